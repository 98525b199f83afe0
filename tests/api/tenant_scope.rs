//! tenant_scope: what a tenant token reads and writes is its own tenant's, checked against a world
//! where both tenants have data. Usage of two tenants (machine, control-plane and adjustment rows)
//! read by each tenant role through every usage route and export format holds only the caller's
//! rows, with the caller's totals; a tenant admin's writes on another tenant's clusters and pools,
//! under either tenant's path, are 404 like missing objects and change nothing.

use std::collections::BTreeSet;

use paddock_service::usage::UsageSettings;
use paddock_testkit::{admin, token, Resp, TestApp};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::common::{self, id};

const CLASS: &str = "gpu-h100";
/// The range every usage read below asks for (within the 31 days records and exports allow).
const RANGE: &str = "from=2026-10-01T00:00:00Z&to=2026-10-31T00:00:00Z";

/// A tenant's seeded usage: its id and the seconds the provider's reads give it.
struct Seeded {
    tenant: Uuid,
    rows: usize,
    node_seconds: i64,
    control_plane_seconds: i64,
}

/// Writes `machines` closed machine segments of one hour each, one control-plane segment of a day
/// and one adjustment of 60 node seconds for `tenant`, all in October 2026 (history as the
/// lifecycle and `POST /v1/usage/adjustments` write it).
async fn seed(app: &TestApp, tenant: Uuid, machines: i64) -> Seeded {
    let (cluster, pool) = (Uuid::now_v7(), Uuid::now_v7());
    for i in 0..machines {
        sqlx::query(
            "insert into usage_segments (id, kind, tenant_id, cluster_id, node_pool_id, machine_id, allocation_id, \
               machine_class, gpu_count, start_at, end_at, close_reason) \
             values ($1, 'machine', $2, $3, $4, $5, $6, $7, 8, \
               '2026-10-05T00:00:00Z'::timestamptz + make_interval(hours => $8::int), \
               '2026-10-05T01:00:00Z'::timestamptz + make_interval(hours => $8::int), 'fixture')",
        )
        .bind(Uuid::now_v7())
        .bind(tenant)
        .bind(cluster)
        .bind(pool)
        .bind(Uuid::now_v7())
        .bind(Uuid::now_v7())
        .bind(CLASS)
        .bind(i32::try_from(i).expect("small"))
        .execute(&app.db.pool)
        .await
        .expect("a machine segment");
    }
    sqlx::query(
        "insert into usage_segments (id, kind, tenant_id, cluster_id, start_at, end_at, close_reason) \
         values ($1, 'control_plane', $2, $3, '2026-10-06T00:00:00Z', '2026-10-07T00:00:00Z', 'fixture')",
    )
    .bind(Uuid::now_v7())
    .bind(tenant)
    .bind(cluster)
    .execute(&app.db.pool)
    .await
    .expect("a control-plane segment");
    sqlx::query(
        "insert into usage_adjustments (id, tenant_id, machine_class, node_seconds, gpu_seconds, \
           control_plane_seconds, reason, actor, recorded_at) \
         values ($1, $2, $3, 60, 480, 0, 'fixture correction', 'fixture', '2026-10-08T00:00:00Z')",
    )
    .bind(Uuid::now_v7())
    .bind(tenant)
    .bind(CLASS)
    .execute(&app.db.pool)
    .await
    .expect("an adjustment");
    Seeded {
        tenant,
        rows: usize::try_from(machines).expect("small") + 2,
        node_seconds: machines * 3600 + 60,
        control_plane_seconds: 86_400,
    }
}

/// An app whose FOCUS export can run (a provider name), two tenants with usage, one priced class.
async fn usage_world() -> (TestApp, Seeded, Seeded) {
    let settings = UsageSettings { billing_provider_name: Some("Example Cloud".into()), ..UsageSettings::default() };
    let app = TestApp::with_services(move |s| s.with_usage_settings(settings)).await;
    common::machine_class(&app, CLASS, 8).await;
    // A price in force since before the seeded usage (the API sets prices from now on).
    sqlx::query(
        "insert into machine_class_prices (machine_class, effective_from, currency, node_hour) \
         values ($1, '2026-09-01T00:00:00Z', 'EUR', 2.5)",
    )
    .bind(CLASS)
    .execute(&app.db.pool)
    .await
    .expect("a past price");
    let own = Uuid::parse_str(&id(&common::tenant(&app, "scope-own").await)).expect("uuid");
    let foreign = Uuid::parse_str(&id(&common::tenant(&app, "scope-foreign").await)).expect("uuid");
    let own = seed(&app, own, 2).await;
    let foreign = seed(&app, foreign, 3).await;
    (app, own, foreign)
}

/// The non-empty lines of a streamed body.
fn lines(resp: &Resp) -> Vec<String> {
    String::from_utf8(resp.body.to_vec()).expect("utf-8").lines().filter(|l| !l.is_empty()).map(str::to_owned).collect()
}

/// The values of column `name` in a CSV body (no quoted commas in these columns).
fn column(resp: &Resp, name: &str) -> Vec<String> {
    let lines = lines(resp);
    let header: Vec<&str> = lines[0].split(',').collect();
    let at = header.iter().position(|c| *c == name).unwrap_or_else(|| panic!("no column {name}: {header:?}"));
    lines[1..].iter().map(|l| l.split(',').nth(at).expect("column").trim_matches('"').to_owned()).collect()
}

/// Every record of a usage walk at `path` (all pages).
async fn records(app: &TestApp, path: &str, token: &str) -> Vec<Value> {
    let mut items = Vec::new();
    let mut next = Some(format!("{path}&limit=2"));
    while let Some(url) = next {
        let page = app.get(url.as_str()).token(token).send().await.expect(200).json();
        items.extend(page["items"].as_array().expect("items").iter().cloned());
        next = page["next_cursor"].as_str().map(|c| format!("{path}&limit=2&cursor={c}"));
    }
    items
}

/// Checks every usage answer `token` gets at `base` (`/v1` or `/v1/tenants/{id}`) against `own`.
async fn check_usage(app: &TestApp, base: &str, token: &str, own: &Seeded, label: &str) {
    let tenant = own.tenant.to_string();
    let items = records(app, &format!("{base}/usage/records?{RANGE}"), token).await;
    assert_eq!(items.len(), own.rows, "{label}: records: {items:?}");
    assert!(items.iter().all(|r| r["tenant_id"] == tenant.as_str()), "{label}: records: {items:?}");

    let agg = app
        .get(format!("{base}/usage/aggregate?{RANGE}&group_by=tenant_id"))
        .token(token)
        .send()
        .await
        .expect(200)
        .json();
    let tenants: BTreeSet<&str> =
        agg["items"].as_array().expect("items").iter().map(|i| i["tenant_id"].as_str().expect("tenant")).collect();
    assert_eq!(tenants, BTreeSet::from([tenant.as_str()]), "{label}: aggregate by tenant: {agg}");
    let totals = app.get(format!("{base}/usage/aggregate?{RANGE}")).token(token).send().await.expect(200).json();
    assert_eq!(totals["totals"]["node_seconds"], own.node_seconds, "{label}: aggregate totals: {totals}");
    assert_eq!(totals["totals"]["control_plane_seconds"], own.control_plane_seconds, "{label}: totals: {totals}");

    let csv = app.get(format!("{base}/usage/export?{RANGE}&format=csv")).token(token).send().await.expect(200);
    let csv_tenants = column(&csv, "tenant_id");
    assert_eq!(csv_tenants.len(), own.rows, "{label}: csv rows");
    assert!(csv_tenants.iter().all(|t| *t == tenant), "{label}: csv: {csv_tenants:?}");

    let nd = app.get(format!("{base}/usage/export?{RANGE}&format=ndjson")).token(token).send().await.expect(200);
    let nd: Vec<Value> = lines(&nd).iter().map(|l| serde_json::from_str(l).expect("json line")).collect();
    let (summary, rows) = nd.split_last().expect("a summary");
    assert_eq!(rows.len(), own.rows, "{label}: ndjson rows");
    assert!(rows.iter().all(|r| r["tenant_id"] == tenant.as_str()), "{label}: ndjson: {rows:?}");
    assert_eq!(summary["node_seconds"], own.node_seconds, "{label}: ndjson summary: {summary}");

    let focus = app.get(format!("{base}/usage/export?{RANGE}&format=focus")).token(token).send().await.expect(200);
    let accounts = column(&focus, "BillingAccountId");
    assert!(!accounts.is_empty(), "{label}: focus has rows");
    assert!(accounts.iter().all(|a| *a == tenant), "{label}: focus: {accounts:?}");
}

#[tokio::test]
async fn a_tenants_usage_reads_hold_only_its_own_rows_in_every_route_and_format() {
    let (app, own, foreign) = usage_world().await;
    // The provider sees both tenants' rows, so the checks below are not vacuous.
    let all = records(&app, &format!("/v1/usage/records?{RANGE}"), &admin()).await;
    assert_eq!(all.len(), own.rows + foreign.rows, "provider: {all:?}");
    for seeded in [&own, &foreign] {
        let path = format!("/v1/tenants/{}", seeded.tenant);
        check_usage(&app, &path, &admin(), seeded, "provider:admin on the tenant's path").await;
    }
    for role in ["tenant:admin", "tenant:member"] {
        let token = token(&[role], Some(own.tenant));
        check_usage(&app, "/v1", &token, &own, &format!("{role} on /v1/usage")).await;
        check_usage(&app, &format!("/v1/tenants/{}", own.tenant), &token, &own, &format!("{role} on its path")).await;
        let foreign_path = format!("/v1/tenants/{}/usage/records?{RANGE}", foreign.tenant);
        app.get(foreign_path.as_str()).token(&token).send().await.problem(404, "not_found");
    }
}

/// A cluster with one pool in `tenant`; returns (cluster, pool) ids.
async fn cluster_in(app: &TestApp, tenant: &str, name: &str) -> (String, String) {
    let body = json!({ "name": name, "kind": "kubernetes", "isolation": "private-nodes",
                       "node_pools": [{ "name": "gpu", "machine_class": CLASS, "count": 1 }] });
    let resp =
        app.post(format!("/v1/tenants/{tenant}/clusters")).token(&admin()).json(&body).send().await.expect(202).json();
    (id(&resp["cluster"]), id(&resp["cluster"]["node_pools"][0]))
}

/// What must not change: the foreign cluster's and pool's views, and the count of rows a write
/// would add.
async fn snapshot(app: &TestApp, tenant: &str, cluster: &str, pool: &str) -> (Value, Value, i64) {
    let c = app.get(format!("/v1/tenants/{tenant}/clusters/{cluster}")).token(&admin()).send().await.expect(200).json();
    let p = app
        .get(format!("/v1/tenants/{tenant}/clusters/{cluster}/node-pools/{pool}"))
        .token(&admin())
        .send()
        .await
        .expect(200)
        .json();
    let writes = app.count("node_pools").await + app.count("operations").await + app.count("jobs").await;
    (c, p, writes)
}

#[tokio::test]
async fn a_tenants_writes_on_another_tenants_clusters_and_pools_are_404_and_change_nothing() {
    let app = TestApp::new().await;
    common::machine_class(&app, CLASS, 8).await;
    common::fleet(&app, CLASS, 2).await;
    let own = id(&common::tenant(&app, "scope-own").await);
    let foreign = id(&common::tenant(&app, "scope-foreign").await);
    let (own_cluster, _) = cluster_in(&app, &own, "own").await;
    let (cluster, pool) = cluster_in(&app, &foreign, "foreign").await;
    let pool_body = json!({ "name": "more", "machine_class": CLASS, "count": 1 });
    // The foreign cluster under the foreign tenant's path, and under the caller's own path.
    let mut writes = Vec::new();
    for tenant in [&foreign, &own] {
        let c = format!("/v1/tenants/{tenant}/clusters/{cluster}");
        writes.push((http::Method::DELETE, c.clone(), None));
        writes.push((http::Method::PATCH, c.clone(), Some(json!({ "kubernetes_version": "v1.36.0" }))));
        writes.push((http::Method::POST, format!("{c}/node-pools"), Some(pool_body.clone())));
        writes.push((http::Method::PATCH, format!("{c}/node-pools/{pool}"), Some(json!({ "count": 0 }))));
        writes.push((http::Method::DELETE, format!("{c}/node-pools/{pool}"), None));
    }
    // The foreign pool under the caller's own cluster.
    let mine = format!("/v1/tenants/{own}/clusters/{own_cluster}/node-pools/{pool}");
    writes.push((http::Method::PATCH, mine.clone(), Some(json!({ "count": 0 }))));
    writes.push((http::Method::DELETE, mine, None));

    let before = snapshot(&app, &foreign, &cluster, &pool).await;
    for role in ["tenant:admin", "tenant:member"] {
        let token = token(&[role], Some(Uuid::parse_str(&own).expect("uuid")));
        for (method, path, body) in &writes {
            let mut req = app.req(method.clone(), path.as_str()).token(&token);
            if let Some(body) = body {
                req = req.json(body);
            }
            let resp = req.send().await;
            // A tenant:member may never write (403 before any lookup); a tenant:admin gets 404.
            let (status, code) = if role == "tenant:member" { (403, "forbidden") } else { (404, "not_found") };
            let label = format!("{role}: {method} {path}");
            assert_eq!(resp.status.as_u16(), status, "{label}: {}", String::from_utf8_lossy(&resp.body));
            assert_eq!(resp.json()["code"], code, "{label}");
        }
    }
    assert_eq!(snapshot(&app, &foreign, &cluster, &pool).await, before, "nothing of the foreign tenant changed");
    // The same writes on the caller's own objects are allowed: the 404s above are not blanket.
    let own_token = token(&["tenant:admin"], Some(Uuid::parse_str(&own).expect("uuid")));
    app.patch(format!("/v1/tenants/{own}/clusters/{own_cluster}"))
        .token(&own_token)
        .json(&json!({ "kubernetes_version": "v1.36.0" }))
        .send()
        .await
        .expect(202);
}
