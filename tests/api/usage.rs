//! usage: metering (docs/billing.md) on the real PostgreSQL. Segments open and close in the
//! transaction of the machine's state change; the schema forbids overlaps and changes of a
//! closed segment; reads clip to the range at a watermark; any windowing and grouping sums to the
//! same total (property tests over random timelines); a cursor walk is complete and duplicate-free
//! while rows arrive; a late-committing writer never lands below a returned `as_of`; closed
//! periods are signed and never change; bad input is a 4xx, never a 500.

use std::collections::BTreeSet;

use base64::Engine;
use chrono::{DateTime, Duration, Utc};
use paddock_domain::signing::SigningKey;
use paddock_domain::usage::{clipped_seconds, Range, Window};
use paddock_store::lifecycle;
use paddock_store::usage as store;
use paddock_testkit::{admin, token, TestApp};
use paddock_types::machine::MachineState;
use paddock_types::{ClusterId, MachineId, TenantId};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::common::{self, id};

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).expect("timestamp").with_timezone(&Utc)
}

fn text(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A closed machine segment written directly (history the lifecycle would have written).
#[derive(Debug, Clone)]
struct Seg {
    tenant: Uuid,
    cluster: Uuid,
    pool: Uuid,
    machine: Uuid,
    class: &'static str,
    gpus: i32,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
}

async fn insert(pool: &sqlx::PgPool, s: &Seg) {
    sqlx::query(
        "insert into usage_segments (id, kind, tenant_id, cluster_id, node_pool_id, machine_id, allocation_id, \
           machine_class, gpu_count, start_at, end_at, close_reason) \
         values ($1, 'machine', $2, $3, $4, $5, $6, $7, $8, $9, $10, 'fixture')",
    )
    .bind(Uuid::now_v7())
    .bind(s.tenant)
    .bind(s.cluster)
    .bind(s.pool)
    .bind(s.machine)
    .bind(Uuid::now_v7())
    .bind(s.class)
    .bind(s.gpus)
    .bind(s.start)
    .bind(s.end)
    .execute(pool)
    .await
    .expect("inserting a segment");
}

fn billing() -> String {
    token(&["billing:reader"], None)
}

async fn get(app: &TestApp, path: &str) -> Value {
    app.get(path).token(&billing()).send().await.expect(200).json()
}

#[tokio::test]
async fn a_machine_segment_opens_at_activation_and_closes_once_when_the_release_finishes() {
    let app = TestApp::new().await;
    common::machine_class(&app, "gpu-8", 8).await;
    let machine = id(&common::machine(&app, "node-1", "gpu-8").await);
    common::set_machine_state(&app, &machine, "provisioning").await;
    let m = MachineId(machine.parse().expect("uuid"));
    let version = || async {
        sqlx::query_scalar::<_, i64>("select status_version from machines where id = $1")
            .bind(m.uuid())
            .fetch_one(&app.db.pool)
            .await
            .expect("version")
    };
    let mut conn = app.db.pool.acquire().await.expect("conn");
    assert!(lifecycle::activate(&mut conn, &paddock_testkit::ledger_key(), m, version().await, "node-1")
        .await
        .expect("activate")
        .is_some());
    // A replay of the activation (a stale version) writes nothing, and no second segment.
    assert!(lifecycle::activate(&mut conn, &paddock_testkit::ledger_key(), m, version().await - 1, "node-1")
        .await
        .expect("replay")
        .is_none());
    assert!(!store::open_machine_segment(&mut conn, m).await.expect("reopen"), "keyed by the allocation");
    let open: (Option<DateTime<Utc>>, i32, String) =
        sqlx::query_as("select end_at, gpu_count, machine_class from usage_segments where machine_id = $1")
            .bind(m.uuid())
            .fetch_one(&app.db.pool)
            .await
            .expect("one segment");
    assert_eq!(open, (None, 8, "gpu-8".to_owned()));
    // The release starts: still billed until the release finishes (`finish_release`, which the
    // machine reconciler calls once the BMC has powered the machine off; no BMC here).
    assert!(lifecycle::begin_release(
        &mut conn,
        &paddock_testkit::ledger_key(),
        m,
        MachineState::Active,
        version().await
    )
    .await
    .expect("release"));
    assert_eq!(app.count("usage_segments where end_at is null").await, 1);
    let mut tx = paddock_store::Store::from_pool(app.db.pool.clone()).begin().await.expect("begin");
    assert!(lifecycle::finish_release(
        &mut tx,
        &paddock_testkit::ledger_key(),
        m,
        MachineState::Releasing,
        version().await
    )
    .await
    .expect("finish"));
    tx.commit().await.expect("commit");
    assert_eq!(app.count("usage_segments where end_at is null").await, 0);
    assert_eq!(app.count("usage_segments where close_reason = 'machine moved to cleaning'").await, 1);
    // The forced path's function closes nothing twice.
    assert!(!store::close_machine_segment(&mut conn, m, "forced").await.expect("close again"));
    // A closed segment never changes, and is never deleted; nothing overlaps one machine's.
    let changed =
        sqlx::query("update usage_segments set end_at = end_at + interval '1 hour'").execute(&app.db.pool).await;
    assert!(changed.is_err(), "a closed segment changed");
    assert!(sqlx::query("delete from usage_segments").execute(&app.db.pool).await.is_err(), "a segment was deleted");
    // Two segments of one machine never overlap: not two open ones, not a closed one inside.
    let other = Uuid::now_v7();
    let seg = |start: &str, end: &str| Seg {
        tenant: Uuid::now_v7(),
        cluster: Uuid::now_v7(),
        pool: Uuid::now_v7(),
        machine: other,
        class: "cpu",
        gpus: 0,
        start: at(start),
        end: at(end),
    };
    insert(&app.db.pool, &seg("2026-10-01T00:00:00Z", "2026-10-01T02:00:00Z")).await;
    insert(&app.db.pool, &seg("2026-10-01T02:00:00Z", "2026-10-01T03:00:00Z")).await; // adjacent: fine
    insert_open(&app.db.pool, &seg("2026-10-02T00:00:00Z", "2026-10-02T00:00:00Z"), true).await;
    let overlap =
        "insert into usage_segments (id, kind, tenant_id, cluster_id, node_pool_id, machine_id, allocation_id, \
           machine_class, start_at, end_at, close_reason) values (gen_random_uuid(), 'machine', gen_random_uuid(), \
           gen_random_uuid(), gen_random_uuid(), $1, gen_random_uuid(), 'cpu', $2, $3, 'x')";
    for (start, end) in
        [("2026-10-01T01:00:00Z", "2026-10-01T01:00:01Z"), ("2026-10-03T00:00:00Z", "2026-10-03T00:00:01Z")]
    {
        let refused = sqlx::query(overlap).bind(other).bind(at(start)).bind(at(end)).execute(&app.db.pool).await;
        assert!(refused.is_err(), "an overlapping segment {start}..{end} was accepted");
    }
}

#[tokio::test]
async fn a_control_plane_segment_opens_once_when_ready_and_closes_when_deletion_starts() {
    let app = TestApp::new().await;
    let tenant = id(&common::tenant(&app, "acme").await);
    let body = json!({ "name": "c1", "kind": "kubernetes", "isolation": "private-nodes" });
    let created =
        app.post(format!("/v1/tenants/{tenant}/clusters")).token(&admin()).json(&body).send().await.expect(202);
    let cluster = created.json()["cluster"]["id"].as_str().expect("id").to_owned();
    let (t, c) = (TenantId(tenant.parse().expect("uuid")), ClusterId(cluster.parse().expect("uuid")));
    let mut conn = app.db.pool.acquire().await.expect("conn");
    assert!(store::open_control_plane_segment(&mut conn, t, c).await.expect("open"));
    assert!(!store::open_control_plane_segment(&mut conn, t, c).await.expect("open again"), "only the first ready");
    app.delete(format!("/v1/tenants/{tenant}/clusters/{cluster}")).token(&admin()).send().await.expect(202);
    assert_eq!(app.count("usage_segments where kind = 'control_plane' and end_at is not null").await, 1);
    assert!(!store::open_control_plane_segment(&mut conn, t, c).await.expect("after deletion"));
}

/// Random timelines: per machine, consecutive non-overlapping segments of random lengths,
/// crossing hour, day and month boundaries.
/// One machine's timeline: tenant, pool and class indexes, and (gap, length) seconds per segment.
type Machine = (u8, u8, u8, Vec<(u32, u32)>);

fn timeline() -> impl Strategy<Value = Vec<Machine>> {
    // (tenant index, pool index, class index, [(gap, length) seconds])
    prop::collection::vec((0u8..3, 0u8..2, 0u8..2, prop::collection::vec((0u32..200_000, 1u32..400_000), 1..5)), 1..6)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_windowing_and_grouping_sums_to_the_same_total_and_to_the_clipped_records() {
    let app = TestApp::new().await;
    let mut runner = TestRunner::new(Config { cases: 12, ..Config::default() });
    let base = at("2026-09-30T20:00:00Z");
    let tenants: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
    let case = std::sync::atomic::AtomicU32::new(0);
    runner
        .run(&timeline(), |machines| {
            let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let segs = segments(&machines, &tenants, base, n);
            let app = &app;
            let outcome = tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(check_case(app, &segs, base))
            });
            prop_assert!(outcome.is_ok(), "{:?}", outcome);
            Ok(())
        })
        .expect("every random timeline sums consistently");
}

fn segments(machines: &[Machine], tenants: &[Uuid], base: DateTime<Utc>, case: u32) -> Vec<Seg> {
    let classes = [("gpu-8", 8), ("cpu", 0)];
    let mut out = Vec::new();
    for (t, p, c, parts) in machines {
        let tenant = tenants[*t as usize];
        // Each case's machines and pools are its own: a case filters on its pools' cluster.
        let cluster = Uuid::from_u128(u128::from(case) << 64 | u128::from(*t));
        let pool = Uuid::from_u128(u128::from(case) << 64 | u128::from(*t) << 8 | u128::from(*p) | 1 << 32);
        let machine = Uuid::now_v7();
        let mut cursor = base;
        for (gap, len) in parts {
            let start = cursor + Duration::seconds(i64::from(*gap));
            let end = start + Duration::seconds(i64::from(*len));
            let (class, gpus) = classes[*c as usize];
            out.push(Seg { tenant, cluster, pool, machine, class, gpus, start, end });
            cursor = end;
        }
    }
    out
}

async fn check_case(app: &TestApp, segs: &[Seg], base: DateTime<Utc>) -> Result<(), String> {
    for s in segs {
        insert(&app.db.pool, s).await;
    }
    let clusters: BTreeSet<Uuid> = segs.iter().map(|s| s.cluster).collect();
    let (from, to) = (base + Duration::seconds(1800), base + Duration::days(10));
    for cluster in clusters {
        let mine: Vec<&Seg> = segs.iter().filter(|s| s.cluster == cluster).collect();
        let expected: i64 = mine.iter().map(|s| clipped_seconds(s.start, s.end, from, to)).sum();
        let expected_gpu: i64 =
            mine.iter().map(|s| clipped_seconds(s.start, s.end, from, to) * i64::from(s.gpus)).sum();
        let q = format!("from={}&to={}&cluster_id={cluster}", text(from), text(to));
        let mut totals = BTreeSet::new();
        for window in ["PT1H", "P1D", "P1M", "none"] {
            for group in
                ["", "tenant_id", "node_pool_id,machine_class", "tenant_id,cluster_id,node_pool_id,machine_class"]
            {
                let agg = get(app, &format!("/v1/usage/aggregate?{q}&window={window}&group_by={group}")).await;
                let items = agg["items"].as_array().ok_or("items")?;
                let sum: i64 = items.iter().map(|i| i["node_seconds"].as_i64().unwrap_or(0)).sum();
                let gpu: i64 = items.iter().map(|i| i["gpu_seconds"].as_i64().unwrap_or(0)).sum();
                if sum != agg["totals"]["node_seconds"].as_i64().unwrap_or(-1) {
                    return Err(format!("{window}/{group}: items sum {sum} != totals {}", agg["totals"]));
                }
                check_windows(items, window, Range { from, to })?;
                totals.insert((sum, gpu));
            }
        }
        if totals != BTreeSet::from([(expected, expected_gpu)]) {
            return Err(format!("cluster {cluster}: totals {totals:?}, expected {expected}/{expected_gpu}"));
        }
        let records = walk(app, &q, 7).await;
        let clipped: i64 = records.iter().map(|r| r["node_seconds"].as_i64().unwrap_or(0)).sum();
        if clipped != expected {
            return Err(format!("records sum {clipped} != {expected}"));
        }
    }
    Ok(())
}

/// Every item's window is one of the UTC-aligned windows of the range.
fn check_windows(items: &[Value], window: &str, range: Range) -> Result<(), String> {
    let w = Window::parse(Some(window)).map_err(|e| e.to_string())?;
    let windows: BTreeSet<(String, String)> = w.windows(range).into_iter().map(|(s, e)| (text(s), text(e))).collect();
    for item in items {
        let key = (
            item["window_start"].as_str().unwrap_or("").to_owned(),
            item["window_end"].as_str().unwrap_or("").to_owned(),
        );
        if !windows.contains(&key) {
            return Err(format!("{window}: window {key:?} is not aligned"));
        }
    }
    Ok(())
}

/// Walks every page of records; returns them in order.
async fn walk(app: &TestApp, query: &str, limit: u32) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/usage/records?{query}&limit={limit}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let resp = app.get(&path).token(&billing()).send().await.expect(200);
        let page = resp.json();
        let link = resp.header("link").map(str::to_owned);
        assert_eq!(link.is_some(), page["next_cursor"].is_string(), "a Link header exactly when there is a next page");
        out.extend(page["items"].as_array().expect("items").iter().cloned());
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return out,
        }
    }
}

#[tokio::test]
async fn hour_day_and_month_boundaries_neither_lose_nor_double_a_second() {
    let app = TestApp::new().await;
    let (tenant, cluster, pool, machine) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    // 10 s before a month's end to 10 s after it.
    let seg = Seg {
        tenant,
        cluster,
        pool,
        machine,
        class: "gpu-8",
        gpus: 8,
        start: at("2026-10-31T23:59:50Z"),
        end: at("2026-11-01T00:00:10Z"),
    };
    insert(&app.db.pool, &seg).await;
    let q = "from=2026-10-31T00:00:00Z&to=2026-11-02T00:00:00Z";
    for window in ["PT1H", "P1D", "P1M"] {
        let agg = get(&app, &format!("/v1/usage/aggregate?{q}&window={window}")).await;
        let seconds: Vec<i64> =
            agg["items"].as_array().expect("items").iter().map(|i| i["node_seconds"].as_i64().expect("n")).collect();
        assert_eq!(seconds, vec![10, 10], "{window}: {agg}");
        assert_eq!(agg["totals"]["gpu_seconds"], 160);
        assert_eq!(agg["totals"]["node_hours"], "0.005556");
    }
    // A range inside one window is that window, clipped to the range, whatever the unit.
    for window in ["P1M", "P1D", "none"] {
        let agg = get(
            &app,
            &format!("/v1/usage/aggregate?from=2026-11-01T00:00:05Z&to=2026-11-01T01:00:00Z&window={window}"),
        )
        .await;
        assert_eq!(agg["items"].as_array().map(Vec::len), Some(1), "{window}: {agg}");
        assert_eq!(agg["items"][0]["window_start"], "2026-11-01T00:00:05Z", "{window}");
        assert_eq!(agg["items"][0]["window_end"], "2026-11-01T01:00:00Z", "{window}");
        assert_eq!(agg["items"][0]["node_seconds"], 5, "{window}");
        assert_eq!(agg["items"][0]["gpu_seconds"], 40, "{window}");
    }
    // Clipped at the range: only the November half.
    let records = get(&app, "/v1/usage/records?from=2026-11-01T00:00:00Z&to=2026-11-02T00:00:00Z").await;
    assert_eq!(records["items"][0]["start"], "2026-11-01T00:00:00Z");
    assert_eq!(records["items"][0]["node_seconds"], 10);
}

#[tokio::test]
async fn a_cursor_walk_is_complete_and_duplicate_free_while_segments_open_and_close() {
    let app = TestApp::new().await;
    let now = Utc::now();
    let now = now - Duration::nanoseconds(i64::from(chrono::Timelike::nanosecond(&now)));
    let mut seeded = BTreeSet::new();
    for i in 0..40 {
        let start = now - Duration::minutes(100 - i);
        // Half of them are still open (end null), as live machines' are.
        let s = Seg {
            tenant: Uuid::now_v7(),
            cluster: Uuid::now_v7(),
            pool: Uuid::now_v7(),
            machine: Uuid::now_v7(),
            class: "cpu",
            gpus: 0,
            start,
            end: start + Duration::minutes(30),
        };
        insert_open(&app.db.pool, &s, i % 2 == 0).await;
        seeded.insert(s.machine);
    }
    let q = format!("from={}&to={}", text(now - Duration::days(1)), text(now + Duration::hours(1)));
    let mut cursor: Option<String> = None;
    let mut seen: Vec<(Uuid, i64)> = Vec::new();
    let mut closing = seeded.iter().copied().collect::<Vec<_>>().into_iter();
    loop {
        let mut path = format!("/v1/usage/records?{q}&limit=3");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let page = get(&app, &path).await;
        for r in page["items"].as_array().expect("items") {
            let machine: Uuid = r["machine_id"].as_str().expect("machine").parse().expect("uuid");
            seen.push((machine, r["node_seconds"].as_i64().expect("seconds")));
        }
        // Writers go on meanwhile: machines leave (their open segments close now) and new ones
        // become active (segments open now).
        let mut conn = app.db.pool.acquire().await.expect("conn");
        if let Some(m) = closing.next() {
            store::close_machine_segment(&mut conn, MachineId(m), "test").await.expect("close");
        }
        let s = Seg {
            tenant: Uuid::now_v7(),
            cluster: Uuid::now_v7(),
            pool: Uuid::now_v7(),
            machine: Uuid::now_v7(),
            class: "cpu",
            gpus: 0,
            start: now + Duration::days(1),
            end: now,
        };
        // Its start is the clock's (the earlier of the two), as a writer's is: above the walk's as_of.
        insert_open(&app.db.pool, &s, true).await;
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    let unique: BTreeSet<Uuid> = seen.iter().map(|(m, _)| *m).collect();
    assert_eq!(unique.len(), seen.len(), "duplicates in the walk");
    assert_eq!(unique, seeded, "the walk is complete and holds nothing newer than its as_of");
    // The same walk again at its as_of, after every close: the same seconds.
    let first = get(&app, &format!("/v1/usage/records?{q}&limit=3")).await;
    let as_of = first["as_of"].as_str().expect("as_of").to_owned();
    let again = get(&app, &format!("/v1/usage/records?{q}&limit=1000&as_of={as_of}")).await;
    assert!(again["items"].as_array().expect("items").len() >= 40);
}

/// Inserts `s`, open (end null) when `open`, with its start clipped to whole seconds.
async fn insert_open(pool: &sqlx::PgPool, s: &Seg, open: bool) {
    if !open {
        return insert(pool, s).await;
    }
    sqlx::query(
        "insert into usage_segments (id, kind, tenant_id, cluster_id, node_pool_id, machine_id, allocation_id, \
           machine_class, gpu_count, start_at) \
         values ($1, 'machine', $2, $3, $4, $5, $6, $7, $8, least($9, date_trunc('second', clock_timestamp(), 'UTC')))",
    )
    .bind(Uuid::now_v7())
    .bind(s.tenant)
    .bind(s.cluster)
    .bind(s.pool)
    .bind(s.machine)
    .bind(Uuid::now_v7())
    .bind(s.class)
    .bind(s.gpus)
    .bind(s.start)
    .execute(pool)
    .await
    .expect("inserting an open segment");
}

#[tokio::test]
async fn a_late_committing_writer_never_lands_below_a_returned_as_of() {
    let app = TestApp::new().await;
    let tenant = id(&common::tenant(&app, "acme").await);
    let body = json!({ "name": "c1", "kind": "kubernetes", "isolation": "private-nodes" });
    let created =
        app.post(format!("/v1/tenants/{tenant}/clusters")).token(&admin()).json(&body).send().await.expect(202);
    let cluster = created.json()["cluster"]["id"].as_str().expect("id").to_owned();
    let (t, c) = (TenantId(tenant.parse().expect("uuid")), ClusterId(cluster.parse().expect("uuid")));
    let mut tx = app.db.pool.begin().await.expect("tx");
    assert!(store::open_control_plane_segment(&mut tx, t, c).await.expect("open"));
    let start: DateTime<Utc> =
        sqlx::query_scalar("select start_at from usage_segments").fetch_one(&mut *tx).await.expect("start");
    // While the writer is open, no watermark is handed out.
    let reader = tokio::spawn({
        let store = app.services.store().clone();
        async move { store::watermark(&store).await.expect("watermark") }
    });
    let waited = tokio::time::timeout(std::time::Duration::from_millis(300), async {
        while !reader.is_finished() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(waited.is_err(), "a watermark was returned while a writer was open");
    tx.commit().await.expect("commit");
    let as_of = reader.await.expect("reader");
    assert!(as_of >= start, "as_of {as_of} below the late writer's start {start}");
    // Reads at that as_of see the segment (it started at or before it) and keep seeing the same.
    let q = format!(
        "from={}&to={}&as_of={}",
        text(start - Duration::hours(1)),
        text(as_of + Duration::hours(1)),
        text(as_of)
    );
    let a = app.get(format!("/v1/usage/export?{q}")).token(&billing()).send().await.expect(200);
    let b = app.get(format!("/v1/usage/export?{q}")).token(&billing()).send().await.expect(200);
    assert_eq!(a.body, b.body, "a repeated export at one as_of is byte-identical");
    assert_eq!(a.header("x-usage-as-of"), Some(text(as_of).as_str()));
}

#[tokio::test]
async fn exports_stream_ordered_records_with_a_summary_and_the_same_bytes_each_time() {
    let app = TestApp::new().await;
    let (tenant, cluster, pool) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    for i in 0..300 {
        let start = at("2026-10-01T00:00:00Z") + Duration::seconds(i * 61);
        let s = Seg {
            tenant,
            cluster,
            pool,
            machine: Uuid::now_v7(),
            class: "gpu-8",
            gpus: 8,
            start,
            end: start + Duration::seconds(3600),
        };
        insert(&app.db.pool, &s).await;
    }
    let q = "from=2026-10-01T00:00:00Z&to=2026-10-02T00:00:00Z";
    let nd = app.get(format!("/v1/usage/export?{q}&format=ndjson")).token(&billing()).send().await.expect(200);
    assert_eq!(nd.header("content-type"), Some("application/x-ndjson"));
    let lines: Vec<Value> = nd
        .body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("json line"))
        .collect();
    assert_eq!(lines.len(), 301);
    let summary = lines.last().expect("summary");
    assert_eq!(summary["type"], "summary");
    assert_eq!(summary["row_count"], 300);
    assert_eq!(summary["node_seconds"], 300 * 3600);
    let starts: Vec<&str> = lines[..300].iter().map(|l| l["start"].as_str().expect("start")).collect();
    assert!(starts.windows(2).all(|w| w[0] <= w[1]), "ordered by start");
    let csv = app.get(format!("/v1/usage/export?{q}&format=csv")).token(&billing()).send().await.expect(200);
    assert_eq!(csv.header("content-type"), Some("text/csv; charset=utf-8"));
    let text = String::from_utf8(csv.body.to_vec()).expect("utf-8");
    assert!(text.starts_with("id,kind,tenant_id,cluster_id,node_pool_id,machine_id,machine_class,gpu_count,start,end,"));
    assert_eq!(text.lines().count(), 301);
}

fn signed_app_key() -> (String, SigningKey) {
    let pem = SigningKey::generate_pem();
    let key = SigningKey::from_pem(&pem).expect("key");
    (pem, key)
}

#[tokio::test]
async fn a_closed_period_is_signed_and_never_changes_after_new_data_and_corrections() {
    let (pem, _) = signed_app_key();
    let app = TestApp::with_services(|s| s.with_signing_key(SigningKey::from_pem(&pem).expect("key"))).await;
    let tenant = id(&common::tenant(&app, "acme").await);
    let t: Uuid = tenant.parse().expect("uuid");
    for (start, end) in
        [("2026-09-30T23:00:00Z", "2026-10-01T01:00:00Z"), ("2026-10-15T00:00:00Z", "2026-11-03T00:00:00Z")]
    {
        let s = Seg {
            tenant: t,
            cluster: Uuid::now_v7(),
            pool: Uuid::now_v7(),
            machine: Uuid::now_v7(),
            class: "gpu-8",
            gpus: 8,
            start: at(start),
            end: at(end),
        };
        insert(&app.db.pool, &s).await;
    }
    // No Idempotency-Key: refused; a month not yet over (+ grace): 409.
    app.post("/v1/usage/periods/2026-10/close").token(&admin()).send().await.problem(400, "idempotency_key_required");
    let this_month = Utc::now().format("%Y-%m").to_string();
    app.post(format!("/v1/usage/periods/{this_month}/close"))
        .token(&admin())
        .header("idempotency-key", "k0")
        .send()
        .await
        .problem(409, "period_not_closable");
    let body = common::close_period(&app, "2026-10", "k1").await;
    let manifest = &body["manifest"];
    assert_eq!(manifest["row_count"], 2);
    assert_eq!(manifest["totals"]["node_seconds"], 3600 + 17 * 86400);
    // The signature verifies with the published key, and fails after any change.
    let keys = get(&app, "/v1/usage/signing-key").await;
    let public = base64::engine::general_purpose::STANDARD
        .decode(keys["keys"][0]["public_key"].as_str().expect("key"))
        .expect("b64");
    let signature = body["signature"].as_str().expect("sig");
    assert_eq!(keys["keys"][0]["key_id"], body["key_id"]);
    assert!(paddock_domain::signing::verify(&public, manifest, signature));
    // As a billing system checks it: the manifest as sorted, compact JSON (what RFC 8785 is for
    // integers and strings), the published PEM, openssl.
    let dir = std::env::temp_dir().join(format!("paddock-usage-sig-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("key.pem"), keys["keys"][0]["public_key_pem"].as_str().expect("pem")).expect("write");
    std::fs::write(dir.join("manifest.json"), serde_json::to_string(manifest).expect("json")).expect("write");
    let raw = base64::engine::general_purpose::STANDARD.decode(signature).expect("b64");
    std::fs::write(dir.join("manifest.sig"), raw).expect("write");
    let verified = std::process::Command::new("openssl")
        .args(["pkeyutl", "-verify", "-pubin", "-inkey", "key.pem", "-rawin", "-in", "manifest.json", "-sigfile"])
        .arg("manifest.sig")
        .current_dir(&dir)
        .output()
        .expect("openssl runs (the test suite installs it)");
    assert!(verified.status.success(), "openssl: {}", String::from_utf8_lossy(&verified.stderr));
    let _ = std::fs::remove_dir_all(&dir);
    let mut tampered = manifest.clone();
    tampered["row_count"] = json!(3);
    assert!(!paddock_domain::signing::verify(&public, &tampered, signature));
    // The manifest's hash is the NDJSON export's at the closing watermark.
    let q = format!(
        "from=2026-10-01T00:00:00Z&to=2026-11-01T00:00:00Z&as_of={}",
        manifest["as_of"].as_str().expect("as_of")
    );
    let export = app.get(format!("/v1/usage/export?{q}&format=ndjson")).token(&billing()).send().await.expect(200);
    assert_eq!(hex::encode(Sha256::digest(&export.body)), manifest["export"]["sha256"].as_str().expect("sha"));
    // New data and a correction land in the open period; the closed one stays byte-identical.
    let adj = json!({ "tenant_id": tenant, "machine_class": "gpu-8", "node_seconds": -3600, "gpu_seconds": -28800,
        "control_plane_seconds": 0, "corrects_period": "2026-10", "reason": "credit for an outage" });
    app.post("/v1/usage/adjustments").token(&admin()).json(&adj).send().await.expect(201);
    app.post("/v1/usage/adjustments").token(&billing()).json(&adj).send().await.problem(403, "forbidden");
    assert_eq!(app.count("audit_events where action = 'usage.adjustment.create' and outcome = 'success'").await, 1);
    let again = app
        .post("/v1/usage/periods/2026-10/close")
        .token(&admin())
        .header("idempotency-key", "k2")
        .send()
        .await
        .expect(200);
    assert_eq!(again.json(), body);
    let view = get(&app, "/v1/usage/periods/2026-10").await;
    assert_eq!(view["state"], "closed");
    assert_eq!(view["closed"], body);
    let export2 = app.get(format!("/v1/usage/export?{q}&format=ndjson")).token(&billing()).send().await.expect(200);
    assert_eq!(export.body, export2.body);
    // The stored manifest cannot be rewritten.
    assert!(sqlx::query("update usage_periods set manifest = '{}'").execute(&app.db.pool).await.is_err());
}

#[tokio::test]
async fn closing_without_a_signing_key_is_409_naming_the_setting() {
    let app = TestApp::without_signing_key().await;
    let resp = app.post("/v1/usage/periods/2026-10/close").token(&admin()).header("idempotency-key", "k").send().await;
    let problem = resp.problem(409, "signing_key_missing");
    assert!(problem["detail"].as_str().expect("detail").contains("PADDOCK_USAGE_SIGNING_KEY"));
    app.get("/v1/usage/signing-key").token(&billing()).send().await.problem(409, "signing_key_missing");
}

#[tokio::test]
async fn bad_usage_parameters_are_documented_problems_never_a_500() {
    let app = TestApp::new().await;
    let own = id(&common::tenant(&app, "acme").await);
    let foreign = id(&common::tenant(&app, "globex").await);
    let ok = "from=2026-10-01T00:00:00Z&to=2026-10-02T00:00:00Z";
    let cases: Vec<(String, u16)> = vec![
        ("/v1/usage/records".into(), 422),
        ("/v1/usage/records?from=2026-10-01T00:00:00Z".into(), 422),
        ("/v1/usage/records?from=2026-10-02T00:00:00Z&to=2026-10-01T00:00:00Z".into(), 422),
        ("/v1/usage/records?from=2026-10-01T00:00:00Z&to=2026-10-01T00:00:00Z".into(), 422),
        ("/v1/usage/records?from=2026-10-01T00:00:00.5Z&to=2026-10-02T00:00:00Z".into(), 422),
        ("/v1/usage/records?from=2026-10-01T02:00:00%2B02:00&to=2026-10-02T00:00:00Z".into(), 422),
        ("/v1/usage/records?from=yesterday&to=2026-10-02T00:00:00Z".into(), 422),
        ("/v1/usage/records?from=2026-09-01T00:00:00Z&to=2026-10-03T00:00:00Z".into(), 422),
        ("/v1/usage/export?from=2026-09-01T00:00:00Z&to=2026-10-03T00:00:00Z".into(), 422),
        ("/v1/usage/aggregate?from=2025-01-01T00:00:00Z&to=2026-10-03T00:00:00Z".into(), 422),
        (format!("/v1/usage/records?{ok}&limit=1001"), 422),
        (format!("/v1/usage/records?{ok}&limit=0"), 422),
        (format!("/v1/usage/records?{ok}&limit=ten"), 400),
        (format!("/v1/usage/records?{ok}&cursor=garbage"), 400),
        (format!("/v1/usage/records?{ok}&kind=gpu"), 422),
        (format!("/v1/usage/records?{ok}&as_of=2999-01-01T00:00:00Z"), 422),
        (format!("/v1/usage/records?{ok}&as_of=soon"), 422),
        (format!("/v1/usage/records?{ok}&tenant_id=not-a-uuid"), 400),
        (format!("/v1/usage/aggregate?{ok}&window=PT2H"), 422),
        (format!("/v1/usage/aggregate?{ok}&group_by=tenant_id,colour"), 422),
        (format!("/v1/usage/export?{ok}&format=xml"), 422),
        ("/v1/usage/periods/2026-13".into(), 422),
        ("/v1/usage/periods/october".into(), 422),
        (format!("/v1/tenants/{foreign}/usage/records?{ok}"), 404),
        (format!("/v1/tenants/{}/usage/records?{ok}", Uuid::now_v7()), 404),
        (format!("/v1/usage/records?{ok}&tenant_id={foreign}"), 404),
    ];
    let member = token(&["tenant:member"], Some(own.parse().expect("uuid")));
    for (path, status) in cases {
        let tok = if path.contains("tenant") { member.clone() } else { billing() };
        let resp = app.get(&path).token(&tok).send().await;
        assert_eq!(resp.status.as_u16(), status, "{path}: {}", String::from_utf8_lossy(&resp.body));
        assert_eq!(resp.header("content-type"), Some("application/problem+json"), "{path}");
    }
    // The member reads its own tenant's usage.
    app.get(format!("/v1/tenants/{own}/usage/records?{ok}")).token(&member).send().await.expect(200);
    app.get(format!("/v1/usage/aggregate?{ok}")).token(&member).send().await.expect(200);
    // Bad adjustment bodies.
    for body in [
        json!({}),
        json!({ "tenant_id": own, "machine_class": "Bad Class", "node_seconds": 1, "gpu_seconds": 0, "control_plane_seconds": 0, "reason": "x" }),
        json!({ "tenant_id": own, "machine_class": "gpu", "node_seconds": 1, "gpu_seconds": 0, "control_plane_seconds": 0, "reason": "" }),
        json!({ "tenant_id": own, "machine_class": "gpu", "node_seconds": 1, "gpu_seconds": 0, "control_plane_seconds": 0, "reason": "x", "corrects_period": "2026-1" }),
        json!({ "tenant_id": own, "machine_class": "gpu", "node_seconds": 1, "gpu_seconds": 0, "control_plane_seconds": 0, "reason": "x", "extra": 1 }),
    ] {
        let resp = app.post("/v1/usage/adjustments").token(&admin()).json(&body).send().await;
        assert_eq!(resp.status.as_u16(), 422, "{body}: {}", String::from_utf8_lossy(&resp.body));
    }
    assert_eq!(app.count("usage_adjustments").await, 0, "nothing half-written");
}
