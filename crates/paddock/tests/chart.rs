//! The chart (`deploy/helm/paddock`) and the processes refuse the same configurations: for
//! combinations of values, the chart renders exactly when every container it renders passes the
//! process's own start rules (`paddock check-config <process>` with the container's environment,
//! its secrets read from the rendered Secret and its mounts present), and when both refuse, the
//! chart names the same variables as the process. And the install example of docs/operating.md,
//! run as written, renders pods that start.
//!
//! The environment of a refused configuration comes from a copy of the chart whose checks
//! (`templates/_checks.tpl`) are emptied: the same templates otherwise.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;
use serde::Deserialize;
use serde_yaml::Value;

const DIGEST: &str = "0fe69a4d69d37826b61d5cf3668142a99abf86c090c214078aa9042b6d24937a";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the repository")
}

fn helm() -> PathBuf {
    let out = Command::new(repo().join("scripts/helm")).arg("--path").output().expect("running scripts/helm");
    assert!(out.status.success(), "scripts/helm --path: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).expect("utf-8").trim())
}

/// A scratch directory, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("paddock-chart-{what}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A copy of the chart without its checks.
fn unchecked_chart(scratch: &Scratch) -> PathBuf {
    let copy = scratch.0.join("paddock");
    let status = Command::new("cp").arg("-r").arg(repo().join("deploy/helm/paddock")).arg(&copy).status();
    assert!(status.expect("cp").success(), "copying the chart");
    std::fs::write(copy.join("templates/_checks.tpl"), "{{- define \"paddock.check\" -}}{{- end -}}\n")
        .expect("emptying the checks");
    copy
}

/// `helm template` of `chart` with `sets`: the documents, or helm's error.
fn render(helm: &Path, chart: &Path, sets: &[String]) -> Result<Vec<Value>, String> {
    let mut cmd = Command::new(helm);
    cmd.args(["template", "p"]).arg(chart);
    for set in sets {
        cmd.args(["--set", set]);
    }
    let out = cmd.output().expect("running helm");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(documents(&String::from_utf8_lossy(&out.stdout)))
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .filter_map(|d| Value::deserialize(d).ok())
        .filter(|d| !d.is_null())
        .collect()
}

/// Each container of the rendered workloads: its process (`args[0]`) and its environment as the
/// pod would see it (secret references read from the rendered Secret, mounted paths present under
/// `mounts`).
fn containers(docs: &[Value], mounts: &Path) -> Vec<(String, BTreeMap<String, String>)> {
    let secret: BTreeMap<String, String> = docs
        .iter()
        .filter(|d| d["kind"] == "Secret")
        .flat_map(|d| d["data"].as_mapping().cloned().unwrap_or_default())
        .filter_map(|(k, v)| {
            let bytes = base64::engine::general_purpose::STANDARD.decode(v.as_str()?).ok()?;
            Some((k.as_str()?.to_owned(), String::from_utf8(bytes).ok()?))
        })
        .collect();
    let mut out = Vec::new();
    for doc in docs.iter().filter(|d| d["kind"] == "Deployment" || d["kind"] == "Job") {
        for container in doc["spec"]["template"]["spec"]["containers"].as_sequence().into_iter().flatten() {
            let process = container["args"][0].as_str().expect("a process").to_owned();
            let mount_paths: Vec<&str> = container["volumeMounts"]
                .as_sequence()
                .into_iter()
                .flatten()
                .filter_map(|m| m["mountPath"].as_str())
                .collect();
            let mut env = BTreeMap::new();
            for var in container["env"].as_sequence().into_iter().flatten() {
                let name = var["name"].as_str().expect("a name").to_owned();
                let value = match var["value"].as_str() {
                    Some(value) => value.to_owned(),
                    None => {
                        let key = var["valueFrom"]["secretKeyRef"]["key"].as_str().expect("a secret key");
                        match secret.get(key) {
                            Some(value) => value.clone(),
                            None => continue,
                        }
                    }
                };
                // A path under a mount: there, in the pod.
                let value = match mount_paths.iter().find(|m| value.starts_with(**m)) {
                    Some(mount) => {
                        let local = mounts.join(mount.trim_start_matches('/'));
                        std::fs::create_dir_all(&local).expect("a mount");
                        format!("{}{}", local.display(), &value[mount.len()..])
                    }
                    None => value,
                };
                env.insert(name, value);
            }
            out.push((process, env));
        }
    }
    out
}

/// `paddock check-config <process>` with exactly `env` of the PADDOCK_ settings: its problems.
fn check_config(process: &str, env: &BTreeMap<String, String>) -> Result<(), String> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_paddock"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("PADDOCK_")) {
        cmd.env_remove(k);
    }
    let out = cmd.args(["check-config", process]).envs(env).output().expect("running paddock check-config");
    match out.status.success() {
        true => Ok(()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// The variable each problem line is about: the first one it names after a driver's "needs".
fn subjects(message: &str) -> BTreeSet<String> {
    message
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .filter_map(|l| {
            let driver = |head: &str| head.starts_with("PADDOCK_") && head.contains('=');
            let l = l.split_once(" needs ").filter(|(head, _)| driver(head)).map_or(l, |(_, rest)| rest);
            let start = l.find("PADDOCK_")?;
            let name: String =
                l[start..].chars().take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_').collect();
            Some(name)
        })
        .collect()
}

/// The values every case starts from: a database URL, the stacks claim, a JWKS URL.
fn base() -> Vec<String> {
    ["secrets.databaseUrl=postgres://paddock@db.example:5432/paddock", "stacks.persistentVolumeClaim.claimName=stacks"]
        .into_iter()
        .chain(["jwt.jwksUrl=https://idp.example/jwks.json"])
        .map(str::to_owned)
        .collect()
}

/// The combinations: every rule the chart's values reach, alone and together.
fn cases() -> Vec<Vec<String>> {
    let redfish = [
        "agent.baseUrl=https://agent.example",
        "agent.seedBaseUrl=https://seed.example",
        "images.wipeUrl=https://images.example/wipe.iso",
        &format!("images.wipeSha256={DIGEST}"),
        "images.osUrl=https://images.example/os.iso",
        &format!("images.osSha256={DIGEST}"),
    ]
    .map(str::to_owned);
    let with =
        |extra: &[&str]| -> Vec<String> { base().into_iter().chain(extra.iter().map(|s| (*s).to_owned())).collect() };
    let mut cases = Vec::new();
    // The Redfish driver with everything, with each setting or each pair of settings left out,
    // with nothing.
    for (i, j) in (0..=redfish.len()).flat_map(|i| (i..=redfish.len()).map(move |j| (i, j))) {
        let mut case = with(&["drivers.bmc=redfish"]);
        case.extend(redfish.iter().enumerate().filter(|(k, _)| *k != i && *k != j).map(|(_, s)| s.clone()));
        cases.push(case);
    }
    cases.push(with(&["drivers.bmc=redfish"]));
    // Plain http, with and without the opt-in, and another scheme.
    for (k, url) in redfish.iter().enumerate().filter(|(_, s)| s.contains("Url=")) {
        for (scheme, insecure) in [("http", false), ("http", true), ("ftp", true)] {
            let mut case = with(&["drivers.bmc=redfish"]);
            case.extend(redfish.iter().enumerate().filter(|(i, _)| *i != k).map(|(_, s)| s.clone()));
            case.push(url.replacen("https", scheme, 1));
            if insecure {
                case.push("agent.insecureHttp=true".into());
            }
            cases.push(case);
        }
    }
    for bmc in ["none", "simulated"] {
        let driver = format!("drivers.bmc={bmc}");
        cases.push(with(&[&driver]));
        cases.push(with(&[&driver, "agent.insecureHttp=true"]));
        cases.push(with(&[&driver, "agent.baseUrl=https://agent.example"]));
        cases.push(with(&[&driver, "agent.baseUrl=http://agent.example"]));
        cases.push(with(&[&driver, "images.wipeUrl=http://images.example/wipe.iso"]));
        cases.push(with(&[&driver, "images.wipeSha256=ABC", "images.osSha256=0fe69a4d"]));
        cases.push(with(&[&driver, &format!("images.osSha256={DIGEST}")]));
    }
    // The kube driver, the listeners, the token keys.
    let no_stacks = |extra: &[&str]| -> Vec<String> {
        let mut case = with(extra);
        case.retain(|s| !s.starts_with("stacks."));
        case
    };
    cases.push(no_stacks(&[]));
    cases.push(no_stacks(&["drivers.kube=none"]));
    cases.push(no_stacks(&["drivers.kube=simulated"]));
    cases.push(with(&["stacks.persistentVolumeClaim.claimName=", "stacks.image.reference=registry.example/stacks:1"]));
    cases.push(with(&["metrics.port=8080"]));
    // The Slurm images' registry.
    cases.push(with(&["slurm.imageRegistry=registry.example:5000/mirror/slurm"]));
    cases.push(with(&["slurm.imageRegistry=https://registry.example/slurm"]));
    cases.push(with(&["slurm.imageRegistry=paddock.local/slurm/"]));
    cases.push(with(&["slurm.imageRegistry=paddock.local/slurm:26.05.5", "metrics.port=8080"]));
    cases.push(with(&["agent.listenPort=9090"]));
    cases.push(with(&["agent.listenPort=8080"]));
    cases.push(with(&["agent.service.enabled=false", "agent.listenPort=8080"]));
    let no_jwks = |extra: &[&str]| -> Vec<String> {
        let mut case = with(extra);
        case.retain(|s| !s.starts_with("jwt.jwksUrl"));
        case
    };
    cases.push(no_jwks(&[]));
    cases.push(no_jwks(&["secrets.generateHs256Secret=true"]));
    cases.push(no_jwks(&["jwt.publicKeysSecret=jwt-keys"]));
    cases.push(no_jwks(&["drivers.bmc=redfish", "metrics.port=8080"]));
    // The console's sign-in through the OIDC issuer: all or none, https, where the URLs point, keys.
    let oidc = |extra: &[&str]| -> Vec<String> {
        let mut case = with(&[
            "jwt.issuer=https://idp.example",
            "console.oidc.discoveryUrl=https://idp.example/.well-known/openid-configuration",
            "console.oidc.clientId=paddock-console",
            "console.oidc.redirectUri=https://paddock.example/console/",
        ]);
        case.extend(extra.iter().map(|s| (*s).to_owned()));
        case
    };
    cases.push(oidc(&[]));
    cases.push(with(&["console.oidc.clientId=paddock-console"]));
    cases.push(oidc(&["console.oidc.discoveryUrl=http://idp.example/.well-known/openid-configuration"]));
    cases.push(oidc(&["console.oidc.redirectUri=https://paddock.example/"]));
    cases.push(oidc(&["jwt.issuer=https://other.example"]));
    let mut keyless = oidc(&["secrets.generateHs256Secret=true"]);
    keyless.retain(|s| !s.starts_with("jwt.jwksUrl"));
    cases.push(keyless);
    cases
}

/// The verdicts of the chart and of its processes on one case; panics on a disagreement.
fn compare(helm: &Path, unchecked: &Path, mounts: &Path, case: &[String]) {
    let chart = render(helm, &repo().join("deploy/helm/paddock"), case);
    let docs = match &chart {
        Ok(docs) => docs.clone(),
        Err(_) => render(helm, unchecked, case).unwrap_or_else(|e| panic!("{case:?}: the unchecked chart: {e}")),
    };
    let mut refused = BTreeSet::new();
    for (process, env) in containers(&docs, mounts) {
        if let Err(why) = check_config(&process, &env) {
            assert!(why.contains("problem"), "{case:?}: `paddock check-config {process}` failed otherwise: {why}");
            refused.extend(subjects(&why));
        }
    }
    match chart {
        Ok(_) => assert!(refused.is_empty(), "{case:?}: the chart renders what the processes refuse: {refused:?}"),
        Err(why) => {
            assert!(!refused.is_empty(), "{case:?}: the chart refuses what the processes accept: {why}");
            assert_eq!(subjects(&why), refused, "{case:?}: the chart and the processes name other settings: {why}");
        }
    }
}

#[test]
fn the_chart_refuses_exactly_what_its_processes_refuse_and_names_the_same_settings() {
    let helm = helm();
    let scratch = Scratch::new("rules");
    let unchecked = unchecked_chart(&scratch);
    let cases = cases();
    assert!(cases.len() > 50, "{} cases", cases.len());
    // Two at a time: each case is a helm run or two and a few processes.
    let (left, right) = cases.split_at(cases.len() / 2);
    std::thread::scope(|s| {
        for (n, half) in [left, right].into_iter().enumerate() {
            let (helm, unchecked) = (&helm, &unchecked);
            let mounts = scratch.0.join(format!("mounts-{n}"));
            s.spawn(move || half.iter().for_each(|case| compare(helm, unchecked, &mounts, case)));
        }
    });
}

/// The `helm install` block of docs/operating.md's "Install with the chart", with the commands
/// before it in the same block.
fn install_example() -> String {
    let doc = std::fs::read_to_string(repo().join("docs/operating.md")).expect("docs/operating.md");
    let section = doc.split("## Install with the chart").nth(1).expect("the install section");
    let block = section.split("```sh\n").nth(1).and_then(|b| b.split("\n```").next()).expect("a sh block");
    assert!(block.contains("helm install"), "the install example: {block}");
    block.to_owned()
}

#[test]
fn the_install_example_renders_pods_that_start() {
    let helm = helm();
    let scratch = Scratch::new("example");
    // The images the example takes digests of, in the directory it runs in.
    for image in ["wipe.iso", "node-os.iso"] {
        std::fs::write(scratch.0.join(image), format!("the {image} image")).expect("an image");
    }
    std::os::unix::fs::symlink(repo().join("deploy"), scratch.0.join("deploy")).expect("the chart's path");
    // As written, with `helm install` rendering instead (no cluster here).
    let script = format!(
        "set -euo pipefail\nhelm() {{ [ \"$1\" = install ] && shift; \"{}\" template \"$@\"; }}\n{}",
        helm.display(),
        install_example()
    );
    let out = Command::new("bash").arg("-c").arg(&script).current_dir(&scratch.0).output().expect("running bash");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the install example does not render: {stderr}\n{script}");
    let docs = documents(&String::from_utf8_lossy(&out.stdout));
    let containers = containers(&docs, &scratch.0.join("mounts"));
    let processes: Vec<&str> = containers.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(processes, ["api", "worker", "migrate"], "the example's workloads");
    for (process, env) in &containers {
        if let Err(why) = check_config(process, env) {
            panic!("the install example's `paddock {process}` would refuse to start: {why}");
        }
    }
    let api = &containers[0].1;
    assert_eq!(api.get("PADDOCK_BMC_DRIVER").map(String::as_str), Some("redfish"), "{api:?}");
}
