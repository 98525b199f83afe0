//! `/v1/agent/{token}/...`: machine-facing, no JWT; the one-time token of the run is the
//! credential. The token never reaches logs or metrics: metrics use the route template, and the
//! request context redacts it from the logged path and from `instance`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use paddock_types::agent::{AgentConfigView, AgentReport, BinaryFile};
use paddock_types::problem::Problem;

use crate::context;
use crate::error::ApiError;
use crate::extract::{JsonBody, Path};
use crate::respond;
use crate::state::AppState;

/// The run's configuration: what to wipe, or how to join.
#[utoipa::path(get, path = "/v1/agent/{token}/config", operation_id = "agent_config_view", tag = "agent",
    params(("token" = String, Path, description = "The run's one-time token")),
    responses(
        (status = 200, description = "The run's configuration", body = AgentConfigView),
        (status = "default", description = "Problem (404 unknown, 409 used, 410 expired)", body = Problem, content_type = "application/problem+json")),
    security(()))]
pub async fn agent_config_view(State(s): State<AppState>, Path(token): Path<String>) -> Result<Response, ApiError> {
    Ok(respond::ok(&s.services.agent_config(&token).await?))
}

/// The run's cloud-init NoCloud seed (ISO 9660, volume `cidata`).
#[utoipa::path(get, path = "/v1/agent/{token}/seed.iso", operation_id = "agent_seed_view", tag = "agent",
    params(("token" = String, Path, description = "The run's one-time token")),
    responses(
        (status = 200, description = "The seed image", content_type = "application/x-iso9660-image", body = BinaryFile),
        (status = "default", description = "Problem (404 unknown, 409 used, 410 expired)", body = Problem, content_type = "application/problem+json")),
    security(()))]
pub async fn agent_seed_view(State(s): State<AppState>, Path(token): Path<String>) -> Result<Response, ApiError> {
    let iso = s.services.agent_seed(&token).await?;
    let mut response = (StatusCode::OK, iso).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-iso9660-image"));
    Ok(response)
}

/// The run's report; it uses the token up.
#[utoipa::path(post, path = "/v1/agent/{token}/report", operation_id = "agent_report", tag = "agent",
    request_body = AgentReport,
    params(("token" = String, Path, description = "The run's one-time token")),
    responses(
        (status = 204, description = "Recorded"),
        (status = "default", description = "Problem (404 unknown, 409 used, 410 expired, 422 invalid)", body = Problem, content_type = "application/problem+json")),
    security(()))]
pub async fn agent_report(
    State(s): State<AppState>,
    Path(token): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    s.services.agent_report(&token, &body, &context::current().request_id).await?;
    Ok(respond::no_content())
}
