//! `/v1/tenants/{tenant_id}/clusters` and their node pools.

use axum::extract::State;
use axum::response::Response;
use chrono::SecondsFormat;
use paddock_domain::cursor::PageRequest;
use paddock_service::cluster::{ClusterChange, ClusterWithPools, NodePoolChange};
use paddock_types::cluster::{
    ClusterAccepted, ClusterCreate, ClusterEventView, ClusterUpdate, ClusterView, KubeconfigParams, NodePoolAccepted,
    NodePoolCreate, NodePoolUpdate, NodePoolView, PoolMachineView,
};
use paddock_types::page::PageParams;
use paddock_types::{ClusterId, MachineId, NodePoolId, TenantId};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{IfMatchHeader, JsonBody, Path, Query};
use crate::respond;
use crate::state::AppState;

fn cluster_location(tenant: TenantId, id: ClusterId) -> String {
    format!("/v1/tenants/{tenant}/clusters/{id}")
}

fn view(c: &ClusterWithPools) -> ClusterView {
    c.cluster.view(&c.pools)
}

fn cluster_accepted(change: ClusterChange) -> Response {
    let cluster = view(&change.cluster);
    let (etag, location) = (cluster.etag.clone(), cluster_location(cluster.tenant_id, cluster.id));
    respond::accepted(&ClusterAccepted { cluster, operation: change.operation }, &etag, &location)
}

fn pool_accepted(tenant: TenantId, change: NodePoolChange) -> Response {
    let node_pool = change.pool.view();
    let etag = node_pool.etag.clone();
    let location = format!("{}/node-pools/{}", cluster_location(tenant, node_pool.cluster_id), node_pool.id);
    respond::accepted(&NodePoolAccepted { node_pool, operation: change.operation }, &etag, &location)
}

/// Creates a cluster (with its node pools); the worker builds it.
///
/// Creates a Slurm cluster with its node pools (`tenant:admin` of the tenant, or `provider:admin`). The
/// answer is 202 with the cluster in `pending` and the `Operation-Id` header naming the operation that
/// follows it to `ready`. Refused before anything is written when the tenant's quotas (409 `quota_exceeded`)
/// or the fleet (409 `insufficient_capacity`, without saying its size) cannot hold it.
#[utoipa::path(post, path = "/v1/tenants/{tenant_id}/clusters", operation_id = "cluster_create", tag = "clusters",
    request_body = ClusterCreate,
    params(("tenant_id" = TenantId, Path, description = "Tenant id")),
    responses(
        (status = 202, description = "Accepted", body = ClusterAccepted,
            headers(("ETag" = String, description = "Generation etag"), ("Location" = String, description = "The cluster")))))]
pub async fn cluster_create(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(tenant): Path<TenantId>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    Ok(cluster_accepted(s.services.cluster_create(&ctx, tenant, &body).await?))
}

/// Lists a tenant's clusters.
///
/// The tenant's clusters not yet deleted, a page at a time.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/clusters", operation_id = "cluster_list", tag = "clusters",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), PageParams),
    responses(
        (status = 200, description = "A page of clusters", body = paddock_types::page::Page<ClusterView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn cluster_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(tenant): Path<TenantId>,
    Query(q): Query<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::parse(q.limit.as_deref(), q.cursor.as_deref())?;
    let listed = s.services.cluster_list(&ctx, tenant, page).await?;
    Ok(respond::page(listed.items.iter().map(view).collect(), listed.next_cursor))
}

/// Reads a cluster.
///
/// One cluster: its phase, node pools with their desired and ready counts, Slurm version and stack. Poll it
/// (or its operation) to follow a change.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/clusters/{cluster_id}", operation_id = "cluster_view", tag = "clusters",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("cluster_id" = ClusterId, Path, description = "Cluster id")),
    responses(
        (status = 200, description = "The cluster", body = ClusterView, headers(("ETag" = String, description = "Generation etag")))))]
pub async fn cluster_view(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, id)): Path<(TenantId, ClusterId)>,
) -> Result<Response, ApiError> {
    let cluster = view(&s.services.cluster_get(&ctx, tenant, id).await?);
    Ok(respond::object(&cluster, &cluster.etag))
}

/// Changes a cluster (JSON merge patch): Kubernetes version, Slurm settings.
///
/// Changes a cluster with a JSON merge patch (its Kubernetes version or its Slurm settings): 202
/// and the operation that carries the change out (`Operation-Id`). Pools are scaled through their own
/// resource.
#[utoipa::path(patch, path = "/v1/tenants/{tenant_id}/clusters/{cluster_id}", operation_id = "cluster_update", tag = "clusters",
    request_body(content((ClusterUpdate = "application/merge-patch+json"), (ClusterUpdate = "application/json"))),
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("cluster_id" = ClusterId, Path, description = "Cluster id"),
        ("If-Match" = Option<String>, Header, description = "Etag the cluster must still have")),
    responses(
        (status = 202, description = "Accepted", body = ClusterAccepted,
            headers(("ETag" = String, description = "Generation etag"), ("Location" = String, description = "The cluster")))))]
pub async fn cluster_update(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, id)): Path<(TenantId, ClusterId)>,
    IfMatchHeader(if_match): IfMatchHeader,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    Ok(cluster_accepted(s.services.cluster_update(&ctx, tenant, id, &body, &if_match).await?))
}

/// Deletes a cluster; it answers 404 once every machine was released and every object is gone.
///
/// Deletes a cluster: 202 and an operation that drains and releases its machines (each wiped before anyone
/// else may use it) and removes its control plane. The cluster answers 404 once every machine was released
/// and every object is gone.
#[utoipa::path(delete, path = "/v1/tenants/{tenant_id}/clusters/{cluster_id}", operation_id = "cluster_delete", tag = "clusters",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("cluster_id" = ClusterId, Path, description = "Cluster id"),
        ("If-Match" = Option<String>, Header, description = "Etag the cluster must still have")),
    responses(
        (status = 202, description = "Accepted", body = ClusterAccepted,
            headers(("ETag" = String, description = "Generation etag"), ("Location" = String, description = "The cluster")))))]
pub async fn cluster_delete(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, id)): Path<(TenantId, ClusterId)>,
    IfMatchHeader(if_match): IfMatchHeader,
) -> Result<Response, ApiError> {
    Ok(cluster_accepted(s.services.cluster_delete(&ctx, tenant, id, &if_match).await?))
}

/// The header of a kubeconfig answer naming when its token expires (RFC 3339, UTC).
pub const EXPIRES_AT: &str = "x-paddock-expires-at";

/// A kubeconfig file (`kind: Config`), served as YAML only: the file a client saves. Described as
/// the mapping its YAML parses to, so that a client that parses YAML answers checks what it gets;
/// there is no JSON form.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
pub struct Kubeconfig {
    /// `v1`.
    #[serde(rename = "apiVersion")]
    #[schema(example = "v1")]
    pub api_version: String,
    /// `Config`.
    #[schema(example = "Config")]
    pub kind: String,
    /// The tenant cluster's API server (`server`, `certificate-authority-data`).
    pub clusters: Vec<serde_json::Value>,
    /// The one context, of that cluster and user.
    pub contexts: Vec<serde_json::Value>,
    /// The user, with its token (valid until `x-paddock-expires-at`).
    pub users: Vec<serde_json::Value>,
    /// The context's name.
    #[serde(rename = "current-context")]
    pub current_context: String,
}

/// Issues the tenant's kubeconfig of a cluster.
///
/// The kubeconfig holds a token of a ServiceAccount bound to cluster-admin in the tenant
/// cluster, valid for `ttl` seconds (never paddock's admin credentials). The body is the kubeconfig itself (`curl -o kubeconfig ...` works); only
/// `tenant:admin` and `provider:admin` may ask, and every call is audited (`cluster.kubeconfig`).
/// 409 `cluster_not_ready` until the cluster's control plane is ready (and while it is deleted),
/// 409 `driver_not_configured` without a cluster driver, 409 `cluster_unreachable` when the
/// cluster's API server does not answer.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/clusters/{cluster_id}/kubeconfig", operation_id = "cluster_kubeconfig", tag = "clusters",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("cluster_id" = ClusterId, Path, description = "Cluster id"), KubeconfigParams),
    responses(
        (status = 200, description = "The kubeconfig (YAML)", body = Kubeconfig, content_type = "application/yaml",
            headers(("x-paddock-expires-at" = String, description = "When the token expires (RFC 3339, UTC)"),
                ("Cache-Control" = String, description = "`no-store`: the body is a credential")))))]
pub async fn cluster_kubeconfig(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, id)): Path<(TenantId, ClusterId)>,
    Query(q): Query<KubeconfigParams>,
) -> Result<Response, ApiError> {
    let issued = s.services.cluster_kubeconfig(&ctx, tenant, id, q.ttl.as_deref()).await?;
    let expires_at = issued.expires_at.to_rfc3339_opts(SecondsFormat::Secs, true);
    Ok(respond::kubeconfig(issued.kubeconfig.expose(), EXPIRES_AT, &expires_at))
}

/// Lists a cluster's events, oldest first.
///
/// What happened to the cluster, oldest first, a page at a time: phase changes, scale steps, waits for
/// machines, errors, in words a tenant may read (nothing about other tenants or the fleet).
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/clusters/{cluster_id}/events", operation_id = "cluster_event_list", tag = "clusters",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("cluster_id" = ClusterId, Path, description = "Cluster id"), PageParams),
    responses(
        (status = 200, description = "A page of events", body = paddock_types::page::Page<ClusterEventView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn cluster_event_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, id)): Path<(TenantId, ClusterId)>,
    Query(q): Query<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::parse(q.limit.as_deref(), q.cursor.as_deref())?;
    let listed = s.services.cluster_events(&ctx, tenant, id, page).await?;
    Ok(respond::page(listed.items, listed.next_cursor))
}

/// Adds a node pool.
///
/// Adds a node pool to a cluster: 202 and the operation that allocates, provisions and joins its machines.
/// The name is unique within the cluster.
#[utoipa::path(post, path = "/v1/tenants/{tenant_id}/clusters/{cluster_id}/node-pools", operation_id = "node_pool_create", tag = "clusters",
    request_body = NodePoolCreate,
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("cluster_id" = ClusterId, Path, description = "Cluster id")),
    responses(
        (status = 202, description = "Accepted", body = NodePoolAccepted,
            headers(("ETag" = String, description = "Generation etag"), ("Location" = String, description = "The node pool")))))]
pub async fn node_pool_create(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, cluster)): Path<(TenantId, ClusterId)>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    Ok(pool_accepted(tenant, s.services.node_pool_create(&ctx, tenant, cluster, &body).await?))
}

/// Lists a cluster's node pools (at most 32: one page).
///
/// The cluster's node pools in creation order: a cluster has at most 32, so this is one page.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/clusters/{cluster_id}/node-pools", operation_id = "node_pool_list", tag = "clusters",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("cluster_id" = ClusterId, Path, description = "Cluster id")),
    responses(
        (status = 200, description = "The node pools", body = paddock_types::page::Page<NodePoolView>)))]
pub async fn node_pool_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, cluster)): Path<(TenantId, ClusterId)>,
) -> Result<Response, ApiError> {
    let pools = s.services.node_pool_list(&ctx, tenant, cluster).await?;
    Ok(respond::page(pools.iter().map(|p| p.view()).collect(), None))
}

/// Reads a node pool.
///
/// One node pool: its machine class, desired and ready node counts, labels and Slurm partition.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/clusters/{cluster_id}/node-pools/{pool_id}", operation_id = "node_pool_view", tag = "clusters",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("cluster_id" = ClusterId, Path, description = "Cluster id"),
        ("pool_id" = NodePoolId, Path, description = "Node pool id")),
    responses(
        (status = 200, description = "The node pool", body = NodePoolView, headers(("ETag" = String, description = "Generation etag")))))]
pub async fn node_pool_view(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, cluster, id)): Path<(TenantId, ClusterId, NodePoolId)>,
) -> Result<Response, ApiError> {
    let pool = s.services.node_pool_get(&ctx, tenant, cluster, id).await?.view();
    Ok(respond::object(&pool, &pool.etag))
}

/// Scales a node pool or changes its labels and taints (JSON merge patch).
///
/// Changes a node pool with a JSON merge patch: a new `count` scales it, labels and taints are applied
/// to its nodes (202 and the operation). Scaling down drains the nodes first and releases their machines
/// through a wipe. Quotas and the fleet are checked as for a create.
#[utoipa::path(patch, path = "/v1/tenants/{tenant_id}/clusters/{cluster_id}/node-pools/{pool_id}", operation_id = "node_pool_update", tag = "clusters",
    request_body(content((NodePoolUpdate = "application/merge-patch+json"), (NodePoolUpdate = "application/json"))),
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("cluster_id" = ClusterId, Path, description = "Cluster id"),
        ("pool_id" = NodePoolId, Path, description = "Node pool id"),
        ("If-Match" = Option<String>, Header, description = "Etag the node pool must still have")),
    responses(
        (status = 202, description = "Accepted", body = NodePoolAccepted,
            headers(("ETag" = String, description = "Generation etag"), ("Location" = String, description = "The node pool")))))]
pub async fn node_pool_update(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, cluster, id)): Path<(TenantId, ClusterId, NodePoolId)>,
    IfMatchHeader(if_match): IfMatchHeader,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    Ok(pool_accepted(tenant, s.services.node_pool_update(&ctx, tenant, cluster, id, &body, &if_match).await?))
}

/// Deletes a node pool; its machines are released and cleaned.
///
/// Deletes a node pool: 202 and the operation that drains it and releases its machines.
#[utoipa::path(delete, path = "/v1/tenants/{tenant_id}/clusters/{cluster_id}/node-pools/{pool_id}", operation_id = "node_pool_delete", tag = "clusters",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("cluster_id" = ClusterId, Path, description = "Cluster id"),
        ("pool_id" = NodePoolId, Path, description = "Node pool id"),
        ("If-Match" = Option<String>, Header, description = "Etag the node pool must still have")),
    responses(
        (status = 202, description = "Accepted", body = NodePoolAccepted,
            headers(("ETag" = String, description = "Generation etag"), ("Location" = String, description = "The node pool")))))]
pub async fn node_pool_delete(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, cluster, id)): Path<(TenantId, ClusterId, NodePoolId)>,
    IfMatchHeader(if_match): IfMatchHeader,
) -> Result<Response, ApiError> {
    Ok(pool_accepted(tenant, s.services.node_pool_delete(&ctx, tenant, cluster, id, &if_match).await?))
}

/// Lists the machines of a node pool (never BMC details).
///
/// The machines that serve the pool (their node names and lifecycle states), a page at a time; never their
/// BMC details.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/clusters/{cluster_id}/node-pools/{pool_id}/machines", operation_id = "node_pool_machine_list", tag = "clusters",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("cluster_id" = ClusterId, Path, description = "Cluster id"),
        ("pool_id" = NodePoolId, Path, description = "Node pool id"), PageParams),
    responses(
        (status = 200, description = "A page of machines", body = paddock_types::page::Page<PoolMachineView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn node_pool_machine_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, cluster, id)): Path<(TenantId, ClusterId, NodePoolId)>,
    Query(q): Query<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::parse(q.limit.as_deref(), q.cursor.as_deref())?;
    let listed = s.services.node_pool_machines(&ctx, tenant, cluster, id, page).await?;
    Ok(respond::page(listed.items, listed.next_cursor))
}

/// Lists the machines a cluster holds, every pool's (never BMC details).
///
/// The machines that serve the cluster's pools, by id, a page at a time: the ids a tenant names its
/// machines by; their pools, node names and lifecycle states; never their BMC details and nothing
/// of other tenancies.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/clusters/{cluster_id}/machines", operation_id = "cluster_machine_list", tag = "clusters",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("cluster_id" = ClusterId, Path, description = "Cluster id"),
        PageParams),
    responses(
        (status = 200, description = "A page of machines", body = paddock_types::page::Page<PoolMachineView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn cluster_machine_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, cluster)): Path<(TenantId, ClusterId)>,
    Query(q): Query<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::parse(q.limit.as_deref(), q.cursor.as_deref())?;
    let listed = s.services.cluster_machines(&ctx, tenant, cluster, page).await?;
    Ok(respond::page(listed.items, listed.next_cursor))
}

/// Reads one machine the cluster holds (never BMC details).
///
/// A machine while it serves the cluster; 404 once released, and for any machine the cluster does not hold.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/clusters/{cluster_id}/machines/{machine_id}", operation_id = "cluster_machine_view", tag = "clusters",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("cluster_id" = ClusterId, Path, description = "Cluster id"),
        ("machine_id" = MachineId, Path, description = "Machine id")),
    responses(
        (status = 200, description = "The machine", body = PoolMachineView)))]
pub async fn cluster_machine_view(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, cluster, id)): Path<(TenantId, ClusterId, MachineId)>,
) -> Result<Response, ApiError> {
    Ok(respond::ok(&s.services.cluster_machine(&ctx, tenant, cluster, id).await?))
}

/// Lists the health reports of a machine the cluster holds, newest first.
///
/// The reports recorded while the cluster holds the machine (an operator's, without who made it), newest
/// first, a page at a time; 404 for a machine the cluster does not hold.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/clusters/{cluster_id}/machines/{machine_id}/health-reports", operation_id = "cluster_machine_health_report_list", tag = "clusters",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("cluster_id" = ClusterId, Path, description = "Cluster id"),
        ("machine_id" = MachineId, Path, description = "Machine id"), PageParams),
    responses(
        (status = 200, description = "A page of reports", body = paddock_types::page::Page<paddock_types::health::HealthReportView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn cluster_machine_health_report_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, cluster, id)): Path<(TenantId, ClusterId, MachineId)>,
    Query(q): Query<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::parse(q.limit.as_deref(), q.cursor.as_deref())?;
    let listed = s.services.cluster_machine_health_reports(&ctx, tenant, cluster, id, page).await?;
    Ok(respond::page(listed.items, listed.next_cursor))
}
