//! `paddock-agent run`: seed, `config`, wipe, report (SPEC section 5, "Cleaning").

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chrono::Utc;

use crate::client::{Client, Delivered, Report, WipeConfig};
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

/// How a run ended, once its report was delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunOutcome {
    /// The reported result.
    pub result: Outcome,
    /// How the report was acknowledged.
    pub delivered: Delivered,
}

/// Finds the seed, fetches `config`, wipes, and delivers the report.
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
    if config.purpose != "wipe" {
        bail!("purpose {:?} is not carried out by this agent", config.purpose);
    }
    let wipe: WipeConfig =
        serde_json::from_value(config.config.clone()).context("config's wipe configuration is not valid")?;
    let started_at = Utc::now();
    let disks = disks(roots, &opts.devices)?;
    let mut drives = wipe::wipe_all(roots, &disks, Choice::Auto);
    let all_found = assign(&wipe, &mut drives);
    let result = if all_found && drives.iter().all(|d| d.result == Outcome::Success && d.verification.is_some()) {
        Outcome::Success
    } else {
        Outcome::Failure
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
    eprintln!("paddock-agent: report delivered ({delivered:?}), result {result:?}");
    Ok(RunOutcome { result, delivered })
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
