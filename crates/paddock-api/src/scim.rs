//! SCIM 2.0 (RFC 7644) under `/v1/tenants/{tenant_id}/scim/v2/`: the tenant's identity provider
//! pushes users and groups here. These routes are the scoped exceptions to the API's conventions
//! (docs/api.md): bodies are `application/scim+json` (`application/json` accepted), failures are
//! SCIM error bodies (`urn:ietf:params:scim:api:messages:2.0:Error`, with `scimType`) rather than
//! problems, lists page with `startIndex`/`count` rather than cursors, and invalid values are 400
//! `invalidValue` rather than 422. They are described by SCIM's own discovery endpoints
//! (`/ServiceProviderConfig`, `/ResourceTypes`, `/Schemas`), which is what SCIM clients read, not
//! by the OpenAPI document. The caller is a SCIM token of the tenant (`scim-tokens`) or a JWT.

use axum::body::{to_bytes, Body as HttpBody};
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::middleware::map_response;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http::request::Parts;
use http::{header, HeaderValue, StatusCode};
use paddock_domain::scim::{discovery, scim_type, ERROR_SCHEMA, LIST_RESPONSE, TOKEN_PREFIX};
use paddock_domain::Error;
use paddock_service::idempotency::DeferredCommit;
use paddock_service::scim::{base_path, ListQuery, ScimCaller, SearchScope};
use paddock_service::{Body, Ctx};
use paddock_types::TenantId;
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::auth::{bearer, Authn};
use crate::context;
use crate::error::ApiError;
use crate::extract::{Path, Query, BODY_LIMIT};
use crate::state::AppState;

/// SCIM's media type.
pub const SCIM_JSON: &str = "application/scim+json";

/// The SCIM routes, with their failures turned into SCIM error bodies.
pub fn router() -> Router<AppState> {
    let at = |tail: &str| format!("/v1/tenants/{{tenant_id}}/scim/v2{tail}");
    Router::new()
        .route(&at("/Users"), get(user_list).post(user_create))
        .route(&at("/Users/.search"), post(user_search))
        .route(&at("/Users/{user_id}"), get(user_view).put(user_replace).patch(user_patch).delete(user_delete))
        .route(&at("/Groups"), get(group_list).post(group_create))
        .route(&at("/Groups/.search"), post(group_search))
        .route(&at("/.search"), post(search))
        .route(&at("/Groups/{group_id}"), get(group_view).put(group_replace).patch(group_patch).delete(group_delete))
        .route(&at("/ServiceProviderConfig"), get(service_provider_config))
        .route(&at("/ResourceTypes"), get(resource_types))
        .route(&at("/ResourceTypes/{name}"), get(resource_type))
        .route(&at("/Schemas"), get(schemas))
        .route(&at("/Schemas/{name}"), get(schema))
        .route(&at("/{*rest}"), axum::routing::any(unknown))
        .layer(map_response(scim_errors))
}

/// The caller of a SCIM route: a JWT caller, or one of the tenant's SCIM tokens (an unknown or
/// revoked token is 401).
pub struct ScimAuth(pub ScimCaller);

impl FromRequestParts<AppState> for ScimAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let (request_id, server_request_id) = context::ids();
        let refused = match parts.extensions.remove::<Authn>() {
            Some(Authn::Caller(actor)) => {
                let deferred_commit = parts.extensions.get::<DeferredCommit>().cloned();
                let ctx = Ctx { actor, request_id, server_request_id, deferred_commit };
                return Ok(ScimAuth(ScimCaller { ctx, token: None }));
            }
            Some(Authn::Refused { server_side: true, .. }) => return Err(ApiError::Domain(Error::Unavailable(None))),
            other => other,
        };
        match bearer(parts.headers.get(header::AUTHORIZATION)) {
            Some(Ok(token)) if token.starts_with(TOKEN_PREFIX) => match state.services.scim_token_find(token).await? {
                Some((id, tenant)) => Ok(ScimAuth(ScimCaller::token(id, tenant, request_id, server_request_id))),
                None => Err(ApiError::Unauthenticated {
                    code: "invalid_token",
                    message: "the SCIM token is unknown or revoked".to_owned(),
                }),
            },
            _ => Err(match refused {
                Some(Authn::Refused { code, message, .. }) => ApiError::Unauthenticated { code, message },
                _ => ApiError::Unauthenticated {
                    code: "missing_token",
                    message: "authentication is required".to_owned(),
                },
            }),
        }
    }
}

/// A SCIM request body: `application/scim+json` or `application/json`; decoded by the service
/// after authorization, like every body of the API.
pub struct ScimBody(pub Body);

impl<S: Send + Sync> FromRequest<S> for ScimBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let media_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or_default().trim().to_ascii_lowercase());
        if !matches!(media_type.as_deref(), Some(SCIM_JSON | "application/json")) {
            let message = "the body must be application/scim+json (or application/json)".to_owned();
            return Ok(ScimBody(Body::refused(Error::UnsupportedMediaType(message))));
        }
        Ok(ScimBody(match bytes::Bytes::from_request(req, state).await {
            Ok(bytes) => Body::bytes(bytes.to_vec()),
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Body::refused(Error::PayloadTooLarge { limit: BODY_LIMIT })
            }
            Err(_) => Body::refused(Error::BadRequest {
                code: "malformed_body",
                message: "the request body could not be read".to_owned(),
            }),
        }))
    }
}

/// The query of a list or a read.
#[derive(Debug, Default, Deserialize)]
pub struct ScimParams {
    filter: Option<String>,
    #[serde(rename = "startIndex")]
    start_index: Option<String>,
    count: Option<String>,
    attributes: Option<String>,
    #[serde(rename = "excludedAttributes")]
    excluded_attributes: Option<String>,
}

impl ScimParams {
    fn list(self) -> ListQuery {
        ListQuery {
            filter: self.filter,
            start_index: self.start_index,
            count: self.count,
            attributes: self.attributes,
            excluded_attributes: self.excluded_attributes,
        }
    }
}

fn scim(status: StatusCode, body: &Value) -> Response {
    let mut response = (status, serde_json::to_vec(body).unwrap_or_default()).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(SCIM_JSON));
    response
}

/// 201 with the resource and its `Location`.
fn created(body: &Value) -> Response {
    let mut response = scim(StatusCode::CREATED, body);
    if let Some(location) = body["meta"]["location"].as_str().and_then(|l| HeaderValue::from_str(l).ok()) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

fn ok(body: &Value) -> Response {
    scim(StatusCode::OK, body)
}

async fn user_list(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path(tenant): Path<TenantId>,
    Query(q): Query<ScimParams>,
) -> Result<Response, ApiError> {
    Ok(ok(&s.services.scim_user_list(&caller, tenant, &q.list()).await?))
}

async fn user_create(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path(tenant): Path<TenantId>,
    ScimBody(body): ScimBody,
) -> Result<Response, ApiError> {
    Ok(created(&s.services.scim_user_create(&caller, tenant, &body).await?))
}

async fn user_view(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path((tenant, id)): Path<(TenantId, Uuid)>,
    Query(q): Query<ScimParams>,
) -> Result<Response, ApiError> {
    let projection = (q.attributes.as_deref(), q.excluded_attributes.as_deref());
    Ok(ok(&s.services.scim_user_get(&caller, tenant, id, projection).await?))
}

async fn user_replace(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path((tenant, id)): Path<(TenantId, Uuid)>,
    ScimBody(body): ScimBody,
) -> Result<Response, ApiError> {
    Ok(ok(&s.services.scim_user_replace(&caller, tenant, id, &body).await?))
}

async fn user_patch(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path((tenant, id)): Path<(TenantId, Uuid)>,
    ScimBody(body): ScimBody,
) -> Result<Response, ApiError> {
    Ok(ok(&s.services.scim_user_patch(&caller, tenant, id, &body).await?))
}

async fn user_delete(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path((tenant, id)): Path<(TenantId, Uuid)>,
) -> Result<Response, ApiError> {
    s.services.scim_user_delete(&caller, tenant, id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn group_list(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path(tenant): Path<TenantId>,
    Query(q): Query<ScimParams>,
) -> Result<Response, ApiError> {
    Ok(ok(&s.services.scim_group_list(&caller, tenant, &q.list()).await?))
}

async fn group_create(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path(tenant): Path<TenantId>,
    ScimBody(body): ScimBody,
) -> Result<Response, ApiError> {
    Ok(created(&s.services.scim_group_create(&caller, tenant, &body).await?))
}

async fn group_view(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path((tenant, id)): Path<(TenantId, Uuid)>,
    Query(q): Query<ScimParams>,
) -> Result<Response, ApiError> {
    let projection = (q.attributes.as_deref(), q.excluded_attributes.as_deref());
    Ok(ok(&s.services.scim_group_get(&caller, tenant, id, projection).await?))
}

async fn group_replace(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path((tenant, id)): Path<(TenantId, Uuid)>,
    ScimBody(body): ScimBody,
) -> Result<Response, ApiError> {
    Ok(ok(&s.services.scim_group_replace(&caller, tenant, id, &body).await?))
}

async fn group_patch(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path((tenant, id)): Path<(TenantId, Uuid)>,
    ScimBody(body): ScimBody,
) -> Result<Response, ApiError> {
    Ok(ok(&s.services.scim_group_patch(&caller, tenant, id, &body).await?))
}

async fn group_delete(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path((tenant, id)): Path<(TenantId, Uuid)>,
) -> Result<Response, ApiError> {
    s.services.scim_group_delete(&caller, tenant, id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn user_search(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path(tenant): Path<TenantId>,
    ScimBody(body): ScimBody,
) -> Result<Response, ApiError> {
    Ok(ok(&s.services.scim_search(&caller, tenant, SearchScope::Users, &body).await?))
}

async fn group_search(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path(tenant): Path<TenantId>,
    ScimBody(body): ScimBody,
) -> Result<Response, ApiError> {
    Ok(ok(&s.services.scim_search(&caller, tenant, SearchScope::Groups, &body).await?))
}

async fn search(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path(tenant): Path<TenantId>,
    ScimBody(body): ScimBody,
) -> Result<Response, ApiError> {
    Ok(ok(&s.services.scim_search(&caller, tenant, SearchScope::All, &body).await?))
}

async fn service_provider_config(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path(tenant): Path<TenantId>,
) -> Result<Response, ApiError> {
    s.services.scim_read_check(&caller, tenant).await?;
    Ok(ok(&discovery::service_provider_config(&base_path(tenant))))
}

/// A `ListResponse` of every item (the discovery lists are short).
fn list_all(items: Vec<Value>) -> Value {
    json!({ "schemas": [LIST_RESPONSE], "totalResults": items.len(), "startIndex": 1,
        "itemsPerPage": items.len(), "Resources": items })
}

async fn resource_types(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path(tenant): Path<TenantId>,
) -> Result<Response, ApiError> {
    s.services.scim_read_check(&caller, tenant).await?;
    Ok(ok(&list_all(discovery::resource_types(&base_path(tenant)))))
}

async fn resource_type(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path((tenant, name)): Path<(TenantId, String)>,
) -> Result<Response, ApiError> {
    s.services.scim_read_check(&caller, tenant).await?;
    let found = discovery::resource_types(&base_path(tenant)).into_iter().find(|r| r["id"] == name.as_str());
    Ok(ok(&found.ok_or(Error::NotFound { kind: "resource type" })?))
}

async fn schemas(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path(tenant): Path<TenantId>,
) -> Result<Response, ApiError> {
    s.services.scim_read_check(&caller, tenant).await?;
    Ok(ok(&list_all(discovery::schemas(&base_path(tenant)))))
}

async fn schema(
    State(s): State<AppState>,
    ScimAuth(caller): ScimAuth,
    Path((tenant, id)): Path<(TenantId, String)>,
) -> Result<Response, ApiError> {
    s.services.scim_read_check(&caller, tenant).await?;
    let found = discovery::schemas(&base_path(tenant)).into_iter().find(|s| s["id"] == id.as_str());
    Ok(ok(&found.ok_or(Error::NotFound { kind: "schema" })?))
}

/// Anything else under the SCIM base (`/Bulk` and `/Me` are not offered): 404.
async fn unknown(uri: http::Uri) -> Response {
    ApiError::RouteNotFound(uri.path().to_owned()).into_response()
}

/// Turns a problem answer of a SCIM route into a SCIM error body (RFC 7644 section 3.12): the
/// same status (a 422 is SCIM's 400 `invalidValue`), the `scimType` of its code when SCIM has
/// one, its detail with its field errors, and its headers (`WWW-Authenticate`, `Retry-After`).
async fn scim_errors(response: Response) -> Response {
    let problem = response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v == "application/problem+json");
    if !problem {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let problem: Value = match to_bytes(body, BODY_LIMIT).await {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_default(),
        Err(_) => Value::Null,
    };
    if parts.status == StatusCode::UNPROCESSABLE_ENTITY {
        parts.status = StatusCode::BAD_REQUEST;
    }
    let mut detail = problem["detail"].as_str().unwrap_or_default().to_owned();
    for e in problem["errors"].as_array().into_iter().flatten() {
        detail.push_str(&format!("; {}: {}", e["field"].as_str().unwrap_or("?"), e["message"].as_str().unwrap_or("")));
    }
    let mut body = json!({ "schemas": [ERROR_SCHEMA], "status": parts.status.as_u16().to_string(), "detail": detail });
    if let Some(t) = problem["code"].as_str().and_then(scim_type) {
        body["scimType"] = json!(t);
    }
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(SCIM_JSON));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, HttpBody::from(serde_json::to_vec(&body).unwrap_or_default()))
}
