//! SCIM 2.0 through the real router: the tenant's SCIM tokens (shown once, stored hashed,
//! revocable), the examples of RFC 7643 and RFC 7644 (users and groups created, read, listed with
//! filters and pages, replaced, patched, deleted; the discovery endpoints), paddock's POSIX
//! extension (ids assigned in the provider's range, stable, unique, never reused), SCIM error
//! bodies for bad input, a foreign tenant's token, and a suspended tenant that may only take
//! access away.

use paddock_testkit::{admin, token, Resp, TestApp};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::common::{id, tenant};

const USER: &str = "urn:ietf:params:scim:schemas:core:2.0:User";
const GROUP: &str = "urn:ietf:params:scim:schemas:core:2.0:Group";
const POSIX: &str = "urn:paddock:params:scim:schemas:extension:posix:2.0:User";
const POSIX_GROUP: &str = "urn:paddock:params:scim:schemas:extension:posix:2.0:Group";
const PATCH_OP: &str = "urn:ietf:params:scim:api:messages:2.0:PatchOp";
const ERROR: &str = "urn:ietf:params:scim:api:messages:2.0:Error";
const LIST: &str = "urn:ietf:params:scim:api:messages:2.0:ListResponse";

const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL2AmpA4kI/TYTmjC3Vf+h3HQc/vvGHZNgUIITHqcjcJ bjensen@laptop";

/// A tenant and one of its SCIM tokens (created by its tenant:admin).
struct Scim {
    tenant: String,
    token: String,
}

impl Scim {
    async fn new(app: &TestApp, name: &str) -> Scim {
        let tenant = id(&tenant(app, name).await);
        let admin = token(&["tenant:admin"], Some(tenant.parse().expect("uuid")));
        let created = app
            .post(format!("/v1/tenants/{tenant}/scim-tokens"))
            .token(&admin)
            .json(&json!({ "description": "Okta" }))
            .send()
            .await
            .expect(201)
            .json();
        let token = created["token"].as_str().expect("the token is shown at creation").to_owned();
        Scim { tenant, token }
    }

    fn path(&self, tail: &str) -> String {
        format!("/v1/tenants/{}/scim/v2{tail}", self.tenant)
    }

    async fn send(&self, app: &TestApp, method: http::Method, tail: &str, body: Option<Value>) -> Resp {
        let mut req = app.req(method, self.path(tail)).token(&self.token);
        if let Some(body) = body {
            req = req.header("content-type", "application/scim+json").json(&body);
        }
        req.send().await
    }

    async fn get(&self, app: &TestApp, tail: &str) -> Resp {
        self.send(app, http::Method::GET, tail, None).await
    }

    async fn post(&self, app: &TestApp, tail: &str, body: Value) -> Resp {
        self.send(app, http::Method::POST, tail, Some(body)).await
    }

    async fn put(&self, app: &TestApp, tail: &str, body: Value) -> Resp {
        self.send(app, http::Method::PUT, tail, Some(body)).await
    }

    async fn patch(&self, app: &TestApp, tail: &str, ops: Value) -> Resp {
        self.send(app, http::Method::PATCH, tail, Some(json!({ "schemas": [PATCH_OP], "Operations": ops }))).await
    }

    async fn delete(&self, app: &TestApp, tail: &str) -> Resp {
        self.send(app, http::Method::DELETE, tail, None).await
    }

    /// Creates a user; returns it.
    async fn user(&self, app: &TestApp, name: &str) -> Value {
        scim_ok(self.post(app, "/Users", json!({ "schemas": [USER], "userName": name })).await, 201)
    }
}

/// Asserts a SCIM answer with `status`; returns its body.
#[track_caller]
fn scim_ok(resp: Resp, status: u16) -> Value {
    let resp = resp.expect(status);
    assert_eq!(resp.header("content-type"), Some("application/scim+json"));
    resp.json()
}

/// Asserts a SCIM error body (RFC 7644 section 3.12) with `status` and `scim_type`.
#[track_caller]
fn scim_error(resp: Resp, status: u16, scim_type: Option<&str>) -> Value {
    let resp = resp.expect(status);
    assert_eq!(resp.header("content-type"), Some("application/scim+json"), "{:?}", resp.body);
    let body = resp.json();
    assert_eq!(body["schemas"], json!([ERROR]), "{body}");
    assert_eq!(body["status"], status.to_string(), "the status is a string: {body}");
    assert_eq!(body["scimType"].as_str(), scim_type, "{body}");
    assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()), "{body}");
    body
}

fn uid(user: &Value) -> i64 {
    user[POSIX]["uidNumber"].as_i64().unwrap_or_else(|| panic!("no uidNumber: {user}"))
}

#[tokio::test]
async fn a_scim_token_is_shown_once_stored_hashed_and_revocable() {
    let app = TestApp::new().await;
    let scim = Scim::new(&app, "acme").await;
    assert!(scim.token.starts_with("pdk_scim_"), "{}", scim.token);
    scim_ok(scim.get(&app, "/Users").await, 200);

    // Stored as its SHA-256 only; the list never shows it.
    let stored: Vec<u8> =
        sqlx::query_scalar("select token_sha256 from scim_tokens").fetch_one(&app.db.pool).await.expect("row");
    assert_eq!(stored, Sha256::digest(scim.token.as_bytes()).to_vec());
    let admin = token(&["tenant:admin"], Some(scim.tenant.parse().expect("uuid")));
    let listed = app.get(format!("/v1/tenants/{}/scim-tokens", scim.tenant)).token(&admin).send().await.expect(200);
    assert!(!String::from_utf8_lossy(&listed.body).contains(&scim.token), "the list shows the token");
    let token_id = listed.json()["items"][0]["id"].as_str().expect("id").to_owned();

    // Revoked: 401 from then on, in SCIM's terms, with WWW-Authenticate.
    app.delete(format!("/v1/tenants/{}/scim-tokens/{token_id}", scim.tenant)).token(&admin).send().await.expect(204);
    let refused = scim.get(&app, "/Users").await;
    assert!(refused.header("www-authenticate").is_some_and(|v| v.starts_with("Bearer")));
    scim_error(refused, 401, None);
    let listed = app.get(format!("/v1/tenants/{}/scim-tokens", scim.tenant)).token(&admin).send().await.expect(200);
    assert!(listed.json()["items"][0]["revoked_at"].is_string());

    // An unknown token, a mangled one, none.
    let path = scim.path("/Users");
    scim_error(app.get(&path).token("pdk_scim_not-a-token").send().await, 401, None);
    scim_error(app.get(&path).token("garbage").send().await, 401, None);
    scim_error(app.get(&path).send().await, 401, None);
}

#[tokio::test]
async fn a_token_or_jwt_of_another_tenant_gets_the_answer_of_a_missing_tenant() {
    let app = TestApp::new().await;
    let own = Scim::new(&app, "acme").await;
    let other = Scim::new(&app, "globex").await;
    let bjensen = own.user(&app, "bjensen").await;
    let user_id = id(&bjensen);

    // The other tenant's token on this tenant's paths: 404, as for a tenant that does not exist.
    let foreign = app.get(own.path("/Users")).token(&other.token).send().await;
    let foreign = scim_error(foreign, 404, None);
    let missing = format!("/v1/tenants/{}/scim/v2/Users", uuid::Uuid::now_v7());
    let missing = scim_error(app.get(&missing).token(&other.token).send().await, 404, None);
    assert_eq!(foreign, missing, "a foreign tenant answers like a missing one");
    let delete = app.delete(own.path(&format!("/Users/{user_id}"))).token(&other.token).send().await;
    scim_error(delete, 404, None);
    scim_ok(own.get(&app, &format!("/Users/{user_id}")).await, 200);

    // The refused write is filed under the caller's tenant, never the target's.
    let filed: Vec<(Option<uuid::Uuid>, String)> = sqlx::query_as(
        "select tenant_id, actor_sub from audit_events where action = 'identity.user.delete' and outcome = 'failure'",
    )
    .fetch_all(&app.db.pool)
    .await
    .expect("events");
    assert_eq!(filed.len(), 1, "{filed:?}");
    assert_eq!(filed[0].0.map(|t| t.to_string()), Some(other.tenant.clone()));
    assert!(filed[0].1.starts_with("scim-token:"), "{filed:?}");

    // JWTs: the tenant's admin and the provider's may; another tenant's admin gets 404; a member 403.
    let path = own.path("/Users");
    let own_admin = token(&["tenant:admin"], Some(own.tenant.parse().expect("uuid")));
    scim_ok(app.get(&path).token(&own_admin).send().await, 200);
    scim_ok(app.get(&path).token(&admin()).send().await, 200);
    let other_admin = token(&["tenant:admin"], Some(other.tenant.parse().expect("uuid")));
    scim_error(app.get(&path).token(&other_admin).send().await, 404, None);
    let member = token(&["tenant:member"], Some(own.tenant.parse().expect("uuid")));
    scim_error(app.get(&path).token(&member).send().await, 403, None);
    // SCIM tokens are for SCIM only.
    let tenant_path = format!("/v1/tenants/{}", own.tenant);
    let refused = app.get(&tenant_path).token(&own.token).send().await.problem(401, "invalid_token");
    assert!(refused["detail"].as_str().is_some_and(|d| d.contains("/scim/v2/")), "{refused}");
}

#[tokio::test]
async fn the_rfc_user_examples_round_trip() {
    let app = TestApp::new().await;
    let scim = Scim::new(&app, "acme").await;
    // RFC 7644 section 3.3.
    let body = json!({
        "schemas": [USER],
        "userName": "bjensen",
        "externalId": "bjensen",
        "name": { "formatted": "Ms. Barbara J Jensen III", "familyName": "Jensen", "givenName": "Barbara" }
    });
    let resp = scim.post(&app, "/Users", body).await.expect(201);
    let location = resp.header("location").expect("Location").to_owned();
    let created = resp.json();
    let user_id = id(&created);
    assert_eq!(location, scim.path(&format!("/Users/{user_id}")));
    assert_eq!(created["meta"]["location"], location);
    assert_eq!(created["meta"]["resourceType"], "User");
    assert_eq!(created["userName"], "bjensen");
    assert_eq!(created["name"]["givenName"], "Barbara");
    assert_eq!(created["active"], true);
    // paddock's POSIX extension: the first id of the range, the user's own group, bash.
    assert_eq!(
        created[POSIX],
        json!({ "uidNumber": 10000, "gidNumber": 10000, "loginShell": "/bin/bash", "sshPublicKeys": [] })
    );
    assert_eq!(scim_ok(scim.get(&app, &format!("/Users/{user_id}")).await, 200), created);

    // Filters (RFC 7644 section 3.4.2.2); userName is case-insensitive, externalId is not.
    scim.user(&app, "jsmith").await;
    let list = scim_ok(scim.get(&app, "/Users?filter=userName%20eq%20%22BJensen%22").await, 200);
    assert_eq!(list["schemas"], json!([LIST]));
    assert_eq!((list["totalResults"].as_u64(), list["Resources"][0]["id"].as_str()), (Some(1), Some(user_id.as_str())));
    let list = scim_ok(scim.get(&app, "/Users?filter=externalId%20eq%20%22BJENSEN%22").await, 200);
    assert_eq!(list["totalResults"], 0);
    let list = scim_ok(
        scim.get(&app, "/Users?filter=name.familyName%20co%20%22ens%22%20or%20userName%20sw%20%22js%22").await,
        200,
    );
    assert_eq!(list["totalResults"], 2);
    // Pages (RFC 7644 section 3.4.2.4).
    scim.user(&app, "mjones").await;
    let page = scim_ok(scim.get(&app, "/Users?startIndex=2&count=1").await, 200);
    assert_eq!(
        (page["totalResults"].as_u64(), page["startIndex"].as_u64(), page["itemsPerPage"].as_u64()),
        (Some(3), Some(2), Some(1))
    );
    assert_eq!(page["Resources"][0]["userName"], "jsmith");
    let page = scim_ok(scim.get(&app, "/Users?count=0").await, 200);
    assert_eq!((page["totalResults"].as_u64(), page["Resources"].as_array().map(Vec::len)), (Some(3), Some(0)));
    let page = scim_ok(scim.get(&app, "/Users?attributes=userName").await, 200);
    assert_eq!(page["Resources"][0], json!({ "schemas": [USER, POSIX], "id": user_id, "userName": "bjensen" }));
    // Search with a body (RFC 7644 section 3.4.3), at the root across users and groups.
    let search = json!({ "schemas": ["urn:ietf:params:scim:api:messages:2.0:SearchRequest"],
        "attributes": ["userName"], "filter": "userName sw \"j\"", "startIndex": 1, "count": 10 });
    let found = scim_ok(scim.post(&app, "/Users/.search", search.clone()).await, 200);
    assert_eq!((found["totalResults"].as_u64(), found["Resources"][0]["userName"].as_str()), (Some(1), Some("jsmith")));
    scim_ok(scim.post(&app, "/Groups", json!({ "schemas": [GROUP], "displayName": "jugglers" })).await, 201);
    let both = json!({ "schemas": ["urn:ietf:params:scim:api:messages:2.0:SearchRequest"],
        "filter": "userName sw \"j\" or displayName sw \"j\"" });
    assert_eq!(scim_ok(scim.post(&app, "/.search", both).await, 200)["totalResults"], 2);

    // Replace (RFC 7644 section 3.5.1): what is left out is cleared; the uid stays.
    let replaced = json!({
        "schemas": [USER, POSIX], "userName": "bjensen", "externalId": "bjensen",
        "name": { "familyName": "Jensen", "givenName": "Barbara", "middleName": "Jane" },
        "emails": [{ "value": "bjensen@example.com" }, { "value": "babs@jensen.org" }],
        POSIX: { "sshPublicKeys": [KEY], "loginShell": "/bin/zsh" }
    });
    let user = scim_ok(scim.put(&app, &format!("/Users/{user_id}"), replaced).await, 200);
    assert_eq!(user["name"], json!({ "familyName": "Jensen", "givenName": "Barbara", "middleName": "Jane" }));
    assert_eq!(
        user[POSIX],
        json!({ "uidNumber": 10000, "gidNumber": 10000, "loginShell": "/bin/zsh", "sshPublicKeys": [KEY] })
    );

    // Patch (RFC 7644 section 3.5.2): an email by filter, deactivation (as Entra ID sends it).
    let ops = json!([
        { "op": "replace", "path": "emails[value eq \"babs@jensen.org\"].type", "value": "home" },
        { "op": "Replace", "path": "active", "value": "False" },
        { "op": "add", "value": { "displayName": "Babs" } }
    ]);
    let user = scim_ok(scim.patch(&app, &format!("/Users/{user_id}"), ops).await, 200);
    assert_eq!(user["emails"][1], json!({ "value": "babs@jensen.org", "type": "home" }));
    assert_eq!((user["active"].as_bool(), user["displayName"].as_str()), (Some(false), Some("Babs")));
    assert_eq!(uid(&user), 10000, "a patch keeps the uid");

    // Delete (RFC 7644 section 3.6), then the user is gone.
    scim.delete(&app, &format!("/Users/{user_id}")).await.expect(204);
    scim_error(scim.get(&app, &format!("/Users/{user_id}")).await, 404, None);
    scim_error(scim.delete(&app, &format!("/Users/{user_id}")).await, 404, None);
    let events: i64 = sqlx::query_scalar(
        "select count(*) from audit_events where action like 'identity.user.%' and outcome = 'success'",
    )
    .fetch_one(&app.db.pool)
    .await
    .expect("count");
    assert_eq!(events, 6, "3 creates, a replace, a patch and a delete are audited");
}

#[tokio::test]
async fn the_rfc_group_examples_manage_members() {
    let app = TestApp::new().await;
    let scim = Scim::new(&app, "acme").await;
    let bjensen = id(&scim.user(&app, "bjensen").await);
    let jsmith = id(&scim.user(&app, "jsmith").await);
    // RFC 7644 section 3.3 (a group with a member).
    let body = json!({ "schemas": [GROUP], "displayName": "Tour Guides", "members": [{ "value": bjensen }] });
    let group = scim_ok(scim.post(&app, "/Groups", body).await, 201);
    let group_id = id(&group);
    assert_eq!(group["members"][0]["value"], bjensen.as_str());
    assert_eq!(group["members"][0]["display"], "bjensen");
    assert_eq!(group[POSIX_GROUP]["gidNumber"], 10002, "after the users' uids, in one id space");
    let user = scim_ok(scim.get(&app, &format!("/Users/{bjensen}")).await, 200);
    assert_eq!(user["groups"][0]["value"], group_id.as_str());

    // RFC 7644 section 3.5.2.1: add a member; section 3.5.2.2: remove one by filter.
    let add = json!([{ "op": "add", "path": "members", "value": [{ "display": "jsmith", "value": jsmith }] }]);
    let group = scim_ok(scim.patch(&app, &format!("/Groups/{group_id}"), add).await, 200);
    assert_eq!(group["members"].as_array().map(Vec::len), Some(2));
    let remove = json!([{ "op": "remove", "path": format!("members[value eq \"{bjensen}\"]") }]);
    let group = scim_ok(scim.patch(&app, &format!("/Groups/{group_id}"), remove).await, 200);
    assert_eq!(
        group["members"],
        json!([{ "value": jsmith, "display": "jsmith", "type": "User",
        "$ref": scim.path(&format!("/Users/{jsmith}")) }])
    );
    // RFC 7644 section 3.5.2.3: replace all members.
    let replace = json!([{ "op": "replace", "path": "members", "value": [{ "value": bjensen }] }]);
    let group = scim_ok(scim.patch(&app, &format!("/Groups/{group_id}"), replace).await, 200);
    assert_eq!(group["members"][0]["value"], bjensen.as_str());

    // Filters and projections as identity providers use them.
    let list = scim_ok(
        scim.get(&app, "/Groups?filter=displayName%20eq%20%22tour%20guides%22&excludedAttributes=members").await,
        200,
    );
    assert_eq!(list["totalResults"], 1);
    assert!(list["Resources"][0].get("members").is_none());
    let by_member = format!("/Groups?filter=members%20eq%20%22{bjensen}%22");
    assert_eq!(scim_ok(scim.get(&app, &by_member).await, 200)["totalResults"], 1);

    // A deleted user leaves its groups; a deleted group is gone.
    scim.delete(&app, &format!("/Users/{bjensen}")).await.expect(204);
    let group = scim_ok(scim.get(&app, &format!("/Groups/{group_id}")).await, 200);
    assert_eq!(group["members"], json!([]));
    scim.delete(&app, &format!("/Groups/{group_id}")).await.expect(204);
    scim_error(scim.get(&app, &format!("/Groups/{group_id}")).await, 404, None);
}

#[tokio::test]
async fn discovery_describes_the_service_and_the_posix_extension() {
    let app = TestApp::new().await;
    let scim = Scim::new(&app, "acme").await;
    let config = scim_ok(scim.get(&app, "/ServiceProviderConfig").await, 200);
    assert_eq!(config["patch"]["supported"], true);
    assert_eq!(config["filter"], json!({ "supported": true, "maxResults": 1000 }));
    assert_eq!(config["bulk"]["supported"], false);
    let types = scim_ok(scim.get(&app, "/ResourceTypes").await, 200);
    assert_eq!(types["totalResults"], 2);
    let user = scim_ok(scim.get(&app, "/ResourceTypes/User").await, 200);
    assert_eq!(user["schemaExtensions"][0]["schema"], POSIX);
    let schemas = scim_ok(scim.get(&app, "/Schemas").await, 200);
    assert_eq!(schemas["totalResults"], 4);
    let posix = scim_ok(scim.get(&app, &format!("/Schemas/{POSIX}")).await, 200);
    let names: Vec<&str> =
        posix["attributes"].as_array().into_iter().flatten().filter_map(|a| a["name"].as_str()).collect();
    assert_eq!(names, ["uidNumber", "gidNumber", "loginShell", "sshPublicKeys"]);
    scim_error(scim.get(&app, "/Schemas/urn:nope").await, 404, None);
    scim_error(scim.get(&app, "/Bulk").await, 404, None);
}

#[tokio::test]
async fn posix_ids_are_assigned_in_range_kept_unique_and_never_reused() {
    let app = TestApp::new().await;
    let scim = Scim::new(&app, "acme").await;
    let a = scim.user(&app, "a").await;
    let b = scim.user(&app, "b").await;
    assert_eq!((uid(&a), uid(&b)), (10000, 10001));
    scim.delete(&app, &format!("/Users/{}", id(&a))).await.expect(204);
    let c = scim.user(&app, "c").await;
    assert_eq!(uid(&c), 10002, "a deleted user's uid is not given to another");
    // The identity provider may name ids: in the range and not another's.
    let named = json!({ "schemas": [USER], "userName": "d", POSIX: { "uidNumber": 10000, "gidNumber": 20000 } });
    let d = scim_ok(scim.post(&app, "/Users", named).await, 201);
    assert_eq!((uid(&d), d[POSIX]["gidNumber"].as_i64()), (10000, Some(20000)));
    let taken = json!({ "schemas": [USER], "userName": "e", POSIX: { "uidNumber": 10001 } });
    scim_error(scim.post(&app, "/Users", taken).await, 409, Some("uniqueness"));
    // A replace without ids keeps them.
    let kept = scim_ok(
        scim.put(&app, &format!("/Users/{}", id(&d)), json!({ "schemas": [USER], "userName": "d" })).await,
        200,
    );
    assert_eq!((uid(&kept), kept[POSIX]["gidNumber"].as_i64()), (10000, Some(20000)));
    // Each tenant has the whole range.
    let other = Scim::new(&app, "globex").await;
    assert_eq!(uid(&other.user(&app, "a").await), 10000);
}

#[tokio::test]
async fn bad_input_gets_scim_errors() {
    let app = TestApp::new().await;
    let scim = Scim::new(&app, "acme").await;
    let user = scim.user(&app, "bjensen").await;
    for filter in ["userName%20eq", "userName%20xx%20%22a%22", "(userName%20eq%20%22a%22", "userName%20eq%20bjensen"] {
        scim_error(scim.get(&app, &format!("/Users?filter={filter}")).await, 400, Some("invalidFilter"));
    }
    scim_error(scim.get(&app, "/Groups?filter=displayName%20eq").await, 400, Some("invalidFilter"));
    let dup = json!({ "schemas": [USER], "userName": "BJensen" });
    scim_error(scim.post(&app, "/Users", dup).await, 409, Some("uniqueness"));
    let bad_key =
        json!({ "schemas": [USER], "userName": "k", POSIX: { "sshPublicKeys": ["ssh-ed25519 not*base64 me"] } });
    scim_error(scim.post(&app, "/Users", bad_key).await, 400, Some("invalidValue"));
    for uid in [401, 999, 65534, 60000, 2_147_483_648_i64] {
        let out = json!({ "schemas": [USER], "userName": "u", POSIX: { "uidNumber": uid } });
        scim_error(scim.post(&app, "/Users", out).await, 400, Some("invalidValue"));
    }
    let no_name = json!({ "schemas": [USER], "displayName": "x" });
    scim_error(scim.post(&app, "/Users", no_name).await, 400, Some("invalidValue"));
    scim_error(scim.post(&app, "/Users", json!({ "userName": "x" })).await, 400, Some("invalidSyntax"));
    let not_json = app
        .post(scim.path("/Users"))
        .token(&scim.token)
        .header("content-type", "application/scim+json")
        .raw("{")
        .send()
        .await;
    scim_error(not_json, 400, Some("invalidSyntax"));
    let wrong_type =
        app.post(scim.path("/Users")).token(&scim.token).header("content-type", "text/plain").raw("{}").send().await;
    scim_error(wrong_type, 415, None);
    let unknown_member =
        json!({ "schemas": [GROUP], "displayName": "g", "members": [{ "value": uuid::Uuid::now_v7() }] });
    scim_error(scim.post(&app, "/Groups", unknown_member).await, 400, Some("invalidValue"));
    let user_path = format!("/Users/{}", id(&user));
    scim_error(
        scim.patch(&app, &user_path, json!([{ "op": "remove", "path": "emails[type eq" }])).await,
        400,
        Some("invalidPath"),
    );
    scim_error(scim.patch(&app, &user_path, json!([{ "op": "remove" }])).await, 400, Some("noTarget"));
    scim_error(
        scim.patch(
            &app,
            &user_path,
            json!([{ "op": "add", "path": format!("{POSIX}:sshPublicKeys"), "value": ["nope"] }]),
        )
        .await,
        400,
        Some("invalidValue"),
    );
    scim_error(scim.get(&app, "/Users/not-a-uuid").await, 404, None);
    // Nothing of the refused writes was kept.
    assert_eq!(scim_ok(scim.get(&app, "/Users").await, 200)["totalResults"], 1);
    assert_eq!(scim_ok(scim.get(&app, &user_path).await, 200)[POSIX]["sshPublicKeys"], json!([]));
}

#[tokio::test]
async fn a_suspended_tenant_may_only_take_access_away() {
    let app = TestApp::new().await;
    let scim = Scim::new(&app, "acme").await;
    let alice = id(&scim.user(&app, "alice").await);
    let bob = id(&scim.user(&app, "bob").await);
    let body = json!({ "schemas": [GROUP], "displayName": "ml", "members": [{ "value": alice }, { "value": bob }] });
    let group = id(&scim_ok(scim.post(&app, "/Groups", body).await, 201));
    app.post(format!("/v1/tenants/{}/suspend", scim.tenant)).token(&admin()).send().await.expect(200);

    // What could give access is refused.
    scim_error(scim.post(&app, "/Users", json!({ "schemas": [USER], "userName": "carol" })).await, 409, None);
    let rename = json!([{ "op": "replace", "path": "displayName", "value": "Alice" }]);
    scim_error(scim.patch(&app, &format!("/Users/{alice}"), rename).await, 409, None);
    let readd = json!([{ "op": "add", "path": "members", "value": [{ "value": bob }] }]);
    // (bob is a member already: adding him again changes nothing and is no grant.)
    scim_ok(scim.patch(&app, &format!("/Groups/{group}"), readd).await, 200);
    let token_create = app
        .post(format!("/v1/tenants/{}/scim-tokens", scim.tenant))
        .token(&token(&["tenant:admin"], Some(scim.tenant.parse().expect("uuid"))))
        .json(&json!({}))
        .send()
        .await;
    token_create.problem(409, "tenant_suspended");

    // Deactivations and removals apply.
    let off = json!([{ "op": "replace", "path": "active", "value": false }]);
    assert_eq!(scim_ok(scim.patch(&app, &format!("/Users/{alice}"), off).await, 200)["active"], false);
    let remove = json!([{ "op": "remove", "path": format!("members[value eq \"{alice}\"]") }]);
    scim_ok(scim.patch(&app, &format!("/Groups/{group}"), remove).await, 200);
    scim.delete(&app, &format!("/Users/{bob}")).await.expect(204);
    scim.delete(&app, &format!("/Groups/{group}")).await.expect(204);
    // Reactivating gives access: refused.
    let on = json!([{ "op": "replace", "path": "active", "value": true }]);
    scim_error(scim.patch(&app, &format!("/Users/{alice}"), on).await, 409, None);
    // The provider's writes still work.
    let path = scim.path("/Users");
    let created = app.post(&path).token(&admin()).header("content-type", "application/scim+json");
    scim_ok(created.json(&json!({ "schemas": [USER], "userName": "dave" })).send().await, 201);
}

#[tokio::test]
async fn concurrent_creates_get_distinct_ids_and_one_name_wins_once() {
    let app = TestApp::new().await;
    let scim = Scim::new(&app, "acme").await;
    let creates = (0..8).map(|n| scim.post(&app, "/Users", json!({ "schemas": [USER], "userName": format!("u{n}") })));
    let mut uids: Vec<i64> =
        futures::future::join_all(creates).await.into_iter().map(|r| uid(&scim_ok(r, 201))).collect();
    uids.sort_unstable();
    assert_eq!(uids, (10000..10008).collect::<Vec<i64>>(), "each create got its own uid, the lowest free ones");
    let same = (0..4).map(|_| scim.post(&app, "/Users", json!({ "schemas": [USER], "userName": "twin" })));
    let statuses: Vec<u16> = futures::future::join_all(same).await.iter().map(|r| r.status.as_u16()).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 1, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 409).count(), 3, "{statuses:?}");
}
