//! SCIM PATCH (RFC 7644, section 3.5.2): `add`, `remove` and `replace` operations applied to a
//! rendered resource, which is then read again as a whole (`resource::parse_user` or
//! `parse_group`), so a PATCH is checked exactly like a PUT. Paths are `attr`, `attr.sub`,
//! `urn:...:attr`, `attr[filter]` and `attr[filter].sub`; operation names and attribute names are
//! case-insensitive. Two habits of identity providers are accepted: Entra ID's
//! `{"op": "Remove", "path": "members", "value": [{"value": id}]}` and boolean strings.

use serde_json::{Map, Value};

use super::filter::{parse_attr_path, AttrPath, CompareOp, Filter};
use super::{
    get_ci, invalid_path, invalid_syntax, invalid_value, key_ci, no_target, GROUP_SCHEMA, PATCH_OP, USER_SCHEMA,
};
use crate::Result;

/// The most operations one PATCH may carry.
const MAX_OPERATIONS: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Add,
    Remove,
    Replace,
}

/// A parsed PATCH path.
#[derive(Debug)]
struct Path {
    attr: AttrPath,
    filter: Option<Filter>,
    /// The sub-attribute after a filter (`emails[type eq "work"].value`).
    sub_after: Option<String>,
}

fn parse_path(text: &str) -> Result<Path> {
    let bad = |why: &str| invalid_path(format!("{:?} is not a path: {why}", text.chars().take(64).collect::<String>()));
    let Some(open) = text.find('[') else {
        let attr = parse_attr_path(text.trim()).map_err(|_| bad("not an attribute"))?;
        return Ok(Path { attr, filter: None, sub_after: None });
    };
    let close = text.rfind(']').ok_or_else(|| bad("a `[` is not closed"))?;
    let attr = parse_attr_path(text[..open].trim()).map_err(|_| bad("not an attribute"))?;
    if attr.sub.is_some() {
        return Err(bad("a filter follows a sub-attribute"));
    }
    let filter = Filter::parse(&text[open + 1..close]).map_err(|e| bad(&e.to_string()))?;
    let sub_after = match &text[close + 1..] {
        "" => None,
        rest => Some(
            rest.strip_prefix('.')
                .filter(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                .ok_or_else(|| bad("only `.sub` may follow a filter"))?
                .to_owned(),
        ),
    };
    Ok(Path { attr, filter: Some(filter), sub_after })
}

/// Applies a PATCH request's operations to `resource` (rendered SCIM JSON); `extensions` are the
/// resource's extension schema URNs (attributes under them live in their own object).
pub fn apply(resource: &mut Value, body: &Value, extensions: &[&str]) -> Result<()> {
    let o = body.as_object().ok_or_else(|| invalid_syntax("the body must be a JSON object"))?;
    let is_patch = get_ci(o, "schemas")
        .and_then(Value::as_array)
        .is_some_and(|s| s.iter().any(|v| v.as_str().is_some_and(|v| v.eq_ignore_ascii_case(PATCH_OP))));
    if !is_patch {
        return Err(invalid_syntax(format!("`schemas` must name {PATCH_OP}")));
    }
    let ops = get_ci(o, "Operations").and_then(Value::as_array).filter(|ops| !ops.is_empty());
    let ops = ops.ok_or_else(|| invalid_syntax("`Operations` must be a non-empty array"))?;
    if ops.len() > MAX_OPERATIONS {
        return Err(invalid_syntax(format!("at most {MAX_OPERATIONS} operations")));
    }
    for op in ops {
        let op = op.as_object().ok_or_else(|| invalid_syntax("each operation must be an object"))?;
        let name = get_ci(op, "op").and_then(Value::as_str).unwrap_or_default().to_ascii_lowercase();
        let kind = match name.as_str() {
            "add" => Op::Add,
            "remove" => Op::Remove,
            "replace" => Op::Replace,
            _ => return Err(invalid_syntax(format!("{name:?} is not add, remove or replace"))),
        };
        let value = get_ci(op, "value");
        match get_ci(op, "path") {
            None | Some(Value::Null) => apply_without_path(resource, kind, value, extensions)?,
            Some(Value::String(path)) => match extensions.iter().find(|e| e.eq_ignore_ascii_case(path.trim())) {
                // The extension itself: its attributes, as an object.
                Some(ext) => apply_extension(resource, kind, ext, value, extensions)?,
                None => apply_at(resource, kind, &parse_path(path)?, value, extensions)?,
            },
            Some(_) => return Err(invalid_path("path must be a string")),
        }
    }
    Ok(())
}

/// `add` or `replace` without a path: the value is an object of attributes to set.
fn apply_without_path(resource: &mut Value, kind: Op, value: Option<&Value>, extensions: &[&str]) -> Result<()> {
    if kind == Op::Remove {
        return Err(no_target("remove needs a path"));
    }
    let value =
        value.and_then(Value::as_object).ok_or_else(|| invalid_value("without a path, value must be an object"))?;
    for (key, v) in value {
        let ext = extensions.iter().find(|e| e.eq_ignore_ascii_case(key));
        match (ext, v) {
            (Some(ext), Value::Object(attrs)) => {
                for (attr, v) in attrs {
                    let path = AttrPath { urn: Some((*ext).to_owned()), attr: attr.clone(), sub: None };
                    set(resource, kind, &path, v.clone(), extensions)?;
                }
            }
            _ => {
                let path = parse_attr_path(key).map_err(|_| invalid_path(format!("{key:?} is not an attribute")))?;
                set(resource, kind, &path, v.clone(), extensions)?;
            }
        }
    }
    Ok(())
}

/// An operation whose path is an extension's URN: `add` and `replace` set the attributes of the
/// object given, `remove` drops the extension's attributes.
fn apply_extension(
    resource: &mut Value,
    kind: Op,
    ext: &str,
    value: Option<&Value>,
    extensions: &[&str],
) -> Result<()> {
    if kind == Op::Remove {
        let root = resource.as_object_mut().ok_or_else(|| invalid_syntax("the resource is not an object"))?;
        if let Some(key) = key_ci(root, ext) {
            root.remove(&key);
        }
        return Ok(());
    }
    let attrs = value.and_then(Value::as_object).ok_or_else(|| invalid_value(format!("{ext} takes an object")))?;
    for (attr, v) in attrs {
        let path = AttrPath { urn: Some(ext.to_owned()), attr: attr.clone(), sub: None };
        set(resource, kind, &path, v.clone(), extensions)?;
    }
    Ok(())
}

/// The object an attribute lives in: the resource, or its extension's object (made when missing).
fn container<'a>(resource: &'a mut Value, path: &AttrPath, extensions: &[&str]) -> Result<&'a mut Map<String, Value>> {
    let root = resource.as_object_mut().ok_or_else(|| invalid_syntax("the resource is not an object"))?;
    let Some(urn) = path.urn.as_deref() else { return Ok(root) };
    if urn.eq_ignore_ascii_case(USER_SCHEMA) || urn.eq_ignore_ascii_case(GROUP_SCHEMA) {
        return Ok(root);
    }
    let ext = extensions
        .iter()
        .find(|e| e.eq_ignore_ascii_case(urn))
        .ok_or_else(|| invalid_path(format!("{urn} is not a schema of this resource")))?;
    let key = key_ci(root, ext).unwrap_or_else(|| (*ext).to_owned());
    let slot = root.entry(key).or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    slot.as_object_mut().ok_or_else(|| invalid_path("the extension is not an object"))
}

/// Sets (add, replace) an attribute or sub-attribute named without a filter.
fn set(resource: &mut Value, kind: Op, path: &AttrPath, value: Value, extensions: &[&str]) -> Result<()> {
    let c = container(resource, path, extensions)?;
    let key = key_ci(c, &path.attr).unwrap_or_else(|| path.attr.clone());
    match &path.sub {
        Some(sub) => {
            let slot = c.entry(key).or_insert_with(|| Value::Object(Map::new()));
            match slot {
                Value::Object(o) => {
                    let sub_key = key_ci(o, sub).unwrap_or_else(|| sub.clone());
                    o.insert(sub_key, value);
                }
                Value::Array(items) => {
                    for item in items.iter_mut().filter_map(Value::as_object_mut) {
                        let sub_key = key_ci(item, sub).unwrap_or_else(|| sub.clone());
                        item.insert(sub_key, value.clone());
                    }
                }
                other => *other = Value::Object(Map::from_iter([(sub.clone(), value)])),
            }
        }
        None => match (kind, c.get_mut(&key), value) {
            // `add` to a multi-valued attribute appends what is not there yet.
            (Op::Add, Some(Value::Array(items)), value) => {
                let new = match value {
                    Value::Array(new) => new,
                    one => vec![one],
                };
                for v in new {
                    if !items.iter().any(|i| same_value(i, &v)) {
                        items.push(v);
                    }
                }
            }
            // A complex attribute takes the sub-attributes given, keeping the others.
            (_, Some(Value::Object(current)), Value::Object(new)) => {
                for (k, v) in new {
                    let k2 = key_ci(current, &k).unwrap_or(k);
                    current.insert(k2, v);
                }
            }
            (_, _, value) => {
                c.insert(key, value);
            }
        },
    }
    Ok(())
}

/// Two values of a multi-valued attribute are the same when equal, or when both are complex with
/// the same `value`.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a.as_object().and_then(|a| get_ci(a, "value")), b.as_object().and_then(|b| get_ci(b, "value"))) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn apply_at(resource: &mut Value, kind: Op, path: &Path, value: Option<&Value>, extensions: &[&str]) -> Result<()> {
    let Some(filter) = &path.filter else {
        return match kind {
            Op::Remove => remove(resource, &path.attr, value, extensions),
            _ => {
                let value = value.cloned().ok_or_else(|| invalid_value("add and replace need a value"))?;
                set(resource, kind, &path.attr, value, extensions)
            }
        };
    };
    let c = container(resource, &path.attr, extensions)?;
    let key = key_ci(c, &path.attr.attr).unwrap_or_else(|| path.attr.attr.clone());
    let items = match c.entry(key).or_insert_with(|| Value::Array(Vec::new())) {
        Value::Array(items) => items,
        _ => return Err(invalid_path(format!("{} is not multi-valued", path.attr.attr))),
    };
    let matching: Vec<usize> = (0..items.len()).filter(|i| filter.matches(&items[*i])).collect();
    if matching.is_empty() {
        return add_missing(items, kind, filter, path, value);
    }
    match (kind, &path.sub_after) {
        (Op::Remove, None) => {
            for i in matching.into_iter().rev() {
                items.remove(i);
            }
        }
        (Op::Remove, Some(sub)) => {
            for i in matching {
                if let Some(o) = items[i].as_object_mut() {
                    if let Some(k) = key_ci(o, sub) {
                        o.remove(&k);
                    }
                }
            }
        }
        (_, None) => {
            let value = value.cloned().ok_or_else(|| invalid_value("add and replace need a value"))?;
            for i in matching {
                match (&mut items[i], &value) {
                    (Value::Object(current), Value::Object(new)) if kind == Op::Add => {
                        current.extend(new.iter().map(|(k, v)| (k.clone(), v.clone())));
                    }
                    (slot, _) => *slot = value.clone(),
                }
            }
        }
        (_, Some(sub)) => {
            let value = value.cloned().ok_or_else(|| invalid_value("add and replace need a value"))?;
            for i in matching {
                if let Some(o) = items[i].as_object_mut() {
                    let k = key_ci(o, sub).unwrap_or_else(|| sub.clone());
                    o.insert(k, value.clone());
                }
            }
        }
    }
    Ok(())
}

/// A filtered path no value matches: `add` or `replace` of `attr[sub eq "x"].other` makes the
/// value (`{sub: "x", other: value}`), as identity providers expect for `emails[type eq "work"]`;
/// anything else is 400 `noTarget`.
fn add_missing(items: &mut Vec<Value>, kind: Op, filter: &Filter, path: &Path, value: Option<&Value>) -> Result<()> {
    let made = match (kind, filter, &path.sub_after, value) {
        (Op::Add | Op::Replace, Filter::Compare { path: f, op: CompareOp::Eq, value: v }, Some(sub), Some(value))
            if f.sub.is_none() && f.urn.is_none() =>
        {
            Value::Object(Map::from_iter([(f.attr.clone(), v.clone()), (sub.clone(), value.clone())]))
        }
        _ => return Err(no_target(format!("no value of {} matches the path's filter", path.attr.attr))),
    };
    items.push(made);
    Ok(())
}

/// Removes an attribute (or sub-attribute); with a value, and a multi-valued attribute, only the
/// values given (Entra ID's way of removing members).
fn remove(resource: &mut Value, path: &AttrPath, value: Option<&Value>, extensions: &[&str]) -> Result<()> {
    let c = container(resource, path, extensions)?;
    let Some(key) = key_ci(c, &path.attr) else { return Ok(()) };
    match (&path.sub, c.get_mut(&key), value) {
        (None, Some(Value::Array(items)), Some(given)) if !given.is_null() => {
            let given = match given {
                Value::Array(g) => g.clone(),
                one => vec![one.clone()],
            };
            items.retain(|i| !given.iter().any(|g| same_value(i, g)));
        }
        (None, _, _) => {
            c.remove(&key);
        }
        (Some(sub), Some(Value::Object(o)), _) => {
            if let Some(k) = key_ci(o, sub) {
                o.remove(&k);
            }
        }
        (Some(sub), Some(Value::Array(items)), _) => {
            for o in items.iter_mut().filter_map(Value::as_object_mut) {
                if let Some(k) = key_ci(o, sub) {
                    o.remove(&k);
                }
            }
        }
        (Some(_), _, _) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::scim::POSIX_USER_SCHEMA;

    fn patch(ops: Value) -> Value {
        json!({ "schemas": [PATCH_OP], "Operations": ops })
    }

    fn group() -> Value {
        json!({ "schemas": [GROUP_SCHEMA], "id": "g", "displayName": "Tour Guides",
            "members": [{ "value": "a", "display": "alice" }, { "value": "b" }] })
    }

    #[test]
    fn members_are_added_and_removed_as_the_rfc_shows() {
        // RFC 7644, section 3.5.2.1 and 3.5.2.2.
        let mut g = group();
        let add = patch(json!([{ "op": "add", "path": "members", "value": [{ "value": "c" }, { "value": "a" }] }]));
        apply(&mut g, &add, &[]).expect("add");
        assert_eq!(g["members"].as_array().map(Vec::len), Some(3), "{g}");
        apply(&mut g, &patch(json!([{ "op": "remove", "path": "members[value eq \"b\"]" }])), &[]).expect("remove");
        let ids: Vec<&str> =
            g["members"].as_array().into_iter().flatten().filter_map(|m| m["value"].as_str()).collect();
        assert_eq!(ids, ["a", "c"]);
        // Entra ID's way.
        let entra = patch(json!([{ "op": "Remove", "path": "members", "value": [{ "value": "a" }] }]));
        apply(&mut g, &entra, &[]).expect("entra remove");
        assert_eq!(g["members"], json!([{ "value": "c" }]));
        apply(&mut g, &patch(json!([{ "op": "remove", "path": "members" }])), &[]).expect("remove all");
        assert!(g.get("members").is_none());
        apply(&mut g, &patch(json!([{ "op": "replace", "value": { "displayName": "Guides" } }])), &[]).expect("rename");
        assert_eq!(g["displayName"], "Guides");
    }

    #[test]
    fn values_are_replaced_by_filter_and_extensions_by_urn() {
        let mut u = json!({ "schemas": [USER_SCHEMA], "userName": "a", "active": true,
            "emails": [{ "value": "a@x", "type": "work" }], POSIX_USER_SCHEMA: { "loginShell": "/bin/sh" } });
        let ops = patch(json!([
            { "op": "replace", "path": "emails[type eq \"work\"].value", "value": "b@x" },
            { "op": "add", "path": "emails[type eq \"home\"].value", "value": "h@x" },
            { "op": "Replace", "path": "active", "value": "False" },
            { "op": "replace", "path": format!("{POSIX_USER_SCHEMA}:loginShell"), "value": "/bin/zsh" },
            { "op": "add", "value": { POSIX_USER_SCHEMA: { "sshPublicKeys": ["k"] }, "displayName": "A" } }
        ]));
        apply(&mut u, &ops, &[POSIX_USER_SCHEMA]).expect("patch");
        assert_eq!(u["emails"], json!([{ "value": "b@x", "type": "work" }, { "type": "home", "value": "h@x" }]));
        assert_eq!(u["active"], "False");
        assert_eq!(u[POSIX_USER_SCHEMA], json!({ "loginShell": "/bin/zsh", "sshPublicKeys": ["k"] }));
        assert_eq!(u["displayName"], "A");
    }

    #[test]
    fn an_extension_is_a_path_of_its_own() {
        let mut u =
            json!({ "schemas": [USER_SCHEMA], "userName": "a", POSIX_USER_SCHEMA: { "loginShell": "/bin/sh" } });
        let set = patch(json!([{ "op": "add", "path": POSIX_USER_SCHEMA, "value": { "sshPublicKeys": ["k"] } }]));
        apply(&mut u, &set, &[POSIX_USER_SCHEMA]).expect("add to the extension");
        assert_eq!(u[POSIX_USER_SCHEMA], json!({ "loginShell": "/bin/sh", "sshPublicKeys": ["k"] }));
        let drop = patch(json!([{ "op": "remove", "path": POSIX_USER_SCHEMA }]));
        apply(&mut u, &drop, &[POSIX_USER_SCHEMA]).expect("remove the extension");
        assert!(u.get(POSIX_USER_SCHEMA).is_none());
    }

    #[test]
    fn bad_patches_are_refused_with_scim_types() {
        let mut g = group();
        let code = |body: Value, g: &mut Value| apply(g, &body, &[]).expect_err("refused").code();
        assert_eq!(code(json!({ "Operations": [] }), &mut g), "invalid_syntax");
        assert_eq!(code(patch(json!([{ "op": "move", "path": "x" }])), &mut g), "invalid_syntax");
        assert_eq!(code(patch(json!([{ "op": "remove" }])), &mut g), "no_target");
        assert_eq!(code(patch(json!([{ "op": "remove", "path": "members[value eq \"zz\"]" }])), &mut g), "no_target");
        assert_eq!(code(patch(json!([{ "op": "remove", "path": "members[value eq" }])), &mut g), "invalid_path");
        assert_eq!(code(patch(json!([{ "op": "add", "path": "urn:x:y:z", "value": 1 }])), &mut g), "invalid_path");
    }
}
