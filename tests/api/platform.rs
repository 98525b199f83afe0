//! Process endpoints and cross-cutting behaviour: health, readiness, metrics, request ids, CORS.

use paddock_api::ApiConfig;
use paddock_testkit::{admin, TestApp};

#[tokio::test]
async fn healthz_and_readyz_answer_when_the_database_is_migrated() {
    let app = TestApp::new().await;
    app.get("/healthz").send().await.expect(200);
    app.get("/readyz").send().await.expect(200);
}

#[tokio::test]
async fn readyz_is_503_with_retry_after_when_the_database_is_not_migrated() {
    let app = TestApp::new().await;
    sqlx::query("drop table _sqlx_migrations").execute(&app.db.pool).await.expect("drop");
    let resp = app.get("/readyz").send().await;
    assert_eq!(resp.header("retry-after"), Some("5"));
    resp.problem(503, "unavailable");
}

#[tokio::test]
async fn a_database_outage_is_503_with_retry_after_and_no_internals() {
    let app = TestApp::new().await;
    app.db.pool.close().await;
    let resp = app.get("/v1/tenants").token(&admin()).send().await;
    assert_eq!(resp.header("retry-after"), Some("5"));
    let problem = resp.problem(503, "unavailable");
    let detail = problem["detail"].as_str().expect("detail");
    assert!(!detail.contains("pool") && !detail.contains("sqlx"), "detail leaks internals: {detail}");
}

#[tokio::test]
async fn request_ids_are_echoed_or_generated() {
    let app = TestApp::new().await;
    let resp = app.get("/healthz").header("x-request-id", "trace-abc-123").send().await;
    assert_eq!(resp.header("x-request-id"), Some("trace-abc-123"));
    let resp = app.get("/healthz").send().await;
    assert!(resp.header("x-request-id").is_some_and(|id| id.len() >= 16));
    // An unreasonable id is replaced rather than echoed into logs and headers.
    let long = "x".repeat(500);
    let resp = app.get("/healthz").header("x-request-id", &long).send().await;
    assert_ne!(resp.header("x-request-id"), Some(long.as_str()));
}

#[tokio::test]
async fn metrics_count_requests_by_route_template_and_report_gauges() {
    // Gauges read anew on every scrape (the default cache would show the second scrape the
    // first's reading): this test checks what they count, `metrics.rs` how often they are read.
    let app = TestApp::with_services(|s| s.with_gauge_max_age(std::time::Duration::ZERO)).await;
    let tenant = crate::common::tenant(&app, "metrics").await;
    app.get(format!("/v1/tenants/{}", crate::common::id(&tenant))).token(&admin()).send().await.expect(200);
    let resp = app.get("/metrics").send().await.expect(200);
    let text = String::from_utf8(resp.body.to_vec()).expect("utf8");
    assert!(
        text.contains(r#"paddock_http_requests_total{method="GET",route="/v1/tenants/{tenant_id}",status="200"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"paddock_http_requests_total{method="POST",route="/v1/tenants",status="201"} 1"#),
        "{text}"
    );
    assert!(!text.contains(&crate::common::id(&tenant)), "raw ids must not become labels");
    assert!(text.contains("paddock_http_request_duration_seconds_bucket"));
    assert!(text.contains(r#"paddock_clusters{phase="ready",kind="slurm"} 0"#), "{text}");
    assert!(text.contains("paddock_clusters_waiting_for_machines 0\n"), "{text}");
    assert!(text.contains("paddock_allocation_oldest_wait_seconds 0\n"), "{text}");
    assert!(text.contains(r#"paddock_build_info{version=""#), "{text}");
    assert!(!text.contains("paddock_queue_depth{"), "no jobs yet: {text}");
    crate::common::machine_class(&app, "gpu", 8).await;
    crate::common::machine(&app, "node-1", "gpu").await;
    let text = String::from_utf8(app.get("/metrics").send().await.expect(200).body.to_vec()).expect("utf8");
    assert!(text.contains(r#"paddock_queue_depth{kind="machine_reconcile",state="queued"} 1"#), "{text}");
    assert!(text.contains(r#"paddock_machines{state="enrolling",machine_class="gpu"} 1"#), "{text}");
    assert!(text.contains(r#"paddock_machines{state="available",machine_class="gpu"} 0"#), "{text}");
    assert!(text.contains("paddock_database_up 1"));
}

#[tokio::test]
async fn cors_allows_the_portal_origin_and_exposes_the_contract_headers() {
    let app =
        TestApp::with_config(ApiConfig { cors_origins: vec!["https://portal.example".into()], ..ApiConfig::default() })
            .await;
    let resp = app
        .req(http::Method::OPTIONS, "/v1/tenants")
        .header("origin", "https://portal.example")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "authorization,content-type,idempotency-key,if-match")
        .send()
        .await;
    assert!(resp.status.is_success(), "preflight: {}", resp.status);
    assert_eq!(resp.header("access-control-allow-origin"), Some("https://portal.example"));
    let allowed = resp.header("access-control-allow-headers").unwrap_or_default().to_ascii_lowercase();
    for h in ["authorization", "if-match", "idempotency-key"] {
        assert!(allowed.contains(h), "{h} not allowed: {allowed}");
    }
    let resp =
        app.get("/v1/tenants").token(&admin()).header("origin", "https://portal.example").send().await.expect(200);
    let exposed = resp.header("access-control-expose-headers").unwrap_or_default().to_ascii_lowercase();
    for h in ["etag", "link", "location", "retry-after", "x-request-id"] {
        assert!(exposed.contains(h), "{h} not exposed: {exposed}");
    }
    let resp = app.get("/v1/tenants").token(&admin()).header("origin", "https://evil.example").send().await.expect(200);
    assert_eq!(resp.header("access-control-allow-origin"), None);
}

#[tokio::test]
async fn several_processes_may_migrate_one_database_at_once() {
    let db = paddock_testkit::TestDb::empty().await;
    let runs = (0..4).map(|_| {
        let url = db.url.clone();
        tokio::spawn(async move {
            // Each "process" has its own pool, as separate `paddock serve` processes would.
            let store = paddock_store::Store::connect_lazy(&url, 2).expect("store");
            store.migrate().await
        })
    });
    for run in futures::future::join_all(runs).await {
        run.expect("task").expect("every concurrent migration succeeds");
    }
    let store = paddock_store::Store::from_pool(db.pool.clone());
    assert!(store.ready().await.expect("ready check"), "migrated and ready");
}

#[tokio::test]
async fn readyz_is_false_before_migrations() {
    let db = paddock_testkit::TestDb::empty().await;
    let store = paddock_store::Store::from_pool(db.pool.clone());
    assert!(!store.ready().await.expect("ready check"));
}
