//! A sweep over the OpenAPI document the server serves: a NUL,
//! invalid UTF-8 and an over-long string (one past `maxLength`, or 100,000 characters where none
//! is documented) go into every path and query parameter and every string field of every request body it
//! lists, on real objects (so no 404 answers first), each body field inside an otherwise valid
//! body. Every answer must be a 4xx problem+json; any other answer is listed.

use serde_json::{json, Value};

use paddock_testkit::{admin, TestApp};

use crate::common::{id, machine, machine_class, tenant};

/// Where the sweep puts its bad strings: `"\u{0}"` (NUL), invalid UTF-8, or too long.
#[derive(Clone, Copy, Debug)]
enum Bad {
    Nul,
    InvalidUtf8,
    TooLong,
}

const BADS: [Bad; 3] = [Bad::Nul, Bad::InvalidUtf8, Bad::TooLong];

/// Stands for the invalid UTF-8 in a serialized body (replaced by the bytes FF FE).
const MARKER: &str = "SWEEP-INVALID-UTF8";

/// A valid body of each request schema; the sweep spoils one field at a time.
fn valid_body(schema: &str, tenant_id: &str) -> Value {
    match schema {
        "TenantCreate" => json!({ "name": "sweep-tenant", "display_name": "Sweep", "labels": { "a": "b" } }),
        "TenantUpdate" => json!({ "display_name": "Sweep", "labels": { "a": "b" } }),
        "MachineClassCreate" => json!({ "name": "sweep-class", "cpu_cores": 32, "memory_gib": 256,
            "gpu_model": "", "gpu_count": 0, "description": "d" }),
        "MachineClassUpdate" => json!({ "description": "patched" }),
        "MachineEnroll" => json!({ "name": "sweep-node", "machine_class": "gpu-h100", "labels": { "rack": "r1" },
            "bmc": { "url": "https://bmc-sweep.example:443", "username": "admin", "password": "s3cret-pw" } }),
        "MachineUpdate" => json!({ "labels": { "rack": "r2" } }),
        "MaintenanceEnter" => json!({ "reason": "fan replacement" }),
        "ClusterCreate" => json!({ "name": "sweep-cluster", "kind": "kubernetes", "isolation": "private-nodes",
            "node_pools": [{ "name": "gpu", "machine_class": "gpu-h100", "count": 1 }] }),
        "ClusterUpdate" => json!({ "kubernetes_version": "v1.36.1" }),
        "NodePoolCreate" => json!({ "name": "sweep-pool", "machine_class": "gpu-h100", "count": 1 }),
        "NodePoolUpdate" => json!({ "labels": { "batch": "b1" } }),
        "UsageAdjustmentCreate" => json!({ "tenant_id": tenant_id, "machine_class": "gpu-h100", "node_seconds": 1,
            "gpu_seconds": 0, "control_plane_seconds": 0, "reason": "correction" }),
        _ => json!({}),
    }
}

/// `$ref`s followed, `null` alternatives dropped: the schema a value must match.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    if let Some(name) = schema["$ref"].as_str().and_then(|r| r.strip_prefix("#/components/schemas/")) {
        return resolve(doc, &doc["components"]["schemas"][name]);
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(alternatives) = schema[key].as_array() {
            if let Some(first) = alternatives.iter().find(|s| s["type"] != "null") {
                return resolve(doc, first);
            }
        }
    }
    schema
}

/// Every string field of `schema`: its path (object keys, `0` for an array's item, `sweep` for a
/// map's key) and its `maxLength`.
fn string_fields(doc: &Value, schema: &Value, path: &mut Vec<String>, out: &mut Vec<(Vec<String>, Option<u64>)>) {
    let schema = resolve(doc, schema);
    if path.len() > 6 {
        return;
    }
    let is_string =
        schema["type"] == "string" || schema["type"].as_array().is_some_and(|t| t.contains(&json!("string")));
    if is_string {
        out.push((path.clone(), schema["maxLength"].as_u64()));
    }
    let mut nested = |key: String, child: &Value| {
        path.push(key);
        string_fields(doc, child, path, out);
        path.pop();
    };
    if let Some(properties) = schema["properties"].as_object() {
        for (key, child) in properties {
            nested(key.clone(), child);
        }
    }
    if schema["items"].is_object() {
        nested("0".to_owned(), &schema["items"]);
    }
    if schema["additionalProperties"].is_object() {
        nested("sweep".to_owned(), &schema["additionalProperties"]);
    }
}

/// `body` with the value at `path` replaced by `value` (objects and arrays made as needed).
fn spoil(body: &Value, path: &[String], value: Value) -> Value {
    let mut body = body.clone();
    let mut at = &mut body;
    for key in path {
        at = match key.parse::<usize>() {
            Ok(n) => {
                if !at.is_array() {
                    *at = json!([]);
                }
                let items = at.as_array_mut().expect("an array");
                while items.len() <= n {
                    items.push(json!({}));
                }
                &mut items[n]
            }
            Err(_) => {
                if !at.is_object() {
                    *at = json!({});
                }
                at.as_object_mut().expect("an object").entry(key.clone()).or_insert(Value::Null)
            }
        };
    }
    *at = value;
    body
}

/// The bad string, as a JSON value (invalid UTF-8 as the marker) and as a query value.
fn bad_string(bad: Bad, max: Option<u64>) -> (String, String) {
    // A URI holds at most 64 KiB: 10,000 characters stand for "too long" in a query.
    let long = |undocumented| "a".repeat(max.map_or(undocumented, |m| m as usize + 1));
    match bad {
        Bad::Nul => ("sweep\u{0}".to_owned(), "sweep%00".to_owned()),
        Bad::InvalidUtf8 => (MARKER.to_owned(), "sweep%FF%FE".to_owned()),
        Bad::TooLong => (long(100_000), long(10_000)),
    }
}

/// The fixtures' ids for the path's parameters.
fn fill(path: &str, ids: &[(&str, String)]) -> String {
    ids.iter().fold(path.to_owned(), |p, (name, value)| p.replace(&format!("{{{name}}}"), value))
}

/// What is wrong with an answer, if anything.
fn judge(resp: &paddock_testkit::Resp) -> Option<String> {
    let problem = resp.header("content-type") == Some("application/problem+json");
    (!resp.status.is_client_error() || !problem).then(|| format!("{} {:?}", resp.status, resp.header("content-type")))
}

/// Sends every bad string to every query parameter and body field of `doc`; returns the
/// requests not answered with a 4xx problem.
async fn sweep(app: &TestApp, doc: &Value, ids: &[(&str, String)], tenant_id: &str) -> (usize, Vec<String>) {
    let (mut sent, mut wrong) = (0, Vec::new());
    for (template, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("a path item") {
            let path = fill(template, ids);
            let method: http::Method = method.to_uppercase().parse().expect("a method");
            for param in op["parameters"].as_array().into_iter().flatten().filter(|p| p["in"] == "path") {
                let (name, max) =
                    (param["name"].as_str().expect("a name"), resolve(doc, &param["schema"])["maxLength"].as_u64());
                for bad in BADS {
                    let spoiled = template.replace(&format!("{{{name}}}"), &bad_string(bad, max).1);
                    let resp = app.req(method.clone(), fill(&spoiled, ids)).token(&admin()).send().await;
                    sent += 1;
                    if let Some(what) = judge(&resp) {
                        wrong.push(format!("{method} {template} path {name} {bad:?}: {what}"));
                    }
                }
            }
            for param in op["parameters"].as_array().into_iter().flatten().filter(|p| p["in"] == "query") {
                let (name, max) =
                    (param["name"].as_str().expect("a name"), resolve(doc, &param["schema"])["maxLength"].as_u64());
                for bad in BADS {
                    let url = format!("{path}?{name}={}", bad_string(bad, max).1);
                    let resp = app.req(method.clone(), &url).token(&admin()).send().await;
                    sent += 1;
                    if let Some(what) = judge(&resp) {
                        wrong.push(format!("{method} {template} query {name} {bad:?}: {what}"));
                    }
                }
            }
            let Some(schema) = op["requestBody"]["content"]["application/json"]["schema"].as_object() else { continue };
            let schema_name =
                schema.get("$ref").and_then(Value::as_str).unwrap_or_default().rsplit('/').next().unwrap_or_default();
            let base = valid_body(schema_name, tenant_id);
            let mut fields = Vec::new();
            string_fields(doc, &Value::Object(schema.clone()), &mut Vec::new(), &mut fields);
            for (field, max) in fields {
                for bad in BADS {
                    let body =
                        serde_json::to_string(&spoil(&base, &field, json!(bad_string(bad, max).0))).expect("json");
                    let body = match body.split_once(MARKER) {
                        Some((before, after)) => [before.as_bytes(), &[0xFF, 0xFE], after.as_bytes()].concat(),
                        None => body.into_bytes(),
                    };
                    let resp = app
                        .req(method.clone(), &path)
                        .token(&admin())
                        .header("content-type", "application/json")
                        .raw(body)
                        .send()
                        .await;
                    sent += 1;
                    if let Some(what) = judge(&resp) {
                        wrong.push(format!("{method} {template} body {} {bad:?}: {what}", field.join(".")));
                    }
                }
            }
        }
    }
    (sent, wrong)
}

#[tokio::test]
async fn every_documented_string_refuses_nul_invalid_utf8_and_over_long_values() {
    let app = TestApp::new().await;
    let doc = app.get("/openapi.json").send().await.expect(200).json();
    let t = id(&tenant(&app, "acme").await);
    machine_class(&app, "gpu-h100", 8).await;
    let m = id(&machine(&app, "node-1", "gpu-h100").await);
    let cluster = json!({ "name": "c1", "kind": "kubernetes", "isolation": "private-nodes",
        "node_pools": [{ "name": "gpu", "machine_class": "gpu-h100", "count": 1 }] });
    let created =
        app.post(format!("/v1/tenants/{t}/clusters")).token(&admin()).json(&cluster).send().await.expect(202).json();
    let c = id(&created["cluster"]);
    let pools =
        app.get(format!("/v1/tenants/{t}/clusters/{c}/node-pools")).token(&admin()).send().await.expect(200).json();
    let p = id(&pools["items"][0]);
    let ids = [
        ("tenant_id", t.clone()),
        ("cluster_id", c),
        ("pool_id", p),
        ("machine_id", m),
        ("name", "gpu-h100".to_owned()),
        ("operation_id", uuid::Uuid::now_v7().to_string()),
        ("period", "2026-11".to_owned()),
        ("seed_token", "A".repeat(43)),
    ];
    let (sent, wrong) = sweep(&app, &doc, &ids, &t).await;
    assert!(sent > 500, "only {sent} requests: the sweep found too little in the document");
    assert!(wrong.is_empty(), "{} of {sent} answers were not a 4xx problem:\n{}", wrong.len(), wrong.join("\n"));
}
