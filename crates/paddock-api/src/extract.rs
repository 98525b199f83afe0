//! Extractors whose rejections are Problems: the JSON body (media type, size), path and query
//! parameters, and `If-Match`.

use std::collections::HashMap;
use std::sync::LazyLock;

use axum::extract::{FromRequest, FromRequestParts, MatchedPath, RawPathParams, Request};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::request::Parts;
use http::{header, StatusCode};
use paddock_domain::precondition::IfMatch;
use paddock_domain::Error;
use paddock_service::Body;
use paddock_types::problem::FieldError;
use serde::de::value::{Error as ValueError, SeqDeserializer, StrDeserializer};
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// Largest accepted body.
pub const BODY_LIMIT: usize = 1024 * 1024;

/// A JSON body, not yet decoded: services decode it after authorization. Accepts
/// `application/json` (with parameters such as charset), and for a `PATCH` (a JSON merge patch)
/// `application/merge-patch+json` too: what the OpenAPI document lists for each operation.
#[derive(Debug)]
pub struct JsonBody(pub Body);

/// Whether a body of `media_type` is accepted by a request of `method`.
fn accepted_media_type(method: &http::Method, media_type: &str) -> bool {
    media_type == "application/json" || (method == http::Method::PATCH && media_type == "application/merge-patch+json")
}

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    /// Never rejects: a refusal travels inside the body and is raised when the service decodes
    /// it, after authorization.
    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let route = req.extensions().get::<MatchedPath>().map(MatchedPath::as_str).unwrap_or_default();
        let shape = crate::shape::body_shape(req.method(), route);
        let media_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or_default().trim().to_ascii_lowercase());
        let patch = req.method() == http::Method::PATCH;
        let refusal = match media_type.as_deref() {
            Some(media_type) if accepted_media_type(req.method(), media_type) => None,
            Some(other) if patch => {
                Some(format!("the body must be application/merge-patch+json or application/json, not {other}"))
            }
            Some(other) => Some(format!("the body must be application/json, not {other}")),
            None => Some("the body must be application/json; the Content-Type header is missing".to_owned()),
        };
        if let Some(message) = refusal {
            return Ok(JsonBody(Body::refused(Error::UnsupportedMediaType(message))));
        }
        Ok(JsonBody(match Bytes::from_request(req, state).await {
            Ok(bytes) => Body::bytes(bytes.to_vec()).with_shape(shape),
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

/// Path parameters. A malformed id (a `*_id` parameter that is not a UUID) names no object: it
/// is replaced by the max UUID, which paddock never issues, so the request still reaches its
/// service and gets the answers a well-formed missing id gets, in the same order (403 for a role
/// that may never do this, else 404), and a refused write is audited like any other. So does a
/// name with a control character (`validate::is_forbidden_control`), as the empty name.
#[derive(Debug)]
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let not_found = || ApiError::Domain(paddock_domain::Error::NotFound { kind: "resource" });
        let raw = RawPathParams::from_request_parts(parts, state).await.map_err(|_| not_found())?;
        let mut values = raw.iter().map(|(key, value)| path_value(key, value));
        // One parameter is the value itself, several a sequence (a tuple): as axum's `Path`.
        let parsed = match (values.next(), values.next()) {
            (Some(one), None) => T::deserialize(StrDeserializer::<ValueError>::new(one)),
            (first, second) => {
                T::deserialize(SeqDeserializer::<_, ValueError>::new(first.into_iter().chain(second).chain(values)))
            }
        };
        parsed.map(Path).map_err(|_| not_found())
    }
}

/// The max UUID, which paddock never issues: what a malformed id stands for (see [`Path`]).
const MAX_UUID: &str = "ffffffff-ffff-ffff-ffff-ffffffffffff";

/// A path parameter as the route's extractor sees it: an `..._id` that is not a UUID becomes the
/// max UUID, a value with a forbidden control character the empty name (see [`Path`]).
fn path_value<'a>(key: &str, value: &'a str) -> &'a str {
    if key.ends_with("_id") && uuid::Uuid::try_parse(value).is_err() {
        MAX_UUID
    } else if value.chars().any(paddock_domain::validate::is_forbidden_control) {
        // No name holds one: the empty name, which none is, stands for it.
        ""
    } else {
        value
    }
}

/// Query parameters, one rule for every route (docs/api.md, "Query parameters"): a query that
/// cannot be read (not UTF-8, a control character, longer than documented) or a value that is
/// not of its parameter's type is malformed, 400 `invalid_parameter`; a parameter the operation
/// does not document is 422 `validation_failed` naming each; a well-formed value outside its
/// documented bounds is 422 on that parameter (checked where it is parsed, `PageRequest`).
#[derive(Debug)]
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        check_query_of(parts)?;
        let query = parts.uri.query().unwrap_or_default();
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(de)
            .map(Query)
            .map_err(|e| ApiError::bad_parameter(format!("invalid query parameter {}: {}", e.path(), e.inner())))
    }
}

/// Checks a request's query against its operation's documented parameters (see [`Query`]):
/// run for every authenticated route by `Caller`, so a route that reads no parameter refuses
/// unknown ones too.
pub(crate) fn check_query_of(parts: &Parts) -> Result<(), ApiError> {
    let query = parts.uri.query().unwrap_or_default();
    let route = parts.extensions.get::<MatchedPath>().map(MatchedPath::as_str).unwrap_or_default();
    check_query(query, query_params(&parts.method, route))
}

/// An operation's query parameters: name -> documented `maxLength`.
type Params = HashMap<String, Option<usize>>;

/// The documented query parameters of each operation, by method and route template, with their
/// `maxLength`, read from the OpenAPI document itself: what the document promises is what is
/// enforced.
static QUERY_PARAMS: LazyLock<HashMap<(String, String), Params>> = LazyLock::new(|| {
    let doc: serde_json::Value = serde_json::from_str(&crate::openapi_json()).unwrap_or_default();
    let mut params = HashMap::new();
    for (path, item) in doc["paths"].as_object().into_iter().flatten() {
        for (method, op) in item.as_object().into_iter().flatten() {
            let query = op["parameters"].as_array().into_iter().flatten().filter(|p| p["in"] == "query");
            let named: Params = query
                .filter_map(|p| {
                    Some((p["name"].as_str()?.to_owned(), p["schema"]["maxLength"].as_u64().map(|m| m as usize)))
                })
                .collect();
            params.insert((method.to_ascii_uppercase(), path.clone()), named);
        }
    }
    params
});

/// The documented query parameters of a route (none known for an undocumented route).
fn query_params(method: &http::Method, route: &str) -> Option<&'static Params> {
    QUERY_PARAMS.get(&(method.as_str().to_owned(), route.to_owned()))
}

/// Refuses a query whose names or values are not UTF-8 once decoded (the decoder would replace
/// the bytes silently), hold a control character no parameter allows, or are longer than the
/// document says (400); then one naming every parameter the operation does not document (422).
fn check_query(query: &str, params: Option<&Params>) -> Result<(), ApiError> {
    let mut unknown: Vec<String> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |raw: &str| {
            let raw = raw.replace('+', " ");
            String::from_utf8(percent_encoding::percent_decode_str(&raw).collect())
        };
        let name = decode(name).map_err(|_| ApiError::bad_parameter("a query parameter's name is not UTF-8"))?;
        let value = decode(value).map_err(|_| {
            ApiError::bad_parameter(format!("invalid query parameter {}: not UTF-8", name.escape_default()))
        })?;
        if name.chars().chain(value.chars()).any(paddock_domain::validate::is_forbidden_control) {
            let message = paddock_domain::validate::CONTROL_MESSAGE;
            return Err(ApiError::bad_parameter(format!(
                "invalid query parameter {}: {message}",
                name.escape_default()
            )));
        }
        match params.map(|p| p.get(&name)) {
            Some(Some(Some(max))) if value.chars().count() > *max => {
                return Err(ApiError::bad_parameter(format!(
                    "invalid query parameter {name}: at most {max} characters"
                )));
            }
            Some(None) if !unknown.contains(&name) => unknown.push(name),
            _ => {}
        }
    }
    match params {
        Some(params) if !unknown.is_empty() => {
            Err(ApiError::Domain(Error::Invalid(unknown_parameters(unknown, params))))
        }
        _ => Ok(()),
    }
}

/// One field error per unknown parameter, listing those the operation takes.
fn unknown_parameters(unknown: Vec<String>, params: &Params) -> Vec<FieldError> {
    let mut known: Vec<&str> = params.keys().map(String::as_str).collect();
    known.sort_unstable();
    let message = if known.is_empty() {
        "is not a query parameter of this operation, which takes none".to_owned()
    } else {
        format!("is not a query parameter of this operation; its parameters are {}", known.join(", "))
    };
    unknown.into_iter().map(|field| FieldError { field, message: message.clone() }).collect()
}

/// The `If-Match` header.
#[derive(Debug)]
pub struct IfMatchHeader(pub IfMatch);

impl<S: Send + Sync> FromRequestParts<S> for IfMatchHeader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let value = parts.headers.get(header::IF_MATCH).map(|v| v.to_str().unwrap_or("\u{0}"));
        Ok(IfMatchHeader(IfMatch::parse(value)))
    }
}

/// Fallback of unknown routes.
pub async fn route_not_found(uri: http::Uri) -> Response {
    ApiError::RouteNotFound(uri.path().to_owned()).into_response()
}

/// Fallback of known routes with another method.
pub async fn method_not_allowed() -> Response {
    ApiError::MethodNotAllowed.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_id_stands_for_the_max_uuid_and_a_control_character_for_the_empty_name() {
        assert_eq!(MAX_UUID, uuid::Uuid::max().to_string());
        assert_eq!(path_value("tenant_id", "not-a-uuid"), MAX_UUID);
        let id = "01a24222-7867-7512-84d0-16fcdbc5a074";
        assert_eq!(path_value("tenant_id", id), id);
        assert_eq!(path_value("name", "a\u{7}b"), "");
        assert_eq!(path_value("name", "gpu-a"), "gpu-a");
    }
}
