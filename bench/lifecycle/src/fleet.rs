//! `lifecycle-bench fleet` (run by `bench/lifecycle/run fleet`): a fleet of simulated
//! machines from enroll to `available` with zero-latency simulated BMCs and agents, the paddock
//! process under test at `paddock serve`'s settings for the simulated drivers at
//! `PADDOCK_SIM_LATENCY_SCALE=0` (worker concurrency 8, a pool of 16, the agent polling every
//! 20 ms, reconcile polls of 50 ms). Measures the wall time from the first enroll POST until every
//! machine is available, the rate per core beside NICo's, and where the time goes: the database's
//! commits and statements per machine (pg_stat_statements), the worker's job runs, CPU per party,
//! and the machines by state and the queue's backlog sampled every second.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};

use super::{
    delta, enroll, fresh_database, loadavg, print_cpu, print_statements, reset_statements, snap, top_statements, Api,
    Args, Server,
};

/// NICo (NVIDIA's open bare-metal manager): 13,500 simulated machines in 3.9-4.9 hours on three
/// 96-core nodes, as its documentation gives it.
const NICO_MACHINES: f64 = 13_500.0;
const NICO_HOURS: (f64, f64) = (4.9, 3.9);
const NICO_CORES: f64 = 3.0 * 96.0;

pub(super) async fn fleet(admin_url: &str, args: &Args) -> anyhow::Result<()> {
    let machines: usize = args.get("machines", 4500)?;
    let admin = PgPoolOptions::new().max_connections(2).connect(admin_url).await?;
    let name = "lifecycle_bench_fleet";
    let url = fresh_database(&admin, admin_url, name).await?;
    let db = PgPoolOptions::new().max_connections(2).connect(&url).await?;
    let extra = [
        ("concurrency", args.str("concurrency", "8")),
        ("pool", args.str("pool", "16")),
        ("agent-poll-ms", args.str("agent-poll-ms", "20")),
        ("poll-ms", args.str("poll-ms", "50")),
    ];
    println!(
        "fleet: {machines} simulated machines, zero latency; serve {}",
        extra.iter().map(|(k, v)| format!("--{k} {v}")).collect::<Vec<_>>().join(" ")
    );
    let server = Server::start(&url, &extra).await?;
    let api = Api::new(&server.base)?;
    api.post(
        "/v1/machine-classes",
        &json!({"name": "bench", "cpu_cores": 64, "memory_gib": 512, "gpu_model": "", "gpu_count": 0,
                "description": "fleet bench"}),
    )
    .await?;
    reset_statements(&db).await;
    let before = snap(&admin, name, Some(server.pid)).await?;

    let sampler = tokio::spawn(sample(db.clone(), machines as i64));
    let t0 = Instant::now();
    enroll(&api, 0, machines, "fleet-").await?;
    let enrolled = t0.elapsed();
    let samples = sampler.await??;
    let wall = t0.elapsed();
    let after = snap(&admin, name, Some(server.pid)).await?;
    let d = delta(&before, &after);

    let n = machines as f64;
    let secs = wall.as_secs_f64();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
    println!("fleet_enroll_seconds: {:.1} ({machines} POSTs, 16 at once)", enrolled.as_secs_f64());
    println!(
        "fleet_wall_seconds: {secs:.1} (first POST -> all {machines} available; target <= 600: {})",
        if secs <= 600.0 { "MET" } else { "NOT MET" }
    );
    println!("fleet_machines_per_second: {:.2}", n / secs);
    let ours = n / (secs / 3600.0) / cores;
    let (nico_low, nico_high) = (NICO_MACHINES / NICO_HOURS.0 / NICO_CORES, NICO_MACHINES / NICO_HOURS.1 / NICO_CORES);
    println!(
        "fleet_machines_per_core_hour: {ours:.0} here ({cores} cores) against NICo's {nico_low:.1}-{nico_high:.1} \
         (13,500 in 3.9-4.9 h on 3 x 96 cores): {:.0}-{:.0}x",
        ours / nico_high,
        ours / nico_low
    );
    println!(
        "fleet_commits: {} ({:.1} per machine), rollbacks {}, WAL records {:.1} per machine, WAL syncs {:.1} per machine",
        d.commits,
        d.commits as f64 / n,
        d.rollbacks,
        d.wal_records as f64 / n,
        d.wal_syncs as f64 / n
    );
    print_cpu("fleet", &d);
    println!(
        "fleet_cpu_seconds_per_machine: paddock {:.2} ms, postgres {:.2} ms",
        d.server / n * 1000.0,
        d.postgres / n * 1000.0
    );
    jobs(&db, n).await?;
    let statements = top_statements(&db, 25).await;
    let (calls, ms) = statements_total(&db).await;
    println!(
        "fleet_statements: {calls} ({:.1} per machine), {:.0} ms executing ({:.2} ms per machine)",
        calls as f64 / n,
        ms,
        ms / n
    );
    print_statements("fleet_top_statements", "machine", &statements, n);
    println!("fleet_samples (s: enrolling inspecting cleaning available | jobs queued-due queued-later running):");
    for s in &samples {
        println!("  {s}");
    }
    println!("load average at the end: {}", loadavg());
    server.stop().await;
    Ok(())
}

/// Every second until `want` machines are available: the machines by state and the queue.
async fn sample(db: PgPool, want: i64) -> anyhow::Result<Vec<String>> {
    let t0 = Instant::now();
    let mut out = Vec::new();
    loop {
        let row = sqlx::query(
            "select count(*) filter (where state = 'enrolling'), count(*) filter (where state = 'inspecting'), \
                    count(*) filter (where state = 'cleaning'), count(*) filter (where state = 'available'), \
                    (select count(*) from jobs where state = 'queued' and run_at <= now()), \
                    (select count(*) from jobs where state = 'queued' and run_at > now()), \
                    (select count(*) from jobs where state = 'running') \
             from machines",
        )
        .fetch_one(&db)
        .await?;
        let v: Vec<i64> = (0..7).map(|i| row.get::<i64, _>(i)).collect();
        out.push(format!(
            "{:>6.1}: {:>5} {:>5} {:>5} {:>5} | {:>5} {:>5} {:>3}",
            t0.elapsed().as_secs_f64(),
            v[0],
            v[1],
            v[2],
            v[3],
            v[4],
            v[5],
            v[6]
        ));
        if v[3] >= want {
            return Ok(out);
        }
        if t0.elapsed() > Duration::from_secs(3600) {
            bail!("only {} of {want} machines became available in an hour", v[3]);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The worker's jobs of the run: how many, and how often they ran (claims = runs).
async fn jobs(db: &PgPool, n: f64) -> anyhow::Result<()> {
    let rows = sqlx::query(
        "select kind, state, count(*), coalesce(sum(attempts), 0)::bigint from jobs group by kind, state order by 1, 2",
    )
    .fetch_all(db)
    .await?;
    println!("fleet_jobs (kind, state, jobs, failed attempts):");
    for r in rows {
        println!("  {} {} {} {}", r.get::<String, _>(0), r.get::<String, _>(1), r.get::<i64, _>(2), r.get::<i64, _>(3));
    }
    let claims: Option<i64> = sqlx::query_scalar(
        "select sum(calls)::bigint from pg_stat_statements \
         where dbid = (select oid from pg_database where datname = current_database()) \
           and query ilike '%for update skip locked%' and query ilike '%jobs%'",
    )
    .fetch_one(db)
    .await
    .unwrap_or(None);
    if let Some(claims) = claims {
        println!("fleet_claim_statements: {claims} ({:.1} per machine)", claims as f64 / n);
    }
    Ok(())
}

/// Statements and their execution time in all (pg_stat_statements), `(0, 0)` without it.
async fn statements_total(db: &PgPool) -> (i64, f64) {
    sqlx::query(
        "select coalesce(sum(calls), 0)::bigint, coalesce(sum(total_exec_time), 0)::float8 from pg_stat_statements \
         where dbid = (select oid from pg_database where datname = current_database())",
    )
    .fetch_one(db)
    .await
    .map(|r| (r.get::<i64, _>(0), r.get::<f64, _>(1)))
    .unwrap_or((0, 0.0))
}
