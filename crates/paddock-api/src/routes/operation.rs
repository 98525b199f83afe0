//! `/v1/operations` and `/v1/tenants/{tenant_id}/operations`.

use axum::extract::State;
use axum::response::Response;
use paddock_domain::cursor::PageRequest;
use paddock_types::operation::OperationFilter;
use paddock_types::operation::{OperationState, OperationView};
use paddock_types::{OperationId, TenantId};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{Path, Query};
use crate::respond;
use crate::state::AppState;

/// Query of the operation lists.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OperationListQuery {
    /// Only operations on this object.
    pub target_id: Option<uuid::Uuid>,
    /// Only operations in this state.
    pub state: Option<OperationState>,
    /// Only this tenant's operations (provider list).
    pub tenant_id: Option<TenantId>,
    /// Page size (text until validated: out of range is 422, not an integer 400).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<String>,
    /// Opaque cursor from a previous page.
    #[param(max_length = 512)]
    pub cursor: Option<String>,
}

/// Query of a tenant's operation list: the tenant is the path's, so no `tenant_id` here.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TenantOperationListQuery {
    /// Only operations on this object.
    pub target_id: Option<uuid::Uuid>,
    /// Only operations in this state.
    pub state: Option<OperationState>,
    /// Page size (text until validated: out of range is 422, not an integer 400).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<String>,
    /// Opaque cursor from a previous page.
    #[param(max_length = 512)]
    pub cursor: Option<String>,
}

impl From<TenantOperationListQuery> for OperationListQuery {
    fn from(q: TenantOperationListQuery) -> Self {
        Self { target_id: q.target_id, state: q.state, tenant_id: None, limit: q.limit, cursor: q.cursor }
    }
}

impl OperationListQuery {
    fn split(self) -> Result<(OperationFilter, PageRequest), ApiError> {
        let page = PageRequest::parse(self.limit.as_deref(), self.cursor.as_deref())?;
        Ok((OperationFilter { tenant_id: self.tenant_id, target_id: self.target_id, state: self.state }, page))
    }
}

/// Lists operations (a tenant token sees its own).
///
/// Operations, oldest first, filtered by `target_id`, `state` or `tenant_id`; a tenant token sees only its
/// own tenant's.
#[utoipa::path(get, path = "/v1/operations", operation_id = "operation_list", tag = "operations",
    params(OperationListQuery),
    responses(
        (status = 200, description = "A page of operations", body = paddock_types::page::Page<OperationView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn operation_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Query(q): Query<OperationListQuery>,
) -> Result<Response, ApiError> {
    let (filter, page) = q.split()?;
    let listed = s.services.operation_list(&ctx, filter, page).await?;
    Ok(respond::page(listed.items, listed.next_cursor))
}

/// Reads an operation.
///
/// One operation: its state, its steps in the order they ran with their times, the current step, and the
/// problem of a failed one.
#[utoipa::path(get, path = "/v1/operations/{operation_id}", operation_id = "operation_view", tag = "operations",
    params(("operation_id" = OperationId, Path, description = "Operation id")),
    responses(
        (status = 200, description = "The operation", body = OperationView)))]
pub async fn operation_view(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<OperationId>,
) -> Result<Response, ApiError> {
    let op = s.services.operation_get(&ctx, id).await?;
    Ok(respond::ok(&op))
}

/// Lists a tenant's operations.
///
/// The tenant's operations, oldest first, filtered by `target_id` or `state`.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/operations", operation_id = "tenant_operation_list", tag = "operations",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), TenantOperationListQuery),
    responses(
        (status = 200, description = "A page of operations", body = paddock_types::page::Page<OperationView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn tenant_operation_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(tenant): Path<TenantId>,
    Query(q): Query<TenantOperationListQuery>,
) -> Result<Response, ApiError> {
    let (filter, page) = OperationListQuery::from(q).split()?;
    let listed = s.services.tenant_operation_list(&ctx, tenant, filter, page).await?;
    Ok(respond::page(listed.items, listed.next_cursor))
}

/// Reads one of a tenant's operations.
///
/// One of the tenant's operations (a foreign one is a 404).
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/operations/{operation_id}", operation_id = "tenant_operation_view", tag = "operations",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("operation_id" = OperationId, Path, description = "Operation id")),
    responses(
        (status = 200, description = "The operation", body = OperationView)))]
pub async fn tenant_operation_view(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, id)): Path<(TenantId, OperationId)>,
) -> Result<Response, ApiError> {
    let op = s.services.tenant_operation_get(&ctx, tenant, id).await?;
    Ok(respond::ok(&op))
}
