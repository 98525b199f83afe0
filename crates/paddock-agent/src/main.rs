//! `paddock-agent`: `run` (what the wipe image's init starts), `wipe` (standalone, for operators)
//! and `discover` (what `run` would wipe, without wiping).

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::{bail, Context};
use paddock_agent::device::{self, Roots};
use paddock_agent::run::{self, Purpose, RunOptions};
use paddock_agent::wipe::{self, Choice, Outcome};
use serde_json::json;

/// Where an image may state its digest (the ISO cannot hold its own: see
/// [`paddock_agent::device::image_sha256`]).
const IMAGE_SHA256_FILE: &str = "/etc/paddock/image.sha256";

const USAGE: &str = "usage:
  paddock-agent wipe --device PATH... [--method auto|NAME] [--report FILE]
  paddock-agent run [--seed-device PATH] [--device PATH...] [--image PATH] [--image-sha256 HEX]
                    [--config-timeout SECONDS] [--no-poweroff]
  paddock-agent discover";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match dispatch(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("paddock-agent: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn dispatch(args: &[String]) -> anyhow::Result<ExitCode> {
    let (cmd, rest) = args.split_first().with_context(|| USAGE.to_owned())?;
    let opts = Opts::parse(rest)?;
    match cmd.as_str() {
        "wipe" => wipe_cmd(&opts),
        "run" => run_cmd(&opts),
        "discover" => discover_cmd(),
        _ => bail!("unknown command {cmd:?}\n{USAGE}"),
    }
}

/// Every option of every command (each command reads the ones it knows).
#[derive(Default)]
struct Opts {
    devices: Vec<PathBuf>,
    method: Option<String>,
    report: Option<PathBuf>,
    seed_device: Option<PathBuf>,
    image: Option<PathBuf>,
    image_sha256: Option<String>,
    config_timeout: Option<u64>,
    no_poweroff: bool,
}

impl Opts {
    fn parse(args: &[String]) -> anyhow::Result<Opts> {
        let mut o = Opts::default();
        let mut it = args.iter().peekable();
        while let Some(arg) = it.next() {
            let mut value = || it.next().cloned().with_context(|| format!("{arg} needs a value\n{USAGE}"));
            match arg.as_str() {
                "--device" => {
                    o.devices.push(value()?.into());
                    // `--device a b c`: the values up to the next option.
                    while let Some(v) = it.next_if(|v| !v.starts_with("--")) {
                        o.devices.push(v.into());
                    }
                }
                "--method" => o.method = Some(value()?),
                "--report" => o.report = Some(value()?.into()),
                "--seed-device" => o.seed_device = Some(value()?.into()),
                "--image" => o.image = Some(value()?.into()),
                "--image-sha256" => o.image_sha256 = Some(value()?),
                "--config-timeout" => {
                    o.config_timeout = Some(value()?.parse().context("--config-timeout takes seconds")?)
                }
                "--no-poweroff" => o.no_poweroff = true,
                _ => bail!("unknown option {arg:?}\n{USAGE}"),
            }
        }
        Ok(o)
    }
}

fn wipe_cmd(opts: &Opts) -> anyhow::Result<ExitCode> {
    if opts.devices.is_empty() {
        bail!("wipe needs at least one --device\n{USAGE}");
    }
    let choice = match opts.method.as_deref() {
        None | Some("auto") => Choice::Auto,
        Some(name) => Choice::Only(name.parse()?),
    };
    let roots = Roots::default();
    let (disks, _) = run::disks(&roots, &opts.devices)?;
    let reports = wipe::wipe_all(&roots, &disks, choice);
    let drives: Vec<WipedDevice> =
        disks.iter().zip(&reports).map(|(disk, report)| WipedDevice { device: &disk.path, report }).collect();
    let ok = reports.iter().all(|d| d.result == Outcome::Success);
    for d in drives.iter().filter(|d| d.report.result == Outcome::Failure) {
        eprintln!(
            "paddock-agent: {} FAILED: {}",
            d.device.display(),
            d.report.detail.as_deref().unwrap_or("no detail")
        );
    }
    let result = if ok { Outcome::Success } else { Outcome::Failure };
    let out = serde_json::to_string_pretty(&WipeOutput { result, drives: &drives })?;
    if let Some(path) = &opts.report {
        std::fs::write(path, format!("{out}\n")).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{out}");
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// What `wipe` prints and writes to `--report`.
#[derive(serde::Serialize)]
struct WipeOutput<'a> {
    result: Outcome,
    drives: &'a [WipedDevice<'a>],
}

/// A drive's evidence with the device node wiped (the report names drives by `id` instead).
#[derive(serde::Serialize)]
struct WipedDevice<'a> {
    device: &'a std::path::Path,
    #[serde(flatten)]
    report: &'a paddock_types::agent::DriveReport,
}

fn run_cmd(opts: &Opts) -> anyhow::Result<ExitCode> {
    let run_opts = RunOptions {
        seed_device: opts.seed_device.clone(),
        devices: opts.devices.clone(),
        image: opts.image.clone(),
        // The flag, else the file an image may carry, else (in `run`) the boot medium's digest.
        image_sha256: opts
            .image_sha256
            .clone()
            .or_else(|| std::fs::read_to_string(IMAGE_SHA256_FILE).ok().map(|f| f.trim().to_owned())),
        config_timeout: Duration::from_secs(opts.config_timeout.unwrap_or(3600)),
    };
    let outcome = run::run(&Roots::default(), &run_opts);
    if !opts.no_poweroff {
        match &outcome {
            // A provisioning boot stays up after its report: paddock ejects the media and restarts
            // the machine from disk, into the node OS just installed (or, after a failure, powers
            // it off as it releases it).
            Ok(o) if o.purpose == Purpose::Provision => wait_for_restart(),
            _ => power_off(),
        }
    }
    match outcome? {
        o if o.result == Outcome::Success => Ok(ExitCode::SUCCESS),
        _ => Ok(ExitCode::FAILURE),
    }
}

fn discover_cmd() -> anyhow::Result<ExitCode> {
    let (disks, left) = device::discover(&Roots::default())?;
    let disks: Vec<_> = disks.iter().map(|d| json!({ "device": d.path, "identity": d.identity })).collect();
    println!("{}", serde_json::to_string_pretty(&json!({ "disks": disks, "left": left }))?);
    Ok(ExitCode::SUCCESS)
}

/// Waits for paddock to restart the machine (never returns).
fn wait_for_restart() -> ! {
    eprintln!("paddock-agent: provisioning reported; waiting for paddock to restart the machine from disk");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Flushes and powers the machine off (busybox's or systemd's `poweroff -f`).
fn power_off() {
    let _ = Command::new("sync").status();
    if let Err(e) = Command::new("poweroff").arg("-f").status() {
        eprintln!("paddock-agent: powering off failed: {e}");
    }
}
