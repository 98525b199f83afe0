//! The one error of the domain and service layers. The API maps each variant to HTTP once.

use paddock_types::problem::FieldError;

/// Result with the domain [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, in terms a user of the API can act on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object does not exist, or belongs to another tenant (the two are indistinguishable).
    #[error("{kind} not found")]
    NotFound {
        /// Resource kind, e.g. `tenant`.
        kind: &'static str,
    },
    /// The caller's role may never do this.
    #[error("{0}")]
    Forbidden(String),
    /// Malformed request syntax that is not a body (a bad cursor, a bad header).
    #[error("{message}")]
    BadRequest {
        /// Stable code.
        code: &'static str,
        /// Readable message.
        message: String,
    },
    /// The body is not of an accepted media type (JSON or JSON merge patch).
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The body is larger than the limit.
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// One or more fields are invalid.
    #[error("the request has invalid fields")]
    Invalid(Vec<FieldError>),
    /// A value that breaks a rule of the resource with a code of its own (422, the field named in
    /// `errors`), such as a Slurm cluster's system pool.
    #[error("{message}")]
    Rule {
        /// Stable code.
        code: &'static str,
        /// The field.
        field: String,
        /// Readable message.
        message: String,
    },
    /// A conflict with the current state (a taken name, an object in use, a wrong state).
    #[error("{message}")]
    Conflict {
        /// Stable code.
        code: &'static str,
        /// Readable message.
        message: String,
    },
    /// A quota would be exceeded.
    #[error("{0}")]
    QuotaExceeded(String),
    /// The object existed and is gone for good (an expired one-time token).
    #[error("{message}")]
    Gone {
        /// Stable code.
        code: &'static str,
        /// Readable message.
        message: String,
    },
    /// `If-Match` does not match the current etag.
    #[error("{}", precondition_message(*current, *misquoted))]
    PreconditionFailed {
        /// The current generation.
        current: i64,
        /// The header named it, but weak (`W/"3"`) or unquoted (`3`): never a match.
        misquoted: bool,
    },
    /// The caller has as many of these requests running as it may (429 with `Retry-After`).
    #[error("{message}")]
    TooManyRequests {
        /// Stable code.
        code: &'static str,
        /// Readable message.
        message: String,
        /// Seconds the caller should wait before it retries.
        retry_after: u64,
    },
    /// A dependency (the database) is unavailable, or the process is draining.
    #[error("the service is temporarily unavailable")]
    Unavailable(#[source] Option<Box<dyn std::error::Error + Send + Sync>>),
    /// A bug or an unexpected failure; the cause is logged, never shown.
    #[error("internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl Error {
    /// A conflict with a stable code.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::Conflict { code, message: message.into() }
    }

    /// A broken rule of a field with its own stable code (422).
    pub fn rule(code: &'static str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Rule { code, field: field.into(), message: message.into() }
    }

    /// A single invalid field.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid(vec![FieldError { field: field.into(), message: message.into() }])
    }

    /// An internal error from any cause.
    pub fn internal(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Internal(source.into())
    }

    /// A copy of a refusal of the request itself (media type, size, syntax); other errors, which
    /// carry sources, become internal errors and are never copied this way.
    pub fn clone_refusal(&self) -> Self {
        match self {
            Self::UnsupportedMediaType(m) => Self::UnsupportedMediaType(m.clone()),
            Self::PayloadTooLarge { limit } => Self::PayloadTooLarge { limit: *limit },
            Self::BadRequest { code, message } => Self::BadRequest { code, message: message.clone() },
            other => Self::internal(other.to_string()),
        }
    }

    /// The stable snake_case code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound { .. } => "not_found",
            Self::Forbidden(_) => "forbidden",
            Self::BadRequest { code, .. }
            | Self::Conflict { code, .. }
            | Self::Rule { code, .. }
            | Self::Gone { code, .. }
            | Self::TooManyRequests { code, .. } => code,
            Self::Invalid(_) => "validation_failed",
            Self::UnsupportedMediaType(_) => "unsupported_media_type",
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::QuotaExceeded(_) => "quota_exceeded",
            Self::PreconditionFailed { .. } => "precondition_failed",
            Self::Unavailable(_) => "unavailable",
            Self::Internal(_) => "internal",
        }
    }
}

/// The text of [`Error::PreconditionFailed`].
fn precondition_message(current: i64, misquoted: bool) -> String {
    if misquoted {
        format!(
            "the object has not changed, but If-Match must name its etag strong and quoted: \"{current}\" \
             (a weak or unquoted tag never matches)"
        )
    } else {
        format!("the object changed: its etag is now \"{current}\"")
    }
}

/// The whole `source` chain of an error in one line (`outer: cause: root cause`), for the one log
/// line written where an error is handled.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        next = cause.source();
    }
    out
}
