//! Every answer an API test sees is held to the OpenAPI document: its status is one the
//! operation lists (not only through `default`), and a problem's `code` is one of those the
//! listed status names (`x-problem-codes`, `paddock_api::routes::doc`). So the document cannot
//! drift from what the server sends while the tests pass. A YAML answer is parsed, as a client
//! that parses YAML does (schemathesis), and must have the documented schema's type and required
//! properties. Answers to requests no operation
//! matches (an unknown route or method), and 500s (a bug the test itself reports), are not
//! checked.
//!
//! With `PADDOCK_TEST_CONTRACT_LOG=<file>` a mismatch is appended to that file instead of
//! failing the test (to list every gap at once while editing the document).

use std::io::Write;
use std::sync::LazyLock;

use http::{HeaderMap, Method, StatusCode};
use serde_json::Value;

static DOCUMENT: LazyLock<Value> =
    LazyLock::new(|| serde_json::from_str(&paddock_api::openapi_json()).expect("the OpenAPI document is JSON"));

/// Checks one answer; panics (or logs) when the document does not list it.
pub(crate) fn check(method: &Method, uri: &str, status: StatusCode, headers: &HeaderMap, body: &[u8]) {
    if status == StatusCode::INTERNAL_SERVER_ERROR {
        return;
    }
    let path = uri.split('?').next().unwrap_or(uri);
    let Some((template, op)) = operation(method, path) else { return };
    let id = op["operationId"].as_str().unwrap_or("?");
    let Some(response) = op["responses"].get(status.as_str()) else {
        return mismatch(format!("{method} {template} ({id}) answered {status}, which the document does not list"));
    };
    if headers.get(http::header::CONTENT_TYPE).is_some_and(|v| v == "application/yaml") {
        if let Err(why) = yaml_conforms(&response["content"]["application/yaml"]["schema"], body) {
            return mismatch(format!("{method} {template} ({id}) answered {status} with YAML {why}"));
        }
    }
    let problem = headers.get(http::header::CONTENT_TYPE).is_some_and(|v| v == "application/problem+json");
    let Some(codes) = response.get("x-problem-codes").and_then(Value::as_array) else { return };
    let code = if problem { serde_json::from_slice::<Value>(body).ok().map(|p| p["code"].clone()) } else { None };
    match code {
        Some(code) if codes.contains(&code) => {}
        Some(code) => mismatch(format!(
            "{method} {template} ({id}) answered {status} with code {code}, which the document does not list there"
        )),
        None => mismatch(format!("{method} {template} ({id}) answered {status} without a problem+json body")),
    }
}

/// Whether a YAML `body`, parsed, has the type of `schema` (a `$ref` resolved) and its required
/// properties; `Err` says what it lacks.
fn yaml_conforms(schema: &Value, body: &[u8]) -> Result<(), String> {
    let schema = match schema["$ref"].as_str().and_then(|r| r.strip_prefix("#/components/schemas/")) {
        Some(name) => &DOCUMENT["components"]["schemas"][name],
        None => schema,
    };
    if schema.is_null() {
        return Err("that the document does not describe".to_owned());
    }
    let parsed: Value = serde_yaml::from_slice(body).map_err(|e| format!("that does not parse: {e}"))?;
    let kind = match &parsed {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    if let Some(documented) = schema["type"].as_str().filter(|t| *t != kind) {
        return Err(format!("that parses to {kind}, where the document says {documented}"));
    }
    let missing: Vec<&str> = (schema["required"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .filter(|name| parsed.get(name).is_none())
        .collect();
    if !missing.is_empty() {
        return Err(format!("without its required {missing:?}"));
    }
    Ok(())
}

/// The operation whose path template matches `path` (the most literal one when several do).
fn operation(method: &Method, path: &str) -> Option<(&'static str, &'static Value)> {
    let segments: Vec<&str> = path.split('/').collect();
    let paths = DOCUMENT["paths"].as_object()?;
    let mut best: Option<(usize, &str, &Value)> = None;
    for (template, item) in paths {
        let parts: Vec<&str> = template.split('/').collect();
        if parts.len() != segments.len() || !parts.iter().zip(&segments).all(|(t, s)| segment_matches(t, s)) {
            continue;
        }
        let Some(op) = item.get(method.as_str().to_ascii_lowercase()) else { continue };
        let literal = parts.iter().filter(|t| !t.contains('{')).count();
        if best.is_none_or(|(n, _, _)| literal > n) {
            best = Some((literal, template, op));
        }
    }
    best.map(|(_, template, op)| (template, op))
}

/// A template segment (`name`, `{id}` or `{token}.iso`) against a path segment.
fn segment_matches(template: &str, segment: &str) -> bool {
    match (template.find('{'), template.find('}')) {
        (Some(open), Some(close)) => {
            let (prefix, suffix) = (&template[..open], &template[close + 1..]);
            segment.len() > prefix.len() + suffix.len() && segment.starts_with(prefix) && segment.ends_with(suffix)
        }
        _ => template == segment,
    }
}

fn mismatch(message: String) {
    match std::env::var_os("PADDOCK_TEST_CONTRACT_LOG") {
        Some(file) => {
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(file).expect("contract log");
            let test = std::thread::current().name().unwrap_or("?").to_owned();
            let _ = writeln!(f, "{message} [{test}]");
        }
        None => {
            panic!("{message}\n(the answers an operation gives are listed in crates/paddock-api/src/routes/doc.rs)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_match_their_segments_and_the_most_literal_wins() {
        assert!(segment_matches("{id}", "abc"));
        assert!(!segment_matches("{id}", ""));
        assert!(segment_matches("{seed_token}.iso", "x.iso"));
        assert!(!segment_matches("{seed_token}.iso", ".iso"));
        assert!(!segment_matches("tenants", "machines"));
        let (template, _) = operation(&Method::GET, "/v1/usage/periods/2026-11").expect("an operation");
        assert_eq!(template, "/v1/usage/periods/{period}");
        let (template, _) = operation(&Method::POST, "/v1/machines").expect("an operation");
        assert_eq!(template, "/v1/machines");
        assert!(operation(&Method::PUT, "/v1/machines").is_none());
    }
}
