//! `lifecycle-bench lifecycle`: N Slurm clusters through create -> ready -> delete -> 404, the
//! commits and CPU they cost against pgbench's insert rate, then the idle process.

use super::*;

pub(super) async fn lifecycle(admin_url: &str, args: &Args) -> anyhow::Result<()> {
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
    let failures = churn(&api, &tenants, clusters, in_flight, interval).await?;
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
