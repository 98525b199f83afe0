//! RFC 9457 problem details, the body of every error answer, and the one table of problem types.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An error answer (`application/problem+json`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// URI identifying the kind of problem.
    #[serde(rename = "type")]
    pub type_: String,
    /// Short summary, fixed per kind.
    pub title: String,
    /// HTTP status code.
    pub status: u16,
    /// What went wrong in this occurrence; safe to show to a user.
    pub detail: String,
    /// The request path.
    pub instance: String,
    /// Stable snake_case code, for programs.
    pub code: String,
    /// Id of the request, also in the `x-request-id` header and in the server's logs.
    pub request_id: String,
    /// Per-field validation errors (422 only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
}

/// One invalid field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FieldError {
    /// Path of the field, dotted (`quotas.max_nodes`, `bmc.url`).
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

/// Base of the problem type URIs: a problem's `type` is this followed by its kind's slug.
pub const PROBLEM_BASE: &str = "https://paddock.dev/problems/";

/// One kind of problem: the last segment of its `type` URI and its fixed `title`. Every kind
/// paddock answers or records is one of the constants below: the one table of problem types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProblemType {
    /// The `type` URI's last segment.
    pub slug: &'static str,
    /// The fixed `title`.
    pub title: &'static str,
}

impl ProblemType {
    /// The `type` URI.
    pub fn uri(&self) -> String {
        format!("{PROBLEM_BASE}{}", self.slug)
    }
}

const fn kind(slug: &'static str, title: &'static str) -> ProblemType {
    ProblemType { slug, title }
}

/// A resource or route that does not exist (or is another tenant's).
pub const NOT_FOUND: ProblemType = kind("not-found", "Not found");
/// The caller may not do this.
pub const FORBIDDEN: ProblemType = kind("forbidden", "Forbidden");
/// A malformed request.
pub const BAD_REQUEST: ProblemType = kind("bad-request", "Bad request");
/// A well-formed request with invalid fields.
pub const VALIDATION: ProblemType = kind("validation", "Invalid request");
/// A body of a content type the route does not take.
pub const UNSUPPORTED_MEDIA_TYPE: ProblemType = kind("unsupported-media-type", "Unsupported media type");
/// A body over the route's size limit.
pub const PAYLOAD_TOO_LARGE: ProblemType = kind("payload-too-large", "Payload too large");
/// The request conflicts with the resource's state.
pub const CONFLICT: ProblemType = kind("conflict", "Conflict");
/// A quota would be exceeded.
pub const QUOTA_EXCEEDED: ProblemType = kind("quota-exceeded", "Quota exceeded");
/// The resource existed and is gone for good.
pub const GONE: ProblemType = kind("gone", "Gone");
/// An `If-Match` precondition did not hold.
pub const PRECONDITION_FAILED: ProblemType = kind("precondition-failed", "Precondition failed");
/// Too many requests of this kind.
pub const TOO_MANY_REQUESTS: ProblemType = kind("too-many-requests", "Too many requests");
/// The caller sent more than its rate allows.
pub const RATE_LIMITED: ProblemType = kind("rate-limited", "Too many requests");
/// The service cannot answer for now.
pub const UNAVAILABLE: ProblemType = kind("unavailable", "Service unavailable");
/// A bug.
pub const INTERNAL: ProblemType = kind("internal", "Internal error");
/// No usable credentials.
pub const UNAUTHENTICATED: ProblemType = kind("unauthenticated", "Unauthenticated");
/// The route exists without this method.
pub const METHOD_NOT_ALLOWED: ProblemType = kind("method-not-allowed", "Method not allowed");
/// An idempotency key used again with another body.
pub const IDEMPOTENCY_KEY_REUSED: ProblemType = kind("idempotency-key-reused", "Idempotency key reused");
/// An operation whose job failed permanently.
pub const OPERATION_FAILED: ProblemType = kind("operation-failed", "Operation failed");
/// An operation whose job ran out of attempts.
pub const RETRIES_EXHAUSTED: ProblemType = kind("retries-exhausted", "Retries exhausted");
