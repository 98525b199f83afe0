//! A request builder over the in-process router: the full middleware stack runs, no socket.

use axum::body::Body;
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

/// A request being built.
pub struct Req<'a> {
    router: &'a axum::Router,
    method: Method,
    path: String,
    headers: HeaderMap,
    body: Option<Vec<u8>>,
}

impl<'a> Req<'a> {
    pub(crate) fn new(router: &'a axum::Router, method: Method, path: String) -> Self {
        Self { router, method, path, headers: HeaderMap::new(), body: None }
    }

    /// `Authorization: Bearer <token>`.
    pub fn token(self, token: &str) -> Self {
        self.header("authorization", &format!("Bearer {token}"))
    }

    /// Any header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        let name = header::HeaderName::from_bytes(name.as_bytes()).expect("header name");
        self.headers.insert(name, HeaderValue::from_str(value).expect("header value"));
        self
    }

    /// A JSON body (with its content type).
    pub fn json(mut self, body: &Value) -> Self {
        self.body = Some(serde_json::to_vec(body).expect("json"));
        if !self.headers.contains_key(header::CONTENT_TYPE) {
            self = self.header("content-type", "application/json");
        }
        self
    }

    /// Raw body bytes (set the content type yourself).
    pub fn raw(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = Some(body.into());
        self
    }

    /// Sends it.
    pub async fn send(self) -> Resp {
        let mut builder = http::Request::builder().method(self.method.clone()).uri(&self.path);
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        let request = builder.body(self.body.map_or_else(Body::empty, Body::from)).expect("request");
        let response = self.router.clone().oneshot(request).await.expect("router is infallible");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        crate::contract::check(&self.method, &self.path, parts.status, &parts.headers, &body);
        Resp { status: parts.status, headers: parts.headers, body }
    }
}

/// An answer.
#[derive(Debug)]
pub struct Resp {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body bytes.
    pub body: Bytes,
}

impl Resp {
    /// The body as JSON (panics with the body when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// A header as a string.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Asserts the status, printing the body on mismatch, and returns self.
    #[track_caller]
    pub fn expect(self, status: u16) -> Self {
        assert_eq!(self.status.as_u16(), status, "unexpected status; body: {}", String::from_utf8_lossy(&self.body));
        self
    }

    /// Asserts a problem+json answer with this status and code; returns the problem.
    #[track_caller]
    pub fn problem(self, status: u16, code: &str) -> Value {
        let this = self.expect(status);
        assert_eq!(this.header("content-type"), Some("application/problem+json"), "content type");
        let problem = this.json();
        assert_eq!(problem["code"], code, "problem: {problem}");
        assert_eq!(problem["status"], status, "problem: {problem}");
        for field in ["type", "title", "detail", "instance", "request_id"] {
            assert!(problem[field].is_string(), "problem lacks {field}: {problem}");
        }
        assert_eq!(this.header("x-request-id"), problem["request_id"].as_str(), "request id echoed");
        problem
    }
}
