//! The tenant's people in its Slurm clusters, on the simulated drivers: `slurm.accounts` maps SCIM
//! groups to Slurm accounts (refused with 422 for a group the tenant does not have, another
//! tenant's included, a duplicate, or a value out of bounds); the cluster's identity sync writes
//! users, accounts, QOS and associations into the simulated Slurm accounting, woken by each SCIM
//! change (a deactivated or deleted user loses its associations without waiting for a drift
//! check), restores what was changed there behind paddock's back at the drift check, and reports
//! counts in `status.identity` and the `IdentitySynced` condition. The writes through slurmrestd
//! are proven against the slurmrestd stand-in in paddock-kube's tests.

use std::time::Duration;

use paddock_domain::slurm_identity::{Association, Slurmdb};
use paddock_testkit::{admin, eventually, TestApp};
use paddock_types::ClusterId;
use serde_json::{json, Value};

use crate::common::{fleet, id, machine_class, tenant};
use crate::lifecycle::{condition, slurm, Lab};

const WAIT: Duration = Duration::from_secs(60);
const USER: &str = "urn:ietf:params:scim:schemas:core:2.0:User";
const GROUP: &str = "urn:ietf:params:scim:schemas:core:2.0:Group";
const PATCH_OP: &str = "urn:ietf:params:scim:api:messages:2.0:PatchOp";

/// A SCIM request of the provider's admin on `tenant`'s people; returns the answer's body.
async fn scim(
    app: &TestApp,
    method: http::Method,
    tenant: &str,
    tail: &str,
    body: Option<Value>,
    status: u16,
) -> Value {
    let mut req = app.req(method, format!("/v1/tenants/{tenant}/scim/v2{tail}")).token(&admin());
    if let Some(body) = body {
        req = req.header("content-type", "application/scim+json").json(&body);
    }
    let resp = req.send().await.expect(status);
    if status == 204 {
        Value::Null
    } else {
        resp.json()
    }
}

async fn user(app: &TestApp, tenant: &str, name: &str) -> String {
    let body = json!({ "schemas": [USER], "userName": name });
    id(&scim(app, http::Method::POST, tenant, "/Users", Some(body), 201).await)
}

async fn group(app: &TestApp, tenant: &str, name: &str, members: &[&str]) -> String {
    let members: Vec<Value> = members.iter().map(|m| json!({ "value": m })).collect();
    let body = json!({ "schemas": [GROUP], "displayName": name, "members": members });
    id(&scim(app, http::Method::POST, tenant, "/Groups", Some(body), 201).await)
}

async fn deactivate(app: &TestApp, tenant: &str, user: &str) {
    let ops = json!({ "schemas": [PATCH_OP], "Operations": [{ "op": "replace", "path": "active", "value": false }] });
    scim(app, http::Method::PATCH, tenant, &format!("/Users/{user}"), Some(ops), 200).await;
}

/// A Slurm cluster of one system node and no compute node, mapping `accounts`.
fn mapped(name: &str, accounts: Value) -> Value {
    let mut body = slurm(name, json!([{ "name": "sys", "machine_class": "gpu", "count": 1 }]));
    body["slurm"] = json!({ "accounts": accounts });
    body
}

/// (user, account) of every user association of `db`, sorted.
fn associations(db: &Slurmdb) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> =
        db.associations.iter().filter(|a| !a.user.is_empty()).map(|a| (a.user.clone(), a.account.clone())).collect();
    pairs.sort();
    pairs
}

/// Waits until the simulated Slurm of `cluster` has exactly `pairs` as user associations.
async fn holds(lab: &Lab, cluster: &str, pairs: &[(&str, &str)]) -> Slurmdb {
    let cluster_id = ClusterId(cluster.parse().expect("uuid"));
    let want: Vec<(String, String)> = pairs.iter().map(|(u, a)| ((*u).to_owned(), (*a).to_owned())).collect();
    eventually(WAIT, || async {
        let db = lab.world.slurmdb(cluster_id).await.expect("slurmdb");
        (associations(&db) == want).then_some(db)
    })
    .await
}

#[tokio::test]
async fn mapped_groups_become_slurm_accounts_and_scim_changes_reach_slurm_without_a_drift_check() {
    // No drift check in this test's time: every change below reaches Slurm through the wake-up.
    let lab = Lab::tuned(|s| s.drift_interval = Duration::from_secs(3600), |d| d).await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("gpu", &["s1"]).await;
    let (alice, bob) = (user(&lab.app, &lab.tenant, "alice").await, user(&lab.app, &lab.tenant, "bob").await);
    group(&lab.app, &lab.tenant, "ML-Team", &[&alice, &bob]).await;
    group(&lab.app, &lab.tenant, "infra", &[&bob]).await;
    let accounts = json!([
        { "group": "ml-team", "account": "ml", "fairshare": 10, "limits": { "max_jobs": 5, "gpu_minutes": 6000 } },
        { "group": "Infra" },
    ]);
    let created = lab.create(mapped("s", accounts)).await;
    let cluster = id(&created["cluster"]);
    assert_eq!(created["cluster"]["slurm"]["accounts"][1]["fairshare"], 1, "{created}");
    lab.ready(&cluster).await;

    let db = holds(&lab, &cluster, &[("alice", "ml"), ("bob", "infra"), ("bob", "ml")]).await;
    let defaults: Vec<(&str, &str)> = db.users.iter().map(|u| (u.name.as_str(), u.default_account.as_str())).collect();
    assert_eq!(defaults, [("alice", "ml"), ("bob", "ml")], "the first mapped group is the default account");
    let own = db.associations.iter().find(|a| a.account == "ml" && a.user.is_empty()).expect("the account's own");
    assert_eq!((own.shares, own.default_qos.as_deref()), (10, Some("paddock-ml")));
    let qos = db.qos.iter().find(|q| q.name == "paddock-ml").expect("the account's QOS");
    assert_eq!((qos.max_jobs, qos.gpu_minutes), (Some(5), Some(6000)));
    let c = eventually(WAIT, || async {
        let c = lab.cluster(&cluster).await;
        (c["status"]["identity"]["users"] == 2).then_some(c)
    })
    .await;
    assert_eq!(condition(&c, "IdentitySynced")["status"], "True", "{c}");
    let counts = &c["status"]["identity"];
    assert_eq!((counts["accounts"].as_u64(), counts["associations"].as_u64()), (Some(2), Some(3)), "{c}");

    // bob is deactivated: he loses every association (and his Slurm user), promptly.
    deactivate(&lab.app, &lab.tenant, &bob).await;
    let db = holds(&lab, &cluster, &[("alice", "ml")]).await;
    assert!(!db.users.iter().any(|u| u.name == "bob"), "{db:?}");
    // carol joins the infra group; alice is deleted.
    let carol = user(&lab.app, &lab.tenant, "carol").await;
    let infra =
        scim(&lab.app, http::Method::GET, &lab.tenant, "/Groups?filter=displayName%20eq%20%22infra%22", None, 200)
            .await["Resources"][0]["id"]
            .as_str()
            .expect("infra")
            .to_owned();
    let add = json!({ "schemas": [PATCH_OP], "Operations": [{ "op": "add", "path": "members", "value": [{ "value": carol }] }] });
    scim(&lab.app, http::Method::PATCH, &lab.tenant, &format!("/Groups/{infra}"), Some(add), 200).await;
    scim(&lab.app, http::Method::DELETE, &lab.tenant, &format!("/Users/{alice}"), None, 204).await;
    let db = holds(&lab, &cluster, &[("carol", "infra")]).await;
    assert_eq!(db.users.len(), 1, "{db:?}");
    eventually(WAIT, || async { (lab.cluster(&cluster).await["status"]["identity"]["users"] == 1).then_some(()) })
        .await;
}

#[tokio::test]
async fn what_is_changed_in_slurm_behind_paddocks_back_is_restored_at_the_drift_check() {
    let lab = Lab::tuned(|s| s.drift_interval = Duration::from_millis(100), |d| d).await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("gpu", &["s1"]).await;
    let alice = user(&lab.app, &lab.tenant, "alice").await;
    group(&lab.app, &lab.tenant, "ml", &[&alice]).await;
    let created = lab.create(mapped("s", json!([{ "group": "ml" }]))).await;
    let cluster = id(&created["cluster"]);
    lab.ready(&cluster).await;
    let mut db = holds(&lab, &cluster, &[("alice", "ml")]).await;

    // A tenant's admin removes alice's association and adds mallory to paddock's account; the
    // account's own association and Slurm's root are left alone otherwise.
    let root = Association { account: "root".into(), user: "root".into(), shares: 1, ..Association::default() };
    db.associations.retain(|a| a.user != "alice");
    db.associations.push(Association { account: "ml".into(), user: "mallory".into(), ..Association::default() });
    db.associations.push(root.clone());
    let cluster_id = ClusterId(cluster.parse().expect("uuid"));
    lab.world.set_slurmdb(cluster_id, &db).await.expect("tamper");

    let restored = holds(&lab, &cluster, &[("alice", "ml"), ("root", "root")]).await;
    assert!(restored.associations.contains(&root), "Slurm's own association was touched: {restored:?}");
    // The event is written once the driver's sync returned: wait for it too.
    eventually(WAIT, || async {
        let events = lab.app.get(format!("{}/events", lab.cluster_path(&cluster))).token(&lab.tenant_token).send();
        let events = events.await.expect(200).json();
        let items = events["items"].as_array().cloned().unwrap_or_default();
        items
            .iter()
            .any(|e| e["reason"] == "IdentitySynced" && e["message"].as_str().is_some_and(|m| m.contains("mallory")))
            .then_some(())
    })
    .await;
}

/// A served API with a tenant `acme` (its admin's token), machines for a system pool, and one
/// group `ml` in acme and a group `secret` in another tenant.
async fn contract() -> (TestApp, String, String) {
    let app = TestApp::served().await;
    machine_class(&app, "gpu", 8).await;
    fleet(&app, "gpu", 2).await;
    let acme = id(&tenant(&app, "acme").await);
    let other = id(&tenant(&app, "other").await);
    group(&app, &acme, "ml", &[]).await;
    group(&app, &other, "secret", &[]).await;
    let token = paddock_testkit::token(&["tenant:admin"], Some(acme.parse().expect("uuid")));
    (app, acme, token)
}

#[tokio::test]
async fn a_group_the_tenant_does_not_have_or_a_duplicate_or_a_bad_value_is_refused() {
    let (app, acme, token) = contract().await;
    let path = format!("/v1/tenants/{acme}/clusters");
    let refused = |accounts: Value, status: u16| {
        let (app, path, token) = (&app, &path, &token);
        async move {
            let resp = app.post(path).token(token).json(&mapped("s", accounts)).send().await.expect(status);
            resp.json()
        }
    };
    for (accounts, code, field) in [
        (json!([{ "group": "nobody" }]), "slurm_account_group_unknown", "slurm.accounts[0].group"),
        // Another tenant's group is as unknown as a missing one.
        (json!([{ "group": "ml" }, { "group": "secret" }]), "slurm_account_group_unknown", "slurm.accounts[1].group"),
        (json!([{ "group": "ml" }, { "group": "ML" }]), "slurm_account_duplicate", "slurm.accounts[1].group"),
        (
            json!([{ "group": "ml" }, { "group": "ml-2", "account": "ml" }]),
            "slurm_account_duplicate",
            "slurm.accounts[1].account",
        ),
        (json!([{ "group": "ml", "fairshare": 0 }]), "validation_failed", "slurm.accounts[0].fairshare"),
        (
            json!([{ "group": "ml", "limits": { "max_jobs": 0 } }]),
            "validation_failed",
            "slurm.accounts[0].limits.max_jobs",
        ),
        (json!([{ "group": "ML Team" }]), "validation_failed", "slurm.accounts[0].group"),
        (json!([{ "group": "ml", "account": "Not-A-Name" }]), "validation_failed", "slurm.accounts[0].account"),
    ] {
        let problem = refused(accounts.clone(), 422).await;
        assert_eq!(problem["code"], code, "{accounts}: {problem}");
        assert_eq!(problem["errors"][0]["field"], field, "{accounts}: {problem}");
    }
    let unknown = refused(json!([{ "group": "secret" }]), 422).await;
    assert!(unknown["detail"].to_string().contains("secret") || unknown["errors"].to_string().contains("secret"));
    let unknown_field = refused(json!([{ "group": "ml", "shares": 3 }]), 422).await;
    assert_eq!(unknown_field["code"], "validation_failed", "{unknown_field}");
    let clusters = app.get(&path).token(&token).send().await.expect(200).json();
    assert_eq!(clusters["items"], json!([]), "a refused cluster was written");

    // A PATCH that maps a group the tenant lacks is refused; one that keeps a mapped group passes.
    let created = app.post(&path).token(&token).json(&mapped("s", json!([{ "group": "ml" }]))).send().await;
    let cluster = id(&created.expect(202).json()["cluster"]);
    let patch = |accounts: Value| json!({ "slurm": { "accounts": accounts } });
    let at = format!("{path}/{cluster}");
    let resp = app.patch(&at).token(&token).json(&patch(json!([{ "group": "ml" }, { "group": "secret" }]))).send();
    assert_eq!(resp.await.expect(422).json()["code"], "slurm_account_group_unknown");
    let resp = app.patch(&at).token(&token).json(&patch(json!([{ "group": "ml", "fairshare": 5 }]))).send();
    let updated = resp.await.expect(202).json();
    assert_eq!(updated["cluster"]["slurm"]["accounts"][0]["fairshare"], 5, "{updated}");
}
