//! usage adjustments: each component is bounded (422 naming the field); sums of usage are
//! checked (409 `usage_overflow`, an export cut off: never a 500 or a wrapped number) even over
//! rows written before the bound; an adjustment's cluster is one of its tenant's, in the API and
//! in the schema.

use paddock_testkit::{admin, token, TestApp};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::common::{self, id};

const MAX: i64 = 1_000_000_000_000;

fn adjustment(tenant: &str, seconds: [i64; 3]) -> Value {
    json!({ "tenant_id": tenant, "machine_class": "gpu-8", "node_seconds": seconds[0], "gpu_seconds": seconds[1],
            "control_plane_seconds": seconds[2], "reason": "a correction" })
}

#[tokio::test]
async fn each_component_of_an_adjustment_is_bounded_and_a_wider_one_is_422_naming_it() {
    let app = TestApp::new().await;
    let tenant = id(&common::tenant(&app, "acme").await);
    for (seconds, field) in [
        ([i64::MAX, 0, 0], "node_seconds"),
        ([0, -MAX - 1, 0], "gpu_seconds"),
        ([0, 0, i64::MIN], "control_plane_seconds"),
        ([MAX + 1, 0, 0], "node_seconds"),
    ] {
        let problem = app
            .post("/v1/usage/adjustments")
            .token(&admin())
            .json(&adjustment(&tenant, seconds))
            .send()
            .await
            .problem(422, "validation_failed");
        let fields: Vec<&str> =
            problem["errors"].as_array().expect("errors").iter().filter_map(|e| e["field"].as_str()).collect();
        assert_eq!(fields, [field], "{seconds:?}: {problem}");
    }
    assert_eq!(app.count("usage_adjustments").await, 0);
    for seconds in [[MAX, MAX, MAX], [-MAX, -MAX, -MAX]] {
        app.post("/v1/usage/adjustments").token(&admin()).json(&adjustment(&tenant, seconds)).send().await.expect(201);
    }
    // The schema holds the bound too.
    let wide = sqlx::query(
        "insert into usage_adjustments (id, tenant_id, machine_class, node_seconds, gpu_seconds, \
           control_plane_seconds, reason, actor, recorded_at) \
         values ($1, $2::uuid, 'gpu-8', $3, 0, 0, 'x', 'x', date_trunc('second', now()))",
    )
    .bind(Uuid::now_v7())
    .bind(&tenant)
    .bind(MAX + 1)
    .execute(&app.db.pool)
    .await;
    assert!(wide.is_err(), "the check constraint refuses it");
}

/// Two adjustments of 2^63 - 1 seconds this month, as rows written before the bound: the bound's
/// constraint is dropped first, which only the schema's owner can do.
async fn legacy_overflow(app: &TestApp, tenant: &str) {
    sqlx::query("alter table usage_adjustments drop constraint if exists usage_adjustments_seconds_bounded")
        .execute(&app.db.pool)
        .await
        .expect("dropping the bound");
    for _ in 0..2 {
        sqlx::query(
            "insert into usage_adjustments (id, tenant_id, machine_class, node_seconds, gpu_seconds, \
               control_plane_seconds, reason, actor, recorded_at) \
             values ($1, $2::uuid, 'gpu-8', $3, 0, 0, 'legacy', 'x', date_trunc('second', now()) - interval '5 seconds')",
        )
        .bind(Uuid::now_v7())
        .bind(tenant)
        .bind(i64::MAX)
        .execute(&app.db.pool)
        .await
        .expect("a legacy adjustment");
    }
}

#[tokio::test]
async fn sums_past_64_bits_are_409_or_a_cut_off_export_never_a_500_or_a_wrapped_number() {
    let app = TestApp::served().await;
    let tenant = id(&common::tenant(&app, "acme").await);
    legacy_overflow(&app, &tenant).await;
    let now = chrono::Utc::now();
    let from = (now - chrono::Duration::days(1)).format("%Y-%m-%dT%H:%M:%SZ");
    let to = (now + chrono::Duration::days(1)).format("%Y-%m-%dT%H:%M:%SZ");
    let range = format!("from={from}&to={to}");
    let reader = token(&["billing:reader"], None);
    for window in ["none", "P1D", "P1M"] {
        let path = format!("/v1/usage/aggregate?{range}&window={window}&group_by=tenant_id");
        app.get(path).token(&reader).send().await.problem(409, "usage_overflow");
    }
    let member = token(&["tenant:member"], Some(tenant.parse().expect("uuid")));
    app.get(format!("/v1/tenants/{tenant}/usage/aggregate?{range}"))
        .token(&member)
        .send()
        .await
        .problem(409, "usage_overflow");
    // The records themselves read fine; the NDJSON export's summary cannot be written, so the
    // export is cut off rather than ending with a wrapped (negative) sum.
    let records = app.get(format!("/v1/usage/records?{range}")).token(&reader).send().await.expect(200).json();
    assert_eq!(records["items"].as_array().map(Vec::len), Some(2));
    let base = app.base_url.clone().expect("served");
    let export = reqwest::Client::new()
        .get(format!("{base}/v1/usage/export?{range}&format=ndjson"))
        .bearer_auth(&reader)
        .send()
        .await
        .expect("the export starts");
    assert_eq!(export.status().as_u16(), 200);
    match export.bytes().await {
        Err(_) => {}
        Ok(body) => panic!("the export completed: {}", String::from_utf8_lossy(&body)),
    }
}

#[tokio::test]
async fn an_adjustment_names_a_cluster_of_its_own_tenant_only() {
    let app = TestApp::new().await;
    let acme = id(&common::tenant(&app, "acme").await);
    let globex = id(&common::tenant(&app, "globex").await);
    let cluster = |tenant: &str| {
        let tenant = tenant.to_owned();
        let pool = app.db.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "insert into clusters (id, tenant_id, name, kind, isolation, kubernetes_version, stack_version) \
                 values (gen_random_uuid(), $1::uuid, 'c-' || substr(md5(random()::text), 1, 8), 'kubernetes', \
                 'private-nodes', 'v1.34.1', '2026.12.0') returning id::text",
            )
            .bind(tenant)
            .fetch_one(&pool)
            .await
            .expect("a cluster")
        }
    };
    let (own, foreign) = (cluster(&acme).await, cluster(&globex).await);
    let mut body = adjustment(&acme, [-3600, 0, 0]);
    body["cluster_id"] = json!(foreign);
    let problem =
        app.post("/v1/usage/adjustments").token(&admin()).json(&body).send().await.problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["field"], "cluster_id", "{problem}");
    body["cluster_id"] = json!(Uuid::now_v7());
    app.post("/v1/usage/adjustments").token(&admin()).json(&body).send().await.problem(422, "validation_failed");
    assert_eq!(app.count("usage_adjustments").await, 0);
    body["cluster_id"] = json!(own);
    let made = app.post("/v1/usage/adjustments").token(&admin()).json(&body).send().await.expect(201).json();
    assert_eq!(made["cluster_id"], json!(own));
    // The schema ties them as well: a row naming another tenant's cluster is refused.
    let stray = sqlx::query(
        "insert into usage_adjustments (id, tenant_id, cluster_id, machine_class, node_seconds, gpu_seconds, \
           control_plane_seconds, reason, actor, recorded_at) \
         values ($1, $2::uuid, $3::uuid, 'gpu-8', 1, 0, 0, 'x', 'x', date_trunc('second', now()))",
    )
    .bind(Uuid::now_v7())
    .bind(&acme)
    .bind(&foreign)
    .execute(&app.db.pool)
    .await
    .expect_err("the foreign key refuses it");
    let code = stray.as_database_error().and_then(|e| e.code()).map(|c| c.into_owned());
    assert_eq!(code.as_deref(), Some("23503"), "{stray}");
}
