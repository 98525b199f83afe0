//! The agents' endpoints: one-time tokens (hashed at rest, 404 unknown, 409 used, 410 expired),
//! the run's configuration, the NoCloud seed image, and the report that proves a wipe only when
//! every listed drive was wiped.

use std::time::Duration;

use paddock_service::agent::AgentRun;
use paddock_testkit::{admin, TestApp};
use paddock_types::agent::AgentPurpose;
use serde_json::{json, Value};

use crate::common::{id, machine, machine_class};

async fn wipe_token(app: &TestApp, ttl: Duration) -> (String, String) {
    machine_class(app, "gpu", 8).await;
    let m = machine(app, "node-1", "gpu").await;
    let run = AgentRun {
        machine_id: id(&m).parse().expect("machine id"),
        run_id: uuid::Uuid::now_v7(),
        purpose: AgentPurpose::Wipe,
        config: json!({ "drives": [{ "id": "nvme0", "capacity_bytes": 3840755982336u64 }, { "id": "nvme1" }] }),
    };
    let token = app.services.agent_token_issue(&run, ttl).await.expect("issue");
    (token, id(&m))
}

fn report(drives: Value) -> Value {
    json!({ "result": "success", "drives": drives, "started_at": "2026-11-30T10:00:00Z", "finished_at": "2026-11-30T10:07:00Z" })
}

async fn verified(app: &TestApp) -> Option<bool> {
    sqlx::query_scalar("select verified from agent_tokens").fetch_one(&app.db.pool).await.expect("token row")
}

#[tokio::test]
async fn a_wipe_run_fetches_its_config_and_seed_and_reports_once() {
    let app = TestApp::new().await;
    let (token, machine_id) = wipe_token(&app, Duration::from_secs(3600)).await;

    let config = app.get(format!("/v1/agent/{token}/config")).send().await.expect(200).json();
    assert_eq!(config["purpose"], "wipe");
    assert_eq!(config["machine"], json!({ "id": machine_id, "name": "node-1" }));
    assert_eq!(config["config"]["drives"][1]["id"], "nvme1");
    assert_eq!(config["report_url"], format!("http://127.0.0.1:8080/v1/agent/{token}/report"));

    let seed = app.get(format!("/v1/agent/{token}/seed.iso")).send().await.expect(200);
    assert_eq!(seed.header("content-type"), Some("application/x-iso9660-image"));
    assert_eq!(seed.body.len() % 2048, 0);
    assert_eq!(&seed.body[0x8001..0x8006], b"CD001", "an ISO 9660 primary volume descriptor");
    assert_eq!(&seed.body[0x8028..0x802e], b"cidata", "the NoCloud volume label");

    let drives = json!([
        { "id": "nvme0", "method": "nvme-format", "result": "success" },
        { "id": "nvme1", "method": "nvme-format", "result": "success", "detail": "crypto erase" }
    ]);
    app.post(format!("/v1/agent/{token}/report")).json(&report(drives.clone())).send().await.expect(204);
    assert_eq!(verified(&app).await, Some(true));
    // Used up: every endpoint now answers 409.
    app.post(format!("/v1/agent/{token}/report")).json(&report(drives)).send().await.problem(409, "agent_token_used");
    app.get(format!("/v1/agent/{token}/config")).send().await.problem(409, "agent_token_used");
    app.get(format!("/v1/agent/{token}/seed.iso")).send().await.problem(409, "agent_token_used");

    let events = app.get("/v1/audit-events?action=agent.report").token(&admin()).send().await.expect(200).json();
    assert_eq!(events["items"][0]["actor"]["sub"], "agent:node-1");
    assert_eq!(events["items"][0]["details"]["verified"], true);
}

#[tokio::test]
async fn a_wipe_is_verified_only_when_every_listed_drive_was_wiped() {
    for drives in [
        json!([{ "id": "nvme0", "method": "nvme-format", "result": "success" }]),
        json!([{ "id": "nvme0", "method": "nvme-format", "result": "success" }, { "id": "nvme1", "method": "nvme-format", "result": "failure", "detail": "I/O error" }]),
        json!([{ "id": "nvme0", "method": "x", "result": "success" }, { "id": "sda", "method": "x", "result": "success" }]),
    ] {
        let app = TestApp::new().await;
        let (token, _) = wipe_token(&app, Duration::from_secs(3600)).await;
        app.post(format!("/v1/agent/{token}/report")).json(&report(drives.clone())).send().await.expect(204);
        assert_eq!(verified(&app).await, Some(false), "{drives}");
    }
    let app = TestApp::new().await;
    let (token, _) = wipe_token(&app, Duration::from_secs(3600)).await;
    let mut failed = report(
        json!([{ "id": "nvme0", "method": "x", "result": "success" }, { "id": "nvme1", "method": "x", "result": "success" }]),
    );
    failed["result"] = json!("failure");
    app.post(format!("/v1/agent/{token}/report")).json(&failed).send().await.expect(204);
    assert_eq!(verified(&app).await, Some(false), "an overall failure is never a verified wipe");
}

#[tokio::test]
async fn unknown_expired_and_malformed_tokens_and_reports() {
    let app = TestApp::new().await;
    app.get("/v1/agent/not-a-token/config").send().await.problem(404, "not_found");
    let well_formed_but_unknown = "A".repeat(43);
    app.get(format!("/v1/agent/{well_formed_but_unknown}/config")).send().await.problem(404, "not_found");

    let (token, _) = wipe_token(&app, Duration::from_secs(3600)).await;
    let problem = app
        .post(format!("/v1/agent/{token}/report"))
        .json(&json!({ "result": "success", "drives": [], "started_at": "2026-11-30T10:00:00Z", "finished_at": "2026-11-30T09:00:00Z" }))
        .send()
        .await
        .problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["field"], "finished_at");
    assert!(!problem["instance"].as_str().expect("instance").contains(&token), "the token never shows in a problem");
    app.post(format!("/v1/agent/{token}/report"))
        .json(&json!({ "result": "maybe" }))
        .send()
        .await
        .problem(422, "validation_failed");
    assert_eq!(verified(&app).await, None, "a refused report does not use the token up");

    sqlx::query("update agent_tokens set expires_at = now() - interval '1 second'")
        .execute(&app.db.pool)
        .await
        .expect("expire");
    app.get(format!("/v1/agent/{token}/config")).send().await.problem(410, "agent_token_expired");
    let drives = json!([{ "id": "nvme0", "method": "x", "result": "success" }, { "id": "nvme1", "method": "x", "result": "success" }]);
    app.post(format!("/v1/agent/{token}/report"))
        .json(&report(drives))
        .send()
        .await
        .problem(410, "agent_token_expired");
}

#[tokio::test]
async fn tokens_are_stored_hashed_and_never_reach_metrics() {
    let app = TestApp::new().await;
    let (token, _) = wipe_token(&app, Duration::from_secs(3600)).await;
    app.get(format!("/v1/agent/{token}/config")).send().await.expect(200);
    let stored: Vec<u8> =
        sqlx::query_scalar("select token_sha256 from agent_tokens").fetch_one(&app.db.pool).await.expect("row");
    assert_eq!(stored.len(), 32);
    let dump: String = sqlx::query_scalar("select row_to_json(t)::text from agent_tokens t")
        .fetch_one(&app.db.pool)
        .await
        .expect("row");
    assert!(!dump.contains(&token), "the token is stored in clear");
    assert!(!dump.contains("nvme0"), "the run's configuration is stored in clear");
    let metrics = String::from_utf8(app.get("/metrics").send().await.expect(200).body.to_vec()).expect("utf8");
    assert!(!metrics.contains(&token));
    assert!(metrics.contains(r#"route="/v1/agent/{token}/config""#), "{metrics}");
}

#[tokio::test]
async fn a_wipe_without_drives_cannot_be_issued() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let m = machine(&app, "node-1", "gpu").await;
    let run = AgentRun {
        machine_id: id(&m).parse().expect("machine id"),
        run_id: uuid::Uuid::now_v7(),
        purpose: AgentPurpose::Wipe,
        config: json!({ "drives": [] }),
    };
    assert!(app.services.agent_token_issue(&run, Duration::from_secs(60)).await.is_err());
    assert_eq!(app.count("agent_tokens").await, 0);
}
