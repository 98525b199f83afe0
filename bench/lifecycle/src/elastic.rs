//! `lifecycle-bench elastic` (run by `bench/lifecycle/run elastic`): elastic pools on the
//! simulated drivers. (1) What watching demand costs at rest: `pools` ready `kubernetes` clusters
//! with one autoscaled pool each (min 0, max 1, no machine held, no demand), dealt over `tenants`
//! tenants, a fresh paddock
//! process measured for `seconds` with the demand checks moved out of the window (the baseline),
//! then at `PADDOCK_AUTOSCALE_INTERVAL` (15 s: the one demand sweep every interval, each reading
//! every pool's demand; a cluster's own check runs only when a decision would write).
//! (2) Paddock's own time from pending demand to the node joining: zero simulated latency, a
//! wiped machine available, demand for one node set on one pool at a time; the database's clock
//! gives when the demand was set, when the autoscaler decided (the scaling operation's
//! creation) and when the pool's status first counted the node ready.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::StreamExt;
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use super::{
    delta, fresh_database, loadavg, poll_cluster, print_statements, ready, reset_statements, setup, snap,
    top_statements, Api, Args, Server,
};

pub(super) async fn elastic(admin_url: &str, args: &Args) -> anyhow::Result<()> {
    let pools: usize = args.get("pools", 1000)?;
    let seconds: u64 = args.get("seconds", 60)?;
    let in_flight: usize = args.get("in-flight", 16)?;
    let samples: usize = args.get("samples", 5)?;
    let tenant_count: usize = args.get("tenants", 50)?.max(1);
    // `PADDOCK_AUTOSCALE_INTERVAL` (15 s by default).
    let interval_s: u64 = args.get("interval-s", 15)?.max(1);
    let admin = PgPoolOptions::new().max_connections(2).connect(admin_url).await?;
    let name = "lifecycle_bench_elastic";
    let url = fresh_database(&admin, admin_url, name).await?;
    let db = PgPoolOptions::new().max_connections(4).connect(&url).await?;

    let server = Server::start(&url, &[("agent-poll-ms", "20".into()), ("drift-interval-s", "0".into())]).await?;
    let api = Api::new(&server.base)?;
    // A fleet at rest is many tenants' (each has its own slots in the worker): `tenants` of them,
    // the clusters dealt round-robin.
    let first = setup(&api, &db, samples, "e").await?;
    let mut tenants = vec![first];
    for t in 1..tenant_count {
        let made = api.post("/v1/tenants", &json!({"name": format!("bench-{t}"), "display_name": "Bench"})).await?;
        tenants.push(made["id"].as_str().context("tenant id")?.to_owned());
    }
    let t0 = Instant::now();
    let made: Vec<anyhow::Result<String>> = futures::stream::iter(0..pools)
        .map(|i| {
            let (api, tenant) = (api.clone(), tenants[i % tenants.len()].clone());
            async move { create_elastic(&api, &tenant, &format!("k{i:05}")).await }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let clusters = made.into_iter().collect::<anyhow::Result<Vec<String>>>()?;
    eprintln!("{pools} clusters with an autoscaled pool ready in {:.1} s", t0.elapsed().as_secs_f64());
    server.stop().await;

    let off = at_rest(&admin, &db, name, &url, seconds, None).await?;
    let on = at_rest(&admin, &db, name, &url, seconds, Some(interval_s)).await?;
    println!("test: elastic pools at rest, {pools} ready clusters of {tenant_count} tenants, one autoscaled pool each (no demand)");
    for window in [&off, &on] {
        window.print();
    }
    let checks = on.checks.max(1) as f64;
    let watching = (on.cpu - off.cpu).max(0.0);
    println!(
        "watching_demand: {:.3}% of one core for {pools} pools (target < 1%): {}; paddock {:.0} us of CPU per check",
        watching * 100.0,
        if watching < 0.01 { "MET" } else { "NOT MET" },
        (on.delta.server - off.delta.server).max(0.0) / checks * 1e6,
    );
    demand_to_join(&db, &url, &clusters[..samples.min(clusters.len())], interval_s).await
}

/// Creates a `kubernetes` cluster with one autoscaled pool and waits until it is ready.
async fn create_elastic(api: &Api, tenant: &str, name: &str) -> anyhow::Result<String> {
    let body = json!({"name": name, "kind": "kubernetes", "isolation": "private-nodes",
        "node_pools": [{"name": "work", "machine_class": "bench", "count": 0,
                        "autoscaling": {"min": 0, "max": 1}}]});
    let v: Value = api.post(&format!("/v1/tenants/{tenant}/clusters"), &body).await?;
    let id = v["cluster"]["id"].as_str().with_context(|| format!("no cluster id in {v}"))?.to_owned();
    let path = format!("/v1/tenants/{tenant}/clusters/{id}");
    poll_cluster(api, &path, Duration::from_millis(200), Duration::from_secs(1800), ready).await?;
    Ok(id)
}

/// One measured window of a fresh process at rest.
struct Window {
    checking: Option<u64>,
    delta: super::Delta,
    cpu: f64,
    load: (String, String),
    checks: i64,
    statements: Vec<(i64, f64, String)>,
}

impl Window {
    fn print(&self) {
        let d = &self.delta;
        let interval = self.checking.map_or("none in the window".to_owned(), |s| format!("every {s} s"));
        println!("window: demand checks {interval} ({:.1} s, load_avg {} -> {})", d.secs, self.load.0, self.load.1);
        println!("  paddock_cpu_s: {:.3} = {:.3}% of one core", d.server, self.cpu * 100.0);
        println!("  postgres_cpu_s: {:.3} = {:.2}% of one core", d.postgres, d.postgres / d.secs * 100.0);
        println!("  commits_per_s: {:.1}", d.commits as f64 / d.secs);
        println!("  demand_checks: {} ({:.2}/s)", self.checks, self.checks as f64 / d.secs);
        print_statements("  statements", "second", &self.statements, d.secs);
    }
}

/// Measures a fresh process for `seconds` with the demand checks queued over the interval
/// (`checking`) or moved out of the window.
async fn at_rest(
    admin: &PgPool,
    db: &PgPool,
    name: &str,
    url: &str,
    seconds: u64,
    checking: Option<u64>,
) -> anyhow::Result<Window> {
    let spread = match checking {
        Some(s) => format!("now() + random() * interval '{s} seconds'"),
        None => "now() + interval '1 day'".to_owned(),
    };
    sqlx::query(&format!("update jobs set run_at = {spread} where kind = 'cluster_autoscale' and state = 'queued'"))
        .execute(db)
        .await?;
    let extra = [
        ("agent-poll-ms", "200".into()),
        ("drift-interval-s", "0".into()),
        ("autoscale-interval-s", checking.unwrap_or(3600).to_string()),
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
    // Every check reads the simulated demand once (pg_stat_statements, reset at the window's
    // start); without it, the clusters checked at least once.
    let reads: Option<i64> = sqlx::query_scalar(
        "select sum(calls)::bigint from pg_stat_statements where query like '%from paddock_sim.demand%' \
         and dbid = (select oid from pg_database where datname = current_database())",
    )
    .fetch_one(db)
    .await
    .ok()
    .flatten();
    let checked: i64 = sqlx::query_scalar(
        "select count(*) from jobs where kind = 'cluster_autoscale' and updated_at >= $1 \
         and last_error->>'code' = 'watching_demand'",
    )
    .bind(since)
    .fetch_one(db)
    .await?;
    let checks = reads.unwrap_or(checked);
    let load_end = loadavg();
    let statements = top_statements(db, 12).await;
    server.stop().await;
    let delta = delta(&a, &b);
    let cpu = delta.server / delta.secs;
    Ok(Window { checking, delta, cpu, load: (load_start, load_end), checks, statements })
}

/// Demand for one node on each of `clusters`' pool in turn, at the default interval: from the
/// demand to the decision, from the decision to the node counted ready.
async fn demand_to_join(db: &PgPool, url: &str, clusters: &[String], interval_s: u64) -> anyhow::Result<()> {
    let extra = [("agent-poll-ms", "200".into()), ("drift-interval-s", "0".into())];
    let server =
        Server::start(url, &[extra[0].clone(), extra[1].clone(), ("autoscale-interval-s", interval_s.to_string())])
            .await?;
    println!(
        "test: pending demand to a joined node, {} samples, autoscale interval {interval_s} s, zero simulated latency",
        clusters.len()
    );
    let (mut decide, mut join) = (Vec::new(), Vec::new());
    for cluster in clusters {
        let id: uuid::Uuid = cluster.parse()?;
        let pool: uuid::Uuid =
            sqlx::query_scalar("select id from node_pools where cluster_id = $1").bind(id).fetch_one(db).await?;
        let set: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
            "insert into paddock_sim.demand (cluster_id, pool, pending_jobs, pending_nodes) values ($1, 'work', 1, 1) \
             on conflict (cluster_id, pool) do update set pending_jobs = 1, pending_nodes = 1 returning clock_timestamp()",
        )
        .bind(id)
        .fetch_one(db)
        .await?;
        let t0 = Instant::now();
        let joined = loop {
            let ready: i32 =
                sqlx::query_scalar("select ready from node_pools where id = $1").bind(pool).fetch_one(db).await?;
            if ready >= 1 {
                break sqlx::query_scalar::<_, chrono::DateTime<chrono::Utc>>("select clock_timestamp()")
                    .fetch_one(db)
                    .await?;
            }
            if t0.elapsed() > Duration::from_secs(300) {
                bail!("the pool of cluster {cluster} did not get its node within 300 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let decided: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
            "select min(created_at) from operations where target_id = $1 and kind = 'node_pool_scale'",
        )
        .bind(pool)
        .fetch_one(db)
        .await?;
        let ms = |d: chrono::TimeDelta| d.num_milliseconds() as f64;
        decide.push(ms(decided - set));
        join.push(ms(joined - decided));
        println!(
            "  sample: demand -> decision {:.0} ms, decision -> node ready {:.0} ms",
            ms(decided - set),
            ms(joined - decided)
        );
    }
    server.stop().await;
    let stats = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v.first().copied().unwrap_or(0.0), v[v.len() / 2], v.last().copied().unwrap_or(0.0))
    };
    let (d, j) = (stats(&mut decide), stats(&mut join));
    println!(
        "demand_to_decision_ms: min {:.0} median {:.0} max {:.0} (the wait for the next check: at most the interval)",
        d.0, d.1, d.2
    );
    println!(
        "decision_to_node_ready_ms: min {:.0} median {:.0} max {:.0} (allocation, provisioning, join: paddock's own)",
        j.0, j.1, j.2
    );
    Ok(())
}
