//! Remediations: a tenant's request to replace a machine its cluster holds, the cluster's
//! remediations, and the provider's list of them all.

use axum::extract::State;
use axum::response::Response;
use paddock_domain::cursor::PageRequest;
use paddock_types::operation::OperationView;
use paddock_types::page::PageParams;
use paddock_types::remediation::{RemediationAccepted, RemediationView, ReplaceRequest};
use paddock_types::{ClusterId, MachineId, TenantId};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{JsonBody, Path, Query};
use crate::respond;
use crate::state::AppState;

/// Replaces a machine the cluster holds with a spare of its class.
///
/// Starts the machine's remediation (`tenant:admin`): its Slurm node and Node are drained, a spare of the
/// same class joins the same pool (within the tenant's quotas, which the spare does not exceed), and once
/// the spare is active the machine leaves the cluster for the provider's maintenance. 202 with the
/// remediation and the operation to follow; 404 for a machine the cluster does not hold; 409 while the
/// machine is already being replaced or is leaving the cluster.
#[utoipa::path(post, path = "/v1/tenants/{tenant_id}/clusters/{cluster_id}/machines/{machine_id}/replace", operation_id = "cluster_machine_replace", tag = "clusters",
    request_body = ReplaceRequest,
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("cluster_id" = ClusterId, Path, description = "Cluster id"),
        ("machine_id" = MachineId, Path, description = "Machine id")),
    responses(
        (status = 202, description = "Accepted", body = RemediationAccepted)))]
pub async fn cluster_machine_replace(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, cluster, id)): Path<(TenantId, ClusterId, MachineId)>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let accepted = s.services.cluster_machine_replace(&ctx, tenant, cluster, id, &body).await?;
    Ok(respond::queued(&accepted))
}

/// Power-cycles a machine the cluster holds.
///
/// Powers an `active` machine the cluster holds off and on again through its BMC (`tenant:admin`); it stays
/// the cluster's, and boots from its disk. 202 with the operation to follow; 404 for a machine the cluster
/// does not hold; 409 for one that is not active.
#[utoipa::path(post, path = "/v1/tenants/{tenant_id}/clusters/{cluster_id}/machines/{machine_id}/power-cycle", operation_id = "cluster_machine_power_cycle", tag = "clusters",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("cluster_id" = ClusterId, Path, description = "Cluster id"),
        ("machine_id" = MachineId, Path, description = "Machine id")),
    responses(
        (status = 202, description = "Accepted", body = OperationView)))]
pub async fn cluster_machine_power_cycle(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, cluster, id)): Path<(TenantId, ClusterId, MachineId)>,
) -> Result<Response, ApiError> {
    let operation = s.services.cluster_machine_power_cycle(&ctx, tenant, cluster, id).await?;
    Ok(respond::queued(&operation))
}

/// Lists the cluster's remediations, newest first.
///
/// The replacements of the cluster's machines, newest first, a page at a time: machine, reason, source
/// (`operator`, `bmc`, `kubernetes` or `tenant`), state, spare, start and end.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/clusters/{cluster_id}/remediations", operation_id = "cluster_remediation_list", tag = "clusters",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("cluster_id" = ClusterId, Path, description = "Cluster id"), PageParams),
    responses(
        (status = 200, description = "A page of remediations", body = paddock_types::page::Page<RemediationView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn cluster_remediation_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, cluster)): Path<(TenantId, ClusterId)>,
    Query(q): Query<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::parse(q.limit.as_deref(), q.cursor.as_deref())?;
    let listed = s.services.cluster_remediations(&ctx, tenant, cluster, page).await?;
    Ok(respond::page(listed.items, listed.next_cursor))
}

/// Lists every remediation, newest first.
///
/// Every machine replacement of every tenant (`provider:admin`, `provider:operator`), newest first, a page
/// at a time.
#[utoipa::path(get, path = "/v1/remediations", operation_id = "remediation_list", tag = "machines",
    params(PageParams),
    responses(
        (status = 200, description = "A page of remediations", body = paddock_types::page::Page<RemediationView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn remediation_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Query(q): Query<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::parse(q.limit.as_deref(), q.cursor.as_deref())?;
    let listed = s.services.remediations(&ctx, page).await?;
    Ok(respond::page(listed.items, listed.next_cursor))
}
