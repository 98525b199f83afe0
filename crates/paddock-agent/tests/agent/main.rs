//! The agent against real block devices: loop devices over files with random contents, wiped by
//! the real binary (as root, as CI runs; `losetup` must work).

mod harness;
mod seed;
mod wipe;
