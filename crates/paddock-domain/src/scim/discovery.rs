//! SCIM's discovery documents (RFC 7644, section 4): what this server supports
//! (`/ServiceProviderConfig`), its resource types (`/ResourceTypes`) and the schemas of their
//! attributes (`/Schemas`), paddock's POSIX extension among them. Identity providers and
//! compliance checkers read these to know what they may send.

use serde_json::{json, Value};

use super::{GROUP_SCHEMA, MAX_RESULTS, POSIX_GROUP_SCHEMA, POSIX_USER_SCHEMA, USER_SCHEMA};

const SPC_SCHEMA: &str = "urn:ietf:params:scim:schemas:core:2.0:ServiceProviderConfig";
const RESOURCE_TYPE_SCHEMA: &str = "urn:ietf:params:scim:schemas:core:2.0:ResourceType";
const SCHEMA_SCHEMA: &str = "urn:ietf:params:scim:schemas:core:2.0:Schema";

/// `/ServiceProviderConfig`.
pub fn service_provider_config(base: &str) -> Value {
    json!({
        "schemas": [SPC_SCHEMA],
        "documentationUri": "https://github.com/paddock-dev/paddock/blob/main/docs/tenants.md",
        "patch": { "supported": true },
        "bulk": { "supported": false, "maxOperations": 0, "maxPayloadSize": 0 },
        "filter": { "supported": true, "maxResults": MAX_RESULTS },
        "changePassword": { "supported": false },
        "sort": { "supported": false },
        "etag": { "supported": false },
        "authenticationSchemes": [{
            "type": "oauthbearertoken",
            "name": "Bearer token",
            "description": "A SCIM token of the tenant (POST /v1/tenants/{tenant_id}/scim-tokens), or a tenant:admin JWT",
            "primary": true
        }],
        "meta": { "resourceType": "ServiceProviderConfig", "location": format!("{base}/ServiceProviderConfig") }
    })
}

/// `/ResourceTypes`: User and Group, each with paddock's POSIX extension.
pub fn resource_types(base: &str) -> Vec<Value> {
    let one = |name: &str, endpoint: &str, schema: &str, ext: &str, what: &str| {
        json!({
            "schemas": [RESOURCE_TYPE_SCHEMA],
            "id": name,
            "name": name,
            "endpoint": endpoint,
            "description": what,
            "schema": schema,
            "schemaExtensions": [{ "schema": ext, "required": false }],
            "meta": { "resourceType": "ResourceType", "location": format!("{base}/ResourceTypes/{name}") }
        })
    };
    vec![
        one("User", "/Users", USER_SCHEMA, POSIX_USER_SCHEMA, "A person of the tenant: a POSIX and Slurm user"),
        one("Group", "/Groups", GROUP_SCHEMA, POSIX_GROUP_SCHEMA, "A group of the tenant's people"),
    ]
}

/// One attribute's definition.
#[allow(clippy::too_many_arguments)]
fn attr(
    name: &str,
    kind: &str,
    multi: bool,
    required: bool,
    mutability: &str,
    unique: &str,
    exact: bool,
    what: &str,
) -> Value {
    json!({
        "name": name, "type": kind, "multiValued": multi, "description": what, "required": required,
        "caseExact": exact, "mutability": mutability, "returned": "default", "uniqueness": unique
    })
}

fn string(name: &str, what: &str) -> Value {
    attr(name, "string", false, false, "readWrite", "none", false, what)
}

fn complex(mut a: Value, subs: Vec<Value>) -> Value {
    a["subAttributes"] = Value::Array(subs);
    a
}

fn schema(id: &str, name: &str, what: &str, attributes: Vec<Value>, base: &str) -> Value {
    json!({
        "schemas": [SCHEMA_SCHEMA], "id": id, "name": name, "description": what, "attributes": attributes,
        "meta": { "resourceType": "Schema", "location": format!("{base}/Schemas/{id}") }
    })
}

fn user_schema(base: &str) -> Value {
    let user_name = attr(
        "userName",
        "string",
        false,
        true,
        "readWrite",
        "server",
        false,
        "Unique within the tenant (without regard to case); the POSIX login name",
    );
    let name = complex(
        attr("name", "complex", false, false, "readWrite", "none", false, "The user's name"),
        ["formatted", "familyName", "givenName", "middleName", "honorificPrefix", "honorificSuffix"]
            .iter()
            .map(|s| string(s, "A part of the name"))
            .collect(),
    );
    let emails = complex(
        attr("emails", "complex", true, false, "readWrite", "none", false, "Email addresses"),
        vec![
            string("value", "The address"),
            string("display", "A label"),
            string("type", "work, home or other"),
            attr("primary", "boolean", false, false, "readWrite", "none", false, "The primary address"),
        ],
    );
    let groups = complex(
        attr("groups", "complex", true, false, "readOnly", "none", false, "The groups the user is a member of"),
        vec![
            attr("value", "string", false, false, "readOnly", "none", true, "The group's id"),
            attr("$ref", "reference", false, false, "readOnly", "none", true, "The group's URI"),
            attr("display", "string", false, false, "readOnly", "none", false, "The group's displayName"),
            attr("type", "string", false, false, "readOnly", "none", false, "direct"),
        ],
    );
    let attrs = vec![
        user_name,
        name,
        string("displayName", "The name to show"),
        emails,
        attr("active", "boolean", false, false, "readWrite", "none", false, "false: the user is locked out"),
        groups,
    ];
    schema(USER_SCHEMA, "User", "User Account", attrs, base)
}

fn group_schema(base: &str) -> Value {
    let display = attr(
        "displayName",
        "string",
        false,
        true,
        "readWrite",
        "server",
        false,
        "Unique within the tenant (without regard to case)",
    );
    let members = complex(
        attr("members", "complex", true, false, "readWrite", "none", false, "The group's users"),
        vec![
            attr("value", "string", false, false, "immutable", "none", true, "The user's id"),
            attr("$ref", "reference", false, false, "immutable", "none", true, "The user's URI"),
            attr("display", "string", false, false, "readOnly", "none", false, "The user's userName"),
            attr("type", "string", false, false, "immutable", "none", false, "User (groups cannot be members)"),
        ],
    );
    schema(GROUP_SCHEMA, "Group", "Group", vec![display, members], base)
}

fn posix_user_schema(base: &str) -> Value {
    let attrs = vec![
        attr(
            "uidNumber",
            "integer",
            false,
            false,
            "readWrite",
            "server",
            false,
            "POSIX uid, unique within the tenant, in the provider's range; assigned when absent, then kept",
        ),
        attr(
            "gidNumber",
            "integer",
            false,
            false,
            "readWrite",
            "none",
            false,
            "POSIX primary gid, in the provider's range; the user's own group (equal to its uid) when absent",
        ),
        string("loginShell", "Absolute path of the login shell (default /bin/bash)"),
        attr(
            "sshPublicKeys",
            "string",
            true,
            false,
            "readWrite",
            "none",
            true,
            "OpenSSH public key lines (`<type> <base64> [comment]`)",
        ),
    ];
    schema(POSIX_USER_SCHEMA, "PosixUser", "paddock: the user's POSIX account on the tenant's clusters", attrs, base)
}

fn posix_group_schema(base: &str) -> Value {
    let attrs = vec![attr(
        "gidNumber",
        "integer",
        false,
        false,
        "readWrite",
        "server",
        false,
        "POSIX gid, unique within the tenant, in the provider's range; assigned when absent, then kept",
    )];
    schema(POSIX_GROUP_SCHEMA, "PosixGroup", "paddock: the group's POSIX group on the tenant's clusters", attrs, base)
}

/// `/Schemas`.
pub fn schemas(base: &str) -> Vec<Value> {
    vec![user_schema(base), group_schema(base), posix_user_schema(base), posix_group_schema(base)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_is_listed_and_located() {
        let all = schemas("/b");
        let ids: Vec<&str> = all.iter().filter_map(|s| s["id"].as_str()).collect();
        assert_eq!(ids, [USER_SCHEMA, GROUP_SCHEMA, POSIX_USER_SCHEMA, POSIX_GROUP_SCHEMA]);
        for s in &all {
            assert!(s["meta"]["location"].as_str().is_some_and(|l| l.starts_with("/b/Schemas/")));
        }
        assert_eq!(resource_types("/b")[0]["schemaExtensions"][0]["schema"], POSIX_USER_SCHEMA);
        // RFC 7643 section 8.7.1: only `id` is always returned, so `attributes=` may leave the
        // names out (a client holds the server to what it publishes).
        assert_eq!(all[0]["attributes"][0]["name"], "userName");
        assert_eq!(all[0]["attributes"][0]["returned"], "default");
        assert_eq!(all[1]["attributes"][0]["returned"], "default");
    }
}
