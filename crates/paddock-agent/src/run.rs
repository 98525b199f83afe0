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
use crate::device::{self, Disk, Roots};
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
    /// SHA-256 of the image the agent runs in.
    pub image_sha256: String,
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
    let client = Client::new(seed)?;
    let config = client.config(Instant::now() + opts.config_timeout)?;
    if config.run_id != seed.run_id {
        bail!("config is for run {}, the seed for run {}", config.run_id, seed.run_id);
    }
    let started_at = Utc::now();
    let (purpose, result, drives) = match config.purpose.as_str() {
        "wipe" => {
            let (result, drives) = wipe_run(roots, opts, &config)?;
            (Purpose::Wipe, result, drives)
        }
        "provision" => (Purpose::Provision, first_boot(&config.config), Vec::new()),
        other => bail!("purpose {other:?} is not carried out by this agent"),
    };
    let report = Report {
        result,
        started_at,
        finished_at: Utc::now(),
        image_sha256: opts.image_sha256.clone(),
        nonce: config.nonce.clone(),
        drives,
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

/// A wipe: every disk found, matched against the drives `config` lists.
fn wipe_run(roots: &Roots, opts: &RunOptions, config: &AgentConfig) -> anyhow::Result<(Outcome, Vec<DriveReport>)> {
    let wipe: WipeConfig =
        serde_json::from_value(config.config.clone()).context("config's wipe configuration is not valid")?;
    let disks = disks(roots, &opts.devices)?;
    let mut drives = wipe::wipe_all(roots, &disks, Choice::Auto);
    let all_found = assign(&wipe, &mut drives);
    let result = if all_found && drives.iter().all(|d| d.result == Outcome::Success && d.verification.is_some()) {
        Outcome::Success
    } else {
        Outcome::Failure
    };
    Ok((result, drives))
}

/// The disks to wipe: the named devices, or every disk discovery finds.
pub fn disks(roots: &Roots, named: &[PathBuf]) -> anyhow::Result<Vec<Disk>> {
    if !named.is_empty() {
        return named.iter().map(|p| device::disk_at(roots, p)).collect();
    }
    let (disks, skipped) = device::discover(roots)?;
    for s in skipped {
        eprintln!("paddock-agent: skipping {}: {}", s.name, s.reason);
    }
    Ok(disks)
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
