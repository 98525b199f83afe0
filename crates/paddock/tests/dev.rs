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
        "node_pools": [{"name": "gpu", "machine_class": "gpu-h100x8", "count": 2},
                       {"name": "system", "machine_class": "cpu-standard", "count": 1, "role": "system"}]
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

/// Each command the banner prints under "Try:" and "More tokens", continuation lines joined, as
/// a user pastes it (after the four `export` lines).
fn printed_commands(banner: &[String]) -> Vec<String> {
    let mut commands = Vec::new();
    let mut current: Option<String> = None;
    for line in banner.iter().map(|l| l.trim()) {
        let start = line.starts_with("curl ") || line.contains(" token --role ");
        let command = match current.take() {
            Some(open) => format!("{open} {line}"),
            None if start => line.to_owned(),
            None => continue,
        };
        match command.strip_suffix('\\') {
            Some(open) => current = Some(open.trim_end().to_owned()),
            None => commands.push(command),
        }
    }
    commands
}

/// Runs `command` in bash after the banner's exports: its standard output, or the test fails.
fn run_printed(dev: &support::Dev, command: &str) -> String {
    let exports: String = dev.exports.iter().map(|(n, v)| format!("export {n}={v}\n")).collect();
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("set -e\n{exports}{command}"))
        .env_remove("PADDOCK_JWT_HS256_SECRET")
        .env_remove("PADDOCK_JWT_HS256_SECRET_FILE")
        .output()
        .expect("running bash");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the printed `{command}` failed: {stderr}{stdout}");
    stdout
}

/// Every command the banner prints works as printed after `cargo run` (no `paddock` on PATH):
/// the curl examples answer without a problem, and the tokens the printed `paddock token`
/// commands mint are accepted, the tenant one for its tenant.
#[tokio::test]
async fn the_commands_the_banner_prints_work_as_printed() {
    let dev = tokio::task::spawn_blocking(support::Dev::start).await.expect("paddock dev starts");
    support::wait_ready(&dev);
    let commands = printed_commands(&dev.banner);
    let (tokens, curls): (Vec<&String>, Vec<&String>) = commands.iter().partition(|c| c.contains(" token --role "));
    assert!(curls.len() >= 6 && tokens.len() == 2, "the printed commands: {commands:#?}");
    for command in curls {
        let answer = run_printed(&dev, command);
        let problem = serde_json::from_str::<serde_json::Value>(&answer)
            .ok()
            .filter(|v| v["status"].as_u64().is_some_and(|s| s >= 400));
        assert!(problem.is_none(), "the printed `{command}` answered a problem: {answer}");
    }
    let client = reqwest::Client::new();
    let (base, tenant) = (dev.var("B"), dev.var("TID"));
    for command in tokens {
        let token = run_printed(&dev, command).trim().to_owned();
        let path = if command.contains("--tenant") {
            format!("/v1/tenants/{tenant}/clusters")
        } else {
            "/v1/machine-classes".into()
        };
        let answer = client.get(format!("{base}{path}")).bearer_auth(&token).send().await.expect("request");
        let status = answer.status().as_u16();
        assert_eq!(status, 200, "`{command}`'s token on {path}: {}", answer.text().await.unwrap_or_default());
    }
}

/// `paddock token` refuses what a server would refuse or ignore, with the reason: a tenant role
/// without its tenant, an unknown role.
#[test]
fn paddock_token_refuses_tokens_a_server_refuses() {
    let secret = String::from_utf8(paddock_testkit::TEST_SECRET.to_vec()).expect("utf-8");
    let token = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_paddock"))
            .arg("token")
            .args(args)
            .env("PADDOCK_JWT_HS256_SECRET", &secret)
            .output()
            .expect("running paddock token");
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let tenant = uuid::Uuid::new_v4().to_string();
    for (args, reason) in [
        (vec!["--role", "tenant:admin"], "--tenant"),
        (vec!["--role", "provider:operator", "--role", "tenant:member"], "--tenant"),
        (vec!["--role", "admin"], "unknown role `admin`"),
        (vec!["--role", "tenant:admin", "--tenant", &tenant, "--role", "tenant:owner"], "unknown role `tenant:owner`"),
        (vec!["--role", "provider:admin", "--sub", ""], "--sub"),
    ] {
        let (minted, stderr) = token(&args);
        assert!(!minted, "`paddock token {args:?}` minted a token a server refuses");
        assert!(stderr.contains(reason), "`paddock token {args:?}` did not say why ({reason}): {stderr}");
    }
    assert!(token(&["--role", "tenant:admin", "--tenant", &tenant]).0);
    assert!(token(&["--role", "billing:reader"]).0);
}

/// On an address already in use, `paddock dev` stops before it starts anything or prints a
/// token, and says how to choose another address.
#[test]
fn paddock_dev_on_a_port_in_use_says_so_before_its_banner() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("a port to hold");
    let address = held.local_addr().expect("its address");
    let dir = std::env::temp_dir().join(format!("paddock-dev-port-{}", uuid::Uuid::new_v4().simple()));
    let out = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args(["dev", "--data-dir"])
        .arg(&dir)
        .env("PADDOCK_LISTEN", address.to_string())
        .env("PADDOCK_LOG", "warn")
        .env_remove("PADDOCK_DATABASE_URL")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("running paddock dev");
    let started_postgres = dir.join("pgdata").exists();
    let _ = std::fs::remove_dir_all(&dir);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "paddock dev exited 0 on a taken port: {stderr}");
    assert!(!stdout.contains("TOKEN") && !stdout.contains("running on"), "a banner before the failure: {stdout}");
    assert!(!started_postgres, "paddock dev started PostgreSQL first: {stderr}");
    for hint in [address.to_string().as_str(), "--listen", "PADDOCK_LISTEN"] {
        assert!(stderr.contains(hint), "the refusal does not say {hint}: {stderr}");
    }
    drop(held);
}
