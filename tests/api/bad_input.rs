//! Bad input gets a clear 4xx problem+json with a stable code (and, for invalid values, the
//! offending field) and writes nothing. Refused calls after authentication do write a failure
//! audit event by design, so "nothing written" is checked on the resource tables.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use paddock_testkit::{admin, Resp, TestApp};
use serde_json::{json, Value};

use crate::common::{enroll_body, id, machine, machine_class, tenant};

/// A real (self-signed test) certificate.
const CERTIFICATE_PEM: &str = include_str!("../../crates/paddock-auth/tests/keys/unsupported_certificate.pem");

/// The resource tables a refused request must leave alone.
const TABLES: [&str; 3] = ["tenants", "machine_classes", "machines"];

/// Row counts of the resource tables.
async fn counts(app: &TestApp) -> Vec<(&'static str, i64)> {
    let mut out = Vec::new();
    for table in TABLES {
        out.push((table, app.count(table).await));
    }
    out
}

/// The `field`s of a problem's `errors`.
fn fields(problem: &Value) -> Vec<String> {
    let errors = problem["errors"].as_array().unwrap_or_else(|| panic!("problem has no errors: {problem}"));
    assert!(!errors.is_empty(), "empty errors: {problem}");
    errors
        .iter()
        .map(|e| {
            assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "error without a message: {problem}");
            e["field"].as_str().unwrap_or_else(|| panic!("error without a field: {problem}")).to_owned()
        })
        .collect()
}

/// Asserts a 422 `validation_failed` naming `field`; returns the problem.
#[track_caller]
fn invalid(resp: Resp, field: &str) -> Value {
    let problem = resp.problem(422, "validation_failed");
    let named = fields(&problem);
    assert!(named.iter().any(|f| f == field), "expected an error on {field}, got {named:?}: {problem}");
    problem
}

/// The status of a response, with the body on mismatch.
#[track_caller]
fn status_is(resp: &Resp, status: u16, what: &str) {
    assert_eq!(resp.status.as_u16(), status, "{what}: {}", String::from_utf8_lossy(&resp.body));
}

fn class_body(name: &str) -> Value {
    json!({ "name": name, "cpu_cores": 64, "memory_gib": 512, "gpu_model": "", "gpu_count": 0 })
}

// ---------------------------------------------------------------------------------------------
// Body syntax and media type

#[tokio::test]
async fn malformed_json_is_400_malformed_body() {
    let app = TestApp::new().await;
    let before = counts(&app).await;
    let deep = "[".repeat(10_000);
    let bodies: [&[u8]; 10] = [
        deep.as_bytes(),
        br#"{"name": "acme""#,
        br#"{"name": "acme",}"#,
        br#"{"name": 'acme'}"#,
        br#"{"name": "acme"} trailing"#,
        br#"{name: "acme"}"#,
        b"",
        b"   ",
        b"\xff\xfe{\"name\": \"acme\"}",
        b"NaN",
    ];
    for path in ["/v1/tenants", "/v1/machine-classes", "/v1/machines"] {
        for body in bodies {
            let resp = app.post(path).token(&admin()).header("content-type", "application/json").raw(body).send().await;
            status_is(&resp, 400, &format!("POST {path} {:?}", String::from_utf8_lossy(body)));
            let problem = resp.problem(400, "malformed_body");
            assert_eq!(problem["instance"], path);
            assert!(problem.get("errors").is_none_or(|e| e.as_array().is_some_and(Vec::is_empty)), "{problem}");
        }
    }
    assert_eq!(counts(&app).await, before);
}

#[tokio::test]
async fn malformed_json_in_a_patch_is_400_and_changes_nothing() {
    let app = TestApp::new().await;
    let t = tenant(&app, "acme").await;
    let path = format!("/v1/tenants/{}", id(&t));
    for content_type in ["application/json", "application/merge-patch+json"] {
        let resp = app
            .patch(&path)
            .token(&admin())
            .header("content-type", content_type)
            .raw(&b"{\"display_name\": "[..])
            .send()
            .await;
        resp.problem(400, "malformed_body");
    }
    let now = app.get(&path).token(&admin()).send().await.expect(200).json();
    assert_eq!(now["generation"], t["generation"]);
    assert_eq!(now["display_name"], t["display_name"]);
}

#[tokio::test]
async fn a_wrong_or_missing_content_type_is_415() {
    let app = TestApp::new().await;
    let before = counts(&app).await;
    let body = serde_json::to_vec(&json!({ "name": "acme" })).expect("json");
    for content_type in [
        Some("text/plain"),
        Some("text/json"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        Some("application/xml"),
        Some("application/jsonx"),
        Some("application/problem+json"),
        Some(""),
        None,
    ] {
        let mut req = app.post("/v1/tenants").token(&admin()).raw(body.clone());
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let resp = req.send().await;
        status_is(&resp, 415, &format!("content type {content_type:?}"));
        resp.problem(415, "unsupported_media_type");
    }
    // The same for the other writers.
    let class = serde_json::to_vec(&class_body("cpu")).expect("json");
    let resp =
        app.post("/v1/machine-classes").token(&admin()).header("content-type", "text/plain").raw(class).send().await;
    resp.problem(415, "unsupported_media_type");
    let enroll = serde_json::to_vec(&enroll_body("m1", "cpu")).expect("json");
    let resp = app.post("/v1/machines").token(&admin()).raw(enroll).send().await;
    resp.problem(415, "unsupported_media_type");
    assert_eq!(counts(&app).await, before);
}

#[tokio::test]
async fn json_media_types_with_parameters_and_any_case_are_accepted() {
    let app = TestApp::new().await;
    let body = |name: &str| serde_json::to_vec(&json!({ "name": name })).expect("json");
    app.post("/v1/tenants")
        .token(&admin())
        .header("content-type", "application/json; charset=utf-8")
        .raw(body("a1"))
        .send()
        .await
        .expect(201);
    app.post("/v1/tenants")
        .token(&admin())
        .header("content-type", "Application/JSON")
        .raw(body("a2"))
        .send()
        .await
        .expect(201);
    assert_eq!(app.count("tenants").await, 2);
}

#[tokio::test]
async fn a_patch_with_the_wrong_content_type_is_415_and_changes_nothing() {
    let app = TestApp::new().await;
    let t = tenant(&app, "acme").await;
    let path = format!("/v1/tenants/{}", id(&t));
    let body = serde_json::to_vec(&json!({ "display_name": "Changed" })).expect("json");
    for ct in [Some("text/plain"), Some("application/json-patch+json"), None] {
        let mut req = app.patch(&path).token(&admin()).raw(body.clone());
        if let Some(ct) = ct {
            req = req.header("content-type", ct);
        }
        req.send().await.problem(415, "unsupported_media_type");
    }
    let now = app.get(&path).token(&admin()).send().await.expect(200).json();
    assert_eq!(now["display_name"], "acme");
    assert_eq!(now["generation"], t["generation"]);
}

#[tokio::test]
async fn a_body_over_one_mib_is_413() {
    let app = TestApp::new().await;
    let before = counts(&app).await;
    let big = json!({ "name": "acme", "display_name": "x".repeat(1024 * 1024) });
    let resp = app.post("/v1/tenants").token(&admin()).json(&big).send().await;
    resp.problem(413, "payload_too_large");
    // Not JSON at all, over the limit: still 413, not a syntax error.
    let resp = app
        .post("/v1/machine-classes")
        .token(&admin())
        .header("content-type", "application/json")
        .raw(vec![b'['; 1024 * 1024 + 1])
        .send()
        .await;
    resp.problem(413, "payload_too_large");
    // With an idempotency key (its middleware reads the body first).
    let resp = app.post("/v1/tenants").token(&admin()).header("idempotency-key", "big-1").json(&big).send().await;
    resp.problem(413, "payload_too_large");
    // A PATCH too.
    let t = tenant(&app, "small").await;
    let resp = app
        .patch(format!("/v1/tenants/{}", id(&t)))
        .token(&admin())
        .json(&json!({ "display_name": "y".repeat(1024 * 1024 + 10) }))
        .send()
        .await;
    resp.problem(413, "payload_too_large");
    assert_eq!(app.count("tenants").await, before[0].1 + 1);
    assert_eq!(app.count("machine_classes").await, before[1].1);
}

#[tokio::test]
async fn a_body_of_exactly_the_limit_is_not_413() {
    let app = TestApp::new().await;
    // Exactly 1 MiB of JSON: decoded and then refused for its values (display_name too long),
    // which shows the size check let it through.
    let skeleton = json!({ "name": "acme", "display_name": "" }).to_string();
    let pad = 1024 * 1024 - skeleton.len();
    let body = json!({ "name": "acme", "display_name": "x".repeat(pad) }).to_string();
    assert_eq!(body.len(), 1024 * 1024);
    let resp =
        app.post("/v1/tenants").token(&admin()).header("content-type", "application/json").raw(body).send().await;
    invalid(resp, "display_name");
    assert_eq!(app.count("tenants").await, 0);
}

// ---------------------------------------------------------------------------------------------
// Body shape: unknown fields, wrong types, missing fields

#[tokio::test]
async fn unknown_fields_are_422_naming_the_field() {
    let app = TestApp::new().await;
    machine_class(&app, "cpu", 0).await;
    let before = counts(&app).await;
    let cases = [
        ("/v1/tenants", json!({ "name": "acme", "bogus": 1 }), "bogus"),
        ("/v1/tenants", json!({ "name": "acme", "quotas": { "max_cpus": 3 } }), "quotas.max_cpus"),
        (
            "/v1/machine-classes",
            json!({ "name": "gpu", "cpu_cores": 1, "memory_gib": 1, "gpu_count": 0, "colour": "red" }),
            "colour",
        ),
        (
            "/v1/machines",
            {
                let mut b = enroll_body("m1", "cpu");
                b["bmc"]["port"] = json!(623);
                b
            },
            "bmc.port",
        ),
        (
            "/v1/machines",
            {
                let mut b = enroll_body("m1", "cpu");
                b["state"] = json!("available");
                b
            },
            "state",
        ),
    ];
    for (path, body, field) in cases {
        let resp = app.post(path).token(&admin()).json(&body).send().await;
        status_is(&resp, 422, &format!("POST {path} {body}"));
        let problem = invalid(resp, field);
        // The field path is exact, not a message to parse.
        assert_eq!(fields(&problem), vec![field.to_owned()], "{problem}");
    }
    assert_eq!(counts(&app).await, before);
}

#[tokio::test]
async fn server_owned_fields_are_unknown_fields_on_create() {
    let app = TestApp::new().await;
    for field in ["id", "state", "generation", "etag", "created_at"] {
        let mut body = json!({ "name": "acme" });
        body[field] = match field {
            "generation" => json!(7),
            "id" => json!(uuid::Uuid::now_v7()),
            _ => json!("x"),
        };
        invalid(app.post("/v1/tenants").token(&admin()).json(&body).send().await, field);
    }
    assert_eq!(app.count("tenants").await, 0);
}

#[tokio::test]
async fn wrong_types_are_422_naming_the_nested_field() {
    let app = TestApp::new().await;
    machine_class(&app, "cpu", 0).await;
    let before = counts(&app).await;
    let cases = [
        ("/v1/tenants", json!({ "name": "acme", "quotas": { "max_nodes": "lots" } }), "quotas.max_nodes"),
        ("/v1/tenants", json!({ "name": "acme", "quotas": { "max_gpus": -1 } }), "quotas.max_gpus"),
        ("/v1/tenants", json!({ "name": "acme", "quotas": { "max_clusters": 1.5 } }), "quotas.max_clusters"),
        ("/v1/tenants", json!({ "name": "acme", "quotas": { "max_nodes": 5_000_000_000_u64 } }), "quotas.max_nodes"),
        ("/v1/tenants", json!({ "name": "acme", "quotas": "none" }), "quotas"),
        ("/v1/tenants", json!({ "name": 42 }), "name"),
        ("/v1/tenants", json!({ "name": null }), "name"),
        ("/v1/tenants", json!({ "name": "acme", "labels": ["a"] }), "labels"),
        ("/v1/tenants", json!({ "name": "acme", "labels": { "team": 7 } }), "labels.team"),
        ("/v1/tenants", json!({ "name": "acme", "display_name": false }), "display_name"),
        (
            "/v1/machine-classes",
            json!({ "name": "gpu", "cpu_cores": "64", "memory_gib": 1, "gpu_count": 0 }),
            "cpu_cores",
        ),
        (
            "/v1/machine-classes",
            json!({ "name": "gpu", "cpu_cores": 64, "memory_gib": 1, "gpu_count": -2 }),
            "gpu_count",
        ),
        (
            "/v1/machines",
            {
                let mut b = enroll_body("m1", "cpu");
                b["bmc"]["insecure_tls"] = json!("yes");
                b
            },
            "bmc.insecure_tls",
        ),
        (
            "/v1/machines",
            {
                let mut b = enroll_body("m1", "cpu");
                b["bmc"] = json!("https://bmc.example");
                b
            },
            "bmc",
        ),
    ];
    for (path, body, field) in cases {
        let resp = app.post(path).token(&admin()).json(&body).send().await;
        status_is(&resp, 422, &format!("POST {path} {body}"));
        invalid(resp, field);
    }
    // A body that is JSON but not an object.
    for body in [json!([]), json!("acme"), json!(3), json!(null)] {
        let resp = app.post("/v1/tenants").token(&admin()).json(&body).send().await;
        status_is(&resp, 422, &format!("body {body}"));
        resp.problem(422, "validation_failed");
    }
    assert_eq!(counts(&app).await, before);
}

#[tokio::test]
async fn arrays_are_not_accepted_in_place_of_objects() {
    // Found as a bug: serde lets an array stand for a struct (fields by position), so `["acme"]`
    // created a tenant and `quotas: [1, 2, 3]` set all three quotas.
    let app = TestApp::new().await;
    // The whole body as an array: fields by position.
    let resp = app.post("/v1/tenants").token(&admin()).json(&json!(["acme"])).send().await;
    status_is(&resp, 422, "body [\"acme\"]");
    resp.problem(422, "validation_failed");
    // A nested object as an array.
    for quotas in [json!([]), json!([1, 2, 3])] {
        let resp =
            app.post("/v1/tenants").token(&admin()).json(&json!({ "name": "beta", "quotas": quotas })).send().await;
        status_is(&resp, 422, &format!("quotas {quotas}"));
        invalid(resp, "quotas");
    }
    assert_eq!(app.count("tenants").await, 0);
    // The same through a merge patch, which replaces an object with the array.
    let t = tenant(&app, "gamma").await;
    let path = format!("/v1/tenants/{}", id(&t));
    let resp = app.patch(&path).token(&admin()).json(&json!({ "quotas": [5] })).send().await;
    status_is(&resp, 422, "patch quotas [5]");
    invalid(resp, "quotas");
    let now = app.get(&path).token(&admin()).send().await.expect(200).json();
    assert_eq!(now["quotas"]["max_clusters"], Value::Null);
}

#[tokio::test]
async fn a_ca_cert_that_is_not_a_pem_certificate_is_422() {
    // Found as a bug: only the BEGIN line was looked for.
    let app = TestApp::new().await;
    machine_class(&app, "cpu", 0).await;
    for ca in [
        "-----BEGIN CERTIFICATE-----",
        "-----BEGIN CERTIFICATE-----\n!!! not base64 !!!\n-----END CERTIFICATE-----\n",
        "junk before -----BEGIN CERTIFICATE----- and no end",
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        &CERTIFICATE_PEM[..CERTIFICATE_PEM.len() / 2],
        &format!("junk\n{CERTIFICATE_PEM}"),
    ] {
        let mut body = enroll_body("m1", "cpu");
        body["bmc"]["ca_cert"] = json!(ca);
        let resp = app.post("/v1/machines").token(&admin()).json(&body).send().await;
        status_is(&resp, 422, &format!("ca_cert {ca:?}"));
        invalid(resp, "bmc.ca_cert");
    }
    assert_eq!(app.count("machines").await, 0);
    // A real certificate passes.
    let mut body = enroll_body("m1", "cpu");
    body["bmc"]["ca_cert"] = json!(CERTIFICATE_PEM);
    app.post("/v1/machines").token(&admin()).json(&body).send().await.expect(202);
}

#[tokio::test]
async fn missing_required_fields_are_422_naming_them() {
    let app = TestApp::new().await;
    machine_class(&app, "cpu", 0).await;
    let before = counts(&app).await;
    invalid(app.post("/v1/tenants").token(&admin()).json(&json!({})).send().await, "name");
    invalid(
        app.post("/v1/machine-classes")
            .token(&admin())
            .json(&json!({ "name": "gpu", "cpu_cores": 1, "memory_gib": 1 }))
            .send()
            .await,
        "gpu_count",
    );
    let mut no_bmc = enroll_body("m1", "cpu");
    no_bmc.as_object_mut().expect("object").remove("bmc");
    invalid(app.post("/v1/machines").token(&admin()).json(&no_bmc).send().await, "bmc");
    let mut no_password = enroll_body("m1", "cpu");
    no_password["bmc"].as_object_mut().expect("object").remove("password");
    invalid(app.post("/v1/machines").token(&admin()).json(&no_password).send().await, "bmc.password");
    let mut no_user = enroll_body("m1", "cpu");
    no_user["bmc"].as_object_mut().expect("object").remove("username");
    invalid(app.post("/v1/machines").token(&admin()).json(&no_user).send().await, "bmc.username");
    assert_eq!(counts(&app).await, before);
}

// ---------------------------------------------------------------------------------------------
// Values: names, labels, bounds

#[tokio::test]
async fn invalid_tenant_names_are_422_on_name() {
    let app = TestApp::new().await;
    let forty_one = "a".repeat(41);
    for name in ["Acme", "ACME", forty_one.as_str(), "-acme", "acme-", "", "ac_me", "ac.me", "ac me", "acmé", " acme"]
    {
        let resp = app.post("/v1/tenants").token(&admin()).json(&json!({ "name": name })).send().await;
        status_is(&resp, 422, &format!("name {name:?}"));
        invalid(resp, "name");
    }
    assert_eq!(app.count("tenants").await, 0);
    // The boundary itself is fine.
    app.post("/v1/tenants").token(&admin()).json(&json!({ "name": "a".repeat(40) })).send().await.expect(201);
    app.post("/v1/tenants").token(&admin()).json(&json!({ "name": "0" })).send().await.expect(201);
}

#[tokio::test]
async fn invalid_machine_class_and_machine_names_are_422_on_name() {
    let app = TestApp::new().await;
    machine_class(&app, "cpu", 0).await;
    let before = counts(&app).await;
    let sixty_four = "a".repeat(64);
    for name in ["Cpu", sixty_four.as_str(), "-cpu", "", "c_pu"] {
        invalid(app.post("/v1/machine-classes").token(&admin()).json(&class_body(name)).send().await, "name");
        invalid(app.post("/v1/machines").token(&admin()).json(&enroll_body(name, "cpu")).send().await, "name");
    }
    assert_eq!(counts(&app).await, before);
}

#[tokio::test]
async fn every_invalid_field_is_named_at_once() {
    let app = TestApp::new().await;
    let body = json!({
        "name": "Bad_Name",
        "display_name": "d".repeat(201),
        "labels": { "bad key": "v" },
        "quotas": { "max_nodes": 2_000_000 },
    });
    let problem = invalid(app.post("/v1/tenants").token(&admin()).json(&body).send().await, "name");
    let named = fields(&problem);
    for field in ["name", "display_name", "labels.bad key", "quotas.max_nodes"] {
        assert!(named.iter().any(|f| f == field), "{field} missing from {named:?}");
    }
    let class = json!({ "name": "X", "cpu_cores": 0, "memory_gib": 0, "gpu_model": "", "gpu_count": 65 });
    let problem = invalid(app.post("/v1/machine-classes").token(&admin()).json(&class).send().await, "name");
    let named = fields(&problem);
    for field in ["name", "cpu_cores", "memory_gib", "gpu_count"] {
        assert!(named.iter().any(|f| f == field), "{field} missing from {named:?}");
    }
    assert_eq!(counts(&app).await, vec![("tenants", 0), ("machine_classes", 0), ("machines", 0)]);
}

#[tokio::test]
async fn invalid_labels_are_422_naming_the_label() {
    let app = TestApp::new().await;
    let long = "v".repeat(64);
    let long_key = "k".repeat(64);
    let cases: Vec<(Value, String)> = vec![
        (json!({ "bad key": "v" }), "labels.bad key".into()),
        (json!({ "": "v" }), "labels.".into()),
        (json!({ "-team": "v" }), "labels.-team".into()),
        (json!({ long_key.clone(): "v" }), format!("labels.{long_key}")),
        (json!({ "Example.COM/team": "v" }), "labels.Example.COM/team".into()),
        (json!({ "/team": "v" }), "labels./team".into()),
        (json!({ "example.com/": "v" }), "labels.example.com/".into()),
        (json!({ "team": "has space" }), "labels.team".into()),
        (json!({ "team": long.clone() }), "labels.team".into()),
        (json!({ "team": "-edge" }), "labels.team".into()),
    ];
    for (labels, field) in cases {
        let resp =
            app.post("/v1/tenants").token(&admin()).json(&json!({ "name": "acme", "labels": labels })).send().await;
        status_is(&resp, 422, &format!("labels {labels}"));
        invalid(resp, &field);
    }
    let too_many: serde_json::Map<String, Value> = (0..65).map(|i| (format!("k{i}"), json!("v"))).collect();
    invalid(
        app.post("/v1/tenants").token(&admin()).json(&json!({ "name": "acme", "labels": too_many })).send().await,
        "labels",
    );
    // Machines check labels the same way.
    machine_class(&app, "cpu", 0).await;
    let mut body = enroll_body("m1", "cpu");
    body["labels"] = json!({ "rack": "r 1" });
    invalid(app.post("/v1/machines").token(&admin()).json(&body).send().await, "labels.rack");
    assert_eq!(app.count("tenants").await, 0);
    assert_eq!(app.count("machines").await, 0);
    // Valid Kubernetes labels pass.
    let ok = json!({ "example.com/team": "a.b_c-d", "x": "", "k8s.io/Name": "V1" });
    app.post("/v1/tenants").token(&admin()).json(&json!({ "name": "acme", "labels": ok })).send().await.expect(201);
}

// ---------------------------------------------------------------------------------------------
// Lists: limit and cursor

/// Every provider list.
const LISTS: [&str; 5] = ["/v1/tenants", "/v1/machine-classes", "/v1/machines", "/v1/operations", "/v1/audit-events"];

#[tokio::test]
async fn limit_out_of_range_is_422_on_limit() {
    let app = TestApp::new().await;
    for list in LISTS {
        for limit in ["0", "1001", "5000", "-1", "-1000"] {
            let resp = app.get(format!("{list}?limit={limit}")).token(&admin()).send().await;
            status_is(&resp, 422, &format!("{list}?limit={limit}"));
            invalid(resp, "limit");
        }
        app.get(format!("{list}?limit=1")).token(&admin()).send().await.expect(200);
        app.get(format!("{list}?limit=1000")).token(&admin()).send().await.expect(200);
    }
}

#[tokio::test]
async fn a_limit_that_is_not_a_number_is_400_invalid_parameter() {
    let app = TestApp::new().await;
    for list in LISTS {
        for limit in ["abc", "-", "1.5", "1e3", "", "%20", "10abc", "0x10", "+5"] {
            let resp = app.get(format!("{list}?limit={limit}")).token(&admin()).send().await;
            status_is(&resp, 400, &format!("{list}?limit={limit}"));
            let problem = resp.problem(400, "invalid_parameter");
            assert!(problem["detail"].as_str().is_some_and(|d| d.contains("limit")), "{problem}");
        }
    }
}

#[tokio::test]
async fn a_huge_numeric_limit_is_422_like_any_limit_above_the_maximum() {
    // Found as a bug (400 once the number overflowed u32); docs/api.md: above the maximum is 422.
    let app = TestApp::new().await;
    for limit in ["4294967296", "99999999999999999999", "-99999999999999999999"] {
        let resp = app.get(format!("/v1/tenants?limit={limit}")).token(&admin()).send().await;
        status_is(&resp, 422, &format!("limit={limit}"));
        invalid(resp, "limit");
    }
}

#[tokio::test]
async fn bad_cursors_are_400_invalid_cursor() {
    let app = TestApp::new().await;
    tenant(&app, "acme").await;
    let cursors = [
        "garbage!!".to_owned(),
        URL_SAFE_NO_PAD.encode("garbage"),
        URL_SAFE_NO_PAD.encode("{}"),
        URL_SAFE_NO_PAD.encode(r#"{"after":"not-a-uuid"}"#),
        URL_SAFE_NO_PAD.encode(r#"{"after":42}"#),
        URL_SAFE_NO_PAD.encode(r#"[1,2]"#),
        // Standard base64 with padding is not our alphabet.
        STANDARD.encode(format!(r#"{{"after": "{}"}}"#, uuid::Uuid::now_v7())),
    ];
    for list in LISTS {
        for cursor in &cursors {
            let resp = app.get(format!("{list}?cursor={cursor}")).token(&admin()).send().await;
            status_is(&resp, 400, &format!("{list}?cursor={cursor}"));
            resp.problem(400, "invalid_cursor");
        }
        // Control characters and over-long values are refused at the edge, in every query
        // parameter alike (the document bounds a cursor to 512 characters).
        for cursor in ["%00%01".to_owned(), "x".repeat(600)] {
            let resp = app.get(format!("{list}?cursor={cursor}")).token(&admin()).send().await;
            status_is(&resp, 400, &format!("{list}?cursor={cursor}"));
            resp.problem(400, "invalid_parameter");
        }
    }
    // A well-formed cursor of ours is accepted (the walk simply starts after that id).
    let good = URL_SAFE_NO_PAD.encode(format!(r#"{{"after":"{}"}}"#, uuid::Uuid::now_v7()));
    app.get(format!("/v1/tenants?cursor={good}")).token(&admin()).send().await.expect(200);
}

#[tokio::test]
async fn malformed_filters_are_400_invalid_parameter() {
    let app = TestApp::new().await;
    for query in [
        "/v1/machines?state=sleeping",
        "/v1/machines?tenant_id=not-a-uuid",
        "/v1/audit-events?from=yesterday",
        "/v1/audit-events?target_id=123",
        "/v1/audit-events?outcome=maybe",
    ] {
        let resp = app.get(query).token(&admin()).send().await;
        status_is(&resp, 400, query);
        resp.problem(400, "invalid_parameter");
    }
}

// ---------------------------------------------------------------------------------------------
// Machine enrollment

#[tokio::test]
async fn enrolling_with_an_unknown_machine_class_is_422_on_machine_class() {
    let app = TestApp::new().await;
    machine_class(&app, "cpu", 0).await;
    let before = counts(&app).await;
    let ops = app.count("operations").await;
    let problem = invalid(
        app.post("/v1/machines").token(&admin()).json(&enroll_body("m1", "nope")).send().await,
        "machine_class",
    );
    assert_eq!(fields(&problem), vec!["machine_class".to_owned()]);
    invalid(
        app.post("/v1/machines").token(&admin()).json(&enroll_body("m1", "Not A Class")).send().await,
        "machine_class",
    );
    assert_eq!(counts(&app).await, before);
    assert_eq!(app.count("operations").await, ops, "no operation for a refused enrollment");
}

#[tokio::test]
async fn enrolling_with_a_deleted_machine_class_is_422_on_machine_class() {
    let app = TestApp::new().await;
    machine_class(&app, "old", 0).await;
    app.delete("/v1/machine-classes/old").token(&admin()).send().await.expect(204);
    invalid(app.post("/v1/machines").token(&admin()).json(&enroll_body("m1", "old")).send().await, "machine_class");
    assert_eq!(app.count("machines").await, 0);
}

#[tokio::test]
async fn bad_bmc_access_is_422_on_the_bmc_field() {
    let app = TestApp::new().await;
    machine_class(&app, "cpu", 0).await;
    let before = counts(&app).await;
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut b = enroll_body("m1", "cpu");
        edit(&mut b);
        b
    };
    let cases = [
        (with(&|b| b["bmc"]["url"] = json!("ftp://bmc.example")), "bmc.url"),
        (with(&|b| b["bmc"]["url"] = json!("file:///etc/passwd")), "bmc.url"),
        (with(&|b| b["bmc"]["url"] = json!("ssh://root@bmc.example")), "bmc.url"),
        (with(&|b| b["bmc"]["url"] = json!("bmc.example")), "bmc.url"),
        (with(&|b| b["bmc"]["url"] = json!("https://")), "bmc.url"),
        (with(&|b| b["bmc"]["url"] = json!("")), "bmc.url"),
        (with(&|b| b["bmc"]["url"] = json!(format!("https://{}.example", "a".repeat(2100)))), "bmc.url"),
        (with(&|b| b["bmc"]["password"] = json!("")), "bmc.password"),
        (with(&|b| b["bmc"]["password"] = json!("p".repeat(1025))), "bmc.password"),
        (with(&|b| b["bmc"]["username"] = json!("")), "bmc.username"),
        (with(&|b| b["bmc"]["ca_cert"] = json!("not a certificate")), "bmc.ca_cert"),
        (
            with(&|b| b["bmc"]["ca_cert"] = json!("-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n")),
            "bmc.ca_cert",
        ),
        (
            with(&|b| {
                b["bmc"]["ca_cert"] = json!(CERTIFICATE_PEM);
                b["bmc"]["insecure_tls"] = json!(true);
            }),
            "bmc.insecure_tls",
        ),
        (with(&|b| b["bmc"]["system_id"] = json!("")), "bmc.system_id"),
    ];
    for (body, field) in cases {
        let resp = app.post("/v1/machines").token(&admin()).json(&body).send().await;
        status_is(&resp, 422, &format!("{field}: {}", body["bmc"]));
        let problem = invalid(resp, field);
        assert!(!problem.to_string().contains("s3cret-pw"), "the password is echoed: {problem}");
    }
    assert_eq!(counts(&app).await, before);
}

#[tokio::test]
async fn a_missing_bmc_password_is_422_and_never_echoed() {
    let app = TestApp::new().await;
    machine_class(&app, "cpu", 0).await;
    let mut body = enroll_body("m1", "cpu");
    body["bmc"].as_object_mut().expect("object").remove("password");
    invalid(app.post("/v1/machines").token(&admin()).json(&body).send().await, "bmc.password");
    let mut body = enroll_body("m1", "cpu");
    body["bmc"]["password"] = json!(null);
    invalid(app.post("/v1/machines").token(&admin()).json(&body).send().await, "bmc.password");
    assert_eq!(app.count("machines").await, 0);
}

// ---------------------------------------------------------------------------------------------
// PATCH

#[tokio::test]
async fn a_patch_that_is_not_an_object_is_422_and_changes_nothing() {
    let app = TestApp::new().await;
    let t = tenant(&app, "acme").await;
    machine_class(&app, "cpu", 0).await;
    let m = machine(&app, "m1", "cpu").await;
    let targets =
        [format!("/v1/tenants/{}", id(&t)), "/v1/machine-classes/cpu".to_owned(), format!("/v1/machines/{}", id(&m))];
    for path in &targets {
        for body in [json!([]), json!([{ "display_name": "x" }]), json!("x"), json!(1), json!(true), json!(null)] {
            for ct in ["application/merge-patch+json", "application/json"] {
                let resp = app.patch(path).token(&admin()).header("content-type", ct).json(&body).send().await;
                status_is(&resp, 422, &format!("PATCH {path} {body} ({ct})"));
                resp.problem(422, "validation_failed");
            }
        }
    }
    let now = app.get(&targets[0]).token(&admin()).send().await.expect(200).json();
    assert_eq!(now["generation"], t["generation"]);
    assert_eq!(now["name"], "acme");
    let now = app.get(&targets[2]).token(&admin()).send().await.expect(200).json();
    assert_eq!(now["generation"], m["generation"]);
    assert_eq!(now["labels"], m["labels"]);
}

#[tokio::test]
async fn a_patch_changing_the_immutable_name_is_422_on_name() {
    let app = TestApp::new().await;
    let t = tenant(&app, "acme").await;
    let path = format!("/v1/tenants/{}", id(&t));
    let problem = invalid(
        app.patch(&path)
            .token(&admin())
            .header("content-type", "application/merge-patch+json")
            .json(&json!({ "name": "other" }))
            .send()
            .await,
        "name",
    );
    assert_eq!(fields(&problem), vec!["name".to_owned()]);
    // Not even alongside a valid change: the whole patch is refused.
    invalid(
        app.patch(&path).token(&admin()).json(&json!({ "name": "other", "display_name": "Other" })).send().await,
        "name",
    );
    // Nor removed with null.
    invalid(app.patch(&path).token(&admin()).json(&json!({ "name": null })).send().await, "name");
    let now = app.get(&path).token(&admin()).send().await.expect(200).json();
    assert_eq!(now["name"], "acme");
    assert_eq!(now["display_name"], "acme");
    assert_eq!(now["generation"], t["generation"]);
    // Repeating the current name is no change.
    app.patch(&path).token(&admin()).json(&json!({ "name": "acme" })).send().await.expect(200);

    machine_class(&app, "cpu", 0).await;
    invalid(app.patch("/v1/machine-classes/cpu").token(&admin()).json(&json!({ "name": "gpu" })).send().await, "name");
    app.get("/v1/machine-classes/cpu").token(&admin()).send().await.expect(200);
    app.get("/v1/machine-classes/gpu").token(&admin()).send().await.problem(404, "not_found");
}

#[tokio::test]
async fn patch_field_errors_name_the_field_and_change_nothing() {
    let app = TestApp::new().await;
    let t = tenant(&app, "acme").await;
    let path = format!("/v1/tenants/{}", id(&t));
    for (patch, field) in [
        (json!({ "bogus": 1 }), "bogus"),
        (json!({ "quotas": { "max_nodes": "lots" } }), "quotas.max_nodes"),
        (json!({ "quotas": { "max_pods": 3 } }), "quotas.max_pods"),
        (json!({ "quotas": { "max_nodes": 2_000_000 } }), "quotas.max_nodes"),
        (json!({ "display_name": 5 }), "display_name"),
        (json!({ "labels": { "bad key": "v" } }), "labels.bad key"),
        (json!({ "state": "suspended" }), "state"),
        (json!({ "generation": 9 }), "generation"),
    ] {
        let resp = app
            .patch(&path)
            .token(&admin())
            .header("content-type", "application/merge-patch+json")
            .json(&patch)
            .send()
            .await;
        status_is(&resp, 422, &format!("patch {patch}"));
        invalid(resp, field);
    }
    let now = app.get(&path).token(&admin()).send().await.expect(200).json();
    assert_eq!(now["generation"], t["generation"]);
    assert_eq!(now["state"], "active");
    assert_eq!(now["quotas"], t["quotas"]);

    machine_class(&app, "cpu", 0).await;
    let m = machine(&app, "m1", "cpu").await;
    let mpath = format!("/v1/machines/{}", id(&m));
    for (patch, field) in [
        (json!({ "bmc": { "url": "ftp://bmc.example" } }), "bmc.url"),
        (json!({ "bmc": { "password": "" } }), "bmc.password"),
        (json!({ "bmc": { "ca_cert": "nope" } }), "bmc.ca_cert"),
        (json!({ "name": "m2" }), "name"),
        (json!({ "labels": { "rack": "r 1" } }), "labels.rack"),
    ] {
        let resp = app.patch(&mpath).token(&admin()).json(&patch).send().await;
        status_is(&resp, 422, &format!("machine patch {patch}"));
        invalid(resp, field);
    }
    let now = app.get(&mpath).token(&admin()).send().await.expect(200).json();
    assert_eq!(now["generation"], m["generation"]);
    assert_eq!(now["bmc"]["url"], m["bmc"]["url"]);
    assert_eq!(now["name"], "m1");
}

#[tokio::test]
async fn a_merge_patch_content_type_is_accepted() {
    let app = TestApp::new().await;
    let t = tenant(&app, "acme").await;
    let path = format!("/v1/tenants/{}", id(&t));
    let body = serde_json::to_vec(&json!({ "display_name": "Acme Corp", "labels": { "tier": "gold" } })).expect("json");
    let resp = app
        .patch(&path)
        .token(&admin())
        .header("content-type", "application/merge-patch+json")
        .raw(body)
        .send()
        .await
        .expect(200);
    let view = resp.json();
    assert_eq!(view["display_name"], "Acme Corp");
    assert_eq!(view["labels"]["tier"], "gold");
    // With a charset parameter, and removing a label with null (RFC 7396).
    let body = serde_json::to_vec(&json!({ "labels": { "tier": null } })).expect("json");
    let view = app
        .patch(&path)
        .token(&admin())
        .header("content-type", "application/merge-patch+json; charset=utf-8")
        .raw(body)
        .send()
        .await
        .expect(200)
        .json();
    assert_eq!(view["labels"], json!({}));
    assert_eq!(view["display_name"], "Acme Corp");
}

// ---------------------------------------------------------------------------------------------
// Routing

#[tokio::test]
async fn an_unknown_route_is_404_route_not_found() {
    let app = TestApp::new().await;
    let before = counts(&app).await;
    for path in [
        "/v1/nope",
        "/nope",
        "/v2/tenants",
        "/v1/tenant",
        "/v1/tenants/",
        "/v1/Tenants",
        "/v1/machine-classes/cpu/extra",
    ] {
        let resp = app.get(path).token(&admin()).send().await;
        status_is(&resp, 404, path);
        let problem = resp.problem(404, "route_not_found");
        assert_eq!(problem["instance"], path);
    }
    // Writes to unknown routes write nothing; without a token it is still a 404 of the route.
    app.post("/v1/tenant")
        .token(&admin())
        .json(&json!({ "name": "acme" }))
        .send()
        .await
        .problem(404, "route_not_found");
    app.post("/v1/nope").json(&json!({ "name": "acme" })).send().await.problem(404, "route_not_found");
    assert_eq!(counts(&app).await, before);
}

#[tokio::test]
async fn a_wrong_method_is_405_method_not_allowed() {
    let app = TestApp::new().await;
    let t = tenant(&app, "acme").await;
    let before = counts(&app).await;
    let tenant_path = format!("/v1/tenants/{}", id(&t));
    for (method, path) in [
        (http::Method::PUT, "/v1/tenants".to_owned()),
        (http::Method::DELETE, "/v1/tenants".to_owned()),
        (http::Method::PATCH, "/v1/tenants".to_owned()),
        (http::Method::PUT, tenant_path.clone()),
        (http::Method::POST, tenant_path.clone()),
        (http::Method::GET, format!("{tenant_path}/suspend")),
        (http::Method::PUT, "/v1/machine-classes/cpu".to_owned()),
        (http::Method::DELETE, "/v1/machines".to_owned()),
        (http::Method::POST, "/healthz".to_owned()),
    ] {
        let resp = app.req(method.clone(), &path).token(&admin()).json(&json!({ "name": "other" })).send().await;
        status_is(&resp, 405, &format!("{method} {path}"));
        resp.problem(405, "method_not_allowed");
    }
    assert_eq!(counts(&app).await, before);
    let now = app.get(&tenant_path).token(&admin()).send().await.expect(200).json();
    assert_eq!(now["generation"], t["generation"]);
}

#[tokio::test]
async fn a_405_names_the_allowed_methods() {
    let app = TestApp::new().await;
    let resp = app.req(http::Method::PUT, "/v1/tenants").token(&admin()).send().await;
    let allow = resp.header("allow").map(str::to_owned);
    resp.problem(405, "method_not_allowed");
    let allow = allow.expect("Allow header");
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
}

#[tokio::test]
async fn a_malformed_uuid_in_the_path_is_404() {
    let app = TestApp::new().await;
    tenant(&app, "acme").await;
    machine_class(&app, "cpu", 0).await;
    let before = counts(&app).await;
    for (method, path) in [
        (http::Method::GET, "/v1/tenants/not-a-uuid"),
        (http::Method::GET, "/v1/tenants/123"),
        (http::Method::GET, "/v1/tenants/00000000-0000-0000-0000-00000000000g"),
        (http::Method::PATCH, "/v1/tenants/not-a-uuid"),
        (http::Method::DELETE, "/v1/tenants/not-a-uuid"),
        (http::Method::POST, "/v1/tenants/not-a-uuid/suspend"),
        (http::Method::GET, "/v1/machines/xyz"),
        (http::Method::PATCH, "/v1/machines/xyz"),
        (http::Method::DELETE, "/v1/machines/xyz"),
        (http::Method::GET, "/v1/operations/xyz"),
        (http::Method::GET, "/v1/tenants/xyz/operations"),
        (http::Method::GET, "/v1/tenants/xyz/audit-events"),
    ] {
        let resp = app.req(method.clone(), path).token(&admin()).json(&json!({ "display_name": "x" })).send().await;
        status_is(&resp, 404, &format!("{method} {path}"));
        let problem = resp.problem(404, "not_found");
        assert_eq!(problem["instance"], path);
    }
    // A well-formed id of nothing answers the same.
    let missing = format!("/v1/tenants/{}", uuid::Uuid::now_v7());
    app.get(&missing).token(&admin()).send().await.problem(404, "not_found");
    assert_eq!(counts(&app).await, before);
}

#[tokio::test]
async fn bad_input_is_refused_after_authentication_and_authorization() {
    // Order of checks: 401 before anything about the body; 403 before the body is decoded.
    let app = TestApp::new().await;
    let resp = app.post("/v1/tenants").header("content-type", "text/plain").raw(&b"{"[..]).send().await;
    resp.problem(401, "missing_token");
    let resp = app.post("/v1/tenants").header("content-type", "application/json").raw(&b"{"[..]).send().await;
    resp.problem(401, "missing_token");
    let t = tenant(&app, "acme").await;
    let tid: uuid::Uuid = id(&t).parse().expect("uuid");
    let member = paddock_testkit::token(&["tenant:member"], Some(tid));
    let resp = app.post("/v1/tenants").token(&member).json(&json!({ "name": "Bad Name", "bogus": 1 })).send().await;
    resp.problem(403, "forbidden");
    let resp =
        app.post("/v1/tenants").token(&member).header("content-type", "application/json").raw(&b"{"[..]).send().await;
    resp.problem(403, "forbidden");
    assert_eq!(app.count("tenants").await, 1);
}

/// Text PostgreSQL cannot store (NUL) or that no field gives a meaning to (other controls) is a
/// 422 naming the field : it used to reach the database and fail
/// there as a 500.
#[tokio::test]
async fn control_characters_in_bodies_are_422_naming_the_field() {
    let app = TestApp::new().await;
    let t = id(&tenant(&app, "acme").await);
    machine_class(&app, "cpu", 0).await;
    let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL2AmpA4kI/TYTmjC3Vf+h3HQc/vvGHZNgUIITHqcjcJ alice\u{0}@laptop";
    let cluster = json!({ "name": "a", "kind": "slurm", "isolation": "private-nodes",
        "node_pools": [{ "name": "p", "machine_class": "cpu", "count": 1, "role": "system" }],
        "slurm": { "login": { "ssh_authorized_keys": [key] } } });
    let before = app.count("clusters").await;
    let problem = app
        .post(format!("/v1/tenants/{t}/clusters"))
        .token(&admin())
        .json(&cluster)
        .send()
        .await
        .problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["field"], "slurm.login.ssh_authorized_keys[0]", "{problem}");
    assert_eq!(app.count("clusters").await, before, "nothing written");
    for (body, field) in [
        (json!({ "name": "t2", "display_name": "bell\u{7}" }), "display_name"),
        (json!({ "name": "t3", "labels": { "rack": "r\u{1b}[31m" } }), "labels.rack"),
        (json!({ "name": "t4", "labels": { "k\u{0}": "v" } }), "labels.k\u{0}"),
    ] {
        let problem =
            app.post("/v1/tenants").token(&admin()).json(&body).send().await.problem(422, "validation_failed");
        assert_eq!(problem["errors"][0]["field"], field, "{problem}");
    }
    // Line breaks and tabs keep their meaning.
    let body = json!({ "name": "t5", "display_name": "two\tcolumns" });
    app.post("/v1/tenants").token(&admin()).json(&body).send().await.expect(201);
}

/// The audit filters the fuzzer found: a NUL, invalid UTF-8 or an over-long value in a query
/// parameter is a 400 or 422, never a 500.
#[tokio::test]
async fn control_characters_and_bad_utf8_in_query_parameters_are_400() {
    let app = TestApp::new().await;
    let t = id(&tenant(&app, "acme").await);
    for query in ["actor=a%00b", "action=tenant.%00", "actor=%FF%FE", "action=%C3", "act%00or=x", "actor=%1B"] {
        for path in ["/v1/audit-events".to_owned(), format!("/v1/tenants/{t}/audit-events")] {
            app.get(format!("{path}?{query}")).token(&admin()).send().await.problem(400, "invalid_parameter");
        }
    }
    let long = "a".repeat(257);
    let resp = app.get(format!("/v1/audit-events?actor={long}")).token(&admin()).send().await;
    assert!(matches!(resp.status.as_u16(), 400 | 422), "an actor over 256 characters: {}", resp.status);
    app.get("/v1/audit-events?actor=alice%20smith").token(&admin()).send().await.expect(200);
}
