//! `/v1/tenants/{tenant_id}/scim-tokens`: the bearer tokens a tenant's identity provider pushes
//! its people with (SCIM 2.0 under `/v1/tenants/{tenant_id}/scim/v2/`, see `crate::scim`).

use axum::extract::State;
use axum::response::Response;
use paddock_domain::cursor::PageRequest;
use paddock_types::page::PageParams;
use paddock_types::scim::{ScimTokenCreate, ScimTokenView, ScimTokenWithSecret};
use paddock_types::{ScimTokenId, TenantId};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{JsonBody, Path, Query};
use crate::respond;
use crate::state::AppState;

/// Creates a SCIM token of a tenant.
///
/// A bearer token for the tenant's identity provider (tenant:admin of the tenant, or provider:admin),
/// shown this once (paddock keeps only its SHA-256): with it the provider creates, changes and removes the
/// tenant's users and groups under `/v1/tenants/{tenant_id}/scim/v2/` (SCIM 2.0). Refused while the tenant
/// is suspended.
#[utoipa::path(post, path = "/v1/tenants/{tenant_id}/scim-tokens", operation_id = "scim_token_create", tag = "identity",
    request_body = ScimTokenCreate,
    params(("tenant_id" = TenantId, Path, description = "Tenant id")),
    responses(
        (status = 201, description = "Created, with its token", body = ScimTokenWithSecret,
            headers(("Location" = String, description = "The tenant's SCIM tokens")))))]
pub async fn scim_token_create(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(tenant): Path<TenantId>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let created = s.services.scim_token_create(&ctx, tenant, &body).await?;
    Ok(respond::created_untagged(&created, &format!("/v1/tenants/{tenant}/scim-tokens")))
}

/// Lists a tenant's SCIM tokens.
///
/// The tenant's SCIM tokens, revoked ones included, a page at a time (tenant:admin of the tenant, or
/// provider:admin); never the tokens themselves.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/scim-tokens", operation_id = "scim_token_list", tag = "identity",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), PageParams),
    responses(
        (status = 200, description = "A page of SCIM tokens", body = paddock_types::page::Page<ScimTokenView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn scim_token_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(tenant): Path<TenantId>,
    Query(q): Query<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::parse(q.limit.as_deref(), q.cursor.as_deref())?;
    let listed = s.services.scim_token_list(&ctx, tenant, page).await?;
    Ok(respond::page(listed.items, listed.next_cursor))
}

/// Revokes a SCIM token.
///
/// From now on the token is refused (401) (tenant:admin of the tenant, or provider:admin); it stays
/// listed with its `revoked_at`. Allowed while the tenant is suspended.
#[utoipa::path(delete, path = "/v1/tenants/{tenant_id}/scim-tokens/{scim_token_id}", operation_id = "scim_token_revoke", tag = "identity",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("scim_token_id" = ScimTokenId, Path, description = "SCIM token id")),
    responses((status = 204, description = "Revoked")))]
pub async fn scim_token_revoke(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, id)): Path<(TenantId, ScimTokenId)>,
) -> Result<Response, ApiError> {
    s.services.scim_token_revoke(&ctx, tenant, id).await?;
    Ok(respond::no_content())
}
