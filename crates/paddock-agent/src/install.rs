//! The installer: a provisioning boot's purpose (the node image contract, "The installer"). In
//! order, each refusal ending the run with a reported failure and a named reason, and no byte
//! written to a disk before the checks of steps 1 to 3 pass:
//!
//! 1. the boot medium's SHA-256 is the configured node OS image's (`os_image_digest_mismatch`);
//! 2. discovery finds the tenant CA, signed with the bootstrap token and matching the pin
//!    ([`crate::discovery`]: `discovery_failed`, `ca_pin_mismatch`);
//! 3. the target disk: the NVMe disk if there is one, else the first SATA or virtio disk, big
//!    enough for `node/disk.img` (`no_target_disk`);
//! 4. `node/disk.img` streamed from the medium's ISO 9660 extent to the target, flushed, read back
//!    from the device (its cached pages dropped) and compared by SHA-256 (`install_failed`);
//! 5. the join archive ([`crate::joinfs`]) written at partition 2 of the table just written,
//!    flushed (`install_failed`).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use paddock_types::agent::{AgentFailure, ProvisionConfig};
use sha2::{Digest, Sha256};

use crate::device::{Disk, Roots};
use crate::discovery::{self, DISCOVERY_TIMEOUT};
use crate::{iso, joinfs, mbr, run};

/// The node OS image on the boot medium.
pub const DISK_IMG: &str = "node/disk.img";
const CHUNK: usize = 1 << 20;

/// Why an installation was refused or failed: a stable reason and what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// `os_image_digest_mismatch`, `discovery_failed`, `ca_pin_mismatch`, `no_target_disk` or
    /// `install_failed`.
    pub code: &'static str,
    /// What happened.
    pub message: String,
}

impl Failure {
    /// A failure with reason `code`.
    pub fn new(code: &'static str, message: impl Into<String>) -> Failure {
        Failure { code, message: message.into() }
    }

    /// The report's `failure`.
    pub fn into_report(self) -> AgentFailure {
        AgentFailure { code: self.code.to_owned(), message: self.message }
    }
}

fn failed(e: impl std::fmt::Display) -> Failure {
    Failure::new("install_failed", e.to_string())
}

/// Where the installer reads from and writes to.
pub struct Target<'a> {
    /// sysfs and /dev.
    pub roots: &'a Roots,
    /// The disks to choose among when named (tests, loop devices); else every disk discovered.
    pub named: &'a [PathBuf],
    /// The boot medium holding `node/disk.img`, or why none was found.
    pub medium: Result<&'a Path, String>,
}

/// Installs the node OS and its join configuration (see the module documentation).
pub fn install(target: &Target, image_sha256: &str, config: &ProvisionConfig) -> Result<(), Failure> {
    if !image_sha256.eq_ignore_ascii_case(config.os_image_sha256.trim()) {
        return Err(Failure::new(
            "os_image_digest_mismatch",
            format!("the boot medium is image {image_sha256}, not the node OS image {}", config.os_image_sha256),
        ));
    }
    let deadline = Instant::now() + DISCOVERY_TIMEOUT;
    let ca_pem = discovery::discover(&config.api_endpoint, &config.bootstrap_token, &config.ca_cert_hash, deadline)?;
    eprintln!("paddock-agent: discovery: the API server's CA matches the pin {}", config.ca_cert_hash);
    let medium = target.medium.clone().map_err(failed)?;
    let mut iso_file = File::open(medium).map_err(|e| failed(format!("opening {}: {e}", medium.display())))?;
    let extent = iso::find(&mut iso_file, DISK_IMG)
        .map_err(|e| failed(format!("reading {}: {e:#}", medium.display())))?
        .ok_or_else(|| failed(format!("the boot medium has no {DISK_IMG}")))?;
    let (disks, _) = run::disks(target.roots, target.named).map_err(|e| failed(format!("{e:#}")))?;
    let disk = choose_target(&disks, u64::from(extent.len), !target.named.is_empty()).ok_or_else(|| {
        Failure::new("no_target_disk", format!("no NVMe, SATA or virtio disk holds {} bytes", extent.len))
    })?;
    eprintln!("paddock-agent: installing {DISK_IMG} ({} bytes) on {}", extent.len, disk.path.display());
    let archive = joinfs::join_archive(config, &ca_pem).map_err(|e| failed(format!("{e:#}")))?;
    write_image(iso::open(iso_file, extent).map_err(failed)?, &disk.path, u64::from(extent.len))?;
    write_archive(&disk.path, &archive)?;
    eprintln!("paddock-agent: installed node {} on {}", config.node_name, disk.path.display());
    Ok(())
}

/// The disk to install on: the first NVMe disk, else the first SATA or virtio disk, of at least
/// `need` bytes. Disks an operator named (`--device`) of another protocol (a loop device) come
/// last.
pub fn choose_target(disks: &[Disk], need: u64, named: bool) -> Option<&Disk> {
    let rank = |d: &Disk| match d.identity.protocol.as_deref() {
        Some("nvme") => Some(0),
        Some("sata" | "virtio") => Some(1),
        _ if named => Some(2),
        _ => None,
    };
    disks
        .iter()
        .filter(|d| d.identity.size_bytes >= need)
        .filter_map(|d| Some((rank(d)?, d)))
        .min_by_key(|(r, _)| *r)
        .map(|(_, d)| d)
}

/// Streams `len` bytes of `image` to the start of `disk`, flushes, reads them back and compares
/// their SHA-256 with what was read from the medium.
fn write_image(mut image: impl Read, disk: &Path, len: u64) -> Result<(), Failure> {
    let mut out =
        OpenOptions::new().write(true).open(disk).map_err(|e| failed(format!("opening {}: {e}", disk.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut copied = 0u64;
    loop {
        let n = match image.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(failed(format!("reading {DISK_IMG}: {e}"))),
        };
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(|e| failed(format!("writing {}: {e}", disk.display())))?;
        copied += n as u64;
    }
    if copied != len {
        return Err(failed(format!("{DISK_IMG} ended after {copied} of its {len} bytes")));
    }
    out.sync_all().map_err(|e| failed(format!("flushing {}: {e}", disk.display())))?;
    // The read-back reads the device, not the pages just written.
    crate::sys::drop_cache(&out).map_err(|e| failed(format!("dropping {}'s cached pages: {e}", disk.display())))?;
    let written = hasher.finalize();
    let mut back = File::open(disk).map_err(|e| failed(format!("reopening {}: {e}", disk.display())))?;
    let mut reread = Sha256::new();
    let n = io::copy(&mut (&mut back).take(len), &mut reread).map_err(|e| failed(format!("reading back: {e}")))?;
    if n != len || reread.finalize() != written {
        return Err(failed(format!(
            "{} does not read back as {DISK_IMG} (sha256 {})",
            disk.display(),
            hex::encode(written)
        )));
    }
    Ok(())
}

/// Writes the join archive at partition 2 of the MBR on `disk` (the table just written), flushes.
fn write_archive(disk: &Path, archive: &[u8]) -> Result<(), Failure> {
    let mut dev = OpenOptions::new()
        .read(true)
        .write(true)
        .open(disk)
        .map_err(|e| failed(format!("opening {}: {e}", disk.display())))?;
    let mut sector0 = [0u8; 512];
    dev.read_exact(&mut sector0).map_err(|e| failed(format!("reading the partition table: {e}")))?;
    let part = mbr::partition(&sector0, 2).map_err(|e| failed(format!("{DISK_IMG}'s partition 2: {e:#}")))?;
    if part.kind != mbr::JOIN_ARCHIVE_TYPE || (archive.len() as u64) > part.len {
        return Err(failed(format!(
            "{DISK_IMG}'s partition 2 (type {:#04x}, {} bytes) is not a join archive partition for {} bytes",
            part.kind,
            part.len,
            archive.len()
        )));
    }
    dev.seek(SeekFrom::Start(part.offset)).map_err(failed)?;
    dev.write_all(archive).map_err(|e| failed(format!("writing the join archive: {e}")))?;
    dev.sync_all().map_err(|e| failed(format!("flushing {}: {e}", disk.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Identity;

    fn disk(name: &str, protocol: &str, size: u64) -> Disk {
        let identity = Identity { size_bytes: size, protocol: Some(protocol.into()), ..Identity::default() };
        Disk { name: name.into(), path: PathBuf::from(format!("/dev/{name}")), identity }
    }

    #[test]
    fn the_target_is_the_nvme_disk_else_the_first_sata_or_virtio_disk_big_enough() {
        let disks = [disk("sda", "sata", 100), disk("vda", "virtio", 100), disk("nvme0n1", "nvme", 100)];
        assert_eq!(choose_target(&disks, 50, false).map(|d| d.name.as_str()), Some("nvme0n1"));
        let small_nvme = [disk("nvme0n1", "nvme", 10), disk("sda", "sata", 100), disk("vda", "virtio", 100)];
        assert_eq!(choose_target(&small_nvme, 50, false).map(|d| d.name.as_str()), Some("sda"));
        let others = [disk("sdb", "sas", 100), disk("loop0", "loop", 100)];
        assert_eq!(choose_target(&others, 50, false), None, "SAS and loop devices are not targets");
        assert_eq!(choose_target(&others, 50, true).map(|d| d.name.as_str()), Some("sdb"), "unless named");
        assert_eq!(choose_target(&disks, 101, false), None, "none big enough");
    }
}
