//! The documented shape of every request body, read from the OpenAPI document itself: what the
//! document promises (types, `minimum`/`maximum`, lengths, patterns, enums, required and unknown
//! fields) is what a body is checked against, and every field that does not fit is reported at
//! once, in the document's terms (never a Rust type's range).

use std::collections::HashMap;
use std::sync::LazyLock;

use paddock_service::{BodyShape, Reading};
use paddock_types::problem::FieldError;
use serde_json::{Map, Value};

/// The OpenAPI document, parsed once.
static DOCUMENT: LazyLock<Value> = LazyLock::new(|| serde_json::from_str(&crate::openapi_json()).unwrap_or_default());

/// Each operation's request body schema, by method and route template.
static SHAPES: LazyLock<HashMap<(String, String), Shape>> = LazyLock::new(|| {
    let mut shapes = HashMap::new();
    for (path, item) in DOCUMENT["paths"].as_object().into_iter().flatten() {
        for (method, op) in item.as_object().into_iter().flatten() {
            let content = op["requestBody"]["content"].as_object();
            if let Some(schema) = content.and_then(|c| c.values().next()).map(|c| &c["schema"]) {
                shapes.insert((method.to_ascii_uppercase(), path.clone()), Shape { schema });
            }
        }
    }
    shapes
});

/// Compiled `pattern`s, by pattern.
static PATTERNS: LazyLock<HashMap<&'static str, regex::Regex>> = LazyLock::new(|| {
    let mut patterns = HashMap::new();
    collect_patterns(&DOCUMENT, &mut patterns);
    patterns
});

fn collect_patterns(value: &'static Value, out: &mut HashMap<&'static str, regex::Regex>) {
    match value {
        Value::Object(map) => {
            if let Some(p) = map.get("pattern").and_then(Value::as_str) {
                if let Ok(re) = regex::Regex::new(p) {
                    out.insert(p, re);
                }
            }
            map.iter().filter(|(k, _)| *k != "example" && *k != "examples").for_each(|(_, v)| collect_patterns(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| collect_patterns(v, out)),
        _ => {}
    }
}

/// The request body schema of one operation.
#[derive(Debug)]
pub struct Shape {
    schema: &'static Value,
}

/// The documented body shape of the operation `method` `route` (a route template), if it takes
/// a body.
pub fn body_shape(method: &http::Method, route: &str) -> Option<&'static dyn BodyShape> {
    SHAPES.get(&(method.as_str().to_owned(), route.to_owned())).map(|s| s as &'static dyn BodyShape)
}

impl BodyShape for Shape {
    fn check(&self, value: &Value, reading: Reading<'_>) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let at = match reading {
            Reading::Whole => At { path: String::new(), patch: false, unchecked: &[] },
            Reading::Patch { immutable } => At { path: String::new(), patch: true, unchecked: immutable },
        };
        check(self.schema, value, &at, &mut errors);
        errors
    }
}

/// Where a value is checked: its field path; whether in a merge patch (where any field may be
/// left out); the top-level fields left unchecked.
struct At<'a> {
    path: String,
    patch: bool,
    unchecked: &'a [&'a str],
}

impl At<'_> {
    /// A field or item under this one.
    fn under(&self, path: String) -> At<'static> {
        At { path, patch: self.patch, unchecked: &[] }
    }
}

/// A schema with its `$ref`s followed.
fn resolve(schema: &'static Value) -> &'static Value {
    let mut schema = schema;
    for _ in 0..16 {
        let Some(name) = schema["$ref"].as_str().and_then(|r| r.strip_prefix("#/components/schemas/")) else {
            break;
        };
        schema = &DOCUMENT["components"]["schemas"][name];
    }
    schema
}

fn push(errors: &mut Vec<FieldError>, path: &str, message: String) {
    let field = if path.is_empty() { "body".to_owned() } else { path.to_owned() };
    errors.push(FieldError { field, message });
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Checks `value` at `path` against `schema`, adding what does not fit to `errors`.
fn check(schema: &'static Value, value: &Value, at: &At<'_>, errors: &mut Vec<FieldError>) {
    let schema = resolve(schema);
    let path = at.path.as_str();
    if let Some(alternatives) = schema["oneOf"].as_array().or_else(|| schema["anyOf"].as_array()) {
        return check_alternatives(alternatives, value, at, errors);
    }
    for part in schema["allOf"].as_array().into_iter().flatten() {
        check(part, value, at, errors);
    }
    let types = types(schema);
    if !types.is_empty() && !types.iter().any(|t| is_type(value, t)) {
        return push(errors, path, expected(schema, &types));
    }
    if let Some(allowed) = schema["enum"].as_array() {
        if !allowed.contains(value) {
            let names: Vec<String> = allowed.iter().map(|v| format!("`{}`", v.as_str().unwrap_or_default())).collect();
            return push(errors, path, format!("must be one of {}", names.join(", ")));
        }
    }
    match value {
        Value::Number(_) => check_number(schema, value, path, &types, errors),
        Value::String(s) => check_string(schema, s, path, errors),
        Value::Array(items) => {
            let (min, max) = (schema["minItems"].as_u64(), schema["maxItems"].as_u64());
            let n = items.len() as u64;
            if min.is_some_and(|m| n < m) || max.is_some_and(|m| n > m) {
                push(errors, path, format!("must have {}", range(min, max, "item", "items")));
            }
            if !schema["items"].is_null() {
                for (i, item) in items.iter().enumerate() {
                    check(&schema["items"], item, &at.under(format!("{path}[{i}]")), errors);
                }
            }
        }
        Value::Object(map) => check_object(schema, map, at, errors),
        _ => {}
    }
}

/// `oneOf`/`anyOf`: null where a `null` alternative allows it, else the one alternative that is
/// not null (an optional object), else whichever alternative fits.
fn check_alternatives(alternatives: &'static [Value], value: &Value, at: &At<'_>, errors: &mut Vec<FieldError>) {
    let (nulls, others): (Vec<&'static Value>, Vec<&'static Value>) =
        alternatives.iter().partition(|a| resolve(a)["type"] == "null");
    if value.is_null() && !nulls.is_empty() {
        return;
    }
    if let [only] = others[..] {
        return check(only, value, at, errors);
    }
    let fits = others.iter().any(|a| {
        let mut scratch = Vec::new();
        check(a, value, at, &mut scratch);
        scratch.is_empty()
    });
    if !fits {
        push(errors, &at.path, "does not have any of the documented shapes".to_owned());
    }
}

fn check_object(schema: &'static Value, map: &Map<String, Value>, at: &At<'_>, errors: &mut Vec<FieldError>) {
    let properties = schema["properties"].as_object();
    if !at.patch {
        for name in schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            if !map.contains_key(name) {
                push(errors, &join(&at.path, name), "is required".to_owned());
            }
        }
    }
    for (key, item) in map.iter().filter(|(key, _)| !at.unchecked.contains(&key.as_str())) {
        let field = at.under(join(&at.path, key));
        match properties.and_then(|p| p.get(key)) {
            Some(property) => check(property, item, &field, errors),
            None => match &schema["additionalProperties"] {
                Value::Bool(false) => {
                    let mut accepted: Vec<&str> = properties.into_iter().flatten().map(|(k, _)| k.as_str()).collect();
                    accepted.sort_unstable();
                    let message = if accepted.is_empty() {
                        "is not a field of this request: it takes none".to_owned()
                    } else {
                        format!("is not a field of this request; its fields are {}", accepted.join(", "))
                    };
                    push(errors, &field.path, message);
                }
                additional @ Value::Object(_) => check(additional, item, &field, errors),
                _ => {}
            },
        }
    }
}

fn check_number(schema: &Value, value: &Value, path: &str, types: &[&str], errors: &mut Vec<FieldError>) {
    let Some(n) = value.as_f64() else { return };
    let (min, max) = (schema["minimum"].as_f64(), schema["maximum"].as_f64());
    if min.is_some_and(|m| n < m) || max.is_some_and(|m| n > m) {
        push(errors, path, expected(schema, types));
    }
}

fn check_string(schema: &Value, s: &str, path: &str, errors: &mut Vec<FieldError>) {
    let n = s.chars().count() as u64;
    let (min, max) = (schema["minLength"].as_u64(), schema["maxLength"].as_u64());
    if min.is_some_and(|m| n < m) || max.is_some_and(|m| n > m) {
        return push(errors, path, format!("must be {}", range(min, max, "character", "characters")));
    }
    if let Some(pattern) = schema["pattern"].as_str() {
        if PATTERNS.get(pattern).is_some_and(|re| !re.is_match(s)) {
            return push(errors, path, format!("must match the pattern {pattern}"));
        }
    }
    let well_formed = match schema["format"].as_str() {
        Some("uuid") => uuid::Uuid::try_parse(s).is_ok(),
        Some("date-time") => chrono::DateTime::parse_from_rfc3339(s).is_ok(),
        _ => true,
    };
    if !well_formed {
        let what = if schema["format"] == "uuid" { "a UUID" } else { "an RFC 3339 timestamp" };
        push(errors, path, format!("must be {what}"));
    }
}

/// The schema's `type`s (one or a list).
fn types(schema: &Value) -> Vec<&str> {
    match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

fn is_type(value: &Value, t: &str) -> bool {
    match t {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => true,
    }
}

/// What a field of `schema` must be, with its bounds: "must be an integer from 0 to 10000".
fn expected(schema: &Value, types: &[&str]) -> String {
    let (min, max) = (schema["minimum"].as_f64(), schema["maximum"].as_f64());
    let bounds = match (min, max) {
        (Some(min), Some(max)) => format!(" from {} to {}", number(min), number(max)),
        (Some(min), None) => format!(" of at least {}", number(min)),
        (None, Some(max)) => format!(" of at most {}", number(max)),
        (None, None) => String::new(),
    };
    let mut kinds: Vec<String> = types
        .iter()
        .filter(|t| **t != "null")
        .map(|t| match *t {
            "integer" => format!("an integer{bounds}"),
            "number" => format!("a number{bounds}"),
            "string" => "a string".to_owned(),
            "boolean" => "true or false".to_owned(),
            "array" => "an array".to_owned(),
            "object" => "an object".to_owned(),
            other => other.to_owned(),
        })
        .collect();
    if types.contains(&"null") {
        kinds.push("null".to_owned());
    }
    format!("must be {}", kinds.join(" or "))
}

/// A bound as the document has it: `10000`, not `10000.0`.
fn number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    }
}

/// "1 to 30 characters", "at most 32 items", "at least 1 character".
fn range(min: Option<u64>, max: Option<u64>, one: &str, many: &str) -> String {
    let noun = |n: u64| if n == 1 { one } else { many };
    match (min, max) {
        (Some(min), Some(max)) => format!("{min} to {max} {many}"),
        (Some(min), None) => format!("at least {min} {}", noun(min)),
        (None, Some(max)) => format!("at most {max} {}", noun(max)),
        (None, None) => String::new(),
    }
}
