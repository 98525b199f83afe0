//! The agent against real block devices: loop devices over files with random contents, wiped by
//! the real binary (as root, as CI runs; `losetup` must work); `run` also against a local paddock
//! (`scripts/test`'s PostgreSQL); the installer against loop devices and a kube-harness API
//! server; and the wipe image built around the agent, booted in QEMU.

mod discovery;
mod harness;
mod image;
mod install;
mod run;
mod seed;
mod wipe;
