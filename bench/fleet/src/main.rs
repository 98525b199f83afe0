//! `bench/fleet/run`'s driver: enroll and clean a fleet of emulated machines spread over
//! several sushy-tools Redfish emulators, with the REAL Redfish driver, against one machine alone
//! measured in the same run.
//!
//! ```text
//! fleet-bench serve <database-url> [--listen A] [--concurrency N] [--pool N] [--per-host N] ...
//! fleet-bench run   <admin-url> --emulators URL,URL,... --prefixes P,P,... [--fleet 200] [--singles 3] ...
//! ```
//!
//! `run` makes its own database (`fleet_bench`), migrates it, serves a tiny wipe image over HTTP
//! (the emulator downloads every image it inserts), starts `serve` (this binary: the API and the
//! worker with the machine and cluster reconcilers and `RedfishBmc`, as `paddock serve` runs them
//! with `PADDOCK_BMC_DRIVER=redfish`) as a child process, and plays the wipe agent of every machine:
//! it watches paddock's database for machines booted into their wipe, reads the seed URL (token and
//! all) back from the emulator's virtual media as a booted machine would find it, fetches
//! the seed's `paddock/agent.json`, `{agent_url}/v1/agent/config` with its agent token, and posts
//! the report with evidence of every drive, at once.
//!
//! Measures: one machine alone, enroll -> available (`--singles` times before the fleet and as
//! many after), then the fleet: `--fleet` machines enrolled at once through the API, wall time
//! until every one is available. Prints `key: value` lines on stdout; progress goes to stderr.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::StreamExt;
use paddock_api::{ApiConfig, AppState};
use paddock_auth::{Claims, Secret, Verifier, VerifierConfig};
use paddock_domain::secret::Cipher;
use paddock_service::agent::AgentSettings;
use paddock_service::Services;
use paddock_store::Store;
use paddock_types::agent::AgentSeed;
use paddock_worker::reconcile::{self, ClusterReconciler, Drivers, MachineReconciler};
use paddock_worker::{JobHandler, Worker, WorkerConfig};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use uuid::Uuid;

/// The HS256 secret shared by the driver and its `serve` child (a benchmark, not a deployment).
const SECRET: &str = "fleet-bench-secret-of-at-least-32-bytes!";

// ------------------------------------------------------------------------------------------------
// Arguments
// ------------------------------------------------------------------------------------------------

struct Args {
    positional: Vec<String>,
    options: BTreeMap<String, String>,
}

impl Args {
    fn parse() -> anyhow::Result<Self> {
        let mut positional = Vec::new();
        let mut options = BTreeMap::new();
        let mut it = std::env::args().skip(1);
        while let Some(a) = it.next() {
            if let Some(name) = a.strip_prefix("--") {
                if let Some((k, v)) = name.split_once('=') {
                    options.insert(k.to_owned(), v.to_owned());
                } else {
                    let v = it.next().with_context(|| format!("--{name} needs a value"))?;
                    options.insert(name.to_owned(), v);
                }
            } else {
                positional.push(a);
            }
        }
        Ok(Self { positional, options })
    }

    fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> anyhow::Result<T> {
        match self.options.get(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| anyhow::anyhow!("--{name}: cannot parse {v:?}")),
        }
    }

    fn list(&self, name: &str) -> Vec<String> {
        self.options
            .get(name)
            .map(|v| v.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect())
            .unwrap_or_default()
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: fleet-bench serve <database-url> --wipe-url URL [--listen A] [--concurrency N] [--pool N] \
         [--per-host N] [--poll-ms MS] [--report-wait-ms MS]\n\
         \x20      fleet-bench run <admin-url> --emulators URL,... --systems-files FILE,... [--emulator-pids PID,...] \
         [--fleet N] [--singles N] [--concurrency N] [--pool N] [--per-host N] [--power-delay S]"
    );
    std::process::exit(2)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse()?;
    let (Some(cmd), Some(url)) = (args.positional.first(), args.positional.get(1)) else { usage() };
    match cmd.as_str() {
        "serve" => serve(url, &args).await,
        "run" => run(url, &args).await,
        _ => usage(),
    }
}

// ------------------------------------------------------------------------------------------------
// serve: the paddock process under test (mirrors crates/paddock/src/server.rs `run` with
// PADDOCK_BMC_DRIVER=redfish, PADDOCK_KUBE_DRIVER=none)
// ------------------------------------------------------------------------------------------------

async fn serve(database_url: &str, args: &Args) -> anyhow::Result<()> {
    if let Ok(filter) = std::env::var("PADDOCK_LOG") {
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    }
    let listen: SocketAddr = args.get("listen", "127.0.0.1:18081".parse()?)?;
    let concurrency: usize = args.get("concurrency", 64)?;
    let pool: u32 = args.get("pool", 80)?;
    let per_host: usize = args.get("per-host", 4)?;
    let defaults = reconcile::Settings::default();
    let poll = Duration::from_millis(args.get("poll-ms", defaults.poll.as_millis() as u64)?);
    let report_wait = Duration::from_millis(args.get("report-wait-ms", defaults.report_wait.as_millis() as u64)?);
    let wipe_url: String = args.get("wipe-url", String::new())?;
    if wipe_url.is_empty() {
        bail!("--wipe-url is needed");
    }

    let store = Store::connect_lazy(database_url, pool)?;
    let key = std::env::var("FLEET_BENCH_KEY").unwrap_or_else(|_| Cipher::generate_key());
    let cipher = Arc::new(Cipher::new(&key, &[])?);
    // Plain http on loopback, as `PADDOCK_AGENT_INSECURE_HTTP=true` allows a lab; the images'
    // digest is the served image's.
    let base = format!("http://{listen}");
    let digest = image_sha256();
    let services = Services::new(store.clone(), cipher, bench_ledger_key()).with_agent(AgentSettings {
        base_url: base.clone(),
        seed_base_url: base,
        ca_cert: None,
        wipe_image_sha256: digest.clone(),
        os_image_sha256: digest,
    });
    // One limiter per process, as `paddock serve` (crates/paddock/src/server.rs) makes it.
    let limiter = paddock_redfish::BmcLimiter::new(per_host);
    let drivers = Drivers { bmc: Some(Arc::new(paddock_redfish::RedfishBmc::new(limiter))), kube: None };
    let lifecycle = reconcile::Settings {
        os_image_url: Some(wipe_url.replace("wipe.iso", "node-os.iso")),
        wipe_image_url: Some(wipe_url),
        poll,
        report_wait,
        ..defaults
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let handlers: Vec<Arc<dyn JobHandler>> = vec![
        Arc::new(MachineReconciler::new(services.clone(), drivers.clone(), lifecycle.clone())),
        Arc::new(ClusterReconciler::new(services.clone(), drivers, lifecycle)),
    ];
    let config = WorkerConfig { concurrency, lease: Duration::from_secs(30), ..WorkerConfig::default() };
    let worker = Worker::new(store.clone(), "fleet-bench", handlers, config)?;
    let mut jobs_stop = stop_rx.clone();
    let worker_task = tokio::spawn(async move {
        worker
            .run(async move {
                let _ = jobs_stop.changed().await;
            })
            .await
    });

    let verifier = Verifier::new(VerifierConfig {
        hs256_secret: Some(Secret::new(SECRET.as_bytes().to_vec())),
        ..VerifierConfig::default()
    })
    .await?;
    let state = AppState::new(services, verifier, ApiConfig::default());
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("listening on {listen}"))?;
    eprintln!(
        "serve: listening on {listen} (worker concurrency {concurrency}, pool {pool}, {per_host} calls per BMC host)"
    );
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        term.recv().await;
    };
    axum::serve(listener, paddock_api::router(state)).with_graceful_shutdown(shutdown).await?;
    let _ = stop_tx.send(true);
    let _ = worker_task.await;
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// CPU accounting (as bench/lifecycle)
// ------------------------------------------------------------------------------------------------

const TICKS: f64 = 100.0;

fn proc_cpu(pid: u32, children: bool) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let mut t = n(11) + n(12);
    if children {
        t += n(13) + n(14);
    }
    Some(t / TICKS)
}

fn postgres_cpu() -> f64 {
    let mut total = 0.0;
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "postgres" {
                total += proc_cpu(pid, true).unwrap_or(0.0);
            }
        }
    }
    total
}

fn machine_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let line = stat.lines().next().unwrap_or_default();
    let v: Vec<f64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let busy: f64 = v.iter().take(8).enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, x)| x).sum();
    busy / TICKS
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split(' ').take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[derive(Clone, Copy)]
struct Snap {
    at: Instant,
    server: f64,
    postgres: f64,
    emulators: f64,
    driver: f64,
    machine: f64,
}

fn snap(server: u32, emulators: &[u32]) -> Snap {
    Snap {
        at: Instant::now(),
        server: proc_cpu(server, false).unwrap_or(0.0),
        postgres: postgres_cpu(),
        // The emulator's image downloads run in its own process (threads), children included.
        emulators: emulators.iter().map(|p| proc_cpu(*p, true).unwrap_or(0.0)).sum(),
        driver: proc_cpu(std::process::id(), false).unwrap_or(0.0),
        machine: machine_cpu(),
    }
}

fn print_cpu(prefix: &str, a: &Snap, b: &Snap) {
    let secs = (b.at - a.at).as_secs_f64().max(1e-9);
    let server = b.server - a.server;
    let postgres = b.postgres - a.postgres;
    let emulators = b.emulators - a.emulators;
    let driver = b.driver - a.driver;
    let other = (b.machine - a.machine - server - postgres - emulators - driver).max(0.0);
    println!(
        "{prefix}_cores: paddock={:.2} postgres={:.2} emulators={:.2} driver+agent={:.2} other={:.2} (of {} cores)",
        server / secs,
        postgres / secs,
        emulators / secs,
        driver / secs,
        other / secs,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
}

// ------------------------------------------------------------------------------------------------
// Database, server child, API
// ------------------------------------------------------------------------------------------------

async fn fresh_database(admin: &PgPool, admin_url: &str, name: &str) -> anyhow::Result<String> {
    sqlx::query(&format!("drop database if exists {name} with (force)")).execute(admin).await?;
    sqlx::query(&format!("create database {name}")).execute(admin).await?;
    let mut u = url::Url::parse(admin_url).context("database URL")?;
    u.set_path(&format!("/{name}"));
    let url = u.to_string();
    let pool = PgPoolOptions::new().max_connections(1).connect(&url).await?;
    paddock_store::MIGRATOR.run(&pool).await?;
    pool.close().await;
    Ok(url)
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

struct Server {
    child: tokio::process::Child,
    pid: u32,
    base: String,
}

impl Server {
    async fn start(database_url: &str, extra: &[(&str, String)]) -> anyhow::Result<Self> {
        let port = free_port()?;
        let listen = format!("127.0.0.1:{port}");
        let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
        cmd.arg("serve").arg(database_url).arg("--listen").arg(&listen);
        for (k, v) in extra {
            cmd.arg(format!("--{k}")).arg(v);
        }
        cmd.stdin(Stdio::null()).kill_on_drop(true).env("FLEET_BENCH_KEY", Cipher::generate_key());
        let child = cmd.spawn().context("starting `fleet-bench serve`")?;
        let pid = child.id().context("child pid")?;
        let base = format!("http://{listen}");
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while http.get(format!("{base}/v1/machine-classes")).send().await.is_err() {
            if Instant::now() > deadline {
                bail!("the server did not start listening");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Self { child, pid, base })
    }

    async fn stop(mut self) {
        let _ = std::process::Command::new("kill").arg("-TERM").arg(self.pid.to_string()).status();
        if tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await.is_err() {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
    }
}

#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Api {
    fn new(base: &str) -> anyhow::Result<Self> {
        let now = chrono::Utc::now().timestamp();
        let claims = Claims {
            sub: "fleet-bench".into(),
            roles: vec!["provider:admin".into()],
            tenant_id: None,
            exp: now + 24 * 3600,
            nbf: Some(now - 5),
            iat: Some(now),
            iss: "paddock".into(),
            aud: Value::String("paddock".into()),
        };
        let token = paddock_auth::mint_hs256(&Secret::new(SECRET.as_bytes().to_vec()), &claims)?;
        let http = reqwest::Client::builder().pool_max_idle_per_host(256).build()?;
        Ok(Self { http, base: base.to_owned(), token })
    }

    async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let resp = self.http.post(format!("{}{path}", self.base)).bearer_auth(&self.token).json(body).send().await?;
        let status = resp.status().as_u16();
        let v: Value = serde_json::from_slice(&resp.bytes().await?).unwrap_or(Value::Null);
        if !(200..300).contains(&status) {
            bail!("POST {path}: {status} {v}");
        }
        Ok(v)
    }
}

// ------------------------------------------------------------------------------------------------
// The image server: the emulator downloads every image it inserts
// ------------------------------------------------------------------------------------------------

/// Serves 64 KiB for `GET /images/<name>.iso`, 404 otherwise; counts the downloads.
/// What the image server serves for any image: 64 KiB of 0x42.
fn served_image() -> Vec<u8> {
    vec![0x42u8; 64 * 1024]
}

/// The SHA-256 of [`served_image`], which the agent reports and `serve` configures.
fn image_sha256() -> String {
    hex::encode(Sha256::digest(served_image()))
}

async fn image_server(downloads: Arc<AtomicU64>) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            let downloads = downloads.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&request).into_owned();
                let mut words = head.split_whitespace();
                let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                let found = path.starts_with("/images/") && path.ends_with(".iso");
                let body = if found { served_image() } else { Vec::new() };
                if found && method == "GET" {
                    downloads.fetch_add(1, Ordering::Relaxed);
                }
                let status = if found { "200 OK" } else { "404 Not Found" };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n",
                    body.len()
                );
                let _ = socket.write_all(head.as_bytes()).await;
                if method != "HEAD" {
                    let _ = socket.write_all(&body).await;
                }
                let _ = socket.shutdown().await;
            });
        }
    });
    Ok(format!("{base}/images/wipe.iso"))
}

// ------------------------------------------------------------------------------------------------
// The test agent: answers every wipe boot at once
// ------------------------------------------------------------------------------------------------

#[derive(Default)]
struct AgentStats {
    answered: AtomicU64,
    errors: AtomicU64,
    /// Seconds from `run_booted_at` (paddock's record of the boot) to the report's 204.
    latencies: Mutex<Vec<f64>>,
    first_error: Mutex<Option<String>>,
}

/// Watches paddock's database every `every` for machines booted into their wipe (state
/// `cleaning`, `run_booted_at` set, `run_finished_at` not), and for each new run plays the agent:
/// the seed URL from the emulator's virtual media, the config, the report of every drive.
async fn agent(db: PgPool, stats: Arc<AgentStats>, every: Duration, mut stop: watch::Receiver<bool>) {
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build().expect("http client");
    let mut seen: HashSet<Uuid> = HashSet::new();
    let limit = Arc::new(tokio::sync::Semaphore::new(32));
    loop {
        let rows = sqlx::query(
            "select run_id, bmc_url, system_uuid, run_booted_at from machines \
             where state = 'cleaning' and run_purpose = 'wipe' and run_booted_at is not null and run_finished_at is null",
        )
        .fetch_all(&db)
        .await
        .unwrap_or_default();
        for r in rows {
            let run: Uuid = r.get(0);
            if !seen.insert(run) {
                continue;
            }
            let bmc: String = r.get(1);
            let uuid: Option<String> = r.get(2);
            let booted: chrono::DateTime<chrono::Utc> = r.get(3);
            let (http, stats, limit) = (http.clone(), stats.clone(), limit.clone());
            tokio::spawn(async move {
                let _permit = limit.acquire().await;
                match answer(&http, &bmc, uuid.as_deref().unwrap_or_default()).await {
                    Ok(()) => {
                        stats.answered.fetch_add(1, Ordering::Relaxed);
                        let lat = (chrono::Utc::now() - booted).num_milliseconds() as f64 / 1000.0;
                        stats.latencies.lock().expect("lock").push(lat);
                    }
                    Err(e) => {
                        stats.errors.fetch_add(1, Ordering::Relaxed);
                        stats.first_error.lock().expect("lock").get_or_insert_with(|| format!("{e:#}"));
                    }
                }
            });
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
    }
}

async fn get_json(http: &reqwest::Client, url: &str) -> anyhow::Result<Value> {
    let resp = http.get(url).send().await?;
    let status = resp.status();
    let v: Value = resp.json().await.with_context(|| format!("GET {url}: {status}"))?;
    if !status.is_success() {
        bail!("GET {url}: {status} {v}");
    }
    Ok(v)
}

async fn answer(http: &reqwest::Client, bmc: &str, uuid: &str) -> anyhow::Result<()> {
    // The seed, as the booted machine finds it: the image of the virtual media device that is
    // not the wipe image's `Cd`.
    let bmc = bmc.trim_end_matches('/');
    let collection = get_json(http, &format!("{bmc}/redfish/v1/Systems/{uuid}/VirtualMedia")).await?;
    let mut seed = None;
    for m in collection["Members"].as_array().into_iter().flatten() {
        let Some(path) = m["@odata.id"].as_str() else { continue };
        if path.ends_with("/Cd") {
            continue;
        }
        let dev = get_json(http, &format!("{bmc}{path}")).await?;
        if let Some(image) = dev["Image"].as_str().filter(|i| i.contains("/v1/agent/seed/")) {
            seed = Some(image.to_owned());
        }
    }
    // The seed image at that URL, read as the machine reads it: paddock/agent.json.
    let seed = seed.with_context(|| format!("no seed inserted in {uuid} at {bmc}"))?;
    let image = http.get(&seed).send().await?.error_for_status().context("fetching the seed")?.bytes().await?;
    let json = paddock_seed::read_file(&image, "paddock/agent.json").context("no paddock/agent.json in the seed")?;
    let found: AgentSeed = serde_json::from_slice(&json).context("paddock/agent.json")?;
    let config =
        http.get(format!("{}/v1/agent/config", found.agent_url)).bearer_auth(&found.agent_token).send().await?;
    let config: Value = config.error_for_status().context("GET config")?.json().await?;
    let listed = config["config"]["drives"].as_array().context("no drives in the config")?;
    let drives: Vec<Value> = listed.iter().map(|d| evidence(listed, d)).collect();
    let devices: Vec<Value> = (0..drives.len())
        .map(|i| json!({ "name": format!("disk{i}"), "kind": "disk", "action": "wiped", "reason": "a disk" }))
        .collect();
    let body = json!({
        "result": "success", "drives": drives, "devices": devices, "image_sha256": image_sha256(),
        "nonce": config["nonce"],
        "started_at": chrono::Utc::now() - chrono::Duration::seconds(1), "finished_at": chrono::Utc::now(),
    });
    let report = format!("{}/v1/agent/report", found.agent_url);
    let resp = http.post(report).bearer_auth(&found.agent_token).json(&body).send().await?;
    if resp.status().as_u16() != 204 {
        bail!("report: {} {}", resp.status(), resp.text().await.unwrap_or_default());
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// run
// ------------------------------------------------------------------------------------------------

/// One emulated system: its emulator's URL and its UUID.
#[derive(Clone)]
struct System {
    bmc: String,
    uuid: String,
}

async fn enroll(api: &Api, name: &str, s: &System) -> anyhow::Result<Uuid> {
    let body = json!({
        "name": name,
        "machine_class": "fleet",
        "bmc": { "url": s.bmc, "system_id": s.uuid, "username": "admin", "password": "password",
                 "allow_insecure_http": true },
    });
    let v = api.post("/v1/machines", &body).await?;
    let id = v["machine"]["id"].as_str().or(v["id"].as_str()).with_context(|| format!("no machine id in {v}"))?;
    Ok(Uuid::parse_str(id)?)
}

async fn state_of(db: &PgPool, id: Uuid) -> anyhow::Result<(String, Option<Value>)> {
    let r = sqlx::query("select state, last_error from machines where id = $1").bind(id).fetch_one(db).await?;
    Ok((r.get(0), r.get(1)))
}

const FAILED: [&str; 3] = ["clean_failed", "maintenance", "retired"];

/// One machine alone: enroll -> available, in seconds.
async fn single(api: &Api, db: &PgPool, name: &str, s: &System) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let id = enroll(api, name, s).await?;
    loop {
        let (state, err) = state_of(db, id).await?;
        if state == "available" {
            return Ok(t0.elapsed().as_secs_f64());
        }
        if FAILED.contains(&state.as_str()) || t0.elapsed() > Duration::from_secs(600) {
            bail!("{name}: {state} after {:.1} s, last_error {err:?}", t0.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn run(admin_url: &str, args: &Args) -> anyhow::Result<()> {
    let emulators = args.list("emulators");
    let files = args.list("systems-files");
    let pids: Vec<u32> = args.list("emulator-pids").iter().filter_map(|p| p.parse().ok()).collect();
    if emulators.is_empty() || emulators.len() != files.len() {
        usage();
    }
    let fleet: usize = args.get("fleet", 200)?;
    let singles: usize = args.get("singles", 3)?;
    let concurrency: usize = args.get("concurrency", 64)?;
    let pool: u32 = args.get("pool", 80)?;
    let per_host: usize = args.get("per-host", 4)?;
    let enroll_parallel: usize = args.get("enroll-parallel", 16)?;
    let agent_every = Duration::from_millis(args.get("agent-poll-ms", 100)?);
    let power_delay: String = args.get("power-delay", "?".to_owned())?;
    let poll_ms: Option<u64> = args.options.get("poll-ms").and_then(|v| v.parse().ok());
    let report_wait_ms: Option<u64> = args.options.get("report-wait-ms").and_then(|v| v.parse().ok());

    // The systems, by emulator, from each emulator's systems.json.
    let mut by_emulator: Vec<Vec<System>> = Vec::new();
    for (url, file) in emulators.iter().zip(&files) {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(file).with_context(|| file.clone())?)?;
        let list: Vec<System> = v["systems"]
            .as_array()
            .context("systems.json: no systems")?
            .iter()
            .filter_map(|s| s["uuid"].as_str())
            .map(|u| System { bmc: url.clone(), uuid: u.to_owned() })
            .collect();
        by_emulator.push(list);
    }
    // Singles take the last systems of each emulator, round-robin; the fleet the rest, round-robin.
    let mut single_systems = Vec::new();
    'outer: for k in 0.. {
        let mut any = false;
        for list in by_emulator.iter_mut() {
            if single_systems.len() == 2 * singles {
                break 'outer;
            }
            if let Some(s) = list.pop() {
                single_systems.push(s);
                any = true;
            }
        }
        if !any || k > 10_000 {
            break;
        }
    }
    let mut fleet_systems = Vec::new();
    let most = by_emulator.iter().map(Vec::len).max().unwrap_or(0);
    for i in 0..most {
        for list in &by_emulator {
            if let Some(s) = list.get(i) {
                fleet_systems.push(s.clone());
            }
        }
    }
    if single_systems.len() < 2 * singles || fleet_systems.len() < fleet {
        bail!(
            "not enough systems: {} emulated, {} needed ({fleet} for the fleet, {} for the singles)",
            single_systems.len() + fleet_systems.len(),
            fleet + 2 * singles,
            2 * singles
        );
    }
    fleet_systems.truncate(fleet);

    let admin = PgPoolOptions::new().max_connections(2).connect(admin_url).await?;
    let name = "fleet_bench";
    let url = fresh_database(&admin, admin_url, name).await?;
    let db = PgPoolOptions::new().max_connections(4).connect(&url).await?;
    let downloads = Arc::new(AtomicU64::new(0));
    let wipe_url = image_server(downloads.clone()).await?;
    let mut extra = vec![
        ("concurrency", concurrency.to_string()),
        ("pool", pool.to_string()),
        ("per-host", per_host.to_string()),
        ("wipe-url", wipe_url.clone()),
    ];
    if let Some(p) = poll_ms {
        extra.push(("poll-ms", p.to_string()));
    }
    if let Some(r) = report_wait_ms {
        extra.push(("report-wait-ms", r.to_string()));
    }
    let server = Server::start(&url, &extra).await?;
    let api = Api::new(&server.base)?;
    api.post(
        "/v1/machine-classes",
        &json!({"name": "fleet", "cpu_cores": 64, "memory_gib": 512, "gpu_model": "", "gpu_count": 0,
                "description": "fleet bench"}),
    )
    .await?;
    let stats = Arc::new(AgentStats::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let agent_task = tokio::spawn(agent(db.clone(), stats.clone(), agent_every, stop_rx));

    let load_start = loadavg();
    let mut single_times = Vec::new();
    for (k, s) in single_systems.iter().take(singles).enumerate() {
        let t = single(&api, &db, &format!("single-a{k}"), s).await?;
        eprintln!("one machine alone (before): {t:.2} s");
        single_times.push(t);
    }

    // The fleet.
    eprintln!(
        "fleet: {fleet} machines on {} emulators, worker concurrency {concurrency}, {per_host} calls per BMC host",
        emulators.len()
    );
    let a = snap(server.pid, &pids);
    let t0 = Instant::now();
    let ids: Vec<anyhow::Result<Uuid>> = futures::stream::iter(fleet_systems.iter().enumerate())
        .map(|(i, s)| {
            let api = api.clone();
            async move { enroll(&api, &format!("fleet-{i:04}"), s).await }
        })
        .buffered(enroll_parallel)
        .collect()
        .await;
    let enrolled_s = t0.elapsed().as_secs_f64();
    let ids: Vec<Uuid> = ids.into_iter().collect::<anyhow::Result<_>>()?;
    eprintln!("enrolled {fleet} machines in {enrolled_s:.1} s");
    let mut done_at: HashMap<Uuid, f64> = HashMap::new();
    let mut most_cleaning = 0i64;
    let (mut samples, mut running_sum, mut running_most, mut due_sum, mut due_most) = (0i64, 0i64, 0i64, 0i64, 0i64);
    let mut states: Vec<(String, i64)>;
    let mut last_print = Instant::now();
    loop {
        let rows = sqlx::query("select id, state from machines where id = any($1)").bind(&ids).fetch_all(&db).await?;
        let now = t0.elapsed().as_secs_f64();
        let mut counts: BTreeMap<String, i64> = BTreeMap::new();
        for r in &rows {
            let state: String = r.get(1);
            if state == "available" || FAILED.contains(&state.as_str()) {
                done_at.entry(r.get(0)).or_insert(now);
            }
            *counts.entry(state).or_default() += 1;
        }
        let booted: i64 = sqlx::query_scalar(
            "select count(*) from machines where id = any($1) and state = 'cleaning' and run_booted_at is not null \
             and run_finished_at is null",
        )
        .bind(&ids)
        .fetch_one(&db)
        .await?;
        most_cleaning = most_cleaning.max(booted);
        // Worker slots in use, and jobs due but waiting for a slot (the backlog).
        let (running, due): (i64, i64) = sqlx::query_as(
            "select count(*) filter (where state = 'running'), \
                    count(*) filter (where state = 'queued' and run_at <= now()) from jobs",
        )
        .fetch_one(&db)
        .await?;
        samples += 1;
        running_sum += running;
        running_most = running_most.max(running);
        due_sum += due;
        due_most = due_most.max(due);
        states = counts.into_iter().collect();
        if last_print.elapsed() > Duration::from_secs(5) {
            eprintln!("  {now:.0} s: {states:?}");
            last_print = Instant::now();
        }
        if done_at.len() >= fleet {
            break;
        }
        if t0.elapsed() > Duration::from_secs(args.get("timeout-s", 1800)?) {
            bail!("the fleet did not finish: {states:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let wall = t0.elapsed().as_secs_f64();
    let b = snap(server.pid, &pids);
    eprintln!("fleet: {fleet} machines done in {wall:.1} s");
    let failed: Vec<(String, Option<Value>)> =
        sqlx::query("select name, last_error from machines where id = any($1) and state <> 'available'")
            .bind(&ids)
            .fetch_all(&db)
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();

    for (k, s) in single_systems.iter().skip(singles).enumerate() {
        let t = single(&api, &db, &format!("single-b{k}"), s).await?;
        eprintln!("one machine alone (after): {t:.2} s");
        single_times.push(t);
    }
    let load_end = loadavg();
    let _ = stop_tx.send(true);
    let _ = agent_task.await;
    let jobs = sqlx::query(
        "select kind, state, count(*), sum(attempts)::bigint from jobs group by kind, state order by kind, state",
    )
    .fetch_all(&db)
    .await?;
    server.stop().await;

    let mut machine_times: Vec<f64> = done_at.values().copied().collect();
    machine_times.sort_by(f64::total_cmp);
    let mut sorted_single = single_times.clone();
    sorted_single.sort_by(f64::total_cmp);
    let single_mean = single_times.iter().sum::<f64>() / single_times.len().max(1) as f64;
    let single_median = pct(&sorted_single, 0.5);
    let serial = fleet as f64 * single_mean;
    let speedup = serial / wall;
    let mut lat = stats.latencies.lock().expect("lock").clone();
    lat.sort_by(f64::total_cmp);

    println!("test: fleet enroll -> inspect -> wipe -> available, REAL RedfishBmc against sushy-tools (fake driver)");
    println!(
        "setup: {fleet} machines on {} emulator processes ({} systems each, {} emulated in all), power delay {power_delay} s",
        emulators.len(),
        fleet.div_ceil(emulators.len()),
        fleet + 2 * singles
    );
    println!(
        "settings: worker_concurrency={concurrency} pool={pool} per_bmc_host={per_host} enroll_parallel={enroll_parallel} \
         agent_poll_ms={} reconcile_poll_ms={} report_wait_ms={}",
        agent_every.as_millis(),
        poll_ms.map_or_else(|| "default".to_owned(), |p| p.to_string()),
        report_wait_ms.map_or_else(|| "default".to_owned(), |p| p.to_string())
    );
    println!("valid: {}", if failed.is_empty() && stats.errors.load(Ordering::Relaxed) == 0 { "yes" } else { "NO" });
    println!("load_avg: {load_start} -> {load_end}");
    println!(
        "single_machine_s: {} (before {singles}, after {singles}); mean {single_mean:.2}, median {single_median:.2}",
        single_times.iter().map(|t| format!("{t:.2}")).collect::<Vec<_>>().join(" ")
    );
    println!("fleet_enroll_posts_s: {enrolled_s:.2}");
    println!("fleet_wall_s: {wall:.2}");
    println!(
        "fleet_machine_done_s (from the first enroll POST): p10 {:.1}, p50 {:.1}, p90 {:.1}, max {:.1}",
        pct(&machine_times, 0.1),
        pct(&machine_times, 0.5),
        pct(&machine_times, 0.9),
        pct(&machine_times, 1.0)
    );
    println!("most_machines_in_the_wipe_at_once (sampled every 100 ms): {most_cleaning}");
    println!(
        "agent: {} reports, {} errors{}; boot recorded -> report accepted: p50 {:.2} s, max {:.2} s",
        stats.answered.load(Ordering::Relaxed),
        stats.errors.load(Ordering::Relaxed),
        stats.first_error.lock().expect("lock").as_ref().map(|e| format!(" (first: {e})")).unwrap_or_default(),
        pct(&lat, 0.5),
        pct(&lat, 1.0)
    );
    println!(
        "worker_slots_in_use (of {concurrency}, sampled every ~100 ms): mean {:.1}, most {running_most}; \
         jobs due and waiting for a slot: mean {:.1}, most {due_most}",
        running_sum as f64 / samples.max(1) as f64,
        due_sum as f64 / samples.max(1) as f64
    );
    println!("image_downloads_by_the_emulators: {}", downloads.load(Ordering::Relaxed));
    print_cpu("fleet", &a, &b);
    println!(
        "RATIO {fleet} x single / fleet wall = {fleet} x {single_mean:.2} / {wall:.2} = {speedup:.1}x (target >= 20x): {}",
        if speedup >= 20.0 { "MET" } else { "NOT MET" }
    );
    if !failed.is_empty() {
        println!("not available: {}", failed.len());
        for (n, e) in failed.iter().take(5) {
            println!("  {n}: {e:?}");
        }
    }
    println!("final states: {states:?}");
    println!("jobs (kind, state, count, attempts):");
    for r in &jobs {
        println!(
            "  {:<24} {:<10} {:>6} {:>6}",
            r.get::<String, _>(0),
            r.get::<String, _>(1),
            r.get::<i64, _>(2),
            r.get::<Option<i64>, _>(3).unwrap_or(0)
        );
    }
    Ok(())
}

/// The custody ledger key of the bench's process (`PADDOCK_LEDGER_KEY` of `paddock serve`).
fn bench_ledger_key() -> paddock_domain::ledger::LedgerKey {
    paddock_domain::ledger::LedgerKey::new(b"bench-ledger-key-of-at-least-32-bytes".to_vec())
}

/// A listed drive's evidence as the wipe agent reports it: its identity as the BMC listed it
/// (matched by a unique serial, else by protocol and capacity) and the contract's ranges read
/// back as zeroes.
fn evidence(listed: &[Value], d: &Value) -> Value {
    let size = d["capacity_bytes"].as_u64().unwrap_or(0);
    let unique = d["serial"].is_string() && listed.iter().filter(|o| o["serial"] == d["serial"]).count() == 1;
    let bytes = paddock_domain::agent::verified_bytes(size);
    json!({
        "id": d["id"], "match_basis": if unique { "serial" } else { "protocol_capacity" },
        "identity": { "serial": d["serial"], "size_bytes": size, "protocol": d["protocol"] },
        "method": "nvme-format-user-data", "result": "success",
        "verification": { "ranges": 66, "bytes_read": bytes, "sha256": paddock_domain::agent::zeros_sha256(bytes) },
    })
}
