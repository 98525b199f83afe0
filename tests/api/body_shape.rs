//! A body is checked against the shape its operation documents: every field that does not fit
//! is reported at once, in the document's bounds, and an unknown field's message lists only the
//! fields the request takes.

use paddock_testkit::{admin, Resp, TestApp};
use serde_json::{json, Value};

use crate::common::{id, machine, machine_class, tenant};

/// `(field, message)` of a 422's errors, sorted by field.
#[track_caller]
fn errors(resp: Resp) -> Vec<(String, String)> {
    let problem = resp.problem(422, "validation_failed");
    let mut errors: Vec<(String, String)> = problem["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("no errors: {problem}"))
        .iter()
        .map(|e| (e["field"].as_str().expect("field").to_owned(), e["message"].as_str().expect("message").to_owned()))
        .collect();
    errors.sort();
    errors
}

/// The words of a message (`display_name` is one word, `name` another).
fn words(message: &str) -> Vec<&str> {
    message.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| !w.is_empty()).collect()
}

#[tokio::test]
async fn every_field_off_the_document_is_reported_at_once_in_its_bounds() {
    let app = TestApp::new().await;
    machine_class(&app, "cpu", 0).await;
    let t = tenant(&app, "acme").await;
    let pools = json!([
        { "name": "a", "machine_class": "cpu", "count": -1 },
        { "name": "b", "machine_class": "cpu", "count": 10001 },
        { "name": "c", "machine_class": "cpu", "count": "3" },
        { "name": "d", "machine_class": "cpu", "count": 5_000_000_000_u64 },
    ]);
    let body = json!({ "name": "a", "kind": "kubernetes", "isolation": "private-nodes", "node_pools": pools });
    let path = format!("/v1/tenants/{}/clusters", id(&t));
    let got = errors(app.post(&path).token(&admin()).json(&body).send().await);
    let count = |i: u32| (format!("node_pools[{i}].count"), "must be an integer from 0 to 10000".to_owned());
    assert_eq!(got, [count(0), count(1), count(2), count(3)]);

    // Types, bounds and enums of several fields, nested ones too, in one answer.
    let body = json!({ "name": "globex", "display_name": false, "quotas": { "max_nodes": "lots", "max_gpus": -1 } });
    let got = errors(app.post("/v1/tenants").token(&admin()).json(&body).send().await);
    let max = "must be an integer from 0 to 1000000 or null".to_owned();
    let want = [
        ("display_name".to_owned(), "must be a string".to_owned()),
        ("quotas.max_gpus".to_owned(), max.clone()),
        ("quotas.max_nodes".to_owned(), max),
    ];
    assert_eq!(got, want);
    let body = json!({ "name": "b", "kind": "docker", "isolation": "shared" });
    let fields: Vec<String> =
        errors(app.post(&path).token(&admin()).json(&body).send().await).into_iter().map(|(field, _)| field).collect();
    assert_eq!(fields, ["isolation", "kind"]);
    assert_eq!(app.count("clusters").await, 0);
    assert_eq!(app.count("tenants").await, 1);
}

#[tokio::test]
async fn a_patch_is_checked_against_its_documented_shape() {
    let app = TestApp::new().await;
    let t = tenant(&app, "acme").await;
    let path = format!("/v1/tenants/{}", id(&t));
    let patch = json!({ "quotas": { "max_nodes": -5, "max_gpus": 1.5 }, "display_name": 3 });
    let got = errors(app.patch(&path).token(&admin()).json(&patch).send().await);
    let fields: Vec<&str> = got.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(fields, ["display_name", "quotas.max_gpus", "quotas.max_nodes"], "{got:?}");
    assert!(got.iter().all(|(_, m)| !m.contains("4294967295")), "{got:?}");
    // Repeating the immutable name unchanged is still no change.
    app.patch(&path).token(&admin()).json(&json!({ "name": "acme" })).send().await.expect(200);
}

/// A PATCH's path and body, the unknown field, fields its message lists and fields it must not.
type Case = (String, Value, &'static str, &'static [&'static str], &'static [&'static str]);

#[tokio::test]
async fn an_unknown_field_lists_only_the_fields_the_request_takes() {
    let app = TestApp::new().await;
    machine_class(&app, "cpu", 0).await;
    let t = tenant(&app, "acme").await;
    let m = machine(&app, "m1", "cpu").await;
    let cluster = json!({ "name": "one", "kind": "kubernetes", "isolation": "private-nodes" });
    let clusters = format!("/v1/tenants/{}/clusters", id(&t));
    let created = app.post(&clusters).token(&admin()).json(&cluster).send().await.expect(202).json();
    let cases: [Case; 4] = [
        (
            format!("/v1/tenants/{}", id(&t)),
            json!({ "bogus": 1 }),
            "bogus",
            &["display_name", "labels", "quotas"],
            &["name", "state", "id"],
        ),
        (
            format!("{clusters}/{}", id(&created["cluster"])),
            json!({ "bogus": 1 }),
            "bogus",
            &["kubernetes_version", "slurm", "stack_version"],
            &["name", "kind", "isolation", "status"],
        ),
        (
            format!("/v1/machines/{}", id(&m)),
            json!({ "bmc": { "port": 623 } }),
            "bmc.port",
            &["url", "username", "password", "ca_cert"],
            &[],
        ),
        (
            "/v1/machine-classes/cpu".to_owned(),
            json!({ "colour": "red" }),
            "colour",
            &["description", "cpu_cores"],
            &["name"],
        ),
    ];
    for (path, patch, field, listed, refused) in cases {
        let got = errors(app.patch(&path).token(&admin()).json(&patch).send().await);
        let [(named, message)] = &got[..] else { panic!("PATCH {path}: {got:?}") };
        assert_eq!(named, field, "PATCH {path}: {got:?}");
        let words = words(message);
        for f in listed {
            assert!(words.contains(f), "PATCH {path}: {f} is not listed in {message:?}");
        }
        for f in refused {
            assert!(!words.contains(f), "PATCH {path}: {f} is listed in {message:?}");
        }
    }
}
