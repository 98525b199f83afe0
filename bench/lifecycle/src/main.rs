//! `bench/lifecycle/run`'s driver: cluster lifecycle throughput, the worker's cost at rest, and
//! the parallelism of one pool's provisioning, each against paddock's real API and worker over a
//! real PostgreSQL, with the simulated drivers (`paddock-sim`).
//!
//! ```text
//! lifecycle-bench serve     <database-url> [options]   # API + worker + simulated agent, like `paddock serve`
//! lifecycle-bench lifecycle <admin-url> [--clusters N] [--in-flight K] ...
//! lifecycle-bench rest      <admin-url> [--clusters N] [--seconds S] ...
//! lifecycle-bench parallel  <admin-url> [--nodes N] [--boot-ms MS] ...
//! lifecycle-bench fleet     <admin-url> [--machines N] ...
//! lifecycle-bench scale-out <admin-url> --paddock BIN [--workers 1,2,4] ...   # real `paddock api`/`worker` processes
//! lifecycle-bench api-scale <admin-url> --paddock BIN ...                     # 1 and 2 `paddock api` behind haproxy
//! lifecycle-bench elastic   <admin-url> [--pools N] [--seconds S] [--samples K] ...
//! ```
//!
//! The three measuring commands create their own database (`lifecycle_bench_<test>`) on the server
//! `<admin-url>` points at (a superuser URL), migrate it, and run `serve` as a child process (this
//! same binary, which adds the simulated world's own schema, `paddock_sim`) so that the CPU of the paddock process (API + worker + the simulated machines'
//! agent, as `paddock serve` with `PADDOCK_BMC_DRIVER=simulated` runs them) is measured apart from
//! the driver's. Results are printed as `key: value` lines on stdout; progress goes to stderr.

mod apiscale;
mod elastic;
mod fleet;
mod lifecycle;
mod parallel;
mod rest;
mod scaleout;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::StreamExt;
use paddock_api::{ApiConfig, AppState};
use paddock_auth::{Claims, Secret, Verifier, VerifierConfig};
use paddock_domain::secret::Cipher;
use paddock_service::Services;
use paddock_store::Store;
use paddock_worker::reconcile::{self, Autoscaler, ClusterReconciler, DriftCheck, Drivers, MachineReconciler};
use paddock_worker::{JobHandler, Worker, WorkerConfig};
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};
use tokio::sync::watch;

/// The HS256 secret shared by the driver and its `serve` child (a benchmark, not a deployment).
const SECRET: &str = "lifecycle-bench-secret-of-at-least-32-bytes";

// ------------------------------------------------------------------------------------------------
// Arguments
// ------------------------------------------------------------------------------------------------

/// `--name value` options after the positional arguments.
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

    fn str(&self, name: &str, default: &str) -> String {
        self.options.get(name).cloned().unwrap_or_else(|| default.to_owned())
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: lifecycle-bench serve <database-url> [--listen A] [--concurrency N] [--pool N] [--boot-ms MS] \
         [--other-ms MS] [--agent-poll-ms MS] [--poll-ms MS] [--agent true|false]\n\
         \x20      lifecycle-bench lifecycle <admin-url> [--clusters N] [--in-flight K] [--machines M] \
         [--pgbench PATH] [--pgbench-seconds S] [--pgbench-clients C] [--sql-dir DIR]\n\
         \x20      lifecycle-bench rest <admin-url> [--clusters N] [--real R] [--seconds S]\n\
         \x20      lifecycle-bench parallel <admin-url> [--nodes N] [--boot-ms MS]\n\
         \x20      lifecycle-bench fleet <admin-url> [--machines N] [--concurrency N] [--pool N]\n\
         \x20      lifecycle-bench scale-out <admin-url> --paddock BIN [--workers 1,2,4] [--machines N] [--clusters N] \
         [--in-flight K] [--latency-scale S] [--log-dir DIR]\n\
         \x20      lifecycle-bench api-scale <admin-url> --paddock BIN [--wrk PATH] [--haproxy PATH] [--window-s S] [--rounds N]"
    );
    std::process::exit(2)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse()?;
    let (Some(cmd), Some(url)) = (args.positional.first(), args.positional.get(1)) else { usage() };
    match cmd.as_str() {
        "serve" => serve(url, &args).await,
        "lifecycle" => lifecycle::lifecycle(url, &args).await,
        "rest" => rest::rest(url, &args).await,
        "parallel" => parallel::parallel(url, &args).await,
        "fleet" => fleet::fleet(url, &args).await,
        "scale-out" => scaleout::scale_out(url, &args).await,
        "api-scale" => apiscale::api_scale(url, &args).await,
        "elastic" => elastic::elastic(url, &args).await,
        _ => usage(),
    }
}

// ------------------------------------------------------------------------------------------------
// serve: the paddock process under test (mirrors crates/paddock/src/server.rs `run`)
// ------------------------------------------------------------------------------------------------

async fn serve(database_url: &str, args: &Args) -> anyhow::Result<()> {
    if let Ok(filter) = std::env::var("PADDOCK_LOG") {
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    }
    let listen: SocketAddr = args.get("listen", "127.0.0.1:18080".parse()?)?;
    let concurrency: usize = args.get("concurrency", 16)?;
    let pool: u32 = args.get("pool", 16)?;
    let boot = Duration::from_millis(args.get("boot-ms", 0)?);
    let other = Duration::from_millis(args.get("other-ms", 0)?);
    let agent_poll = Duration::from_millis(args.get("agent-poll-ms", 20)?);
    let poll = Duration::from_millis(args.get("poll-ms", 50)?);
    let run_agent: bool = args.get("agent", true)?;
    let drift_interval = Duration::from_secs(args.get("drift-interval-s", 600)?);
    let autoscale_interval = Duration::from_secs(args.get("autoscale-interval-s", 15)?);

    let store = Store::connect_lazy(database_url, pool)?;
    // One key for every `serve` of a run (the driver passes it), so a restarted process reads
    // what the first one encrypted.
    let key = std::env::var("LIFECYCLE_BENCH_KEY").unwrap_or_else(|_| Cipher::generate_key());
    let cipher = Arc::new(Cipher::new(&key, &[])?);
    let services =
        Services::new(store.clone(), cipher, bench_ledger_key()).with_agent_base_url(&format!("http://{listen}"));
    let sim = paddock_sim::SimConfig {
        bmc_latency: other,
        boot_latency: boot,
        node_ready_latency: other,
        control_plane_latency: other,
        stack_latency: other,
        slurm_latency: other,
        delete_latency: other,
        agent_poll,
    };
    paddock_sim::migrate(&store).await?;
    let world = paddock_sim::SimWorld::new(store.clone(), sim);
    let drivers = Drivers { bmc: Some(world.bmc()), kube: Some(world.kube()) };
    let lifecycle = reconcile::Settings {
        wipe_image_url: Some("http://images.bench.invalid/wipe.img".into()),
        os_image_url: Some("http://images.bench.invalid/os.img".into()),
        poll,
        drift_interval,
        autoscale_interval,
        ..reconcile::Settings::default()
    };
    {
        // As `paddock serve` does at a worker's start.
        let mut tx = store.begin().await?;
        paddock_store::autoscale::enqueue_sweep(&mut tx, Duration::ZERO).await?;
        tx.commit().await?;
        eprintln!("serve: enqueued the demand sweep of elastic pools");
    }
    if !drift_interval.is_zero() {
        // As `paddock serve` does at a worker's start.
        let mut conn = store.conn().await?;
        let armed = paddock_store::drift::arm_unarmed(&mut conn, drift_interval).await?;
        eprintln!("serve: armed the drift checks of {armed} ready clusters");
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    if run_agent {
        tokio::spawn(world.agent(reqwest::Client::new()).run(stop_rx.clone()));
    }
    let clusters = ClusterReconciler::new(services.clone(), drivers.clone(), lifecycle.clone());
    let handlers: Vec<Arc<dyn JobHandler>> = vec![
        Arc::new(MachineReconciler::new(services.clone(), drivers, lifecycle)),
        Arc::new(DriftCheck(clusters.clone())),
        Arc::new(Autoscaler(clusters.clone())),
        Arc::new(clusters),
    ];
    let config = WorkerConfig { concurrency, lease: Duration::from_secs(30), ..WorkerConfig::default() };
    let worker = Worker::new(store.clone(), "lifecycle-bench", handlers, config)?;
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
    eprintln!("serve: listening on {listen}");
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
// Shared helpers for the measuring commands
// ------------------------------------------------------------------------------------------------

/// CPU clock ticks per second (`getconf CLK_TCK`; 100 on Linux).
const TICKS: f64 = 100.0;

/// utime + stime (+ children's) of a process, in seconds.
fn proc_cpu(pid: u32, children: bool) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // After the comm: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let mut t = n(11) + n(12);
    if children {
        t += n(13) + n(14);
    }
    Some(t / TICKS)
}

/// The benchmark's own postmaster (found by [`fresh_database`]): other PostgreSQL servers on the
/// machine (tests, builds) must not count.
static POSTMASTER: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// The parent process id of `pid`.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].split(' ').nth(1)?.parse().ok()
}

/// CPU seconds of the benchmark's PostgreSQL server: its postmaster and every process it started
/// (exited backends count through the postmaster's children times).
fn postgres_cpu() -> f64 {
    let Some(&postmaster) = POSTMASTER.get() else { return 0.0 };
    let mut total = proc_cpu(postmaster, true).unwrap_or(0.0);
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if parent_of(pid) == Some(postmaster) {
                total += proc_cpu(pid, true).unwrap_or(0.0);
            }
        }
    }
    total
}

/// Finds the postmaster of the server `admin` is connected to: the parent of its checkpointer.
async fn find_postmaster(admin: &PgPool) -> anyhow::Result<()> {
    if POSTMASTER.get().is_some() {
        return Ok(());
    }
    let checkpointer: i32 = sqlx::query_scalar("select pid from pg_stat_activity where backend_type = 'checkpointer'")
        .fetch_one(admin)
        .await?;
    let postmaster = parent_of(checkpointer as u32).context("the checkpointer's parent (is the server local?)")?;
    let _ = POSTMASTER.set(postmaster);
    Ok(())
}

/// CPU seconds of the whole machine (all cores), from /proc/stat.
fn machine_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let line = stat.lines().next().unwrap_or_default();
    let v: Vec<f64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal: busy = all but idle and iowait.
    let busy: f64 = v.iter().take(8).enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, x)| x).sum();
    busy / TICKS
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split(' ').take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// A point in time for deltas: wall clock, commits of the database, CPU of each party.
#[derive(Clone, Copy)]
struct Snap {
    at: Instant,
    commits: i64,
    rollbacks: i64,
    wal_records: i64,
    wal_syncs: i64,
    server: f64,
    postgres: f64,
    driver: f64,
    machine: f64,
}

async fn snap(admin: &PgPool, db: &str, server_pid: Option<u32>) -> anyhow::Result<Snap> {
    // Statistics are flushed by backends at most once a second (PostgreSQL 15); ask for a fresh
    // snapshot of what has been reported.
    let row = sqlx::query(
        "select xact_commit, xact_rollback, (select wal_records from pg_stat_wal), (select wal_sync from pg_stat_wal) \
         from pg_stat_database where datname = $1",
    )
    .bind(db)
    .fetch_one(admin)
    .await?;
    Ok(Snap {
        at: Instant::now(),
        commits: row.get(0),
        rollbacks: row.get(1),
        wal_records: row.get(2),
        wal_syncs: row.get(3),
        server: server_pid.and_then(|p| proc_cpu(p, false)).unwrap_or(0.0),
        postgres: postgres_cpu(),
        driver: proc_cpu(std::process::id(), false).unwrap_or(0.0),
        machine: machine_cpu(),
    })
}

/// Deltas between two snapshots.
struct Delta {
    secs: f64,
    commits: i64,
    rollbacks: i64,
    wal_records: i64,
    wal_syncs: i64,
    server: f64,
    postgres: f64,
    driver: f64,
    other: f64,
}

fn delta(a: &Snap, b: &Snap) -> Delta {
    let server = b.server - a.server;
    let postgres = b.postgres - a.postgres;
    let driver = b.driver - a.driver;
    let machine = b.machine - a.machine;
    Delta {
        secs: (b.at - a.at).as_secs_f64(),
        commits: b.commits - a.commits,
        rollbacks: b.rollbacks - a.rollbacks,
        wal_records: b.wal_records - a.wal_records,
        wal_syncs: b.wal_syncs - a.wal_syncs,
        server,
        postgres,
        driver,
        other: (machine - server - postgres - driver).max(0.0),
    }
}

fn print_cpu(prefix: &str, d: &Delta) {
    println!(
        "{prefix}_cores: paddock={:.3} postgres={:.3} driver={:.3} other={:.3} (of {} cores)",
        d.server / d.secs,
        d.postgres / d.secs,
        d.driver / d.secs,
        d.other / d.secs,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
}

/// A fresh, migrated database `name` on the admin URL's server; returns its URL.
async fn fresh_database(admin: &PgPool, admin_url: &str, name: &str) -> anyhow::Result<String> {
    find_postmaster(admin).await?;
    sqlx::query(&format!("drop database if exists {name} with (force)")).execute(admin).await?;
    sqlx::query(&format!("create database {name}")).execute(admin).await?;
    let url = with_database(admin_url, name)?;
    let pool = PgPoolOptions::new().max_connections(1).connect(&url).await?;
    paddock_store::MIGRATOR.run(&pool).await?;
    // pg_stat_statements when the server preloads it (bench/lifecycle/run does).
    let _ = sqlx::query("create extension if not exists pg_stat_statements").execute(&pool).await;
    pool.close().await;
    Ok(url)
}

fn with_database(url: &str, db: &str) -> anyhow::Result<String> {
    let mut u = url::Url::parse(url).context("database URL")?;
    u.set_path(&format!("/{db}"));
    Ok(u.to_string())
}

/// The encryption key of this run's `serve` processes.
fn bench_key() -> &'static str {
    static KEY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    KEY.get_or_init(Cipher::generate_key)
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// The paddock process under test: this binary's `serve`, as a child.
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
        cmd.stdin(Stdio::null()).kill_on_drop(true).env("LIFECYCLE_BENCH_KEY", bench_key());
        let child = cmd.spawn().context("starting `lifecycle-bench serve`")?;
        let pid = child.id().context("child pid")?;
        let base = format!("http://{listen}");
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if http.get(format!("{base}/v1/machine-classes")).send().await.is_ok() {
                break;
            }
            if Instant::now() > deadline {
                bail!("the server did not start listening");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Self { child, pid, base })
    }

    async fn stop(mut self) {
        // SIGTERM (graceful), then wait; the child is ours (spawned above, by pid).
        let _ = std::process::Command::new("kill").arg("-TERM").arg(self.pid.to_string()).status();
        if tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await.is_err() {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
    }
}

/// The API as the driver sees it; counts its requests (each is at least one commit).
#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
    requests: Arc<AtomicU64>,
}

impl Api {
    fn new(base: &str) -> anyhow::Result<Self> {
        let now = chrono::Utc::now().timestamp();
        let claims = Claims {
            sub: "lifecycle-bench".into(),
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
        Ok(Self { http, base: base.to_owned(), token, requests: Arc::new(AtomicU64::new(0)) })
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> anyhow::Result<(u16, Value)> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let send = || {
            let mut req = self.http.request(method.clone(), format!("{}{path}", self.base)).bearer_auth(&self.token);
            if let Some(b) = body {
                req = req.json(b);
            }
            req.send()
        };
        // The server closes a keep-alive connection idle for its header-read timeout; a GET sent on
        // it at that moment meets a reset. GETs are safe to send again, once, as clients do.
        let resp = match send().await {
            Err(e) if method == reqwest::Method::GET && !e.is_timeout() => {
                RESENT_GETS.fetch_add(1, Ordering::Relaxed);
                send().await?
            }
            other => other?,
        };
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await?;
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok((status, value))
    }

    async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let (status, v) = self.call(reqwest::Method::POST, path, Some(body)).await?;
        if !(200..300).contains(&status) {
            bail!("POST {path}: {status} {v}");
        }
        Ok(v)
    }
}

/// One machine class, one tenant without quotas, `machines` enrolled `sim://` machines; waits
/// until every machine is available (wiped). Returns the tenant id.
async fn setup(api: &Api, db: &PgPool, machines: usize, prefix: &str) -> anyhow::Result<String> {
    api.post(
        "/v1/machine-classes",
        &json!({"name": "bench", "cpu_cores": 64, "memory_gib": 512, "gpu_model": "", "gpu_count": 0,
                "description": "lifecycle bench"}),
    )
    .await?;
    let tenant = api.post("/v1/tenants", &json!({"name": "bench", "display_name": "Bench"})).await?;
    let tenant_id = tenant["id"].as_str().context("tenant id")?.to_owned();
    enroll(api, 0, machines, prefix).await?;
    wait_available(db, machines as i64).await?;
    Ok(tenant_id)
}

async fn enroll(api: &Api, from: usize, to: usize, prefix: &str) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let results: Vec<anyhow::Result<Value>> = futures::stream::iter(from..to)
        .map(|i| {
            let api = api.clone();
            let name = format!("{prefix}{i:05}");
            async move {
                api.post(
                    "/v1/machines",
                    &json!({"name": name, "machine_class": "bench",
                            "bmc": {"url": format!("sim://{name}"), "username": "admin", "password": "pw"}}),
                )
                .await
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    for r in results {
        r?;
    }
    eprintln!("enrolled {} machines in {:.1} s", to - from, t0.elapsed().as_secs_f64());
    Ok(())
}

async fn wait_available(db: &PgPool, want: i64) -> anyhow::Result<()> {
    let t0 = Instant::now();
    loop {
        let n: i64 =
            sqlx::query_scalar("select count(*) from machines where state = 'available'").fetch_one(db).await?;
        if n >= want {
            eprintln!("{n} machines available after {:.1} s", t0.elapsed().as_secs_f64());
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(3600) {
            bail!("only {n} of {want} machines became available");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Polls the cluster with `GET` until `done` holds for (status, body); returns the GETs made.
async fn poll_cluster(
    api: &Api,
    path: &str,
    interval: Duration,
    limit: Duration,
    done: impl Fn(u16, &Value) -> anyhow::Result<bool>,
) -> anyhow::Result<u64> {
    let t0 = Instant::now();
    let mut n = 0;
    loop {
        let (status, v) = api.call(reqwest::Method::GET, path, None).await?;
        n += 1;
        if done(status, &v)? {
            return Ok(n);
        }
        if t0.elapsed() > limit {
            bail!("{path}: not done after {:?}: {status} {v}", limit);
        }
        tokio::time::sleep(interval).await;
    }
}

fn pool_body(name: &str, count: u32) -> Value {
    json!({"name": name, "kind": "slurm", "isolation": "private-nodes",
           "node_pools": [{"name": "compute", "machine_class": "bench", "count": count, "role": "system"}]})
}

fn ready(status: u16, v: &Value) -> anyhow::Result<bool> {
    if status != 200 {
        bail!("GET cluster: {status} {v}");
    }
    match v["status"]["phase"].as_str() {
        Some("ready") => Ok(true),
        Some("failed") => bail!("cluster failed: {v}"),
        _ => Ok(false),
    }
}

/// GETs sent again after a connection error (see [`Api::call`]).
static RESENT_GETS: AtomicU64 = AtomicU64::new(0);

/// Cluster creates answered 500 and retried.
static CREATE_RETRIES: AtomicU64 = AtomicU64::new(0);

/// Creates a cluster and waits for it to be ready; returns (id, GETs).
async fn create_ready(api: &Api, tenant: &str, name: &str, count: u32, interval: Duration) -> anyhow::Result<String> {
    // A create that fails with 500 is retried (counted in CREATE_RETRIES, printed by every test):
    // concurrent creates and allocations in one tenant can deadlock (see BENCHMARKS.md).
    let path = format!("/v1/tenants/{tenant}/clusters");
    let mut tries = 0;
    let v = loop {
        let (status, v) = api.call(reqwest::Method::POST, &path, Some(&pool_body(name, count))).await?;
        if (200..300).contains(&status) {
            break v;
        }
        tries += 1;
        if status != 500 || tries > 20 {
            bail!("POST {path}: {status} {v}");
        }
        CREATE_RETRIES.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(100 * tries)).await;
    };
    let id =
        v["cluster"]["id"].as_str().or(v["id"].as_str()).with_context(|| format!("no cluster id in {v}"))?.to_owned();
    poll_cluster(api, &format!("/v1/tenants/{tenant}/clusters/{id}"), interval, Duration::from_secs(1800), ready)
        .await?;
    Ok(id)
}

/// `clusters` lifecycles of 2-node Slurm clusters (create -> ready -> delete -> 404), `in_flight`
/// loops at once, loop k on `tenants[k % len]`, each taking the next cluster number until all are
/// through; returns the failures.
async fn churn(
    api: &Api,
    tenants: &[String],
    clusters: usize,
    in_flight: usize,
    interval: Duration,
) -> anyhow::Result<Vec<String>> {
    let t0 = Instant::now();
    let done = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    // K loops, each on its own tenant (or all on one with --tenants 1), each taking the next
    // cluster number until N are through.
    let mut loops = Vec::new();
    for k in 0..in_flight {
        let api = api.clone();
        let tenant = tenants[k % tenants.len()].clone();
        let (done, next) = (done.clone(), next.clone());
        loops.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= clusters as u64 {
                    return failures;
                }
                let one = async {
                    let id = create_ready(&api, &tenant, &format!("c{i:05}"), 2, interval).await?;
                    let path = format!("/v1/tenants/{tenant}/clusters/{id}");
                    let (status, v) = api.call(reqwest::Method::DELETE, &path, None).await?;
                    if !(200..300).contains(&status) {
                        bail!("DELETE {path}: {status} {v}");
                    }
                    poll_cluster(&api, &path, interval, Duration::from_secs(1800), |s, _| Ok(s == 404)).await?;
                    anyhow::Ok(())
                };
                match one.await {
                    Ok(()) => {
                        let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                        if n % 100 == 0 {
                            eprintln!("  {n} clusters done after {:.1} s", t0.elapsed().as_secs_f64());
                        }
                    }
                    Err(e) => failures.push(format!("{e:#}")),
                }
            }
        }));
    }
    let mut failures: Vec<String> = Vec::new();
    for l in loops {
        failures.extend(l.await?);
    }
    Ok(failures)
}

/// Statements by calls during a test (pg_stat_statements, when present).
async fn top_statements(db: &PgPool, limit: i64) -> Vec<(i64, f64, String)> {
    let rows = sqlx::query(
        "select calls, total_exec_time, regexp_replace(query, '\\s+', ' ', 'g') from pg_stat_statements \
         where dbid = (select oid from pg_database where datname = current_database()) \
         order by calls desc limit $1",
    )
    .bind(limit)
    .fetch_all(db)
    .await;
    match rows {
        Ok(rows) => rows.iter().map(|r| (r.get::<i64, _>(0), r.get::<f64, _>(1), r.get::<String, _>(2))).collect(),
        Err(_) => Vec::new(),
    }
}

async fn reset_statements(db: &PgPool) {
    let _ = sqlx::query("select pg_stat_statements_reset()").execute(db).await;
}

fn print_statements(title: &str, unit: &str, rows: &[(i64, f64, String)], per: f64) {
    if rows.is_empty() {
        println!("{title}: (pg_stat_statements not available)");
        return;
    }
    println!("{title} (calls, per {unit}, total ms, statement):");
    for (calls, ms, q) in rows {
        let q: String = q.chars().take(150).collect();
        println!("  {calls:>9} {:>8.2} {ms:>10.0}  {q}", *calls as f64 / per);
    }
}

/// pgbench's single-row insert (bench/pgbench/insert.sql) against `db_url`: commits per second.
async fn pgbench_insert(
    pgbench: &str,
    admin: &PgPool,
    db_url: &str,
    db: &str,
    sql_dir: &Path,
    clients: u32,
    seconds: u32,
) -> anyhow::Result<(f64, Delta)> {
    let a = snap(admin, db, None).await?;
    let out = tokio::process::Command::new(pgbench)
        .arg("-n")
        .arg("-M")
        .arg("prepared")
        .arg("-c")
        .arg(clients.to_string())
        .arg("-j")
        .arg("2")
        .arg("-T")
        .arg(seconds.to_string())
        .arg("-f")
        .arg(sql_dir.join("insert.sql"))
        .arg(db_url)
        .output()
        .await
        .context("running pgbench")?;
    tokio::time::sleep(Duration::from_millis(1100)).await; // statistics flush
    let b = snap(admin, db, None).await?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("pgbench failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    }
    let tps = text
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .context("no tps in pgbench's output")?;
    let failed = text.lines().any(|l| l.starts_with("number of failed transactions: ") && !l.contains(": 0"));
    if failed {
        bail!("pgbench had failed transactions: {text}");
    }
    Ok((tps, delta(&a, &b)))
}

/// The custody ledger key of the bench's process (`PADDOCK_LEDGER_KEY` of `paddock serve`).
fn bench_ledger_key() -> paddock_domain::ledger::LedgerKey {
    paddock_domain::ledger::LedgerKey::new(b"bench-ledger-key-of-at-least-32-bytes".to_vec())
}
