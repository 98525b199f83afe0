//! Probing a disk's capabilities and carrying out one erase method on it.
//!
//! The NVMe and ATA methods run the field's tools (nvme-cli, hdparm), which the wipe image ships;
//! discard and zero-out are the kernel's ioctls ([`crate::sys`]). Success of a method is never
//! taken on its word: [`crate::wipe`] verifies every erase with its own reads.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::device::{read_attr, Disk, Roots};
use crate::method::{self, AtaCaps, Capabilities, Method, NvmeCaps};
use crate::sys;

/// Zero-out and discard are issued in steps of this many bytes, so a failure names where it was.
const STEP: u64 = 16 << 30;
/// The ATA password the agent sets for SECURITY ERASE UNIT (cleared by the erase itself).
const ATA_PASSWORD: &str = "paddock-wipe";
/// Longest wait for an NVMe Sanitize to complete.
const SANITIZE_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// What the disk advertises, and notes on what could not be asked (for the evidence's detail).
pub fn probe(roots: &Roots, disk: &Disk) -> (Capabilities, Vec<String>) {
    let queue = roots.sys.join("block").join(&disk.name).join("queue");
    let mut caps = Capabilities {
        discard: read_attr(&queue.join("discard_max_bytes")).is_some_and(|v| v != "0"),
        discard_zeroes_data: read_attr(&queue.join("discard_zeroes_data")).as_deref() == Some("1"),
        ..Capabilities::default()
    };
    let mut notes = Vec::new();
    match disk.identity.protocol.as_deref() {
        Some("nvme") => match nvme_caps(roots, disk) {
            Ok(n) => caps.nvme = Some(n),
            Err(e) => notes.push(format!("NVMe Identify unavailable: {e:#}")),
        },
        Some("sata") => match ata_caps(&disk.path) {
            Ok(a) => caps.ata = a,
            Err(e) => notes.push(format!("ATA IDENTIFY unavailable: {e:#}")),
        },
        _ => {}
    }
    (caps, notes)
}

fn nvme_caps(roots: &Roots, disk: &Disk) -> anyhow::Result<NvmeCaps> {
    let ctrl = nvme_controller(roots, disk)?;
    let mut caps = method::parse_nvme_id_ctrl(&tool("nvme", &["id-ctrl", path_str(&ctrl)?, "-o", "json"])?)?;
    caps.dlfeat = method::parse_nvme_id_ns_dlfeat(&tool("nvme", &["id-ns", path_str(&disk.path)?, "-o", "json"])?)?;
    Ok(caps)
}

/// The controller character device (`/dev/nvme0`) of an NVMe namespace.
fn nvme_controller(roots: &Roots, disk: &Disk) -> anyhow::Result<std::path::PathBuf> {
    let link = std::fs::canonicalize(roots.sys.join("block").join(&disk.name).join("device"))
        .with_context(|| format!("{} has no controller in sysfs", disk.name))?;
    let name = link.file_name().and_then(|n| n.to_str()).context("controller has no name")?;
    Ok(roots.dev.join(name))
}

fn ata_caps(dev: &Path) -> anyhow::Result<Option<AtaCaps>> {
    Ok(method::parse_hdparm_identify(&tool("hdparm", &["-I", path_str(dev)?])?))
}

/// Opens the disk for writing, exclusively: a mounted or otherwise claimed disk is refused.
pub fn open_for_erase(path: &Path) -> anyhow::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_EXCL)
        .open(path)
        .with_context(|| format!("opening {} exclusively for writing", path.display()))
}

/// Carries out `method` on `disk` (`size` bytes).
pub fn erase(roots: &Roots, disk: &Disk, method: Method, size: u64) -> anyhow::Result<()> {
    let dev = path_str(&disk.path)?;
    match method {
        Method::OverwriteZeroes => ranged(&disk.path, size, sys::zero_out, "zero-out"),
        Method::DiscardZeroes => ranged(&disk.path, size, sys::discard, "discard"),
        Method::NvmeFormatCrypto => tool("nvme", &["format", dev, "--ses=2", "--force"]).map(drop),
        Method::NvmeFormatUserData => tool("nvme", &["format", dev, "--ses=1", "--force"]).map(drop),
        Method::NvmeSanitizeCrypto => nvme_sanitize(&nvme_controller(roots, disk)?, 4),
        Method::NvmeSanitizeBlock => nvme_sanitize(&nvme_controller(roots, disk)?, 2),
        Method::AtaSecureEraseEnhanced => ata_erase(dev, "--security-erase-enhanced"),
        Method::AtaSecureErase => ata_erase(dev, "--security-erase"),
    }
}

type RangeIoctl = fn(&File, u64, u64) -> std::io::Result<()>;

fn ranged(path: &Path, size: u64, op: RangeIoctl, what: &str) -> anyhow::Result<()> {
    let file = open_for_erase(path)?;
    let mut offset = 0;
    while offset < size {
        let len = STEP.min(size - offset);
        op(&file, offset, len).with_context(|| format!("{what} of {len} bytes at offset {offset}"))?;
        offset += len;
    }
    Ok(())
}

/// Flushes the device's volatile write cache (fsync of a block device issues a FLUSH), so the
/// erase is durable before it is reported. [`crate::wipe`] runs it while it verifies.
pub fn flush(path: &Path) -> anyhow::Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("flushing the write cache of {}", path.display()))
}

fn nvme_sanitize(ctrl: &Path, sanact: u8) -> anyhow::Result<()> {
    let ctrl = path_str(ctrl)?;
    tool("nvme", &["sanitize", ctrl, &format!("--sanact={sanact}")])?;
    let started = Instant::now();
    loop {
        let log: serde_json::Value = serde_json::from_str(&tool("nvme", &["sanitize-log", ctrl, "-o", "json"])?)
            .context("nvme sanitize-log printed no JSON")?;
        // SSTAT bits 2:0: 1 completed, 2 in progress, 3 failed, 4 completed without deallocation.
        match find_u64(&log, "sstat").context("sanitize-log has no sstat")? & 0b111 {
            1 | 4 => return Ok(()),
            2 => {}
            3 => bail!("the controller reports the sanitize failed"),
            other => bail!("unexpected sanitize status {other}"),
        }
        if started.elapsed() > SANITIZE_TIMEOUT {
            bail!("sanitize still in progress after {SANITIZE_TIMEOUT:?}");
        }
        thread::sleep(Duration::from_secs(5));
    }
}

/// The first number under `key` anywhere in `v` (nvme-cli versions nest the log differently).
fn find_u64(v: &serde_json::Value, key: &str) -> Option<u64> {
    match v {
        serde_json::Value::Object(m) => {
            m.get(key).and_then(serde_json::Value::as_u64).or_else(|| m.values().find_map(|x| find_u64(x, key)))
        }
        serde_json::Value::Array(a) => a.iter().find_map(|x| find_u64(x, key)),
        _ => None,
    }
}

fn ata_erase(dev: &str, erase_flag: &str) -> anyhow::Result<()> {
    tool("hdparm", &["--user-master", "u", "--security-set-pass", ATA_PASSWORD, dev])?;
    let erased = tool("hdparm", &["--user-master", "u", erase_flag, ATA_PASSWORD, dev]);
    if erased.is_err() {
        // Never leave the drive locked with our password: clear it, best effort (the erase error is what counts).
        let _ = tool("hdparm", &["--user-master", "u", "--security-disable", ATA_PASSWORD, dev]);
    }
    erased.map(drop)
}

/// Runs a tool; its stdout, or an error with its status and stderr.
fn tool(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        bail!("{program} {} failed ({}): {}", args.join(" "), out.status, stderr.trim());
    }
    String::from_utf8(out.stdout).with_context(|| format!("{program} printed non-UTF-8 output"))
}

fn path_str(p: &Path) -> anyhow::Result<&str> {
    p.to_str().with_context(|| format!("device path {} is not UTF-8", p.display()))
}
