//! `bench/lifecycle/run`'s driver: cluster lifecycle throughput, the worker's cost at rest, and
//! the parallelism of one pool's provisioning, each against paddock's real API and worker over a
//! real PostgreSQL, with the simulated drivers (`paddock-sim`).
//!
//! ```text
//! lifecycle-bench serve     <database-url> [options]   # API + worker + simulated agent, like `paddock serve`
//! lifecycle-bench lifecycle <admin-url> [--clusters N] [--in-flight K] ...
//! lifecycle-bench rest      <admin-url> [--clusters N] [--seconds S] ...
//! lifecycle-bench parallel  <admin-url> [--nodes N] [--boot-ms MS] ...
//! lifecycle-bench elastic   <admin-url> [--pools N] [--seconds S] [--samples K] ...
//! ```
//!
//! The three measuring commands create their own database (`lifecycle_bench_<test>`) on the server
//! `<admin-url>` points at (a superuser URL), migrate it, and run `serve` as a child process (this
//! same binary, which adds the simulated world's own schema, `paddock_sim`) so that the CPU of the paddock process (API + worker + the simulated machines'
//! agent, as `paddock serve` with `PADDOCK_BMC_DRIVER=simulated` runs them) is measured apart from
//! the driver's. Results are printed as `key: value` lines on stdout; progress goes to stderr.

mod elastic;
mod fleet;

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
         \x20      lifecycle-bench fleet <admin-url> [--machines N] [--concurrency N] [--pool N]"
    );
    std::process::exit(2)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse()?;
    let (Some(cmd), Some(url)) = (args.positional.first(), args.positional.get(1)) else { usage() };
    match cmd.as_str() {
        "serve" => serve(url, &args).await,
        "lifecycle" => lifecycle(url, &args).await,
        "rest" => rest(url, &args).await,
        "parallel" => parallel(url, &args).await,
        "fleet" => fleet::fleet(url, &args).await,
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
        let mut conn = store.conn().await?;
        let armed = paddock_store::autoscale::arm_unarmed(&mut conn, autoscale_interval).await?;
        eprintln!("serve: armed the demand checks of {armed} clusters with autoscaled pools");
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

/// CPU seconds of every PostgreSQL process (exited backends count through the postmaster's
/// children times).
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
        let mut req = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await?;
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

// ------------------------------------------------------------------------------------------------
// 1. lifecycle
// ------------------------------------------------------------------------------------------------

async fn lifecycle(admin_url: &str, args: &Args) -> anyhow::Result<()> {
    let clusters: usize = args.get("clusters", 1000)?;
    let in_flight: usize = args.get("in-flight", 32)?;
    let machines: usize = args.get("machines", (2 * in_flight + 16).min(2 * clusters))?;
    let interval = Duration::from_millis(args.get("get-interval-ms", 200)?);
    let pgbench = args.str("pgbench", "pgbench");
    let pg_seconds: u32 = args.get("pgbench-seconds", 10)?;
    let pg_clients: u32 = args.get("pgbench-clients", 4)?;
    let sql_dir = PathBuf::from(args.str("sql-dir", "bench/pgbench"));
    let concurrency = args.str("concurrency", "16");
    let pool_size = args.str("pool", "16");
    let tenants_n: usize = args.get("tenants", in_flight)?.clamp(1, in_flight);
    if machines < 2 {
        bail!("--machines must be at least 2");
    }

    let admin = PgPoolOptions::new().max_connections(2).connect(admin_url).await?;
    // pgbench's table in its own database on the same server.
    let pg_db = "lifecycle_bench_pgbench";
    let pg_url = fresh_database(&admin, admin_url, pg_db).await?;
    let out = tokio::process::Command::new(pgbench.replace("pgbench", "psql"))
        .arg("-q")
        .arg("-v")
        .arg("ON_ERROR_STOP=1")
        .arg("-v")
        .arg("rows=1000")
        .arg("-f")
        .arg(sql_dir.join("schema.sql"))
        .arg(&pg_url)
        .output()
        .await
        .context("psql (next to pgbench) for the pgbench schema")?;
    if !out.status.success() {
        bail!("pgbench schema: {}", String::from_utf8_lossy(&out.stderr));
    }

    let name = "lifecycle_bench_lifecycle";
    let url = fresh_database(&admin, admin_url, name).await?;
    let db = PgPoolOptions::new().max_connections(2).connect(&url).await?;
    let server = Server::start(
        &url,
        &[
            ("concurrency", concurrency.clone()),
            ("pool", pool_size.clone()),
            ("poll-ms", args.str("poll-ms", "50")),
            ("agent-poll-ms", args.str("agent-poll-ms", "20")),
        ],
    )
    .await?;
    let api = Api::new(&server.base)?;
    let tenant = setup(&api, &db, machines, "m").await?;
    let mut tenants = vec![tenant];
    for k in 1..tenants_n {
        let t = api.post("/v1/tenants", &json!({"name": format!("bench-{k}")})).await?;
        tenants.push(t["id"].as_str().context("tenant id")?.to_owned());
    }
    // Settle: the enrollment's last jobs finish; then the measured window.
    tokio::time::sleep(Duration::from_secs(2)).await;

    eprintln!("pgbench insert (before): {pg_clients} clients, {pg_seconds} s");
    let (tps_before, pg_before) =
        pgbench_insert(&pgbench, &admin, &pg_url, pg_db, &sql_dir, pg_clients, pg_seconds).await?;

    let jobs_before: i64 = sqlx::query_scalar("select count(*) from jobs").fetch_one(&db).await?;
    reset_statements(&db).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let load_start = loadavg();
    let a = snap(&admin, name, Some(server.pid)).await?;
    api.requests.store(0, Ordering::Relaxed);
    eprintln!("lifecycle: {clusters} clusters, {in_flight} in flight, {machines} machines");
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
    let elapsed = t0.elapsed().as_secs_f64();
    let requests = api.requests.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(1100)).await; // statistics flush
    let b = snap(&admin, name, Some(server.pid)).await?;
    let load_end = loadavg();
    let statements = top_statements(&db, 25).await;
    // Statement executions that write, by pg_stat_statements (all statements, not only the top).
    let writes: Option<(i64, i64)> = sqlx::query_as(
        "select coalesce(sum(calls) filter (where query ~* '^\\s*(with\\s.*)?(insert|update|delete)\\s' \
                                        or query ~* '\\m(insert\\s+into|update\\s+\\w+\\s+(\\w+\\s+)?set|delete\\s+from)\\M'), 0)::bigint, \
                coalesce(sum(calls), 0)::bigint \
           from pg_stat_statements where dbid = (select oid from pg_database where datname = current_database())",
    )
    .fetch_optional(&db)
    .await
    .ok()
    .flatten();
    // The simulated drivers' own statements (on `paddock_sim` tables): each is a transaction of its
    // own (the drivers take a pooled connection, never the caller's transaction), except the
    // simulated agent's Node registration, one transaction of two statements (the `delete`
    // counted, the `insert` not).
    let sim_commits: Option<i64> = sqlx::query_scalar(
        "select coalesce(sum(calls) filter (where query ~ 'paddock_sim\\.' \
                  and query !~ '^\\s*insert into paddock_sim\\.nodes \\(cluster_id, node_name, system_uuid, labels, taints\\)\\s'), 0)::bigint \
           from pg_stat_statements where dbid = (select oid from pg_database where datname = current_database())",
    )
    .fetch_optional(&db)
    .await
    .ok()
    .flatten();
    let kinds = sqlx::query(
        "select kind, count(*), sum(attempts)::bigint, state from jobs group by kind, state order by kind, state",
    )
    .fetch_all(&db)
    .await?;
    let jobs_after: i64 = sqlx::query_scalar("select count(*) from jobs").fetch_one(&db).await?;
    let leftover: i64 =
        sqlx::query_scalar("select count(*) from clusters where deleted_at is null").fetch_one(&db).await.unwrap_or(-1);

    let idle = idle_after(&admin, &db, name, server.pid, args).await?;

    eprintln!("pgbench insert (after): {pg_clients} clients, {pg_seconds} s");
    let (tps_after, pg_after) =
        pgbench_insert(&pgbench, &admin, &pg_url, pg_db, &sql_dir, pg_clients, pg_seconds).await?;
    server.stop().await;

    let d = delta(&a, &b);
    let n = clusters as f64;
    let rate = n / elapsed;
    let per = d.commits as f64 / n;
    let commit_rate = d.commits as f64 / d.secs;
    let tps = (tps_before + tps_after) / 2.0;
    println!("test: lifecycle (create -> ready -> delete -> 404), {clusters} clusters x 2 nodes");
    println!("settings: in_flight={in_flight} tenants={tenants_n} machines={machines} worker_concurrency={concurrency} pool={pool_size} get_interval_ms={}", interval.as_millis());
    println!(
        "valid: {}",
        if failures.is_empty() {
            "yes".to_owned()
        } else {
            format!("NO ({} failures; first: {})", failures.len(), failures[0])
        }
    );
    println!("load_avg: {load_start} -> {load_end}");
    println!("create_500_retries: {}", CREATE_RETRIES.load(Ordering::Relaxed));
    println!("elapsed_s: {elapsed:.2}");
    println!("clusters_per_s: {rate:.2}");
    println!("commits: {} (rollbacks {}), per cluster {per:.1}, per s {commit_rate:.0}", d.commits, d.rollbacks);
    println!(
        "wal: {} records ({:.0} per cluster), {} WAL syncs ({:.1} per cluster)",
        d.wal_records,
        d.wal_records as f64 / n,
        d.wal_syncs,
        d.wal_syncs as f64 / n
    );
    if let Some((w, all)) = writes {
        println!(
            "statements: {all} executed ({:.0} per cluster), of which {w} write ({:.0} per cluster: insert/update/delete, \
             alone or in a CTE)",
            all as f64 / n,
            w as f64 / n
        );
    }
    println!(
        "driver_requests: {requests} ({:.1} per cluster; each a commit or more: the GETs polling for ready and 404)",
        requests as f64 / n
    );
    println!("commits_per_cluster_without_driver_requests: {:.1}", (d.commits as f64 - requests as f64) / n);
    if let Some(sim) = sim_commits {
        println!(
            "simulator_commits: {sim} ({:.1} per cluster: its statements on paddock_sim tables, each its own transaction)",
            sim as f64 / n
        );
        println!(
            "commits_per_cluster_of_paddock: {:.1} (without the driver's requests and the simulator's commits; \
             target <= 100)",
            (d.commits as f64 - requests as f64 - sim as f64) / n
        );
    }
    println!(
        "cpu_per_cluster_ms: paddock={:.1} postgres={:.1} driver={:.1}",
        d.server * 1000.0 / n,
        d.postgres * 1000.0 / n,
        d.driver * 1000.0 / n
    );
    print_cpu("lifecycle", &d);
    println!(
        "pgbench_insert_tps: before={tps_before:.0} after={tps_after:.0} mean={tps:.0} ({pg_clients} clients, {pg_seconds} s, -M prepared)"
    );
    print_cpu("pgbench_before", &pg_before);
    print_cpu("pgbench_after", &pg_after);
    println!(
        "pgbench_wal_syncs_per_commit: {:.2} (before) {:.2} (after)",
        pg_before.wal_syncs as f64 / pg_before.commits.max(1) as f64,
        pg_after.wal_syncs as f64 / pg_after.commits.max(1) as f64
    );
    println!(
        "pgbench_cpu_per_commit_us: postgres={:.0} (before) {:.0} (after)",
        pg_before.postgres * 1e6 / pg_before.commits.max(1) as f64,
        pg_after.postgres * 1e6 / pg_after.commits.max(1) as f64
    );
    println!("lifecycle_postgres_cpu_per_commit_us: {:.0}", d.postgres * 1e6 / d.commits.max(1) as f64);
    let ratio = per * rate / tps;
    println!(
        "RATIO commits_per_cluster x clusters_per_s / pgbench_tps = {per:.1} x {rate:.2} / {tps:.0} = {:.1}% (target >= 40%): {}",
        ratio * 100.0,
        if ratio >= 0.40 { "MET" } else { "NOT MET" }
    );
    println!(
        "jobs: {} new ({} before, {} after); live clusters left: {leftover}",
        jobs_after - jobs_before,
        jobs_before,
        jobs_after
    );
    println!("jobs by kind and state (all jobs of the database, enrollment included: kind, state, count, attempts):");
    for r in &kinds {
        println!(
            "  {:<24} {:<10} {:>7} {:>7}",
            r.get::<String, _>(0),
            r.get::<String, _>(3),
            r.get::<i64, _>(1),
            r.get::<Option<i64>, _>(2).unwrap_or(0)
        );
    }
    print_statements("statements during the lifecycle", "cluster", &statements, n);
    let (after, window) = (idle.after.as_secs(), idle.window.secs);
    println!(
        "idle_after_last_deletion: from {after} s after the last cluster was gone, for {window:.0} s: \
         {:.1} commits/s, paddock {:.2}% of a core",
        idle.window.commits as f64 / window,
        idle.window.server * 100.0 / window
    );
    print_statements("statements while idle", "second", &idle.statements, window);
    Ok(())
}

/// The idle process after the lifecycle: what it still commits.
struct Idle {
    after: Duration,
    window: Delta,
    statements: Vec<(i64, f64, String)>,
}

/// Waits `--idle-after-s` (10) after the last deletion, then measures `--idle-seconds` (30).
async fn idle_after(admin: &PgPool, db: &PgPool, name: &str, pid: u32, args: &Args) -> anyhow::Result<Idle> {
    let after = Duration::from_secs(args.get("idle-after-s", 10)?);
    let seconds = Duration::from_secs(args.get("idle-seconds", 30)?);
    eprintln!("idle: waiting {after:?}, then measuring {seconds:?}");
    tokio::time::sleep(after).await;
    reset_statements(db).await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // statistics flush
    let a = snap(admin, name, Some(pid)).await?;
    tokio::time::sleep(seconds).await;
    let b = snap(admin, name, Some(pid)).await?;
    let statements = top_statements(db, 12).await;
    Ok(Idle { after, window: delta(&a, &b), statements })
}

// ------------------------------------------------------------------------------------------------
// 2. rest
// ------------------------------------------------------------------------------------------------

async fn rest(admin_url: &str, args: &Args) -> anyhow::Result<()> {
    let clusters: usize = args.get("clusters", 10_000)?;
    let real: usize = args.get("real", 100)?.min(clusters).max(1);
    let seconds: u64 = args.get("seconds", 60)?;
    let in_flight: usize = args.get("in-flight", 8)?;
    let agent: bool = args.get("agent", true)?;
    let admin = PgPoolOptions::new().max_connections(2).connect(admin_url).await?;
    let name = "lifecycle_bench_rest";
    let url = fresh_database(&admin, admin_url, name).await?;
    let db = PgPoolOptions::new().max_connections(4).connect(&url).await?;

    // (a) `real` clusters through the API and the worker, ready.
    let server = Server::start(&url, &[("agent-poll-ms", "20".into())]).await?;
    let api = Api::new(&server.base)?;
    let tenant = setup(&api, &db, 2 * real, "m").await?;
    let t0 = Instant::now();
    let results: Vec<anyhow::Result<String>> = futures::stream::iter(0..real)
        .map(|i| {
            let api = api.clone();
            let tenant = tenant.clone();
            async move { create_ready(&api, &tenant, &format!("c{i:05}"), 2, Duration::from_millis(200)).await }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    for r in results {
        r?;
    }
    let rest_retries = CREATE_RETRIES.load(Ordering::Relaxed);
    eprintln!("{real} clusters ready through the lifecycle in {:.1} s", t0.elapsed().as_secs_f64());
    server.stop().await;

    // (b) The rest as copies in SQL of the real ones' rows (see clone_sql).
    let t1 = Instant::now();
    let copies = clusters - real;
    if copies > 0 {
        let mut tx = db.begin().await?;
        sqlx::raw_sql(&clone_sql(copies as i64, real as i64)).execute(&mut *tx).await?;
        tx.commit().await?;
        sqlx::raw_sql("vacuum analyze").execute(&db).await?;
    }
    let counts = sqlx::query(
        "select (select count(*) from clusters where phase = 'ready' and deleted_at is null), \
                (select count(*) from node_pools), (select count(*) from machines where state = 'active'), \
                (select count(*) from machine_allocations), (select count(*) from jobs), \
                (select count(*) from jobs where state in ('queued', 'running'))",
    )
    .fetch_one(&db)
    .await?;
    eprintln!("copied {copies} clusters in SQL in {:.1} s", t1.elapsed().as_secs_f64());

    // (c) Every copy's first drift check, before anything is measured: it repairs what a copy in
    //     SQL cannot carry (sealed values are bound to their row, so the copies have none; the
    //     simulated world has no rows for them), once. A process with a 10 s interval checks each.
    let t2 = Instant::now();
    settle_drift(&db, &url, ready_clusters(&db).await?).await?;
    eprintln!("every ready cluster had its first drift check after {:.1} s", t2.elapsed().as_secs_f64());

    // (d) A fresh paddock process over the ready clusters, measured at rest: drift checks off
    //     (the baseline), then on at the default interval, same data, same run.
    let off = at_rest(&admin, &db, name, &url, agent, seconds, 0).await?;
    let on = at_rest(&admin, &db, name, &url, agent, seconds, 600).await?;
    println!("test: at rest, {} ready clusters", counts.get::<i64, _>(0));
    println!(
        "data: ready_clusters={} node_pools={} active_machines={} allocations={} jobs={} open_jobs={} ({real} through the lifecycle, {copies} copied in SQL)",
        counts.get::<i64, _>(0),
        counts.get::<i64, _>(1),
        counts.get::<i64, _>(2),
        counts.get::<i64, _>(3),
        counts.get::<i64, _>(4),
        counts.get::<i64, _>(5)
    );
    println!("settings: simulated agent {} (agent_poll 200 ms, as `paddock serve` at latency scale 1), worker poll_interval 1 s", if agent { "running in the process" } else { "off" });
    println!("create_500_retries (while making the real clusters, one tenant): {rest_retries}");
    for window in [&off, &on] {
        window.print();
    }
    let checks = on.checks.max(1) as f64;
    println!(
        "drift_check_cost: paddock {:.0} us, PostgreSQL {:.0} us of CPU per verified cluster (window with checks minus the one without, over {} checks)",
        (on.delta.server - off.delta.server).max(0.0) / checks * 1e6,
        (on.delta.postgres - off.delta.postgres).max(0.0) / checks * 1e6,
        on.checks
    );
    Ok(())
}

async fn ready_clusters(db: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar("select count(*) from clusters where phase = 'ready' and deleted_at is null")
        .fetch_one(db)
        .await?)
}

/// Runs a process whose drift checks come every 10 s until every ready cluster's check has run
/// once: each check armed at its start has ended (queued again after a check that wrote nothing,
/// or handed over to the next one armed by a check that restored something); bounded.
async fn settle_drift(db: &PgPool, url: &str, ready: i64) -> anyhow::Result<()> {
    // The checks armed by the lifecycle (due up to 600 s later) come due with the others.
    sqlx::query(
        "update jobs set run_at = now() + random() * interval '10 seconds' \
         where kind = 'cluster_drift_check' and state = 'queued'",
    )
    .execute(db)
    .await?;
    let server = Server::start(url, &[("agent", "false".into()), ("drift-interval-s", "10".into())]).await?;
    let armed: Vec<uuid::Uuid> =
        sqlx::query_scalar("select id from jobs where kind = 'cluster_drift_check' and state in ('queued', 'running')")
            .fetch_all(db)
            .await?;
    anyhow::ensure!(armed.len() as i64 >= ready, "{} drift checks armed for {ready} ready clusters", armed.len());
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let open: i64 = sqlx::query_scalar(
            "select count(*) from jobs where id = any($1) \
             and (state = 'running' or (state = 'queued' and last_error is null))",
        )
        .bind(&armed)
        .fetch_one(db)
        .await?;
        if open == 0 {
            break;
        }
        if Instant::now() > deadline {
            server.stop().await;
            bail!("{open} of {ready} ready clusters still wait for their first drift check after 30 minutes");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    server.stop().await;
    Ok(())
}

/// One measured window of a fresh process at rest.
struct RestWindow {
    drift_interval_s: u64,
    delta: Delta,
    load: (String, String),
    checks: i64,
    statements: Vec<(i64, f64, String)>,
}

impl RestWindow {
    fn print(&self) {
        let d = &self.delta;
        let core = d.server / d.secs;
        println!(
            "window: PADDOCK_DRIFT_INTERVAL={} ({:.1} s, load_avg {} -> {})",
            self.drift_interval_s, d.secs, self.load.0, self.load.1
        );
        println!(
            "  paddock_cpu_s: {:.3} = {:.2}% of one core (target < 2%): {}",
            d.server,
            core * 100.0,
            if core < 0.02 { "MET" } else { "NOT MET" }
        );
        println!(
            "  postgres_cpu_s: {:.3} = {:.2}% of one core (all PostgreSQL processes)",
            d.postgres,
            d.postgres / d.secs * 100.0
        );
        println!("  commits_per_s: {:.1} (rollbacks {:.1}/s)", d.commits as f64 / d.secs, d.rollbacks as f64 / d.secs);
        println!("  drift_checks: {} ({:.2}/s)", self.checks, self.checks as f64 / d.secs);
        print_statements("  statements", "second", &self.statements, d.secs);
    }
}

/// Measures a fresh process with drift checks every `drift_interval_s` (0: off) for `seconds`,
/// after its start-up work. The queued checks are spread evenly over the interval first (off:
/// moved out of the window), as a fleet at rest has them.
async fn at_rest(
    admin: &PgPool,
    db: &PgPool,
    name: &str,
    url: &str,
    agent: bool,
    seconds: u64,
    drift_interval_s: u64,
) -> anyhow::Result<RestWindow> {
    let spread =
        if drift_interval_s == 0 { "now() + interval '1 day'" } else { "now() + random() * $1 * interval '1 second'" };
    sqlx::query(&format!(
        "update jobs set run_at = {spread} where kind = 'cluster_drift_check' and state = 'queued' and $1 >= 0"
    ))
    .bind(drift_interval_s as f64)
    .execute(db)
    .await?;
    let extra = [
        ("agent", agent.to_string()),
        ("agent-poll-ms", "200".into()),
        ("drift-interval-s", drift_interval_s.to_string()),
    ];
    let server = Server::start(url, &extra).await?;
    tokio::time::sleep(Duration::from_secs(5)).await; // start-up work out of the window
    reset_statements(db).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let load_start = loadavg();
    let since: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("select now()").fetch_one(db).await?;
    let a = snap(admin, name, Some(server.pid)).await?;
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let b = snap(admin, name, Some(server.pid)).await?;
    let checks: i64 = sqlx::query_scalar(
        "select count(*) from jobs where kind = 'cluster_drift_check' and updated_at >= $1 \
         and last_error->>'code' = 'at_rest'",
    )
    .bind(since)
    .fetch_one(db)
    .await?;
    let load_end = loadavg();
    let statements = top_statements(db, 15).await;
    server.stop().await;
    Ok(RestWindow { drift_interval_s, delta: delta(&a, &b), load: (load_start, load_end), checks, statements })
}

/// Copies the `real` ready clusters round-robin `copies` times: each copy gets a new cluster, its
/// node pool and two new machines (active, with their own clean and allocation), all with fresh
/// ids and names; not the sealed values (bound to their row) nor the simulated world's rows,
/// which each copy's first drift check makes (`settle_drift`). Generic over the columns: every row is
/// copied with `jsonb_populate_record`, only ids, names and references are rewritten.
fn clone_sql(copies: i64, real: i64) -> String {
    format!(
        r#"
create temp table cmap as
  select gen_random_uuid() as new_id, c.id as old_id, g as n
  from generate_series(1, {copies}) g
  join (select id, row_number() over (order by id) - 1 as k from clusters where deleted_at is null) c
    on c.k = (g - 1) % {real};
create temp table pmap as
  select gen_random_uuid() as new_id, p.id as old_id, m.new_id as cluster_new, m.n
  from cmap m join node_pools p on p.cluster_id = m.old_id;
create temp table mmap as
  select gen_random_uuid() as new_id, a.machine_id as old_id, gen_random_uuid() as clean_new,
         gen_random_uuid() as alloc_new, a.id as alloc_old, m.new_id as cluster_new, pm.new_id as pool_new, m.n,
         row_number() over () as k
  from cmap m join machine_allocations a on a.cluster_id = m.old_id and a.released_at is null
  join pmap pm on pm.old_id = a.node_pool_id and pm.cluster_new = m.new_id;

insert into clusters
  select (jsonb_populate_record(null::clusters, to_jsonb(c)
    || jsonb_build_object('id', m.new_id, 'name', 'copy-' || m.n,
         'admin_kubeconfig_enc', null, 'slurm_secrets_enc', null))).*
  from cmap m join clusters c on c.id = m.old_id;
insert into node_pools
  select (jsonb_populate_record(null::node_pools, to_jsonb(p)
    || jsonb_build_object('id', pm.new_id, 'cluster_id', pm.cluster_new))).*
  from pmap pm join node_pools p on p.id = pm.old_id;
-- Machines first without their clean and allocation (the two reference each other), then the
-- clean and the allocation, then the machine's tenancy as the original has it.
insert into machines
  select (jsonb_populate_record(null::machines, to_jsonb(x)
    || jsonb_build_object('id', mm.new_id, 'name', 'copy-' || mm.k, 'bmc_url', 'sim://copy-' || mm.k,
         'system_uuid', gen_random_uuid()::text, 'state', 'enrolling', 'clean_id', null, 'allocation_id', null, 'tenant_id', null, 'cluster_id', null,
         'node_pool_id', null, 'node_name', null))).*
  from mmap mm join machines x on x.id = mm.old_id;
insert into machine_cleans
  select (jsonb_populate_record(null::machine_cleans, to_jsonb(c)
    || jsonb_build_object('id', mm.clean_new, 'machine_id', mm.new_id, 'run_id', gen_random_uuid()))).*
  from mmap mm join machine_allocations a on a.id = mm.alloc_old join machine_cleans c on c.id = a.clean_id;
insert into machine_allocations
  select (jsonb_populate_record(null::machine_allocations, to_jsonb(a)
    || jsonb_build_object('id', mm.alloc_new, 'machine_id', mm.new_id, 'clean_id', mm.clean_new,
         'cluster_id', mm.cluster_new, 'node_pool_id', mm.pool_new))).*
  from mmap mm join machine_allocations a on a.id = mm.alloc_old;
update machines m set state = x.state, clean_id = mm.clean_new, allocation_id = mm.alloc_new,
    tenant_id = x.tenant_id, cluster_id = mm.cluster_new, node_pool_id = mm.pool_new,
    node_name = 'copy-' || mm.k
  from mmap mm join machines x on x.id = mm.old_id
  where m.id = mm.new_id;
drop table cmap, pmap, mmap;
"#
    )
}

// ------------------------------------------------------------------------------------------------
// 3. parallel
// ------------------------------------------------------------------------------------------------

async fn parallel(admin_url: &str, args: &Args) -> anyhow::Result<()> {
    let nodes: u32 = args.get("nodes", 64)?;
    let boot_ms: u64 = args.get("boot-ms", 5000)?;
    let other_ms = args.str("other-ms", "50");
    let poll_ms = args.str("poll-ms", "100");
    let concurrency = args.str("concurrency", "16");
    let admin = PgPoolOptions::new().max_connections(2).connect(admin_url).await?;
    let name = "lifecycle_bench_parallel";
    let url = fresh_database(&admin, admin_url, name).await?;
    let db = PgPoolOptions::new().max_connections(2).connect(&url).await?;
    let server = Server::start(
        &url,
        &[
            ("boot-ms", boot_ms.to_string()),
            ("other-ms", other_ms.clone()),
            ("poll-ms", poll_ms.clone()),
            ("agent-poll-ms", "20".into()),
            ("concurrency", concurrency.clone()),
        ],
    )
    .await?;
    let api = Api::new(&server.base)?;
    let machines = nodes as usize + 2;
    let tenant = setup(&api, &db, machines, "p").await?;
    let interval = Duration::from_millis(50);

    // Samples machine states while a cluster comes up: the most machines booting at once.
    async fn timed(
        api: &Api,
        db: &PgPool,
        tenant: &str,
        cname: &str,
        count: u32,
        interval: Duration,
    ) -> anyhow::Result<(f64, i64)> {
        let t0 = Instant::now();
        let create = create_ready(api, tenant, cname, count, interval);
        tokio::pin!(create);
        let mut most = 0i64;
        loop {
            tokio::select! {
                r = &mut create => { r?; break; }
                _ = tokio::time::sleep(Duration::from_millis(250)) => {
                    let n: i64 = sqlx::query_scalar(
                        "select count(*) from machines where state = 'provisioning' and run_booted_at is not null and run_finished_at is null")
                        .fetch_one(db).await.unwrap_or(0);
                    most = most.max(n);
                }
            }
        }
        Ok((t0.elapsed().as_secs_f64(), most))
    }

    let load_start = loadavg();
    let (one_a, _) = timed(&api, &db, &tenant, "one-a", 1, interval).await?;
    eprintln!("1 node: {one_a:.2} s");
    let (big, most) = timed(&api, &db, &tenant, "big", nodes, interval).await?;
    eprintln!("{nodes} nodes: {big:.2} s");
    let (one_b, _) = timed(&api, &db, &tenant, "one-b", 1, interval).await?;
    eprintln!("1 node: {one_b:.2} s");
    let load_end = loadavg();
    let kinds = sqlx::query("select kind, count(*) from jobs group by kind order by kind").fetch_all(&db).await?;
    // Where the time of each cluster went: its events and its jobs' runs, from its creation.
    let timeline = sqlx::query(
        "with c as (select id, name, created_at from clusters where name in ('one-a', 'big')) \
         select c.name, extract(epoch from e.at - c.created_at)::float8, e.reason || ': ' || e.message \
           from c join cluster_events e on e.cluster_id = c.id \
         union all \
         select c.name, extract(epoch from j.started_at - c.created_at)::float8, \
                'job ' || j.kind || ' ' || j.state || ' (last run started; created +' || \
                round(extract(epoch from j.created_at - c.created_at)::numeric, 2) || ' s, finished +' || \
                coalesce(round(extract(epoch from j.finished_at - c.created_at)::numeric, 2)::text, '-') || ' s)' \
           from c join jobs j on j.target_id = c.id \
         union all \
         select c.name || '/m', extract(epoch from j.started_at - c.created_at)::float8, \
                'machine job ' || j.kind || ' ' || j.state || ' (created +' || \
                round(extract(epoch from j.created_at - c.created_at)::numeric, 2) || ' s, finished +' || \
                coalesce(round(extract(epoch from j.finished_at - c.created_at)::numeric, 2)::text, '-') || ' s) ' || \
                coalesce(j.last_error::text, '') \
           from c join machines m on m.cluster_id = c.id join jobs j on j.target_id = m.id \
          where c.name = 'one-a' and j.created_at >= c.created_at \
         order by 1 desc, 2",
    )
    .fetch_all(&db)
    .await
    .unwrap_or_default();
    server.stop().await;
    let one = (one_a + one_b) / 2.0;
    let ratio = big / one;
    println!("test: pool parallelism, simulated boot {boot_ms} ms, other latencies {other_ms} ms, reconcile poll {poll_ms} ms, worker concurrency {concurrency}");
    println!("load_avg: {load_start} -> {load_end}");
    println!("one_node_s: {one_a:.2} (before) {one_b:.2} (after), mean {one:.2}");
    println!("{nodes}_nodes_s: {big:.2}");
    println!("most_machines_booted_at_once (sampled every 250 ms): {most}");
    println!(
        "RATIO {nodes} nodes / 1 node = {ratio:.2} (target < 1.3): {}",
        if ratio < 1.3 { "MET" } else { "NOT MET" }
    );
    println!("jobs by kind:");
    for r in &kinds {
        println!("  {:<24} {:>7}", r.get::<String, _>(0), r.get::<i64, _>(1));
    }
    println!("timeline (cluster, seconds from its creation, what):");
    for r in &timeline {
        let what: String = r.get::<String, _>(2).chars().take(220).collect();
        println!("  {:<6} {:>7.2}  {what}", r.get::<String, _>(0), r.get::<Option<f64>, _>(1).unwrap_or(-1.0));
    }
    Ok(())
}

/// The custody ledger key of the bench's process (`PADDOCK_LEDGER_KEY` of `paddock serve`).
fn bench_ledger_key() -> paddock_domain::ledger::LedgerKey {
    paddock_domain::ledger::LedgerKey::new(b"bench-ledger-key-of-at-least-32-bytes".to_vec())
}
