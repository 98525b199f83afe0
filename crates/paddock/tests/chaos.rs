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
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::task::JoinHandle;

#[path = "chaos/invariants.rs"]
mod invariants;
#[path = "chaos/procs.rs"]
mod procs;
#[path = "chaos/runs.rs"]
mod runs;

use invariants::{db_snapshot, EndState};
use procs::{free_port, log_problems, tail, Api, Procs};

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

/// Waits up to 1.5 s for a worker that runs the job of a machine in `provisioning` (its
/// activation opens a usage segment) or `releasing` (its power-off closes one); that worker and
/// the state. It looks for the state aimed at least so far (`aimed`) and takes the other only
/// when the wait ends: a release is over in a few simulated milliseconds while a provisioning
/// job runs most of the time, so a first-found aim would almost never hit a release.
async fn aim(pool: &PgPool, procs: &Mutex<Procs>, aimed: &Mutex<BTreeMap<String, usize>>) -> Option<(usize, String)> {
    let want = {
        let aimed = aimed.lock().expect("aimed");
        let count = |state: &str| aimed.get(state).copied().unwrap_or(0);
        if count("releasing") < count("provisioning") {
            "releasing"
        } else {
            "provisioning"
        }
    };
    let until = Instant::now() + Duration::from_millis(1500);
    let mut other = None;
    while Instant::now() < until {
        // Only the last look's other state counts: an older one's job may be over.
        other = None;
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
            let Some(i) = pid.and_then(|pid| procs.lock().expect("procs").worker_of(pid)) else { continue };
            if state == want {
                return Some((i, state));
            }
            other = Some((i, state));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    other
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

    let (procs, api) = start(&db.url, &logs).await;
    enrol_fleet(&api, &db.pool, &logs).await;
    let fleet_ready = started.elapsed();
    let tenants = create_tenants(&api).await;

    let killer = Killer::spawn(seed, procs.clone(), db.pool.clone());
    let chaos_started = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut play = Play::default();
    play.run(&api, &db.pool, &mut rng, &tenants).await;
    while chaos_started.elapsed() < CHAOS_MIN || play.requests_done.map_or(Duration::ZERO, |t| t.elapsed()) < CHAOS_TAIL
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (kill_events, kills, aimed) = killer.stop().await;
    let chaos_ended = Instant::now();
    restart_workers(&procs, &logs);

    let pending = converge(&api, &db.pool, &play, chaos_ended).await;
    let converged = chaos_ended.elapsed();
    let end = EndState { clusters: &play.clusters, pending: &pending, converged, failed: &play.failed, aimed: &aimed };
    let violations = invariants::check(&db.pool, &api, &end).await;
    let timing = format!(
        "fleet ready after {:.1} s, chaos {:.1} s, converged {:.1} s after the last kill; {:.1} s in all",
        fleet_ready.as_secs_f64(),
        (chaos_ended - chaos_started).as_secs_f64(),
        converged.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    let starts = procs.lock().expect("procs").starts;
    summarize(&db.pool, seed, &play, kills, &aimed, starts, &timing).await;
    if !violations.is_empty() {
        panic!(
            "chaos (seed {seed}) broke {}:\n{}\n\n== database {} (kept) ==\n{}\n== actions ==\n{}\n== kills ==\n{}\n== logs ({}) ==\n{}",
            violations.names(),
            violations.report(),
            db.name,
            db_snapshot(&db.pool).await,
            play.actions.join("\n"),
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

/// The environment every process of the test gets: the test's database, simulated drivers, a
/// short worker lease.
fn process_env(db_url: &str, port: u16) -> Vec<(String, String)> {
    let base = format!("http://127.0.0.1:{port}");
    let latency = std::env::var("PADDOCK_CHAOS_LATENCY_SCALE").unwrap_or_else(|_| "0.1".to_owned());
    [
        ("PADDOCK_DATABASE_URL", db_url.to_owned()),
        ("PADDOCK_DATABASE_MAX_CONNECTIONS", "12".to_owned()),
        ("PADDOCK_LISTEN", format!("127.0.0.1:{port}")),
        ("PADDOCK_JWT_HS256_SECRET", String::from_utf8(paddock_testkit::TEST_SECRET.to_vec()).expect("utf-8")),
        ("PADDOCK_ENCRYPTION_KEY", paddock_domain::secret::Cipher::generate_key()),
        ("PADDOCK_KUBE_DRIVER", "simulated".to_owned()),
        ("PADDOCK_BMC_DRIVER", "simulated".to_owned()),
        ("PADDOCK_WIPE_IMAGE_URL", "http://images.chaos.invalid/wipe.iso".to_owned()),
        ("PADDOCK_OS_IMAGE_URL", "http://images.chaos.invalid/os.img".to_owned()),
        ("PADDOCK_SIM_LATENCY_SCALE", latency),
        ("NO_COLOR", "1".to_owned()),
        ("PADDOCK_AGENT_BASE_URL", base),
        ("PADDOCK_AGENT_INSECURE_HTTP", "true".to_owned()),
        // A killed worker's jobs move on 5 s after its last renewal, not the default 30 s.
        ("PADDOCK_WORKER_LEASE", "5".to_owned()),
        ("PADDOCK_LEDGER_KEY", "chaos-test-ledger-key-of-at-least-32-bytes".to_owned()),
        ("PADDOCK_LOG", "info,sqlx=warn".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Starts `paddock api` and the workers, and waits for the API to be ready.
async fn start(db_url: &str, logs: &Path) -> (Arc<Mutex<Procs>>, Api) {
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let procs = Arc::new(Mutex::new(Procs {
        api: None,
        workers: (0..WORKERS).map(|_| None).collect(),
        env: process_env(db_url, port),
        logs: logs.to_path_buf(),
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
    (procs, api)
}

/// The fleet: every machine enrolled, inspected and cleaned before the chaos starts.
async fn enrol_fleet(api: &Api, db: &PgPool, logs: &Path) {
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
            .fetch_one(db)
            .await
            .expect("count");
        if available == total_machines {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the fleet did not become available:\n{}\n{}",
            db_snapshot(db).await,
            log_problems(logs)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn create_tenants(api: &Api) -> Vec<String> {
    let mut tenants = Vec::new();
    for t in 0..TENANTS {
        let body = json!({"name": format!("chaos-{t}"), "display_name": format!("Chaos {t}")});
        let answer = api.expect(reqwest::Method::POST, "/v1/tenants", body, 201).await;
        tenants.push(answer["id"].as_str().expect("tenant id").to_owned());
    }
    tenants
}

/// The killer: every 0.3-1.5 s SIGKILLs a worker and restarts it shortly after. Every other
/// time it aims: at a worker running the job of a machine about to be activated or released
/// (where metering opens and closes a segment), else at random.
struct Killer {
    stop: Arc<AtomicBool>,
    kills: Arc<AtomicUsize>,
    aimed: Arc<Mutex<BTreeMap<String, usize>>>,
    task: JoinHandle<Vec<String>>,
}

impl Killer {
    fn spawn(seed: u64, procs: Arc<Mutex<Procs>>, pool: PgPool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let kills = Arc::new(AtomicUsize::new(0));
        let aimed = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
        let (stop2, kills2, aimed2) = (stop.clone(), kills.clone(), aimed.clone());
        let mut rng = StdRng::seed_from_u64(seed ^ 0x6b11);
        let task = tokio::spawn(async move {
            let mut events = Vec::new();
            while !stop2.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(rng.random_range(300..1500))).await;
                let target = if rng.random_bool(0.5) { aim(&pool, &procs, &aimed2).await } else { None };
                let (i, why) = match target {
                    Some((i, state)) => {
                        let why = format!(" running the job of a machine in {state}");
                        *aimed2.lock().expect("aimed").entry(state).or_default() += 1;
                        (i, why)
                    }
                    None => (rng.random_range(0..WORKERS), String::new()),
                };
                let pid = procs.lock().expect("procs").kill_worker(i);
                kills2.fetch_add(1, Ordering::SeqCst);
                events.push(format!("killed worker {i} (pid {pid:?}){why}"));
                tokio::time::sleep(Duration::from_millis(rng.random_range(50..500))).await;
                procs.lock().expect("procs").start_worker(i);
            }
            events
        });
        Self { stop, kills, aimed, task }
    }

    /// Stops killing; what it did: its events, the number of kills, and the aimed ones by state.
    async fn stop(self) -> (Vec<String>, usize, BTreeMap<String, usize>) {
        self.stop.store(true, Ordering::SeqCst);
        let events = self.task.await.expect("killer");
        let aimed = self.aimed.lock().expect("aimed").clone();
        (events, self.kills.load(Ordering::SeqCst), aimed)
    }
}

/// Once the killing stopped: no worker exited by itself, and every one runs again.
fn restart_workers(procs: &Mutex<Procs>, logs: &Path) {
    let mut p = procs.lock().expect("procs");
    let exited = p.exited_workers();
    assert!(exited.is_empty(), "{exited:?}\n{}", log_problems(logs));
    for i in 0..WORKERS {
        if p.workers[i].is_none() {
            p.start_worker(i);
        }
    }
}

/// The tenants' side, from the seed: what it asked for, and the model of what should be.
#[derive(Default)]
struct Play {
    clusters: Vec<ClusterModel>,
    /// Machines reported failed mid-run (their remediation goes on while workers are killed), and
    /// how many of each class therefore end in maintenance.
    failed: Vec<String>,
    out_of_service: [u32; CLASSES.len()],
    actions: Vec<String>,
    scales: usize,
    deletes: usize,
    requests_done: Option<Instant>,
}

impl Play {
    async fn run(&mut self, api: &Api, db: &PgPool, rng: &mut StdRng, tenants: &[String]) {
        for n in 0..CLUSTERS {
            if !self.clusters.iter().all(|c| c.deleted) && rng.random_bool(0.2) {
                let live: Vec<usize> = (0..self.clusters.len()).filter(|&i| !self.clusters[i].deleted).collect();
                let &idx = live.choose(rng).expect("a live cluster");
                delete_cluster(api, &mut self.clusters, idx, &mut self.actions).await;
                self.deletes += 1;
            }
            self.create(api, rng, tenants, n).await;
            for _ in 0..2 {
                if rng.random_bool(0.45) {
                    self.scale(api, rng).await;
                }
            }
            if n % (CLUSTERS / 2) == CLUSTERS / 4 {
                if let Some((machine, class)) = report_failed(api, db).await {
                    self.actions.push(format!("report machine {machine} of class {} failed", CLASSES[class].0));
                    self.out_of_service[class] += 1;
                    self.failed.push(machine);
                }
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(100..900))).await;
        }
        // The end state must fit the fleet, or clusters would rightly wait for ever: the machines
        // reported failed end in maintenance.
        for (class, &(_, _, _, supply)) in CLASSES.iter().enumerate() {
            let supply = supply as u32 - self.out_of_service[class];
            self.trim(api, rng, class, supply).await;
        }
        self.requests_done = Some(Instant::now());
    }

    /// Deletes random live clusters that use `class` until its demand is at most `limit`.
    async fn trim(&mut self, api: &Api, rng: &mut StdRng, class: usize, limit: u32) {
        let before = self.clusters.iter().filter(|c| c.deleted).count();
        trim(api, rng, &mut self.clusters, class, limit, &mut self.actions).await;
        self.deletes += self.clusters.iter().filter(|c| c.deleted).count() - before;
    }

    /// Creates cluster `n` with one or two random pools (deleting older clusters first where its
    /// demand would exceed what the run lets live).
    async fn create(&mut self, api: &Api, rng: &mut StdRng, tenants: &[String], n: usize) {
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
                self.trim(api, rng, class, cap(class).saturating_sub(extra)).await;
            }
        }
        let tenant = tenants.choose(rng).expect("a tenant").clone();
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
        self.actions.push(format!(
            "create {name} ({id}) {kind} {:?}",
            pools.iter().map(|p| (CLASSES[p.class].0, p.count)).collect::<Vec<_>>()
        ));
        self.clusters.push(ClusterModel { tenant, id, name, kind, pools, deleted: false });
    }

    /// Scales a random pool of a random live cluster to 1-3 machines, where the run lets it (never
    /// a system pool down).
    async fn scale(&mut self, api: &Api, rng: &mut StdRng) {
        let clusters = &mut self.clusters;
        let live: Vec<usize> = (0..clusters.len()).filter(|&i| !clusters[i].deleted).collect();
        let &idx = live.choose(rng).expect("a live cluster");
        let p = rng.random_range(0..clusters[idx].pools.len());
        let class = clusters[idx].pools[p].class;
        let old = clusters[idx].pools[p].count;
        let new = rng.random_range(1..=3);
        let system = clusters[idx].kind == "slurm" && p == 0;
        if new != old && !(system && new < old) && (new < old || demand(clusters, class) + new - old <= cap(class)) {
            let path = format!("{}/node-pools/{}", clusters[idx].path(), clusters[idx].pools[p].id);
            api.expect(reqwest::Method::PATCH, &path, json!({"count": new}), 202).await;
            clusters[idx].pools[p].count = new;
            self.actions.push(format!("scale {}/{} {old} -> {new}", clusters[idx].name, clusters[idx].pools[p].name));
            self.scales += 1;
        }
    }
}

/// Waits until every live cluster is ready at its generation, every deleted one gone and every
/// machine available or active (or in maintenance after its failure report), or until
/// [`CONVERGE_MAX`] after the last kill; what was still pending then.
async fn converge(api: &Api, db: &PgPool, play: &Play, chaos_ended: Instant) -> Vec<String> {
    loop {
        let pending = pending_items(api, db, play).await;
        if pending.is_empty() || chaos_ended.elapsed() > CONVERGE_MAX {
            return pending;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn pending_items(api: &Api, db: &PgPool, play: &Play) -> Vec<String> {
    let mut pending = Vec::new();
    for c in play.clusters.iter().filter(|c| !c.deleted) {
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
    for c in play.clusters.iter().filter(|c| c.deleted) {
        let (status, view) = api.call(reqwest::Method::GET, &c.path(), None).await;
        if status != 404 {
            let phase = view["status"]["phase"].as_str().unwrap_or("?");
            pending.push(format!("deleted {} ({}): {status} phase={phase}", c.name, c.id));
        }
    }
    let machines: Vec<String> = sqlx::query_scalar(
        "select name || ' ' || state from machines where state not in ('available', 'active') \
           and not (state = 'maintenance' and id::text = any($1)) order by name",
    )
    .bind(&play.failed)
    .fetch_all(db)
    .await
    .expect("machines");
    if !machines.is_empty() {
        pending.push(format!("machines neither available nor active: {machines:?}"));
    }
    pending
}

/// One line of what the run did, for whoever reads the test's output.
async fn summarize(
    db: &PgPool,
    seed: u64,
    play: &Play,
    kills: usize,
    aimed: &BTreeMap<String, usize>,
    starts: usize,
    timing: &str,
) {
    let count =
        |sql: &'static str| async move { sqlx::query_scalar::<_, i64>(sql).fetch_one(db).await.expect("count") };
    let allocations = count("select count(*) from machine_allocations").await;
    let cleans = count("select count(*) from machine_cleans").await;
    let taken_over = count("select count(*) from jobs where attempts > 0").await;
    let credited: Vec<String> = sqlx::query_scalar(
        "select format('%s %s', r.outcome, coalesce(-a.node_seconds, 0)) from machine_remediations r \
           left join usage_adjustments a on a.remediation_id = r.id order by r.id",
    )
    .fetch_all(db)
    .await
    .expect("remediations");
    let live = play.clusters.iter().filter(|c| !c.deleted).count();
    println!(
        "chaos: seed {seed}: {} clusters ({live} live, {} deleted), {} scalings, {kills} worker kills \
         (aimed at a machine's job: {aimed:?}; {starts} process starts, {taken_over} jobs run again after a lost lease), \
         {allocations} allocations, {cleans} cleans, remediations (outcome, seconds credited) {credited:?}; {timing}; {}",
        play.clusters.len(),
        play.deletes,
        play.scales,
        runs::summary(db).await
    );
}

/// Reports an active machine of a compute pool failed (an operator's report), which starts its
/// remediation; the machine and its class, if there is one. Never one reported before: each
/// report must start a remediation of its own.
async fn report_failed(api: &Api, pool: &PgPool) -> Option<(String, usize)> {
    let found: Option<(String, String)> = sqlx::query_as(
        "select m.id::text, c.name from machines m join node_pools p on p.id = m.node_pool_id \
           join machine_classes c on c.id = m.machine_class_id \
         where m.state = 'active' and p.role = 'compute' \
           and not exists (select 1 from machine_remediations r where r.machine_id = m.id) \
         order by m.id limit 1",
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
