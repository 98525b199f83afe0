//! The Slurm images `scripts/slurm-images` built (`PADDOCK_TEST_SLURM_IMAGES`, the directory it
//! printed: slurm.tar, mariadb.tar, ... and manifest.txt) run Slurm on the node image
//! (`PADDOCK_TEST_NODE_IMAGE`'s disk.img): `images/slurm/proof-boot` boots the node in QEMU (TCG)
//! with the archives on a second disk, and with `ctr run` (no kubelet, no operator) MariaDB,
//! slurmdbd, slurmctld and slurmd start from the images and answer `srun`, `sbatch -W` and
//! `sacct`.
//!
//! Ignored by default, as the images take 37 minutes to build cold and the proof minutes to boot
//! (images/slurm/README.md has the measured times): `PADDOCK_TEST_SLURM_IMAGES=build scripts/test
//! -p paddock-agent --test agent -- --ignored slurm_images` builds the images and runs both. Run
//! without the images, they fail.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The images' directory (`PADDOCK_TEST_SLURM_IMAGES`, the first line scripts/slurm-images prints).
fn images() -> PathBuf {
    let dir = std::env::var("PADDOCK_TEST_SLURM_IMAGES").ok().filter(|v| !v.is_empty());
    PathBuf::from(dir.expect(
        "PADDOCK_TEST_SLURM_IMAGES: `PADDOCK_TEST_SLURM_IMAGES=build scripts/test -p paddock-agent --test agent \
         -- --ignored slurm_images`",
    ))
}

/// The manifest lists every image the stack names under its local reference, and each archive's
/// SHA-256 is the one it records.
#[test]
#[ignore = "needs the Slurm images (37 min cold): PADDOCK_TEST_SLURM_IMAGES=build scripts/test ... --ignored"]
fn the_slurm_images_are_what_their_manifest_says() {
    let dir = images();
    let manifest = std::fs::read_to_string(dir.join("manifest.txt")).expect("the images' manifest.txt");
    for image in ["slurmctld", "slurmd", "slurmrestd", "slurmdbd", "login", "mariadb"] {
        let wanted = format!(" paddock.local/slurm/{image}:");
        assert!(manifest.lines().any(|l| l.contains(&wanted)), "{image} in manifest.txt:\n{manifest}");
    }
    let provisioner = "paddock.local/rancher/local-path-provisioner:";
    assert!(manifest.contains(provisioner), "{provisioner} in manifest.txt");
    for archive in ["slurm.tar", "mariadb.tar", "local-path.tar"] {
        let bytes = std::fs::read(dir.join(archive)).expect("an archive of the manifest");
        let line = format!("{}  {archive}", crate::harness::sha256_hex(&bytes));
        assert!(manifest.lines().any(|l| l == line), "{line} in manifest.txt");
    }
}

/// On the node image, the images run a whole Slurm: `srun -N1 hostname` and `sbatch -W --wrap
/// hostname` answer with the node's name, and `sacct` shows the batch job COMPLETED (slurmdbd on
/// MariaDB, set up by the image's entrypoint from the MARIADB_* variables paddock's pod sets).
#[test]
#[ignore = "needs the Slurm images (37 min cold) and boots for minutes: PADDOCK_TEST_SLURM_IMAGES=build ... --ignored"]
fn the_slurm_images_run_jobs_on_the_node_image() {
    let dir = images();
    let why = "scripts/test builds the node image and sets it";
    let Some(iso) = paddock_testkit::skip::env("PADDOCK_TEST_NODE_IMAGE", why) else { return };
    let disk = Path::new(&iso).with_file_name("disk.img");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../images/slurm/proof-boot");
    let out = Command::new(&script)
        .arg(&disk)
        .arg(&dir)
        .output()
        .expect("running images/slurm/proof-boot (qemu-system-x86, fdisk, tar)");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the proof boot failed:\n{said}");
    for line in ["paddock-proof: srun -N1 hostname: proof-node", "paddock-proof: sacct -j", "paddock-proof: PASS"] {
        assert!(said.contains(line), "{line}:\n{said}");
    }
    eprintln!("{said}");
}
