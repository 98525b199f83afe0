//! `/metrics` of real `paddock` processes (SPEC sections 3 and 9): every process that runs a worker
//! renders its job outcomes, and `PADDOCK_METRICS_LISTEN` gives the metrics a listener of their
//! own: the only one of a `paddock worker`, and then `/metrics` is off the API listener.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `paddock` process, killed when the test ends however it ends.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// Starts `paddock <role>` on the test's database with no drivers (the power sync's fleet job
/// still runs, and waits for its driver: a job outcome to count).
fn start(role: &str, db: &paddock_testkit::TestDb, extra: &[(&str, String)]) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_paddock"));
    cmd.arg(role);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("PADDOCK_")) {
        cmd.env_remove(k);
    }
    let secret = String::from_utf8(paddock_testkit::TEST_SECRET.to_vec()).expect("utf-8");
    cmd.env("PADDOCK_DATABASE_URL", &db.url)
        .env("PADDOCK_JWT_HS256_SECRET", secret)
        .env("PADDOCK_ENCRYPTION_KEY", paddock_domain::secret::Cipher::generate_key())
        .env("PADDOCK_LEDGER_KEY", "metrics-test-ledger-key-of-at-least-32-bytes")
        .env("PADDOCK_LOG", "warn")
        .envs(extra.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    Proc(cmd.spawn().unwrap_or_else(|e| panic!("starting `paddock {role}`: {e}")))
}

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
