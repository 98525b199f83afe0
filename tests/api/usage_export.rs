//! usage exports over a real socket: an export the client does not read holds no database
//! connection (its records are read in keyset pages), so unread exports of many callers, more
//! than the pool, leave every other request and `/readyz` answering; each caller runs a bounded
//! number of exports (429 beyond); an export the client stops reading, or one past its maximum
//! duration, is cut off and frees its caller's slot; the keyset pages together are the bytes of
//! one read (the signed manifest's hash).

use std::time::Duration;

use paddock_service::usage::UsageSettings;
use paddock_testkit::{eventually, token, token_with, TestApp};
use serde_json::Value;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::common::{self, id};

/// `count` closed machine segments of `tenant` from 2026-10-01 (several MB of export), seven
/// starting at each minute, so that pages (4,000 records) meet ties of `start`.
async fn many_segments(app: &TestApp, tenant: Uuid, count: i64) {
    sqlx::query(
        "insert into usage_segments (id, kind, tenant_id, cluster_id, node_pool_id, machine_id, allocation_id, \
           machine_class, gpu_count, start_at, end_at, close_reason) \
         select gen_random_uuid(), 'machine', $1, $2, $3, gen_random_uuid(), gen_random_uuid(), 'gpu-8', 8, \
           timestamptz '2026-10-01T00:00:00Z' + make_interval(mins => (i / 7)::int), \
           timestamptz '2026-10-01T01:00:00Z' + make_interval(mins => (i / 7)::int), 'fixture' \
         from generate_series(0, $4 - 1) i",
    )
    .bind(tenant)
    .bind(Uuid::now_v7())
    .bind(Uuid::now_v7())
    .bind(count)
    .execute(&app.db.pool)
    .await
    .expect("inserting segments");
}

const RANGE: &str = "from=2026-10-01T00:00:00Z&to=2026-10-31T00:00:00Z";

fn reader(name: &str) -> String {
    token_with(|c| {
        c.sub = name.to_owned();
        c.roles = vec!["billing:reader".to_owned()];
    })
}

fn base(app: &TestApp) -> String {
    app.base_url.clone().expect("a served app")
}

/// Starts an export and returns its answer once the headers are in, without reading the body.
async fn open_export(client: &reqwest::Client, app: &TestApp, token: &str) -> reqwest::Response {
    client
        .get(format!("{}/v1/usage/export?{RANGE}&format=ndjson", base(app)))
        .bearer_auth(token)
        .send()
        .await
        .expect("the export answers")
}

async fn status(client: &reqwest::Client, url: String, token: Option<&str>) -> u16 {
    let mut req = client.get(url);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    req.send().await.expect("an answer").status().as_u16()
}

#[tokio::test]
async fn unread_exports_of_many_callers_beyond_the_pool_leave_other_requests_and_readyz_answering() {
    let app = TestApp::served().await;
    let busy = id(&common::tenant(&app, "busy").await);
    let other = id(&common::tenant(&app, "other").await);
    many_segments(&app, busy.parse().expect("uuid"), 30_000).await;
    let client = reqwest::Client::new();
    // Six callers, three exports each (under the default of four per caller): 18 exports, more
    // than the 16 connections of the test's pool. None is read.
    let tokens: Vec<String> = (0..6).map(|i| reader(&format!("reader-{i}"))).collect();
    let opened = futures::future::join_all(
        tokens.iter().flat_map(|t| std::iter::repeat_n(t, 3)).map(|t| open_export(&client, &app, t)),
    )
    .await;
    let statuses: Vec<u16> = opened.iter().map(|r| r.status().as_u16()).collect();
    assert!(statuses.iter().all(|s| *s == 200), "every export starts: {statuses:?}");
    // Another tenant's reads and the readiness probe answer while the exports wait for readers.
    let member = token(&["tenant:member"], Some(other.parse().expect("uuid")));
    for _ in 0..5 {
        let records = format!("{}/v1/tenants/{other}/usage/records?{RANGE}", base(&app));
        assert_eq!(status(&client, records, Some(&member)).await, 200);
        let aggregate = format!("{}/v1/tenants/{other}/usage/aggregate?{RANGE}", base(&app));
        assert_eq!(status(&client, aggregate, Some(&member)).await, 200);
        assert_eq!(status(&client, format!("{}/readyz", base(&app)), None).await, 200);
    }
    drop(opened);
}

#[tokio::test]
async fn a_caller_runs_at_most_its_exports_at_once_and_gets_429_beyond() {
    let app = TestApp::served().await;
    let busy = id(&common::tenant(&app, "busy").await);
    many_segments(&app, busy.parse().expect("uuid"), 30_000).await;
    let client = reqwest::Client::new();
    let (alice, bob) = (reader("alice"), reader("bob"));
    let mut held = Vec::new();
    for _ in 0..4 {
        let resp = open_export(&client, &app, &alice).await;
        assert_eq!(resp.status().as_u16(), 200);
        held.push(resp);
    }
    let refused = open_export(&client, &app, &alice).await;
    assert_eq!(refused.status().as_u16(), 429);
    assert!(refused.headers().get("retry-after").is_some(), "429 says when to retry");
    let problem: Value = refused.json().await.expect("problem");
    assert_eq!(problem["code"], "too_many_exports");
    // The cap is the caller's: another caller exports meanwhile.
    assert_eq!(open_export(&client, &app, &bob).await.status().as_u16(), 200);
    // A client that goes away frees its slot.
    held.pop();
    eventually(Duration::from_secs(30), || async {
        let resp = open_export(&client, &app, &alice).await;
        (resp.status().as_u16() == 200).then_some(())
    })
    .await;
}

/// An unread export is cut off at `settings`' bound: the caller's one slot frees, and the body,
/// read then, ends in an error rather than as a whole export.
async fn cut_off_when(settings: UsageSettings) {
    let app = TestApp::served_with_services(move |s| s.with_usage_settings(settings)).await;
    let busy = id(&common::tenant(&app, "busy").await);
    many_segments(&app, busy.parse().expect("uuid"), 30_000).await;
    let client = reqwest::Client::new();
    let alice = reader("alice");
    let first = open_export(&client, &app, &alice).await;
    assert_eq!(first.status().as_u16(), 200);
    assert_eq!(open_export(&client, &app, &alice).await.status().as_u16(), 429, "one export at a time");
    eventually(Duration::from_secs(60), || async {
        let resp = open_export(&client, &app, &alice).await;
        (resp.status().as_u16() == 200).then_some(())
    })
    .await;
    assert!(first.bytes().await.is_err(), "a cut-off export never reads as complete");
}

#[tokio::test]
async fn an_export_the_client_stops_reading_is_cut_off_after_the_idle_timeout() {
    cut_off_when(UsageSettings {
        export_max_per_caller: 1,
        export_idle_timeout: Duration::from_secs(1),
        ..UsageSettings::default()
    })
    .await;
}

#[tokio::test]
async fn an_export_is_cut_off_at_its_maximum_duration() {
    cut_off_when(UsageSettings {
        export_max_per_caller: 1,
        export_max_duration: Duration::from_secs(1),
        ..UsageSettings::default()
    })
    .await;
}

#[tokio::test]
async fn an_export_read_in_keyset_pages_is_the_bytes_the_signed_manifest_hashes() {
    let app = TestApp::new().await;
    let busy = id(&common::tenant(&app, "busy").await);
    // Several pages, with ties of `start` across the page boundaries.
    many_segments(&app, busy.parse().expect("uuid"), 8_505).await;
    let lines = october_export_is_its_manifest(&app, 8_505).await;
    assert_eq!(lines.len(), 8_506, "every record once, and the summary");
}

/// Closes 2026-10 with `rows` records and reads its NDJSON export at the manifest's `as_of`:
/// the bytes must be those the signed manifest hashes (one query's rows, in their order).
/// Returns the export's lines.
async fn october_export_is_its_manifest(app: &TestApp, rows: u64) -> Vec<Value> {
    let closed = common::close_period(app, "2026-10", "k1").await;
    let manifest = &closed["manifest"];
    assert_eq!(manifest["row_count"], rows);
    let q = format!(
        "from=2026-10-01T00:00:00Z&to=2026-11-01T00:00:00Z&as_of={}&format=ndjson",
        manifest["as_of"].as_str().expect("as_of")
    );
    let export = app.get(format!("/v1/usage/export?{q}")).token(&reader("alice")).send().await.expect(200);
    assert_eq!(hex::encode(Sha256::digest(&export.body)), manifest["export"]["sha256"].as_str().expect("sha"));
    export
        .body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("json"))
        .collect()
}

#[tokio::test]
async fn records_begun_before_the_range_fill_pages_of_their_own_before_the_later_ones() {
    let app = TestApp::new().await;
    let busy: Uuid = id(&common::tenant(&app, "busy").await).parse().expect("uuid");
    // 4,500 segments begun before October and running into it: all clipped to its first second,
    // more than a page (4,000) of records ordered by id alone; then 1,200 begun in it.
    sqlx::query(
        "insert into usage_segments (id, kind, tenant_id, cluster_id, node_pool_id, machine_id, allocation_id, \
           machine_class, gpu_count, start_at, end_at, close_reason) \
         select gen_random_uuid(), 'machine', $1, $2, $3, gen_random_uuid(), gen_random_uuid(), 'gpu-8', 8, \
           timestamptz '2026-09-30T20:00:00Z' + make_interval(secs => i), \
           timestamptz '2026-10-01T02:00:00Z' + make_interval(secs => i), 'fixture' \
         from generate_series(0, 4499) i",
    )
    .bind(busy)
    .bind(Uuid::now_v7())
    .bind(Uuid::now_v7())
    .execute(&app.db.pool)
    .await
    .expect("inserting segments");
    many_segments(&app, busy, 1_200).await;
    let lines = october_export_is_its_manifest(&app, 5_700).await;
    let records: Vec<&Value> = lines.iter().filter(|v| v["type"] == "record").collect();
    assert_eq!(records.len(), 5_700, "every record once");
    let clipped = records.iter().take_while(|r| r["start"] == "2026-10-01T00:00:00Z").count();
    assert!(clipped >= 4_500, "the records clipped to the range's start come first: {clipped}");
}
