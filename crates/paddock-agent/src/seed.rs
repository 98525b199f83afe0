//! The run's seed: found among the removable media the BMC presents as virtual media (a CD, a
//! floppy or a USB device, by how the kernel says each is attached: [`device::kind`]), never on a
//! disk of the machine, whose contents its previous tenant wrote; read for `paddock/agent.json`
//! (ISO 9660 directly; other file systems through a read-only mount). Exactly one device may hold
//! one: a second is a planted seed that would send the agent elsewhere, and fails the run.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::device::{self, Roots};
use crate::iso;

/// Where the seed keeps the agent's part.
pub const AGENT_JSON: &str = "paddock/agent.json";

/// `paddock/agent.json` (docs/security.md, "Agent tokens").
#[derive(Clone, Deserialize, Serialize)]
pub struct AgentSeed {
    /// Base URL of the agent API, without a trailing slash.
    pub agent_url: String,
    /// The bearer token. Never logged: [`AgentSeed`]'s Debug leaves it out.
    pub agent_token: String,
    /// PEM of the CA the agent API's certificate chains to, or `None` for the system roots.
    #[serde(default)]
    pub ca_cert: Option<String>,
    /// The machine's id.
    pub machine_id: String,
    /// The run's id.
    pub run_id: String,
}

impl std::fmt::Debug for AgentSeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSeed")
            .field("agent_url", &self.agent_url)
            .field("agent_token", &"<redacted>")
            .field("machine_id", &self.machine_id)
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

/// A seed found on a block device.
#[derive(Debug)]
pub struct FoundSeed {
    /// The device node holding the seed's file system (a disk or a partition).
    pub device: PathBuf,
    /// What it holds.
    pub seed: AgentSeed,
}

/// Reads every removable media device and partition for [`AGENT_JSON`]: the one that holds it is
/// the seed; none, or more than one, is an error naming each device tried.
pub fn find(roots: &Roots) -> anyhow::Result<FoundSeed> {
    let candidates = device::media(roots)?;
    let mut found = Vec::new();
    let mut errors = Vec::new();
    for device in candidates {
        match read(&device) {
            Ok(seed) => found.push(FoundSeed { device, seed }),
            Err(e) => errors.push(format!("{}: {e:#}", device.display())),
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 if errors.is_empty() => bail!("no removable media device (CD, floppy, USB) to find the seed on"),
        0 => bail!("no removable media device holds the seed ({})", errors.join("; ")),
        _ => {
            let devices: Vec<String> = found.iter().map(|f| f.device.display().to_string()).collect();
            bail!("more than one device holds {AGENT_JSON}, refusing to choose: {}", devices.join(", "))
        }
    }
}

/// Reads [`AGENT_JSON`] from the seed on `device`: an ISO 9660 image directly, anything else (a
/// FAT floppy or USB image) through a read-only mount on a private directory.
pub fn read(device: &Path) -> anyhow::Result<AgentSeed> {
    let mut file = File::open(device).with_context(|| format!("opening {}", device.display()))?;
    let json = match iso::read_file(&mut file, AGENT_JSON) {
        Ok(found) => found.with_context(|| format!("the seed has no {AGENT_JSON}"))?,
        Err(not_iso) => read_mounted(device)
            .with_context(|| format!("not readable as ISO 9660 ({not_iso:#}), nor by mounting it"))?,
    };
    serde_json::from_slice(&json).with_context(|| format!("{AGENT_JSON} is not valid"))
}

fn read_mounted(device: &Path) -> anyhow::Result<Vec<u8>> {
    let dir = std::env::temp_dir().join(format!("paddock-seed-{}", std::process::id()));
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let read =
        run("mount", &[OsStr::new("-o"), OsStr::new("ro"), device.as_os_str(), dir.as_os_str()]).and_then(|()| {
            let json = fs::read(dir.join(AGENT_JSON)).with_context(|| format!("the seed has no {AGENT_JSON}"));
            let unmounted = run("umount", &[dir.as_os_str()]);
            let json = json?;
            unmounted.map(|()| json)
        });
    let _ = fs::remove_dir(&dir);
    read
}

fn run(program: &str, args: &[&OsStr]) -> anyhow::Result<()> {
    let out = Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!("{program} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}
