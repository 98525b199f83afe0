//! The HTTP edge of a real `paddock api` process: a client that sends its headers slowly
//! (slowloris) loses its connection after PADDOCK_HTTP_HEADER_READ_TIMEOUT, a flood from one client
//! address gets 429 with `Retry-After` while another caller (a JWT subject) keeps being served, and
//! neither made-up agent tokens nor paths no route matches escape their address's limit. Each
//! test prints what it measured (for BENCHMARKS.md's notes;
//! no timing is asserted).

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[path = "support/process.rs"]
mod process;

use process::{free_port, Proc};

/// Starts `paddock api` on the test's database with `extra` settings; returns it and its base URL
/// once `/healthz` answers.
async fn start_api(db: &paddock_testkit::TestDb, extra: &[(&str, &str)]) -> (Proc, String) {
    let port = free_port();
    let mut settings = vec![("PADDOCK_LISTEN", format!("127.0.0.1:{port}"))];
    settings.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let proc = process::start("api", db, &settings);
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while reqwest::get(format!("{base}/healthz")).await.map(|r| r.status().as_u16()).ok() != Some(200) {
        assert!(Instant::now() < deadline, "paddock api never answered /healthz");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (proc, base)
}

/// Whether the server has closed `conn` (end of stream or reset).
async fn closed(conn: &mut TcpStream) -> bool {
    let mut buf = [0u8; 512];
    match tokio::time::timeout(Duration::from_millis(20), conn.read(&mut buf)).await {
        Ok(Ok(0) | Err(_)) => true,
        // Bytes (a 408, say) or nothing yet: look again for the end of stream.
        Ok(Ok(_)) => {
            matches!(tokio::time::timeout(Duration::from_millis(20), conn.read(&mut buf)).await, Ok(Ok(0) | Err(_)))
        }
        Err(_) => false,
    }
}

#[tokio::test]
async fn a_slowloris_client_is_disconnected_after_the_header_read_timeout() {
    let db = paddock_testkit::TestDb::new().await;
    let (_api, base) = start_api(&db, &[("PADDOCK_HTTP_HEADER_READ_TIMEOUT", "1")]).await;
    let addr = base.trim_start_matches("http://").to_owned();
    let mut conns = Vec::new();
    for _ in 0..50 {
        let mut conn = TcpStream::connect(&addr).await.expect("connecting");
        conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: paddock\r\n").await.expect("half the headers");
        conns.push(conn);
    }
    // One more header line every 250 ms, never the blank line that ends them, for 4 s (the
    // timeout is 1 s).
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        for conn in &mut conns {
            let _ = conn.write_all(b"X-Slow: 1\r\n").await;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut open = 0;
    for conn in &mut conns {
        if !closed(conn).await {
            open += 1;
        }
    }
    eprintln!("slowloris: {open} of {} connections still open 4 s into a 1 s header-read timeout", conns.len());
    assert_eq!(open, 0, "connections the slowloris client still holds");
    let status = reqwest::get(format!("{base}/healthz")).await.expect("a normal client").status();
    assert_eq!(status, 200);
}

/// Milliseconds of the `p`-th percentile of `samples`.
fn percentile(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples.get(i).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

#[tokio::test]
async fn a_flood_from_one_address_gets_429s_while_another_caller_is_served() {
    let db = paddock_testkit::TestDb::new().await;
    let limits = [("PADDOCK_RATE_LIMIT_PER_SECOND", "100"), ("PADDOCK_RATE_LIMIT_BURST", "100")];
    let (_api, base) = start_api(&db, &limits).await;
    let client = reqwest::Client::new();
    let flood = (0..8).map(|_| {
        let (client, url) = (client.clone(), format!("{base}/healthz"));
        tokio::spawn(async move {
            let (mut ok, mut refused) = (0u32, 0u32);
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(3) {
                let resp = client.get(&url).send().await.expect("the flood's request");
                match resp.status().as_u16() {
                    200 => ok += 1,
                    429 => {
                        let retry_after = resp.headers().get("retry-after").and_then(|v| v.to_str().ok());
                        assert!(retry_after.is_some_and(|v| v.parse::<u64>().is_ok_and(|s| s >= 1)), "{retry_after:?}");
                        refused += 1;
                    }
                    other => panic!("the flood got {other}"),
                }
            }
            (ok, refused)
        })
    });
    let flood: Vec<_> = flood.collect();
    let token = paddock_testkit::token_with(|claims| claims.sub = "calm-caller".to_owned());
    let mut latencies = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let sent = Instant::now();
        let resp = client.get(format!("{base}/v1/tenants")).bearer_auth(&token).send().await.expect("other caller");
        assert_eq!(resp.status(), 200, "the other caller during the flood");
        latencies.push(sent.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (mut ok, mut refused) = (0, 0);
    for task in flood {
        let (o, r) = task.await.expect("a flood task");
        (ok, refused) = (ok + o, refused + r);
    }
    eprintln!(
        "flood: {ok} served and {refused} refused (429) in 3 s ({:.0} 429/s, {:.1}% refused); the other caller: {} requests, all 200, p50 {:.2} ms, p99 {:.2} ms",
        f64::from(refused) / 3.0,
        100.0 * f64::from(refused) / f64::from(ok + refused),
        latencies.len(),
        percentile(&mut latencies, 0.5),
        percentile(&mut latencies, 0.99),
    );
    assert!(refused > 0, "a flood over the rate gets 429s");
    assert!(ok <= 100 + 3 * 100 + 10, "{ok} served: the burst and the rate, no more");
}

/// A client whose connections come from `source`, another loopback address: another client
/// address to the server.
fn client_from(source: [u8; 4]) -> reqwest::Client {
    let source = std::net::IpAddr::from(source);
    reqwest::Client::builder().local_address(source).build().expect("a client")
}

#[tokio::test]
async fn made_up_agent_tokens_and_unmatched_paths_are_limited_by_the_client_address() {
    let db = paddock_testkit::TestDb::new().await;
    let limits = [("PADDOCK_RATE_LIMIT_PER_SECOND", "1"), ("PADDOCK_RATE_LIMIT_BURST", "10")];
    let (_api, base) = start_api(&db, &limits).await;
    // Each flood from an address of its own: 40 requests, each agent request with a new token.
    for (source, path) in [([127, 0, 0, 2], "/v1/agent/config"), ([127, 0, 0, 3], "/no-such-route")] {
        let client = client_from(source);
        let (mut served, mut refused) = (0u64, 0u64);
        let started = Instant::now();
        for i in 0..40 {
            let request = client.get(format!("{base}{path}"));
            let request =
                if path.starts_with("/v1/agent/") { request.bearer_auth(format!("made-up-{i}")) } else { request };
            let resp = request.send().await.expect("the flood's request");
            match resp.status().as_u16() {
                404 => served += 1,
                429 => {
                    let retry_after = resp.headers().get("retry-after").and_then(|v| v.to_str().ok());
                    assert!(retry_after.is_some_and(|v| v.parse::<u64>().is_ok_and(|s| s >= 1)), "{retry_after:?}");
                    refused += 1;
                }
                other => panic!("{path} answered {other}"),
            }
        }
        // The burst, and one a second since the first request.
        let allowed = 10 + started.elapsed().as_secs() + 1;
        eprintln!("{path}: {served} of 40 answered, {refused} refused (429), {allowed} allowed");
        assert!(served <= allowed, "{path}: {served} of 40 answered, the address's burst and rate are {allowed}");
    }
    let other = client_from([127, 0, 0, 4]).get(format!("{base}/healthz")).send().await.expect("another address");
    assert_eq!(other.status(), 200, "another client address is served");
}

#[tokio::test]
async fn the_agent_listener_serves_the_agent_routes_and_nothing_else() {
    let db = paddock_testkit::TestDb::new().await;
    let agent_port = free_port();
    let (_api, base) = start_api(&db, &[("PADDOCK_AGENT_LISTEN", &format!("127.0.0.1:{agent_port}"))]).await;
    let agents = format!("http://127.0.0.1:{agent_port}");
    let client = reqwest::Client::new();
    let admin = paddock_testkit::admin();
    let status = |url: String, token: Option<&str>| {
        let request = client.get(url);
        let request = match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        async move { request.send().await.expect("an answer").status().as_u16() }
    };
    // The agents' routes are there (a config read without its token is theirs to refuse)...
    assert_eq!(status(format!("{agents}/v1/agent/config"), None).await, 401);
    assert_eq!(status(format!("{agents}/v1/agent/config"), Some("made-up")).await, 404);
    // ... and nothing else is: not the API, not its document, not the process endpoints.
    for path in ["/openapi.json", "/v1/tenants", "/healthz", "/metrics"] {
        assert_eq!(status(format!("{agents}{path}"), Some(&admin)).await, 404, "{path} on the agent listener");
    }
    // The API listener serves everything but the agents' routes.
    assert_eq!(status(format!("{base}/openapi.json"), None).await, 200);
    assert_eq!(status(format!("{base}/v1/tenants"), Some(&admin)).await, 200);
    assert_eq!(status(format!("{base}/v1/agent/config"), None).await, 404, "the agents' routes moved");
}
