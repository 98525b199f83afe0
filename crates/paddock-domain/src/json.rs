//! JSON decoding with field paths, and RFC 7396 merge patch. Every body goes through `decode`, so
//! syntax errors (400) and field errors (422, naming the field) look the same everywhere, and every
//! PATCH goes through `apply_patch`, so all resources share one merge mechanism.

use paddock_types::problem::FieldError;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::Error;

/// Why a body did not decode.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON at all (400).
    #[error("the body is not valid JSON: {0}")]
    Syntax(String),
    /// JSON of the wrong shape (422).
    #[error("invalid field {field}: {message}")]
    Data {
        /// Dotted path of the field.
        field: String,
        /// What is wrong.
        message: String,
    },
}

impl DecodeError {
    /// The field error of a data error.
    pub fn into_error(self) -> Error {
        match self {
            DecodeError::Syntax(message) => Error::BadRequest { code: "malformed_body", message },
            DecodeError::Data { field, message } => Error::invalid(field, message),
        }
    }
}

/// Decodes `bytes` into `T`, naming the offending field on a shape error.
pub fn decode<T: DeserializeOwned + Serialize>(bytes: &[u8]) -> Result<T, DecodeError> {
    from_value(parse(bytes)?)
}

/// Parses `bytes` as JSON (400 when it is not) whose strings hold no control character a field
/// never allows (422 naming the field).
pub fn parse(bytes: &[u8]) -> Result<Value, DecodeError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| DecodeError::Syntax(syntax_message(&e)))?;
    if let Some(field) = control_character(&value, "") {
        let field = if field.is_empty() { "body".to_owned() } else { field };
        return Err(DecodeError::Data { field, message: crate::validate::CONTROL_MESSAGE.to_owned() });
    }
    Ok(value)
}

/// The path of the first string (value or key) with a control character no field allows.
fn control_character(value: &Value, path: &str) -> Option<String> {
    let join = |key: &str| if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") };
    let bad = |s: &str| s.chars().any(crate::validate::is_forbidden_control);
    match value {
        Value::String(s) => bad(s).then(|| path.to_owned()),
        Value::Object(map) => map.iter().find_map(|(k, v)| {
            let field = join(k);
            if bad(k) {
                Some(field)
            } else {
                control_character(v, &field)
            }
        }),
        Value::Array(items) => {
            items.iter().enumerate().find_map(|(n, v)| control_character(v, &format!("{path}[{n}]")))
        }
        _ => None,
    }
}

/// Decodes an already-parsed JSON value into `T`, naming the offending field. serde lets a JSON
/// array stand for a struct (its fields in order); the API does not, so the decoded value is
/// compared with the input and an array where an object belongs is refused.
pub fn from_value<T: DeserializeOwned + Serialize>(value: Value) -> Result<T, DecodeError> {
    let decoded: T = decode_value(value.clone())?;
    let shape = serde_json::to_value(&decoded).unwrap_or(Value::Null);
    match array_for_object(&value, &shape, "") {
        None => Ok(decoded),
        Some(field) => Err(DecodeError::Data {
            field: if field.is_empty() { "body".to_owned() } else { field },
            message: "must be a JSON object, not an array".to_owned(),
        }),
    }
}

/// The path of the first place where `input` has an array and the decoded `output` an object.
fn array_for_object(input: &Value, output: &Value, path: &str) -> Option<String> {
    let join = |key: &str| if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") };
    match (input, output) {
        (Value::Array(_), Value::Object(_)) => Some(path.to_owned()),
        (Value::Object(i), Value::Object(o)) => {
            i.iter().find_map(|(k, v)| o.get(k).and_then(|ov| array_for_object(v, ov, &join(k))))
        }
        (Value::Array(i), Value::Array(o)) => {
            i.iter().zip(o).enumerate().find_map(|(n, (iv, ov))| array_for_object(iv, ov, &format!("{path}[{n}]")))
        }
        _ => None,
    }
}

fn decode_value<T: DeserializeOwned>(value: Value) -> Result<T, DecodeError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        let message = e.into_inner().to_string();
        // serde names the missing field in the message only; lift it into the path.
        let field = match (field.is_empty(), missing_field(&message)) {
            (true, Some(missing)) => missing.to_owned(),
            (false, Some(missing)) => format!("{field}.{missing}"),
            (_, None) => field,
        };
        let field = if field.is_empty() { "body".to_owned() } else { field };
        DecodeError::Data { field, message: json_terms(&strip_position(&message)) }
    })
}

/// serde's "invalid type: string \"x\", expected u32" in JSON's terms: "invalid type: string
/// \"x\", expected an integer from 0 to 4294967295". What was found and what was expected are
/// named as a JSON document has them (object, array, number, null), never as Rust types.
fn json_terms(message: &str) -> String {
    let Some((found, expected)) = message.split_once(", expected ") else { return message.to_owned() };
    let found = [("map", "object"), ("sequence", "array"), ("floating point", "number"), ("unit value", "null")]
        .iter()
        .fold(found.to_owned(), |f, (rust, json)| match f.split_once(": ") {
            Some((kind, what)) if what == *rust || what.starts_with(&format!("{rust} ")) => {
                format!("{kind}: {json}{}", &what[rust.len()..])
            }
            _ => f,
        });
    let expected = match expected {
        "u8" => "an integer from 0 to 255".to_owned(),
        "u16" => "an integer from 0 to 65535".to_owned(),
        "u32" => "an integer from 0 to 4294967295".to_owned(),
        "u64" | "usize" => "an integer of at least 0".to_owned(),
        "i32" => "an integer from -2147483648 to 2147483647".to_owned(),
        "i64" | "isize" => "an integer".to_owned(),
        "f32" | "f64" => "a number".to_owned(),
        "a map" => "an object".to_owned(),
        "a sequence" => "an array".to_owned(),
        "a borrowed string" | "a string" => "a string".to_owned(),
        "unit" => "null".to_owned(),
        other if other.starts_with("struct ") => "an object".to_owned(),
        other => other.to_owned(),
    };
    format!("{found}, expected {expected}")
}

fn missing_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("missing field `")?;
    rest.split('`').next()
}

fn syntax_message(e: &serde_json::Error) -> String {
    format!("{} at line {} column {}", strip_position(&e.to_string()), e.line(), e.column())
}

/// serde_json appends " at line X column Y" to messages; a value-level message has no position.
fn strip_position(message: &str) -> String {
    match message.find(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

/// Applies an RFC 7396 merge patch to `target` in place.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(patch_map) => {
            if !target.is_object() {
                *target = Value::Object(serde_json::Map::new());
            }
            if let Value::Object(target_map) = target {
                for (key, value) in patch_map {
                    if value.is_null() {
                        target_map.remove(key);
                    } else {
                        merge_patch(target_map.entry(key.clone()).or_insert(Value::Null), value);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Applies a merge patch to a spec: the patch must be an object, `immutable` top-level fields may
/// be repeated unchanged but not altered, and the result must decode into the spec type again
/// (unknown fields and wrong types are field errors).
pub fn apply_patch<S: Serialize + DeserializeOwned>(
    current: &S,
    patch: &Value,
    immutable: &[&str],
) -> Result<S, Error> {
    let Value::Object(patch_map) = patch else {
        return Err(Error::invalid("body", "a merge patch must be a JSON object"));
    };
    let original = serde_json::to_value(current).map_err(Error::internal)?;
    let mut errors = Vec::new();
    for field in immutable {
        if let Some(new) = patch_map.get(*field) {
            if original.get(*field) != Some(new) {
                errors.push(FieldError { field: (*field).to_owned(), message: "cannot be changed".to_owned() });
            }
        }
    }
    if !errors.is_empty() {
        return Err(Error::Invalid(errors));
    }
    let mut merged = original;
    merge_patch(&mut merged, patch);
    from_value(merged).map_err(DecodeError::into_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Spec {
        name: String,
        #[serde(default)]
        size: Option<u32>,
        #[serde(default)]
        labels: std::collections::BTreeMap<String, String>,
    }

    #[test]
    fn merge_patch_follows_rfc_7396() {
        let mut target = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut target, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(target, json!({"a": "z", "c": {"d": "e"}}));
    }

    #[test]
    fn patch_removes_labels_and_resets_nullable_fields() {
        let current = Spec { name: "x".into(), size: Some(3), labels: [("k".into(), "v".into())].into() };
        let patched = apply_patch(&current, &json!({"size": null, "labels": {"k": null, "n": "m"}}), &["name"])
            .expect("patch applies");
        assert_eq!(patched, Spec { name: "x".into(), size: None, labels: [("n".into(), "m".into())].into() });
    }

    #[test]
    fn patch_refuses_immutable_and_unknown_fields() {
        let current = Spec { name: "x".into(), size: None, labels: Default::default() };
        assert!(apply_patch(&current, &json!({"name": "x"}), &["name"]).is_ok());
        let Err(Error::Invalid(errors)) = apply_patch(&current, &json!({"name": "y"}), &["name"]) else {
            panic!("expected a field error");
        };
        assert_eq!(errors[0].field, "name");
        let Err(Error::Invalid(errors)) = apply_patch(&current, &json!({"bogus": 1}), &["name"]) else {
            panic!("expected a field error");
        };
        assert!(errors[0].message.contains("bogus"), "{errors:?}");
    }

    #[test]
    fn arrays_do_not_stand_for_objects() {
        let err = decode::<Spec>(br#"["x"]"#).expect_err("array for the body");
        assert!(matches!(err, DecodeError::Data { ref field, .. } if field == "body"), "{err:?}");
        #[derive(Debug, Serialize, Deserialize)]
        struct Outer {
            inner: Spec,
        }
        let err = decode::<Outer>(br#"{"inner": ["x"]}"#).expect_err("array for a nested object");
        assert!(matches!(err, DecodeError::Data { ref field, .. } if field == "inner"), "{err:?}");
    }

    #[test]
    fn type_errors_are_in_json_terms() {
        let message = |body: &[u8]| match decode::<Spec>(body).expect_err("wrong type") {
            DecodeError::Data { message, .. } => message,
            e @ DecodeError::Syntax(_) => panic!("{e}"),
        };
        assert_eq!(
            message(br#"{"name": "x", "size": "big"}"#),
            "invalid type: string \"big\", expected an integer from 0 to 4294967295"
        );
        assert_eq!(
            message(br#"{"name": "x", "size": -1}"#),
            "invalid value: integer `-1`, expected an integer from 0 to 4294967295"
        );
        assert_eq!(
            message(br#"{"name": "x", "size": 1.5}"#),
            "invalid type: number `1.5`, expected an integer from 0 to 4294967295"
        );
        assert_eq!(message(br#"{"name": {}, "size": 1}"#), "invalid type: object, expected a string");
        assert_eq!(message(br#"{"name": [], "size": 1}"#), "invalid type: array, expected a string");
        assert_eq!(message(br#"{"name": null, "size": 1}"#), "invalid type: null, expected a string");
        assert_eq!(message(br#""x""#), "invalid type: string \"x\", expected an object");
    }

    #[test]
    fn decode_names_nested_fields() {
        let err = decode::<Spec>(br#"{"name": "x", "size": "big"}"#).expect_err("wrong type");
        let DecodeError::Data { field, .. } = err else { panic!("expected data error") };
        assert_eq!(field, "size");
        let err = decode::<Spec>(br#"{}"#).expect_err("missing");
        let DecodeError::Data { field, .. } = err else { panic!("expected data error") };
        assert_eq!(field, "name");
        assert!(matches!(decode::<Spec>(b"{"), Err(DecodeError::Syntax(_))));
    }
}
