//! Per-BMC client settings: endpoint, system selection, credentials, TLS trust, timeouts, retry and
//! polling policies. Every duration has a default that suits a real BMC; tests shorten them.

use std::time::Duration;

use url::Url;

use crate::error::RedfishError;

/// A BMC password. `Debug` and `Display` print `[redacted]`, so it can sit in logged structs.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    /// Wraps a password.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The password itself; call only where the request is built.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::fmt::Display for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Capped exponential backoff between attempts of one HTTP request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Wait before the first retry; doubled on each further retry.
    pub initial: Duration,
    /// Upper bound of the computed wait.
    pub max: Duration,
    /// The longest `Retry-After` the client waits for in place. A longer one ends the call with a
    /// transient error carrying the wait, so the caller reschedules instead of blocking a worker.
    pub max_retry_after: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The computed wait before retry number `retry` (0 = first retry), without `Retry-After`.
    pub fn delay(&self, retry: u32) -> Duration {
        // 2^16 already exceeds any sane cap; clamping the shift keeps the multiplication finite.
        let factor = 1u32 << retry.min(16);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// How `power` waits for the wanted state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PowerPolicy {
    /// Give up (with a transient `PowerTimeout`) after this long.
    pub timeout: Duration,
    /// Wait between two reads of `PowerState`.
    pub poll_interval: Duration,
    /// When the machine still shows the opposite state this long after the `Reset`, the request
    /// is taken as lost and sent once more.
    pub reissue_after: Duration,
}

impl Default for PowerPolicy {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(120),
            poll_interval: Duration::from_secs(2),
            reissue_after: Duration::from_secs(30),
        }
    }
}

/// How a `202 Accepted` task monitor is followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskPolicy {
    /// Give up (with a transient `TaskTimeout` that names the monitor) after this long.
    pub timeout: Duration,
    /// Wait between polls when the BMC sends no `Retry-After`.
    pub poll_interval: Duration,
}

impl Default for TaskPolicy {
    fn default() -> Self {
        Self { timeout: Duration::from_secs(600), poll_interval: Duration::from_secs(2) }
    }
}

/// The default [`RedfishConfig::max_body_bytes`]: 4 MiB, far above any Redfish resource (a
/// Systems member with its inventory links is a few KiB; expanded collections stay under 1 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// The default [`RedfishConfig::insert_timeout`]: 10 minutes, enough for a BMC that fetches a
/// node OS image of about a gigabyte over a slow or busy link before it answers.
pub const DEFAULT_INSERT_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// Everything needed to talk to one BMC.
#[derive(Debug, Clone)]
pub struct RedfishConfig {
    /// Base URL of the BMC (`https://10.0.0.5` or `https://bmc.example:8443`); only scheme, host
    /// and port are used, every resource path comes from the service itself.
    pub url: Url,
    /// The system's `Id` or `UUID`; required when the service lists more than one system.
    pub system_id: Option<String>,
    /// Basic-auth user; empty means no `Authorization` header at all.
    pub username: String,
    /// Basic-auth password.
    pub password: Password,
    /// PEM of the CA (or CAs) that signed the BMC's certificate. When set, only these are trusted.
    pub ca_cert_pem: Option<String>,
    /// Accept any certificate. Explicit, and exclusive with `ca_cert_pem`.
    pub insecure_tls: bool,
    /// TCP + TLS connect timeout.
    pub connect_timeout: Duration,
    /// Timeout of one HTTP request, from send to the end of the body.
    pub request_timeout: Duration,
    /// Timeout of the request that inserts virtual media. Many BMCs (sushy-tools among them)
    /// fetch the whole image before they answer it, so it is far longer than `request_timeout`.
    /// The request is never sent again once it may have reached the BMC: another one would fetch
    /// the image again (see `RedfishClient::insert_media`).
    pub insert_timeout: Duration,
    /// The largest response body read; a larger one is cut off unread and the call fails
    /// (`BodyTooLarge`), so a broken or hostile BMC cannot make the worker hold its garbage.
    pub max_body_bytes: usize,
    /// Retries of one HTTP request after a connection error, a timeout, or a retryable status.
    pub retries: u32,
    /// Waits between retries.
    pub backoff: Backoff,
    /// Power convergence.
    pub power: PowerPolicy,
    /// Task monitors.
    pub task: TaskPolicy,
}

impl RedfishConfig {
    /// A config with the default timeouts and policies.
    pub fn new(url: Url, username: impl Into<String>, password: Password) -> Self {
        Self {
            url,
            system_id: None,
            username: username.into(),
            password,
            ca_cert_pem: None,
            insecure_tls: false,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            insert_timeout: DEFAULT_INSERT_TIMEOUT,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            retries: 3,
            backoff: Backoff::default(),
            power: PowerPolicy::default(),
            task: TaskPolicy::default(),
        }
    }

    /// Refuses settings that cannot work or would be unsafe.
    pub(crate) fn validate(&self) -> Result<(), RedfishError> {
        let invalid = |reason: &str| Err(RedfishError::Config { reason: reason.to_owned() });
        match self.url.scheme() {
            "http" | "https" => {}
            _ => return invalid("the BMC URL must be http:// or https://"),
        }
        if self.url.host_str().is_none() {
            return invalid("the BMC URL has no host");
        }
        if !self.url.username().is_empty() || self.url.password().is_some() {
            // Credentials in the URL would end up in logs and error messages.
            return invalid("the BMC URL must not carry credentials; use username/password");
        }
        if self.ca_cert_pem.is_some() && self.insecure_tls {
            return invalid("ca_cert_pem and insecure_tls exclude each other");
        }
        if self.username.contains(':') {
            return invalid("the BMC username must not contain ':'");
        }
        if self.max_body_bytes == 0 {
            return invalid("max_body_bytes must be positive");
        }
        if self.power.poll_interval.is_zero() || self.task.poll_interval.is_zero() {
            return invalid("poll intervals must be positive");
        }
        Ok(())
    }

    /// `host:port` of the BMC, the key of the per-host concurrency bound.
    pub fn host_key(&self) -> String {
        let host = self.url.host_str().unwrap_or_default();
        match self.url.port_or_known_default() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str) -> RedfishConfig {
        RedfishConfig::new(Url::parse(url).expect("url"), "admin", Password::new("s3cret"))
    }

    #[test]
    fn password_never_prints_itself() {
        let c = config("https://bmc.example");
        let shown = format!("{c:?} {}", c.password);
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("[redacted]"));
    }

    #[test]
    fn host_key_includes_the_default_port() {
        assert_eq!(config("https://bmc.example").host_key(), "bmc.example:443");
        assert_eq!(config("http://127.0.0.1:8000/").host_key(), "127.0.0.1:8000");
    }

    #[test]
    fn unsafe_or_contradictory_settings_are_refused() {
        let mut c = config("https://admin:pw@bmc.example");
        assert!(c.validate().is_err());
        c = config("ftp://bmc.example");
        assert!(c.validate().is_err());
        c = config("https://bmc.example");
        c.insecure_tls = true;
        c.ca_cert_pem = Some("pem".into());
        assert!(c.validate().is_err());
        c.ca_cert_pem = None;
        assert!(c.validate().is_ok());
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let b = Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(1), ..Backoff::default() };
        assert_eq!(b.delay(0), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(400));
        assert_eq!(b.delay(10), Duration::from_secs(1));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
    }
}
