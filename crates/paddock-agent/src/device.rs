//! Block devices: discovery from /sys/block, identity as the running kernel sees it, and the
//! labels that mark the devices the agent must leave alone (the seed and its own image).

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sha2::Digest;

/// Volume label of the run's seed (cloud-init NoCloud).
pub const SEED_LABEL: &str = "cidata";
/// Volume label of the wipe image itself (images/wipe/build sets it).
pub const IMAGE_LABEL: &str = "PADDOCK_WIPE";

/// A drive's identity as the running kernel sees it (the report's `identity`, docs/security.md).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// Model string.
    pub model: Option<String>,
    /// Serial number.
    pub serial: Option<String>,
    /// World Wide Name (SCSI/ATA `naa.`, or an NVMe `nvme.` id).
    pub wwn: Option<String>,
    /// NVMe EUI-64 or NGUID.
    pub eui: Option<String>,
    /// Capacity in bytes.
    pub size_bytes: u64,
    /// How it is attached: `nvme`, `sata`, `sas`, `scsi`, `virtio`, `loop`, or another kernel name.
    pub protocol: Option<String>,
}

/// A whole-disk block device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    /// Kernel name, e.g. `nvme0n1`.
    pub name: String,
    /// Device node, e.g. `/dev/nvme0n1`.
    pub path: PathBuf,
    /// Identity from sysfs.
    pub identity: Identity,
}

/// Why discovery skipped a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Kernel name.
    pub name: String,
    /// Why.
    pub reason: String,
}

/// Where to look: sysfs and /dev (tests and chroots may move them).
#[derive(Clone, Debug)]
pub struct Roots {
    /// Usually `/sys`.
    pub sys: PathBuf,
    /// Usually `/dev`.
    pub dev: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Roots { sys: PathBuf::from("/sys"), dev: PathBuf::from("/dev") }
    }
}

/// Kernel name prefixes discovery never wipes: CD-ROMs, loop, RAM disks, zram, device-mapper, md
/// arrays (their member disks are wiped), network block devices and floppies (where a seed may be).
const VIRTUAL_PREFIXES: &[&str] = &["sr", "loop", "ram", "zram", "dm-", "md", "nbd", "fd"];

/// Every disk the kernel shows that the agent must wipe, and those it skipped with the reason.
/// (Loop devices are wiped only when an operator names them: see [`disk_at`].)
pub fn discover(roots: &Roots) -> anyhow::Result<(Vec<Disk>, Vec<Skipped>)> {
    let mut names: Vec<String> = fs::read_dir(roots.sys.join("block"))
        .with_context(|| format!("listing {}", roots.sys.join("block").display()))?
        .filter_map(|e| e.ok().and_then(|e| e.file_name().into_string().ok()))
        .collect();
    names.sort();
    let (mut disks, mut skipped) = (Vec::new(), Vec::new());
    for name in names {
        let skip = |reason: String| Skipped { name: name.clone(), reason };
        if is_virtual(roots, &name) {
            skipped.push(skip("not a disk (rom, loop, RAM, zram, device-mapper or similar)".into()));
            continue;
        }
        // A disk without an identity is an error, not a skip: it would go unwiped unreported.
        let disk = disk(roots, &name)?;
        // A disk whose label cannot be read is kept: its wipe then fails with the reason, which
        // the report shows, rather than the disk being passed over quietly.
        if disk.identity.size_bytes == 0 {
            skipped.push(skip("no medium (size 0)".into()));
        } else if let Ok(Some(label)) = protected_label(roots, &name) {
            skipped.push(skip(format!("carries the {label:?} volume (the seed or the agent's image)")));
        } else {
            disks.push(disk);
        }
    }
    Ok((disks, skipped))
}

fn is_virtual(roots: &Roots, name: &str) -> bool {
    let dev_type = read_attr(&roots.sys.join("block").join(name).join("device/type"));
    VIRTUAL_PREFIXES.iter().any(|p| name.starts_with(p)) || dev_type.as_deref() == Some("5")
}

/// The disk `name` (a kernel name under /sys/block) with its identity.
pub fn disk(roots: &Roots, name: &str) -> anyhow::Result<Disk> {
    let sys = roots.sys.join("block").join(name);
    let sectors: u64 = read_attr(&sys.join("size"))
        .with_context(|| format!("{} has no size", sys.display()))?
        .parse()
        .with_context(|| format!("{}/size is not a number", sys.display()))?;
    let protocol = protocol(&sys, name);
    let identity = Identity {
        model: read_attr(&sys.join("device/model")),
        serial: serial(&sys),
        wwn: read_attr(&sys.join("wwid"))
            .or_else(|| read_attr(&sys.join("device/wwid")))
            .filter(|w| !w.starts_with("eui.")),
        eui: read_attr(&sys.join("eui")).or_else(|| read_attr(&sys.join("nguid"))),
        size_bytes: sectors * 512,
        protocol,
    };
    Ok(Disk { name: name.to_owned(), path: roots.dev.join(name), identity })
}

/// The disk behind a device path given by an operator (`/dev/sdb`, a by-id symlink, ...).
pub fn disk_at(roots: &Roots, path: &Path) -> anyhow::Result<Disk> {
    let real = fs::canonicalize(path).with_context(|| format!("{} does not exist", path.display()))?;
    let name = real.file_name().and_then(|n| n.to_str()).with_context(|| format!("{} has no name", real.display()))?;
    if !roots.sys.join("block").join(name).exists() {
        anyhow::bail!("{} is not a whole-disk block device (no /sys/block/{name})", path.display());
    }
    let mut d = disk(roots, name)?;
    d.path = real;
    Ok(d)
}

/// The label of the seed or the agent's image if the disk or one of its partitions carries one.
pub fn protected_label(roots: &Roots, name: &str) -> anyhow::Result<Option<String>> {
    let mut nodes = vec![name.to_owned()];
    nodes.extend(partitions(roots, name));
    for node in nodes {
        let label = match File::open(roots.dev.join(&node)) {
            Ok(mut f) => volume_label(&mut f).with_context(|| format!("reading the label of /dev/{node}"))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("opening /dev/{node}")),
        };
        if let Some(l) = label.filter(|l| l.eq_ignore_ascii_case(SEED_LABEL) || l.eq_ignore_ascii_case(IMAGE_LABEL)) {
            return Ok(Some(l));
        }
    }
    Ok(None)
}

/// The kernel names of every block device and partition (`/sys/class/block`), sorted.
pub fn block_devices(roots: &Roots) -> anyhow::Result<Vec<String>> {
    let class = roots.sys.join("class/block");
    let mut names: Vec<String> = fs::read_dir(&class)
        .with_context(|| format!("listing {}", class.display()))?
        .filter_map(|e| e.ok().and_then(|e| e.file_name().into_string().ok()))
        .collect();
    names.sort();
    Ok(names)
}

/// SHA-256 (hex) of the wipe image the agent booted from: the device labelled [`IMAGE_LABEL`]
/// (the CD, or a USB disk the ISO was written to), read up to the ISO's own length, so it is the
/// digest `images/wipe/build` printed for the ISO file.
pub fn image_sha256(roots: &Roots) -> anyhow::Result<String> {
    let names = block_devices(roots)?;
    for name in names {
        let path = roots.dev.join(&name);
        let Ok(mut f) = File::open(&path) else { continue };
        if volume_label(&mut f).ok().flatten().is_none_or(|l| l != IMAGE_LABEL) {
            continue;
        }
        let len =
            crate::iso::image_len(&mut f).with_context(|| format!("reading the image length on {}", path.display()))?;
        f.seek(SeekFrom::Start(0))?;
        let mut hasher = sha2::Sha256::new();
        let copied = io::copy(&mut f.take(len), &mut hasher).with_context(|| format!("reading {}", path.display()))?;
        if copied != len {
            anyhow::bail!("{} ends after {copied} of the image's {len} bytes", path.display());
        }
        return Ok(hex::encode(hasher.finalize()));
    }
    anyhow::bail!("no block device carries the wipe image (volume label {IMAGE_LABEL:?})")
}

/// Partitions of the disk `name` (kernel names).
pub fn partitions(roots: &Roots, name: &str) -> Vec<String> {
    let Ok(entries) = fs::read_dir(roots.sys.join("block").join(name)) else { return Vec::new() };
    let mut parts: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("partition").exists())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    parts.sort();
    parts
}

/// The volume label of an ISO 9660 or FAT file system at the start of `dev`, if it holds one.
pub fn volume_label(dev: &mut (impl Read + Seek)) -> io::Result<Option<String>> {
    let mut boot = [0u8; 512];
    if read_full(dev, 0, &mut boot)? {
        if let Some(l) = fat_label(&boot) {
            return Ok(Some(l));
        }
    }
    let mut pvd = [0u8; 2048];
    if read_full(dev, 16 * 2048, &mut pvd)? && pvd[0] == 1 && &pvd[1..6] == b"CD001" {
        return Ok(Some(trim_label(&pvd[40..72])));
    }
    Ok(None)
}

fn fat_label(boot: &[u8; 512]) -> Option<String> {
    if boot[510..512] != [0x55, 0xaa] {
        return None;
    }
    // FAT32 keeps its extended boot record at 64, FAT12/16 at 36 (signature 0x29 at +2).
    let at = if &boot[82..87] == b"FAT32" {
        64
    } else if &boot[54..57] == b"FAT" {
        36
    } else {
        return None;
    };
    (boot[at + 2] == 0x29).then(|| trim_label(&boot[at + 7..at + 18]))
}

fn trim_label(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw).trim_end_matches([' ', '\0']).to_owned()
}

/// Fills `buf` from `offset`; `false` when the device is shorter.
fn read_full(dev: &mut (impl Read + Seek), offset: u64, buf: &mut [u8]) -> io::Result<bool> {
    dev.seek(SeekFrom::Start(offset))?;
    match dev.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

fn serial(sys: &Path) -> Option<String> {
    read_attr(&sys.join("device/serial")).or_else(|| read_attr(&sys.join("serial"))).or_else(|| vpd_serial(sys))
}

/// The Unit Serial Number VPD page (0x80) of a SCSI or SATA disk: a 4-byte header, then the serial.
fn vpd_serial(sys: &Path) -> Option<String> {
    let page = fs::read(sys.join("device/vpd_pg80")).ok()?;
    let len = usize::from(*page.get(3)?);
    let s = String::from_utf8_lossy(page.get(4..4 + len)?).trim().to_owned();
    (!s.is_empty()).then_some(s)
}

fn protocol(sys: &Path, name: &str) -> Option<String> {
    if name.starts_with("nvme") {
        return Some("nvme".into());
    }
    if name.starts_with("loop") {
        return Some("loop".into());
    }
    let device = fs::canonicalize(sys.join("device")).ok()?;
    let device = device.to_string_lossy();
    let vendor = read_attr(&sys.join("device/vendor"));
    let proto = if device.contains("/virtio") {
        "virtio"
    } else if device.contains("/ata") || vendor.as_deref() == Some("ATA") {
        "sata"
    } else if device.contains("/port-") || device.contains("/expander-") || device.contains("sas") {
        "sas"
    } else if device.contains("/target") {
        "scsi"
    } else if device.contains("/mmc") {
        "mmc"
    } else {
        return None;
    };
    Some(proto.into())
}

/// A sysfs attribute, trimmed; `None` when absent or empty.
pub fn read_attr(path: &Path) -> Option<String> {
    let s = fs::read_to_string(path).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    #[test]
    fn reads_the_label_of_a_seed_iso() {
        let iso = paddock_seed::seed_iso(b"instance-id: m\n", b"#cloud-config\n", None).expect("seed");
        assert_eq!(volume_label(&mut Cursor::new(iso)).expect("label").as_deref(), Some("cidata"));
    }

    #[test]
    fn reads_the_label_of_a_fat_file_system() {
        let mut boot = [0u8; 512];
        boot[54..62].copy_from_slice(b"FAT12   ");
        boot[38] = 0x29;
        boot[43..54].copy_from_slice(b"CIDATA     ");
        boot[510] = 0x55;
        boot[511] = 0xaa;
        assert_eq!(volume_label(&mut Cursor::new(boot.to_vec())).expect("label").as_deref(), Some("CIDATA"));
    }

    #[test]
    fn random_bytes_have_no_label() {
        let bytes: Vec<u8> = (0..40_000u32).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(volume_label(&mut Cursor::new(bytes)).expect("label"), None);
        assert_eq!(volume_label(&mut Cursor::new(vec![1u8; 100])).expect("short"), None);
    }
}
