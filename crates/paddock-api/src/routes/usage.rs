//! `/v1/usage/...` and `/v1/tenants/{tenant_id}/usage/...` (docs/billing.md).

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use paddock_service::usage::UsageParams;
use paddock_types::usage::{
    UsageAdjustmentCreate, UsageAdjustmentView, UsageAggregate, UsagePeriodClosed, UsagePeriodView, UsageRecordPage,
    UsageSigningKeys,
};
use paddock_types::{ClusterId, NodePoolId, TenantId};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{JsonBody, Path, Query};
use crate::respond;
use crate::state::AppState;

/// The header carrying an export's watermark (its body has no room for it).
pub const AS_OF_HEADER: &str = "x-usage-as-of";

/// Parameters of every usage read. Times are text until validated: anything but RFC 3339 UTC
/// whole seconds is a 422 naming the parameter.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// Range start, inclusive (RFC 3339 UTC, whole seconds). Required.
    #[param(value_type = String, format = DateTime, pattern = "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$", example = "2026-11-01T00:00:00Z")]
    pub from: Option<String>,
    /// Range end, exclusive; after `from`, at most 31 days later (records, export) or 400 (aggregate). Required.
    #[param(value_type = String, format = DateTime, pattern = "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$", example = "2026-12-01T00:00:00Z")]
    pub to: Option<String>,
    /// Read at this watermark (a previous answer's `as_of`); default: now's.
    #[param(value_type = Option<String>, format = DateTime, pattern = "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$")]
    pub as_of: Option<String>,
    /// Only this tenant's usage.
    pub tenant_id: Option<TenantId>,
    /// Only this cluster's.
    pub cluster_id: Option<ClusterId>,
    /// Only this node pool's.
    pub node_pool_id: Option<NodePoolId>,
    /// Only this machine class's.
    #[param(max_length = 63)]
    pub machine_class: Option<String>,
    /// Only records of this kind.
    #[param(value_type = Option<String>, pattern = "^(machine|control_plane|adjustment)$")]
    pub kind: Option<String>,
    /// Records: page size.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<String>,
    /// Records: opaque cursor from a previous page (it keeps the page's `as_of`).
    #[param(max_length = 512)]
    pub cursor: Option<String>,
    /// Aggregate: `PT1H`, `P1D`, `P1M` or `none`.
    #[param(value_type = Option<String>, pattern = "^(PT1H|P1D|P1M|none)$", default = "none")]
    pub window: Option<String>,
    /// Aggregate: comma-separated `tenant_id`, `cluster_id`, `node_pool_id`, `machine_class`.
    #[param(
        max_length = 100,
        pattern = "^(tenant_id|cluster_id|node_pool_id|machine_class)(,(tenant_id|cluster_id|node_pool_id|machine_class))*$"
    )]
    pub group_by: Option<String>,
    /// Export: `csv`, `ndjson`, or `focus` (FinOps FOCUS 1.2 CSV; 409 `price_missing` or without `PADDOCK_BILLING_PROVIDER_NAME`).
    #[param(value_type = Option<String>, pattern = "^(csv|ndjson|focus)$", default = "ndjson")]
    pub format: Option<String>,
}

impl UsageQuery {
    fn params(&self) -> UsageParams {
        UsageParams {
            from: self.from.clone(),
            to: self.to.clone(),
            as_of: self.as_of.clone(),
            tenant_id: self.tenant_id,
            cluster_id: self.cluster_id,
            node_pool_id: self.node_pool_id,
            machine_class: self.machine_class.clone(),
            kind: self.kind.clone(),
        }
    }
}

/// Usage records clipped to the range (every tenant the caller may read).
///
/// Usage records (machine-seconds of each tenancy, control-plane time, adjustments) clipped to `[from, to)`,
/// exact to the second, a page at a time. Every answer carries `as_of`, the watermark: repeat a read with
/// `as_of` to get the same rows.
#[utoipa::path(get, path = "/v1/usage/records", operation_id = "usage_record_list", tag = "usage",
    params(UsageQuery),
    responses(
        (status = 200, description = "A page of records ordered by (start, id)", body = UsageRecordPage,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn usage_record_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Query(q): Query<UsageQuery>,
) -> Result<Response, ApiError> {
    let page = s.services.usage_records(&ctx, None, &q.params(), q.limit.as_deref(), q.cursor.as_deref()).await?;
    Ok(respond::page_body(&page, page.next_cursor.as_deref()))
}

/// A tenant's usage records clipped to the range.
///
/// The tenant's usage records clipped to `[from, to)`, a page at a time.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/usage/records", operation_id = "tenant_usage_record_list",
    tag = "usage",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), UsageQuery),
    responses(
        (status = 200, description = "A page of records ordered by (start, id)", body = UsageRecordPage,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn tenant_usage_record_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(tenant): Path<TenantId>,
    Query(q): Query<UsageQuery>,
) -> Result<Response, ApiError> {
    let page =
        s.services.usage_records(&ctx, Some(tenant), &q.params(), q.limit.as_deref(), q.cursor.as_deref()).await?;
    Ok(respond::page_body(&page, page.next_cursor.as_deref()))
}

/// Usage summed per UTC window and group.
///
/// Usage summed per UTC `window` (`PT1H`, `P1D`, `P1M` or `none`) and per `group_by` (tenant, cluster, node
/// pool, machine class).
#[utoipa::path(get, path = "/v1/usage/aggregate", operation_id = "usage_aggregate_view", tag = "usage",
    params(UsageQuery),
    responses(
        (status = 200, description = "Windows × groups with totals", body = UsageAggregate)))]
pub async fn usage_aggregate_view(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Query(q): Query<UsageQuery>,
) -> Result<Response, ApiError> {
    let agg = s.services.usage_aggregate(&ctx, None, &q.params(), q.window.as_deref(), q.group_by.as_deref()).await?;
    Ok(respond::ok(&agg))
}

/// A tenant's usage summed per UTC window and group.
///
/// The tenant's usage summed per UTC window and group.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/usage/aggregate", operation_id = "tenant_usage_aggregate_view",
    tag = "usage",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), UsageQuery),
    responses(
        (status = 200, description = "Windows × groups with totals", body = UsageAggregate)))]
pub async fn tenant_usage_aggregate_view(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(tenant): Path<TenantId>,
    Query(q): Query<UsageQuery>,
) -> Result<Response, ApiError> {
    let params = q.params();
    let agg =
        s.services.usage_aggregate(&ctx, Some(tenant), &params, q.window.as_deref(), q.group_by.as_deref()).await?;
    Ok(respond::ok(&agg))
}

/// Every record of the range, streamed (CSV, or NDJSON with a summary line).
///
/// Every record of the range streamed in one answer: CSV, NDJSON ending with a summary line, or FinOps FOCUS
/// 1.2 CSV priced from the machine classes (409 `price_missing` naming the first unpriced class); a closed
/// period's FOCUS rows carry the prices its signed manifest pins. The `x-usage-as-of` header carries the
/// watermark. A caller runs at most `PADDOCK_USAGE_EXPORT_MAX_PER_CALLER` exports at once (429
/// `too_many_exports` with `Retry-After` beyond); an export the client stops reading for
/// `PADDOCK_USAGE_EXPORT_IDLE_TIMEOUT` seconds, or still running after `PADDOCK_USAGE_EXPORT_MAX_DURATION`,
/// is cut off: its body ends in an error, never as a complete export.
#[utoipa::path(get, path = "/v1/usage/export", operation_id = "usage_export", tag = "usage",
    params(UsageQuery),
    responses(
        (status = 200, description = "The records ordered by (start, id)", content((String = "text/csv"), (String = "application/x-ndjson")),
            headers(("x-usage-as-of" = String, description = "The watermark the export was read at")))))]
pub async fn usage_export(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Query(q): Query<UsageQuery>,
) -> Result<Response, ApiError> {
    let export = s.services.usage_export(&ctx, None, &q.params(), q.format.as_deref()).await?;
    Ok(stream(export))
}

/// A tenant's records of the range, streamed.
///
/// The tenant's records of the range, streamed (CSV, NDJSON or FOCUS).
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/usage/export", operation_id = "tenant_usage_export", tag = "usage",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), UsageQuery),
    responses(
        (status = 200, description = "The records ordered by (start, id)", content((String = "text/csv"), (String = "application/x-ndjson")),
            headers(("x-usage-as-of" = String, description = "The watermark the export was read at")))))]
pub async fn tenant_usage_export(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(tenant): Path<TenantId>,
    Query(q): Query<UsageQuery>,
) -> Result<Response, ApiError> {
    let export = s.services.usage_export(&ctx, Some(tenant), &q.params(), q.format.as_deref()).await?;
    Ok(stream(export))
}

fn stream(export: paddock_service::usage::Export) -> Response {
    let mut response = Response::new(Body::from_stream(export.body));
    let as_of = export.as_of.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(export.content_type));
    if let Ok(value) = HeaderValue::from_str(&as_of) {
        headers.insert(AS_OF_HEADER, value);
    }
    response
}

/// A billing period: open, or closed with its signed manifest.
///
/// A billing month: `open`, or `closed` with its signed manifest (totals per tenant and class).
#[utoipa::path(get, path = "/v1/usage/periods/{period}", operation_id = "usage_period_view", tag = "usage",
    params(("period" = String, Path, description = "UTC month, YYYY-MM (from 2000)", pattern = "^[2-9][0-9]{3}-(0[1-9]|1[0-2])$")),
    responses(
        (status = 200, description = "The period", body = UsagePeriodView)))]
pub async fn usage_period_view(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(period): Path<String>,
) -> Result<Response, ApiError> {
    Ok(respond::ok(&s.services.usage_period_view(&ctx, &period).await?))
}

/// Closes a billing period.
///
/// Signs the month's manifest (201) once the close grace has passed after its end (409
/// `period_not_closable` before); closing again answers the stored one (200).
/// `Idempotency-Key` is required here (400 `idempotency_key_required` without it).
#[utoipa::path(post, path = "/v1/usage/periods/{period}/close", operation_id = "usage_period_close", tag = "usage",
    params(("period" = String, Path, description = "UTC month, YYYY-MM (from 2000)", pattern = "^[2-9][0-9]{3}-(0[1-9]|1[0-2])$")),
    responses(
        (status = 201, description = "Closed now", body = UsagePeriodClosed),
        (status = 200, description = "Already closed: the stored manifest", body = UsagePeriodClosed)))]
pub async fn usage_period_close(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(period): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let keyed = headers.contains_key("idempotency-key");
    let (closed, new) = s.services.usage_period_close(&ctx, &period, keyed).await?;
    let mut response = respond::ok(&closed);
    if new {
        *response.status_mut() = StatusCode::CREATED;
    }
    Ok(response)
}

/// The public key(s) that verify closed periods' signatures.
///
/// The Ed25519 public keys that verify closed periods' and custody checkpoints' signatures (409
/// `signing_key_missing` when none is configured).
#[utoipa::path(get, path = "/v1/usage/signing-key", operation_id = "usage_signing_key_view", tag = "usage",
    responses(
        (status = 200, description = "The verification keys", body = UsageSigningKeys)))]
pub async fn usage_signing_key_view(State(s): State<AppState>, Caller(ctx): Caller) -> Result<Response, ApiError> {
    Ok(respond::ok(&s.services.usage_signing_keys(&ctx)?))
}

/// Records a correction in the open period (provider:admin; audited).
///
/// Records a correction (credit or debit of node-seconds) in the open period, with its reason
/// (`provider:admin`; audited).
#[utoipa::path(post, path = "/v1/usage/adjustments", operation_id = "usage_adjustment_create", tag = "usage",
    request_body = UsageAdjustmentCreate,
    responses(
        (status = 201, description = "Recorded", body = UsageAdjustmentView)))]
pub async fn usage_adjustment_create(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let view = s.services.usage_adjustment_create(&ctx, &body).await?;
    let mut response = respond::ok(&view);
    *response.status_mut() = StatusCode::CREATED;
    Ok(response)
}
