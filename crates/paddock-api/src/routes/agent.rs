//! The machine-facing agent endpoints (docs/api.md, docs/security.md), no JWT:
//! - `GET /v1/agent/seed/{seed_token}.iso`: the run's seed, the only agent URL with a secret in
//!   it (a BMC fetching virtual media cannot send headers);
//! - `GET /v1/agent/config` and `POST /v1/agent/report` with `Authorization: Bearer <agent token>`,
//!   the token found in the seed.
//!
//! No token reaches logs or metrics: metrics use the route template, the request context redacts
//! the seed token from the logged path and from `instance`, and the authentication middleware
//! leaves these routes' bearer alone (it is no JWT).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::{header, HeaderValue, StatusCode};
use paddock_types::agent::{AgentConfigView, AgentReport, BinaryFile};

use crate::context;
use crate::error::ApiError;
use crate::extract::{JsonBody, Path};
use crate::respond;
use crate::state::AppState;

/// The agent token of a request: its `Authorization: Bearer` value.
#[derive(Debug)]
pub struct AgentToken(String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for AgentToken {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        match crate::auth::bearer(parts.headers.get(header::AUTHORIZATION)) {
            Some(Ok(token)) => Ok(AgentToken(token.to_owned())),
            Some(Err(())) => Err(ApiError::Unauthenticated {
                code: "invalid_token",
                message: "the Authorization header is not a Bearer token".to_owned(),
            }),
            None => Err(ApiError::Unauthenticated {
                code: "missing_token",
                message: "this request needs `Authorization: Bearer <agent token>`, the token of the run's seed"
                    .to_owned(),
            }),
        }
    }
}

/// The run's configuration: what to wipe, or how to join.
///
/// The machine agent's configuration for its run (what to wipe, or how to install and join), read with the
/// run's agent token. One run, one token: a used token is 409, an expired one 410.
#[utoipa::path(get, path = "/v1/agent/config", operation_id = "agent_config_view", tag = "agent",
    responses(
        (status = 200, description = "The run's configuration", body = AgentConfigView)),
    security(("agent_token" = [])))]
pub async fn agent_config_view(State(s): State<AppState>, token: AgentToken) -> Result<Response, ApiError> {
    Ok(respond::ok(&s.services.agent_config(&token.0).await?))
}

/// The run's seed image.
///
/// The ISO the BMC attaches as virtual media; the seed token in the URL is its only
/// credential. NoCloud `meta-data` and `user-data` plus `paddock/agent.json` (ISO 9660,
/// volume `cidata`, at least 1,474,560 bytes). Generated when fetched.
#[utoipa::path(get, path = "/v1/agent/seed/{seed_token}.iso", operation_id = "agent_seed_view", tag = "agent",
    params(("seed_token" = String, Path, description = "The run's seed token")),
    responses(
        (status = 200, description = "The seed image", content_type = "application/x-iso9660-image", body = BinaryFile)),
    security(()))]
pub async fn agent_seed_view(State(s): State<AppState>, Path(file): Path<String>) -> Result<Response, ApiError> {
    // The router cannot match a parameter with a suffix: `{seed_token}.iso` is taken apart here.
    let seed_token = file.strip_suffix(".iso").ok_or(paddock_domain::Error::NotFound { kind: "agent token" })?;
    let iso = s.services.agent_seed(seed_token).await?;
    let mut response = (StatusCode::OK, iso).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-iso9660-image"));
    Ok(response)
}

/// The route the seed is served at (see [`agent_seed_view`]).
pub const SEED_ROUTE: &str = "/v1/agent/seed/{seed_file}";

/// The run's report; it uses the run up.
///
/// The agent's report of its run: the evidence of every drive's wipe (or the first boot). Accepted once;
/// whether it proves the run is decided from the evidence, not from the agent's word.
#[utoipa::path(post, path = "/v1/agent/report", operation_id = "agent_report", tag = "agent",
    request_body = AgentReport,
    responses(
        (status = 204, description = "Recorded (whether it proves the run is decided from its evidence)")),
    security(("agent_token" = [])))]
pub async fn agent_report(
    State(s): State<AppState>,
    token: AgentToken,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let (request_id, server_request_id) = context::ids();
    s.services.agent_report(&token.0, &body, request_id, server_request_id).await?;
    Ok(respond::no_content())
}
