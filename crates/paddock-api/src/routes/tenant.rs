//! `/v1/tenants`.

use axum::extract::State;
use axum::response::Response;
use paddock_domain::cursor::PageRequest;
use paddock_domain::model::Tenant;
use paddock_types::page::PageParams;
use paddock_types::tenant::{TenantCreate, TenantUpdate, TenantView};
use paddock_types::TenantId;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{IfMatchHeader, JsonBody, Path, Query};
use crate::respond;
use crate::state::AppState;

/// Location of a tenant.
pub fn location(id: TenantId) -> String {
    format!("/v1/tenants/{id}")
}

/// Creates a tenant.
///
/// Creates a tenant with its quotas (`provider:admin`). The name is unique among tenants. Audited
/// (`tenant.create`).
#[utoipa::path(post, path = "/v1/tenants", operation_id = "tenant_create", tag = "tenants",
    request_body = TenantCreate,
    responses(
        (status = 201, description = "Created", body = TenantView,
            headers(("ETag" = String, description = "Generation etag"), ("Location" = String, description = "The tenant")))))]
pub async fn tenant_create(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let tenant = s.services.tenant_create(&ctx, &body).await?.view();
    Ok(respond::created(&tenant, &tenant.etag, &location(tenant.id)))
}

/// Lists tenants; a tenant token sees only its own.
///
/// Tenants ordered by creation, a page at a time (`limit`, `cursor`; the `Link` header names the next page).
/// Provider roles and `billing:reader` see every tenant, tenant roles only their own.
#[utoipa::path(get, path = "/v1/tenants", operation_id = "tenant_list", tag = "tenants",
    params(PageParams),
    responses(
        (status = 200, description = "A page of tenants", body = paddock_types::page::Page<TenantView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn tenant_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Query(q): Query<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::parse(q.limit.as_deref(), q.cursor.as_deref())?;
    let listed = s.services.tenant_list(&ctx, page).await?;
    Ok(respond::page(listed.items.into_iter().map(Tenant::view).collect(), listed.next_cursor))
}

/// Reads a tenant.
///
/// One tenant with its quotas and `quota_use` (the clusters, nodes and GPUs its clusters ask for against
/// those quotas). A tenant token may read only its own tenant; any other id is a 404.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}", operation_id = "tenant_view", tag = "tenants",
    params(("tenant_id" = TenantId, Path, description = "Tenant id")),
    responses(
        (status = 200, description = "The tenant", body = TenantView, headers(("ETag" = String, description = "Generation etag")))))]
pub async fn tenant_view(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<TenantId>,
) -> Result<Response, ApiError> {
    let tenant = s.services.tenant_get(&ctx, id).await?.view();
    Ok(respond::object(&tenant, &tenant.etag))
}

/// Changes a tenant (JSON merge patch).
///
/// Changes a tenant's display name, labels or quotas with a JSON merge patch (`provider:admin`). Lowering a
/// quota below what is in use is allowed: only new demand is refused. Send `If-Match` with the etag you read
/// to refuse a lost update (412).
#[utoipa::path(patch, path = "/v1/tenants/{tenant_id}", operation_id = "tenant_update", tag = "tenants",
    request_body(content((TenantUpdate = "application/merge-patch+json"), (TenantUpdate = "application/json"))),
    params(("tenant_id" = TenantId, Path, description = "Tenant id"),
        ("If-Match" = Option<String>, Header, description = "Etag the tenant must still have")),
    responses(
        (status = 200, description = "The changed tenant", body = TenantView, headers(("ETag" = String, description = "Generation etag")))))]
pub async fn tenant_update(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<TenantId>,
    IfMatchHeader(if_match): IfMatchHeader,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let tenant = s.services.tenant_update(&ctx, id, &body, &if_match).await?.view();
    Ok(respond::object(&tenant, &tenant.etag))
}

/// Deletes a tenant; 409 while it has clusters or machines.
///
/// Deletes a tenant that has no clusters left (`provider:admin`; 409 `tenant_not_empty` otherwise). Its usage
/// records and audit events are kept.
#[utoipa::path(delete, path = "/v1/tenants/{tenant_id}", operation_id = "tenant_delete", tag = "tenants",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"),
        ("If-Match" = Option<String>, Header, description = "Etag the tenant must still have")),
    responses(
        (status = 204, description = "Deleted")))]
pub async fn tenant_delete(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<TenantId>,
    IfMatchHeader(if_match): IfMatchHeader,
) -> Result<Response, ApiError> {
    s.services.tenant_delete(&ctx, id, &if_match).await?;
    Ok(respond::no_content())
}

/// Suspends a tenant: its own writes get 409, its clusters keep running.
///
/// Suspends a tenant (`provider:admin`): its own writes are refused with 409 `tenant_suspended` and no
/// kubeconfig is issued, while its clusters keep running. Suspending a suspended tenant answers it unchanged.
#[utoipa::path(post, path = "/v1/tenants/{tenant_id}/suspend", operation_id = "tenant_suspend", tag = "tenants",
    params(("tenant_id" = TenantId, Path, description = "Tenant id")),
    responses(
        (status = 200, description = "The tenant", body = TenantView, headers(("ETag" = String, description = "Generation etag")))))]
pub async fn tenant_suspend(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<TenantId>,
) -> Result<Response, ApiError> {
    let tenant = s.services.tenant_suspend(&ctx, id).await?.view();
    Ok(respond::object(&tenant, &tenant.etag))
}

/// Resumes a suspended tenant.
///
/// Resumes a suspended tenant (`provider:admin`); resuming an active tenant answers it unchanged.
#[utoipa::path(post, path = "/v1/tenants/{tenant_id}/resume", operation_id = "tenant_resume", tag = "tenants",
    params(("tenant_id" = TenantId, Path, description = "Tenant id")),
    responses(
        (status = 200, description = "The tenant", body = TenantView, headers(("ETag" = String, description = "Generation etag")))))]
pub async fn tenant_resume(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<TenantId>,
) -> Result<Response, ApiError> {
    let tenant = s.services.tenant_resume(&ctx, id).await?.view();
    Ok(respond::object(&tenant, &tenant.etag))
}
