//! The image without a Docker engine (none runs here): what `docker/Dockerfile` and
//! `docker/compose.yaml` promise is checked against the binary and the configuration contract.
//! The runtime stage's entrypoint, command, user and environment; the chart runs the same user;
//! compose's environment uses only the configuration table's names; and the real `paddock`
//! binary, laid out as in the image and run as that user with compose's configuration (database
//! and ports swapped for the test's), serves `/readyz` and `/metrics` and stops cleanly on SIGTERM.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The instructions of the Dockerfile's runtime stage, as (instruction, rest of the line).
fn runtime_stage() -> Vec<(String, String)> {
    let text = read("docker/Dockerfile").replace("\\\n", " ");
    let mut stage = Vec::new();
    let mut inside = false;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (op, rest) = line.split_once(' ').unwrap_or((line, ""));
        if op == "FROM" {
            inside = rest.ends_with(" AS runtime");
        } else if inside {
            stage.push((op.to_owned(), rest.trim().to_owned()));
        }
    }
    assert!(!stage.is_empty(), "docker/Dockerfile has no `AS runtime` stage");
    stage
}

fn one(stage: &[(String, String)], op: &str) -> String {
    let found: Vec<&String> = stage.iter().filter(|(o, _)| o == op).map(|(_, r)| r).collect();
    assert_eq!(found.len(), 1, "the runtime stage has one {op}: {found:?}");
    found[0].clone()
}

/// The variable names of the configuration reference (docs/configuration.md, generated from the
/// settings' definitions).
fn configuration_names() -> Vec<String> {
    read("docs/configuration.md")
        .lines()
        .filter(|l| l.starts_with("| `PADDOCK_"))
        .map(|l| l.split('|').nth(1).unwrap_or_default().trim().trim_matches('`').to_owned())
        .collect()
}

fn known(name: &str, names: &[String]) -> bool {
    names.iter().any(|n| n == name || format!("{n}_FILE") == name)
}

#[test]
fn the_runtime_stage_runs_paddock_as_the_charts_user() {
    let stage = runtime_stage();
    assert_eq!(one(&stage, "ENTRYPOINT"), r#"["/usr/local/bin/paddock"]"#);
    assert_eq!(one(&stage, "CMD"), r#"["serve"]"#);
    assert_eq!(one(&stage, "USER"), "10001:10001");
    assert_eq!(one(&stage, "WORKDIR"), "/var/lib/paddock");
    let copies: Vec<&String> = stage.iter().filter(|(o, _)| o == "COPY").map(|(_, r)| r).collect();
    assert!(copies.iter().any(|c| c.ends_with(" /usr/local/bin/paddock")), "the binary lands at the entrypoint");
    assert!(copies.iter().any(|c| c.ends_with(" /usr/local/bin/paddock-agent")), "the agent is beside it");
    let names = configuration_names();
    for pair in one(&stage, "ENV").split_whitespace() {
        let (name, _) = pair.split_once('=').expect("ENV name=value");
        assert!(known(name, &names), "ENV {name} is not in the configuration table");
    }
    // The chart runs the image as the same user and mounts the stacks where the image has them.
    let values = read("deploy/helm/paddock/values.yaml");
    assert!(values.contains("runAsUser: 10001") && values.contains("runAsGroup: 10001"), "chart user");
    assert!(one(&stage, "RUN").contains("/var/lib/paddock/stacks"));
    assert!(read("deploy/helm/paddock/templates/_helpers.tpl").contains("mountPath: /var/lib/paddock/stacks"));
}

/// The `paddock` service of docker/compose.yaml.
fn compose_service() -> Value {
    let compose: Value = serde_yaml::from_str(&read("docker/compose.yaml")).expect("compose.yaml is YAML");
    compose["services"]["paddock"].clone()
}

#[test]
fn compose_configures_paddock_with_the_contracts_names() {
    let service = compose_service();
    let names = configuration_names();
    let env = service["environment"].as_object().expect("an environment map");
    assert!(env.contains_key("PADDOCK_DATABASE_URL"));
    for name in env.keys() {
        assert!(known(name, &names), "compose sets {name}, which is not in the configuration table");
    }
    assert_eq!(service["command"], serde_json::json!(["serve"]));
    assert_eq!(service["depends_on"]["postgres"]["condition"], "service_healthy");
    let probe = service["healthcheck"]["test"].to_string();
    assert!(probe.contains("/readyz"), "{probe}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// The image's layout under `root`: the binary at the entrypoint, the working directory owned by
/// the image's user.
fn lay_out(root: &Path) -> PathBuf {
    let bin = root.join("usr/local/bin/paddock");
    std::fs::create_dir_all(bin.parent().expect("parent")).expect("bin dir");
    std::fs::copy(env!("CARGO_BIN_EXE_paddock"), &bin).expect("copy the binary");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let work = root.join("var/lib/paddock/stacks");
    std::fs::create_dir_all(&work).expect("workdir");
    for dir in [root.join("var/lib/paddock"), work] {
        std::os::unix::fs::chown(&dir, Some(10001), Some(10001)).expect("chown to the image's user");
    }
    bin
}

async fn status(url: &str) -> Option<u16> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("client");
    client.get(url).send().await.ok().map(|r| r.status().as_u16())
}

#[tokio::test]
async fn the_binary_serves_as_the_images_user_with_composes_configuration() {
    // Switching users needs root (CI runs as root).
    if !paddock_testkit::skip::root("running as the image's user") {
        return;
    }
    let db = paddock_testkit::TestDb::new().await;
    let root = std::env::temp_dir().join(format!("paddock-image-{}", uuid::Uuid::new_v4().simple()));
    let bin = lay_out(&root);
    let (port, metrics) = (free_port(), free_port());
    let mut env: BTreeMap<String, String> = compose_service()["environment"]
        .as_object()
        .expect("environment")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_owned)))
        .collect();
    env.insert("PADDOCK_DATABASE_URL".into(), db.url.clone());
    env.insert("PADDOCK_LISTEN".into(), format!("127.0.0.1:{port}"));
    env.insert("PADDOCK_METRICS_LISTEN".into(), format!("127.0.0.1:{metrics}"));
    let mut child = Command::new("setpriv")
        .args(["--reuid=10001", "--regid=10001", "--clear-groups", "--"])
        .arg(&bin)
        .arg("serve")
        .current_dir(root.join("var/lib/paddock"))
        .env_clear()
        .env("HOME", "/nonexistent")
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .envs(&env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("setpriv");
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    while status(&format!("http://127.0.0.1:{port}/readyz")).await != Some(200) {
        if let Ok(Some(exit)) = child.try_wait() {
            panic!("paddock serve exited as the image's user: {exit}");
        }
        assert!(Instant::now() < deadline, "paddock serve did not become ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(status(&format!("http://127.0.0.1:{metrics}/metrics")).await, Some(200));
    let proc_status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the process's status");
    let uid = proc_status.lines().find(|l| l.starts_with("Uid:")).expect("Uid line");
    assert!(uid.split_whitespace().skip(1).all(|u| u == "10001"), "{uid}");

    let term = Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("kill");
    assert!(term.success());
    let grace: u64 = env["PADDOCK_SHUTDOWN_GRACE"].parse().expect("a number");
    let deadline = Instant::now() + Duration::from_secs(grace + 5);
    let exit = loop {
        if let Some(exit) = child.try_wait().expect("wait") {
            break exit;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("paddock serve did not exit within its grace period of {grace} s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(exit.success(), "paddock serve exited with {exit} on SIGTERM");
    std::fs::remove_dir_all(&root).expect("remove the layout");
}
