//! Chaos: with a fixed seed and a bounded size, 50 clusters are created,
//! scaled and deleted through a real `paddock api` process while `paddock worker` processes are
//! killed with SIGKILL at random moments and restarted. Afterwards every cluster reaches its
//! desired state, no machine was ever in two live allocations, no machine became `available`
//! after a tenancy without a recorded clean, no job is stuck, and metering kept one usage segment
//! per billed allocation, open exactly while the machine is held and inside its allocation, and no
//! two runs of one target overlapped across the worker processes (the run journal of `runs`). Twice
//! during the run an active machine is reported failed: its remediation goes on while workers are
//! killed, and it must end with the machine in maintenance (never lost, never back in the fleet)
//! and its credit written once, exactly the seconds from the report to its segment's close. Each
//! invariant is a function of its own, named for what it holds (`no_machine_in_two_live_allocations`,
//! ...); a failure names the invariants it broke and leads each finding with that name.
//!
//! The seed is fixed (`PADDOCK_CHAOS_SEED` overrides it to replay or explore); the sequence of API
//! calls follows from it, the timing of the kills relative to the work does not. Each process's
//! log goes to a directory the test prints (kept on failure, or always with
//! `PADDOCK_CHAOS_KEEP_LOGS`), and the test's database is kept. `PADDOCK_CHAOS_LATENCY_SCALE`
//! (default 0.1) slows the simulated world down, so that more kills land in the middle of a job.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use sqlx::{PgPool, Row};

#[path = "chaos/runs.rs"]
mod runs;

const DEFAULT_SEED: u64 = 0x5eed_c4a0_5000;
const CLUSTERS: usize = 50;
const WORKERS: usize = 4;
const TENANTS: usize = 5;
/// (class, cpu cores, memory GiB, machines).
const CLASSES: [(&str, u32, u32, usize); 2] = [("small", 8, 32, 24), ("large", 32, 128, 16)];
/// Live demand per class may reach this share of its supply during the run (then clusters wait).
const OVERCOMMIT: f64 = 1.5;
/// Kills keep going at least this long after the first one, and this long after the last request.
const CHAOS_MIN: Duration = Duration::from_secs(30);
const CHAOS_TAIL: Duration = Duration::from_secs(8);
/// How long everything may take to converge once the killing stops (the workers' lease is 5 s, so
/// a job held by the last killed worker is taken over within that).
const CONVERGE_MAX: Duration = Duration::from_secs(150);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// The processes the test started; every one is killed when the test ends, however it ends.
struct Procs {
    api: Option<Child>,
    workers: Vec<Option<Child>>,
    env: Vec<(String, String)>,
    logs: PathBuf,
    starts: usize,
}

impl Procs {
    fn spawn(&mut self, role: &str, log: &str) -> Child {
        self.starts += 1;
        let path = self.logs.join(log);
        let mut file = OpenOptions::new().create(true).append(true).open(&path).expect("log file");
        let _ = writeln!(file, "===== chaos: start #{} of `paddock {role}` =====", self.starts);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_paddock"));
        cmd.arg(role);
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("PADDOCK_")) {
            cmd.env_remove(k);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting `paddock {role}`: {e}"))
    }

    /// Starts worker `i` unless it runs.
    fn start_worker(&mut self, i: usize) {
        if self.workers[i].is_none() {
            let child = self.spawn("worker", &format!("worker-{i}.log"));
            self.workers[i] = Some(child);
        }
    }

    /// The worker whose process is `pid`.
    fn worker_of(&self, pid: u32) -> Option<usize> {
        self.workers.iter().position(|w| w.as_ref().is_some_and(|c| c.id() == pid))
    }

    /// SIGKILL (what `Child::kill` sends on Unix), then reap.
    fn kill_worker(&mut self, i: usize) -> Option<u32> {
        let mut child = self.workers[i].take()?;
        let pid = child.id();
        let _ = child.kill();
        let _ = child.wait();
        Some(pid)
    }

    /// Workers that exited by themselves (they should not).
    fn exited_workers(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, w) in self.workers.iter_mut().enumerate() {
            if let Some(child) = w {
                if let Ok(Some(status)) = child.try_wait() {
                    out.push(format!("worker {i} (pid {}) exited by itself: {status}", child.id()));
                    *w = None;
                }
            }
        }
        out
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for child in self.workers.iter_mut().filter_map(Option::take).chain(self.api.take()) {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A thin client of the API under test.
struct Api {
    client: reqwest::Client,
    base: String,
    token: String,
}

impl Api {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut last = String::new();
        for _ in 0..5 {
            let mut req = self.client.request(method.clone(), format!("{}{path}", self.base)).bearer_auth(&self.token);
            if let Some(body) = &body {
                let ct =
                    if method == reqwest::Method::PATCH { "application/merge-patch+json" } else { "application/json" };
                req = req.header("content-type", ct).body(body.to_string());
            }
            match req.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let text = resp.text().await.unwrap_or_default();
                    return (status, serde_json::from_str(&text).unwrap_or(Value::String(text)));
                }
                Err(e) => {
                    last = e.to_string();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        panic!("{method} {path}: the API does not answer: {last}");
    }

    async fn expect(&self, method: reqwest::Method, path: &str, body: Value, want: u16) -> Value {
        let sent = (!body.is_null()).then(|| body.clone());
        let (status, answer) = self.call(method.clone(), path, sent).await;
        assert_eq!(status, want, "{method} {path} {body}: unexpected answer {status}: {answer}");
        answer
    }
}

#[derive(Debug, Clone)]
struct PoolModel {
    id: String,
    name: String,
    class: usize,
    count: u32,
}

#[derive(Debug, Clone)]
struct ClusterModel {
    tenant: String,
    id: String,
    name: String,
    kind: &'static str,
    pools: Vec<PoolModel>,
    deleted: bool,
}

impl ClusterModel {
    fn path(&self) -> String {
        format!("/v1/tenants/{}/clusters/{}", self.tenant, self.id)
    }
}

fn demand(clusters: &[ClusterModel], class: usize) -> u32 {
    clusters.iter().filter(|c| !c.deleted).flat_map(|c| &c.pools).filter(|p| p.class == class).map(|p| p.count).sum()
}

fn cap(class: usize) -> u32 {
    (CLASSES[class].3 as f64 * OVERCOMMIT) as u32
}

async fn delete_cluster(api: &Api, clusters: &mut [ClusterModel], idx: usize, log: &mut Vec<String>) {
    let c = &mut clusters[idx];
    api.expect(reqwest::Method::DELETE, &c.path(), Value::Null, 202).await;
    c.deleted = true;
    log.push(format!("delete {} ({})", c.name, c.id));
}

/// Deletes random live clusters that use `class` until its demand is at most `limit`.
async fn trim(
    api: &Api,
    rng: &mut StdRng,
    clusters: &mut [ClusterModel],
    class: usize,
    limit: u32,
    log: &mut Vec<String>,
) {
    while demand(clusters, class) > limit {
        let using: Vec<usize> = (0..clusters.len())
            .filter(|&i| !clusters[i].deleted && clusters[i].pools.iter().any(|p| p.class == class && p.count > 0))
            .collect();
        let &idx = using.choose(rng).expect("a cluster holds the demand");
        delete_cluster(api, clusters, idx, log).await;
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Lines of every log that report errors or panics (the last few of each).
fn log_problems(dir: &Path) -> String {
    let mut out = String::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir).map(|d| d.filter_map(Result::ok).collect()).unwrap_or_default();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let bad: Vec<&str> =
            text.lines().filter(|l| l.contains("ERROR") || l.contains("panicked") || l.contains(" WARN ")).collect();
        out.push_str(&format!(
            "--- {} ({} error/warn lines; last 15)\n{}\n",
            entry.path().display(),
            bad.len(),
            bad[bad.len().saturating_sub(15)..].join("\n")
        ));
    }
    out
}

async fn rows(pool: &PgPool, sql: &str) -> Vec<String> {
    sqlx::query_scalar::<_, String>(sql).fetch_all(pool).await.unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The database's view of the queue and the machines, for failure messages.
async fn db_snapshot(pool: &PgPool) -> String {
    let mut out = String::new();
    let machines = rows(pool, "select state || ': ' || count(*) from machines group by state order by state").await;
    out.push_str(&format!("machines by state: {machines:?}\n"));
    let jobs =
        rows(pool, "select kind || '/' || state || ': ' || count(*) from jobs group by kind, state order by 1").await;
    out.push_str(&format!("jobs by kind/state: {jobs:?}\n"));
    let open = rows(
        pool,
        "select format('%s %s target=%s attempts=%s run_at=%s (%s s from now) locked_by=%s locked_until=%s last_error=%s',
                kind, state, target_id, attempts, run_at, round(extract(epoch from run_at - now())::numeric, 1),
                locked_by, locked_until, last_error)
           from jobs where state in ('queued', 'running', 'failed') order by created_at limit 40",
    )
    .await;
    out.push_str(&format!("open or failed jobs (first 40):\n  {}\n", open.join("\n  ")));
    let ops =
        rows(pool, "select kind || '/' || state || ': ' || count(*) from operations group by kind, state order by 1")
            .await;
    out.push_str(&format!("operations by kind/state: {ops:?}\n"));
    out
}

/// Waits up to 1.5 s for a worker that runs the job of a machine in `provisioning` (its
/// activation opens a usage segment) or `releasing` (its power-off closes one); that worker and
/// the state.
async fn aim(pool: &PgPool, procs: &Mutex<Procs>) -> Option<(usize, String)> {
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        let running: Vec<(String, String)> = sqlx::query_as(
            "select j.locked_by, m.state from jobs j join machines m on m.id = j.target_id \
              where j.state = 'running' and j.target_type = 'machine' and j.locked_until > now() \
                and m.state in ('provisioning', 'releasing')",
        )
        .fetch_all(pool)
        .await
        .expect("running machine jobs");
        for (worker, state) in running {
            // `default_worker_id`: worker-<pid>-<random>.
            let pid = worker.split('-').nth(1).and_then(|p| p.parse().ok());
            if let Some(i) = pid.and_then(|pid| procs.lock().expect("procs").worker_of(pid)) {
                return Some((i, state));
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_clusters_converge_while_workers_are_killed() {
    let started = Instant::now();
    let seed = std::env::var("PADDOCK_CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(DEFAULT_SEED);
    let db = paddock_testkit::TestDb::new().await;
    runs::install(&db.pool).await;
    let logs = std::env::temp_dir().join(format!("paddock-chaos-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&logs).expect("log directory");
    println!("chaos: seed {seed}, database {}, logs in {}", db.name, logs.display());

    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let env: Vec<(String, String)> = [
        ("PADDOCK_DATABASE_URL", db.url.clone()),
        ("PADDOCK_DATABASE_MAX_CONNECTIONS", "12".to_owned()),
        ("PADDOCK_LISTEN", format!("127.0.0.1:{port}")),
        ("PADDOCK_JWT_HS256_SECRET", String::from_utf8(paddock_testkit::TEST_SECRET.to_vec()).expect("utf-8")),
        ("PADDOCK_ENCRYPTION_KEY", paddock_domain::secret::Cipher::generate_key()),
        ("PADDOCK_KUBE_DRIVER", "simulated".to_owned()),
        ("PADDOCK_BMC_DRIVER", "simulated".to_owned()),
        ("PADDOCK_WIPE_IMAGE_URL", "http://images.chaos.invalid/wipe.iso".to_owned()),
        ("PADDOCK_OS_IMAGE_URL", "http://images.chaos.invalid/os.img".to_owned()),
        (
            "PADDOCK_SIM_LATENCY_SCALE",
            std::env::var("PADDOCK_CHAOS_LATENCY_SCALE").unwrap_or_else(|_| "0.1".to_owned()),
        ),
        ("NO_COLOR", "1".to_owned()),
        ("PADDOCK_AGENT_BASE_URL", base.clone()),
        ("PADDOCK_AGENT_INSECURE_HTTP", "true".to_owned()),
        // A killed worker's jobs move on 5 s after its last renewal, not the default 30 s.
        ("PADDOCK_WORKER_LEASE", "5".to_owned()),
        ("PADDOCK_LEDGER_KEY", "chaos-test-ledger-key-of-at-least-32-bytes".to_owned()),
        ("PADDOCK_LOG", "info,sqlx=warn".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let procs = Arc::new(Mutex::new(Procs {
        api: None,
        workers: (0..WORKERS).map(|_| None).collect(),
        env,
        logs: logs.clone(),
        starts: 0,
    }));
    {
        let mut p = procs.lock().expect("procs");
        let api = p.spawn("api", "api.log");
        p.api = Some(api);
        for i in 0..WORKERS {
            p.start_worker(i);
        }
    }

    let api = Api {
        client: reqwest::Client::builder().timeout(Duration::from_secs(20)).build().expect("client"),
        base: base.clone(),
        token: paddock_testkit::admin(),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if api.client.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        assert!(Instant::now() < deadline, "paddock api did not become ready:\n{}", tail(&logs.join("api.log"), 30));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The fleet: every machine enrolled, inspected and cleaned before the chaos starts.
    for (name, cpu, mem, n) in CLASSES {
        let body = json!({"name": name, "cpu_cores": cpu, "memory_gib": mem, "gpu_count": 0});
        api.expect(reqwest::Method::POST, "/v1/machine-classes", body, 201).await;
        for i in 0..n {
            let m = format!("{name}-{i:02}");
            let body = json!({"name": m, "machine_class": name, "bmc": {"url": format!("sim://{m}"), "username": "a", "password": "b"}});
            let (status, answer) = api.call(reqwest::Method::POST, "/v1/machines", Some(body)).await;
            assert!(status == 201 || status == 202, "enrolling {m}: {status} {answer}");
        }
    }
    let total_machines: i64 = CLASSES.iter().map(|c| c.3 as i64).sum();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let available: i64 = sqlx::query_scalar("select count(*) from machines where state = 'available'")
            .fetch_one(&db.pool)
            .await
            .expect("count");
        if available == total_machines {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the fleet did not become available:\n{}\n{}",
            db_snapshot(&db.pool).await,
            log_problems(&logs)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let fleet_ready = started.elapsed();

    let mut tenants = Vec::new();
    for t in 0..TENANTS {
        let body = json!({"name": format!("chaos-{t}"), "display_name": format!("Chaos {t}")});
        let answer = api.expect(reqwest::Method::POST, "/v1/tenants", body, 201).await;
        tenants.push(answer["id"].as_str().expect("tenant id").to_owned());
    }

    // The killer: every 0.3-1.5 s SIGKILLs a worker and restarts it shortly after. Every other
    // time it aims: at a worker running the job of a machine about to be activated or released
    // (where metering opens and closes a segment), else at random.
    let stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(AtomicUsize::new(0));
    let aimed = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let killer = {
        let (procs, stop, kills, aimed) = (procs.clone(), stop.clone(), kills.clone(), aimed.clone());
        let pool = db.pool.clone();
        let mut rng = StdRng::seed_from_u64(seed ^ 0x6b11);
        tokio::spawn(async move {
            let mut events = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(rng.random_range(300..1500))).await;
                let target = if rng.random_bool(0.5) { aim(&pool, &procs).await } else { None };
                let (i, why) = match target {
                    Some((i, state)) => {
                        let why = format!(" running the job of a machine in {state}");
                        *aimed.lock().expect("aimed").entry(state).or_default() += 1;
                        (i, why)
                    }
                    None => (rng.random_range(0..WORKERS), String::new()),
                };
                let pid = procs.lock().expect("procs").kill_worker(i);
                kills.fetch_add(1, Ordering::SeqCst);
                events.push(format!("killed worker {i} (pid {pid:?}){why}"));
                tokio::time::sleep(Duration::from_millis(rng.random_range(50..500))).await;
                procs.lock().expect("procs").start_worker(i);
            }
            events
        })
    };
    let chaos_started = Instant::now();

    // The tenants' side, from the seed.
    let mut rng = StdRng::seed_from_u64(seed);
    let mut clusters: Vec<ClusterModel> = Vec::new();
    // Machines reported failed mid-run (their remediation goes on while workers are killed), and
    // how many of each class therefore end in maintenance.
    let mut failed: Vec<String> = Vec::new();
    let mut out_of_service = [0u32; CLASSES.len()];
    let mut actions: Vec<String> = Vec::new();
    let (mut scales, mut deletes) = (0, 0);
    for n in 0..CLUSTERS {
        if !clusters.iter().all(|c| c.deleted) && rng.random_bool(0.2) {
            let live: Vec<usize> = (0..clusters.len()).filter(|&i| !clusters[i].deleted).collect();
            let &idx = live.choose(&mut rng).expect("a live cluster");
            delete_cluster(&api, &mut clusters, idx, &mut actions).await;
            deletes += 1;
        }
        let kind = if rng.random_bool(0.5) { "slurm" } else { "kubernetes" };
        let mut pools = Vec::new();
        for p in 0..rng.random_range(1..=2usize) {
            let class = rng.random_range(0..CLASSES.len());
            pools.push(PoolModel { id: String::new(), name: format!("p{p}"), class, count: rng.random_range(1..=3) });
        }
        // Demand may exceed supply (clusters then wait), but only so far: older clusters go first.
        for class in 0..CLASSES.len() {
            let extra: u32 = pools.iter().filter(|p| p.class == class).map(|p| p.count).sum();
            if extra > 0 {
                let before = clusters.iter().filter(|c| c.deleted).count();
                trim(&api, &mut rng, &mut clusters, class, cap(class).saturating_sub(extra), &mut actions).await;
                deletes += clusters.iter().filter(|c| c.deleted).count() - before;
            }
        }
        let tenant = tenants.choose(&mut rng).expect("a tenant").clone();
        let name = format!("c{n:02}");
        let body = json!({
            "name": name,
            "kind": kind,
            "isolation": "private-nodes",
            // A Slurm cluster's first pool is its system pool (never scaled down below).
            "node_pools": pools.iter().enumerate().map(|(i, p)| {
                let role = if kind == "slurm" && i == 0 { "system" } else { "compute" };
                json!({"name": p.name, "machine_class": CLASSES[p.class].0, "count": p.count, "role": role})
            }).collect::<Vec<_>>(),
        });
        let answer = api.expect(reqwest::Method::POST, &format!("/v1/tenants/{tenant}/clusters"), body, 202).await;
        let id = answer["cluster"]["id"].as_str().expect("cluster id").to_owned();
        for p in &mut pools {
            let view = answer["cluster"]["node_pools"]
                .as_array()
                .and_then(|a| a.iter().find(|v| v["name"] == p.name.as_str()))
                .unwrap_or_else(|| panic!("pool {} in {answer}", p.name));
            p.id = view["id"].as_str().expect("pool id").to_owned();
        }
        actions.push(format!(
            "create {name} ({id}) {kind} {:?}",
            pools.iter().map(|p| (CLASSES[p.class].0, p.count)).collect::<Vec<_>>()
        ));
        clusters.push(ClusterModel { tenant, id, name, kind, pools, deleted: false });

        for _ in 0..2 {
            if !rng.random_bool(0.45) {
                continue;
            }
            let live: Vec<usize> = (0..clusters.len()).filter(|&i| !clusters[i].deleted).collect();
            let &idx = live.choose(&mut rng).expect("a live cluster");
            let p = rng.random_range(0..clusters[idx].pools.len());
            let class = clusters[idx].pools[p].class;
            let old = clusters[idx].pools[p].count;
            let new = rng.random_range(1..=3);
            let system = clusters[idx].kind == "slurm" && p == 0;
            if new != old && !(system && new < old) && (new < old || demand(&clusters, class) + new - old <= cap(class))
            {
                let path = format!("{}/node-pools/{}", clusters[idx].path(), clusters[idx].pools[p].id);
                api.expect(reqwest::Method::PATCH, &path, json!({"count": new}), 202).await;
                clusters[idx].pools[p].count = new;
                actions.push(format!("scale {}/{} {old} -> {new}", clusters[idx].name, clusters[idx].pools[p].name));
                scales += 1;
            }
        }
        if n % (CLUSTERS / 2) == CLUSTERS / 4 {
            if let Some((machine, class)) = report_failed(&api, &db.pool).await {
                actions.push(format!("report machine {machine} of class {} failed", CLASSES[class].0));
                out_of_service[class] += 1;
                failed.push(machine);
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..900))).await;
    }
    // The end state must fit the fleet, or clusters would rightly wait for ever: the machines
    // reported failed end in maintenance.
    for (class, &(_, _, _, supply)) in CLASSES.iter().enumerate() {
        let before = clusters.iter().filter(|c| c.deleted).count();
        let supply = supply as u32 - out_of_service[class];
        trim(&api, &mut rng, &mut clusters, class, supply, &mut actions).await;
        deletes += clusters.iter().filter(|c| c.deleted).count() - before;
    }
    let requests_done = Instant::now();
    while chaos_started.elapsed() < CHAOS_MIN || requests_done.elapsed() < CHAOS_TAIL {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let kill_events = killer.await.expect("killer");
    let chaos_ended = Instant::now();
    let kills = kills.load(Ordering::SeqCst);
    let aimed = aimed.lock().expect("aimed").clone();
    {
        let mut p = procs.lock().expect("procs");
        let exited = p.exited_workers();
        assert!(exited.is_empty(), "{exited:?}\n{}", log_problems(&logs));
        for i in 0..WORKERS {
            if p.workers[i].is_none() {
                p.start_worker(i);
            }
        }
    }

    // Convergence: every live cluster ready at its generation with exactly its machines, every
    // deleted one gone, every machine available or active.
    let live: Vec<&ClusterModel> = clusters.iter().filter(|c| !c.deleted).collect();
    let gone: Vec<&ClusterModel> = clusters.iter().filter(|c| c.deleted).collect();
    let mut pending: Vec<String>;
    loop {
        pending = Vec::new();
        for c in &live {
            let (status, view) = api.call(reqwest::Method::GET, &c.path(), None).await;
            let phase = view["status"]["phase"].as_str().unwrap_or("?");
            let (gen, observed) = (view["generation"].as_i64(), view["status"]["observed_generation"].as_i64());
            if status != 200 || phase != "ready" || gen != observed {
                let waiting: Vec<String> = view["status"]["conditions"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter(|c| c["status"] != "True")
                            .map(|c| format!("{}={} {}: {}", c["type"], c["status"], c["reason"], c["message"]))
                            .collect()
                    })
                    .unwrap_or_default();
                pending.push(format!(
                    "{} {} ({}): {status} phase={phase} generation={gen:?} observed={observed:?} {waiting:?}",
                    c.kind, c.name, c.id
                ));
            }
        }
        for c in &gone {
            let (status, view) = api.call(reqwest::Method::GET, &c.path(), None).await;
            if status != 404 {
                pending.push(format!(
                    "deleted {} ({}): {status} phase={}",
                    c.name,
                    c.id,
                    view["status"]["phase"].as_str().unwrap_or("?")
                ));
            }
        }
        let machines: Vec<String> = sqlx::query_scalar(
            "select name || ' ' || state from machines where state not in ('available', 'active') \
               and not (state = 'maintenance' and id::text = any($1)) order by name",
        )
        .bind(&failed)
        .fetch_all(&db.pool)
        .await
        .expect("machines");
        if !machines.is_empty() {
            pending.push(format!("machines neither available nor active: {machines:?}"));
        }
        if pending.is_empty() || chaos_ended.elapsed() > CONVERGE_MAX {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let converged = chaos_ended.elapsed();

    let mut violations = Violations::default();
    violations.check("every_cluster_converged", every_cluster_converged(&pending, converged));
    violations.check("pools_hold_their_counts", pools_hold_their_counts(&db.pool, &clusters).await);
    violations.check("the_api_shows_the_counts_asked_for", the_api_shows_the_counts_asked_for(&api, &live).await);
    violations.check("no_machine_in_two_live_allocations", no_machine_in_two_live_allocations(&db.pool).await);
    violations.check("every_allocation_took_a_fresh_clean", every_allocation_took_a_fresh_clean(&db.pool).await);
    violations.check("no_machine_available_without_a_clean", no_machine_available_without_a_clean(&db.pool).await);
    violations.check("metering_survived_the_kills", metering_survived_the_kills(&db.pool).await);
    violations.check("no_activation_went_unbilled", no_activation_went_unbilled(&db.pool).await);
    violations.check("no_job_is_stuck", no_job_is_stuck(&db.pool).await);
    violations.check("failed_machines_were_swapped_and_credited_once", swapped_and_credited(&db.pool, &failed).await);
    violations.check("no_two_runs_of_a_target_overlapped", runs::no_two_runs_of_a_target_overlapped(&db.pool).await);
    if pending.is_empty() {
        violations.check("no_operation_is_left_open", no_operation_is_left_open(&db.pool).await);
    }

    let allocations: i64 =
        sqlx::query_scalar("select count(*) from machine_allocations").fetch_one(&db.pool).await.expect("count");
    let cleans: i64 =
        sqlx::query_scalar("select count(*) from machine_cleans").fetch_one(&db.pool).await.expect("count");
    let taken_over: i64 =
        sqlx::query_scalar("select count(*) from jobs where attempts > 0").fetch_one(&db.pool).await.expect("count");
    let starts = procs.lock().expect("procs").starts;
    let credited: Vec<String> = sqlx::query_scalar(
        "select format('%s %s', r.outcome, coalesce(-a.node_seconds, 0)) from machine_remediations r \
           left join usage_adjustments a on a.remediation_id = r.id order by r.id",
    )
    .fetch_all(&db.pool)
    .await
    .expect("remediations");
    println!(
        "chaos: seed {seed}: {} clusters ({} live, {deletes} deleted), {scales} scalings, {kills} worker kills \
         (aimed at a machine's job: {aimed:?}; {starts} process starts, {taken_over} jobs run again after a lost lease), {allocations} allocations, {cleans} cleans, remediations (outcome, seconds credited) {credited:?}; fleet ready after {:.1} s, chaos {:.1} s, \
         converged {:.1} s after the last kill; {:.1} s in all; {}",
        clusters.len(),
        live.len(),
        fleet_ready.as_secs_f64(),
        (chaos_ended - chaos_started).as_secs_f64(),
        converged.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        runs::summary(&db.pool).await
    );
    violations.check("the_kills_were_aimed", the_kills_were_aimed(&aimed));
    if !violations.is_empty() {
        panic!(
            "chaos (seed {seed}) broke {}:\n{}\n\n== database {} (kept) ==\n{}\n== actions ==\n{}\n== kills ==\n{}\n== logs ({}) ==\n{}",
            violations.names(),
            violations.report(),
            db.name,
            db_snapshot(&db.pool).await,
            actions.join("\n"),
            kill_events.join("\n"),
            logs.display(),
            log_problems(&logs)
        );
    }
    drop(procs);
    if std::env::var_os("PADDOCK_CHAOS_KEEP_LOGS").is_none() {
        let _ = std::fs::remove_dir_all(&logs);
    }
}

/// The invariants the test found broken: per invariant (the name of the function that checks
/// it), what it found.
#[derive(Default)]
struct Violations(Vec<(&'static str, Vec<String>)>);

impl Violations {
    /// Records what the invariant `name` found broken (nothing: it holds).
    fn check(&mut self, name: &'static str, found: Vec<String>) {
        if !found.is_empty() {
            self.0.push((name, found));
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The broken invariants' names.
    fn names(&self) -> String {
        self.0.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(", ")
    }

    /// Each finding, led by its invariant's name.
    fn report(&self) -> String {
        let lines = self.0.iter().flat_map(|(name, found)| found.iter().map(move |v| format!("[{name}] {v}")));
        lines.collect::<Vec<_>>().join("\n")
    }
}

/// Every live cluster is ready at its generation with exactly its machines, every deleted one
/// gone, every machine available or active, within [`CONVERGE_MAX`] of the last kill.
fn every_cluster_converged(pending: &[String], converged: Duration) -> Vec<String> {
    if pending.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "not converged {} s after the last kill ({} items):\n  {}",
        converged.as_secs(),
        pending.len(),
        pending.join("\n  ")
    )]
}

/// Each pool holds exactly its count of active machines (none of a deleted cluster), and no
/// machine in another state.
async fn pools_hold_their_counts(db: &PgPool, clusters: &[ClusterModel]) -> Vec<String> {
    let mut violations = Vec::new();
    let held: BTreeMap<(String, String), i64> = sqlx::query(
        "select node_pool_id::text as pool, state, count(*) as n from machines where node_pool_id is not null group by 1, 2",
    )
    .fetch_all(db)
    .await
    .expect("held machines")
    .iter()
    .map(|r| ((r.get("pool"), r.get("state")), r.get("n")))
    .collect();
    for c in clusters {
        for p in &c.pools {
            let active = held.get(&(p.id.clone(), "active".to_owned())).copied().unwrap_or(0);
            let other: i64 = held.iter().filter(|((pool, s), _)| *pool == p.id && s != "active").map(|(_, n)| n).sum();
            let want = if c.deleted { 0 } else { i64::from(p.count) };
            if active != want || other != 0 {
                violations.push(format!(
                    "pool {}/{} ({}, deleted cluster: {}): wants {want} active machines, holds {active} active and {other} in other states",
                    c.name, p.name, p.id, c.deleted
                ));
            }
        }
    }
    violations
}

/// The API shows each live pool with the count asked for.
async fn the_api_shows_the_counts_asked_for(api: &Api, live: &[&ClusterModel]) -> Vec<String> {
    let mut violations = Vec::new();
    for c in live {
        let (_, view) = api.call(reqwest::Method::GET, &c.path(), None).await;
        for p in &c.pools {
            let shown = view["node_pools"]
                .as_array()
                .and_then(|a| a.iter().find(|v| v["id"] == p.id.as_str()))
                .and_then(|v| v["count"].as_u64());
            if shown != Some(u64::from(p.count)) {
                violations.push(format!(
                    "pool {}/{}: the API shows count {shown:?}, {} was asked for",
                    c.name, p.name, p.count
                ));
            }
        }
    }
    violations
}

/// No machine was ever in two live allocations.
async fn no_machine_in_two_live_allocations(pool: &PgPool) -> Vec<String> {
    rows(
        pool,
        "select format('machine %s: allocation %s [%s, %s) overlaps allocation %s [%s, %s)', m.name,
                a.id, a.allocated_at, a.released_at, b.id, b.allocated_at, b.released_at)
           from machine_allocations a
           join machine_allocations b on a.machine_id = b.machine_id and a.id < b.id
           join machines m on m.id = a.machine_id
          where tstzrange(a.allocated_at, coalesce(a.released_at, 'infinity'), '[)')
             && tstzrange(b.allocated_at, coalesce(b.released_at, 'infinity'), '[)')",
    )
    .await
}

/// Every allocation consumed a clean of its machine completed after the previous tenancy ended
/// (or after enrollment) and before the allocation.
async fn every_allocation_took_a_fresh_clean(pool: &PgPool) -> Vec<String> {
    rows(
        pool,
        "with ordered as (
             select a.*, lag(a.released_at) over (partition by a.machine_id order by a.allocated_at, a.id) as prev_released,
                    lag(a.id) over (partition by a.machine_id order by a.allocated_at, a.id) as prev_id
               from machine_allocations a)
         select format('machine %s: allocation %s at %s (previous %s released %s): its clean %s completed %s (machine %s); any clean in between: %s',
                       m.name, o.id, o.allocated_at, o.prev_id, o.prev_released, c.id, c.completed_at, c.machine_id,
                       exists (select 1 from machine_cleans x where x.machine_id = o.machine_id
                                  and x.completed_at > coalesce(o.prev_released, m.created_at) and x.completed_at <= o.allocated_at))
           from ordered o
           join machines m on m.id = o.machine_id
           left join machine_cleans c on c.id = o.clean_id
          where c.id is null or c.machine_id <> o.machine_id
             or (o.prev_id is not null and o.prev_released is null)
             or c.completed_at <= coalesce(o.prev_released, m.created_at)
             or c.completed_at > o.allocated_at",
    )
    .await
}

/// No machine is available after a tenancy without a clean since (nor with a used clean).
async fn no_machine_available_without_a_clean(pool: &PgPool) -> Vec<String> {
    rows(
        pool,
        "select format('machine %s is available: last allocation %s released %s, its clean_id %s completed %s',
                       m.name, a.id, a.released_at, m.clean_id, c.completed_at)
           from machines m
           left join machine_cleans c on c.id = m.clean_id
           left join lateral (select * from machine_allocations x where x.machine_id = m.id
                               order by x.allocated_at desc, x.id desc limit 1) a on true
          where m.state = 'available'
            and (c.id is null or c.machine_id <> m.id
                 or (a.id is not null and (a.released_at is null or c.completed_at <= a.released_at))
                 or exists (select 1 from machine_allocations u where u.clean_id = m.clean_id))",
    )
    .await
}

/// Metering survived the kills: one segment per allocation that reached `active` (the schema
/// also forbids overlaps); an active machine's is open, every other one closed, and a closed
/// one lies inside its allocation (its close reads the clock just after the release's); no control plane of a deleted cluster is still billed.
async fn metering_survived_the_kills(pool: &PgPool) -> Vec<String> {
    rows(
        pool,
        "select format('machine %s (%s, allocation %s): %s', m.name, m.state, m.allocation_id, problem)
           from (select m.id, 'active without an open segment' as problem from machines m
                  where m.state = 'active' and not exists (select 1 from usage_segments s
                        where s.allocation_id = m.allocation_id and s.end_at is null)
                 union all
                 select s.machine_id, format('segment %s still open', s.id) from usage_segments s
                   join machines m on m.id = s.machine_id
                  where s.kind = 'machine' and s.end_at is null
                    and (m.allocation_id is distinct from s.allocation_id or m.state not in ('active', 'releasing'))
                 union all
                 select s.machine_id, format('segment %s [%s, %s) outside its allocation [%s, %s)', s.id,
                        s.start_at, s.end_at, a.allocated_at, a.released_at)
                   from usage_segments s join machine_allocations a on a.id = s.allocation_id
                  where s.start_at < date_trunc('second', a.allocated_at)
                     or (s.end_at is not null and a.released_at is not null and s.end_at > a.released_at + interval '1 second')
                     or (s.end_at is not null and a.released_at is null)) bad
           join machines m on m.id = bad.id
         union all
         select format('cluster %s: its control plane is still billed after its deletion started', c.id)
           from clusters c join usage_segments s on s.cluster_id = c.id and s.kind = 'control_plane'
          where c.deletion_requested_at is not null and s.end_at is null",
    )
    .await
}

/// No activation went unbilled: an allocation whose machine the ledger saw become `active`
/// has its segment (the activation and the segment are one transaction).
async fn no_activation_went_unbilled(pool: &PgPool) -> Vec<String> {
    rows(
        pool,
        "select format('allocation %s of machine %s reached active but has no usage segment', a.id, a.machine_id)
           from machine_allocations a
          where not exists (select 1 from usage_segments s where s.allocation_id = a.id)
            and exists (select 1 from custody_entries e where e.machine_id = a.machine_id and e.to_state = 'active'
                          and e.at >= a.allocated_at and (a.released_at is null or e.at <= a.released_at))",
    )
    .await
}

/// Reports an active machine of a compute pool failed (an operator's report), which starts its
/// remediation; the machine and its class, if there is one.
async fn report_failed(api: &Api, pool: &PgPool) -> Option<(String, usize)> {
    let found: Option<(String, String)> = sqlx::query_as(
        "select m.id::text, c.name from machines m join node_pools p on p.id = m.node_pool_id \
           join machine_classes c on c.id = m.machine_class_id \
         where m.state = 'active' and p.role = 'compute' order by m.id limit 1",
    )
    .fetch_optional(pool)
    .await
    .expect("an active machine");
    let (machine, class) = found?;
    let body = json!({"status": "failed", "checks": [{"name": "gpu.ecc", "status": "failed", "detail": "chaos"}]});
    let (status, answer) =
        api.call(reqwest::Method::POST, &format!("/v1/machines/{machine}/health-reports"), Some(body)).await;
    assert_eq!(status, 201, "reporting {machine} failed: {answer}");
    Some((machine, CLASSES.iter().position(|c| c.0 == class).expect("a chaos class")))
}

/// Each machine reported failed mid-run: its one remediation ended, it is in maintenance (not
/// lost, not back in the fleet), and its credit, written at most once, is exactly the seconds
/// from the report to its segment's close.
async fn swapped_and_credited(pool: &PgPool, failed: &[String]) -> Vec<String> {
    let found: Vec<String> = sqlx::query_scalar(
        "select format('machine %s: state %s, remediations %s (ended %s), credits %s of %s seconds, window %s', \
             m.id, m.state, count(distinct r.id), count(distinct r.id) filter (where r.ended_at is not null), \
             (select count(*) from usage_adjustments a where a.machine_id = m.id and a.category = 'credit'), \
             (select sum(-a.node_seconds) from usage_adjustments a where a.machine_id = m.id and a.category = 'credit'), \
             max(w.seconds)) \
         from machines m join machine_remediations r on r.machine_id = m.id \
           left join usage_segments s on s.allocation_id = r.allocation_id \
           left join machine_health_reports h on h.id = r.report_id \
           left join lateral (select extract(epoch from s.end_at - greatest(s.start_at, \
             date_trunc('second', h.observed_at, 'UTC')))::bigint as seconds) w on true \
         where m.id::text = any($1) \
         group by m.id, m.state \
         having m.state <> 'maintenance' or count(distinct r.id) <> 1 \
           or count(distinct r.id) filter (where r.ended_at is not null) <> 1 \
           or (select count(*) from usage_adjustments a where a.machine_id = m.id and a.category = 'credit') \
              <> (case when max(w.seconds) > 0 then 1 else 0 end) \
           or coalesce((select sum(-a.node_seconds) from usage_adjustments a where a.machine_id = m.id \
              and a.category = 'credit'), 0) <> greatest(coalesce(max(w.seconds), 0), 0)",
    )
    .bind(failed)
    .fetch_all(pool)
    .await
    .expect("remediations");
    let remediated: i64 = sqlx::query_scalar(
        "select count(distinct machine_id) from machine_remediations where machine_id::text = any($1)",
    )
    .bind(failed)
    .fetch_one(pool)
    .await
    .expect("count");
    let mut found = found;
    if remediated != failed.len() as i64 {
        found.push(format!("{} of {} machines reported failed have a remediation", remediated, failed.len()));
    }
    found
}

/// No job stuck: none running on an expired lease, none due long ago, none failed.
async fn no_job_is_stuck(pool: &PgPool) -> Vec<String> {
    rows(
        pool,
        "select format('job %s %s target=%s: %s, attempts %s, run_at %s, locked_by %s until %s, last_error %s',
                       id, kind, target_id, state, attempts, run_at, locked_by, locked_until, last_error)
           from jobs
          where (state = 'running' and locked_until < now())
             or (state = 'queued' and run_at < now() - interval '15 seconds')
             or state = 'failed'
          order by created_at",
    )
    .await
}

/// Every operation ended, and none failed (checked only once everything converged).
async fn no_operation_is_left_open(pool: &PgPool) -> Vec<String> {
    rows(
        pool,
        "select format('operation %s %s on %s (generation %s): %s, error %s', id, kind, target_id, target_generation, state, error)
           from operations where state in ('pending', 'running', 'failed') order by created_at",
    )
    .await
}

/// The aim found its moments: a kill hit a machine's job in `provisioning` and one in
/// `releasing`, or the kills around activation and release were luck.
fn the_kills_were_aimed(aimed: &BTreeMap<String, usize>) -> Vec<String> {
    ["provisioning", "releasing"]
        .into_iter()
        .filter(|state| aimed.get(*state).is_none_or(|&n| n == 0))
        .map(|state| format!("no kill was aimed at a machine's job in {state}"))
        .collect()
}
