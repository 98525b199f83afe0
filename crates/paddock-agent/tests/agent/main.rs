//! The agent against real block devices: loop devices over files with random contents, wiped by
//! the real binary (as root, as CI runs; `losetup` must work); `run` also against a local paddock
//! (`scripts/test`'s PostgreSQL); the installer against loop devices and a kube-harness API
//! server; the wipe image built around the agent, booted in QEMU; and the node OS image, whose
//! disk boots in QEMU into containerd and the kubelet.

mod discovery;
mod harness;
mod image;
mod install;
mod node_image;
mod run;
mod seed;
mod slurm_images;
mod wipe;
