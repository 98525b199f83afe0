//! Tenants: create, read, patch, suspend, resume, delete.

use paddock_testkit::{admin, TestApp};
use serde_json::json;

use crate::common::{id, tenant};

#[tokio::test]
async fn tenant_create_returns_201_with_location_etag_and_defaults() {
    let app = TestApp::new().await;
    let resp = app
        .post("/v1/tenants")
        .token(&admin())
        .header("x-request-id", "req-create-1")
        .json(&json!({ "name": "acme", "labels": { "plan": "gold" }, "quotas": { "max_nodes": 8 } }))
        .send()
        .await
        .expect(201);
    let body = resp.json();
    assert_eq!(resp.header("location"), Some(format!("/v1/tenants/{}", id(&body)).as_str()));
    assert_eq!(resp.header("etag"), Some("\"1\""));
    assert_eq!(body["etag"], "\"1\"");
    assert_eq!(body["generation"], 1);
    assert_eq!(body["display_name"], "acme", "display_name defaults to the name");
    assert_eq!(body["state"], "active");
    assert_eq!(body["quotas"], json!({ "max_clusters": null, "max_nodes": 8, "max_gpus": null }));
    assert!(uuid::Uuid::parse_str(&id(&body)).expect("uuid").get_version_num() == 7);

    let events = app.get("/v1/audit-events?action=tenant.create").token(&admin()).send().await.expect(200).json();
    let event = &events["items"][0];
    assert_eq!(event["outcome"], "success");
    assert_eq!(event["request_id"], "req-create-1");
    assert_eq!(event["target"]["id"], body["id"]);
    assert_eq!(event["actor"]["sub"], "test-user");
}

#[tokio::test]
async fn tenant_create_with_taken_name_returns_409() {
    let app = TestApp::new().await;
    tenant(&app, "acme").await;
    app.post("/v1/tenants")
        .token(&admin())
        .json(&json!({ "name": "acme" }))
        .send()
        .await
        .problem(409, "tenant_name_taken");
    assert_eq!(app.count("tenants").await, 1);
}

#[tokio::test]
async fn concurrent_creates_of_one_name_give_one_201_and_409s() {
    let app = TestApp::new().await;
    let token = admin();
    let sends = (0..8).map(|_| app.post("/v1/tenants").token(&token).json(&json!({ "name": "race" })).send());
    let statuses: Vec<u16> = futures::future::join_all(sends).await.iter().map(|r| r.status.as_u16()).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 1, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 409).count(), 7, "{statuses:?}");
    assert_eq!(app.count("tenants").await, 1);
}

#[tokio::test]
async fn tenant_patch_merges_and_bumps_the_etag_only_on_change() {
    let app = TestApp::new().await;
    let t = tenant(&app, "acme").await;
    let path = format!("/v1/tenants/{}", id(&t));
    let patched = app
        .patch(&path)
        .token(&admin())
        .header("content-type", "application/merge-patch+json")
        .raw(
            json!({ "display_name": "ACME", "labels": { "a": "1", "b": "2" }, "quotas": { "max_gpus": 16 } })
                .to_string(),
        )
        .send()
        .await
        .expect(200);
    assert_eq!(patched.header("etag"), Some("\"2\""));
    let body = patched.json();
    assert_eq!(body["display_name"], "ACME");
    assert_eq!(body["quotas"]["max_gpus"], 16);

    // null removes a label and makes a quota unlimited again
    let body = app
        .patch(&path)
        .token(&admin())
        .json(&json!({ "labels": { "a": null }, "quotas": { "max_gpus": null } }))
        .send()
        .await
        .expect(200)
        .json();
    assert_eq!(body["labels"], json!({ "b": "2" }));
    assert_eq!(body["quotas"]["max_gpus"], json!(null));
    assert_eq!(body["generation"], 3);

    // a patch that changes nothing keeps the etag
    let body =
        app.patch(&path).token(&admin()).json(&json!({ "labels": { "b": "2" } })).send().await.expect(200).json();
    assert_eq!(body["generation"], 3);
}

#[tokio::test]
async fn tenant_patch_with_stale_if_match_returns_412_and_changes_nothing() {
    let app = TestApp::new().await;
    let t = tenant(&app, "acme").await;
    let path = format!("/v1/tenants/{}", id(&t));
    app.patch(&path)
        .token(&admin())
        .header("if-match", "\"1\"")
        .json(&json!({ "display_name": "one" }))
        .send()
        .await
        .expect(200);
    let problem = app
        .patch(&path)
        .token(&admin())
        .header("if-match", "\"1\"")
        .json(&json!({ "display_name": "two" }))
        .send()
        .await
        .problem(412, "precondition_failed");
    assert!(problem["detail"].as_str().expect("detail").contains("\"2\""));
    let now = app.get(&path).token(&admin()).send().await.expect(200).json();
    assert_eq!(now["display_name"], "one");
    app.patch(&path)
        .token(&admin())
        .header("if-match", "\"2\"")
        .json(&json!({ "display_name": "two" }))
        .send()
        .await
        .expect(200);
    app.delete(&path).token(&admin()).header("if-match", "\"2\"").send().await.problem(412, "precondition_failed");
}

#[tokio::test]
async fn suspend_and_resume_are_idempotent() {
    let app = TestApp::new().await;
    let t = tenant(&app, "acme").await;
    let path = format!("/v1/tenants/{}", id(&t));
    let body = app.post(format!("{path}/suspend")).token(&admin()).send().await.expect(200).json();
    assert_eq!(body["state"], "suspended");
    assert_eq!(body["generation"], 2);
    let body = app.post(format!("{path}/suspend")).token(&admin()).send().await.expect(200).json();
    assert_eq!(body["generation"], 2, "suspending a suspended tenant changes nothing");
    let body = app.post(format!("{path}/resume")).token(&admin()).send().await.expect(200).json();
    assert_eq!(body["state"], "active");
    let resumed = body["generation"].clone();
    let body = app.post(format!("{path}/resume")).token(&admin()).send().await.expect(200).json();
    assert_eq!(body["state"], "active");
    assert_eq!(body["generation"], resumed, "resuming an active tenant changes nothing");
    assert_eq!(app.count("audit_events where action like 'tenant.%' and outcome = 'success'").await, 5);
}

#[tokio::test]
async fn deleted_tenant_is_gone_and_its_name_reusable() {
    let app = TestApp::new().await;
    let t = tenant(&app, "acme").await;
    let path = format!("/v1/tenants/{}", id(&t));
    app.delete(&path).token(&admin()).send().await.expect(204);
    app.get(&path).token(&admin()).send().await.problem(404, "not_found");
    app.delete(&path).token(&admin()).send().await.problem(404, "not_found");
    let list = app.get("/v1/tenants").token(&admin()).send().await.expect(200).json();
    assert_eq!(list["items"].as_array().expect("items").len(), 0);
    tenant(&app, "acme").await;
}

#[tokio::test]
async fn tenant_holding_machines_cannot_be_deleted() {
    let app = TestApp::new().await;
    let t = tenant(&app, "acme").await;
    crate::common::machine_class(&app, "gpu", 8).await;
    let m = crate::common::machine(&app, "node-1", "gpu").await;
    crate::common::hold_machine(&app, &id(&m), Some((&id(&t), None)), "active").await;
    app.delete(format!("/v1/tenants/{}", id(&t))).token(&admin()).send().await.problem(409, "tenant_not_empty");
    app.get(format!("/v1/tenants/{}", id(&t))).token(&admin()).send().await.expect(200);
}

#[tokio::test]
async fn tenant_token_lists_only_its_own_tenant() {
    let app = TestApp::new().await;
    let own = tenant(&app, "own").await;
    tenant(&app, "other").await;
    let token = paddock_testkit::token(&["tenant:member"], Some(id(&own).parse().expect("uuid")));
    let list = app.get("/v1/tenants").token(&token).send().await.expect(200).json();
    let names: Vec<&str> = list["items"].as_array().expect("items").iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["own"]);
}
