//! Per-request facts every answer needs: the request id and the path. A middleware sets them in a
//! task-local for the handler's future, so a Problem built anywhere below (extractor rejections
//! included) carries `instance` and `request_id` without threading them through every call.

use axum::extract::Request;
use axum::response::Response;
use http::{HeaderName, HeaderValue};

/// The request id header.
pub static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// What a request is.
#[derive(Debug, Clone, Default)]
pub struct RequestInfo {
    /// Accepted from the client when sane, else the server's id.
    pub request_id: String,
    /// The id the server gave the request, whatever the client sent: two clients may send the
    /// same request id, never get the same server id.
    pub server_request_id: uuid::Uuid,
    /// The path, for `instance` and the logs (credentials redacted).
    pub path: String,
    /// The query string, for `Link` headers.
    pub query: Option<String>,
}

tokio::task_local! {
    static REQUEST: RequestInfo;
}

/// The current request's facts (defaults outside a request).
pub fn current() -> RequestInfo {
    REQUEST.try_with(Clone::clone).unwrap_or_default()
}

/// The current request's ids (the client's or the server's request id, and the server's), without
/// copying the rest of [`RequestInfo`]; empty outside a request.
pub fn ids() -> (String, uuid::Uuid) {
    REQUEST.try_with(|r| (r.request_id.clone(), r.server_request_id)).unwrap_or_default()
}

/// Runs `fut` with `info` as the current request (also used where work moves to another task).
pub async fn scope<F: std::future::Future>(info: RequestInfo, fut: F) -> F::Output {
    REQUEST.scope(info, fut).await
}

/// A client's request id is kept when it is short, visible ASCII; otherwise the server's is used.
fn accept_request_id(value: Option<&HeaderValue>, server_request_id: uuid::Uuid) -> String {
    value
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned)
        // Encoded in place, one allocation of the exact size (`to_string` goes through `Display`).
        .unwrap_or_else(|| server_request_id.hyphenated().encode_lower(&mut uuid::Uuid::encode_buffer()).to_owned())
}

/// The path as it may be logged and shown: a run's seed token is a credential, so
/// `/v1/agent/seed/{seed_token}.iso` keeps only its shape; so does anything else under
/// `/v1/agent/` that is not one of its fixed paths.
fn redact(path: &str) -> String {
    match path.strip_prefix("/v1/agent/") {
        Some("config" | "report") => path.to_owned(),
        Some(rest) if rest.starts_with("seed/") => "/v1/agent/seed/[redacted].iso".to_owned(),
        Some(_) => "/v1/agent/[redacted]".to_owned(),
        None => path.to_owned(),
    }
}

/// Runs `handle` on `req` with the request id and path set for it, and echoes the id back (the
/// outermost step of every route's middleware, `crate::router`).
pub async fn in_context(req: Request, handle: impl AsyncFnOnce(Request) -> Response) -> Response {
    let server_request_id = uuid::Uuid::now_v7();
    let request_id = accept_request_id(req.headers().get(&REQUEST_ID), server_request_id);
    let echoed = HeaderValue::from_str(&request_id).ok();
    let path = redact(req.uri().path());
    let span = tracing::info_span!("request", request.id = %request_id, request.server_id = %server_request_id, method = %req.method(), path = %path);
    let info = RequestInfo { request_id, server_request_id, path, query: req.uri().query().map(str::to_owned) };
    let mut response = tracing::Instrument::instrument(scope(info, handle(req)), span).await;
    if let Some(value) = echoed {
        response.headers_mut().insert(&REQUEST_ID, value);
    }
    response
}
