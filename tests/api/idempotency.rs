//! `Idempotency-Key` on POST: replay, mismatch, in flight, scoping.

use std::time::Duration;

use paddock_service::fault;
use paddock_testkit::{admin, eventually, Resp, TestApp};
use serde_json::{json, Value};

#[tokio::test]
async fn same_key_and_body_replays_the_first_answer() {
    let app = TestApp::new().await;
    let send = || {
        app.post("/v1/tenants").token(&admin()).header("idempotency-key", "k-1").json(&json!({ "name": "acme" })).send()
    };
    let first = send().await.expect(201);
    let second = send().await.expect(201);
    assert_eq!(first.body, second.body);
    assert_eq!(first.header("location"), second.header("location"));
    assert_eq!(first.header("etag"), second.header("etag"));
    assert_eq!(second.header("idempotent-replayed"), Some("true"));
    assert_eq!(app.count("tenants").await, 1);
    let creates = app.get("/v1/audit-events?action=tenant.create").token(&admin()).send().await.expect(200).json();
    assert_eq!(creates["items"].as_array().expect("items").len(), 1, "a replay is not a second change");
}

#[tokio::test]
async fn same_key_with_another_body_is_422() {
    let app = TestApp::new().await;
    app.post("/v1/tenants")
        .token(&admin())
        .header("idempotency-key", "k-1")
        .json(&json!({ "name": "acme" }))
        .send()
        .await
        .expect(201);
    app.post("/v1/tenants")
        .token(&admin())
        .header("idempotency-key", "k-1")
        .json(&json!({ "name": "other" }))
        .send()
        .await
        .problem(422, "idempotency_key_reused");
    assert_eq!(app.count("tenants").await, 1);
}

#[tokio::test]
async fn a_refused_answer_is_replayed_too() {
    let app = TestApp::new().await;
    crate::common::tenant(&app, "acme").await;
    let send = || {
        app.post("/v1/tenants").token(&admin()).header("idempotency-key", "k-2").json(&json!({ "name": "acme" })).send()
    };
    send().await.problem(409, "tenant_name_taken");
    let first = app.get("/v1/audit-events?outcome=failure").token(&admin()).send().await.expect(200).json();
    let replay = send().await.expect(409);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.header("content-type"), Some("application/problem+json"));
    // The replay is the first answer, byte for byte (its request_id included).
    assert_eq!(replay.json()["code"], "tenant_name_taken");
    let after = app.get("/v1/audit-events?outcome=failure").token(&admin()).send().await.expect(200).json();
    assert_eq!(
        first["items"].as_array().map(Vec::len),
        after["items"].as_array().map(Vec::len),
        "a replay is not audited again"
    );
}

#[tokio::test]
async fn a_duplicate_in_flight_is_409() {
    let app = TestApp::new().await;
    // The first request with this key claimed it and has not answered yet.
    let body = serde_json::to_vec(&json!({ "name": "acme" })).expect("json");
    let hash = <sha2::Sha256 as sha2::Digest>::digest(&body).to_vec();
    sqlx::query(
        "insert into idempotency_keys (subject, tenant_scope, method, path, key, request_hash) \
         values ('test-user', '00000000-0000-0000-0000-000000000000', 'POST', '/v1/tenants', 'k-3', $1)",
    )
    .bind(hash)
    .execute(&app.db.pool)
    .await
    .expect("claim");
    app.post("/v1/tenants")
        .token(&admin())
        .header("idempotency-key", "k-3")
        .header("content-type", "application/json")
        .raw(body)
        .send()
        .await
        .problem(409, "idempotency_in_flight");
    assert_eq!(app.count("tenants").await, 0);
}

/// A request whose process died holds its key under a lease: once the lease has run out, a retry
/// takes the key over and runs (before, the key answered 409 for 24 hours); while it runs, 409.
#[tokio::test]
async fn a_key_whose_request_died_is_taken_over_once_its_lease_ran_out() {
    let app = TestApp::new().await;
    let body = serde_json::to_vec(&json!({ "name": "acme" })).expect("json");
    let hash = <sha2::Sha256 as sha2::Digest>::digest(&body).to_vec();
    let claim = |key: &'static str, lease: &'static str| {
        let sql = format!(
            "insert into idempotency_keys (subject, tenant_scope, method, path, key, request_hash, holder, lease_until) \
             values ('test-user', '00000000-0000-0000-0000-000000000000', 'POST', '/v1/tenants', '{key}', $1, \
             gen_random_uuid(), now() + interval '{lease}')"
        );
        let hash = hash.clone();
        let pool = app.db.pool.clone();
        async move { sqlx::query(&sql).bind(hash).execute(&pool).await.expect("claim") }
    };
    let send = |key: &'static str| {
        app.post("/v1/tenants")
            .token(&admin())
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .raw(body.clone())
            .send()
    };
    claim("k-live", "20 seconds").await;
    send("k-live").await.problem(409, "idempotency_in_flight");
    assert_eq!(app.count("tenants").await, 0);

    claim("k-dead", "-1 second").await;
    let first = send("k-dead").await.expect(201);
    assert_eq!(app.count("tenants").await, 1);
    let replay = send("k-dead").await.expect(201);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(first.body, replay.body);
}

#[tokio::test]
async fn an_unauthenticated_request_never_claims_a_key() {
    let app = TestApp::new().await;
    app.post("/v1/tenants")
        .header("idempotency-key", "k-anon")
        .json(&json!({ "name": "acme" }))
        .send()
        .await
        .problem(401, "missing_token");
    app.post("/v1/tenants")
        .token("not-a-jwt")
        .header("idempotency-key", "k-anon")
        .json(&json!({ "name": "acme" }))
        .send()
        .await
        .expect(401);
    assert_eq!(app.count("idempotency_keys").await, 0, "authentication comes before idempotency");
    // The same key works for the caller once authenticated.
    let ok = app.post("/v1/tenants").token(&admin()).header("idempotency-key", "k-anon");
    ok.json(&json!({ "name": "acme" })).send().await.expect(201);
}

#[tokio::test]
async fn keys_are_scoped_by_subject_and_path_and_expire_after_a_day() {
    let app = TestApp::new().await;
    let other_admin = paddock_testkit::token_with(|c| c.sub = "someone-else".into());
    app.post("/v1/tenants")
        .token(&admin())
        .header("idempotency-key", "k")
        .json(&json!({ "name": "a" }))
        .send()
        .await
        .expect(201);
    app.post("/v1/tenants")
        .token(&other_admin)
        .header("idempotency-key", "k")
        .json(&json!({ "name": "b" }))
        .send()
        .await
        .expect(201);
    let class = json!({ "name": "c", "cpu_cores": 1, "memory_gib": 1, "gpu_count": 0 });
    app.post("/v1/machine-classes")
        .token(&admin())
        .header("idempotency-key", "k")
        .json(&class)
        .send()
        .await
        .expect(201);
    assert_eq!(app.count("tenants").await, 2);

    sqlx::query("update idempotency_keys set created_at = now() - interval '25 hours'")
        .execute(&app.db.pool)
        .await
        .expect("age");
    app.post("/v1/tenants")
        .token(&admin())
        .header("idempotency-key", "k")
        .json(&json!({ "name": "a2" }))
        .send()
        .await
        .expect(201);
    assert_eq!(app.count("tenants").await, 3);
}

#[tokio::test]
async fn an_invalid_key_is_400() {
    let app = TestApp::new().await;
    app.post("/v1/tenants")
        .token(&admin())
        .header("idempotency-key", &"k".repeat(300))
        .json(&json!({ "name": "a" }))
        .send()
        .await
        .problem(400, "invalid_idempotency_key");
    assert_eq!(app.count("tenants").await, 0);
}

#[tokio::test]
async fn the_worker_forgets_keys_older_than_a_day() {
    let app = TestApp::new().await;
    for key in ["old", "new"] {
        app.post("/v1/tenants")
            .token(&admin())
            .header("idempotency-key", key)
            .json(&json!({ "name": key }))
            .send()
            .await
            .expect(201);
    }
    sqlx::query("update idempotency_keys set created_at = now() - interval '25 hours' where key = 'old'")
        .execute(&app.db.pool)
        .await
        .expect("age");
    assert_eq!(app.services.purge_expired_idempotency_keys().await.expect("purge"), 1);
    assert_eq!(app.count("idempotency_keys").await, 1);
}

/// Sends `body` to `path` with a key, in a process that is killed right after the transaction of
/// the request's effect commits (the fault point stops the request there for good, as SIGKILL
/// would: no answer, nothing recorded after it), waits until `effect` (a count) shows the
/// change, lets the dead request's lease run out, and retries with the same key and body.
async fn killed_after_commit_then_retried(app: &TestApp, path: &str, body: &Value, effect: &str) -> Resp {
    let request_id = format!("killed-{}", uuid::Uuid::now_v7());
    fault::arm(fault::AFTER_COMMIT, &request_id);
    let send = |request_id: &str| {
        app.post(path)
            .token(&admin())
            .header("idempotency-key", "k-killed")
            .header("x-request-id", request_id)
            .json(body)
    };
    let first = send(&request_id).send();
    tokio::pin!(first);
    let pool = app.db.pool.clone();
    let committed = eventually(Duration::from_secs(30), || {
        let pool = pool.clone();
        async move {
            let n: i64 = sqlx::query_scalar(effect).fetch_one(&pool).await.expect("count");
            (n > 0).then_some(())
        }
    });
    tokio::select! {
        answered = &mut first => panic!("the request answered ({}) though its process died", answered.status),
        () = committed => {}
    }
    // Nothing renews the dead request's lease: it runs out.
    sqlx::query("update idempotency_keys set lease_until = now() - interval '1 second' where key = 'k-killed'")
        .execute(&app.db.pool)
        .await
        .expect("lease");
    send(&format!("retry-{}", uuid::Uuid::now_v7())).send().await
}

/// A tenant created just before its process was killed: the retry gets the first answer (201,
/// the same tenant), not a second run (409 `tenant_name_taken`).
#[tokio::test]
async fn a_retry_after_a_kill_between_commit_and_answer_gets_the_first_answer() {
    let app = TestApp::new().await;
    let body = json!({ "name": "acme" });
    let effect = "select count(*) from tenants where name = 'acme'";
    let retry = killed_after_commit_then_retried(&app, "/v1/tenants", &body, effect).await.expect(201);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    let stored: uuid::Uuid =
        sqlx::query_scalar("select id from tenants where name = 'acme'").fetch_one(&app.db.pool).await.expect("tenant");
    assert_eq!(retry.json()["id"], stored.to_string());
    assert_eq!(retry.header("location"), Some(format!("/v1/tenants/{stored}").as_str()));
    assert_eq!(app.count("tenants").await, 1);
    let creates = app.get("/v1/audit-events?action=tenant.create").token(&admin()).send().await.expect(200).json();
    assert_eq!(creates["items"].as_array().map(Vec::len), Some(1), "the tenant was created once: {creates}");
}

/// The same for an accepted change (202 with an operation), through the same one mechanism: the
/// machine is enrolled once, with one operation, and the retry replays the first answer.
#[tokio::test]
async fn an_accepted_change_killed_before_its_answer_is_made_once() {
    let app = TestApp::new().await;
    crate::common::machine_class(&app, "gpu", 8).await;
    let body = crate::common::enroll_body("node-1", "gpu");
    let effect = "select count(*) from machines";
    let retry = killed_after_commit_then_retried(&app, "/v1/machines", &body, effect).await.expect(202);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    let view = retry.json();
    let stored: uuid::Uuid =
        sqlx::query_scalar("select id from machines").fetch_one(&app.db.pool).await.expect("machine");
    assert_eq!(view["machine"]["id"], stored.to_string());
    assert_eq!(app.count("machines").await, 1);
    assert_eq!(app.count("operations").await, 1);
}
