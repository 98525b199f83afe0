//! Machines: enroll, read, patch labels and credentials, maintenance, retire. BMC passwords are
//! sealed at rest, bound to their row, and never shown.

use paddock_domain::secret::Binding;
use paddock_testkit::{admin, token, TestApp};
use serde_json::json;

use crate::common::{enroll_body, id, machine, machine_class, set_machine_state};

async fn sealed_password(app: &TestApp, machine_id: &str) -> Vec<u8> {
    sqlx::query_scalar("select bmc_password_enc from machines where id = $1::uuid")
        .bind(machine_id)
        .fetch_one(&app.db.pool)
        .await
        .expect("password column")
}

fn binding(machine_id: &str) -> Binding<'static> {
    Binding { table: "machines", column: "bmc_password_enc", row: machine_id.parse().expect("uuid") }
}

#[tokio::test]
async fn machine_enroll_returns_202_with_a_pending_operation() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let resp = app.post("/v1/machines").token(&admin()).json(&enroll_body("node-1", "gpu")).send().await.expect(202);
    let body = resp.json();
    let machine = &body["machine"];
    let operation = &body["operation"];
    assert_eq!(resp.header("location"), Some(format!("/v1/machines/{}", id(machine)).as_str()));
    assert_eq!(machine["state"], "enrolling");
    assert_eq!(machine["machine_class"], "gpu");
    assert_eq!(
        machine["bmc"],
        json!({ "url": "https://bmc-node-1.example:443", "system_id": null, "username": "admin", "insecure_tls": false, "has_ca_cert": false })
    );
    assert_eq!(operation["state"], "pending");
    assert_eq!(operation["kind"], "machine_enroll");
    assert_eq!(operation["target"], json!({ "type": "machine", "id": machine["id"] }));
    let fetched = app.get(format!("/v1/operations/{}", id(operation))).token(&admin()).send().await.expect(200).json();
    assert_eq!(fetched["state"], "pending");
}

#[tokio::test]
async fn bmc_password_is_sealed_bound_to_its_row_and_never_shown() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let a = machine(&app, "node-a", "gpu").await;
    let b = machine(&app, "node-b", "gpu").await;
    let sealed = sealed_password(&app, &id(&a)).await;
    assert!(!sealed.windows(9).any(|w| w == b"s3cret-pw"), "the password is stored in clear");
    assert_eq!(app.cipher.open(&sealed, binding(&id(&a))).expect("opens for its row"), b"s3cret-pw");
    // A ciphertext copied into another row does not open there.
    assert!(app.cipher.open(&sealed, binding(&id(&b))).is_err());

    for path in [
        format!("/v1/machines/{}", id(&a)),
        "/v1/machines".to_owned(),
        "/v1/audit-events".to_owned(),
        "/v1/operations".to_owned(),
    ] {
        let body = app.get(&path).token(&admin()).send().await.expect(200);
        assert!(!String::from_utf8_lossy(&body.body).contains("s3cret-pw"), "{path} shows the password");
    }
}

#[tokio::test]
async fn machine_patch_of_labels_is_synchronous_and_of_credentials_asynchronous() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let m = machine(&app, "node-1", "gpu").await;
    let path = format!("/v1/machines/{}", id(&m));
    let body = app
        .patch(&path)
        .token(&admin())
        .json(&json!({ "labels": { "rack": null, "row": "7" } }))
        .send()
        .await
        .expect(200)
        .json();
    assert_eq!(body["labels"], json!({ "row": "7" }));
    assert_eq!(app.count("operations").await, 1, "a labels change starts no operation");

    let resp = app
        .patch(&path)
        .token(&token(&["provider:operator"], None))
        .header("if-match", "\"2\"")
        .json(&json!({ "bmc": { "password": "n3w-secret", "username": "root" } }))
        .send()
        .await
        .expect(202);
    let body = resp.json();
    assert_eq!(body["operation"]["kind"], "machine_update_credentials");
    assert_eq!(body["machine"]["bmc"]["username"], "root");
    assert_eq!(body["machine"]["generation"], 3);
    let sealed = sealed_password(&app, &id(&m)).await;
    assert_eq!(app.cipher.open(&sealed, binding(&id(&m))).expect("opens"), b"n3w-secret");
    let events = app.get("/v1/audit-events?action=machine.update").token(&admin()).send().await.expect(200);
    let text = String::from_utf8_lossy(&events.body);
    assert!(!text.contains("n3w-secret"), "audit shows the password: {text}");
    assert!(text.contains("\"password_changed\":true"));

    app.patch(&path)
        .token(&admin())
        .json(&json!({ "bmc": { "password": null } }))
        .send()
        .await
        .problem(422, "validation_failed");
    app.patch(&path).token(&admin()).json(&json!({ "name": "x" })).send().await.problem(422, "validation_failed");
}

#[tokio::test]
async fn machine_list_filters_by_state_class_and_tenant_and_hides_retired() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    machine_class(&app, "cpu", 0).await;
    let a = machine(&app, "a", "gpu").await;
    let b = machine(&app, "b", "cpu").await;
    let c = machine(&app, "c", "cpu").await;
    set_machine_state(&app, &id(&b), "available").await;
    set_machine_state(&app, &id(&c), "retired").await;
    let names = |v: serde_json::Value| -> Vec<String> {
        v["items"].as_array().expect("items").iter().map(|m| m["name"].as_str().expect("name").to_owned()).collect()
    };
    let all = app.get("/v1/machines").token(&admin()).send().await.expect(200).json();
    assert_eq!(names(all), ["a", "b"]);
    let cpu = app.get("/v1/machines?machine_class=cpu").token(&admin()).send().await.expect(200).json();
    assert_eq!(names(cpu), ["b"]);
    let available = app.get("/v1/machines?state=available").token(&admin()).send().await.expect(200).json();
    assert_eq!(names(available), ["b"]);
    let retired = app.get("/v1/machines?state=retired").token(&admin()).send().await.expect(200).json();
    assert_eq!(names(retired), ["c"]);
    let t = crate::common::tenant(&app, "acme").await;
    crate::common::hold_machine(&app, &id(&a), Some((&id(&t), None)), "active").await;
    let held = app.get(format!("/v1/machines?tenant_id={}", id(&t))).token(&admin()).send().await.expect(200).json();
    assert_eq!(names(held), ["a"]);
    app.get("/v1/machines?state=bogus").token(&admin()).send().await.problem(400, "invalid_parameter");
}

#[tokio::test]
async fn maintenance_enter_and_leave() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let m = machine(&app, "node-1", "gpu").await;
    let path = format!("/v1/machines/{}/maintenance", id(&m));
    app.delete(&path).token(&admin()).send().await.problem(409, "not_in_maintenance");
    let body =
        app.post(&path).token(&admin()).json(&json!({ "reason": "replace DIMM B2" })).send().await.expect(202).json();
    assert_eq!(body["machine"]["maintenance_reason"], "replace DIMM B2");
    assert_eq!(body["operation"]["kind"], "machine_maintenance_enter");
    let enter_op = id(&body["operation"]);
    app.post(&path)
        .token(&admin())
        .json(&json!({ "reason": "again" }))
        .send()
        .await
        .problem(409, "already_in_maintenance");
    app.post(&path).token(&admin()).json(&json!({ "reason": "  " })).send().await.expect(409);

    let body = app.delete(&path).token(&admin()).send().await.expect(202).json();
    assert_eq!(body["operation"]["kind"], "machine_maintenance_leave");
    assert_eq!(body["machine"]["maintenance_reason"], json!(null));
    let enter = app.get(format!("/v1/operations/{enter_op}")).token(&admin()).send().await.expect(200).json();
    assert_eq!(enter["state"], "superseded", "leaving replaces the pending enter");
    let events =
        app.get(format!("/v1/audit-events?target_id={}", id(&m))).token(&admin()).send().await.expect(200).json();
    let reasons: Vec<&serde_json::Value> =
        events["items"].as_array().expect("items").iter().map(|e| &e["details"]["reason"]).collect();
    assert!(reasons.contains(&&json!("replace DIMM B2")), "{events}");
}

#[tokio::test]
async fn maintenance_reason_is_required() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let m = machine(&app, "node-1", "gpu").await;
    set_machine_state(&app, &id(&m), "available").await;
    let problem = app
        .post(format!("/v1/machines/{}/maintenance", id(&m)))
        .token(&admin())
        .json(&json!({ "reason": "" }))
        .send()
        .await
        .problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["field"], "reason");
}

#[tokio::test]
async fn retire_only_from_retirable_states() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let m = machine(&app, "node-1", "gpu").await;
    let path = format!("/v1/machines/{}", id(&m));
    app.delete(&path).token(&admin()).send().await.problem(409, "machine_busy");
    for busy in ["active", "allocated", "cleaning", "releasing"] {
        set_machine_state(&app, &id(&m), busy).await;
        app.delete(&path).token(&admin()).send().await.problem(409, "machine_busy");
    }
    set_machine_state(&app, &id(&m), "available").await;
    let body = app.delete(&path).token(&admin()).send().await.expect(202).json();
    assert_eq!(body["operation"]["kind"], "machine_retire");
    app.delete(&path).token(&admin()).send().await.problem(409, "retire_pending");
    set_machine_state(&app, &id(&m), "retired").await;
    app.patch(&path)
        .token(&admin())
        .json(&json!({ "labels": { "a": "b" } }))
        .send()
        .await
        .problem(409, "machine_retired");
    // The retired machine's name may be enrolled again (a rebuilt server).
    machine(&app, "node-1", "gpu").await;
}

#[tokio::test]
async fn machine_enroll_with_taken_name_returns_409_and_writes_nothing() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    machine(&app, "node-1", "gpu").await;
    app.post("/v1/machines")
        .token(&admin())
        .json(&enroll_body("node-1", "gpu"))
        .send()
        .await
        .problem(409, "machine_name_taken");
    assert_eq!(app.count("machines").await, 1);
    assert_eq!(app.count("operations").await, 1);
}

#[tokio::test]
async fn bmc_urls_are_https_unless_plain_http_is_allowed_and_never_carry_credentials() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let with_url = |name: &str, url: &str| {
        let mut body = enroll_body(name, "gpu");
        body["bmc"]["url"] = json!(url);
        body
    };
    for url in ["http://10.0.0.17", "https://root:hunter2@10.0.0.17", "http://root@10.0.0.17", "https://:hunter2@bmc"] {
        let problem = app
            .post("/v1/machines")
            .token(&admin())
            .json(&with_url("m1", url))
            .send()
            .await
            .problem(422, "validation_failed");
        assert_eq!(problem["errors"][0]["field"], "bmc.url", "{url}: {problem}");
        assert!(!problem.to_string().contains("hunter2"), "the URL's password is echoed: {problem}");
    }
    let mut userinfo = with_url("m1", "http://root:hunter2@10.0.0.17");
    userinfo["bmc"]["allow_insecure_http"] = json!(true);
    app.post("/v1/machines").token(&admin()).json(&userinfo).send().await.problem(422, "validation_failed");
    assert_eq!(app.count("machines").await, 0);
    let audit = app.get("/v1/audit-events").token(&admin()).send().await.expect(200);
    assert!(!String::from_utf8_lossy(&audit.body).contains("hunter2"), "the audit keeps the URL's password");

    let mut lab = with_url("lab-1", "http://10.0.0.17");
    lab["bmc"]["allow_insecure_http"] = json!(true);
    let m = app.post("/v1/machines").token(&admin()).json(&lab).send().await.expect(202).json()["machine"].clone();
    let path = format!("/v1/machines/{}", id(&m));
    // The opt-in is kept: another http URL needs no repetition, but turning it off is refused.
    app.patch(&path).token(&admin()).json(&json!({ "bmc": { "url": "http://10.0.0.18" } })).send().await.expect(202);
    let off = json!({ "bmc": { "allow_insecure_http": false } });
    app.patch(&path).token(&admin()).json(&off).send().await.problem(422, "validation_failed");
    let secure = json!({ "bmc": { "url": "https://10.0.0.18", "allow_insecure_http": false } });
    app.patch(&path).token(&admin()).json(&secure).send().await.expect(202);
    app.post("/v1/machines").token(&admin()).json(&with_url("sim-1", "sim://sim-1")).send().await.expect(202);
}

#[tokio::test]
async fn force_release_of_a_held_machine_is_accepted_once_and_audited() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let m = id(&machine(&app, "node-1", "gpu").await);
    set_machine_state(&app, &m, "active").await;
    let path = format!("/v1/machines/{m}/force-release");

    // Roles that may never do this: 403 before any lookup, and nothing is recorded.
    let holder: String = sqlx::query_scalar("select tenant_id::text from machines where id = $1::uuid")
        .bind(&m)
        .fetch_one(&app.db.pool)
        .await
        .expect("holder");
    let tenant = holder.parse().expect("uuid");
    for t in [
        token(&["billing:reader"], None),
        token(&["tenant:admin"], Some(tenant)),
        token(&["tenant:member"], Some(tenant)),
    ] {
        app.post(&path).token(&t).json(&json!({ "reason": "stuck" })).send().await.problem(403, "forbidden");
    }

    // A reason is required (after the state check).
    app.post(&path).token(&admin()).json(&json!({ "reason": " " })).send().await.problem(422, "validation_failed");

    let resp = app.post(&path).token(&token(&["provider:operator"], None)).json(&json!({ "reason": "node stuck" }));
    let resp = resp.send().await.expect(202);
    assert_eq!(resp.header("location"), Some(format!("/v1/machines/{m}").as_str()));
    let body = resp.json();
    assert_eq!(body["operation"]["kind"], "machine_force_release");
    assert_eq!(body["operation"]["state"], "pending");
    assert_eq!(body["machine"]["state"], "active", "the worker carries it out");
    let (reason, by): (Option<String>, Option<String>) =
        sqlx::query_as("select force_release_reason, force_release_requested_by from machines where id = $1::uuid")
            .bind(&m)
            .fetch_one(&app.db.pool)
            .await
            .expect("intent");
    assert_eq!(reason.as_deref(), Some("node stuck"));
    assert!(by.is_some());
    let jobs: i64 = sqlx::query_scalar(
        "select count(*) from jobs where kind = 'machine_reconcile' and target_id = $1::uuid and state = 'queued'",
    )
    .bind(&m)
    .fetch_one(&app.db.pool)
    .await
    .expect("jobs");
    assert_eq!(jobs, 1, "the worker is asked to carry it out");

    // Once pending, a second request is a conflict.
    app.post(&path)
        .token(&admin())
        .json(&json!({ "reason": "again" }))
        .send()
        .await
        .problem(409, "force_release_pending");

    let events = app.get("/v1/audit-events?action=machine.force_release&limit=100").token(&admin()).send().await;
    let events = events.expect(200).json()["items"].as_array().cloned().expect("items");
    assert!(events.iter().any(|e| e["outcome"] == "success" && e["target"]["id"] == m.as_str()), "{events:?}");
    assert!(events.iter().any(|e| e["code"] == "forbidden"), "{events:?}");
    assert!(events.iter().any(|e| e["code"] == "force_release_pending"), "{events:?}");
}

#[tokio::test]
async fn force_release_needs_a_tenancy_and_an_existing_machine() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let m = id(&machine(&app, "node-1", "gpu").await);
    let reason = json!({ "reason": "stuck" });
    for state in ["enrolling", "available", "cleaning", "maintenance", "clean_failed"] {
        set_machine_state(&app, &m, state).await;
        let resp = app.post(format!("/v1/machines/{m}/force-release")).token(&admin()).json(&reason).send().await;
        let problem = resp.problem(409, "machine_not_in_tenancy");
        assert!(problem["detail"].as_str().is_some_and(|d| d.contains(state)), "{problem}");
    }
    // Every tenancy state is accepted.
    for (n, state) in ["allocated", "provisioning", "active", "releasing", "provision_failed"].iter().enumerate() {
        let held = id(&machine(&app, &format!("held-{n}"), "gpu").await);
        set_machine_state(&app, &held, state).await;
        app.post(format!("/v1/machines/{held}/force-release")).token(&admin()).json(&reason).send().await.expect(202);
    }
    // Unknown: 404; an id of another kind of object names no machine either.
    let unknown = uuid::Uuid::now_v7();
    app.post(format!("/v1/machines/{unknown}/force-release"))
        .token(&admin())
        .json(&reason)
        .send()
        .await
        .problem(404, "not_found");
    let tenant = id(&crate::common::tenant(&app, "acme").await);
    app.post(format!("/v1/machines/{tenant}/force-release"))
        .token(&admin())
        .json(&reason)
        .send()
        .await
        .problem(404, "not_found");
    // Retired: its record stays, but it takes no more changes.
    set_machine_state(&app, &m, "retired").await;
    app.post(format!("/v1/machines/{m}/force-release"))
        .token(&admin())
        .json(&reason)
        .send()
        .await
        .problem(409, "machine_retired");
}

/// An enrollment body for `name` at the BMC `url`, system `system_id`.
fn enroll_at(name: &str, url: &str, system_id: Option<&str>) -> serde_json::Value {
    json!({ "name": name, "machine_class": "gpu",
            "bmc": { "url": url, "system_id": system_id, "username": "admin", "password": "s3cret-pw" } })
}

#[tokio::test]
async fn enrolling_a_bmc_system_already_enrolled_returns_409_and_writes_nothing() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let first = app
        .post("/v1/machines")
        .token(&admin())
        .json(&enroll_at("node-1", "https://BMC-7.example:443/redfish/v1/", Some("1")))
        .send()
        .await
        .expect(202)
        .json();
    // The same system behind other spellings of its BMC's address: the driver talks to the origin.
    for url in ["https://bmc-7.example", "https://bmc-7.example./", "HTTPS://bmc-7.EXAMPLE:443/redfish/v1/Systems"] {
        let problem = app.post("/v1/machines").token(&admin()).json(&enroll_at("node-2", url, Some("1"))).send().await;
        let problem = problem.problem(409, "machine_already_enrolled");
        assert_eq!(problem["type"], "https://paddock.dev/problems/conflict", "{problem}");
    }
    assert_eq!(app.count("machines").await, 1);
    assert_eq!(app.count("operations").await, 1);
    // A system named by its UUID in another case is the same system too.
    let uuid = "0b1e4a3c-0000-4000-8000-00000000000a";
    app.post("/v1/machines")
        .token(&admin())
        .json(&enroll_at("node-2", "https://bmc-9.example", Some(uuid)))
        .send()
        .await
        .expect(202);
    app.post("/v1/machines")
        .token(&admin())
        .json(&enroll_at("node-3", "https://bmc-9.example", Some(&uuid.to_uppercase())))
        .send()
        .await
        .problem(409, "machine_already_enrolled");

    // Another system of the same BMC, and the same system id at another BMC, are other servers.
    app.post("/v1/machines")
        .token(&admin())
        .json(&enroll_at("node-3", "https://bmc-7.example", Some("2")))
        .send()
        .await
        .expect(202);
    let other = app
        .post("/v1/machines")
        .token(&admin())
        .json(&enroll_at("node-4", "https://bmc-8.example", Some("1")))
        .send()
        .await
        .expect(202)
        .json();
    // Pointing a machine's BMC access at an enrolled system is refused as well.
    let path = format!("/v1/machines/{}", id(&other["machine"]));
    app.patch(&path)
        .token(&admin())
        .json(&json!({ "bmc": { "url": "https://bmc-7.example:443" } }))
        .send()
        .await
        .problem(409, "machine_already_enrolled");

    // Once the record is retired, its system may be enrolled again (a rebuilt record).
    set_machine_state(&app, &id(&first["machine"]), "retired").await;
    app.post("/v1/machines")
        .token(&admin())
        .json(&enroll_at("node-5", "https://bmc-7.example", Some("1")))
        .send()
        .await
        .expect(202);
}

#[tokio::test]
async fn a_duplicate_record_of_an_enrolled_server_can_only_be_retired() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let held = machine(&app, "node-1", "gpu").await;
    let dup = machine(&app, "node-2", "gpu").await;
    // What inspection writes when it finds node-2's system UUID held by node-1 (the worker's
    // tests drive that through the Redfish emulator).
    sqlx::query(
        "update machines set state = 'inspecting', duplicate_of = $2::uuid, \
         last_error = jsonb_build_object('code', 'duplicate_system', 'message', 'held', 'at', now()) where id = $1::uuid",
    )
    .bind(id(&dup))
    .bind(id(&held))
    .execute(&app.db.pool)
    .await
    .expect("fixture");
    let path = format!("/v1/machines/{}", id(&dup));
    let view = app.get(&path).token(&admin()).send().await.expect(200).json();
    assert_eq!(view["last_error"]["code"], "duplicate_system");
    let reason = json!({ "reason": "look at it" });
    app.post(format!("{path}/maintenance")).token(&admin()).json(&reason).send().await.problem(409, "duplicate_system");
    app.patch(&path)
        .token(&admin())
        .json(&json!({ "bmc": { "password": "another" } }))
        .send()
        .await
        .problem(409, "duplicate_system");
    let body = app.delete(&path).token(&admin()).send().await.expect(202).json();
    assert_eq!(body["operation"]["kind"], "machine_retire");
}
