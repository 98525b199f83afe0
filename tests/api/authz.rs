//! authz: the authorization matrix of docs/api.md. Every `/v1` route × every role (× own,
//! foreign and missing objects) gets exactly the status the matrix says, with the Problem code
//! `forbidden` / `not_found`; a tenant token's 2xx bodies never mention another tenant; every
//! refused mutating call is audited as a failure; without a token every route is 401
//! `missing_token`; another tenant's objects are answered exactly like missing ones.

use std::collections::{BTreeSet, HashMap};

use http::Method;
use paddock_testkit::{admin, token, Resp, TestApp};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::common::{self, id};

/// The roles, in the column order of the matrix.
const ROLES: [&str; 5] = ["provider:admin", "provider:operator", "billing:reader", "tenant:admin", "tenant:member"];

/// Name of the tenant the tenant tokens belong to.
const OWN_NAME: &str = "acme-own";
/// Name of the other tenant, which a tenant token must never see.
const FOREIGN_NAME: &str = "globex-foreign";
/// The machine class every machine of the world uses.
const CLASS: &str = "gpu-h100";

/// Valid bodies. `{n}` is a number unique to each call, so that every call creates or changes
/// something (and so that a success is a real success, audited as such).
const TENANT_CREATE: &str = r#"{"name": "tenant-{n}"}"#;
const TENANT_PATCH: &str = r#"{"display_name": "Renamed {n}"}"#;
const CLASS_CREATE: &str =
    r#"{"name": "class-{n}", "cpu_cores": 32, "memory_gib": 256, "gpu_model": "", "gpu_count": 0}"#;
const CLASS_PATCH: &str = r#"{"description": "patched {n}"}"#;
const ENROLL: &str = r#"{"name": "node-{n}", "machine_class": "gpu-h100",
    "bmc": {"url": "https://bmc-{n}.example:443", "username": "admin", "password": "s3cret-pw"}}"#;
const MACHINE_PATCH: &str = r#"{"labels": {"rack": "r{n}"}}"#;
const UNSIGNED_CHECKPOINT: &str = r#"{"checkpoint": {"issued_at": "2026-12-01T00:00:00Z", "machines": [],
    "signature": "AAAA", "key_id": "0000000000000000"}}"#;
const WEBHOOK_CREATE: &str = r#"{"url": "https://hooks.example.com/{n}", "events": ["cluster.ready"]}"#;
const WEBHOOK_PATCH: &str = r#"{"description": "patched {n}"}"#;
const SCIM_TOKEN_CREATE: &str = r#"{"description": "idp {n}"}"#;
const REASON: &str = r#"{"reason": "fan replacement {n}"}"#;
const HEALTH_REPORT: &str = r#"{"status": "degraded", "checks": [{"name": "fan", "status": "degraded"}]}"#;
const CLUSTER_CREATE: &str = r#"{"name": "cluster-{n}", "kind": "kubernetes", "isolation": "private-nodes",
    "node_pools": [{"name": "gpu", "machine_class": "gpu-h100", "count": 1}]}"#;
const CLUSTER_PATCH: &str = r#"{"kubernetes_version": "v1.36.{n}"}"#;
const POOL_CREATE: &str = r#"{"name": "pool-{n}", "machine_class": "gpu-h100", "count": 1}"#;
const POOL_PATCH: &str = r#"{"labels": {"batch": "b{n}"}}"#;
const ADJUSTMENT: &str = r#"{"tenant_id": "{own}", "machine_class": "gpu-h100", "node_seconds": {n},
    "gpu_seconds": 0, "control_plane_seconds": 0, "reason": "correction {n}"}"#;

/// One route on concrete objects, and the status each role must get (in `ROLES` order).
///
/// Placeholders in `path`:
/// - tenants: `{own}` (the tenant tokens' tenant), `{foreign}` (another tenant), `{missing}`
///   (never existed), `{fresh_tenant}` (created for this call);
/// - machine classes: `{class}` (in use by machines), `{missing_class}`, `{fresh_class}` (unused);
/// - machines: `{machine}` (enrolling), `{maint_machine}` (in maintenance), `{missing_machine}`,
///   `{fresh_machine}` (available, made for this call), `{fresh_maint_machine}` (in maintenance,
///   made for this call), `{fresh_held_machine}` (active in a fixture tenancy, made for this call);
/// - operations: `{own_op}`, `{foreign_op}` (of the two tenants), `{machine_op}` (provider-side,
///   no tenant), `{missing_op}`;
/// - billing periods: `{closed_period}` (a past month);
/// - clusters: `{own_cluster}`, `{foreign_cluster}` (one per tenant), `{fresh_cluster}` (in the
///   own tenant, made for this call); node pools: `{own_pool}`, `{foreign_pool}` (of those
///   clusters), `{fresh_pool}` (in the own cluster, made for this call).
struct Row {
    method: Method,
    path: &'static str,
    body: Option<&'static str>,
    expect: [u16; 5],
}

fn get(path: &'static str, expect: [u16; 5]) -> Row {
    Row { method: Method::GET, path, body: None, expect }
}

fn post(path: &'static str, body: Option<&'static str>, expect: [u16; 5]) -> Row {
    Row { method: Method::POST, path, body, expect }
}

fn patch(path: &'static str, body: &'static str, expect: [u16; 5]) -> Row {
    Row { method: Method::PATCH, path, body: Some(body), expect }
}

fn delete(path: &'static str, expect: [u16; 5]) -> Row {
    Row { method: Method::DELETE, path, body: None, expect }
}

/// The matrix. Rows run top to bottom, each for every role in column order.
#[rustfmt::skip]
fn matrix() -> Vec<Row> {
    const ALL: [u16; 5] = [200, 200, 200, 200, 200];
    vec![
        //                                                                   p:admin p:oper bill  t:admin t:member
        // Tenants.
        post("/v1/tenants", Some(TENANT_CREATE),                            [201,   403,   403,  403,   403]),
        get("/v1/tenants",                                                  ALL),
        get("/v1/tenants/{own}",                                            ALL),
        get("/v1/tenants/{foreign}",                                        [200,   200,   200,  404,   404]),
        get("/v1/tenants/{missing}",                                        [404,   404,   404,  404,   404]),
        patch("/v1/tenants/{own}", TENANT_PATCH,                            [200,   403,   403,  403,   403]),
        patch("/v1/tenants/{foreign}", TENANT_PATCH,                        [200,   403,   403,  403,   403]),
        patch("/v1/tenants/{missing}", TENANT_PATCH,                        [404,   403,   403,  403,   403]),
        post("/v1/tenants/{own}/suspend", None,                             [200,   403,   403,  403,   403]),
        post("/v1/tenants/{foreign}/suspend", None,                         [200,   403,   403,  403,   403]),
        post("/v1/tenants/{missing}/suspend", None,                         [404,   403,   403,  403,   403]),
        post("/v1/tenants/{own}/resume", None,                              [200,   403,   403,  403,   403]),
        post("/v1/tenants/{foreign}/resume", None,                          [200,   403,   403,  403,   403]),
        post("/v1/tenants/{missing}/resume", None,                          [404,   403,   403,  403,   403]),
        delete("/v1/tenants/{fresh_tenant}",                                [204,   403,   403,  403,   403]),
        delete("/v1/tenants/{missing}",                                     [404,   403,   403,  403,   403]),
        // Machine classes: every role reads them, only provider:admin writes them.
        post("/v1/machine-classes", Some(CLASS_CREATE),                     [201,   403,   403,  403,   403]),
        get("/v1/machine-classes",                                          ALL),
        get("/v1/machine-classes/{class}",                                  ALL),
        get("/v1/machine-classes/{missing_class}",                          [404,   404,   404,  404,   404]),
        patch("/v1/machine-classes/{class}", CLASS_PATCH,                   [200,   403,   403,  403,   403]),
        patch("/v1/machine-classes/{missing_class}", CLASS_PATCH,           [404,   403,   403,  403,   403]),
        delete("/v1/machine-classes/{fresh_class}",                         [204,   403,   403,  403,   403]),
        delete("/v1/machine-classes/{class}",                               [409,   403,   403,  403,   403]),
        delete("/v1/machine-classes/{missing_class}",                       [404,   403,   403,  403,   403]),
        // Machines: providers only; the operator manages them too.
        post("/v1/machines", Some(ENROLL),                                  [202,   202,   403,  403,   403]),
        get("/v1/machines",                                                 [200,   200,   403,  403,   403]),
        get("/v1/machines/{machine}",                                       [200,   200,   403,  403,   403]),
        get("/v1/machines/{missing_machine}",                               [404,   404,   403,  403,   403]),
        patch("/v1/machines/{machine}", MACHINE_PATCH,                      [200,   200,   403,  403,   403]),
        patch("/v1/machines/{missing_machine}", MACHINE_PATCH,              [404,   404,   403,  403,   403]),
        delete("/v1/machines/{fresh_machine}",                              [202,   202,   403,  403,   403]),
        delete("/v1/machines/{machine}",                                    [409,   409,   403,  403,   403]),
        delete("/v1/machines/{missing_machine}",                            [404,   404,   403,  403,   403]),
        post("/v1/machines/{fresh_machine}/maintenance", Some(REASON),      [202,   202,   403,  403,   403]),
        post("/v1/machines/{maint_machine}/maintenance", Some(REASON),      [409,   409,   403,  403,   403]),
        post("/v1/machines/{missing_machine}/maintenance", Some(REASON),    [404,   404,   403,  403,   403]),
        delete("/v1/machines/{fresh_maint_machine}/maintenance",            [202,   202,   403,  403,   403]),
        delete("/v1/machines/{machine}/maintenance",                        [409,   409,   403,  403,   403]),
        delete("/v1/machines/{missing_machine}/maintenance",                [404,   404,   403,  403,   403]),
        post("/v1/machines/{fresh_held_machine}/force-release", Some(REASON), [202, 202,   403,  403,   403]),
        post("/v1/machines/{maint_machine}/force-release", Some(REASON),    [409,   409,   403,  403,   403]),
        post("/v1/machines/{missing_machine}/force-release", Some(REASON),  [404,   404,   403,  403,   403]),
        get("/v1/machines/{machine}/custody",                               [200,   200,   403,  403,   403]),
        get("/v1/machines/{missing_machine}/custody",                       [404,   404,   403,  403,   403]),
        // Ledger checkpoints: provider roles; a checkpoint we did not sign is 422.
        get("/v1/custody/checkpoint",                                       [200,   200,   403,  403,   403]),
        post("/v1/custody/verify", Some(UNSIGNED_CHECKPOINT),               [422,   422,   403,  403,   403]),
        // Operations: billing reads none; tenant tokens only their own tenant's.
        get("/v1/operations",                                               [200,   200,   403,  200,   200]),
        get("/v1/operations?tenant_id={foreign}",                           [200,   200,   403,  200,   200]),
        get("/v1/operations/{own_op}",                                      [200,   200,   403,  200,   200]),
        get("/v1/operations/{foreign_op}",                                  [200,   200,   403,  404,   404]),
        get("/v1/operations/{machine_op}",                                  [200,   200,   403,  404,   404]),
        get("/v1/operations/{missing_op}",                                  [404,   404,   403,  404,   404]),
        get("/v1/tenants/{own}/operations",                                 [200,   200,   403,  200,   200]),
        get("/v1/tenants/{foreign}/operations",                             [200,   200,   403,  404,   404]),
        get("/v1/tenants/{missing}/operations",                             [404,   404,   403,  404,   404]),
        get("/v1/tenants/{own}/operations/{own_op}",                        [200,   200,   403,  200,   200]),
        get("/v1/tenants/{foreign}/operations/{foreign_op}",                [200,   200,   403,  404,   404]),
        get("/v1/tenants/{own}/operations/{foreign_op}",                    [404,   404,   403,  404,   404]),
        get("/v1/tenants/{missing}/operations/{missing_op}",                [404,   404,   403,  404,   404]),
        // Audit: providers all; tenant:admin its own tenant's; billing and tenant:member none.
        get("/v1/audit-events",                                             [200,   200,   403,  200,   403]),
        get("/v1/audit-events?tenant_id={foreign}",                         [200,   200,   403,  200,   403]),
        get("/v1/tenants/{own}/audit-events",                               [200,   200,   403,  200,   403]),
        get("/v1/tenants/{foreign}/audit-events",                           [200,   200,   403,  404,   403]),
        get("/v1/tenants/{missing}/audit-events",                           [404,   404,   403,  404,   403]),
        // Clusters: provider:admin and tenant:admin write, tenant:member and the operator read.
        post("/v1/tenants/{own}/clusters", Some(CLUSTER_CREATE),            [202,   403,   403,  202,   403]),
        post("/v1/tenants/{foreign}/clusters", Some(CLUSTER_CREATE),        [202,   403,   403,  404,   403]),
        post("/v1/tenants/{missing}/clusters", Some(CLUSTER_CREATE),        [404,   403,   403,  404,   403]),
        get("/v1/tenants/{own}/clusters",                                   [200,   200,   403,  200,   200]),
        get("/v1/tenants/{foreign}/clusters",                               [200,   200,   403,  404,   404]),
        get("/v1/tenants/{missing}/clusters",                               [404,   404,   403,  404,   404]),
        get("/v1/tenants/{own}/clusters/{own_cluster}",                     [200,   200,   403,  200,   200]),
        get("/v1/tenants/{foreign}/clusters/{foreign_cluster}",             [200,   200,   403,  404,   404]),
        get("/v1/tenants/{own}/clusters/{foreign_cluster}",                 [404,   404,   403,  404,   404]),
        get("/v1/tenants/{own}/clusters/{missing}",                         [404,   404,   403,  404,   404]),
        patch("/v1/tenants/{own}/clusters/{own_cluster}", CLUSTER_PATCH,    [202,   403,   403,  202,   403]),
        patch("/v1/tenants/{foreign}/clusters/{foreign_cluster}", CLUSTER_PATCH, [202, 403, 403,  404,   403]),
        patch("/v1/tenants/{own}/clusters/{missing}", CLUSTER_PATCH,        [404,   403,   403,  404,   403]),
        delete("/v1/tenants/{own}/clusters/{fresh_cluster}",                [202,   403,   403,  202,   403]),
        delete("/v1/tenants/{own}/clusters/{missing}",                      [404,   403,   403,  404,   403]),
        get("/v1/tenants/{own}/clusters/{own_cluster}/events",              [200,   200,   403,  200,   200]),
        get("/v1/tenants/{foreign}/clusters/{foreign_cluster}/events",      [200,   200,   403,  404,   404]),
        // The isolation report: whoever reads the tenant's clusters.
        get("/v1/tenants/{own}/isolation-report",                           [200,   200,   403,  200,   200]),
        get("/v1/tenants/{foreign}/isolation-report",                       [200,   200,   403,  404,   404]),
        get("/v1/tenants/{missing}/isolation-report",                       [404,   404,   403,  404,   404]),
        // The tenant's kubeconfig: admins only. 409: the test app has no cluster driver.
        get("/v1/tenants/{own}/clusters/{own_cluster}/kubeconfig",          [409,   403,   403,  409,   403]),
        get("/v1/tenants/{foreign}/clusters/{foreign_cluster}/kubeconfig",  [409,   403,   403,  404,   403]),
        get("/v1/tenants/{own}/clusters/{missing}/kubeconfig",              [404,   403,   403,  404,   403]),
        // Node pools.
        post("/v1/tenants/{own}/clusters/{own_cluster}/node-pools", Some(POOL_CREATE), [202, 403, 403, 202, 403]),
        post("/v1/tenants/{foreign}/clusters/{foreign_cluster}/node-pools", Some(POOL_CREATE), [202, 403, 403, 404, 403]),
        get("/v1/tenants/{own}/clusters/{own_cluster}/node-pools",          [200,   200,   403,  200,   200]),
        get("/v1/tenants/{foreign}/clusters/{foreign_cluster}/node-pools",  [200,   200,   403,  404,   404]),
        get("/v1/tenants/{own}/clusters/{own_cluster}/node-pools/{own_pool}", [200, 200,   403,  200,   200]),
        get("/v1/tenants/{foreign}/clusters/{foreign_cluster}/node-pools/{foreign_pool}", [200, 200, 403, 404, 404]),
        get("/v1/tenants/{own}/clusters/{own_cluster}/node-pools/{foreign_pool}", [404, 404, 403, 404, 404]),
        patch("/v1/tenants/{own}/clusters/{own_cluster}/node-pools/{own_pool}", POOL_PATCH, [202, 403, 403, 202, 403]),
        patch("/v1/tenants/{foreign}/clusters/{foreign_cluster}/node-pools/{foreign_pool}", POOL_PATCH, [202, 403, 403, 404, 403]),
        delete("/v1/tenants/{own}/clusters/{own_cluster}/node-pools/{fresh_pool}", [202, 403, 403, 202, 403]),
        delete("/v1/tenants/{own}/clusters/{own_cluster}/node-pools/{missing}", [404, 403, 403, 404, 403]),
        get("/v1/tenants/{own}/clusters/{own_cluster}/node-pools/{own_pool}/machines", [200, 200, 403, 200, 200]),
        get("/v1/tenants/{foreign}/clusters/{foreign_cluster}/node-pools/{foreign_pool}/machines", [200, 200, 403, 404, 404]),
        get("/v1/tenants/{own}/clusters/{own_cluster}/machines",            [200,   200,   403,  200,   200]),
        get("/v1/tenants/{foreign}/clusters/{foreign_cluster}/machines",    [200,   200,   403,  404,   404]),
        get("/v1/tenants/{own}/clusters/{missing}/machines",                [404,   404,   403,  404,   404]),
        get("/v1/tenants/{own}/clusters/{own_cluster}/machines/{missing_machine}", [404, 404, 403, 404, 404]),
        // A machine of the fleet the cluster does not hold is answered like a missing one.
        get("/v1/tenants/{own}/clusters/{own_cluster}/machines/{machine}",  [404,   404,   403,  404,   404]),
        get("/v1/tenants/{own}/clusters/{own_cluster}/machines/{machine}/health-reports", [404, 404, 403, 404, 404]),
        // Remediations: a tenant's admin replaces a machine its cluster holds (one it does not
        // hold is 404); the cluster's remediations are read like the cluster; provider roles
        // list them all.
        post("/v1/tenants/{own}/clusters/{own_cluster}/machines/{machine}/replace", Some(REASON), [404, 403, 403, 404, 403]),
        post("/v1/tenants/{foreign}/clusters/{foreign_cluster}/machines/{machine}/replace", Some(REASON), [404, 403, 403, 404, 403]),
        post("/v1/tenants/{own}/clusters/{own_cluster}/machines/{missing_machine}/replace", Some(REASON), [404, 403, 403, 404, 403]),
        post("/v1/tenants/{own}/clusters/{own_cluster}/machines/{machine}/power-cycle", None, [404, 403, 403, 404, 403]),
        post("/v1/tenants/{foreign}/clusters/{foreign_cluster}/machines/{machine}/power-cycle", None, [404, 403, 403, 404, 403]),
        get("/v1/tenants/{own}/clusters/{own_cluster}/remediations",         [200,   200,   403,  200,   200]),
        get("/v1/tenants/{foreign}/clusters/{foreign_cluster}/remediations", [200,   200,   403,  404,   404]),
        get("/v1/tenants/{own}/clusters/{missing}/remediations",             [404,   404,   403,  404,   404]),
        get("/v1/remediations",                                              [200,   200,   403,  403,   403]),
        // Health reports: operators write, provider roles read.
        post("/v1/machines/{machine}/health-reports", Some(HEALTH_REPORT),   [201,   201,   403,  403,   403]),
        post("/v1/machines/{missing_machine}/health-reports", Some(HEALTH_REPORT), [404, 404, 403, 403, 403]),
        get("/v1/machines/{machine}/health-reports",                        [200,   200,   403,  403,   403]),
        get("/v1/machines/{missing_machine}/health-reports",                [404,   404,   403,  403,   403]),
        // Usage: every role reads, tenant roles their own tenant only; provider:admin writes.
        // The signing key is public to every role; 400: closing needs an Idempotency-Key.
        get("/v1/usage/records?from=2026-10-01T00:00:00Z&to=2026-10-02T00:00:00Z", ALL),
        get("/v1/tenants/{own}/usage/records?from=2026-10-01T00:00:00Z&to=2026-10-02T00:00:00Z", ALL),
        get("/v1/tenants/{foreign}/usage/records?from=2026-10-01T00:00:00Z&to=2026-10-02T00:00:00Z", [200, 200, 200, 404, 404]),
        get("/v1/tenants/{missing}/usage/records?from=2026-10-01T00:00:00Z&to=2026-10-02T00:00:00Z", [404, 404, 404, 404, 404]),
        get("/v1/usage/aggregate?from=2026-10-01T00:00:00Z&to=2026-11-01T00:00:00Z&window=P1D", ALL),
        get("/v1/tenants/{own}/usage/aggregate?from=2026-10-01T00:00:00Z&to=2026-11-01T00:00:00Z", ALL),
        get("/v1/tenants/{foreign}/usage/aggregate?from=2026-10-01T00:00:00Z&to=2026-11-01T00:00:00Z", [200, 200, 200, 404, 404]),
        get("/v1/usage/export?from=2026-10-01T00:00:00Z&to=2026-10-02T00:00:00Z&format=csv", ALL),
        get("/v1/tenants/{own}/usage/export?from=2026-10-01T00:00:00Z&to=2026-10-02T00:00:00Z", ALL),
        get("/v1/tenants/{foreign}/usage/export?from=2026-10-01T00:00:00Z&to=2026-10-02T00:00:00Z", [200, 200, 200, 404, 404]),
        get("/v1/usage/periods/{closed_period}",                            ALL),
        post("/v1/usage/periods/{closed_period}/close", None,               [400,   403,   403,  403,   403]),
        get("/v1/usage/signing-key",                                        [200,   200,   200,  200,   200]),
        post("/v1/usage/adjustments", Some(ADJUSTMENT),                     [201,   403,   403,  403,   403]),
        // Webhooks: the provider's are provider:admin's; a tenant's, its tenant:admin's.
        post("/v1/webhooks", Some(WEBHOOK_CREATE),                          [201,   403,   403,  403,   403]),
        get("/v1/webhooks",                                                 [200,   403,   403,  403,   403]),
        get("/v1/webhooks/{missing}",                                       [404,   403,   403,  403,   403]),
        patch("/v1/webhooks/{missing}", WEBHOOK_PATCH,                      [404,   403,   403,  403,   403]),
        delete("/v1/webhooks/{missing}",                                    [404,   403,   403,  403,   403]),
        post("/v1/webhooks/{missing}/rotate-secret", None,                  [404,   403,   403,  403,   403]),
        get("/v1/webhooks/{missing}/deliveries",                            [404,   403,   403,  403,   403]),
        post("/v1/webhooks/{missing}/deliveries/{missing}/redeliver", None, [404,   403,   403,  403,   403]),
        post("/v1/tenants/{own}/webhooks", Some(WEBHOOK_CREATE),            [201,   403,   403,  201,   403]),
        post("/v1/tenants/{foreign}/webhooks", Some(WEBHOOK_CREATE),        [201,   403,   403,  404,   403]),
        get("/v1/tenants/{own}/webhooks",                                   [200,   403,   403,  200,   403]),
        get("/v1/tenants/{foreign}/webhooks",                               [200,   403,   403,  404,   403]),
        get("/v1/tenants/{own}/webhooks/{missing}",                         [404,   403,   403,  404,   403]),
        patch("/v1/tenants/{own}/webhooks/{missing}", WEBHOOK_PATCH,        [404,   403,   403,  404,   403]),
        delete("/v1/tenants/{own}/webhooks/{missing}",                      [404,   403,   403,  404,   403]),
        post("/v1/tenants/{own}/webhooks/{missing}/rotate-secret", None,    [404,   403,   403,  404,   403]),
        get("/v1/tenants/{own}/webhooks/{missing}/deliveries",              [404,   403,   403,  404,   403]),
        post("/v1/tenants/{own}/webhooks/{missing}/deliveries/{missing}/redeliver", None, [404, 403, 403, 404, 403]),
        // SCIM tokens: the tenant's admin's (SCIM itself is tests/api/scim.rs's: it answers in its own terms).
        post("/v1/tenants/{own}/scim-tokens", Some(SCIM_TOKEN_CREATE),      [201,   403,   403,  201,   403]),
        post("/v1/tenants/{foreign}/scim-tokens", Some(SCIM_TOKEN_CREATE),  [201,   403,   403,  404,   403]),
        get("/v1/tenants/{own}/scim-tokens",                                [200,   403,   403,  200,   403]),
        get("/v1/tenants/{foreign}/scim-tokens",                            [200,   403,   403,  404,   403]),
        delete("/v1/tenants/{own}/scim-tokens/{missing}",                   [404,   403,   403,  404,   403]),
        delete("/v1/tenants/{foreign}/scim-tokens/{missing}",               [404,   403,   403,  404,   403]),
        // Last, as they concern the tenants every row above uses: they still hold clusters.
        delete("/v1/tenants/{foreign}",                                     [409,   403,   403,  403,   403]),
        delete("/v1/tenants/{own}",                                         [409,   403,   403,  403,   403]),
    ]
}

/// The objects the matrix runs against.
struct World {
    own: String,
    foreign: String,
    own_op: String,
    foreign_op: String,
    missing: String,
    missing_op: String,
    /// Fixed placeholders and their values.
    vars: Vec<(&'static str, String)>,
}

/// A pending operation of `tenant` (tenant-side operations come with clusters; until then they
/// are written the way the service writes them).
async fn tenant_operation(app: &TestApp, tenant: &str) -> String {
    let op = Uuid::now_v7();
    sqlx::query(
        "insert into operations (id, kind, target_type, target_id, tenant_id, target_generation) \
         values ($1, 'cluster_create', 'cluster', $2, $3::uuid, 1)",
    )
    .bind(op)
    .bind(Uuid::now_v7())
    .bind(tenant)
    .execute(&app.db.pool)
    .await
    .expect("inserting a tenant operation");
    op.to_string()
}

/// Creates a kubernetes cluster with one pool in `tenant`; returns the cluster and pool ids.
async fn cluster_in(app: &TestApp, tenant: &str, name: &str) -> (String, String) {
    let body = json!({
        "name": name, "kind": "kubernetes", "isolation": "private-nodes",
        "node_pools": [{ "name": "gpu", "machine_class": CLASS, "count": 1 }]
    });
    let resp =
        app.post(format!("/v1/tenants/{tenant}/clusters")).token(&admin()).json(&body).send().await.expect(202).json();
    let cluster = &resp["cluster"];
    (id(cluster), id(&cluster["node_pools"][0]))
}

/// Enrolls a machine in `state`; returns its id.
async fn machine_in(app: &TestApp, name: &str, state: &str) -> String {
    let machine = id(&common::machine(app, name, CLASS).await);
    common::set_machine_state(app, &machine, state).await;
    machine
}

impl World {
    async fn new(app: &TestApp) -> World {
        let own = id(&common::tenant(app, OWN_NAME).await);
        let foreign = id(&common::tenant(app, FOREIGN_NAME).await);
        common::machine_class(app, CLASS, 8).await;
        let enrolled = app
            .post("/v1/machines")
            .token(&admin())
            .json(&common::enroll_body("node-enrolling", CLASS))
            .send()
            .await
            .expect(202)
            .json();
        let maint_machine = machine_in(app, "node-maintenance", "maintenance").await;
        let own_op = tenant_operation(app, &own).await;
        let foreign_op = tenant_operation(app, &foreign).await;
        let missing = Uuid::now_v7().to_string();
        let missing_op = Uuid::now_v7().to_string();
        let (own_cluster, own_pool) = cluster_in(app, &own, "own").await;
        let (foreign_cluster, foreign_pool) = cluster_in(app, &foreign, "foreign").await;
        let vars = vec![
            ("{own}", own.clone()),
            ("{foreign}", foreign.clone()),
            ("{missing}", missing.clone()),
            ("{class}", CLASS.to_owned()),
            ("{missing_class}", "no-such-class".to_owned()),
            ("{machine}", id(&enrolled["machine"])),
            ("{maint_machine}", maint_machine),
            ("{missing_machine}", Uuid::now_v7().to_string()),
            ("{own_op}", own_op.clone()),
            ("{foreign_op}", foreign_op.clone()),
            ("{machine_op}", id(&enrolled["operation"])),
            ("{missing_op}", missing_op.clone()),
            ("{own_cluster}", own_cluster),
            ("{own_pool}", own_pool),
            ("{foreign_cluster}", foreign_cluster),
            ("{foreign_pool}", foreign_pool),
            ("{closed_period}", "2026-10".to_owned()),
        ];
        World { own, foreign, own_op, foreign_op, missing, missing_op, vars }
    }

    /// The token of `role`; tenant roles belong to the own tenant.
    fn token(&self, role: &str) -> String {
        let tenant = role.starts_with("tenant:").then(|| self.own.parse::<Uuid>().expect("tenant id"));
        token(&[role], tenant)
    }

    /// Fills the fixed placeholders and `{n}`.
    fn fill(&self, template: &str, n: usize) -> String {
        let mut s = template.replace("{n}", &n.to_string());
        for (name, value) in &self.vars {
            s = s.replace(name, value);
        }
        s
    }

    /// Fills `template`, first making the fresh objects it names (as provider:admin).
    async fn concrete(&self, app: &TestApp, template: &str, n: usize) -> String {
        let mut s = template.to_owned();
        if s.contains("{fresh_tenant}") {
            let tenant = id(&common::tenant(app, &format!("fresh-{n}")).await);
            s = s.replace("{fresh_tenant}", &tenant);
        }
        if s.contains("{fresh_class}") {
            let class = format!("fresh-{n}");
            common::machine_class(app, &class, 0).await;
            s = s.replace("{fresh_class}", &class);
        }
        if s.contains("{fresh_machine}") {
            let machine = machine_in(app, &format!("fresh-{n}"), "available").await;
            s = s.replace("{fresh_machine}", &machine);
        }
        if s.contains("{fresh_cluster}") {
            let (cluster, _) = cluster_in(app, &self.own, &format!("fresh-{n}")).await;
            s = s.replace("{fresh_cluster}", &cluster);
        }
        if s.contains("{fresh_pool}") {
            let cluster = self.fill("{own_cluster}", n);
            let pool = app
                .post(format!("/v1/tenants/{}/clusters/{cluster}/node-pools", self.own))
                .token(&admin())
                .json(&json!({ "name": format!("fresh-{n}"), "machine_class": CLASS, "count": 1 }))
                .send()
                .await
                .expect(202)
                .json();
            s = s.replace("{fresh_pool}", &id(&pool["node_pool"]));
        }
        if s.contains("{fresh_held_machine}") {
            let machine = machine_in(app, &format!("fresh-held-{n}"), "active").await;
            s = s.replace("{fresh_held_machine}", &machine);
        }
        if s.contains("{fresh_maint_machine}") {
            let machine = machine_in(app, &format!("fresh-maint-{n}"), "maintenance").await;
            s = s.replace("{fresh_maint_machine}", &machine);
        }
        let s = self.fill(&s, n);
        assert!(!s.contains('{'), "unresolved placeholder in {s}");
        s
    }
}

/// Sends `method path` with an optional JSON body and token.
async fn send(app: &TestApp, method: Method, path: &str, body: Option<&str>, token: Option<&str>) -> Resp {
    let mut req = app.req(method, path);
    if let Some(token) = token {
        req = req.token(token);
    }
    if let Some(body) = body {
        let value: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("test body is not JSON ({e}): {body}"));
        req = req.json(&value);
    }
    req.send().await
}

/// The Problem code a refusal with this status must carry; `None` where it depends on the case.
fn expected_code(status: u16) -> Option<&'static str> {
    match status {
        401 => Some("missing_token"),
        403 => Some("forbidden"),
        404 => Some("not_found"),
        _ => None,
    }
}

/// Checks status, media type and, for refusals, the Problem; returns the Problem code.
fn check(resp: &Resp, expected: u16) -> Result<Option<String>, String> {
    let status = resp.status.as_u16();
    let body = String::from_utf8_lossy(&resp.body);
    if status != expected {
        return Err(format!("expected {expected}, got {status}: {body}"));
    }
    let content_type = resp.header("content-type");
    if status == 204 {
        return if resp.body.is_empty() { Ok(None) } else { Err(format!("204 with a body: {body}")) };
    }
    if status < 300 {
        // JSON, or one of the usage exports' streamed formats.
        let formats = [Some("application/json"), Some("text/csv; charset=utf-8"), Some("application/x-ndjson")];
        return if formats.contains(&content_type) {
            Ok(None)
        } else {
            Err(format!("content type {content_type:?} on a {status}"))
        };
    }
    if content_type != Some("application/problem+json") {
        return Err(format!("content type {content_type:?} on a {status}: {body}"));
    }
    let problem: Value =
        serde_json::from_slice(&resp.body).map_err(|e| format!("problem is not JSON ({e}): {body}"))?;
    let code = problem["code"].as_str().ok_or_else(|| format!("problem without a code: {body}"))?;
    if let Some(want) = expected_code(status) {
        if code != want {
            return Err(format!("expected code {want}, got {code}: {body}"));
        }
    }
    if problem["status"] != status {
        return Err(format!("problem status differs from {status}: {body}"));
    }
    if problem["request_id"].as_str().is_none() || problem["request_id"].as_str() != resp.header("x-request-id") {
        return Err(format!("problem request_id differs from the x-request-id header: {body}"));
    }
    Ok(Some(code.to_owned()))
}

/// A mutating call of the matrix, to be found in the audit trail.
struct Write {
    label: String,
    request_id: String,
    outcome: &'static str,
    code: Option<String>,
}

/// Every audit event with `outcome`, walked page by page as provider:admin.
async fn audit_events(app: &TestApp, outcome: &str) -> Vec<Value> {
    let mut events = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/audit-events?outcome={outcome}&limit=1000");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let page = app.get(path).token(&admin()).send().await.expect(200).json();
        events.extend(page["items"].as_array().expect("items").iter().cloned());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return events,
        }
    }
}

#[tokio::test]
async fn every_route_answers_every_role_as_the_matrix_says() {
    let app = TestApp::new().await;
    let w = World::new(&app).await;
    let mut failures = Vec::new();
    let mut writes = Vec::new();
    let mut cases = 0;
    for row in matrix() {
        for (col, role) in ROLES.into_iter().enumerate() {
            cases += 1;
            let path = w.concrete(&app, row.path, cases).await;
            let body = row.body.map(|b| w.fill(b, cases));
            let label = format!("{} {} as {role} ({path})", row.method, row.path);
            let resp = send(&app, row.method.clone(), &path, body.as_deref(), Some(&w.token(role))).await;
            let code = match check(&resp, row.expect[col]) {
                Ok(code) => code,
                Err(e) => {
                    failures.push(format!("{label}: {e}"));
                    continue;
                }
            };
            let status = resp.status.as_u16();
            // A tenant token's answers never mention the other tenant.
            if role.starts_with("tenant:") && status < 300 {
                let text = String::from_utf8_lossy(&resp.body);
                for secret in [w.foreign.as_str(), FOREIGN_NAME] {
                    if text.contains(secret) {
                        failures.push(format!("{label}: the body mentions the foreign tenant ({secret}): {text}"));
                    }
                }
            }
            if row.method != Method::GET {
                let request_id = resp.header("x-request-id").expect("x-request-id on every answer").to_owned();
                let outcome = if status < 300 { "success" } else { "failure" };
                writes.push(Write { label, request_id, outcome, code });
            }
        }
    }
    assert!(failures.is_empty(), "{} of {cases} matrix cases failed:\n{}", failures.len(), failures.join("\n"));

    // Every mutating call, refused or not, left exactly one audit event with its outcome.
    let mut events: HashMap<String, Vec<Value>> = HashMap::new();
    for outcome in ["success", "failure"] {
        for event in audit_events(&app, outcome).await {
            assert_eq!(event["outcome"], outcome, "the outcome filter: {event}");
            let request_id = event["request_id"].as_str().expect("request_id").to_owned();
            events.entry(request_id).or_default().push(event);
        }
    }
    let refused = writes.iter().filter(|w| w.outcome == "failure").count();
    assert!(refused > 100, "the matrix refuses many writes, got {refused}");
    for write in &writes {
        match events.get(&write.request_id).map(Vec::as_slice) {
            Some([event]) => {
                if event["outcome"] != write.outcome || event["code"].as_str() != write.code.as_deref() {
                    failures.push(format!(
                        "{}: audited as {} / {}, expected {} / {:?}",
                        write.label, event["outcome"], event["code"], write.outcome, write.code
                    ));
                }
            }
            Some(many) => failures.push(format!("{}: {} audit events: {many:?}", write.label, many.len())),
            None => failures
                .push(format!("{}: no audit event for request {} ({})", write.label, write.request_id, write.outcome)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} mutating calls are not audited right:\n{}",
        failures.len(),
        writes.len(),
        failures.join("\n")
    );
}

/// The route templates of the matrix, in OpenAPI spelling (`POST /v1/tenants/{tenant_id}/suspend`).
fn matrix_routes() -> BTreeSet<String> {
    let params = [
        ("{tenant_id}", &["{own}", "{foreign}", "{missing}", "{fresh_tenant}"][..]),
        ("{name}", &["{class}", "{missing_class}", "{fresh_class}"][..]),
        (
            "{machine_id}",
            &[
                "{machine}",
                "{maint_machine}",
                "{missing_machine}",
                "{fresh_machine}",
                "{fresh_maint_machine}",
                "{fresh_held_machine}",
            ][..],
        ),
        ("{operation_id}", &["{own_op}", "{foreign_op}", "{machine_op}", "{missing_op}"][..]),
        ("{cluster_id}", &["{own_cluster}", "{foreign_cluster}", "{fresh_cluster}"][..]),
        ("{pool_id}", &["{own_pool}", "{foreign_pool}", "{fresh_pool}"][..]),
        ("{period}", &["{closed_period}"][..]),
    ];
    matrix()
        .iter()
        .map(|row| {
            let mut path = row.path.split('?').next().unwrap_or_default().to_owned();
            // `{missing}` stands for a missing tenant, cluster or pool: its position names it.
            path = path
                .replace("deliveries/{missing}", "deliveries/{delivery_id}")
                .replace("webhooks/{missing}", "webhooks/{webhook_id}")
                .replace("scim-tokens/{missing}", "scim-tokens/{scim_token_id}")
                .replace("clusters/{missing}", "clusters/{cluster_id}")
                .replace("node-pools/{missing}", "node-pools/{pool_id}");
            for (param, placeholders) in params {
                for placeholder in placeholders {
                    path = path.replace(placeholder, param);
                }
            }
            format!("{} {path}", row.method)
        })
        .collect()
}

#[test]
fn the_matrix_covers_every_v1_route_of_the_openapi_document() {
    let doc: Value = serde_json::from_str(&paddock_api::openapi_json()).expect("openapi json");
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        // The agents' routes take their run's tokens (the seed token in the seed URL, the agent token
        // as the bearer) instead of a JWT: tests/api/agent.rs checks them.
        if !path.starts_with("/v1/") || path.starts_with("/v1/agent/") {
            continue;
        }
        for method in ["get", "post", "patch", "put", "delete"] {
            if item.get(method).is_some() {
                documented.insert(format!("{} {path}", method.to_uppercase()));
            }
        }
    }
    let covered = matrix_routes();
    let missing: Vec<_> = documented.difference(&covered).collect();
    assert!(missing.is_empty(), "routes without rows in the authz matrix: {missing:?}");
    let unknown: Vec<_> = covered.difference(&documented).collect();
    assert!(unknown.is_empty(), "matrix rows for routes the document does not have: {unknown:?}");
}

#[tokio::test]
async fn every_v1_route_without_a_token_is_401_missing_token() {
    let app = TestApp::new().await;
    let w = World::new(&app).await;
    let audited = app.count("audit_events").await;
    let mut failures = Vec::new();
    let mut cases = 0;
    for row in matrix() {
        cases += 1;
        // Nothing is made for a call that must be refused before anything is looked at.
        let template = row
            .path
            .replace("{fresh_tenant}", "{missing}")
            .replace("{fresh_class}", "{missing_class}")
            .replace("{fresh_machine}", "{missing_machine}")
            .replace("{fresh_maint_machine}", "{missing_machine}")
            .replace("{fresh_held_machine}", "{missing_machine}")
            .replace("{fresh_cluster}", "{missing}")
            .replace("{fresh_pool}", "{missing}");
        let path = w.fill(&template, cases);
        assert!(!path.contains('{'), "unresolved placeholder in {path}");
        let body = row.body.map(|b| w.fill(b, cases));
        let label = format!("{} {} ({path})", row.method, row.path);
        let resp = send(&app, row.method.clone(), &path, body.as_deref(), None).await;
        if let Err(e) = check(&resp, 401) {
            failures.push(format!("{label}: {e}"));
        } else if !resp.header("www-authenticate").is_some_and(|v| v.starts_with("Bearer")) {
            failures.push(format!("{label}: no `WWW-Authenticate: Bearer` header: {:?}", resp.headers));
        }
    }
    assert!(failures.is_empty(), "{} of {cases} routes failed:\n{}", failures.len(), failures.join("\n"));
    assert_eq!(app.count("audit_events").await, audited, "an unauthenticated call wrote to the audit trail");
}

/// A Problem without what differs between any two answers (`request_id`, `instance`).
fn comparable(resp: &Resp) -> Value {
    let mut problem = resp.json();
    let object = problem.as_object_mut().expect("a problem is an object");
    object.remove("request_id");
    object.remove("instance");
    problem
}

/// Header names of an answer, without the per-request id.
fn header_names(resp: &Resp) -> BTreeSet<String> {
    resp.headers.keys().map(|k| k.as_str().to_owned()).filter(|k| k != "x-request-id").collect()
}

#[tokio::test]
async fn another_tenants_objects_are_answered_exactly_like_missing_ones() {
    let app = TestApp::new().await;
    let w = World::new(&app).await;
    let (own, foreign, missing) = (&w.own, &w.foreign, &w.missing);
    let (own_op, foreign_op, missing_op) = (&w.own_op, &w.foreign_op, &w.missing_op);
    // (role, foreign path, missing path)
    let pairs = [
        ("tenant:admin", format!("/v1/tenants/{foreign}"), format!("/v1/tenants/{missing}")),
        ("tenant:member", format!("/v1/tenants/{foreign}"), format!("/v1/tenants/{missing}")),
        ("tenant:admin", format!("/v1/tenants/{foreign}/operations"), format!("/v1/tenants/{missing}/operations")),
        ("tenant:member", format!("/v1/tenants/{foreign}/operations"), format!("/v1/tenants/{missing}/operations")),
        (
            "tenant:admin",
            format!("/v1/tenants/{foreign}/operations/{foreign_op}"),
            format!("/v1/tenants/{missing}/operations/{missing_op}"),
        ),
        (
            "tenant:admin",
            format!("/v1/tenants/{own}/operations/{foreign_op}"),
            format!("/v1/tenants/{own}/operations/{missing_op}"),
        ),
        ("tenant:admin", format!("/v1/operations/{foreign_op}"), format!("/v1/operations/{missing_op}")),
        ("tenant:member", format!("/v1/operations/{foreign_op}"), format!("/v1/operations/{missing_op}")),
        ("tenant:admin", format!("/v1/tenants/{foreign}/audit-events"), format!("/v1/tenants/{missing}/audit-events")),
    ];
    for (role, foreign_path, missing_path) in &pairs {
        let token = w.token(role);
        let to_foreign = app.get(foreign_path.as_str()).token(&token).send().await;
        let to_missing = app.get(missing_path.as_str()).token(&token).send().await;
        let label = format!("{role}: GET {foreign_path} vs GET {missing_path}");
        check(&to_foreign, 404).unwrap_or_else(|e| panic!("{label}: foreign: {e}"));
        check(&to_missing, 404).unwrap_or_else(|e| panic!("{label}: missing: {e}"));
        assert_eq!(comparable(&to_foreign), comparable(&to_missing), "{label}: bodies differ");
        assert_eq!(header_names(&to_foreign), header_names(&to_missing), "{label}: headers differ");
        assert_eq!(to_foreign.json()["instance"], foreign_path.as_str(), "{label}: instance is the request path");
    }
    // The own tenant's objects are there for the same tokens: the 404s above are not blanket.
    for role in ["tenant:admin", "tenant:member"] {
        let token = w.token(role);
        app.get(format!("/v1/tenants/{own}")).token(&token).send().await.expect(200);
        app.get(format!("/v1/tenants/{own}/operations/{own_op}")).token(&token).send().await.expect(200);
    }
}

#[tokio::test]
async fn tenant_tokens_list_only_their_own_tenants_objects() {
    let app = TestApp::new().await;
    let w = World::new(&app).await;
    let (own, foreign) = (w.own.as_str(), w.foreign.as_str());
    // Providers see both tenants, so the checks below are not vacuous.
    let all = app.get("/v1/tenants").token(&admin()).send().await.expect(200).json();
    let ids: BTreeSet<&str> =
        all["items"].as_array().expect("items").iter().map(|t| t["id"].as_str().expect("id")).collect();
    assert!(ids.contains(own) && ids.contains(foreign), "provider list: {all}");
    let ops = app.get(format!("/v1/operations?tenant_id={foreign}")).token(&admin()).send().await.expect(200).json();
    let op_ids: Vec<&str> = ops["items"].as_array().expect("items").iter().filter_map(|o| o["id"].as_str()).collect();
    assert!(op_ids.contains(&w.foreign_op.as_str()), "provider filter by tenant: {ops}");
    assert!(
        ops["items"].as_array().expect("items").iter().all(|o| o["tenant_id"] == foreign),
        "provider filter by tenant: {ops}"
    );

    for role in ["tenant:admin", "tenant:member"] {
        let token = w.token(role);
        let tenants = app.get("/v1/tenants").token(&token).send().await.expect(200).json();
        assert_eq!(tenants["items"].as_array().map(Vec::len), Some(1), "{role}: GET /v1/tenants: {tenants}");
        assert_eq!(tenants["items"][0]["id"], own, "{role}: GET /v1/tenants: {tenants}");
        assert_eq!(tenants["items"][0]["name"], OWN_NAME);
        // The tenant_id filter cannot widen a tenant token's scope.
        for path in [
            "/v1/operations".to_owned(),
            format!("/v1/operations?tenant_id={foreign}"),
            format!("/v1/tenants/{own}/operations"),
        ] {
            let ops = app.get(path.as_str()).token(&token).send().await.expect(200).json();
            let items = ops["items"].as_array().expect("items");
            assert!(items.iter().any(|o| o["id"] == w.own_op.as_str()), "{role}: GET {path}: {ops}");
            for op in items {
                assert_eq!(op["tenant_id"], own, "{role}: GET {path}: only the own tenant's operations: {ops}");
            }
        }
    }
    let token = w.token("tenant:admin");
    for path in [
        "/v1/audit-events".to_owned(),
        format!("/v1/audit-events?tenant_id={foreign}"),
        format!("/v1/tenants/{own}/audit-events"),
    ] {
        let events = app.get(path.as_str()).token(&token).send().await.expect(200).json();
        let items = events["items"].as_array().expect("items");
        assert!(!items.is_empty(), "tenant:admin: GET {path}: the own tenant's creation is there: {events}");
        for event in items {
            assert_eq!(event["tenant_id"], own, "tenant:admin: GET {path}: {event}");
        }
    }
}

#[tokio::test]
async fn a_forbidden_role_gets_403_even_for_ids_that_do_not_exist() {
    let app = TestApp::new().await;
    let missing = Uuid::now_v7();
    let tenant_admin = token(&["tenant:admin"], Some(Uuid::now_v7()));
    let billing = token(&["billing:reader"], None);
    let operator = token(&["provider:operator"], None);
    let cases = [
        (&billing, Method::GET, format!("/v1/machines/{missing}"), None),
        (&billing, Method::GET, format!("/v1/operations/{missing}"), None),
        (&billing, Method::GET, format!("/v1/tenants/{missing}/audit-events"), None),
        (&operator, Method::DELETE, format!("/v1/tenants/{missing}"), None),
        (&operator, Method::PATCH, "/v1/machine-classes/no-such-class".to_owned(), Some(json!({ "description": "x" }))),
        (&tenant_admin, Method::POST, format!("/v1/tenants/{missing}/suspend"), None),
        (&tenant_admin, Method::DELETE, format!("/v1/machines/{missing}/maintenance"), None),
    ];
    for (token, method, path, body) in cases {
        let mut req = app.req(method.clone(), path.as_str()).token(token);
        if let Some(body) = &body {
            req = req.json(body);
        }
        let resp = req.send().await;
        check(&resp, 403).unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    }
}

/// A malformed id is answered like a missing object (a 404), but the order of checks puts 403
/// before any lookup: a role that may never call a route must get 403 whatever the id, and the
/// refused write must be audited like any other refused write.
#[tokio::test]
async fn a_forbidden_role_gets_an_audited_403_even_for_a_malformed_id() {
    let app = TestApp::new().await;
    let billing = token(&["billing:reader"], None);
    check(&app.get("/v1/machines/not-a-uuid").token(&billing).send().await, 403)
        .unwrap_or_else(|e| panic!("GET /v1/machines/not-a-uuid as billing:reader: {e}"));
    let member = token(&["tenant:member"], Some(Uuid::now_v7()));
    let resp = app.delete("/v1/machines/not-a-uuid").token(&member).send().await;
    check(&resp, 403).unwrap_or_else(|e| panic!("DELETE /v1/machines/not-a-uuid as tenant:member: {e}"));
    let request_id = resp.header("x-request-id").expect("request id").to_owned();
    let failures = audit_events(&app, "failure").await;
    assert!(
        failures.iter().any(|e| e["request_id"] == request_id.as_str()),
        "the refused DELETE is not in the audit trail: {failures:?}"
    );
}

#[tokio::test]
async fn a_token_without_a_known_role_is_forbidden_on_every_route() {
    let app = TestApp::new().await;
    let w = World::new(&app).await;
    let nobody = [token(&[], None), token(&["root", "provider:superuser"], None)];
    let mut failures = Vec::new();
    let mut cases = 0;
    for row in matrix() {
        for token in &nobody {
            cases += 1;
            let path = w.concrete(&app, row.path, cases).await;
            let body = row.body.map(|b| w.fill(b, cases));
            let resp = send(&app, row.method.clone(), &path, body.as_deref(), Some(token)).await;
            if let Err(e) = check(&resp, 403) {
                failures.push(format!("{} {} ({path}): {e}", row.method, row.path));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {cases} calls were not 403:\n{}", failures.len(), failures.join("\n"));
}

/// A refused call against another tenant is recorded under the *target* tenant, so that tenant's
/// admins read the subject (a user name, often an e-mail address) of another customer's user.
#[tokio::test]
async fn a_tenants_audit_trail_never_shows_another_tenants_users() {
    let app = TestApp::new().await;
    let w = World::new(&app).await;
    let alice = paddock_testkit::token_with(|claims| {
        claims.sub = "alice@acme-own.example".to_owned();
        claims.roles = vec!["tenant:admin".to_owned()];
        claims.tenant_id = Some(w.own.parse().expect("tenant id"));
    });
    for path in [format!("/v1/tenants/{}/suspend", w.foreign), format!("/v1/tenants/{}/resume", w.foreign)] {
        check(&app.post(path.as_str()).token(&alice).send().await, 403).unwrap_or_else(|e| panic!("POST {path}: {e}"));
    }
    let foreign_admin = token(&["tenant:admin"], Some(w.foreign.parse().expect("tenant id")));
    for path in ["/v1/audit-events".to_owned(), format!("/v1/tenants/{}/audit-events", w.foreign)] {
        let resp = app.get(path.as_str()).token(&foreign_admin).send().await.expect(200);
        let text = String::from_utf8_lossy(&resp.body);
        assert!(!text.contains("alice@acme-own.example"), "GET {path} as the other tenant's admin shows alice: {text}");
    }
}

/// Filed by role: a provider token that also carries a `tenant_id` claim (an identity provider may
/// stamp one on every token) acts for the provider, so its refused call on a tenant is filed under
/// the tenant it targeted, not under the claim's (whose admins would read it). And every event
/// keeps the id the server gave the request beside the client's `x-request-id`, which two callers
/// may share: the trail still tells their calls apart.
#[tokio::test]
async fn a_providers_refused_call_is_filed_under_its_target_with_the_servers_request_id() {
    let app = TestApp::new().await;
    let w = World::new(&app).await;
    let stamped = token(&["provider:admin"], Some(w.own.parse().expect("tenant id")));
    let shared = format!("shared-{}", Uuid::now_v7().simple());
    let path = format!("/v1/tenants/{}/clusters", w.foreign);
    for caller in [&stamped, &admin()] {
        let resp = app.post(path.as_str()).token(caller).header("x-request-id", &shared).json(&json!({})).send().await;
        assert!(resp.status.is_client_error(), "an empty cluster body is refused: {}", resp.status);
        assert_eq!(resp.header("x-request-id"), Some(shared.as_str()), "the client's id is echoed");
    }
    let events: Vec<Value> =
        audit_events(&app, "failure").await.into_iter().filter(|e| e["request_id"] == shared.as_str()).collect();
    assert_eq!(events.len(), 2, "both refusals are on the trail: {events:?}");
    for event in &events {
        assert_eq!(event["tenant_id"], w.foreign.as_str(), "filed under the targeted tenant: {event}");
    }
    let servers: Vec<Uuid> = events
        .iter()
        .map(|e| e["server_request_id"].as_str().and_then(|s| s.parse().ok()).expect("a server request id"))
        .collect();
    assert_ne!(servers[0], servers[1], "one shared client id, two server ids");

    // Without a client id, the server's is the request id too.
    let resp = app.post(path.as_str()).token(&admin()).json(&json!({})).send().await;
    let own_id = resp.header("x-request-id").expect("a generated request id").to_owned();
    let event = audit_events(&app, "failure").await.into_iter().find(|e| e["request_id"] == own_id.as_str());
    let event = event.expect("the refusal's event");
    assert_eq!(event["server_request_id"], own_id.as_str(), "the generated id is the server's");
    let stamped_own = app
        .get(format!("/v1/tenants/{}/audit-events", w.own))
        .token(&token(&["tenant:admin"], Some(w.own.parse().expect("id"))));
    let text = String::from_utf8_lossy(&stamped_own.send().await.expect(200).body).into_owned();
    assert!(!text.contains(&shared), "the claim's tenant sees nothing of the provider's calls: {text}");
}
