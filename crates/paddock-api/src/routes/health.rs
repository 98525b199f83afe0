//! Unauthenticated process endpoints: liveness, readiness, metrics, the OpenAPI document.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue};
use paddock_types::problem::Problem;

use crate::error::ApiError;
use crate::state::AppState;

/// Liveness: the process answers.
///
/// Whether the process runs (no dependency checked): for a liveness probe.
#[utoipa::path(get, path = "/healthz", operation_id = "health_live", tag = "health",
    responses((status = 200, description = "The process is alive", body = String, content_type = "text/plain")))]
pub async fn health_live() -> &'static str {
    "ok"
}

/// Readiness: the database is reachable and migrated, and the process is not draining.
///
/// Whether the process can serve: the database answers and it is not draining (503 otherwise): for a
/// readiness probe.
#[utoipa::path(get, path = "/readyz", operation_id = "health_ready", tag = "health",
    responses(
        (status = 200, description = "Ready", body = String, content_type = "text/plain"),
        (status = 503, description = "Not ready", body = Problem, content_type = "application/problem+json")))]
pub async fn health_ready(State(s): State<AppState>) -> Response {
    if !s.is_draining() && s.services.ready().await {
        "ready".into_response()
    } else {
        ApiError::Domain(paddock_domain::Error::Unavailable(None)).into_response()
    }
}

/// Prometheus metrics.
///
/// Prometheus metrics in the text format: requests, jobs, machines, clusters, queue depth, build info (see
/// the metrics table of docs/operating.md).
#[utoipa::path(get, path = "/metrics", operation_id = "metrics_view", tag = "health",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain; version=0.0.4")))]
pub async fn metrics_view(State(s): State<AppState>) -> Response {
    // With `PADDOCK_METRICS_LISTEN` they have a listener of their own, off the API's.
    if !s.metrics_here {
        return ApiError::RouteNotFound("/metrics".to_owned()).into_response();
    }
    s.exposition().response().await
}

/// The OpenAPI document of this API.
///
/// This OpenAPI 3.1 document, as generated from the code: the same bytes as `openapi/openapi.json`.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi_view", tag = "health",
    responses((status = 200, description = "OpenAPI 3.1 document", body = Object)))]
pub async fn openapi_view() -> Response {
    let mut response = crate::openapi_json().into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
