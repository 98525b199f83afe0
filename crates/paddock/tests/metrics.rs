//! `/metrics` of real `paddock` processes (docs/api.md, docs/configuration.md): every process that runs a worker
//! renders its job outcomes, and `PADDOCK_METRICS_LISTEN` gives the metrics a listener of their
//! own: the only one of a `paddock worker`, and then `/metrics` is off the API listener.

#[path = "support/process.rs"]
mod process;

use process::{free_port, start};
use std::time::{Duration, Instant};

/// GETs `url` until it answers, then returns (status, body).
async fn get(url: &str) -> (u16, String) {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("client");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match client.get(url).send().await {
            Ok(r) => return (r.status().as_u16(), r.text().await.expect("body")),
            Err(e) => assert!(Instant::now() < deadline, "{url} never answered: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Scrapes `url` until a sample line starts with `series` and has a value of at least 1.
async fn scrape_until(url: &str, series: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = get(url).await;
        assert_eq!(status, 200, "{url}: {body}");
        let counted = body
            .lines()
            .filter_map(|l| l.strip_prefix(series))
            .any(|v| v.trim().parse::<f64>().is_ok_and(|n| n >= 1.0));
        if counted {
            return body;
        }
        assert!(Instant::now() < deadline, "{url} never showed {series} >= 1:\n{body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

const POWER_SYNC_CLAIMED: &str = "paddock_jobs_total{kind=\"power_sync\",outcome=\"claimed\"}";

#[tokio::test]
async fn a_worker_process_serves_its_job_outcomes_on_the_metrics_listener() {
    let db = paddock_testkit::TestDb::new().await;
    let port = free_port();
    let _worker = start("worker", &db, &[("PADDOCK_METRICS_LISTEN", format!("127.0.0.1:{port}"))]);
    let url = format!("http://127.0.0.1:{port}/metrics");
    let body = scrape_until(&url, POWER_SYNC_CLAIMED).await;
    assert!(body.contains("# TYPE paddock_jobs_total counter"), "{body}");
    for kind in ["machine_reconcile", "cluster_reconcile"] {
        assert!(body.contains(&format!("paddock_jobs_total{{kind=\"{kind}\",outcome=\"failed\"}} 0")), "{body}");
    }
    // What the reconcilers observe, from the start (the allocation wait has its one series).
    for family in [
        "paddock_wipe_duration_seconds histogram",
        "paddock_wipe_failures_total counter",
        "paddock_provisioning_duration_seconds histogram",
        "paddock_allocation_wait_seconds histogram",
        "paddock_driver_errors_total counter",
        "paddock_webhook_attempts_total counter",
        "paddock_webhook_attempt_duration_seconds histogram",
        "paddock_webhook_backlog gauge",
        "paddock_webhook_oldest_pending_seconds gauge",
    ] {
        assert!(body.contains(&format!("# TYPE {family}\n")), "{family}: {body}");
    }
    assert!(body.contains("paddock_allocation_wait_seconds_count 0\n"), "{body}");
    assert!(body.contains("paddock_database_up 1"), "{body}");
    assert!(!body.contains("paddock_http_requests_total{"), "a worker serves no API, so no request metrics: {body}");
    // The metrics listener serves nothing else.
    let (status, _) = get(&format!("http://127.0.0.1:{port}/v1/tenants")).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn serve_renders_job_outcomes_beside_the_request_metrics() {
    let db = paddock_testkit::TestDb::new().await;
    let port = free_port();
    let _serve = start("serve", &db, &[("PADDOCK_LISTEN", format!("127.0.0.1:{port}"))]);
    let base = format!("http://127.0.0.1:{port}");
    assert_eq!(get(&format!("{base}/healthz")).await.0, 200);
    let body = scrape_until(&format!("{base}/metrics"), POWER_SYNC_CLAIMED).await;
    assert!(body.contains("paddock_http_requests_total{method=\"GET\",route=\"/healthz\",status=\"200\"}"), "{body}");
}

#[tokio::test]
async fn with_a_metrics_listener_the_api_listener_no_longer_serves_metrics() {
    let db = paddock_testkit::TestDb::new().await;
    let (api_port, metrics_port) = (free_port(), free_port());
    let _serve = start(
        "serve",
        &db,
        &[
            ("PADDOCK_LISTEN", format!("127.0.0.1:{api_port}")),
            ("PADDOCK_METRICS_LISTEN", format!("127.0.0.1:{metrics_port}")),
        ],
    );
    let api = format!("http://127.0.0.1:{api_port}");
    assert_eq!(get(&format!("{api}/healthz")).await.0, 200);
    let (status, body) = get(&format!("{api}/metrics")).await;
    assert_eq!(status, 404, "{body}");
    let body = scrape_until(&format!("http://127.0.0.1:{metrics_port}/metrics"), POWER_SYNC_CLAIMED).await;
    assert!(body.contains("route=\"/healthz\""), "the API's request metrics move with them: {body}");
    assert!(body.contains("route=\"/metrics\",status=\"404\""), "{body}");
}
