//! The one mapping from errors to HTTP: RFC 9457 problem+json with a stable `code`, the request
//! path as `instance` and the request id. A 5xx never shows its cause; the cause is logged once,
//! here, under the same request id.

use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use paddock_domain::Error;
use paddock_types::problem::{self, FieldError, Problem, ProblemType};

use crate::context;

/// Seconds a client should wait before retrying a 503.
const RETRY_AFTER_SECS: &str = "5";

/// Everything a request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A domain or service error.
    #[error(transparent)]
    Domain(#[from] Error),
    /// No usable bearer token.
    #[error("{message}")]
    Unauthenticated {
        /// Stable code (`missing_token`, `invalid_token`, `token_expired`, ...).
        code: &'static str,
        /// Safe message.
        message: String,
    },
    /// No such route.
    #[error("no route matches {0}")]
    RouteNotFound(String),
    /// The route exists without this method.
    #[error("this method is not allowed here")]
    MethodNotAllowed,
    /// The idempotency key was used with another body.
    #[error("this Idempotency-Key was used with another request body")]
    IdempotencyMismatch,
    /// A request with the same idempotency key is still running.
    #[error("a request with this Idempotency-Key is still in progress")]
    IdempotencyInFlight,
    /// The caller sent more than its rate allows (`limits`).
    #[error("too many requests from this caller; retry in {retry_after} s")]
    RateLimited {
        /// Seconds until the caller may send again.
        retry_after: u64,
    },
    /// The process has as many requests in flight as it takes.
    #[error("the server is busy; retry later")]
    Overloaded,
    /// The request took longer than its time limit.
    #[error("the request took too long; retry later")]
    TimedOut,
}

impl ApiError {
    /// A malformed path or query parameter.
    pub fn bad_parameter(message: impl Into<String>) -> Self {
        Self::Domain(Error::BadRequest { code: "invalid_parameter", message: message.into() })
    }
}

struct Kind {
    status: StatusCode,
    type_: ProblemType,
}

/// The problem kind of each error: its status and its entry of the problem type table.
fn kind(e: &ApiError) -> Kind {
    let k = |status, type_| Kind { status, type_ };
    match e {
        ApiError::Domain(d) => match d {
            Error::NotFound { .. } => k(StatusCode::NOT_FOUND, problem::NOT_FOUND),
            Error::Forbidden(_) => k(StatusCode::FORBIDDEN, problem::FORBIDDEN),
            Error::BadRequest { .. } => k(StatusCode::BAD_REQUEST, problem::BAD_REQUEST),
            Error::Invalid(_) | Error::Rule { .. } => k(StatusCode::UNPROCESSABLE_ENTITY, problem::VALIDATION),
            Error::UnsupportedMediaType(_) => k(StatusCode::UNSUPPORTED_MEDIA_TYPE, problem::UNSUPPORTED_MEDIA_TYPE),
            Error::PayloadTooLarge { .. } => k(StatusCode::PAYLOAD_TOO_LARGE, problem::PAYLOAD_TOO_LARGE),
            Error::Conflict { .. } => k(StatusCode::CONFLICT, problem::CONFLICT),
            Error::QuotaExceeded(_) => k(StatusCode::CONFLICT, problem::QUOTA_EXCEEDED),
            Error::Gone { .. } => k(StatusCode::GONE, problem::GONE),
            Error::PreconditionFailed { .. } => k(StatusCode::PRECONDITION_FAILED, problem::PRECONDITION_FAILED),
            Error::TooManyRequests { .. } => k(StatusCode::TOO_MANY_REQUESTS, problem::TOO_MANY_REQUESTS),
            Error::Unavailable(_) => k(StatusCode::SERVICE_UNAVAILABLE, problem::UNAVAILABLE),
            Error::Internal(_) => k(StatusCode::INTERNAL_SERVER_ERROR, problem::INTERNAL),
        },
        ApiError::Unauthenticated { .. } => k(StatusCode::UNAUTHORIZED, problem::UNAUTHENTICATED),
        ApiError::RouteNotFound(_) => k(StatusCode::NOT_FOUND, problem::NOT_FOUND),
        ApiError::MethodNotAllowed => k(StatusCode::METHOD_NOT_ALLOWED, problem::METHOD_NOT_ALLOWED),
        ApiError::IdempotencyMismatch => k(StatusCode::UNPROCESSABLE_ENTITY, problem::IDEMPOTENCY_KEY_REUSED),
        ApiError::IdempotencyInFlight => k(StatusCode::CONFLICT, problem::CONFLICT),
        ApiError::RateLimited { .. } => k(StatusCode::TOO_MANY_REQUESTS, problem::RATE_LIMITED),
        ApiError::Overloaded | ApiError::TimedOut => k(StatusCode::SERVICE_UNAVAILABLE, problem::UNAVAILABLE),
    }
}

fn code(e: &ApiError) -> &'static str {
    match e {
        ApiError::Domain(d) => d.code(),
        ApiError::Unauthenticated { code, .. } => code,
        ApiError::RouteNotFound(_) => "route_not_found",
        ApiError::MethodNotAllowed => "method_not_allowed",
        ApiError::IdempotencyMismatch => "idempotency_key_reused",
        ApiError::IdempotencyInFlight => "idempotency_in_flight",
        ApiError::RateLimited { .. } => "rate_limited",
        ApiError::Overloaded => "overloaded",
        ApiError::TimedOut => "request_timeout",
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let info = context::current();
        let kind = kind(&self);
        let detail = if kind.status.is_server_error() {
            if let ApiError::Domain(Error::Internal(source) | Error::Unavailable(Some(source))) = &self {
                tracing::error!(error = source.as_ref() as &dyn std::error::Error, request.id = %info.request_id, "request failed: {}", paddock_domain::error::chain(source.as_ref()));
            }
            match &self {
                ApiError::Domain(Error::Unavailable(_)) | ApiError::Overloaded | ApiError::TimedOut => {
                    "the service is temporarily unavailable; retry later".to_owned()
                }
                _ => format!("an internal error occurred; quote request id {} when reporting it", info.request_id),
            }
        } else {
            self.to_string()
        };
        let errors: Vec<FieldError> = match &self {
            ApiError::Domain(Error::Invalid(errors)) => errors.clone(),
            ApiError::Domain(Error::Rule { field, message, .. }) => {
                vec![FieldError { field: field.clone(), message: message.clone() }]
            }
            _ => Vec::new(),
        };
        let problem = Problem {
            type_: kind.type_.uri(),
            title: kind.type_.title.to_owned(),
            status: kind.status.as_u16(),
            detail,
            instance: info.path,
            code: code(&self).to_owned(),
            request_id: info.request_id,
            errors,
        };
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut response = (kind.status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        match kind.status {
            StatusCode::UNAUTHORIZED => {
                let value = if matches!(&self, ApiError::Unauthenticated { code: "missing_token", .. }) {
                    HeaderValue::from_static("Bearer realm=\"paddock\"")
                } else {
                    HeaderValue::from_static("Bearer realm=\"paddock\", error=\"invalid_token\"")
                };
                headers.insert(header::WWW_AUTHENTICATE, value);
            }
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => {
                let value = match &self {
                    ApiError::RateLimited { retry_after }
                    | ApiError::Domain(Error::TooManyRequests { retry_after, .. }) => HeaderValue::from(*retry_after),
                    _ => HeaderValue::from_static(RETRY_AFTER_SECS),
                };
                headers.insert(header::RETRY_AFTER, value);
            }
            _ => {}
        }
        response
    }
}
