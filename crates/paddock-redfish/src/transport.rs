//! HTTP to one BMC: basic auth, TLS trust, timeouts, retries with capped backoff that honour
//! `Retry-After`, the per-host bound, and `202 Accepted` task monitors.
//!
//! Invariants:
//! - Only links on the BMC's own origin are followed (links, `Location`, redirects), so the
//!   credentials never travel to another host.
//! - 401/403 and capability answers (404/405/501 on a change) are never retried.
//! - One HTTP attempt holds one host permit; the wait between attempts holds none.
//! - A change sent [`Sending::Once`] is sent again only when it surely never reached the BMC (no
//!   connection) or the BMC answered that it did not take it (a retryable status); a timeout
//!   or a connection lost after sending ends the call at once.

use std::io;
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, HeaderValue, ETAG, IF_MATCH, LOCATION, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use tracing::{debug, warn};
use url::Url;

use crate::config::{Backoff, Password, RedfishConfig, TaskPolicy};
use crate::error::{status_is_retried, RedfishError};
use crate::limiter::BmcLimiter;
use crate::model::{ErrorBody, TaskRes};
use crate::redact::Redactor;

/// A final (not retried) answer.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub path: String,
}

impl Reply {
    fn etag(&self) -> Option<String> {
        self.headers.get(ETAG).and_then(|v| v.to_str().ok()).map(str::to_owned)
    }

    fn retry_after(&self) -> Option<Duration> {
        parse_retry_after(self.headers.get(RETRY_AFTER)?, chrono::Utc::now())
    }

    /// The Redfish error message of an error body, if any.
    fn message(&self) -> Option<String> {
        let body: ErrorBody = serde_json::from_slice(&self.body).ok()?;
        body.error.extended.into_iter().find_map(|m| m.message).or(body.error.message)
    }

    fn status_error(&self, method: &Method) -> RedfishError {
        RedfishError::Status {
            method: method.to_string(),
            path: self.path.clone(),
            status: self.status.as_u16(),
            message: self.message(),
            retry_after: self.retry_after(),
        }
    }
}

/// How the request of a change is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sending {
    /// With the client's timeout, sent again after any failure that may be transient.
    Retried,
    /// With this timeout, and never sent again once it may have reached the BMC: for a change
    /// the BMC carries out inside the request at a cost (an insert of virtual media, which many
    /// BMCs fetch whole before they answer).
    Once(Duration),
}

/// The HTTP side of a [`RedfishClient`](crate::RedfishClient).
#[derive(Debug)]
pub(crate) struct Transport {
    http: reqwest::Client,
    origin: Url,
    username: String,
    password: Password,
    retries: u32,
    backoff: Backoff,
    task: TaskPolicy,
    host_key: String,
    max_body_bytes: usize,
    limiter: Option<BmcLimiter>,
}

impl Transport {
    pub(crate) fn new(config: &RedfishConfig) -> Result<Self, RedfishError> {
        config.validate()?;
        let mut origin = config.url.clone();
        origin.set_path("/");
        origin.set_query(None);
        origin.set_fragment(None);

        let redirect_origin = origin.clone();
        let mut builder = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout)
            .user_agent(concat!("paddock-redfish/", env!("CARGO_PKG_VERSION")))
            // Redirects (e.g. a system addressed by name) are followed on our origin only.
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() >= 5 {
                    attempt.error("too many redirects")
                } else if same_origin(attempt.url(), &redirect_origin) {
                    attempt.follow()
                } else {
                    attempt.stop()
                }
            }));
        if let Some(pem) = &config.ca_cert_pem {
            // Only the machine's CA is trusted: the public roots could vouch for any certificate.
            let certs = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
                .map_err(|source| RedfishError::CaCert { source })?;
            if certs.is_empty() {
                return Err(RedfishError::Config { reason: "ca_cert_pem holds no certificate".into() });
            }
            builder = builder.tls_built_in_root_certs(false);
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        if config.insecure_tls {
            builder = builder.danger_accept_invalid_certs(true);
        }
        let http = builder.build().map_err(|source| RedfishError::ClientBuild { source })?;
        Ok(Self {
            http,
            origin,
            username: config.username.clone(),
            password: config.password.clone(),
            retries: config.retries,
            backoff: config.backoff,
            task: config.task,
            host_key: config.host_key(),
            max_body_bytes: config.max_body_bytes,
            limiter: None,
        })
    }

    pub(crate) fn set_limiter(&mut self, limiter: BmcLimiter) {
        self.limiter = Some(limiter);
    }

    pub(crate) fn host_key(&self) -> &str {
        &self.host_key
    }

    /// Resolves a link (`@odata.id`, `target`, `Location`) against the BMC, refusing other hosts.
    pub(crate) fn resolve(&self, link: &str) -> Result<Url, RedfishError> {
        let url = self.origin.join(link).map_err(|_| RedfishError::ForeignLink {
            link: link.to_owned(),
            origin: self.origin.as_str().to_owned(),
        })?;
        if !same_origin(&url, &self.origin) {
            return Err(RedfishError::ForeignLink { link: link.to_owned(), origin: self.origin.as_str().to_owned() });
        }
        Ok(url)
    }

    /// GET and decode a resource. 404 is `NotFound`, 501 a `CapabilityGap`.
    pub(crate) async fn get<T: DeserializeOwned>(&self, link: &str) -> Result<T, RedfishError> {
        Ok(self.get_tagged(link).await?.0)
    }

    /// GET and decode a resource, with its `ETag` (for `If-Match` on a following PATCH).
    pub(crate) async fn get_tagged<T: DeserializeOwned>(
        &self,
        link: &str,
    ) -> Result<(T, Option<String>), RedfishError> {
        let url = self.resolve(link)?;
        let reply = self.exchange(Method::GET, url, None, None, Sending::Retried, None).await?;
        match reply.status.as_u16() {
            200..=299 => {
                let value = serde_json::from_slice(&reply.body)
                    .map_err(|source| RedfishError::Decode { path: reply.path.clone(), source })?;
                Ok((value, reply.etag()))
            }
            404 => Err(RedfishError::NotFound { path: reply.path }),
            501 => Err(RedfishError::CapabilityGap { what: format!("GET {}", reply.path), status: Some(501) }),
            _ => Err(reply.status_error(&Method::GET)),
        }
    }

    /// A change (POST action or PATCH): follows a task monitor when answered 202. `what` names the
    /// capability for the `CapabilityGap` that 404/405/501 mean here.
    pub(crate) async fn change(
        &self,
        method: Method,
        link: &str,
        body: &serde_json::Value,
        if_match: Option<&str>,
        what: &str,
    ) -> Result<(), RedfishError> {
        self.change_inner(method, link, body, if_match, what, Sending::Retried, None).await
    }

    /// A change sent as `sending` says, its answers scrubbed with `redact` when given.
    #[expect(clippy::too_many_arguments, reason = "the request, how it is sent and what to scrub")]
    pub(crate) async fn change_sent(
        &self,
        method: Method,
        link: &str,
        body: &serde_json::Value,
        if_match: Option<&str>,
        what: &str,
        sending: Sending,
        redact: Option<&Redactor>,
    ) -> Result<(), RedfishError> {
        match redact {
            Some(r) => self
                .change_inner(method, link, body, if_match, what, sending, Some(r))
                .await
                .map_err(|e| e.scrubbed(&|text: &str| r.scrub(text))),
            None => self.change_inner(method, link, body, if_match, what, sending, None).await,
        }
    }

    #[expect(clippy::too_many_arguments, reason = "the request, how it is sent and what to scrub")]
    async fn change_inner(
        &self,
        method: Method,
        link: &str,
        body: &serde_json::Value,
        if_match: Option<&str>,
        what: &str,
        sending: Sending,
        redact: Option<&Redactor>,
    ) -> Result<(), RedfishError> {
        let url = self.resolve(link)?;
        let reply = self.exchange(method.clone(), url, Some(body), if_match, sending, redact).await?;
        match reply.status.as_u16() {
            202 => match reply.headers.get(LOCATION).and_then(|v| v.to_str().ok()) {
                Some(location) => {
                    let location = location.to_owned();
                    debug!(bmc.host = %self.host_key, task.uri = %location, "{what}: accepted, following task monitor {location}");
                    // The Task resource the 202 carries, if any: read at the end when the
                    // monitor's last answer does not say how the task ended (e.g. bmcweb's 204).
                    let task = serde_json::from_slice::<TaskRes>(&reply.body).ok().and_then(|t| t.odata_id);
                    self.wait_task_from(&location, reply.retry_after(), task.as_deref()).await
                }
                // Accepted without a monitor: the caller verifies the postcondition by reading.
                None => Ok(()),
            },
            200..=299 => Ok(()),
            404 | 405 | 501 => {
                Err(RedfishError::CapabilityGap { what: what.to_owned(), status: Some(reply.status.as_u16()) })
            }
            _ => Err(reply.status_error(&method)),
        }
    }

    /// Polls a task monitor until the task ends.
    pub(crate) async fn wait_task(&self, task_uri: &str) -> Result<(), RedfishError> {
        self.wait_task_from(task_uri, None, None).await
    }

    /// Polls the monitor `task_uri` until the task ends. When its last answer is a success that
    /// does not carry the Task, the Task resource `task` (if known) is read for how it ended.
    async fn wait_task_from(
        &self,
        task_uri: &str,
        first_wait: Option<Duration>,
        task: Option<&str>,
    ) -> Result<(), RedfishError> {
        let url = self.resolve(task_uri)?;
        let deadline = Instant::now() + self.task.timeout;
        let mut wait = first_wait.unwrap_or(self.task.poll_interval).min(self.backoff.max_retry_after);
        let timeout = || RedfishError::TaskTimeout { task_uri: task_uri.to_owned(), timeout: self.task.timeout };
        loop {
            if Instant::now() + wait > deadline {
                return Err(timeout());
            }
            tokio::time::sleep(wait).await;
            let reply = self.exchange(Method::GET, url.clone(), None, None, Sending::Retried, None).await?;
            wait = reply.retry_after().unwrap_or(self.task.poll_interval).min(self.backoff.max_retry_after);
            let status = reply.status.as_u16();
            if status == 202 {
                continue;
            }
            if !(200..300).contains(&status) {
                // The operation's own error answer, as the task monitor relays it.
                return Err(task_failed(task_uri, format!("HTTP {status}"), reply.message()));
            }
            // A monitor may answer with the Task resource itself (some BMCs always do).
            match serde_json::from_slice::<TaskRes>(&reply.body).ok().filter(|t| t.task_state.is_some()) {
                Some(answer) => match task_end(task_uri, answer) {
                    Some(end) => return end,
                    None => continue,
                },
                None => {
                    let Some(task) = task else { return Ok(()) };
                    // The monitor said it is over: a state that is not an end, or a Task the BMC
                    // no longer keeps, is taken as done.
                    return match self.get::<TaskRes>(task).await {
                        Ok(answer) => task_end(task_uri, answer).unwrap_or(Ok(())),
                        Err(RedfishError::NotFound { .. }) => Ok(()),
                        Err(e) => Err(e),
                    };
                }
            }
        }
    }

    /// Sends one request, retrying connection errors, timeouts and retryable statuses (only what
    /// never reached the BMC and retryable statuses when sent [`Sending::Once`]). Returns the
    /// first final answer; 401/403 become `AuthFailed`.
    async fn exchange(
        &self,
        method: Method,
        url: Url,
        body: Option<&serde_json::Value>,
        if_match: Option<&str>,
        sending: Sending,
        redact: Option<&Redactor>,
    ) -> Result<Reply, RedfishError> {
        let path = url.path().to_owned();
        let mut retry = 0u32;
        loop {
            let started = Instant::now();
            let outcome = {
                let _host = match &self.limiter {
                    Some(limiter) => Some(limiter.acquire_host(&self.host_key).await),
                    None => None,
                };
                self.send_once(&method, &url, body, if_match, sending).await
            };
            let elapsed_ms = started.elapsed().as_millis() as u64;
            let (error, wait) = match outcome {
                Ok(reply) => {
                    let status = reply.status.as_u16();
                    debug!(bmc.host = %self.host_key, http.method = %method, http.path = %path, http.status = status,
                        duration_ms = elapsed_ms, attempt = retry + 1, "BMC {method} {path}: {status}");
                    if status == 401 || status == 403 {
                        return Err(RedfishError::AuthFailed { status, path });
                    }
                    if !status_is_retried(status) {
                        return Ok(reply);
                    }
                    let retry_after = reply.retry_after();
                    let error = reply.status_error(&method);
                    if let Some(asked) = retry_after {
                        // A wait longer than we are willing to block goes back to the caller.
                        if asked > self.backoff.max_retry_after {
                            return Err(error);
                        }
                    }
                    let wait = self.backoff.delay(retry).max(retry_after.unwrap_or_default());
                    (error, wait)
                }
                Err(Failure::TooLarge) => {
                    let (method, path, limit) = (method.to_string(), path, self.max_body_bytes);
                    return Err(RedfishError::BodyTooLarge { method, path, limit });
                }
                Err(Failure::Http(source)) => {
                    // A request that may have reached the BMC is not sent again when once is all
                    // it may be sent: the caller reads what became of it.
                    let unsent = source.is_connect();
                    let error = classify(&method, &path, source);
                    if matches!(error, RedfishError::Tls { .. }) || (sending != Sending::Retried && !unsent) {
                        return Err(error);
                    }
                    (error, self.backoff.delay(retry))
                }
            };
            if retry >= self.retries {
                return Err(error);
            }
            retry += 1;
            let shown = match redact {
                Some(r) => r.scrub(&chain(&error)),
                None => chain(&error),
            };
            warn!(bmc.host = %self.host_key, http.method = %method, http.path = %path, attempt = retry,
                wait_ms = wait.as_millis() as u64, error = %shown, "BMC {method} {path} failed, retrying in {wait:?}");
            tokio::time::sleep(wait).await;
        }
    }

    async fn send_once(
        &self,
        method: &Method,
        url: &Url,
        body: Option<&serde_json::Value>,
        if_match: Option<&str>,
        sending: Sending,
    ) -> Result<Reply, Failure> {
        let mut request = self.http.request(method.clone(), url.clone()).header("OData-Version", "4.0");
        if let Sending::Once(timeout) = sending {
            request = request.timeout(timeout);
        }
        if !self.username.is_empty() {
            request = request.basic_auth(&self.username, Some(self.password.expose()));
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        if let Some(tag) = if_match.and_then(|t| HeaderValue::from_str(t).ok()) {
            request = request.header(IF_MATCH, tag);
        }
        let mut response = request.send().await?;
        let status = response.status();
        let headers = response.headers().clone();
        let path = response.url().path().to_owned();
        // Read up to the limit and no further, whatever `Content-Length` claims (it may lie, or
        // be missing with a chunked body).
        let limit = self.max_body_bytes;
        if response.content_length().is_some_and(|n| n > limit as u64) {
            return Err(Failure::TooLarge);
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await? {
            if body.len() + chunk.len() > limit {
                return Err(Failure::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Reply { status, headers, body, path })
    }
}

/// Why one attempt got no answer to use.
enum Failure {
    /// The request or the answer failed in transit.
    Http(reqwest::Error),
    /// The answer's body is over the limit (dropped: the connection is not reused).
    TooLarge,
}

impl From<reqwest::Error> for Failure {
    fn from(e: reqwest::Error) -> Self {
        Self::Http(e)
    }
}

/// An error and its causes on one line, for the log line that handles it.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

/// Same scheme, host and port.
fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme() && a.host_str() == b.host_str() && a.port_or_known_default() == b.port_or_known_default()
}

/// Maps a transport error: timeouts, TLS handshake failures (not retried), other connection errors.
fn classify(method: &Method, path: &str, source: reqwest::Error) -> RedfishError {
    let (method, path) = (method.to_string(), path.to_owned());
    if source.is_timeout() {
        return RedfishError::Timeout { method, path, source };
    }
    if is_tls_failure(&source) {
        return RedfishError::Tls { method, path, source };
    }
    RedfishError::Connect { method, path, source }
}

/// rustls reports handshake and certificate failures as an `io::Error` of kind `InvalidData`
/// (wrapping the `rustls::Error`) in the connect error's chain, e.g.
/// `hyper_util Error(Connect, io(Other, io(InvalidData, InvalidCertificate(UnknownIssuer))))`;
/// a refused or reset connection has another kind.
fn is_tls_failure(error: &reqwest::Error) -> bool {
    if !error.is_connect() {
        return false;
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        cause = match e.downcast_ref::<io::Error>() {
            Some(io) if io.kind() == io::ErrorKind::InvalidData => return true,
            // `io::Error::source` skips the wrapped error itself; descend into it explicitly.
            Some(io) => match io.get_ref() {
                Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
                None => e.source(),
            },
            None => e.source(),
        };
    }
    false
}

/// `Retry-After` as seconds or an HTTP date (a date in the past means "now").
pub(crate) fn parse_retry_after(value: &HeaderValue, now: chrono::DateTime<chrono::Utc>) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = chrono::DateTime::parse_from_rfc2822(text).ok()?;
    Some((at.with_timezone(&chrono::Utc) - now).to_std().unwrap_or_default())
}

fn task_failed(task_uri: &str, state: String, message: Option<String>) -> RedfishError {
    RedfishError::TaskFailed { task_uri: task_uri.to_owned(), state, message }
}

/// How a task ended, from its Task resource; `None` while it runs.
fn task_end(task_uri: &str, task: TaskRes) -> Option<Result<(), RedfishError>> {
    let TaskRes { task_state, task_status, messages, .. } = task;
    let state = task_state.unwrap_or_default();
    let message = messages.into_iter().find_map(|m| m.message);
    match state.as_str() {
        "Completed" if task_status.as_deref() == Some("Critical") => {
            Some(Err(task_failed(task_uri, "Critical".into(), message)))
        }
        "Completed" => Some(Ok(())),
        "Exception" | "Killed" | "Cancelled" => Some(Err(task_failed(task_uri, state, message))),
        // New, Starting, Running, Pending, Suspended, Stopping, Service, Interrupted, ...
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_and_http_dates() {
        let now =
            chrono::DateTime::parse_from_rfc3339("2015-10-21T07:28:00Z").expect("date").with_timezone(&chrono::Utc);
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(parse_retry_after(&v("3"), now), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after(&v("Wed, 21 Oct 2015 07:28:30 GMT"), now), Some(Duration::from_secs(30)));
        assert_eq!(parse_retry_after(&v("Wed, 21 Oct 2015 07:27:00 GMT"), now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after(&v("soon"), now), None);
    }

    #[test]
    fn links_to_other_hosts_are_refused() {
        let config =
            RedfishConfig::new(Url::parse("https://bmc.example:8443/redfish").expect("url"), "", Password::new(""));
        let t = Transport::new(&config).expect("transport");
        assert_eq!(
            t.resolve("/redfish/v1/Systems/1").expect("own link").as_str(),
            "https://bmc.example:8443/redfish/v1/Systems/1"
        );
        assert!(t.resolve("https://bmc.example:8443/redfish/v1/TaskMonitors/1").is_ok());
        assert!(matches!(t.resolve("https://evil.example/redfish/v1/"), Err(RedfishError::ForeignLink { .. })));
        assert!(matches!(t.resolve("http://bmc.example:8443/x"), Err(RedfishError::ForeignLink { .. })));
    }
}
