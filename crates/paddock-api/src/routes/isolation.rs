//! `/v1/tenants/{tenant_id}/isolation-report`.

use axum::extract::State;
use axum::response::Response;
use paddock_types::custody::IsolationReport;
use paddock_types::TenantId;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::Path;
use crate::respond;
use crate::state::AppState;

/// The tenant's isolation report.
///
/// Per live cluster, its namespace and API endpoint and every
/// machine it holds with the verified wipe that preceded the allocation and the machine's custody
/// ledger verification; whether any machine is shared; a digest of the whole.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/isolation-report", operation_id = "isolation_report_view",
    tag = "tenants",
    params(("tenant_id" = TenantId, Path, description = "Tenant id")),
    responses(
        (status = 200, description = "The report", body = IsolationReport)))]
pub async fn isolation_report_view(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(tenant_id): Path<TenantId>,
) -> Result<Response, ApiError> {
    Ok(respond::ok(&s.services.isolation_report(&ctx, tenant_id).await?))
}
