//! [`Verifier`]: configured keys plus the verification procedure.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use url::Url;

use crate::claims::{Claims, Expectations, Payload};
use crate::error::{AuthConfigError, AuthError};
use crate::jwks::{Jwks, Snapshot};
use crate::keys::{KeyAlg, VerifyKey};
use crate::mint::MIN_HS256_SECRET_LEN;
use crate::secret::Secret;
use crate::token::{from_json_object, ParsedToken};

/// Minimum time between two JWKS fetches used by [`Verifier::new`].
pub const DEFAULT_JWKS_MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(10);

/// Key sources and claim expectations. At least one key source must be set.
#[derive(Clone, Debug)]
pub struct VerifierConfig {
    /// Shared secret for HS256 (`PADDOCK_JWT_HS256_SECRET`); at least 32 bytes.
    pub hs256_secret: Option<Secret>,
    /// PEM file (or directory of `*.pem` files) of RSA, EC P-256 or Ed25519 public keys
    /// (`PADDOCK_JWT_PUBLIC_KEYS`).
    pub public_keys_pem: Option<PathBuf>,
    /// JWKS endpoint, http or https (`PADDOCK_JWT_JWKS_URL`).
    pub jwks_url: Option<Url>,
    /// Required `iss` (`PADDOCK_JWT_ISSUER`, default `paddock`).
    pub issuer: String,
    /// Audience that `aud` must contain (`PADDOCK_JWT_AUDIENCE`, default `paddock`).
    pub audience: String,
    /// Clock skew tolerated on `exp` and `nbf`, in seconds (default 30).
    pub leeway_secs: u64,
    /// Age after which JWKS keys are refreshed in the background (default 300 s).
    pub jwks_refresh: Duration,
    /// Longest `exp - iat` accepted, seconds (`PADDOCK_TOKEN_MAX_LIFETIME`, default 86400); a
    /// token without `iat` is refused.
    pub max_lifetime_secs: u64,
}

impl Default for VerifierConfig {
    /// No key source; issuer and audience `paddock`; 30 s leeway; JWKS refresh every 300 s;
    /// tokens live at most a day.
    fn default() -> Self {
        Self {
            hs256_secret: None,
            public_keys_pem: None,
            jwks_url: None,
            issuer: "paddock".to_owned(),
            audience: "paddock".to_owned(),
            leeway_secs: 30,
            jwks_refresh: Duration::from_secs(300),
            max_lifetime_secs: 86_400,
        }
    }
}

/// Verifies bearer tokens. Cheap to clone (one `Arc`); share it across requests.
#[derive(Clone)]
pub struct Verifier {
    inner: Arc<Inner>,
}

struct Inner {
    /// The HS256 secret and PEM keys: no `kid`, never refreshed.
    static_keys: Vec<VerifyKey>,
    jwks: Option<Arc<Jwks>>,
    issuer: String,
    audience: String,
    leeway: i64,
    max_lifetime: i64,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("static_keys", &self.inner.static_keys)
            .field("jwks", &self.inner.jwks.is_some())
            .field("issuer", &self.inner.issuer)
            .field("audience", &self.inner.audience)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// Validates the configuration, loads the keys and makes a first JWKS fetch.
    ///
    /// Refuses a configuration without any key source, an HS256 secret shorter than 32 bytes, an
    /// unreadable or malformed PEM file, a PEM key of an unsupported type, and a non-http(s) JWKS
    /// URL. A failing first JWKS fetch is only logged: keys are fetched again when needed.
    pub async fn new(cfg: VerifierConfig) -> Result<Self, AuthConfigError> {
        Self::with_jwks_min_refresh_interval(cfg, DEFAULT_JWKS_MIN_REFRESH_INTERVAL).await
    }

    /// Like [`Verifier::new`] with another minimum time between JWKS fetches (tests use zero).
    pub async fn with_jwks_min_refresh_interval(
        cfg: VerifierConfig,
        jwks_min_refresh_interval: Duration,
    ) -> Result<Self, AuthConfigError> {
        if cfg.hs256_secret.is_none() && cfg.public_keys_pem.is_none() && cfg.jwks_url.is_none() {
            return Err(AuthConfigError::NoKeyConfigured);
        }
        if cfg.issuer.is_empty() {
            return Err(AuthConfigError::IssuerEmpty);
        }
        if cfg.audience.is_empty() {
            return Err(AuthConfigError::AudienceEmpty);
        }
        let mut static_keys = Vec::new();
        if let Some(secret) = &cfg.hs256_secret {
            if secret.is_empty() {
                return Err(AuthConfigError::Hs256SecretEmpty);
            }
            if secret.len() < MIN_HS256_SECRET_LEN {
                return Err(AuthConfigError::Hs256SecretTooShort { len: secret.len() });
            }
            static_keys.push(VerifyKey::hs256(secret.expose()));
        }
        if let Some(path) = &cfg.public_keys_pem {
            static_keys.extend(crate::pem::load_public_keys(path)?);
        }
        let jwks = match cfg.jwks_url {
            Some(url) => {
                let jwks = Arc::new(Jwks::new(url, cfg.jwks_refresh, jwks_min_refresh_interval)?);
                // A failure here is logged by `refresh` and not fatal: the identity service may
                // start after us, and keys are fetched again when a token needs them.
                jwks.refresh().await;
                Some(jwks)
            }
            None => None,
        };
        tracing::info!(
            auth.static_keys = static_keys.len(),
            auth.jwks = jwks.is_some(),
            "JWT verification configured with {} static keys{}",
            static_keys.len(),
            if jwks.is_some() { " and a JWKS" } else { "" }
        );
        Ok(Self {
            inner: Arc::new(Inner {
                static_keys,
                jwks,
                issuer: cfg.issuer,
                audience: cfg.audience,
                leeway: i64::try_from(cfg.leeway_secs).unwrap_or(i64::MAX),
                max_lifetime: i64::try_from(cfg.max_lifetime_secs).unwrap_or(i64::MAX),
            }),
        })
    }

    /// Verifies a compact JWS (without the `Bearer ` prefix) and returns its validated claims.
    pub async fn verify(&self, token: &str) -> Result<Claims, AuthError> {
        let parsed = ParsedToken::parse(token)?;
        let alg = KeyAlg::from_header(&parsed.alg).ok_or(AuthError::UnsupportedAlgorithm)?;
        self.check_signature(&parsed, alg).await?;
        // Only now is the payload trusted enough to look at.
        let payload: Payload = from_json_object(&parsed.payload)
            .ok_or(AuthError::Malformed("the payload is not a JSON object with each claim once"))?;
        let inner = &self.inner;
        Claims::from_payload(
            payload,
            &Expectations {
                issuer: &inner.issuer,
                audience: &inner.audience,
                leeway: inner.leeway,
                now: unix_now(),
                max_lifetime: inner.max_lifetime,
            },
        )
    }

    /// Finds the keys the token may be checked with and checks the signature.
    async fn check_signature(&self, token: &ParsedToken<'_>, alg: KeyAlg) -> Result<(), AuthError> {
        let inner = &self.inner;
        let Some(jwks) = &inner.jwks else {
            // No JWKS: the secret and PEM keys have no kid, so a token's kid is ignored.
            return try_keys(inner.static_keys.iter().filter(|k| k.alg == alg), token);
        };
        jwks.refresh_if_stale();
        let kid = token.kid.as_deref();
        // A JWKS never provides HS256 keys (we drop `oct` keys), so it cannot help an HS256 token.
        let jwks_may_help = alg != KeyAlg::Hs256;
        let mut snapshot = jwks.snapshot();
        if jwks_may_help && candidates(&inner.static_keys, &snapshot, alg, kid).next().is_none() {
            // Unknown kid, or no key of this algorithm: the keys may have rotated. `refresh`
            // is rate-limited and shared between concurrent callers.
            snapshot = jwks.refresh().await;
        }
        let mut keys = candidates(&inner.static_keys, &snapshot, alg, kid).peekable();
        if keys.peek().is_some() {
            return try_keys(keys, token);
        }
        if jwks_may_help && !snapshot.healthy {
            return Err(AuthError::KeysUnavailable);
        }
        match kid {
            Some(kid) if !snapshot.keys.iter().any(|k| k.kid.as_deref() == Some(kid)) => Err(AuthError::UnknownKey),
            _ => Err(AuthError::UnsupportedAlgorithm),
        }
    }
}

/// The keys a token may be verified with when a JWKS is configured: with a `kid`, only the JWKS
/// keys with that kid; without one, every key (static and JWKS) of the token's algorithm.
fn candidates<'a>(
    static_keys: &'a [VerifyKey],
    snapshot: &'a Snapshot,
    alg: KeyAlg,
    kid: Option<&'a str>,
) -> impl Iterator<Item = &'a VerifyKey> + 'a {
    let statics = static_keys.iter().filter(move |_| kid.is_none());
    statics.chain(&snapshot.keys).filter(move |k| k.alg == alg && (kid.is_none() || k.kid.as_deref() == kid))
}

/// Succeeds when any of `keys` verifies the token's signature.
fn try_keys<'a>(mut keys: impl Iterator<Item = &'a VerifyKey>, token: &ParsedToken<'_>) -> Result<(), AuthError> {
    let mut tried = false;
    let verified = keys.any(|key| {
        tried = true;
        key.verifies(token.signature, token.signing_input.as_bytes())
    });
    match (verified, tried) {
        (true, _) => Ok(()),
        (false, true) => Err(AuthError::BadSignature),
        (false, false) => Err(AuthError::UnsupportedAlgorithm),
    }
}

/// Seconds since the Unix epoch. A clock before 1970 reads as 0, which fails every `exp`.
fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
