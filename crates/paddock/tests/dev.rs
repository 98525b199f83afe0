//! `paddock dev` as a newcomer runs it: a private PostgreSQL from the machine's binaries, demo
//! data, a token that works, and Ctrl-C stopping everything it started.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

#[tokio::test]
async fn paddock_dev_serves_demo_data_and_stops_its_postgres_on_ctrl_c() {
    let dir = std::env::temp_dir().join(format!("paddock-dev-test-{}", uuid::Uuid::new_v4().simple()));
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args(["dev", "--data-dir"])
        .arg(&dir)
        .env("PADDOCK_LISTEN", format!("127.0.0.1:{port}"))
        .env("PADDOCK_LOG", "warn")
        .env_remove("PADDOCK_DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("paddock dev starts");

    // The welcome text carries the provider-admin token. The reader keeps draining stdout after
    // it, so paddock never writes into a closed pipe.
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(token) = line.trim().strip_prefix("export TOKEN=") {
                let _ = tx.send(token.to_owned());
            }
        }
    });
    let token = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(120)))
        .await
        .expect("reader")
        .expect("paddock dev prints a provider token");

    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if client.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        assert!(Instant::now() < deadline, "paddock dev did not become ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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

    // Ctrl-C (SIGINT) stops the API, the worker and the PostgreSQL dev started.
    let pid = child.id().to_string();
    Command::new("kill").args(["-INT", &pid]).status().expect("kill -INT");
    let status = tokio::task::spawn_blocking(move || child.wait()).await.expect("join").expect("wait");
    assert!(status.success(), "paddock dev exits cleanly: {status}");
    let pg_running = Command::new("pgrep")
        .args(["-f", &format!("postgres -D {}", dir.display())])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    assert!(!pg_running, "the dev PostgreSQL is still running");
    let _ = std::fs::remove_dir_all(&dir);
}
