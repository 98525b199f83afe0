//! The committed OpenAPI document is what the code generates, and it is complete.

use paddock_testkit::TestApp;
use serde_json::Value;

const REGENERATE: &str = "cargo run --bin paddock -- openapi   (writes openapi/openapi.json)";

#[test]
fn committed_openapi_document_matches_the_code() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let generated = paddock_api::openapi_json();
    if committed != generated {
        let line = committed.lines().zip(generated.lines()).position(|(a, b)| a != b).unwrap_or(0) + 1;
        panic!("openapi/openapi.json is out of date (first difference at line {line}); regenerate it with:\n    {REGENERATE}");
    }
}

#[test]
fn every_operation_has_an_id_responses_and_security() {
    let doc: Value = serde_json::from_str(&paddock_api::openapi_json()).expect("json");
    assert_eq!(doc["openapi"], "3.1.0");
    let mut ids = std::collections::HashSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("item") {
            let id = op["operationId"].as_str().unwrap_or_else(|| panic!("{method} {path} has no operationId"));
            assert!(ids.insert(id.to_owned()), "duplicate operationId {id}");
            let responses = op["responses"].as_object().expect("responses");
            assert!(responses.keys().any(|s| s.starts_with('2')), "{id} lists no success response");
            assert!(op.get("security").is_some(), "{id} declares no security requirement");
            if path.starts_with("/v1/agent/seed/") {
                // The BMC's fetch: the seed token in the path is the credential.
                assert_eq!(op["security"], serde_json::json!([{}]), "{id} must not ask for a bearer token");
            } else if path.starts_with("/v1/agent/") {
                // Machine-facing: the run's agent token is the bearer, not a JWT.
                assert_eq!(op["security"], serde_json::json!([{ "agent_token": [] }]), "{id} takes the agent token");
            } else if path.starts_with("/v1/") {
                let default = &responses["default"]["content"]["application/problem+json"]["schema"];
                assert_eq!(default["$ref"], "#/components/schemas/Problem", "{id} lacks the Problem default response");
                assert_eq!(op["security"][0]["bearer"], serde_json::json!([]), "{id} must require a bearer token");
            }
        }
    }
    assert!(ids.len() >= 28, "only {} operations documented", ids.len());
}

#[tokio::test]
async fn the_served_document_is_the_generated_one() {
    let app = TestApp::new().await;
    let resp = app.get("/openapi.json").send().await.expect(200);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    assert_eq!(resp.body, paddock_api::openapi_json().as_bytes());
}

/// What a portal team reads from the document alone: every operation says what it does, every
/// request body shows an example, every failure status names its problem codes, no parameter is
/// listed twice, and every authenticated operation lists its 401, 403, 429 and 503.
#[test]
fn every_operation_is_described_with_its_failures_and_examples() {
    let doc: Value = serde_json::from_str(&paddock_api::openapi_json()).expect("json");
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("item") {
            let id = op["operationId"].as_str().expect("id");
            let description = op["description"].as_str().unwrap_or_default();
            assert!(description.len() >= 20, "{id} has no description");
            for p in op["parameters"].as_array().into_iter().flatten() {
                assert!(p["description"].is_string(), "{id}: parameter {} has no description", p["name"]);
            }
            let mut seen = std::collections::HashSet::new();
            for p in op["parameters"].as_array().into_iter().flatten() {
                assert!(seen.insert(p["name"].as_str().expect("name")), "{id} lists {} twice", p["name"]);
            }
            if let Some(body) = op.get("requestBody") {
                for (media, content) in body["content"].as_object().expect("content") {
                    let schema = &content["schema"];
                    let example = content.get("example").or_else(|| {
                        let name = schema["$ref"].as_str()?.rsplit('/').next()?;
                        doc["components"]["schemas"][name].get("example")
                    });
                    assert!(example.is_some(), "{id}: the {media} body has no example");
                }
            }
            let responses = op["responses"].as_object().expect("responses");
            for (status, response) in responses {
                if status.starts_with('4') {
                    let codes = response["x-problem-codes"].as_array();
                    assert!(codes.is_some_and(|c| !c.is_empty()), "{id}: {status} names no problem code");
                }
            }
            if op["security"][0].get("bearer").is_some() {
                for status in ["401", "403", "429", "503"] {
                    assert!(responses.contains_key(status), "{method} {path} ({id}) does not list {status}");
                }
            }
        }
    }
}

/// The media types the served document lists for a body are what the server accepts: a PATCH
/// (a JSON merge patch) takes `application/merge-patch+json` and `application/json`, every other
/// body `application/json` only; a media type the document does not list for the operation is 415.
#[tokio::test]
async fn the_documented_body_media_types_are_the_accepted_ones() {
    let app = TestApp::new().await;
    let doc: Value = app.get("/openapi.json").send().await.expect(200).json();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("item") {
            let Some(body) = op.get("requestBody") else { continue };
            let mut media: Vec<&str> =
                body["content"].as_object().expect("content").keys().map(String::as_str).collect();
            media.sort_unstable();
            let want: &[&str] = match method.as_str() {
                "patch" => &["application/json", "application/merge-patch+json"],
                _ => &["application/json"],
            };
            assert_eq!(media, want, "{method} {path}");
        }
    }
    let admin = paddock_testkit::admin();
    let created = app.post("/v1/tenants").token(&admin).json(&serde_json::json!({ "name": "acme" })).send().await;
    let tenant = created.expect(201).json();
    let path = format!("/v1/tenants/{}", tenant["id"].as_str().expect("id"));
    for (n, ct) in ["application/merge-patch+json", "application/json"].into_iter().enumerate() {
        let body = format!(r#"{{"display_name": "Acme {n}"}}"#);
        app.patch(&path).token(&admin).header("content-type", ct).raw(body).send().await.expect(200);
    }
    let resp = app
        .post("/v1/tenants")
        .token(&admin)
        .header("content-type", "application/merge-patch+json")
        .raw(&br#"{"name": "globex"}"#[..])
        .send()
        .await;
    resp.problem(415, "unsupported_media_type");
}
