//! The wipe and first-boot agent as these tests play it, on the agent contract of docs/security.md:
//! the seed fetched from the URL the BMC was given (as the emulator fetched it), read with the
//! independent ISO reader (pycdlib, see paddock-seed's tests), its `paddock/agent.json` giving the
//! agent URL and token; `config` and `report` with that token as the bearer.

use paddock_domain::agent::{verified_bytes, zeros_sha256};
use paddock_testkit::TestApp;
use paddock_types::agent::AgentSeed;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

#[path = "../../../paddock-seed/tests/seed/reader.rs"]
#[expect(dead_code, reason = "the seed tests' ISO reader, shared by path: this file uses part of it")]
mod reader;

/// What the tests' image servers serve for any image: 64 KiB of 0x42.
pub fn served_image() -> Vec<u8> {
    vec![0x42u8; 64 * 1024]
}

/// The SHA-256 of [`served_image`]: the wipe and OS images' digest the tests configure.
pub fn image_sha256() -> String {
    hex::encode(Sha256::digest(served_image()))
}

/// The run's seed at `seed_path` (`/v1/agent/seed/<seed token>.iso`), as the machine reads it:
/// `paddock/agent.json`, through pycdlib (locally, without it, through paddock-seed's own reader,
/// with a notice; under `CI=true` pycdlib is required).
pub async fn seed(app: &TestApp, seed_path: &str) -> AgentSeed {
    let iso = app.get(seed_path).send().await.expect(200);
    assert_eq!(&iso.body[0x8001..0x8006], b"CD001", "an ISO 9660 seed");
    assert_eq!(&iso.body[0x8028..0x802e], b"cidata", "the NoCloud label");
    assert!(iso.body.len() >= 1_474_560, "a seed fills at least a floppy");
    // Tests run in parallel: each read gets a scratch file of its own.
    let scratch = format!("worker-seed-{}", uuid::Uuid::now_v7());
    let json = match reader::read_with_pycdlib(&scratch, &iso.body) {
        Some(seen) => {
            let files = seen.files("joliet");
            let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, ["meta-data", "paddock/agent.json", "user-data"], "the seed's files");
            files.into_iter().find(|(n, _)| n == "paddock/agent.json").map(|(_, d)| d).expect("agent.json")
        }
        None => paddock_seed::read_file(&iso.body, "paddock/agent.json").expect("paddock/agent.json"),
    };
    serde_json::from_slice(&json).expect("agent.json as the contract says")
}

/// `GET /v1/agent/config` with `token`.
pub async fn config(app: &TestApp, token: &str) -> Value {
    app.get("/v1/agent/config").token(token).send().await.expect(200).json()
}

/// Complete evidence of each of `ids` wiped, as the real agent reports it ([`report`] fills in
/// each drive's identity and verification as the drive the run listed).
pub fn wiped(ids: &[String]) -> Value {
    ids.iter().map(|id| drive(id, "success", None)).collect()
}

/// One drive's evidence with `result` (and `detail`); verified when it succeeded.
pub fn drive(id: &str, result: &str, detail: Option<&str>) -> Value {
    let verification = (result == "success").then(|| json!({ "ranges": 66, "bytes_read": 0, "sha256": "" }));
    json!({
        "id": id, "match_basis": "protocol_capacity",
        "identity": { "model": "emulated", "serial": null, "wwn": null, "eui": null, "size_bytes": 0, "protocol": null },
        "method": "nvme-format-user-data", "result": result, "detail": detail, "verification": verification,
    })
}

/// A report body of `result` with `drives`, naming the image the tests serve.
pub fn report_body(result: &str, drives: Value) -> Value {
    json!({
        "result": result, "drives": drives, "image_sha256": image_sha256(),
        "started_at": chrono::Utc::now() - chrono::Duration::minutes(5), "finished_at": chrono::Utc::now(),
    })
}

/// `POST /v1/agent/report` with `token`: the status. While the run is open, the body is first
/// completed as the agent sees its machine: the run's nonce, each listed drive's identity as the
/// BMC reported it (matched by a unique serial, else by protocol and capacity), a verification of
/// the contract's ranges read back as zeroes where the body has one, and every drive as a disk
/// the agent saw.
pub async fn report(app: &TestApp, token: &str, body: &Value) -> u16 {
    let mut body = body.clone();
    let open = app.get("/v1/agent/config").token(token).send().await;
    if open.status.as_u16() == 200 {
        complete(&mut body, &open.json());
    }
    app.post("/v1/agent/report").token(token).json(&body).send().await.status.as_u16()
}

fn complete(body: &mut Value, config: &Value) {
    body["nonce"] = config["nonce"].clone();
    let listed = config["config"]["drives"].as_array().cloned().unwrap_or_default();
    let drives = body["drives"].as_array_mut().expect("drives");
    for d in drives.iter_mut() {
        let Some(l) = listed.iter().find(|l| l["id"] == d["id"]) else { continue };
        let unique = l["serial"].is_string() && listed.iter().filter(|o| o["serial"] == l["serial"]).count() == 1;
        d["match_basis"] = json!(if unique { "serial" } else { "protocol_capacity" });
        let size = l["capacity_bytes"].as_u64().unwrap_or(0);
        d["identity"]["serial"] = l["serial"].clone();
        d["identity"]["size_bytes"] = json!(size);
        d["identity"]["protocol"] = l["protocol"].clone();
        if d["verification"].is_object() && d["verification"]["sha256"] == "" {
            let bytes = verified_bytes(size);
            d["verification"]["bytes_read"] = json!(bytes);
            d["verification"]["sha256"] = json!(zeros_sha256(bytes));
        }
    }
    let devices: Vec<Value> = drives
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let action = if d["result"] == "success" { "wiped" } else { "wipe_failed" };
            json!({ "name": format!("disk{i}"), "kind": "disk", "action": action, "reason": "a disk of the machine" })
        })
        .collect();
    body["devices"] = json!(devices);
}
