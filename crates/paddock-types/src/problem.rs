//! RFC 9457 problem details, the body of every error answer.

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
