//! The JWKS key source: fetch, parse, cache, and refresh (periodic, on demand, rate-limited).
//!
//! The cache is an immutable [`Snapshot`] behind an `RwLock<Arc<_>>`, so verification only
//! clones an `Arc`. Fetches are serialised by an async mutex: a caller that waited for the lock
//! while another caller fetched sees that the attempt counter moved and uses that result instead
//! of fetching again, so any number of concurrent callers share one fetch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use serde_json::Value;
use url::Url;

use crate::der;
use crate::error::AuthConfigError;
use crate::keys::VerifyKey;

/// Largest JWKS document accepted.
const MAX_JWKS_BYTES: usize = 1024 * 1024;
/// Connect timeout of a JWKS fetch.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Total timeout of a JWKS fetch.
const TOTAL_TIMEOUT: Duration = Duration::from_secs(10);

/// base64url that tolerates padding, since some identity providers pad JWK members.
const B64URL: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The JWKS state at one moment. Replaced wholesale, never mutated.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// Usable keys from the last successful fetch (kept when a later fetch fails).
    pub(crate) keys: Vec<VerifyKey>,
    /// Number of fetch attempts so far; lets waiting callers see that someone else fetched.
    attempts: u64,
    /// When the last attempt started.
    last_attempt: Option<Instant>,
    /// When the last successful fetch completed.
    loaded_at: Option<Instant>,
    /// Whether the last attempt succeeded.
    pub(crate) healthy: bool,
}

/// Why a fetch failed. Logged, never shown to clients.
#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("requesting the JWKS")]
    Request {
        #[source]
        source: reqwest::Error,
    },
    #[error("the JWKS endpoint answered HTTP {0}")]
    Status(u16),
    #[error("the JWKS document is larger than {MAX_JWKS_BYTES} bytes")]
    TooLarge,
    #[error("the JWKS document is not a JSON object with a `keys` array")]
    Json {
        #[source]
        source: serde_json::Error,
    },
}

/// A JWKS endpoint and its cached keys.
pub(crate) struct Jwks {
    url: Url,
    client: reqwest::Client,
    refresh_every: Duration,
    min_interval: Duration,
    snapshot: RwLock<Arc<Snapshot>>,
    fetch_lock: tokio::sync::Mutex<()>,
    background_running: AtomicBool,
}

impl Jwks {
    /// Checks the URL and builds the HTTP client; does not fetch. The keys decide who is who, so
    /// they come over https (plain http only from this host) and redirects are not followed: a
    /// redirect could lead the fetch anywhere, plain http included.
    pub(crate) fn new(url: Url, refresh_every: Duration, min_interval: Duration) -> Result<Self, AuthConfigError> {
        let loopback = match url.host() {
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
            None => false,
        };
        if !(url.scheme() == "https" || (url.scheme() == "http" && loopback)) {
            return Err(AuthConfigError::JwksUrlScheme { scheme: url.scheme().to_owned() });
        }
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(TOTAL_TIMEOUT)
            .build()
            .map_err(|source| AuthConfigError::HttpClient { source })?;
        Ok(Self {
            url,
            client,
            refresh_every,
            min_interval,
            snapshot: RwLock::new(Arc::new(Snapshot::default())),
            fetch_lock: tokio::sync::Mutex::new(()),
            background_running: AtomicBool::new(false),
        })
    }

    /// The URL without credentials or query, for logs.
    fn display_url(&self) -> String {
        format!(
            "{}://{}{}",
            self.url.scheme(),
            self.url.host_str().unwrap_or(""),
            self.url.port().map(|p| format!(":{p}")).unwrap_or_default()
        ) + self.url.path()
    }

    /// Returns the current snapshot.
    pub(crate) fn snapshot(&self) -> Arc<Snapshot> {
        // A poisoned lock only means a panic elsewhere while swapping an Arc; the value is intact.
        Arc::clone(&self.snapshot.read().unwrap_or_else(|e| e.into_inner()))
    }

    fn store(&self, snapshot: Snapshot) -> Arc<Snapshot> {
        let snapshot = Arc::new(snapshot);
        *self.snapshot.write().unwrap_or_else(|e| e.into_inner()) = Arc::clone(&snapshot);
        snapshot
    }

    /// Fetches the key set unless a fetch happened while we waited or within the minimum
    /// interval; returns the snapshot to use either way.
    pub(crate) async fn refresh(&self) -> Arc<Snapshot> {
        let seen = self.snapshot().attempts;
        let _guard = self.fetch_lock.lock().await;
        let current = self.snapshot();
        if current.attempts != seen {
            // Another caller fetched while we waited for the lock: share its result.
            return current;
        }
        if current.last_attempt.is_some_and(|at| at.elapsed() < self.min_interval) {
            // Rate limit: a flood of tokens with unknown kids must not become a flood of fetches.
            return current;
        }
        let started = Instant::now();
        let result = self.fetch().await;
        let next = match result {
            Ok(keys) => {
                tracing::debug!(jwks.url = %self.display_url(), jwks.keys = keys.len(), "JWKS refreshed");
                Snapshot {
                    keys,
                    attempts: current.attempts + 1,
                    last_attempt: Some(started),
                    loaded_at: Some(Instant::now()),
                    healthy: true,
                }
            }
            Err(error) => {
                tracing::warn!(
                    jwks.url = %self.display_url(),
                    error = %ErrorChain(&error),
                    "fetching the JWKS from {} failed; keeping {} previously loaded keys",
                    self.display_url(),
                    current.keys.len()
                );
                Snapshot {
                    keys: current.keys.clone(),
                    attempts: current.attempts + 1,
                    last_attempt: Some(started),
                    loaded_at: current.loaded_at,
                    healthy: false,
                }
            }
        };
        self.store(next)
    }

    /// Starts a background refresh when the keys are older than the refresh period (or were never
    /// loaded), so periodic refreshes never delay a request. At most one runs at a time.
    pub(crate) fn refresh_if_stale(self: &Arc<Self>) {
        let stale = self.snapshot().loaded_at.is_none_or(|at| at.elapsed() >= self.refresh_every);
        if !stale {
            return;
        }
        // Outside a Tokio runtime (no one to run the task) the on-demand refresh still works.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.background_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::clone(self);
        runtime.spawn(async move {
            // Reset the flag even if the task is cancelled mid-fetch.
            let _reset = ResetOnDrop(&this.background_running);
            this.refresh().await;
        });
    }

    async fn fetch(&self) -> Result<Vec<VerifyKey>, FetchError> {
        let request_err = |source: reqwest::Error| FetchError::Request {
            // The URL may carry credentials; it is logged separately without them.
            source: source.without_url(),
        };
        let mut response = self
            .client
            .get(self.url.clone())
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(request_err)?;
        if !response.status().is_success() {
            return Err(FetchError::Status(response.status().as_u16()));
        }
        if response.content_length().is_some_and(|len| len > MAX_JWKS_BYTES as u64) {
            return Err(FetchError::TooLarge);
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(request_err)? {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err(FetchError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        parse_jwks(&body).map_err(|source| FetchError::Json { source })
    }
}

struct ResetOnDrop<'a>(&'a AtomicBool);

impl Drop for ResetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Displays an error with its whole `source` chain, for one log line.
struct ErrorChain<'a>(&'a dyn std::error::Error);

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

/// Parses a JWKS document, keeping the usable signature keys and skipping (with a log line) the
/// rest. Only a document that is not `{"keys": [...]}` is an error.
pub(crate) fn parse_jwks(body: &[u8]) -> Result<Vec<VerifyKey>, serde_json::Error> {
    #[derive(serde::Deserialize)]
    struct Document {
        keys: Vec<Value>,
    }
    let document: Document = serde_json::from_slice(body)?;
    let mut keys = Vec::with_capacity(document.keys.len());
    for (index, jwk) in document.keys.iter().enumerate() {
        match jwk_to_key(jwk) {
            Ok(key) => keys.push(key),
            Err(reason) => {
                let kid = jwk.get("kid").and_then(Value::as_str).unwrap_or("");
                tracing::debug!(jwks.index = index, jwks.kid = kid, "skipping JWKS key: {reason}");
            }
        }
    }
    Ok(keys)
}

/// Converts one JWK into a key pinned to its algorithm, or says why it is skipped.
fn jwk_to_key(jwk: &Value) -> Result<VerifyKey, String> {
    let text = |name: &str| -> Result<Option<&str>, String> {
        match jwk.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(value)) => Ok(Some(value.as_str())),
            Some(_) => Err(format!("`{name}` is not a string")),
        }
    };
    let bytes = |name: &str| -> Result<Vec<u8>, String> {
        let value = text(name)?.ok_or_else(|| format!("`{name}` is missing"))?;
        B64URL.decode(value).map_err(|_| format!("`{name}` is not base64url"))
    };
    if !jwk.is_object() {
        return Err("not a JSON object".to_owned());
    }
    let kid = text("kid")?.map(str::to_owned);
    if let Some(usage) = text("use")? {
        if usage != "sig" {
            return Err(format!("`use` is `{usage}`, not `sig`"));
        }
    }
    if let Some(ops) = jwk.get("key_ops") {
        let verifies = ops.as_array().is_some_and(|ops| ops.iter().any(|op| op == "verify"));
        if !verifies {
            return Err("`key_ops` does not include `verify`".to_owned());
        }
    }
    let alg = text("alg")?;
    let kty = text("kty")?.ok_or("`kty` is missing")?;
    // An `alg` member, when present, must name the one algorithm we pin to this key type.
    let check_alg = |allowed: &[&str]| match alg {
        Some(alg) if !allowed.contains(&alg) => Err(format!("`alg` {alg} is not supported")),
        _ => Ok(()),
    };
    match kty {
        "RSA" => {
            check_alg(&["RS256"])?;
            let n = bytes("n")?;
            let e = bytes("e")?;
            if e.is_empty() {
                return Err("`e` is empty".to_owned());
            }
            der::check_rsa_modulus(&n).map_err(|error| match error {
                der::KeyError::Malformed(reason) => reason.to_owned(),
                der::KeyError::Unsupported(kind) => kind,
            })?;
            Ok(VerifyKey::rsa_components(&n, &e, kid))
        }
        "EC" => {
            check_alg(&["ES256"])?;
            match text("crv")? {
                Some("P-256") => {}
                other => return Err(format!("curve {other:?} is not supported")),
            }
            let (x, y) = (bytes("x")?, bytes("y")?);
            if x.len() != 32 || y.len() != 32 {
                return Err("P-256 coordinates are not 32 bytes".to_owned());
            }
            let mut point = Vec::with_capacity(65);
            point.push(0x04);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            Ok(VerifyKey::public(der::PublicKey::EcP256(point), kid))
        }
        "OKP" => {
            check_alg(&["EdDSA", "Ed25519"])?;
            match text("crv")? {
                Some("Ed25519") => {}
                other => return Err(format!("curve {other:?} is not supported")),
            }
            let x = bytes("x")?;
            if x.len() != 32 {
                return Err("Ed25519 key is not 32 bytes".to_owned());
            }
            Ok(VerifyKey::public(der::PublicKey::Ed25519(x), kid))
        }
        // A symmetric key published in a JWKS would let anyone who can read the JWKS mint tokens.
        "oct" => Err("symmetric (`oct`) keys are never accepted from a JWKS".to_owned()),
        other => Err(format!("key type `{other}` is not supported")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::KeyAlg;

    #[test]
    fn unsupported_and_foreign_keys_are_skipped_not_fatal() {
        let doc = serde_json::json!({"keys": [
            {"kty": "oct", "kid": "sym", "k": "c2VjcmV0"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": "AQAB", "e": "AQAB"},
            {"kty": "RSA", "kid": "small", "n": "AQAB", "e": "AQAB"},
            {"kty": "RSA", "kid": "ps", "alg": "PS256", "n": "AQAB", "e": "AQAB"},
            {"kty": "EC", "kid": "p384", "crv": "P-384", "x": "AA", "y": "AA"},
            {"kty": "OKP", "kid": "x25519", "crv": "X25519", "x": "AA"},
            {"kty": "OKP", "kid": "ops", "crv": "Ed25519", "key_ops": ["encrypt"],
             "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty": "WAT"},
            "not an object",
            {"kty": "OKP", "kid": "ed", "crv": "Ed25519",
             "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}
        ]});
        let keys = parse_jwks(doc.to_string().as_bytes()).expect("document parses");
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].kid.as_deref(), Some("ed"));
        assert_eq!(keys[0].alg, KeyAlg::EdDsa);
    }

    #[test]
    fn document_without_keys_array_is_an_error() {
        assert!(parse_jwks(b"{}").is_err());
        assert!(parse_jwks(b"[]").is_err());
        assert!(parse_jwks(b"not json").is_err());
    }
}
