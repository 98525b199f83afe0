//! `paddock-agent run`: seed, `config`, then the run's purpose, then the report (docs/security.md):
//! a wipe ("Cleaning"), or a provisioning boot's first boot ("Provisioning").
//!
//! A provisioning boot is handled by the same agent in the same image, as the smallest honest
//! stand-in for a node OS installer: it proves that the machine booted the image the BMC inserted
//! from `PADDOCK_OS_IMAGE_URL` (the report names the digest of the boot medium, which paddock
//! checks against `PADDOCK_OS_IMAGE_SHA256`), found the run's seed, and fetched the run's join
//! configuration with the run's token, complete with the contract's keys. It installs nothing and
//! joins nothing (no kubelet runs; with the simulated cluster drivers the join is simulated), and
//! it never touches a disk. The machine stays up after the report: paddock ejects the media and
//! restarts it from disk.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chrono::Utc;

use crate::client::{AgentConfig, Client, Delivered, Report, WipeConfig};
use crate::device::{self, Action, Disk, Kind, Roots, Seen};
use crate::matching::match_drives;
use crate::seed::{self, FoundSeed};
use crate::wipe::{self, Choice, DriveReport, Outcome};

/// What `run` is told on its command line.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Read the seed from this device instead of searching by label.
    pub seed_device: Option<PathBuf>,
    /// Wipe exactly these devices instead of every disk discovered (tests, and loop devices).
    pub devices: Vec<PathBuf>,
    /// SHA-256 of the image the agent runs in; `None`: the digest of the removable media device,
    /// besides the seed's, that holds it ([`device::image_sha256`]).
    pub image_sha256: Option<String>,
    /// How long to keep trying to fetch `config`.
    pub config_timeout: Duration,
}

/// What a run was for (`config`'s purpose).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// Wipe every disk.
    Wipe,
    /// Report a provisioning boot's first boot.
    Provision,
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
    let image_sha256 = match &opts.image_sha256 {
        Some(digest) => digest.clone(),
        None => device::image_sha256(roots, &found.device).context("finding the image digest")?,
    };
    check_digest(&image_sha256)?;
    eprintln!("paddock-agent: image sha256 {image_sha256}");
    let client = Client::new(seed)?;
    let config = client.config(Instant::now() + opts.config_timeout)?;
    if config.run_id != seed.run_id {
        bail!("config is for run {}, the seed for run {}", config.run_id, seed.run_id);
    }
    let started_at = Utc::now();
    let (purpose, (result, drives, devices)) = match config.purpose.as_str() {
        "wipe" => (Purpose::Wipe, wipe_run(roots, opts, &config)?),
        "provision" => (Purpose::Provision, (first_boot(&config.config), Vec::new(), Vec::new())),
        other => bail!("purpose {other:?} is not carried out by this agent"),
    };
    let report = Report {
        result,
        started_at,
        finished_at: Utc::now(),
        image_sha256,
        nonce: config.nonce.clone(),
        drives,
        devices,
    };
    let left = (config.expires_at - Utc::now()).to_std().unwrap_or_default();
    let delivered = client.report(&report, Instant::now() + left)?;
    eprintln!("paddock-agent: report delivered ({delivered:?}), purpose {purpose:?}, result {result:?}");
    Ok(RunOutcome { purpose, result, delivered })
}

/// The join configuration's keys a first boot needs (docs/security.md: the API endpoint, the CA
/// certificate and its pin, the bootstrap token) and the node's name.
const JOIN_KEYS: [&str; 5] = ["node_name", "api_endpoint", "ca_cert", "ca_cert_hash", "bootstrap_token"];

/// A provisioning boot's first boot: success when the run's join configuration holds every key
/// a join needs (see the module documentation for what this proves and what it does not).
fn first_boot(join: &serde_json::Value) -> Outcome {
    let missing: Vec<&str> =
        JOIN_KEYS.into_iter().filter(|k| join[*k].as_str().is_none_or(|v| v.trim().is_empty())).collect();
    if missing.is_empty() {
        eprintln!("paddock-agent: first boot of node {} (API server {})", join["node_name"], join["api_endpoint"]);
        Outcome::Success
    } else {
        eprintln!("paddock-agent: the join configuration lacks {}", missing.join(", "));
        Outcome::Failure
    }
}

/// What a wipe run reports: the overall result, each drive's evidence and every device seen.
type WipeResult = (Outcome, Vec<DriveReport>, Vec<Seen>);

/// A wipe: every disk found, matched against the drives `config` lists; every device seen
/// reported with what was done to it.
fn wipe_run(roots: &Roots, opts: &RunOptions, config: &AgentConfig) -> anyhow::Result<WipeResult> {
    let wipe: WipeConfig =
        serde_json::from_value(config.config.clone()).context("config's wipe configuration is not valid")?;
    let (disks, left) = disks(roots, &opts.devices)?;
    let mut drives = wipe::wipe_all(roots, &disks, Choice::Auto);
    let all_found = assign(&wipe, &mut drives);
    let devices = seen(&disks, &drives, left);
    let disk_left = devices.iter().any(|d| d.kind == Kind::Disk && d.action != Action::Wiped);
    let all_wiped = drives.iter().all(|d| d.result == Outcome::Success && d.verification.is_some());
    let result = if all_found && all_wiped && !disk_left { Outcome::Success } else { Outcome::Failure };
    Ok((result, drives, devices))
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
        drive.device = None;
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_first_boot_succeeds_only_with_a_complete_join_configuration() {
        let mut join = json!({
            "node_name": "m-1", "api_endpoint": "https://cp.example:6443", "ca_cert": "-----BEGIN CERTIFICATE-----",
            "ca_cert_hash": "sha256:00", "bootstrap_token": "abcdef.0123456789abcdef", "join": {},
        });
        assert_eq!(first_boot(&join), Outcome::Success);
        join["bootstrap_token"] = json!(" ");
        assert_eq!(first_boot(&join), Outcome::Failure);
        join["bootstrap_token"] = json!("abcdef.0123456789abcdef");
        join.as_object_mut().expect("object").remove("api_endpoint");
        assert_eq!(first_boot(&join), Outcome::Failure);
    }
}
