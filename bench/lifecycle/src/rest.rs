//! `lifecycle-bench rest`: the worker's cost with many ready clusters at rest.

use super::*;

pub(super) async fn rest(admin_url: &str, args: &Args) -> anyhow::Result<()> {
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
            "  postgres_cpu_s: {:.3} = {:.2}% of one core (the benchmark server's processes)",
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
