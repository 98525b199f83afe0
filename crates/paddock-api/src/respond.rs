//! Success answers: JSON with `ETag` for single objects, `Location` for created and accepted
//! ones, and `Link: <...>; rel="next"` for pages.

use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use paddock_types::page::Page;
use serde::Serialize;

use crate::context;

fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => {
            let mut response = (status, bytes).into_response();
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
        Err(e) => crate::error::ApiError::Domain(paddock_domain::Error::internal(e)).into_response(),
    }
}

fn with_header(mut response: Response, name: header::HeaderName, value: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(value) {
        response.headers_mut().insert(name, value);
    }
    response
}

/// 200 with a body that has no etag (operations, reports).
pub fn ok<T: Serialize>(body: &T) -> Response {
    json(StatusCode::OK, body)
}

/// 200 with the object and its `ETag`.
pub fn object<T: Serialize>(body: &T, etag: &str) -> Response {
    with_header(json(StatusCode::OK, body), header::ETAG, etag)
}

/// 201 with the object, its `ETag` and `Location`.
pub fn created<T: Serialize>(body: &T, etag: &str, location: &str) -> Response {
    let response = with_header(json(StatusCode::CREATED, body), header::ETAG, etag);
    with_header(response, header::LOCATION, location)
}

/// 201 with the object and its `Location`, for an object without an etag.
pub fn created_untagged<T: Serialize>(body: &T, location: &str) -> Response {
    with_header(json(StatusCode::CREATED, body), header::LOCATION, location)
}

/// 202 with a body and no etag (a delivery queued again).
pub fn queued<T: Serialize>(body: &T) -> Response {
    json(StatusCode::ACCEPTED, body)
}

/// 202 with `{<resource>, operation}`, the resource's `ETag` and `Location`.
pub fn accepted<T: Serialize>(body: &T, etag: &str, location: &str) -> Response {
    let response = with_header(json(StatusCode::ACCEPTED, body), header::ETAG, etag);
    with_header(response, header::LOCATION, location)
}

/// 204.
pub fn no_content() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

/// 200 with a page, and a `Link` header to the next one.
pub fn page<T: Serialize>(items: Vec<T>, next_cursor: Option<String>) -> Response {
    let link = next_cursor.as_deref().map(next_link);
    let response = json(StatusCode::OK, &Page { items, next_cursor });
    match link {
        Some(link) => with_header(response, header::LINK, &link),
        None => response,
    }
}

/// 200 with a page-like body (one with more than `items` and `next_cursor`) and its `Link`.
pub fn page_body<T: Serialize>(body: &T, next_cursor: Option<&str>) -> Response {
    let response = json(StatusCode::OK, body);
    match next_cursor.map(next_link) {
        Some(link) => with_header(response, header::LINK, &link),
        None => response,
    }
}

/// `<path?query-with-the-next-cursor>; rel="next"`, keeping the request's other parameters.
fn next_link(cursor: &str) -> String {
    let info = context::current();
    let mut query = form_urlencoded::Serializer::new(String::new());
    if let Some(q) = &info.query {
        for (key, value) in form_urlencoded::parse(q.as_bytes()).filter(|(k, _)| k != "cursor") {
            query.append_pair(&key, &value);
        }
    }
    query.append_pair("cursor", cursor);
    format!("<{}?{}>; rel=\"next\"", info.path, query.finish())
}

/// 200 with a kubeconfig (YAML, a credential: never cached) and the header `expires_name` saying
/// when its token expires.
pub fn kubeconfig(yaml: &str, expires_name: &'static str, expires_at: &str) -> Response {
    let mut response = (StatusCode::OK, yaml.to_owned()).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/yaml"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    with_header(response, header::HeaderName::from_static(expires_name), expires_at)
}
