//! Users and groups as SCIM JSON: reading a request's resource (POST, PUT, and the result of a
//! PATCH) into what paddock keeps, checking every value (400 `invalidValue`), and rendering what
//! paddock keeps back into SCIM JSON. Attributes paddock does not keep are ignored; read-only ones
//! (`id`, `meta`, a user's `groups`) are never taken from a request.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::{
    get_ci, invalid_syntax, invalid_value, IdRange, GROUP_SCHEMA, POSIX_GROUP_SCHEMA, POSIX_USER_SCHEMA, USER_SCHEMA,
};
use crate::Result;

/// The longest string attribute (names, ids, emails).
const MAX_STRING: usize = 256;
/// The most SSH keys one user may have.
pub const MAX_SSH_KEYS: usize = 32;
/// The most email addresses one user may have.
const MAX_EMAILS: usize = 16;
/// The shell of a user whose identity provider names none.
pub const DEFAULT_SHELL: &str = "/bin/bash";

/// A user as a request gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct UserInput {
    /// `userName`: unique within the tenant without regard to case; the POSIX login name.
    pub user_name: String,
    /// `externalId`.
    pub external_id: Option<String>,
    /// `displayName`.
    pub display_name: Option<String>,
    /// `name` (its known string sub-attributes).
    pub name: Option<Value>,
    /// `emails` (`value`, `type`, `primary`, `display`).
    pub emails: Value,
    /// `active`: false locks the user out everywhere.
    pub active: bool,
    /// `uidNumber`, when the request names one.
    pub uid_number: Option<i32>,
    /// `gidNumber`, when the request names one.
    pub gid_number: Option<i32>,
    /// `loginShell`.
    pub login_shell: String,
    /// `sshPublicKeys`, each an OpenSSH public key line.
    pub ssh_public_keys: Vec<String>,
}

/// A group as a request gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupInput {
    /// `displayName`: unique within the tenant without regard to case.
    pub display_name: String,
    /// `externalId`.
    pub external_id: Option<String>,
    /// `gidNumber`, when the request names one.
    pub gid_number: Option<i32>,
    /// The members' user ids.
    pub members: Vec<Uuid>,
}

/// A user as paddock keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct UserRecord {
    /// Id.
    pub id: Uuid,
    /// What the identity provider gave, with the assigned numbers.
    pub input: UserInput,
    /// The assigned `uidNumber`.
    pub uid_number: i32,
    /// The `gidNumber` (the user's own group's, equal to its uid, unless given).
    pub gid_number: i32,
    /// The groups it is a member of: (id, displayName).
    pub groups: Vec<(Uuid, String)>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Changed.
    pub updated_at: DateTime<Utc>,
}

/// A group as paddock keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupRecord {
    /// Id.
    pub id: Uuid,
    /// `displayName`.
    pub display_name: String,
    /// `externalId`.
    pub external_id: Option<String>,
    /// The assigned `gidNumber`.
    pub gid_number: i32,
    /// The members: (user id, userName).
    pub members: Vec<(Uuid, String)>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Changed.
    pub updated_at: DateTime<Utc>,
}

fn object(body: &Value) -> Result<&Map<String, Value>> {
    body.as_object().ok_or_else(|| invalid_syntax("the body must be a JSON object"))
}

/// Checks that `schemas` names `schema`.
fn require_schema(o: &Map<String, Value>, schema: &str) -> Result<()> {
    let named = get_ci(o, "schemas")
        .and_then(Value::as_array)
        .is_some_and(|s| s.iter().any(|v| v.as_str().is_some_and(|v| v.eq_ignore_ascii_case(schema))));
    if named {
        Ok(())
    } else {
        Err(invalid_syntax(format!("`schemas` must name {schema}")))
    }
}

/// A string attribute: absent and null are `None`; anything else but a bounded string is refused.
fn string(o: &Map<String, Value>, name: &str) -> Result<Option<String>> {
    match get_ci(o, name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => {
            if s.chars().count() > MAX_STRING {
                return Err(invalid_value(format!("{name} must be at most {MAX_STRING} characters")));
            }
            if s.chars().any(char::is_control) {
                return Err(invalid_value(format!("{name} must not hold control characters")));
            }
            Ok(Some(s.clone()))
        }
        Some(_) => Err(invalid_value(format!("{name} must be a string"))),
    }
}

/// A boolean, also as the strings `"true"`/`"false"` some identity providers send.
fn boolean(o: &Map<String, Value>, name: &str) -> Result<Option<bool>> {
    match get_ci(o, name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(Some(true)),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(Some(false)),
        Some(_) => Err(invalid_value(format!("{name} must be a boolean"))),
    }
}

/// A POSIX id in the provider's range.
fn posix_id(o: &Map<String, Value>, name: &str, range: &IdRange) -> Result<Option<i32>> {
    match get_ci(o, name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(n) if range.contains(n) => Ok(Some(n as i32)),
            _ => Err(invalid_value(format!(
                "{name} {n} is outside the range this provider assigns ({range}; 65534 and 65535 excluded)"
            ))),
        },
        Some(_) => Err(invalid_value(format!("{name} must be an integer"))),
    }
}

fn user_name(o: &Map<String, Value>) -> Result<String> {
    let name = string(o, "userName")?.ok_or_else(|| invalid_value("userName is required"))?;
    if name.is_empty() || name.starts_with('-') || name.chars().any(|c| c.is_whitespace() || c == ':' || c == '/') {
        return Err(invalid_value(
            "userName must be non-empty, not start with `-`, and hold no whitespace, `:` or `/` (it is the POSIX login name)",
        ));
    }
    Ok(name)
}

fn name(o: &Map<String, Value>) -> Result<Option<Value>> {
    const SUBS: [&str; 6] =
        ["formatted", "familyName", "givenName", "middleName", "honorificPrefix", "honorificSuffix"];
    match get_ci(o, "name") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(n)) => {
            let mut kept = Map::new();
            for sub in SUBS {
                if let Some(v) =
                    string(n, sub).map_err(|_| invalid_value(format!("name.{sub} must be a short string")))?
                {
                    kept.insert(sub.to_owned(), Value::String(v));
                }
            }
            Ok((!kept.is_empty()).then_some(Value::Object(kept)))
        }
        Some(_) => Err(invalid_value("name must be an object")),
    }
}

fn emails(o: &Map<String, Value>) -> Result<Value> {
    let items = match get_ci(o, "emails") {
        None | Some(Value::Null) => return Ok(json!([])),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(invalid_value("emails must be an array")),
    };
    if items.len() > MAX_EMAILS {
        return Err(invalid_value(format!("a user has at most {MAX_EMAILS} emails")));
    }
    let mut kept = Vec::new();
    for item in items {
        let e = item.as_object().ok_or_else(|| invalid_value("each of emails must be an object"))?;
        let mut email = Map::new();
        let value = string(e, "value")?.filter(|v| !v.is_empty());
        email.insert(
            "value".to_owned(),
            Value::String(value.ok_or_else(|| invalid_value("emails[].value is required"))?),
        );
        for sub in ["type", "display"] {
            if let Some(v) = string(e, sub)? {
                email.insert(sub.to_owned(), Value::String(v));
            }
        }
        if let Some(primary) = boolean(e, "primary")? {
            email.insert("primary".to_owned(), Value::Bool(primary));
        }
        kept.push(Value::Object(email));
    }
    Ok(Value::Array(kept))
}

fn login_shell(o: Option<&Map<String, Value>>) -> Result<String> {
    let Some(shell) = o.map(|o| string(o, "loginShell")).transpose()?.flatten() else {
        return Ok(DEFAULT_SHELL.to_owned());
    };
    let fits = shell.starts_with('/')
        && shell.len() > 1
        && shell.chars().all(|c| c.is_ascii_alphanumeric() || "/._+-".contains(c));
    if fits {
        Ok(shell)
    } else {
        Err(invalid_value("loginShell must be an absolute path of letters, digits and `/._+-`"))
    }
}

fn ssh_keys(o: Option<&Map<String, Value>>) -> Result<Vec<String>> {
    let items = match o.and_then(|o| get_ci(o, "sshPublicKeys")) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(invalid_value("sshPublicKeys must be an array of strings")),
    };
    if items.len() > MAX_SSH_KEYS {
        return Err(invalid_value(format!("a user has at most {MAX_SSH_KEYS} SSH public keys")));
    }
    let mut keys: Vec<String> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        // A complex value (`{"value": ...}`) as some providers send multi-valued strings.
        let line = match item {
            Value::String(s) => s.as_str(),
            Value::Object(v) => get_ci(v, "value").and_then(Value::as_str).unwrap_or_default(),
            _ => "",
        };
        let line = line.trim();
        if line.len() > 16 * 1024 || line.chars().any(char::is_control) {
            return Err(invalid_value(format!("sshPublicKeys[{i}] is not an OpenSSH public key line")));
        }
        crate::ssh::user_key(line)
            .map_err(|e| invalid_value(format!("sshPublicKeys[{i}] is not an OpenSSH public key: {e}")))?;
        if !keys.iter().any(|k| k == line) {
            keys.push(line.to_owned());
        }
    }
    Ok(keys)
}

/// Reads a user (a POST or PUT body, or the result of a PATCH).
pub fn parse_user(body: &Value, range: &IdRange) -> Result<UserInput> {
    let o = object(body)?;
    require_schema(o, USER_SCHEMA)?;
    let posix = match get_ci(o, POSIX_USER_SCHEMA) {
        None | Some(Value::Null) => None,
        Some(Value::Object(p)) => Some(p),
        Some(_) => return Err(invalid_value(format!("{POSIX_USER_SCHEMA} must be an object"))),
    };
    Ok(UserInput {
        user_name: user_name(o)?,
        external_id: string(o, "externalId")?,
        display_name: string(o, "displayName")?,
        name: name(o)?,
        emails: emails(o)?,
        active: boolean(o, "active")?.unwrap_or(true),
        uid_number: posix.map(|p| posix_id(p, "uidNumber", range)).transpose()?.flatten(),
        gid_number: posix.map(|p| posix_id(p, "gidNumber", range)).transpose()?.flatten(),
        login_shell: login_shell(posix)?,
        ssh_public_keys: ssh_keys(posix)?,
    })
}

/// Reads a group (a POST or PUT body, or the result of a PATCH).
pub fn parse_group(body: &Value, range: &IdRange) -> Result<GroupInput> {
    let o = object(body)?;
    require_schema(o, GROUP_SCHEMA)?;
    let display_name = string(o, "displayName")?.filter(|n| !n.trim().is_empty());
    let display_name = display_name.ok_or_else(|| invalid_value("displayName is required"))?;
    let posix = match get_ci(o, POSIX_GROUP_SCHEMA) {
        None | Some(Value::Null) => None,
        Some(Value::Object(p)) => Some(p),
        Some(_) => return Err(invalid_value(format!("{POSIX_GROUP_SCHEMA} must be an object"))),
    };
    Ok(GroupInput {
        display_name,
        external_id: string(o, "externalId")?,
        gid_number: posix.map(|p| posix_id(p, "gidNumber", range)).transpose()?.flatten(),
        members: members(o)?,
    })
}

fn members(o: &Map<String, Value>) -> Result<Vec<Uuid>> {
    let items = match get_ci(o, "members") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(invalid_value("members must be an array")),
    };
    let mut ids = Vec::with_capacity(items.len());
    for item in items {
        let value = item.as_object().and_then(|m| get_ci(m, "value")).and_then(Value::as_str);
        let id = value
            .and_then(|v| Uuid::try_parse(v).ok())
            .ok_or_else(|| invalid_value("each member must be `{\"value\": <a user's id>}`"))?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(ids)
}

fn time(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn meta(kind: &str, location: String, created: &DateTime<Utc>, updated: &DateTime<Utc>) -> Value {
    json!({ "resourceType": kind, "created": time(created), "lastModified": time(updated), "location": location })
}

/// A user as SCIM JSON; `base` is the tenant's SCIM base path (`/v1/tenants/{id}/scim/v2`).
pub fn render_user(u: &UserRecord, base: &str) -> Value {
    let mut o = Map::new();
    o.insert("schemas".to_owned(), json!([USER_SCHEMA, POSIX_USER_SCHEMA]));
    o.insert("id".to_owned(), json!(u.id));
    if let Some(e) = &u.input.external_id {
        o.insert("externalId".to_owned(), json!(e));
    }
    o.insert("userName".to_owned(), json!(u.input.user_name));
    if let Some(n) = &u.input.name {
        o.insert("name".to_owned(), n.clone());
    }
    if let Some(d) = &u.input.display_name {
        o.insert("displayName".to_owned(), json!(d));
    }
    if u.input.emails.as_array().is_some_and(|e| !e.is_empty()) {
        o.insert("emails".to_owned(), u.input.emails.clone());
    }
    o.insert("active".to_owned(), json!(u.input.active));
    let groups: Vec<Value> = u
        .groups
        .iter()
        .map(|(id, name)| json!({ "value": id, "display": name, "$ref": format!("{base}/Groups/{id}"), "type": "direct" }))
        .collect();
    if !groups.is_empty() {
        o.insert("groups".to_owned(), Value::Array(groups));
    }
    o.insert(
        POSIX_USER_SCHEMA.to_owned(),
        json!({
            "uidNumber": u.uid_number,
            "gidNumber": u.gid_number,
            "loginShell": u.input.login_shell,
            "sshPublicKeys": u.input.ssh_public_keys,
        }),
    );
    o.insert("meta".to_owned(), meta("User", format!("{base}/Users/{}", u.id), &u.created_at, &u.updated_at));
    Value::Object(o)
}

/// A group as SCIM JSON; `base` is the tenant's SCIM base path.
pub fn render_group(g: &GroupRecord, base: &str) -> Value {
    let mut o = Map::new();
    o.insert("schemas".to_owned(), json!([GROUP_SCHEMA, POSIX_GROUP_SCHEMA]));
    o.insert("id".to_owned(), json!(g.id));
    if let Some(e) = &g.external_id {
        o.insert("externalId".to_owned(), json!(e));
    }
    o.insert("displayName".to_owned(), json!(g.display_name));
    let members: Vec<Value> = g
        .members
        .iter()
        .map(|(id, name)| json!({ "value": id, "display": name, "$ref": format!("{base}/Users/{id}"), "type": "User" }))
        .collect();
    o.insert("members".to_owned(), Value::Array(members));
    o.insert(POSIX_GROUP_SCHEMA.to_owned(), json!({ "gidNumber": g.gid_number }));
    o.insert("meta".to_owned(), meta("Group", format!("{base}/Groups/{}", g.id), &g.created_at, &g.updated_at));
    Value::Object(o)
}

/// Keeps only the `attributes` asked for, or drops the `excluded` ones (comma-separated lists of
/// attribute names, RFC 7644 section 3.4.2.5); `id` and `schemas` are always returned.
pub fn project(resource: &mut Value, attributes: Option<&str>, excluded: Option<&str>) {
    let Some(o) = resource.as_object_mut() else { return };
    let names = |list: &str| -> Vec<String> {
        list.split(',')
            .map(|a| {
                let a = a.trim();
                // `urn:...:User:userName` names `userName`; an extension's attribute, its object.
                let a = [USER_SCHEMA, GROUP_SCHEMA]
                    .iter()
                    .find_map(|core| {
                        a.get(..core.len()).filter(|p| p.eq_ignore_ascii_case(core)).map(|_| &a[core.len()..])
                    })
                    .map(|rest| rest.trim_start_matches(':'))
                    .unwrap_or(a);
                let top = match [POSIX_USER_SCHEMA, POSIX_GROUP_SCHEMA]
                    .iter()
                    .find(|ext| a.get(..ext.len()).is_some_and(|p| p.eq_ignore_ascii_case(ext)))
                {
                    Some(ext) => (*ext).to_owned(),
                    None => a.split('.').next().unwrap_or_default().to_owned(),
                };
                top.to_ascii_lowercase()
            })
            .filter(|a| !a.is_empty())
            .collect()
    };
    let always = ["id", "schemas"];
    if let Some(list) = attributes.filter(|l| !l.trim().is_empty()) {
        let keep = names(list);
        o.retain(|k, _| always.contains(&k.as_str()) || keep.contains(&k.to_ascii_lowercase()));
    } else if let Some(list) = excluded.filter(|l| !l.trim().is_empty()) {
        let drop = names(list);
        o.retain(|k, _| always.contains(&k.as_str()) || !drop.contains(&k.to_ascii_lowercase()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL2AmpA4kI/TYTmjC3Vf+h3HQc/vvGHZNgUIITHqcjcJ alice@laptop";

    fn user(ext: Value) -> Value {
        json!({ "schemas": [USER_SCHEMA, POSIX_USER_SCHEMA], "userName": "alice", POSIX_USER_SCHEMA: ext })
    }

    #[test]
    fn a_user_is_read_with_its_posix_attributes() {
        let range = IdRange::default();
        let input = parse_user(&user(json!({ "sshPublicKeys": [KEY], "uidNumber": 12000 })), &range).expect("user");
        assert_eq!(input.user_name, "alice");
        assert_eq!(input.uid_number, Some(12000));
        assert_eq!(input.gid_number, None);
        assert_eq!(input.login_shell, DEFAULT_SHELL);
        assert_eq!(input.ssh_public_keys, vec![KEY.to_owned()]);
        assert!(input.active);
        let lower = json!({ "SCHEMAS": [USER_SCHEMA], "username": "bob", "ACTIVE": "False" });
        let input = parse_user(&lower, &range).expect("attribute names are case-insensitive");
        assert_eq!((input.user_name.as_str(), input.active), ("bob", false));
    }

    #[test]
    fn bad_values_are_invalid_value() {
        let range = IdRange::default();
        for (ext, what) in [
            (json!({ "sshPublicKeys": ["ssh-ed25519 not*base64"] }), "a key that does not parse"),
            (json!({ "sshPublicKeys": "ssh-ed25519 AAAA" }), "keys not in an array"),
            (json!({ "uidNumber": 401 }), "the slurm user's uid"),
            (json!({ "uidNumber": 65534 }), "nobody"),
            (json!({ "uidNumber": 9999999 }), "above the range"),
            (json!({ "gidNumber": 0 }), "root's group"),
            (json!({ "uidNumber": "12000" }), "a uid as a string"),
            (json!({ "loginShell": "bash" }), "a relative shell"),
        ] {
            let err = parse_user(&user(ext), &range).expect_err(what);
            assert_eq!(err.code(), "invalid_value", "{what}: {err}");
        }
        let err = parse_user(&json!({ "schemas": [USER_SCHEMA], "userName": "a b" }), &range).expect_err("space");
        assert_eq!(err.code(), "invalid_value");
        let err = parse_user(&json!({ "userName": "a" }), &range).expect_err("no schemas");
        assert_eq!(err.code(), "invalid_syntax");
    }

    #[test]
    fn projection_keeps_what_is_asked() {
        let mut r = json!({ "schemas": [USER_SCHEMA], "id": "1", "userName": "a", "emails": [], "meta": {} });
        project(&mut r, Some("urn:ietf:params:scim:schemas:core:2.0:User:userName"), None);
        assert_eq!(r, json!({ "schemas": [USER_SCHEMA], "id": "1", "userName": "a" }));
        let mut g = json!({ "schemas": [GROUP_SCHEMA], "id": "1", "displayName": "a", "members": [] });
        project(&mut g, None, Some("members"));
        assert_eq!(g, json!({ "schemas": [GROUP_SCHEMA], "id": "1", "displayName": "a" }));
    }
}
