//! The wipe and first-boot agent as these tests play it, on the agent contract of docs/security.md:
//! the seed fetched from the URL the BMC was given (as the emulator fetched it), read with the
//! independent ISO reader (pycdlib, see paddock-seed's tests), its `paddock/agent.json` giving the
//! agent URL and token; `config` and `report` with that token as the bearer.

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

/// Complete evidence of each of `ids` wiped, as the real agent reports it.
pub fn wiped(ids: &[String]) -> Value {
    ids.iter().map(|id| drive(id, "success", None)).collect()
}

/// One drive's evidence with `result` (and `detail`); verified when it succeeded.
pub fn drive(id: &str, result: &str, detail: Option<&str>) -> Value {
    let verification = (result == "success")
        .then(|| json!({ "ranges": 66, "bytes_read": 66 * 1024 * 1024, "sha256": hex::encode(Sha256::digest(id)) }));
    json!({
        "id": id, "match_basis": "protocol_capacity",
        "identity": { "model": "emulated", "serial": null, "wwn": null, "eui": null, "size_bytes": 1u64 << 40, "protocol": "nvme" },
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

/// `POST /v1/agent/report` with `token`: the status.
pub async fn report(app: &TestApp, token: &str, body: &Value) -> u16 {
    app.post("/v1/agent/report").token(token).json(body).send().await.status.as_u16()
}
