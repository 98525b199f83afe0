//! The agents' endpoints (docs/security.md): the seed token only in the seed's URL, the agent token
//! (derived, found in the seed's `paddock/agent.json`) as the bearer of `config` and `report`,
//! both stored only hashed; 404 unknown, 409 used, 410 expired; the report that proves a wipe only
//! with complete evidence of every drive from the configured image.

use std::time::Duration;

use paddock_domain::agent::{verified_bytes, zeros_sha256, SIMULATED_OS_IMAGE_SHA256, SIMULATED_WIPE_IMAGE_SHA256};
use paddock_domain::secret::SecretString;
use paddock_service::agent::AgentRun;
use paddock_testkit::{admin, TestApp};
use paddock_types::agent::{AgentRunConfig, AgentSeed};
use serde_json::{json, Value};

use crate::common::{id, machine, machine_class};

/// A wipe run of a new machine `node-1` listing `nvme0` and `nvme1`: its seed token and the
/// machine's id.
async fn wipe_run(app: &TestApp, ttl: Duration) -> (SecretString, String) {
    machine_class(app, "gpu", 8).await;
    let m = machine(app, "node-1", "gpu").await;
    let run = AgentRun {
        machine_id: id(&m).parse().expect("machine id"),
        run_id: uuid::Uuid::now_v7(),
        config: wipe_config(json!({ "drives": [
            { "id": "nvme0", "serial": "S0", "capacity_bytes": 3840755982336u64, "protocol": "nvme" },
            { "id": "nvme1", "serial": null, "capacity_bytes": 1920383410176u64, "protocol": "SATA" },
        ] })),
    };
    let seed = app.services.agent_token_issue(&run, ttl).await.expect("issue");
    (seed, id(&m))
}

/// A wipe's configuration from its JSON.
fn wipe_config(config: Value) -> AgentRunConfig {
    AgentRunConfig::Wipe(serde_json::from_value(config).expect("a wipe's configuration"))
}

fn seed_path(seed: &SecretString) -> String {
    format!("/v1/agent/seed/{}.iso", seed.expose())
}

/// The seed as the machine finds it, and the agent token in its `paddock/agent.json`.
async fn agent_seed(app: &TestApp, seed: &SecretString) -> AgentSeed {
    let iso = app.get(seed_path(seed)).send().await.expect(200);
    assert_eq!(iso.header("content-type"), Some("application/x-iso9660-image"));
    let json = paddock_seed::read_file(&iso.body, "paddock/agent.json").expect("paddock/agent.json in the seed");
    serde_json::from_slice(&json).expect("agent.json")
}

/// Complete evidence of a wiped drive: `nvme0` (matched by its unique serial), `nvme1` (no
/// serial: by protocol and capacity), or a drive the BMC did not list.
fn wiped(id: Option<&str>) -> Value {
    let (basis, serial, size, protocol) = match id {
        Some("nvme1") => ("protocol_capacity", None, 1920383410176u64, "sata"),
        Some(_) => ("serial", Some("S0"), 3840755982336u64, "nvme"),
        None => ("serial", Some("S9"), 3840755982336u64, "nvme"),
    };
    let bytes = verified_bytes(size);
    json!({
        "id": id, "match_basis": id.map(|_| basis),
        "identity": { "model": "M", "serial": serial, "wwn": null, "eui": null, "size_bytes": size, "protocol": protocol },
        "method": "nvme-sanitize-crypto", "result": "success", "detail": null,
        "verification": { "ranges": 66, "bytes_read": bytes, "sha256": zeros_sha256(bytes) },
    })
}

/// A report of `drives`, each a disk the agent saw and wiped, beside the CD it booted from.
fn report(drives: Value) -> Value {
    let count = drives.as_array().map_or(0, Vec::len);
    let mut devices: Vec<Value> = (0..count)
        .map(|i| json!({ "name": format!("nvme{i}n1"), "kind": "disk", "action": "wiped", "reason": "a disk" }))
        .collect();
    devices.push(json!({ "name": "sr0", "kind": "cd", "action": "left", "reason": "the wipe image" }));
    let now = chrono::Utc::now();
    json!({
        "result": "success", "drives": drives, "devices": devices, "image_sha256": SIMULATED_WIPE_IMAGE_SHA256,
        "started_at": now - chrono::Duration::minutes(1), "finished_at": now,
    })
}

/// Posts `body` with the run's nonce (unless `body` sets its own): the status.
async fn post_report(app: &TestApp, token: &str, mut body: Value) -> u16 {
    if body.get("nonce").is_none() {
        body["nonce"] = app.get("/v1/agent/config").token(token).send().await.expect(200).json()["nonce"].clone();
    }
    app.post("/v1/agent/report").token(token).json(&body).send().await.status.as_u16()
}

async fn verdict(app: &TestApp) -> (Option<bool>, Option<String>) {
    sqlx::query_as("select verified, failure from agent_tokens").fetch_one(&app.db.pool).await.expect("token row")
}

#[tokio::test]
async fn a_wipe_run_fetches_its_seed_and_config_and_reports_once() {
    let app = TestApp::new().await;
    let (seed, machine_id) = wipe_run(&app, Duration::from_secs(3600)).await;

    let found = agent_seed(&app, &seed).await;
    assert_eq!(found.agent_url, "http://127.0.0.1:8080");
    assert_eq!(found.machine_id.to_string(), machine_id);
    assert_eq!(found.ca_cert, None);
    assert_ne!(found.agent_token, seed.expose(), "the agent token is derived, not the seed token");
    assert_eq!(agent_seed(&app, &seed).await, found, "the seed may be fetched again until the report");
    let token = found.agent_token;

    let config = app.get("/v1/agent/config").token(&token).send().await.expect(200).json();
    assert_eq!(config["purpose"], "wipe");
    assert_eq!(config["machine"], json!({ "id": machine_id, "name": "node-1" }));
    assert_eq!(config["run_id"], found.run_id.to_string());
    assert_eq!(
        config["config"]["drives"][0],
        json!({ "id": "nvme0", "serial": "S0", "capacity_bytes": 3840755982336u64, "protocol": "nvme" })
    );
    assert_eq!(config["config"]["drives"][1]["id"], "nvme1");
    assert_eq!(config["nonce"].as_str().expect("nonce").len(), 43);
    assert!(config.get("report_url").is_none(), "the agent derives its URLs from agent_url");

    // Each token works only where it belongs, and neither is a JWT.
    app.get("/v1/agent/config").send().await.problem(401, "missing_token");
    app.get("/v1/agent/config").token(seed.expose()).send().await.problem(404, "not_found");
    app.get(format!("/v1/agent/seed/{token}.iso")).send().await.problem(404, "not_found");
    app.get(format!("/v1/agent/seed/{}", seed.expose())).send().await.problem(404, "not_found");
    assert_eq!(app.get("/v1/machines").token(&token).send().await.status.as_u16(), 401);

    let mut body = report(json!([wiped(Some("nvme0")), wiped(Some("nvme1")), wiped(None)]));
    body["nonce"] = config["nonce"].clone();
    app.post("/v1/agent/report").token(&token).json(&body).send().await.expect(204);
    assert_eq!(verdict(&app).await, (Some(true), None));
    // Used up: every endpoint now answers 409.
    app.post("/v1/agent/report").token(&token).json(&body).send().await.problem(409, "agent_token_used");
    app.get("/v1/agent/config").token(&token).send().await.problem(409, "agent_token_used");
    app.get(seed_path(&seed)).send().await.problem(409, "agent_token_used");

    let events = app.get("/v1/audit-events?action=agent.report").token(&admin()).send().await.expect(200).json();
    assert_eq!(events["items"][0]["actor"]["sub"], "agent:node-1");
    assert_eq!(events["items"][0]["details"]["verified"], true);
    assert_eq!(events["items"][0]["details"]["image_sha256"], SIMULATED_WIPE_IMAGE_SHA256);
    let audit = events.to_string();
    assert!(!audit.contains(&token) && !audit.contains(seed.expose()), "no token in the audit trail");
}

#[tokio::test]
async fn a_wipe_is_verified_only_with_complete_evidence_of_every_drive_from_the_wipe_image() {
    let mut no_verification = wiped(Some("nvme1"));
    no_verification["verification"] = Value::Null;
    let mut unknown_method = wiped(Some("nvme1"));
    unknown_method["method"] = json!("sim-overwrite");
    let mut few_ranges = wiped(Some("nvme1"));
    few_ranges["verification"]["ranges"] = json!(65);
    let mut failed = wiped(Some("nvme1"));
    failed["result"] = json!("failure");
    failed["detail"] = json!("I/O error");
    let mut stranger_failed = wiped(None);
    stranger_failed["result"] = json!("failure");
    let mut other_image = report(json!([wiped(Some("nvme0")), wiped(Some("nvme1"))]));
    other_image["image_sha256"] = json!("b".repeat(64));
    let mut overall_failure = report(json!([wiped(Some("nvme0")), wiped(Some("nvme1"))]));
    overall_failure["result"] = json!("failure");
    for (body, why) in [
        (report(json!([wiped(Some("nvme0"))])), "drive nvme1: not reported (the agent did not find it)"),
        (report(json!([wiped(Some("nvme0")), failed])), "drive nvme1: wipe failed (I/O error)"),
        (report(json!([wiped(Some("nvme0")), unknown_method])), "drive nvme1: unknown method \"sim-overwrite\""),
        (report(json!([wiped(Some("nvme0")), no_verification])), "drive nvme1: verification missing"),
        (
            report(json!([wiped(Some("nvme0")), few_ranges])),
            "drive nvme1: verification read 65 ranges, not the contract's 66",
        ),
        (
            report(json!([wiped(Some("nvme0")), wiped(Some("nvme1")), stranger_failed])),
            "unlisted drive with serial S9: wipe failed",
        ),
        (
            report(json!([wiped(Some("nvme0")), wiped(Some("nvme1")), wiped(Some("sda"))])),
            "drive sda: not a drive of this run's configuration",
        ),
        (other_image, "image: the agent booted image bbbb"),
        (overall_failure, "the agent reported failure"),
    ] {
        let app = TestApp::new().await;
        let (seed, _) = wipe_run(&app, Duration::from_secs(3600)).await;
        let token = agent_seed(&app, &seed).await.agent_token;
        assert_eq!(post_report(&app, &token, body.clone()).await, 204, "{body}");
        let (verified, failure) = verdict(&app).await;
        assert_eq!(verified, Some(false), "{body}");
        let failure = failure.expect("a reason");
        assert!(failure.starts_with(why), "{failure:?} should start with {why:?}");
    }
}

/// Evidence that contradicts the BMC's inventory or itself (what a forged report carried: serials
/// not the BMC's, a 1-byte size for a 3.8 TB drive, one byte read for 66 ranges, an all-zero
/// digest, no nonce), or leaves a disk the agent saw unwiped, is recorded but verifies nothing,
/// and the reason names the check.
#[tokio::test]
async fn evidence_contradicting_the_inventory_or_itself_fails_naming_the_check() {
    let two = || [wiped(Some("nvme0")), wiped(Some("nvme1"))];
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut body = report(json!(two()));
        f(&mut body);
        body
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            edit(&|b| b["drives"][0]["identity"]["serial"] = json!("FORGED")),
            "drive nvme0: serial Some(\"FORGED\") is not the inventory's",
        ),
        (
            edit(&|b| b["drives"][0]["identity"]["size_bytes"] = json!(1)),
            "drive nvme0: size 1 bytes is not the inventory's 3840755982336",
        ),
        (
            edit(&|b| b["drives"][0]["verification"]["bytes_read"] = json!(1)),
            "drive nvme0: verification read 1 bytes, but its ranges hold 6291456",
        ),
        (
            edit(&|b| b["drives"][0]["verification"]["sha256"] = json!("0".repeat(64))),
            "drive nvme0: verification digest 0000",
        ),
        (
            edit(&|b| b["drives"][1]["match_basis"] = json!("serial")),
            "drive nvme1: matched by Some(Serial), but the inventory calls for ProtocolCapacity",
        ),
        (
            edit(&|b| b["drives"][1]["identity"]["protocol"] = json!("nvme")),
            "drive nvme1: protocol Some(\"nvme\") is not the inventory's",
        ),
        (edit(&|b| b["nonce"] = Value::Null), "nonce: missing"),
        (edit(&|b| b["started_at"] = json!("2026-01-01T00:00:00Z")), "times: started_at 2026-01-01"),
        (edit(&|b| b["finished_at"] = json!("2099-01-01T00:00:00Z")), "times: finished_at 2099-01-01"),
        (
            edit(&|b| {
                b["devices"][0] =
                    json!({ "name": "vdc", "kind": "disk", "action": "left", "reason": "carries a cidata volume" })
            }),
            "device vdc: a disk of the machine was not wiped (carries a cidata volume)",
        ),
        (edit(&|b| b["devices"] = json!([])), "devices: the report lists no block device"),
    ];
    for (body, why) in cases {
        let app = TestApp::new().await;
        let (seed, _) = wipe_run(&app, Duration::from_secs(3600)).await;
        let token = agent_seed(&app, &seed).await.agent_token;
        assert_eq!(post_report(&app, &token, body.clone()).await, 204, "{body}");
        let (verified, failure) = verdict(&app).await;
        assert_eq!(verified, Some(false), "{body}");
        let failure = failure.expect("a reason");
        assert!(failure.starts_with(why), "{failure:?} should start with {why:?}");
    }
}

#[tokio::test]
async fn unknown_expired_and_malformed_tokens_and_reports() {
    let app = TestApp::new().await;
    app.get("/v1/agent/config").token("not-a-token").send().await.problem(404, "not_found");
    let well_formed_but_unknown = "A".repeat(43);
    app.get("/v1/agent/config").token(&well_formed_but_unknown).send().await.problem(404, "not_found");
    app.get(format!("/v1/agent/seed/{well_formed_but_unknown}.iso")).send().await.problem(404, "not_found");

    let (seed, _) = wipe_run(&app, Duration::from_secs(3600)).await;
    let token = agent_seed(&app, &seed).await.agent_token;
    let mut backwards = report(json!([]));
    backwards["finished_at"] = json!("2026-11-30T09:00:00Z");
    let problem =
        app.post("/v1/agent/report").token(&token).json(&backwards).send().await.problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["field"], "finished_at");
    assert!(!problem.to_string().contains(&token), "the token never shows in a problem");
    let problem =
        app.get(format!("/v1/agent/seed/{well_formed_but_unknown}.iso")).send().await.problem(404, "not_found");
    assert_eq!(problem["instance"], "/v1/agent/seed/[redacted].iso", "the seed token never shows in a problem");
    app.post("/v1/agent/report")
        .token(&token)
        .json(&json!({ "result": "maybe" }))
        .send()
        .await
        .problem(422, "validation_failed");
    let mut bad = report(json!([wiped(Some("nvme0"))]));
    bad["nonce"] = json!("not-this-runs-nonce");
    bad["image_sha256"] = json!("not hex");
    let problem = app.post("/v1/agent/report").token(&token).json(&bad).send().await.problem(422, "validation_failed");
    let fields: Vec<&str> =
        problem["errors"].as_array().expect("errors").iter().filter_map(|e| e["field"].as_str()).collect();
    assert_eq!(fields, ["image_sha256", "nonce"]);
    assert_eq!(verdict(&app).await, (None, None), "a refused report does not use the run up");

    sqlx::query("update agent_tokens set expires_at = now() - interval '1 second'")
        .execute(&app.db.pool)
        .await
        .expect("expire");
    app.get("/v1/agent/config").token(&token).send().await.problem(410, "agent_token_expired");
    app.get(seed_path(&seed)).send().await.problem(410, "agent_token_expired");
    let drives = json!([wiped(Some("nvme0")), wiped(Some("nvme1"))]);
    app.post("/v1/agent/report").token(&token).json(&report(drives)).send().await.problem(410, "agent_token_expired");
}

#[tokio::test]
async fn tokens_are_stored_hashed_and_never_reach_metrics() {
    let app = TestApp::new().await;
    let (seed, _) = wipe_run(&app, Duration::from_secs(3600)).await;
    let token = agent_seed(&app, &seed).await.agent_token;
    app.get("/v1/agent/config").token(&token).send().await.expect(200);
    let (seed_hash, agent_hash): (Vec<u8>, Vec<u8>) =
        sqlx::query_as("select seed_sha256, agent_sha256 from agent_tokens")
            .fetch_one(&app.db.pool)
            .await
            .expect("row");
    use sha2::Digest;
    assert_eq!(seed_hash, sha2::Sha256::digest(seed.expose().as_bytes()).to_vec());
    assert_eq!(agent_hash, sha2::Sha256::digest(token.as_bytes()).to_vec());
    let dump: String = sqlx::query_scalar("select row_to_json(t)::text from agent_tokens t")
        .fetch_one(&app.db.pool)
        .await
        .expect("row");
    assert!(!dump.contains(&token) && !dump.contains(seed.expose()), "a token is stored in clear");
    assert!(!dump.contains("nvme0"), "the run's configuration is stored in clear");
    let metrics = String::from_utf8(app.get("/metrics").send().await.expect(200).body.to_vec()).expect("utf8");
    assert!(!metrics.contains(&token) && !metrics.contains(seed.expose()));
    assert!(metrics.contains(r#"route="/v1/agent/config""#), "{metrics}");
    assert!(metrics.contains(r#"route="/v1/agent/seed/{seed_file}""#), "{metrics}");
}

#[tokio::test]
async fn a_wipe_without_drives_cannot_be_issued() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let m = machine(&app, "node-1", "gpu").await;
    let run = AgentRun {
        machine_id: id(&m).parse().expect("machine id"),
        run_id: uuid::Uuid::now_v7(),
        config: wipe_config(json!({ "drives": [] })),
    };
    assert!(app.services.agent_token_issue(&run, Duration::from_secs(60)).await.is_err());
    assert_eq!(app.count("agent_tokens").await, 0);
}

/// A NUL in a report's text (a drive's `detail`) is a 422 naming it, and the run is not used up
/// (it once reached PostgreSQL and failed as a 500).
#[tokio::test]
async fn a_control_character_in_a_report_is_422_and_leaves_the_run_open() {
    let app = TestApp::new().await;
    let (seed, _) = wipe_run(&app, Duration::from_secs(3600)).await;
    let token = agent_seed(&app, &seed).await.agent_token;
    let mut drive = wiped(Some("nvme0"));
    drive["detail"] = json!("sanitize\u{0}done");
    let problem = app
        .post("/v1/agent/report")
        .token(&token)
        .json(&report(json!([drive])))
        .send()
        .await
        .problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["field"], "drives[0].detail", "{problem}");
    assert_eq!(verdict(&app).await, (None, None), "a refused report does not use the run up");
}

/// A provisioning run of a new machine `node-p`: its seed token.
async fn provision_run(app: &TestApp) -> SecretString {
    machine_class(app, "gpu", 8).await;
    let m = machine(app, "node-p", "gpu").await;
    let config = json!({
        "node_name": "m-1", "api_endpoint": "https://10.0.0.1:6443", "ca_cert": "-----BEGIN CERTIFICATE-----",
        "ca_cert_hash": format!("sha256:{}", "a".repeat(64)), "bootstrap_token": "abcdef.0123456789abcdef",
        "node_taints": [{ "key": "gpu", "value": "true", "effect": "NoSchedule" }],
        "os_image_sha256": SIMULATED_OS_IMAGE_SHA256, "join": { "cluster_id": "c" },
    });
    let run = AgentRun {
        machine_id: id(&m).parse().expect("machine id"),
        run_id: uuid::Uuid::now_v7(),
        config: AgentRunConfig::Provision(serde_json::from_value(config).expect("a provisioning config")),
    };
    app.services.agent_token_issue(&run, Duration::from_secs(3600)).await.expect("issue")
}

#[tokio::test]
async fn a_provisioning_run_serves_its_typed_config_and_its_failure_names_the_installers_reason() {
    let app = TestApp::new().await;
    let seed = provision_run(&app).await;
    let token = agent_seed(&app, &seed).await.agent_token;
    let config: Value = app.get("/v1/agent/config").token(&token).send().await.expect(200).json();
    assert_eq!(config["purpose"], "provision");
    assert_eq!(config["config"]["os_image_sha256"], SIMULATED_OS_IMAGE_SHA256);
    assert_eq!(config["config"]["node_taints"][0]["effect"], "NoSchedule");
    assert_eq!(config["config"]["join"]["cluster_id"], "c");

    let now = chrono::Utc::now();
    let mut body = json!({
        "result": "failure", "image_sha256": SIMULATED_OS_IMAGE_SHA256,
        "started_at": now - chrono::Duration::minutes(1), "finished_at": now,
        "failure": { "code": "Not Snake", "message": "x" },
    });
    let problem = app.post("/v1/agent/report").token(&token).json(&body).send().await.problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["field"], "failure.code", "{problem}");
    assert_eq!(verdict(&app).await, (None, None), "a refused report does not use the run up");

    body["failure"] = json!({ "code": "ca_pin_mismatch", "message": "the API server's CA is not the pinned one" });
    assert_eq!(post_report(&app, &token, body).await, 204);
    let (verified, failure) = verdict(&app).await;
    assert_eq!(verified, Some(false));
    assert_eq!(
        failure.as_deref(),
        Some("the installer failed: ca_pin_mismatch: the API server's CA is not the pinned one")
    );
}
