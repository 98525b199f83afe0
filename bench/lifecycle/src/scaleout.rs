//! `lifecycle-bench scale-out` (run by `bench/scale-out/run`): one PostgreSQL, one `paddock api`
//! and 1, 2, 4... `paddock worker` processes (the release binary, each with its default slots and
//! pool), all on the simulated drivers with their latencies scaled (`PADDOCK_SIM_LATENCY_SCALE`) so
//! that the BMC's waits hold the worker's slots as in production. Per replica count, on a fresh
//! database: enroll and clean `--machines` machines, then `--clusters` cluster lifecycles with
//! `--in-flight` at once; throughput, its ratio to one worker, PostgreSQL's share of the CPU,
//! backends waiting on locks, commits and CPU per unit of work, and the top statements by time.
//!
//! Each worker process also runs the simulated machines' agent (as `paddock worker` does with the
//! simulated BMC): with N workers, N agents poll the simulated world. That is the simulator's
//! cost, not a production one; the statements on `paddock_sim` tables show it.

use super::*;

/// One replica count's measurements.
struct Run {
    workers: usize,
    enroll: Phase,
    churn: Phase,
}

/// One phase of a run: wall time, units of work, deltas and lock samples.
struct Phase {
    secs: f64,
    units: f64,
    delta: Delta,
    paddock_cpu: f64,
    locks: Locks,
    statements: Vec<(i64, f64, String)>,
}

impl Phase {
    fn rate(&self) -> f64 {
        self.units / self.secs
    }
}

/// Backends of the database waiting on a heavyweight lock, sampled every 100 ms; and, per waiter,
/// what the backend it waits for was doing at that moment (its wait event, or its state with the
/// statement it last ran: `idle in transaction` means the holder's process had not yet sent its
/// next statement or its commit).
#[derive(Default, Clone)]
struct Locks {
    samples: u64,
    waiting: u64,
    max: i64,
    active: u64,
    blockers: BTreeMap<String, u64>,
}

pub(super) async fn scale_out(admin_url: &str, args: &Args) -> anyhow::Result<()> {
    let bin = PathBuf::from(args.str("paddock", "target/release/paddock"));
    let counts: Vec<usize> = args
        .str("workers", "1,2,4")
        .split(',')
        .map(|w| w.trim().parse().with_context(|| format!("--workers: {w:?} is not a count")))
        .collect::<anyhow::Result<_>>()?;
    let mut runs = Vec::new();
    for &workers in &counts {
        runs.push(one(admin_url, args, &bin, workers).await?);
    }
    summary(&runs);
    Ok(())
}

async fn one(admin_url: &str, args: &Args, bin: &Path, workers: usize) -> anyhow::Result<Run> {
    let machines: usize = args.get("machines", 4500)?;
    let clusters: usize = args.get("clusters", 2000)?;
    let in_flight: usize = args.get("in-flight", 256)?;
    let scale = args.str("latency-scale", "4");
    let interval = Duration::from_millis(args.get("get-interval-ms", 500)?);
    let admin = PgPoolOptions::new().max_connections(2).connect(admin_url).await?;
    let name = format!("scale_out_w{workers}");
    let url = fresh_database(&admin, admin_url, &name).await?;
    let db = PgPoolOptions::new().max_connections(2).connect(&url).await?;
    let fleet = Fleet::start(bin, &url, workers, &scale, &args.str("log-dir", "/tmp")).await?;
    let api = Api::new(&fleet.base)?;
    println!(
        "\nscale-out: {workers} worker(s), 1 api; {machines} machines, {clusters} clusters ({in_flight} in flight), \
         PADDOCK_SIM_LATENCY_SCALE={scale}"
    );
    api.post(
        "/v1/machine-classes",
        &json!({"name": "bench", "cpu_cores": 64, "memory_gib": 512, "gpu_model": "", "gpu_count": 0,
                "description": "scale-out bench"}),
    )
    .await?;
    let mut tenants = Vec::new();
    for k in 0..in_flight.clamp(1, 256) {
        let t = api.post("/v1/tenants", &json!({"name": format!("bench-{k}")})).await?;
        tenants.push(t["id"].as_str().context("tenant id")?.to_owned());
    }

    let enroll_phase = measure(&admin, &db, &name, &fleet, machines as f64, async {
        enroll(&api, 0, machines, "m").await?;
        wait_available(&db, machines as i64).await
    })
    .await?;
    report("enroll", "machine", &enroll_phase);
    let churn_phase = measure(&admin, &db, &name, &fleet, clusters as f64, async {
        let failures = churn(&api, &tenants, clusters, in_flight, interval).await?;
        match failures.first() {
            None => Ok(()),
            Some(first) => bail!("{} of {clusters} lifecycles failed; first: {first}", failures.len()),
        }
    })
    .await?;
    report("lifecycle", "cluster", &churn_phase);
    fleet.stop().await;
    Ok(Run { workers, enroll: enroll_phase, churn: churn_phase })
}

/// Runs `work`, measuring the database, the CPU of every party and the lock waits around it.
async fn measure(
    admin: &PgPool,
    db: &PgPool,
    name: &str,
    fleet: &Fleet,
    units: f64,
    work: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<Phase> {
    reset_statements(db).await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // statistics flush
    let (cpu0, a) = (fleet.cpu(), snap(admin, name, None).await?);
    let (stop_tx, stop_rx) = watch::channel(false);
    let sampler = tokio::spawn(sample_locks(admin.clone(), name.to_owned(), stop_rx));
    let t0 = Instant::now();
    let result = work.await;
    let secs = t0.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    let locks = sampler.await?;
    result?;
    tokio::time::sleep(Duration::from_millis(1100)).await; // statistics flush
    let (cpu1, b) = (fleet.cpu(), snap(admin, name, None).await?);
    let statements = statements_by_time(db, 8).await;
    Ok(Phase { secs, units, delta: delta(&a, &b), paddock_cpu: cpu1 - cpu0, locks, statements })
}

async fn sample_locks(admin: PgPool, db: String, mut stop: watch::Receiver<bool>) -> Locks {
    let mut locks = Locks::default();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return locks,
        }
        let row: Result<(i64, i64), _> = sqlx::query_as(
            "select count(*) filter (where wait_event_type = 'Lock'), count(*) filter (where state = 'active') \
             from pg_stat_activity where datname = $1",
        )
        .bind(&db)
        .fetch_one(&admin)
        .await;
        if let Ok((waiting, active)) = row {
            locks.samples += 1;
            locks.waiting += waiting as u64;
            locks.active += active as u64;
            locks.max = locks.max.max(waiting);
            if waiting > 0 {
                for (key, n) in blockers(&admin, &db).await {
                    *locks.blockers.entry(key).or_default() += n as u64;
                }
            }
        }
    }
}

/// For the backends waiting on a lock: the statement each waits in, and what the backend it waits
/// for is doing (a wait event, or its state and the statement it ran last), counted.
async fn blockers(admin: &PgPool, db: &str) -> Vec<(String, i64)> {
    sqlx::query_as(
        "select left(regexp_replace(w.query, '\\s+', ' ', 'g'), 60) || '  <-  ' || \
           coalesce(b.wait_event_type || ':' || b.wait_event, b.state, '?') || ' [' || \
           left(regexp_replace(b.query, '\\s+', ' ', 'g'), 60) || ']', count(*) \
         from pg_stat_activity w cross join lateral unnest(pg_blocking_pids(w.pid)) as bp(pid) \
         join pg_stat_activity b on b.pid = bp.pid \
         where w.datname = $1 and w.wait_event_type = 'Lock' group by 1",
    )
    .bind(db)
    .fetch_all(admin)
    .await
    .unwrap_or_default()
}

/// The statements that took the most time (pg_stat_statements), as (calls, total ms, text).
async fn statements_by_time(db: &PgPool, limit: i64) -> Vec<(i64, f64, String)> {
    sqlx::query_as(
        "select calls, total_exec_time, regexp_replace(query, '\\s+', ' ', 'g') from pg_stat_statements \
         where dbid = (select oid from pg_database where datname = current_database()) \
         order by total_exec_time desc limit $1",
    )
    .bind(limit)
    .fetch_all(db)
    .await
    .unwrap_or_default()
}

fn report(what: &str, unit: &str, p: &Phase) {
    let d = &p.delta;
    println!("{what}_seconds: {:.1}", p.secs);
    println!("{what}_per_second: {:.2} {unit}s", p.rate());
    println!(
        "{what}_cores: paddock={:.3} postgres={:.3} driver={:.3} other={:.3}; postgres share of the busy CPU {:.0}%",
        p.paddock_cpu / d.secs,
        d.postgres / d.secs,
        d.driver / d.secs,
        (d.other - p.paddock_cpu).max(0.0) / d.secs,
        100.0 * d.postgres / (p.paddock_cpu + d.postgres + d.driver + (d.other - p.paddock_cpu).max(0.0)).max(1e-9)
    );
    println!(
        "{what}_per_{unit}: {:.1} commits, postgres {:.2} ms CPU, paddock {:.2} ms CPU; {:.0} commits/s, postgres {:.0} us CPU per commit",
        d.commits as f64 / p.units,
        d.postgres * 1e3 / p.units,
        p.paddock_cpu * 1e3 / p.units,
        d.commits as f64 / d.secs,
        d.postgres * 1e6 / d.commits.max(1) as f64
    );
    let l = &p.locks;
    let n = l.samples.max(1) as f64;
    println!(
        "{what}_lock_waits: {:.2} backends waiting on a lock on average (max {}), of {:.1} active; {} samples",
        l.waiting as f64 / n,
        l.max,
        l.active as f64 / n,
        l.samples
    );
    let mut blockers: Vec<(&String, &u64)> = l.blockers.iter().collect();
    blockers.sort_by(|a, b| b.1.cmp(a.1));
    let total: u64 = l.blockers.values().sum();
    println!("{what}_lock_blockers: what a waiter waited for, share of {total} (waiter, blocker) samples:");
    for (key, count) in blockers.iter().take(8) {
        println!("  {:>5.1}%  {key}", 100.0 * **count as f64 / total.max(1) as f64);
    }
    println!(
        "{what}_rollbacks: {}; GETs sent again after a connection reset (all phases so far): {}",
        d.rollbacks,
        RESENT_GETS.load(Ordering::Relaxed)
    );
    println!("{what}: top statements by time (calls, total ms, statement):");
    for (calls, ms, q) in &p.statements {
        let q: String = q.chars().take(140).collect();
        println!("  {calls:>9} {ms:>10.0}  {q}");
    }
}

fn summary(runs: &[Run]) {
    let Some(base) = runs.first() else { return };
    println!("\nsummary (ratio = throughput / the first row's):");
    println!("  workers  machines/s  ratio  clusters/s  ratio  pg share (enroll, lifecycle)  lock waits avg");
    for r in runs {
        let share = |p: &Phase| {
            let busy = p.paddock_cpu + p.delta.postgres + p.delta.driver + (p.delta.other - p.paddock_cpu).max(0.0);
            100.0 * p.delta.postgres / busy.max(1e-9)
        };
        let waits = |p: &Phase| p.locks.waiting as f64 / p.locks.samples.max(1) as f64;
        println!(
            "  {:>7}  {:>10.2}  {:>5.2}  {:>10.2}  {:>5.2}  {:>3.0}%, {:>3.0}%                    {:.2}, {:.2}",
            r.workers,
            r.enroll.rate(),
            r.enroll.rate() / base.enroll.rate(),
            r.churn.rate(),
            r.churn.rate() / base.churn.rate(),
            share(&r.enroll),
            share(&r.churn),
            waits(&r.enroll),
            waits(&r.churn)
        );
    }
}

/// The processes under test: one `paddock api` and N `paddock worker`, children of the driver.
struct Fleet {
    base: String,
    children: Vec<tokio::process::Child>,
    pids: Vec<u32>,
}

impl Fleet {
    async fn start(bin: &Path, url: &str, workers: usize, scale: &str, log_dir: &str) -> anyhow::Result<Self> {
        let listen = format!("127.0.0.1:{}", free_port()?);
        let base = format!("http://{listen}");
        let env = [
            ("PADDOCK_DATABASE_URL", url.to_owned()),
            ("PADDOCK_LISTEN", listen.clone()),
            ("PADDOCK_JWT_HS256_SECRET", SECRET.to_owned()),
            ("PADDOCK_ENCRYPTION_KEY", bench_key().to_owned()),
            ("PADDOCK_LEDGER_KEY", "bench-ledger-key-of-at-least-32-bytes".to_owned()),
            ("PADDOCK_KUBE_DRIVER", "simulated".to_owned()),
            ("PADDOCK_BMC_DRIVER", "simulated".to_owned()),
            ("PADDOCK_SIM_LATENCY_SCALE", scale.to_owned()),
            ("PADDOCK_WIPE_IMAGE_URL", "http://images.bench.invalid/wipe.img".to_owned()),
            ("PADDOCK_OS_IMAGE_URL", "http://images.bench.invalid/os.img".to_owned()),
            ("PADDOCK_AGENT_BASE_URL", base.clone()),
            ("PADDOCK_AGENT_INSECURE_HTTP", "true".to_owned()),
            ("PADDOCK_LOG", "warn".to_owned()),
        ];
        let mut fleet = Self { base, children: Vec::new(), pids: Vec::new() };
        for (i, role) in std::iter::once("api").chain(std::iter::repeat_n("worker", workers)).enumerate() {
            let log = std::fs::File::create(format!("{log_dir}/scale-out-w{workers}-{i}-{role}.log"))?;
            let mut cmd = tokio::process::Command::new(bin);
            cmd.arg(role).envs(env.iter().cloned()).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
            let child = cmd.kill_on_drop(true).spawn().with_context(|| format!("starting {} {role}", bin.display()))?;
            fleet.pids.push(child.id().context("child pid")?);
            fleet.children.push(child);
        }
        fleet.wait_listening().await?;
        Ok(fleet)
    }

    async fn wait_listening(&self) -> anyhow::Result<()> {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while http.get(format!("{}/v1/machine-classes", self.base)).send().await.is_err() {
            if Instant::now() > deadline {
                bail!("`paddock api` did not start listening on {}", self.base);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// CPU seconds of every process of the fleet.
    fn cpu(&self) -> f64 {
        self.pids.iter().filter_map(|&p| proc_cpu(p, false)).sum()
    }

    async fn stop(mut self) {
        for pid in &self.pids {
            let _ = std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
        }
        for child in &mut self.children {
            if tokio::time::timeout(Duration::from_secs(30), child.wait()).await.is_err() {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
    }
}
