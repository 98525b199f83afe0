//! Block devices: discovery from /sys/block, identity as the running kernel sees it, and what
//! each device is by how the kernel says it is attached (never by what it holds, which a disk's
//! owner can write): the machine's disks, which are wiped; removable media as a BMC presents
//! virtual media (a CD `sr*`, a floppy `fd*`, a device on the USB transport), where the seed and
//! the agent's own image are and which are never wiped; and virtual devices (loop, RAM, ...).

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::Context;
use paddock_types::agent::{BlockDevice, BlockDeviceAction, BlockDeviceKind, DriveIdentity};
use sha2::Digest;

/// A drive's identity as the running kernel sees it (the report's `identity`, docs/security.md).
pub type Identity = DriveIdentity;

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

/// What a block device is (the report's `devices[].kind`, docs/security.md).
pub type Kind = BlockDeviceKind;
/// What the agent did with a block device (the report's `devices[].action`).
pub type Action = BlockDeviceAction;
/// A block device the agent saw, what it did with it and why.
pub type Seen = BlockDevice;

/// Removable media: where virtual media (the seed, the image) may be; never wiped.
pub fn is_media(kind: Kind) -> bool {
    matches!(kind, Kind::Cd | Kind::Floppy | Kind::Usb)
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

/// Kernel name prefixes of devices that are not disks: loop, RAM disks, zram, device-mapper, md
/// arrays (their member disks are wiped) and network block devices.
const VIRTUAL_PREFIXES: &[&str] = &["loop", "ram", "zram", "dm-", "md", "nbd"];

/// The whole-disk block devices (`/sys/block`), sorted by kernel name.
pub fn block_devices(roots: &Roots) -> anyhow::Result<Vec<String>> {
    let block = roots.sys.join("block");
    let mut names: Vec<String> = fs::read_dir(&block)
        .with_context(|| format!("listing {}", block.display()))?
        .filter_map(|e| e.ok().and_then(|e| e.file_name().into_string().ok()))
        .collect();
    names.sort();
    Ok(names)
}

/// Every disk of the machine, to wipe, and every other block device, left alone with the reason.
/// (Loop devices are wiped only when an operator names them: see [`disk_at`].)
pub fn discover(roots: &Roots) -> anyhow::Result<(Vec<Disk>, Vec<Seen>)> {
    let (mut disks, mut left) = (Vec::new(), Vec::new());
    for name in block_devices(roots)? {
        let kind = kind(roots, &name);
        let mut leave =
            |reason: &str| left.push(Seen { name: name.clone(), kind, action: Action::Left, reason: reason.into() });
        match kind {
            Kind::Virtual => leave("not a disk (loop, RAM, zram, device-mapper, md or network block device)"),
            Kind::Cd | Kind::Floppy | Kind::Usb => {
                leave("removable media (virtual media: the seed or the agent's image)")
            }
            Kind::Disk => {
                // A disk without an identity is an error, not a skip: it would go unwiped.
                let disk = disk(roots, &name)?;
                if disk.identity.size_bytes == 0 {
                    leave("no medium (size 0)");
                } else {
                    disks.push(disk);
                }
            }
        }
    }
    Ok((disks, left))
}

/// What the block device `name` is, from its kernel name and its place in sysfs alone.
pub fn kind(roots: &Roots, name: &str) -> Kind {
    let sys = roots.sys.join("block").join(name);
    let rom = read_attr(&sys.join("device/type")).as_deref() == Some("5");
    if name.starts_with("sr") || rom {
        Kind::Cd
    } else if name.starts_with("fd") {
        Kind::Floppy
    } else if VIRTUAL_PREFIXES.iter().any(|p| name.starts_with(p)) {
        Kind::Virtual
    } else if on_usb(&sys) {
        Kind::Usb
    } else {
        Kind::Disk
    }
}

/// Whether the device hangs off a USB bus: a `usb<N>` step in its sysfs device path.
fn on_usb(sys: &Path) -> bool {
    let Ok(device) = fs::canonicalize(sys.join("device")) else { return false };
    device.components().any(|c| c.as_os_str().to_str().is_some_and(|c| c.starts_with("usb")))
}

/// The removable media devices (by [`kind`]) and their partitions, as device nodes, in
/// kernel-name order: where the seed and the image may be.
pub fn media(roots: &Roots) -> anyhow::Result<Vec<PathBuf>> {
    let mut nodes = Vec::new();
    for name in block_devices(roots)? {
        if is_media(kind(roots, &name)) {
            nodes.push(roots.dev.join(&name));
            nodes.extend(partitions(roots, &name).into_iter().map(|p| roots.dev.join(p)));
        }
    }
    Ok(nodes)
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

/// The removable media device the agent booted from, besides the seed's: the one that holds an
/// ISO 9660 image (the CD, or a USB disk the ISO was written to). Never a disk of the machine:
/// whatever a disk holds does not count. More than one candidate is an error naming them all.
pub fn boot_medium(roots: &Roots, seed: &Path) -> anyhow::Result<PathBuf> {
    let seed = seed.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let mut images = Vec::new();
    for name in block_devices(roots)? {
        if !is_media(kind(roots, &name)) || name == seed || partitions(roots, &name).iter().any(|p| p == seed) {
            continue;
        }
        let node = roots.dev.join(&name);
        let Ok(mut f) = File::open(&node) else { continue };
        if crate::iso::image_len(&mut f).is_ok() {
            images.push(node);
        }
    }
    match images.len() {
        1 => Ok(images.remove(0)),
        0 => anyhow::bail!("no removable media device but the seed's holds an ISO 9660 image (the boot image)"),
        _ => {
            let names: Vec<String> = images.iter().map(|p| p.display().to_string()).collect();
            anyhow::bail!("more than one removable media device holds an ISO 9660 image: {}", names.join(", "))
        }
    }
}

/// SHA-256 (hex) of the ISO 9660 image at the start of `medium`, read up to the ISO's own length,
/// so it is the digest `images/wipe/build` printed for the ISO file (the ISO cannot hold its own).
pub fn image_sha256(medium: &Path) -> anyhow::Result<String> {
    let mut f = File::open(medium).with_context(|| format!("opening {}", medium.display()))?;
    let len = crate::iso::image_len(&mut f).with_context(|| format!("{} holds no ISO 9660 image", medium.display()))?;
    f.seek(SeekFrom::Start(0))?;
    let mut hasher = sha2::Sha256::new();
    let copied = io::copy(&mut f.take(len), &mut hasher).with_context(|| format!("reading {}", medium.display()))?;
    if copied != len {
        anyhow::bail!("{} ends after {copied} of the image's {len} bytes", medium.display());
    }
    Ok(hex::encode(hasher.finalize()))
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
