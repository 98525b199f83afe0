//! `paddock-agent run`: seed, `config`, then the run's purpose, then the report (docs/security.md):
//! a wipe ("Cleaning"), or a provisioning boot's installation of the node OS ("Provisioning",
//! [`crate::install`]). After a provisioning boot's report the machine stays up: paddock ejects the
//! media and restarts it from disk.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chrono::Utc;

use paddock_types::agent::{
    AcceptanceConfig, AgentFailure, AgentPurpose, AgentReport, AgentRunConfig, DriveReport, WipeConfig,
};
use paddock_types::health::{HealthCheck, HealthStatus};

use crate::accept;
use crate::client::{Client, Delivered};
use crate::device::{self, Action, Disk, Kind, Roots, Seen};
use crate::install;
use crate::matching::match_drives;
use crate::seed::{self, FoundSeed};
use crate::wipe::{self, Choice, Outcome};

/// What `run` is told on its command line.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Read the seed from this device instead of searching by label.
    pub seed_device: Option<PathBuf>,
    /// Wipe, or install on, exactly these devices instead of the disks discovered (tests, and
    /// loop devices).
    pub devices: Vec<PathBuf>,
    /// The boot medium (the ISO the agent runs from); `None`: the removable media device, besides
    /// the seed's, that holds an ISO 9660 image ([`device::boot_medium`]).
    pub image: Option<PathBuf>,
    /// SHA-256 of the image the agent runs in; `None`: the boot medium's ([`device::image_sha256`]).
    pub image_sha256: Option<String>,
    /// How long to keep trying to fetch `config`.
    pub config_timeout: Duration,
}

/// What a run was for (`config`'s purpose).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// Wipe every disk.
    Wipe,
    /// Install the node OS and its join configuration.
    Provision,
    /// Check the machine against its class (an acceptance image).
    Acceptance,
}

/// How a run ended, once its report was delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunOutcome {
    /// What it was for.
    pub purpose: Purpose,
    /// The reported result.
    pub result: Outcome,
    /// How the report was acknowledged.
    pub delivered: Delivered,
}

/// Finds the seed, fetches `config`, carries out its purpose, and delivers the report.
pub fn run(roots: &Roots, opts: &RunOptions) -> anyhow::Result<RunOutcome> {
    let found = match &opts.seed_device {
        Some(d) => FoundSeed { device: d.clone(), seed: seed::read(d)? },
        None => seed::find(roots)?,
    };
    let seed = &found.seed;
    eprintln!("paddock-agent: seed on {} (machine {}, run {})", found.device.display(), seed.machine_id, seed.run_id);
    let medium = match &opts.image {
        Some(m) => Ok(m.clone()),
        None => device::boot_medium(roots, &found.device),
    };
    let image_sha256 = match (&opts.image_sha256, &medium) {
        (Some(digest), _) => digest.clone(),
        (None, Ok(medium)) => device::image_sha256(medium).context("finding the image digest")?,
        (None, Err(e)) => bail!("finding the image: {e:#}"),
    };
    check_digest(&image_sha256)?;
    eprintln!("paddock-agent: image sha256 {image_sha256}");
    let client = Client::new(seed)?;
    let config = client.config(Instant::now() + opts.config_timeout)?;
    if config.run_id.to_string() != seed.run_id {
        bail!("config is for run {}, the seed for run {}", config.run_id, seed.run_id);
    }
    let started_at = Utc::now();
    let (purpose, done) = match (&config.purpose, &config.config) {
        (AgentPurpose::Wipe, AgentRunConfig::Wipe(wipe)) => (Purpose::Wipe, wipe_run(roots, opts, wipe)?),
        (AgentPurpose::Provision, AgentRunConfig::Provision(provision)) => {
            let medium = medium.as_deref().map_err(|e| format!("{e:#}"));
            let target = install::Target { roots, named: &opts.devices, medium };
            let failure = install::install(&target, &image_sha256, provision).err().map(|f| f.into_report());
            let result = if failure.is_none() { Outcome::Success } else { Outcome::Failure };
            (Purpose::Provision, Done { result, failure, ..Done::default() })
        }
        (AgentPurpose::Acceptance, AgentRunConfig::Acceptance(acceptance)) => {
            (Purpose::Acceptance, accept_run(roots, opts, acceptance)?)
        }
        (purpose, _) => bail!("config's instructions are not those of its purpose {purpose:?}"),
    };
    let result = done.result;
    let report = AgentReport {
        result,
        started_at,
        finished_at: Utc::now(),
        image_sha256,
        nonce: Some(config.nonce.clone()),
        drives: done.drives,
        devices: done.devices,
        failure: done.failure,
        checks: done.checks,
    };
    let left = (config.expires_at - Utc::now()).to_std().unwrap_or_default();
    let delivered = client.report(&report, Instant::now() + left)?;
    eprintln!("paddock-agent: report delivered ({delivered:?}), purpose {purpose:?}, result {result:?}");
    Ok(RunOutcome { purpose, result, delivered })
}

/// What a run did: the overall result, each drive's evidence and every device seen (a wipe),
/// why it failed when the agent can name it (a provisioning boot), and what it checked (an
/// acceptance).
struct Done {
    result: Outcome,
    drives: Vec<DriveReport>,
    devices: Vec<Seen>,
    failure: Option<AgentFailure>,
    checks: Vec<HealthCheck>,
}

impl Default for Done {
    fn default() -> Self {
        Done { result: Outcome::Failure, drives: Vec::new(), devices: Vec::new(), failure: None, checks: Vec::new() }
    }
}

/// An acceptance: the disks found and the memory, checked against the class (never written to).
fn accept_run(roots: &Roots, opts: &RunOptions, acceptance: &AcceptanceConfig) -> anyhow::Result<Done> {
    let (disks, _) = disks(roots, &opts.devices)?;
    let found: Vec<_> = disks.iter().map(|d| d.identity.clone()).collect();
    let checks = accept::checks(acceptance, &found, accept::memory_bytes(&roots.sys));
    let passed = checks.iter().all(|c| c.status == HealthStatus::Healthy);
    let result = if passed { Outcome::Success } else { Outcome::Failure };
    Ok(Done { result, checks, ..Done::default() })
}

/// A wipe: every disk found, matched against the drives `config` lists; every device seen
/// reported with what was done to it.
fn wipe_run(roots: &Roots, opts: &RunOptions, wipe: &WipeConfig) -> anyhow::Result<Done> {
    let (disks, left) = disks(roots, &opts.devices)?;
    let mut drives = wipe::wipe_all(roots, &disks, Choice::Auto);
    let all_found = assign(wipe, &mut drives);
    let devices = seen(&disks, &drives, left);
    let disk_left = devices.iter().any(|d| d.kind == Kind::Disk && d.action != Action::Wiped);
    let all_wiped = drives.iter().all(|d| d.result == Outcome::Success && d.verification.is_some());
    let result = if all_found && all_wiped && !disk_left { Outcome::Success } else { Outcome::Failure };
    Ok(Done { result, drives, devices, ..Done::default() })
}

/// Every device seen: the disks with how their wipe went, then those left alone.
fn seen(disks: &[Disk], drives: &[DriveReport], left: Vec<Seen>) -> Vec<Seen> {
    let wiped = disks.iter().zip(drives).map(|(disk, drive)| {
        let (action, reason) = match drive.result {
            Outcome::Success => {
                (Action::Wiped, format!("a disk of the machine: wiped with {} and verified", drive.method))
            }
            Outcome::Failure => {
                (Action::WipeFailed, "a disk of the machine: its wipe failed (see its drive)".to_owned())
            }
        };
        Seen { name: disk.name.clone(), kind: Kind::Disk, action, reason }
    });
    wiped.chain(left).collect()
}

/// The disks to wipe, and every other device seen with why it is left alone: the named devices
/// (and nothing else), or what discovery finds.
pub fn disks(roots: &Roots, named: &[PathBuf]) -> anyhow::Result<(Vec<Disk>, Vec<Seen>)> {
    if !named.is_empty() {
        let disks = named.iter().map(|p| device::disk_at(roots, p)).collect::<anyhow::Result<_>>()?;
        return Ok((disks, Vec::new()));
    }
    let (disks, left) = device::discover(roots)?;
    for s in &left {
        eprintln!("paddock-agent: leaving {} alone: {}", s.name, s.reason);
    }
    Ok((disks, left))
}

/// An image digest is 64 lowercase hex digits.
fn check_digest(digest: &str) -> anyhow::Result<()> {
    if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        bail!("the image digest {digest:?} is not 64 lowercase hex digits");
    }
    Ok(())
}

/// Fills in each drive's config id and match basis; `false` if a listed drive was not found.
fn assign(wipe: &WipeConfig, drives: &mut [DriveReport]) -> bool {
    let identities: Vec<_> = drives.iter().map(|d| d.identity.clone()).collect();
    let (by_found, unmatched) = match_drives(&wipe.drives, &identities);
    for (drive, m) in drives.iter_mut().zip(by_found) {
        if let Some((ci, basis)) = m {
            drive.id = Some(wipe.drives[ci].id.clone());
            drive.match_basis = Some(basis);
        }
    }
    for ci in &unmatched {
        let d = &wipe.drives[*ci];
        eprintln!(
            "paddock-agent: drive {} (serial {:?}, {:?} bytes, {:?}) listed by config was not found",
            d.id, d.serial, d.capacity_bytes, d.protocol
        );
    }
    unmatched.is_empty()
}
