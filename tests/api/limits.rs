//! The edge's limits: a caller over its rate gets 429 with
//! `Retry-After` while other callers are served; a full process and a request over its time get
//! 503 with `Retry-After`. The header-read timeout is the server's: `crates/paddock/tests/edge.rs`.

use std::time::Duration;

use paddock_api::limits::Limits;
use paddock_testkit::{token_with, Resp, TestApp};

fn limits(rate_per_second: u32, rate_burst: u32) -> Limits {
    Limits { rate_per_second, rate_burst, ..Limits::default() }
}

fn subject(sub: &str) -> String {
    token_with(|claims| claims.sub = sub.to_owned())
}

/// A 429 or 503 Problem with a `Retry-After` of whole seconds, at least one.
fn assert_refused(resp: Resp, status: u16, code: &str) {
    let retry_after = resp.header("retry-after").map(str::to_owned);
    let seconds: u64 = retry_after.as_deref().and_then(|v| v.parse().ok()).expect("Retry-After in seconds");
    assert!(seconds >= 1, "Retry-After {seconds}");
    assert_eq!(resp.header("content-type"), Some("application/problem+json"));
    resp.problem(status, code);
}

#[tokio::test]
async fn a_flood_from_one_subject_gets_429_with_retry_after_while_another_is_served() {
    let app = TestApp::with_limits(limits(1, 20)).await;
    let (flood, calm) = (subject("flooding-client"), subject("calm-client"));
    let mut refused = 0;
    for i in 0..100 {
        let resp = app.get("/v1/tenants").token(&flood).send().await;
        if resp.status == 429 {
            refused += 1;
            assert_refused(resp, 429, "rate_limited");
        } else {
            resp.expect(200);
        }
        if i % 10 == 0 {
            app.get("/v1/tenants").token(&calm).send().await.expect(200);
        }
    }
    // 20 of burst, and at most a few more refilled at one a second.
    assert!((75..=80).contains(&refused), "{refused} of 100 refused");
}

#[tokio::test]
async fn agent_tokens_have_buckets_of_their_own() {
    let app = TestApp::with_limits(limits(1, 5)).await;
    let report = |token: &'static str| {
        app.post("/v1/agent/report").token(token).json(&serde_json::json!({"phase": "wipe", "outcome": "started"}))
    };
    for _ in 0..5 {
        assert_ne!(report("agent-token-one").send().await.status, 429);
    }
    assert_refused(report("agent-token-one").send().await, 429, "rate_limited");
    assert_ne!(report("agent-token-two").send().await.status, 429, "another run's token is not limited");
}

#[tokio::test]
async fn a_process_with_no_room_answers_503_with_retry_after() {
    let app = TestApp::with_limits(Limits { max_in_flight: 0, ..Limits::default() }).await;
    assert_refused(app.get("/v1/tenants").token(&subject("anyone")).send().await, 503, "overloaded");
}

#[tokio::test]
async fn a_request_over_its_time_answers_503_with_retry_after() {
    use tower::ServiceExt;
    let app = TestApp::with_limits(Limits { request_timeout: Duration::from_millis(200), ..Limits::default() }).await;
    // A body that never ends: the handler waits for it until the request's time is up.
    let body = axum::body::Body::from_stream(futures::stream::pending::<Result<Vec<u8>, std::io::Error>>());
    let request = http::Request::post("/v1/tenants")
        .header("authorization", format!("Bearer {}", subject("slow-uploader")))
        .header("content-type", "application/json")
        .body(body)
        .expect("a request");
    let response = tokio::time::timeout(Duration::from_secs(10), app.router.clone().oneshot(request))
        .await
        .expect("answered once the request's time is up")
        .expect("the router is infallible");
    let (parts, body) = response.into_parts();
    let body = http_body_util::BodyExt::collect(body).await.expect("a body").to_bytes();
    assert_refused(Resp { status: parts.status, headers: parts.headers, body }, 503, "request_timeout");
}
