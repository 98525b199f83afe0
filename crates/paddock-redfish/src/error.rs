//! `RedfishError`: what went wrong talking to a BMC, classified for the caller.
//!
//! Each variant's message describes only this level; the cause hangs off `#[source]`. The two
//! questions a reconcile step asks are answered by [`RedfishError::is_transient`] (retry later with
//! backoff, keep the phase) and [`RedfishError::code`] (a stable snake_case code for `last_error`).

use std::time::Duration;

/// A failed Redfish operation.
#[derive(Debug, thiserror::Error)]
pub enum RedfishError {
    /// The client configuration is unusable (caught before any request).
    #[error("invalid Redfish client configuration: {reason}")]
    Config {
        /// What is wrong.
        reason: String,
    },
    /// The CA certificate PEM could not be read.
    #[error("the BMC CA certificate is not valid PEM")]
    CaCert {
        /// The parse error.
        #[source]
        source: reqwest::Error,
    },
    /// The HTTP client could not be built from the configuration.
    #[error("could not build the HTTP client for the BMC")]
    ClientBuild {
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// No connection could be made (refused, unreachable, reset).
    #[error("cannot reach the BMC for {method} {path}")]
    Connect {
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The TLS handshake failed: the certificate is not trusted or does not name the host.
    #[error("TLS handshake with the BMC failed for {method} {path} (untrusted or mismatched certificate)")]
    Tls {
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The request (connect or response) did not finish in time.
    #[error("BMC request {method} {path} timed out")]
    Timeout {
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// 401 or 403: the credentials are wrong or lack the privilege. Never retried.
    #[error("the BMC refused the credentials ({status} on {path})")]
    AuthFailed {
        /// 401 or 403.
        status: u16,
        /// Request path.
        path: String,
    },
    /// The BMC does not offer what was asked: the action or value is not advertised, or the BMC
    /// answered 404/405/501 to it. Permanent for this BMC; never retried.
    #[error("the BMC does not support {what}")]
    CapabilityGap {
        /// The missing capability, e.g. `ComputerSystem.Reset with ResetType On`.
        what: String,
        /// The status that told us, if it came from an answer rather than the advertised actions.
        status: Option<u16>,
    },
    /// A resource the client followed a link to is missing.
    #[error("BMC resource {path} not found")]
    NotFound {
        /// Request path.
        path: String,
    },
    /// Any other non-success status.
    #[error("the BMC answered {status} to {method} {path}{}", message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Status {
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// HTTP status.
        status: u16,
        /// The Redfish error message (`error.message`), when there is one.
        message: Option<String>,
        /// `Retry-After`, when sent.
        retry_after: Option<Duration>,
    },
    /// The body is not the JSON shape Redfish promises.
    #[error("unexpected response body from {path}")]
    Decode {
        /// Request path.
        path: String,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The answer's body is larger than the client reads ([`RedfishConfig::max_body_bytes`]
    /// (crate::RedfishConfig::max_body_bytes)): it was cut off unread. Never retried.
    #[error("the BMC's answer to {method} {path} is larger than {limit} bytes")]
    BodyTooLarge {
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// The limit.
        limit: usize,
    },
    /// A resource lacks a property the operation needs.
    #[error("{path} lacks {property}")]
    Missing {
        /// Resource path.
        path: String,
        /// The property.
        property: String,
    },
    /// A link or `Location` header points to another host: it is not followed with our credentials.
    #[error("the BMC linked to {link}, outside {origin}")]
    ForeignLink {
        /// The link.
        link: String,
        /// Our BMC's origin.
        origin: String,
    },
    /// The service lists several systems and none was named: the API maps this to 422.
    #[error("the BMC lists {} systems; system_id must name one by Id or UUID", ids.len())]
    AmbiguousSystem {
        /// The `Id`s listed.
        ids: Vec<String>,
    },
    /// No system has the configured `Id` or `UUID`.
    #[error("the BMC has no system with Id or UUID {system_id:?}")]
    SystemNotFound {
        /// What was asked for.
        system_id: String,
        /// The `Id`s listed.
        available: Vec<String>,
    },
    /// The Systems collection is empty.
    #[error("the BMC lists no systems")]
    NoSystems,
    /// The system's UUID is not the one recorded for this machine: nothing destructive was sent.
    #[error("the BMC's system UUID is {}, expected {expected}", actual.as_deref().unwrap_or("not reported"))]
    UuidMismatch {
        /// The recorded UUID.
        expected: String,
        /// What the BMC reports (None: no UUID at all).
        actual: Option<String>,
    },
    /// The named virtual media device does not exist.
    #[error("the BMC has no virtual media device {device:?}")]
    NoSuchVirtualMedia {
        /// The device asked for.
        device: String,
        /// The devices listed.
        available: Vec<String>,
    },
    /// The BMC cannot hold the image (a CD) and the seed (a second device) at once.
    #[error("the BMC offers {} usable virtual media device(s) ({}); a boot needs a CD for the image and a second device for the seed", usable.len(), if usable.is_empty() { "none".to_owned() } else { usable.join(", ") })]
    NoSecondVirtualMedia {
        /// The `Id`s of the usable devices.
        usable: Vec<String>,
    },
    /// The power state did not reach the wanted one in time (the reset was sent, and re-sent once).
    #[error("the system did not reach power state {wanted} within {}s (last seen: {})", timeout.as_secs(), last.as_deref().unwrap_or("unknown"))]
    PowerTimeout {
        /// The wanted state.
        wanted: String,
        /// The last `PowerState` read.
        last: Option<String>,
        /// The configured deadline.
        timeout: Duration,
    },
    /// A task monitor did not finish in time. The caller may resume with `wait_task(task_uri)`.
    #[error("BMC task {task_uri} did not finish within {}s", timeout.as_secs())]
    TaskTimeout {
        /// The task monitor path.
        task_uri: String,
        /// The configured deadline.
        timeout: Duration,
    },
    /// A task ended in a failed state.
    #[error("BMC task {task_uri} ended in state {state}{}", message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    TaskFailed {
        /// The task monitor path.
        task_uri: String,
        /// `TaskState` (`Exception`, `Killed`, `Cancelled`) or `TaskStatus`.
        state: String,
        /// The first message of the task, if any.
        message: Option<String>,
    },
    /// The BMC accepted a change but does not show it afterwards.
    #[error("the BMC accepted {what} but does not show it applied")]
    NotApplied {
        /// The change.
        what: String,
    },
    /// An insert of virtual media got no answer (it timed out, or the connection was lost after
    /// it was sent) and the device does not show the image yet: the BMC may still be fetching
    /// it. The insert is not sent again before the insert timeout has passed since; try later.
    #[error("the BMC has not shown the media inserted into {device} yet, {waited:?} after its insert went unanswered")]
    InsertUnconfirmed {
        /// The virtual media device.
        device: String,
        /// Time since the insert's answer failed to come.
        waited: Duration,
        /// Why the insert got no answer, when this call sent it.
        #[source]
        source: Option<Box<RedfishError>>,
    },
}

impl RedfishError {
    /// Whether trying again later may succeed without anyone changing anything: network trouble,
    /// timeouts, 5xx (but 501), 429, 408, 409 and 412, and deadlines of power and task waits.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Connect { .. } | Self::Timeout { .. } => true,
            Self::Status { status, .. } => status_is_transient(*status),
            Self::PowerTimeout { .. }
            | Self::TaskTimeout { .. }
            | Self::NotApplied { .. }
            | Self::InsertUnconfirmed { .. } => true,
            Self::Config { .. }
            | Self::CaCert { .. }
            | Self::ClientBuild { .. }
            | Self::Tls { .. }
            | Self::AuthFailed { .. }
            | Self::CapabilityGap { .. }
            | Self::NotFound { .. }
            | Self::Decode { .. }
            | Self::BodyTooLarge { .. }
            | Self::Missing { .. }
            | Self::ForeignLink { .. }
            | Self::AmbiguousSystem { .. }
            | Self::SystemNotFound { .. }
            | Self::NoSystems
            | Self::UuidMismatch { .. }
            | Self::NoSuchVirtualMedia { .. }
            | Self::NoSecondVirtualMedia { .. }
            | Self::TaskFailed { .. } => false,
        }
    }

    /// Whether the request may have reached the BMC although no answer came: a timeout or a
    /// connection lost after the request was sent (not one that never connected).
    pub fn may_have_reached_the_bmc(&self) -> bool {
        match self {
            Self::Timeout { source, .. } | Self::Connect { source, .. } => !source.is_connect(),
            _ => false,
        }
    }

    /// The wait the BMC asked for with `Retry-After`, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// A stable snake_case code for `last_error.code` and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Config { .. } | Self::CaCert { .. } | Self::ClientBuild { .. } => "bmc_config_invalid",
            Self::Connect { .. } => "bmc_unreachable",
            Self::Tls { .. } => "bmc_tls_failed",
            Self::Timeout { .. } => "bmc_timeout",
            Self::AuthFailed { .. } => "bmc_auth_failed",
            Self::CapabilityGap { .. } => "bmc_capability_gap",
            Self::NotFound { .. } => "bmc_resource_not_found",
            Self::Status { .. } => "bmc_error_status",
            Self::Decode { .. } | Self::BodyTooLarge { .. } | Self::Missing { .. } | Self::ForeignLink { .. } => {
                "bmc_bad_response"
            }
            Self::AmbiguousSystem { .. } => "bmc_system_ambiguous",
            Self::SystemNotFound { .. } | Self::NoSystems => "bmc_system_not_found",
            Self::UuidMismatch { .. } => "bmc_uuid_mismatch",
            Self::NoSuchVirtualMedia { .. } => "bmc_no_such_virtual_media",
            Self::NoSecondVirtualMedia { .. } => "no_second_virtual_media",
            Self::PowerTimeout { .. } => "bmc_power_timeout",
            Self::TaskTimeout { .. } => "bmc_task_timeout",
            Self::TaskFailed { .. } => "bmc_task_failed",
            Self::NotApplied { .. } => "bmc_change_not_applied",
            Self::InsertUnconfirmed { .. } => "bmc_media_insert_unconfirmed",
        }
    }
}

impl RedfishError {
    /// The error with `scrub` applied to every text that may carry what the BMC echoed of a
    /// request (its messages) or what we named (paths, capabilities): used for requests that
    /// carry a secret URL, so that neither the error nor its `Display` can leak it.
    pub(crate) fn scrubbed(self, scrub: &dyn Fn(&str) -> String) -> Self {
        let opt = |m: Option<String>| m.map(|m| scrub(&m));
        match self {
            Self::Status { method, path, status, message, retry_after } => {
                Self::Status { method, path: scrub(&path), status, message: opt(message), retry_after }
            }
            Self::TaskFailed { task_uri, state, message } => {
                Self::TaskFailed { task_uri: scrub(&task_uri), state: scrub(&state), message: opt(message) }
            }
            Self::CapabilityGap { what, status } => Self::CapabilityGap { what: scrub(&what), status },
            Self::NotApplied { what } => Self::NotApplied { what: scrub(&what) },
            Self::NotFound { path } => Self::NotFound { path: scrub(&path) },
            Self::Missing { path, property } => Self::Missing { path: scrub(&path), property },
            Self::ForeignLink { link, origin } => Self::ForeignLink { link: scrub(&link), origin },
            Self::TaskTimeout { task_uri, timeout } => Self::TaskTimeout { task_uri: scrub(&task_uri), timeout },
            Self::AuthFailed { status, path } => Self::AuthFailed { status, path: scrub(&path) },
            // The rest name only our own paths, settings and the BMC's identity.
            other => other,
        }
    }
}

/// Statuses worth another try later (501 is a capability answer, not an outage).
pub(crate) fn status_is_transient(status: u16) -> bool {
    matches!(status, 408 | 409 | 412 | 429) || ((500..600).contains(&status) && status != 501)
}

/// Statuses the transport retries in place (409/412 need the caller to re-read first).
pub(crate) fn status_is_retried(status: u16) -> bool {
    status == 429 || status == 408 || ((500..600).contains(&status) && status != 501)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified() {
        for s in [500, 502, 503, 504, 429, 408] {
            assert!(status_is_transient(s) && status_is_retried(s), "{s}");
        }
        for s in [409, 412] {
            assert!(status_is_transient(s) && !status_is_retried(s), "{s}");
        }
        for s in [400, 401, 403, 404, 405, 501] {
            assert!(!status_is_transient(s) && !status_is_retried(s), "{s}");
        }
    }

    #[test]
    fn auth_failure_and_capability_gap_are_permanent_with_stable_codes() {
        let auth = RedfishError::AuthFailed { status: 401, path: "/redfish/v1/Systems".into() };
        assert!(!auth.is_transient());
        assert_eq!(auth.code(), "bmc_auth_failed");
        let gap = RedfishError::CapabilityGap { what: "x".into(), status: Some(501) };
        assert!(!gap.is_transient());
        let busy = RedfishError::Status {
            method: "GET".into(),
            path: "/".into(),
            status: 503,
            message: None,
            retry_after: Some(Duration::from_secs(5)),
        };
        assert!(busy.is_transient());
        assert_eq!(busy.retry_after(), Some(Duration::from_secs(5)));
    }

    #[test]
    fn uuid_mismatch_message_names_both_sides() {
        let e = RedfishError::UuidMismatch { expected: "a".into(), actual: None };
        assert_eq!(e.to_string(), "the BMC's system UUID is not reported, expected a");
    }
}
