//! `lifecycle-bench parallel`: one pool's nodes provisioned in parallel against a 1-node pool.

use super::*;

pub(super) async fn parallel(admin_url: &str, args: &Args) -> anyhow::Result<()> {
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
