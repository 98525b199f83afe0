//! The edge's limits: a caller over its rate gets 429 with `Retry-After` while other callers are
//! served (made-up agent tokens and paths no route matches count against their address, an agent
//! token a route accepted against a bucket of its own); a full process and a request over its
//! time get 503 with `Retry-After`. The header-read timeout is the server's: `crates/paddock/tests/edge.rs`.

use std::time::Duration;

use paddock_api::limits::Limits;
use paddock_service::agent::AgentRun;
use paddock_testkit::{token_with, Resp, TestApp};
use paddock_types::agent::{AgentRunConfig, AgentSeed};
use serde_json::json;

use crate::common::{id, machine, machine_class};

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

/// The agent token of a new wipe run of a new machine `name` (read from its seed through the
/// services: the seed's fetch would count against the test's rate limit).
async fn agent_token(app: &TestApp, name: &str) -> String {
    let m = machine(app, name, "gpu").await;
    let run = AgentRun {
        machine_id: id(&m).parse().expect("machine id"),
        run_id: uuid::Uuid::now_v7(),
        config: AgentRunConfig::Wipe(serde_json::from_value(json!({ "drives": [{ "id": "nvme0" }] })).expect("wipe")),
    };
    let seed = app.services.agent_token_issue(&run, Duration::from_secs(3600)).await.expect("issue");
    let iso = app.services.agent_seed(seed.expose()).await.expect("the seed");
    let json = paddock_seed::read_file(&iso, "paddock/agent.json").expect("paddock/agent.json in the seed");
    serde_json::from_slice::<AgentSeed>(&json).expect("agent.json").agent_token
}

/// How many of `n` answers of `request` were 429 (the others `otherwise`).
async fn refusals<'a>(n: usize, otherwise: u16, request: impl Fn(usize) -> paddock_testkit::Req<'a>) -> usize {
    let mut refused = 0;
    for i in 0..n {
        let resp = request(i).send().await;
        if resp.status == 429 {
            refused += 1;
            assert_refused(resp, 429, "rate_limited");
        } else {
            assert_eq!(resp.status, otherwise, "{:?}", resp.json());
        }
    }
    refused
}

#[tokio::test]
async fn made_up_agent_tokens_and_unmatched_paths_count_against_the_client_address() {
    let app = TestApp::with_limits(limits(1, 5)).await;
    // Each request a new token: no new bucket each (each would be a database lookup).
    let made_up = |i: usize| app.get("/v1/agent/config").token(&format!("made-up-token-{i}"));
    let refused = refusals(20, 404, made_up).await;
    // 5 of burst, and at most a few more refilled at one a second.
    assert!(refused >= 12, "{refused} of 20 made-up agent tokens refused");

    let app = TestApp::with_limits(limits(1, 5)).await;
    let refused = refusals(20, 404, |i| app.get(format!("/no-such-route/{i}"))).await;
    assert!(refused >= 12, "{refused} of 20 requests to no route refused");
}

#[tokio::test]
async fn an_agent_token_a_route_accepted_has_a_bucket_of_its_own() {
    let app = TestApp::with_limits(limits(1, 5)).await;
    machine_class(&app, "gpu", 8).await;
    let (one, two) = (agent_token(&app, "node-1").await, agent_token(&app, "node-2").await);
    app.get("/v1/agent/config").token(&one).send().await.expect(200);
    // The address's bucket runs dry on made-up tokens: a token nobody vouched for is refused.
    let made_up = |i: usize| app.get("/v1/agent/config").token(&format!("made-up-token-{i}"));
    assert!(refusals(10, 404, made_up).await > 0);
    assert_refused(app.get("/v1/agent/config").token(&two).send().await, 429, "rate_limited");
    // The accepted token is not: it has its own bucket, as limited as any other.
    let config = |_| app.get("/v1/agent/config").token(&one);
    let refused = refusals(10, 200, config).await;
    assert!((1..=6).contains(&refused), "{refused} of the accepted token's 10 requests refused");
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
