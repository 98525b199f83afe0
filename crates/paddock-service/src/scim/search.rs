//! `POST .../.search` (RFC 7644 section 3.4.3): a list whose query is a `SearchRequest` body, for
//! filters too long for a URL; at the root it searches users and groups together.

use paddock_domain::scim::resource::{render_group, render_user};
use paddock_domain::scim::{get_ci, invalid_syntax, invalid_value};
use paddock_domain::Result;
use paddock_store::identity::{self, Lookup};
use paddock_types::TenantId;
use serde_json::Value;

use super::{base_path, list_response, parse_list, ListQuery, ScimCaller};
use crate::{Body, Services};

/// The schema of a search's body.
const SEARCH_REQUEST: &str = "urn:ietf:params:scim:api:messages:2.0:SearchRequest";

/// What a search looks through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchScope {
    /// `/Users/.search`.
    Users,
    /// `/Groups/.search`.
    Groups,
    /// `/.search`: both.
    All,
}

/// The list query a `SearchRequest` body stands for.
fn query(body: &Value) -> Result<ListQuery> {
    let o = body.as_object().ok_or_else(|| invalid_syntax("the body must be a JSON object"))?;
    let named = get_ci(o, "schemas")
        .and_then(Value::as_array)
        .is_some_and(|s| s.iter().any(|v| v.as_str().is_some_and(|v| v.eq_ignore_ascii_case(SEARCH_REQUEST))));
    if !named {
        return Err(invalid_syntax(format!("`schemas` must name {SEARCH_REQUEST}")));
    }
    let text = |name: &str| -> Result<Option<String>> {
        match get_ci(o, name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(invalid_value(format!("{name} must be a string"))),
        }
    };
    let list = |name: &str| -> Result<Option<String>> {
        match get_ci(o, name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(items)) => {
                let names: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
                let names = names.ok_or_else(|| invalid_value(format!("{name} must be an array of strings")))?;
                Ok(Some(names.join(",")))
            }
            Some(_) => Err(invalid_value(format!("{name} must be an array of strings"))),
        }
    };
    let int = |name: &str| -> Result<Option<String>> {
        match get_ci(o, name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(_) => Err(invalid_value(format!("{name} must be an integer"))),
        }
    };
    Ok(ListQuery {
        filter: text("filter")?,
        start_index: int("startIndex")?,
        count: int("count")?,
        attributes: list("attributes")?,
        excluded_attributes: list("excludedAttributes")?,
    })
}

impl Services {
    /// Searches users, groups or both with a `SearchRequest`; answers a `ListResponse`.
    pub async fn scim_search(
        &self,
        caller: &ScimCaller,
        tenant: TenantId,
        scope: SearchScope,
        body: &Body,
    ) -> Result<Value> {
        self.scim_read_check(caller, tenant).await?;
        let q = query(&body.value()?)?;
        let (filter, start, count) = parse_list(&q)?;
        let mut conn = self.store.conn().await?;
        let base = base_path(tenant);
        let mut rendered = Vec::new();
        if scope != SearchScope::Groups {
            let users = identity::users(&mut conn, tenant, Lookup::All).await?;
            rendered.extend(users.iter().map(|u| render_user(u, &base)));
        }
        if scope != SearchScope::Users {
            let groups = identity::groups(&mut conn, tenant, Lookup::All).await?;
            rendered.extend(groups.iter().map(|g| render_group(g, &base)));
        }
        Ok(list_response(rendered, filter.as_ref(), start, count, &q))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_search_request_is_a_list_query() {
        // RFC 7644 section 3.4.3.
        let body = json!({ "schemas": [SEARCH_REQUEST], "attributes": ["displayName", "userName"],
            "filter": "displayName sw \"smith\"", "startIndex": 1, "count": 10 });
        let q = query(&body).expect("a search");
        assert_eq!(q.attributes.as_deref(), Some("displayName,userName"));
        assert_eq!(q.filter.as_deref(), Some("displayName sw \"smith\""));
        assert_eq!((q.start_index.as_deref(), q.count.as_deref()), (Some("1"), Some("10")));
        assert_eq!(query(&json!({ "filter": "x" })).expect_err("no schemas").code(), "invalid_syntax");
        let bad = json!({ "schemas": [SEARCH_REQUEST], "attributes": "userName" });
        assert_eq!(query(&bad).expect_err("not an array").code(), "invalid_value");
    }
}
