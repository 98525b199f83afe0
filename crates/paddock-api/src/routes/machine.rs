//! `/v1/machines`.

use axum::extract::State;
use axum::response::Response;
use paddock_domain::cursor::PageRequest;
use paddock_service::MachineChange;
use paddock_types::custody::CustodyView;
use paddock_types::health::{HealthReportCreate, HealthReportView};
use paddock_types::machine::MachineFilter;
use paddock_types::machine::{
    MachineAccepted, MachineEnroll, MachineForceRelease, MachineState, MachineUpdate, MachineView, MaintenanceEnter,
};
use paddock_types::page::PageParams;
use paddock_types::{MachineId, TenantId};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{IfMatchHeader, JsonBody, Path, Query};
use crate::respond;
use crate::state::AppState;

/// Query of the machine list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MachineListQuery {
    /// Only machines in this state (default: every state but `retired`).
    pub state: Option<MachineState>,
    /// Only machines of this class.
    #[param(max_length = 63)]
    pub machine_class: Option<String>,
    /// Only machines held by this tenant.
    pub tenant_id: Option<TenantId>,
    /// Page size (text until validated: out of range is 422, not an integer 400).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<String>,
    /// Opaque cursor from a previous page.
    #[param(max_length = 512)]
    pub cursor: Option<String>,
}

fn location(id: MachineId) -> String {
    format!("/v1/machines/{id}")
}

/// 202 with the machine and its operation, or 200 with the machine for a synchronous change.
fn change(change: MachineChange) -> Response {
    let machine = change.machine.view();
    let location = location(machine.id);
    match change.operation {
        Some(operation) => {
            let etag = machine.etag.clone();
            respond::accepted(&MachineAccepted { machine, operation }, &etag, &location)
        }
        None => respond::object(&machine, &machine.etag),
    }
}

/// Enrolls a machine; the worker then inspects and cleans it.
///
/// Enrolls a bare-metal machine by its BMC (`provider:admin`, `provider:operator`): 202 and the operation
/// that inspects it through Redfish and wipes it; it becomes `available` only after a verified wipe. An
/// enroll stopped at the BMC (wrong credentials) fails its operation with `bmc_auth_failed`. The BMC password
/// is encrypted at rest and never answered.
#[utoipa::path(post, path = "/v1/machines", operation_id = "machine_enroll", tag = "machines",
    request_body = MachineEnroll,
    responses(
        (status = 202, description = "Accepted", body = MachineAccepted,
            headers(("ETag" = String, description = "Generation etag"), ("Location" = String, description = "The machine")))))]
pub async fn machine_enroll(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    Ok(change(s.services.machine_enroll(&ctx, &body).await?))
}

/// Lists machines.
///
/// The fleet, filtered by `state`, `machine_class` or `tenant_id`, a page at a time (provider roles only).
#[utoipa::path(get, path = "/v1/machines", operation_id = "machine_list", tag = "machines",
    params(MachineListQuery),
    responses(
        (status = 200, description = "A page of machines", body = paddock_types::page::Page<MachineView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn machine_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Query(q): Query<MachineListQuery>,
) -> Result<Response, ApiError> {
    let page = PageRequest::parse(q.limit.as_deref(), q.cursor.as_deref())?;
    let filter = MachineFilter { state: q.state, machine_class: q.machine_class, tenant_id: q.tenant_id };
    let listed = s.services.machine_list(&ctx, &filter, page).await?;
    Ok(respond::page(listed.items.iter().map(|m| m.view()).collect(), listed.next_cursor))
}

/// Reads a machine (never its BMC password).
///
/// One machine: its lifecycle state, last error, holder, inventory and BMC (never its password).
#[utoipa::path(get, path = "/v1/machines/{machine_id}", operation_id = "machine_view", tag = "machines",
    params(("machine_id" = MachineId, Path, description = "Machine id")),
    responses(
        (status = 200, description = "The machine", body = MachineView, headers(("ETag" = String, description = "Generation etag")))))]
pub async fn machine_view(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<MachineId>,
) -> Result<Response, ApiError> {
    let machine = s.services.machine_get(&ctx, id).await?.view();
    Ok(respond::object(&machine, &machine.etag))
}

/// Changes labels (200) or BMC access (202 with an operation).
///
/// Changes a machine with a JSON merge patch: its labels (200), or its BMC access (202 and the operation that
/// verifies the new address or credentials against the BMC).
#[utoipa::path(patch, path = "/v1/machines/{machine_id}", operation_id = "machine_update", tag = "machines",
    request_body(content((MachineUpdate = "application/merge-patch+json"), (MachineUpdate = "application/json"))),
    params(("machine_id" = MachineId, Path, description = "Machine id"),
        ("If-Match" = Option<String>, Header, description = "Etag the machine must still have")),
    responses(
        (status = 200, description = "Labels changed", body = MachineView, headers(("ETag" = String, description = "Generation etag"))),
        (status = 202, description = "BMC access change accepted", body = MachineAccepted,
            headers(("ETag" = String, description = "Generation etag"), ("Location" = String, description = "The machine")))))]
pub async fn machine_update(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<MachineId>,
    IfMatchHeader(if_match): IfMatchHeader,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    Ok(change(s.services.machine_update(&ctx, id, &body, &if_match).await?))
}

/// Retires a machine (only from available, maintenance or clean_failed).
///
/// Retires a machine for good (`provider:admin`, `provider:operator`): 202 and its operation. Only from
/// `available`, `maintenance` or `clean_failed`; a machine that serves a tenant is 409 `machine_busy`.
#[utoipa::path(delete, path = "/v1/machines/{machine_id}", operation_id = "machine_retire", tag = "machines",
    params(("machine_id" = MachineId, Path, description = "Machine id"),
        ("If-Match" = Option<String>, Header, description = "Etag the machine must still have")),
    responses(
        (status = 202, description = "Accepted", body = MachineAccepted,
            headers(("ETag" = String, description = "Generation etag"), ("Location" = String, description = "The machine")))))]
pub async fn machine_retire(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<MachineId>,
    IfMatchHeader(if_match): IfMatchHeader,
) -> Result<Response, ApiError> {
    Ok(change(s.services.machine_retire(&ctx, id, &if_match).await?))
}

/// Takes a machine out of service.
///
/// Takes a machine out of service with a reason: an available machine at once, a serving one after its
/// tenancy ends.
#[utoipa::path(post, path = "/v1/machines/{machine_id}/maintenance", operation_id = "machine_maintenance_enter", tag = "machines",
    request_body = MaintenanceEnter,
    params(("machine_id" = MachineId, Path, description = "Machine id")),
    responses(
        (status = 202, description = "Accepted", body = MachineAccepted,
            headers(("ETag" = String, description = "Generation etag"), ("Location" = String, description = "The machine")))))]
pub async fn machine_maintenance_enter(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<MachineId>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    Ok(change(s.services.machine_maintenance_enter(&ctx, id, &body).await?))
}

/// Returns a machine to service, through cleaning.
///
/// Ends maintenance: the machine is wiped again before it is `available`.
#[utoipa::path(delete, path = "/v1/machines/{machine_id}/maintenance", operation_id = "machine_maintenance_leave", tag = "machines",
    params(("machine_id" = MachineId, Path, description = "Machine id")),
    responses(
        (status = 202, description = "Accepted", body = MachineAccepted,
            headers(("ETag" = String, description = "Generation etag"), ("Location" = String, description = "The machine")))))]
pub async fn machine_maintenance_leave(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<MachineId>,
) -> Result<Response, ApiError> {
    Ok(change(s.services.machine_maintenance_leave(&ctx, id).await?))
}

/// Forces the release of a machine's tenancy at once.
///
/// For a machine that must leave a tenant that does not answer (`provider:admin`,
/// `provider:operator`): the worker records the release (billing stops), powers the machine off, deletes its Node best effort and sends it to cleaning.
#[utoipa::path(post, path = "/v1/machines/{machine_id}/force-release", operation_id = "machine_force_release", tag = "machines",
    request_body = MachineForceRelease,
    params(("machine_id" = MachineId, Path, description = "Machine id")),
    responses(
        (status = 202, description = "Accepted", body = MachineAccepted,
            headers(("ETag" = String, description = "Generation etag"), ("Location" = String, description = "The machine")))))]
pub async fn machine_force_release(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<MachineId>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    Ok(change(s.services.machine_force_release(&ctx, id, &body).await?))
}

/// Reads a machine's custody ledger, oldest first, with its HMAC chain recomputed.
///
/// The machine's custody ledger, oldest first: every state change, tenancy and wipe with its evidence, each
/// entry chained to the one before by an HMAC, recomputed here (`verified`).
#[utoipa::path(get, path = "/v1/machines/{machine_id}/custody", operation_id = "machine_custody_view", tag = "machines",
    params(("machine_id" = MachineId, Path, description = "Machine id")),
    responses(
        (status = 200, description = "The ledger and its verification", body = CustodyView)))]
pub async fn machine_custody_view(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<MachineId>,
) -> Result<Response, ApiError> {
    Ok(respond::ok(&s.services.machine_custody(&ctx, id).await?))
}

/// Records a health report on a machine.
///
/// What an operator (`provider:admin`, `provider:operator`) observed about a machine's health: its status as a
/// whole and the checks behind it. Recorded as said and never changed; a machine a tenant holds shows the
/// report to that tenant. A retired machine takes none (409 `machine_retired`).
#[utoipa::path(post, path = "/v1/machines/{machine_id}/health-reports", operation_id = "machine_health_report_create", tag = "machines",
    request_body = HealthReportCreate,
    params(("machine_id" = MachineId, Path, description = "Machine id")),
    responses(
        (status = 201, description = "Recorded", body = HealthReportView,
            headers(("Location" = String, description = "The machine's reports")))))]
pub async fn machine_health_report_create(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<MachineId>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let report = s.services.machine_health_report(&ctx, id, &body).await?;
    Ok(respond::created_untagged(&report, &format!("/v1/machines/{id}/health-reports")))
}

/// Lists a machine's health reports, newest first.
///
/// Every report recorded on the machine, newest first, a page at a time (provider roles).
#[utoipa::path(get, path = "/v1/machines/{machine_id}/health-reports", operation_id = "machine_health_report_list", tag = "machines",
    params(("machine_id" = MachineId, Path, description = "Machine id"), PageParams),
    responses(
        (status = 200, description = "A page of reports", body = paddock_types::page::Page<HealthReportView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn machine_health_report_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<MachineId>,
    Query(q): Query<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::parse(q.limit.as_deref(), q.cursor.as_deref())?;
    let listed = s.services.machine_health_reports(&ctx, id, page).await?;
    Ok(respond::page(listed.items, listed.next_cursor))
}
