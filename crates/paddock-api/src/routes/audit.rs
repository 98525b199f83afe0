//! `/v1/audit-events` and `/v1/tenants/{tenant_id}/audit-events`.

use axum::extract::State;
use axum::response::Response;
use chrono::{DateTime, Utc};
use paddock_domain::cursor::PageRequest;
use paddock_types::audit::{AuditEventView, AuditFilter, AuditOutcome};
use paddock_types::TenantId;
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{Path, Query};
use crate::respond;
use crate::state::AppState;

/// Query of the audit lists.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditListQuery {
    /// Only events of this tenant (provider list).
    pub tenant_id: Option<TenantId>,
    /// Only this action, e.g. `tenant.create`.
    #[param(max_length = 100)]
    pub action: Option<String>,
    /// Only events about this object.
    pub target_id: Option<uuid::Uuid>,
    /// Only calls by this subject.
    #[param(max_length = 256)]
    pub actor: Option<String>,
    /// Only this outcome.
    pub outcome: Option<AuditOutcome>,
    /// Events at or after this time (RFC 3339).
    pub from: Option<DateTime<Utc>>,
    /// Events before this time (RFC 3339).
    pub to: Option<DateTime<Utc>>,
    /// Page size (text until validated: out of range is 422, not an integer 400).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<String>,
    /// Opaque cursor from a previous page.
    #[param(max_length = 512)]
    pub cursor: Option<String>,
}

impl AuditListQuery {
    fn split(self) -> Result<(AuditFilter, PageRequest), ApiError> {
        let page = PageRequest::parse(self.limit.as_deref(), self.cursor.as_deref())?;
        let filter = AuditFilter {
            tenant_id: self.tenant_id,
            action: self.action,
            target_id: self.target_id,
            actor: self.actor,
            outcome: self.outcome,
            from: self.from,
            to: self.to,
        };
        Ok((filter, page))
    }
}

/// Lists audit events (providers).
///
/// Audit events, oldest first, filtered by tenant, action, target, actor, outcome and time (`provider:admin`,
/// `provider:operator`; a tenant reads its own at `/v1/tenants/{tenant_id}/audit-events`).
#[utoipa::path(get, path = "/v1/audit-events", operation_id = "audit_event_list", tag = "audit",
    params(AuditListQuery),
    responses(
        (status = 200, description = "A page of events, oldest first", body = paddock_types::page::Page<AuditEventView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn audit_event_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Query(q): Query<AuditListQuery>,
) -> Result<Response, ApiError> {
    let (filter, page) = q.split()?;
    let listed = s.services.audit_list(&ctx, &filter, page).await?;
    Ok(respond::page(listed.items, listed.next_cursor))
}

/// Lists a tenant's audit events.
///
/// The tenant's audit events (`tenant:admin`), oldest first, with the same filters.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/audit-events", operation_id = "tenant_audit_event_list", tag = "audit",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), AuditListQuery),
    responses(
        (status = 200, description = "A page of events, oldest first", body = paddock_types::page::Page<AuditEventView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn tenant_audit_event_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(tenant): Path<TenantId>,
    Query(q): Query<AuditListQuery>,
) -> Result<Response, ApiError> {
    let (filter, page) = q.split()?;
    let listed = s.services.tenant_audit_list(&ctx, tenant, &filter, page).await?;
    Ok(respond::page(listed.items, listed.next_cursor))
}
