//! `paddock dev` as a newcomer runs it: a private PostgreSQL from the machine's binaries, demo
//! data, a token that works, and Ctrl-C stopping everything it started.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

#[tokio::test]
async fn paddock_dev_serves_demo_data_and_stops_its_postgres_on_ctrl_c() {
    // The banner carries the provider-admin token; its reader keeps draining stdout after it, so
    // paddock never writes into a closed pipe.
    let mut dev = tokio::task::spawn_blocking(support::Dev::start).await.expect("paddock dev starts");
    let (base, token) = (dev.var("B").to_owned(), dev.var("TOKEN").to_owned());
    support::wait_ready(&dev);
    let client = reqwest::Client::new();
    let classes: serde_json::Value = client
        .get(format!("{base}/v1/machine-classes"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    let names: Vec<&str> =
        classes["items"].as_array().expect("items").iter().filter_map(|c| c["name"].as_str()).collect();
    assert!(names.contains(&"gpu-h100x8"), "demo machine classes: {classes}");
    let tenants: serde_json::Value = client
        .get(format!("{base}/v1/tenants"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    assert_eq!(tenants["items"][0]["name"], "acme");

    // On the simulated drivers, a Slurm cluster of two nodes goes ready (the printed curl).
    let tenant = tenants["items"][0]["id"].as_str().expect("tenant id").to_owned();
    let clusters = format!("{base}/v1/tenants/{tenant}/clusters");
    let body = serde_json::json!({
        "name": "hpc", "kind": "slurm", "isolation": "private-nodes",
        "node_pools": [{"name": "gpu", "machine_class": "gpu-h100x8", "count": 2}]
    });
    let created = client.post(&clusters).bearer_auth(&token).json(&body).send().await.expect("create");
    assert_eq!(created.status().as_u16(), 202);
    let created: serde_json::Value = created.json().await.expect("json");
    let cluster = format!("{clusters}/{}", created["cluster"]["id"].as_str().expect("cluster id"));
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let c: serde_json::Value =
            client.get(&cluster).bearer_auth(&token).send().await.expect("get").json().await.expect("json");
        if c["status"]["phase"] == "ready" {
            // The view shows where to connect, and the login host key to check on first connect.
            let endpoints = &c["status"]["endpoints"];
            assert!(endpoints["slurm_rest_api"].is_string() && endpoints["login_ssh"].is_string(), "{c}");
            let fingerprint = endpoints["login_ssh_host_keys"][0]["fingerprint"].as_str().unwrap_or_default();
            assert!(fingerprint.starts_with("SHA256:"), "{c}");
            break;
        }
        assert!(Instant::now() < deadline, "the demo cluster did not become ready: {c}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The billing pull of docs/billing.md works in dev as it does in production: the FOCUS export too (the
    // demo classes have prices, and dev names the provider).
    let now = chrono::Utc::now();
    let window = |d: chrono::Duration| (now + d).format("%Y-%m-%dT%H:00:00Z").to_string();
    let export = client
        .get(format!("{base}/v1/usage/export"))
        .query(&[
            ("format", "focus"),
            ("from", &window(-chrono::Duration::hours(1))),
            ("to", &window(chrono::Duration::hours(2))),
        ])
        .bearer_auth(&token)
        .send()
        .await
        .expect("export");
    let status = export.status().as_u16();
    let csv = export.text().await.expect("body");
    assert_eq!(status, 200, "the FOCUS export in dev: {csv}");
    assert!(csv.lines().skip(1).any(|l| l.contains("paddock dev")), "rows name the provider: {csv}");

    // Ctrl-C (SIGINT) stops the API, the worker and the PostgreSQL dev started.
    let status = dev.stop();
    assert!(status.success(), "paddock dev exits cleanly: {status}");
    let pg_running = Command::new("pgrep")
        .args(["-f", &format!("postgres -D {}", dev.dir.display())])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    assert!(!pg_running, "the dev PostgreSQL is still running");
}
