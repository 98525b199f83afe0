//! The documents' command blocks, run as written against `paddock dev`, so they cannot rot:
//!
//! - the README's five-minute tour (the `sh` block under "The API in five minutes"), which also
//!   cleans up after itself: the dev world after it is the one before it (the same tenants, no
//!   cluster, every machine `available`) but for node-301, which it enrolled and retired, so a
//!   reader can go on with `scripts/clients --smoke` or the tour again;
//! - every `sh` block of docs/billing.md, in order: the billing pull step by step.
//!
//! Each runs under bash with the four variables the banner exports (read from the banner
//! itself): every `curl` in it must get a success (a 4xx or 5xx fails the run, through
//! `curl --fail-with-body`), every `jq` must parse what it got, every `until` loop must end.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// A document of the repository.
fn document(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path))
        .unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The ```sh blocks of a text, without their fences, in order.
fn sh_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some((_, after)) = rest.split_once("```sh\n") {
        let (block, tail) = after.split_once("\n```").expect("an sh block's end");
        blocks.push(block.to_owned());
        rest = tail;
    }
    blocks
}

/// The tour's block: the first ```sh fence after its heading.
fn tour() -> String {
    let readme = document("README.md");
    let section = readme.split_once("## The API in five minutes").expect("the tour's heading").1;
    sh_blocks(section).into_iter().next().expect("the tour's sh block")
}

/// Runs a script as a reader would paste it, in a directory of its own under dev's, with the
/// banner's variables; each command echoed (-x) so a failure shows where, `curl` failing on any
/// error status, five minutes in all. Returns what it printed.
fn run(dev: &support::Dev, name: &str, script: &str) -> String {
    let script =
        format!("set -euo pipefail -x\ncurl() {{ command curl --fail-with-body --max-time 30 \"$@\"; }}\n{script}\n");
    let work = dev.dir.join(name);
    std::fs::create_dir_all(&work).expect("the script's directory");
    let out = Command::new("timeout")
        .args(["300", "bash", "-c", &script])
        .current_dir(&work)
        .envs(dev.exports.iter().map(|(n, v)| (n.as_str(), v.as_str())))
        .output()
        .expect("running bash (and curl, jq)");
    let said = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{said}");
    assert!(out.status.success(), "{name} failed ({}):\n{said}", out.status);
    said
}

#[test]
fn the_readme_tour_runs_as_written_against_paddock_dev() {
    let dev = support::Dev::start();
    support::wait_ready(&dev);
    let before = settled_world(&dev);
    assert!(before.retired.is_empty() && before.machines.len() == 8, "dev's eight machines: {before:?}");

    let said = run(&dev, "tour", &tour());
    assert!(said.contains("not_found"), "the tour shows a problem's code:\n{said}");

    let after = settled_world(&dev);
    let mut expected = before;
    expected.retired.push("node-301".to_owned());
    assert_eq!(after, expected, "the tour leaves the dev world as it found it (node-301 retired)");
}

#[test]
fn the_billing_pull_runs_as_written_against_paddock_dev() {
    let billing = document("docs/billing.md");
    let blocks = sh_blocks(&billing);
    assert!(blocks.len() >= 2, "docs/billing.md has its dev setup and its pull: {blocks:?}");
    let dev = support::Dev::start();
    support::wait_ready(&dev);
    let said = run(&dev, "billing", &blocks.join("\n"));
    assert!(said.contains("\"type\":\"summary\""), "the pull shows the export's summary:\n{said}");
    assert!(said.contains("Signature Verified Successfully"), "openssl verified the manifest:\n{said}");
}

/// What a user of `paddock dev` sees of its world: the tenants by name, the demo tenant's
/// clusters, every machine's state (the list leaves retired machines out), the retired ones.
#[derive(Debug, PartialEq)]
struct World {
    tenants: Vec<String>,
    clusters: Vec<String>,
    machines: BTreeMap<String, String>,
    retired: Vec<String>,
}

/// The world once no machine is on its way anywhere (every one listed is `available`), read
/// through the API with the banner's tokens; two minutes at most (dev's wipes take seconds).
fn settled_world(dev: &support::Dev) -> World {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let world = runtime.block_on(read_world(dev));
        if world.machines.values().all(|s| s == "available") {
            return world;
        }
        assert!(Instant::now() < deadline, "dev's machines did not settle in two minutes: {world:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

async fn read_world(dev: &support::Dev) -> World {
    let http = reqwest::Client::new();
    let get = async |path: String, token: &str| -> serde_json::Value {
        let response = http.get(format!("{}{path}", dev.var("B"))).bearer_auth(token).send().await.expect("GET");
        assert!(response.status().is_success(), "GET {path}: {}", response.status());
        response.json().await.expect("a JSON body")
    };
    let names = |list: &serde_json::Value, field: &str| -> Vec<(String, String)> {
        let items = list["items"].as_array().expect("items");
        assert!(list["next_cursor"].is_null(), "one page holds dev's world");
        items.iter().map(|i| (i["name"].as_str().unwrap_or_default().to_owned(), i[field].to_string())).collect()
    };
    let (token, tenant_token) = (dev.var("TOKEN"), dev.var("TENANT_TOKEN"));
    let tenants = names(&get("/v1/tenants?limit=1000".into(), token).await, "state");
    let clusters_path = format!("/v1/tenants/{}/clusters?limit=1000", dev.var("TID"));
    let clusters = names(&get(clusters_path, tenant_token).await, "kind");
    let machines = names(&get("/v1/machines?limit=1000".into(), token).await, "state");
    let retired = names(&get("/v1/machines?state=retired&limit=1000".into(), token).await, "state");
    World {
        retired: retired.into_iter().map(|(n, _)| n).collect(),
        tenants: tenants.into_iter().map(|(n, _)| n).collect(),
        clusters: clusters.into_iter().map(|(n, _)| n).collect(),
        machines: machines.into_iter().map(|(n, s)| (n, s.trim_matches('"').to_owned())).collect(),
    }
}
