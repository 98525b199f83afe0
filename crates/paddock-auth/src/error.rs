//! Errors: [`AuthError`] for a rejected token, [`AuthConfigError`] for a refused configuration.

use std::path::PathBuf;

/// Why a token was rejected (or, for [`crate::mint_hs256`], could not be signed).
///
/// The `Display` text is safe to show to the client: it never includes token contents, key
/// material or internal addresses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The token is not a well-formed compact JWS (segments, base64url, JSON).
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    /// The token's `alg` is not one of the algorithms of the configured keys (`none` included).
    #[error("token algorithm is not accepted")]
    UnsupportedAlgorithm,
    /// The token's `kid` names no configured key, even after refreshing the JWKS.
    #[error("token signing key is unknown")]
    UnknownKey,
    /// No configured key of the token's algorithm verifies its signature.
    #[error("token signature is invalid")]
    BadSignature,
    /// `exp` is in the past (beyond the leeway).
    #[error("token has expired")]
    Expired,
    /// `nbf` is in the future (beyond the leeway).
    #[error("token is not valid yet")]
    NotYetValid,
    /// `iss` is not the configured issuer.
    #[error("token issuer is not accepted")]
    WrongIssuer,
    /// `aud` does not contain the configured audience.
    #[error("token audience does not include this service")]
    WrongAudience,
    /// A required claim is absent (or, for `sub`, empty).
    #[error("token lacks the required claim `{0}`")]
    MissingClaim(&'static str),
    /// A claim has the wrong JSON type or an invalid value.
    #[error("token claim `{0}` has an invalid value")]
    InvalidClaim(&'static str),
    /// `exp - iat` is longer than the longest lifetime accepted.
    #[error("token lives longer than the {max_secs} s accepted (exp - iat)")]
    LifetimeTooLong {
        /// The longest lifetime accepted, seconds (`PADDOCK_TOKEN_MAX_LIFETIME`).
        max_secs: i64,
    },
    /// The token needs JWKS keys and the JWKS endpoint could not be fetched: not the client's fault.
    #[error("token signing keys are temporarily unavailable")]
    KeysUnavailable,
    /// Minting only: the HS256 secret is shorter than [`crate::MIN_HS256_SECRET_LEN`] bytes.
    #[error("the HS256 signing secret is too short")]
    SigningSecretTooShort,
    /// Minting only: the token could not be encoded or signed.
    #[error("signing the token")]
    Signing {
        /// The underlying encoding error.
        #[source]
        source: jsonwebtoken::errors::Error,
    },
}

impl AuthError {
    /// Returns the stable snake_case code for problem responses.
    ///
    /// Expiry gets its own codes so clients know to refresh their token; unavailable keys are a
    /// server-side condition (answer 503); every other rejection is `invalid_token`, the
    /// RFC 6750 error code, with the `Display` text as the detail.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Expired => "token_expired",
            Self::NotYetValid => "token_not_yet_valid",
            Self::KeysUnavailable => "token_keys_unavailable",
            Self::SigningSecretTooShort | Self::Signing { .. } => "token_signing_failed",
            Self::Malformed(_)
            | Self::UnsupportedAlgorithm
            | Self::UnknownKey
            | Self::BadSignature
            | Self::WrongIssuer
            | Self::WrongAudience
            | Self::MissingClaim(_)
            | Self::InvalidClaim(_)
            | Self::LifetimeTooLong { .. } => "invalid_token",
        }
    }

    /// Returns whether the failure is on the server's side (keys unavailable, signing failed)
    /// rather than the token's: the API answers 503 (or 500) instead of 401 for these.
    pub fn is_server_side(&self) -> bool {
        matches!(self, Self::KeysUnavailable | Self::SigningSecretTooShort | Self::Signing { .. })
    }
}

/// Why [`crate::Verifier::new`] refused the configuration. Messages name the setting to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthConfigError {
    /// No key source at all.
    #[error("no JWT key configured: set PADDOCK_JWT_HS256_SECRET, PADDOCK_JWT_PUBLIC_KEYS or PADDOCK_JWT_JWKS_URL")]
    NoKeyConfigured,
    /// The HS256 secret is empty.
    #[error("PADDOCK_JWT_HS256_SECRET is empty")]
    Hs256SecretEmpty,
    /// The HS256 secret is shorter than [`crate::MIN_HS256_SECRET_LEN`] bytes.
    #[error("PADDOCK_JWT_HS256_SECRET is too short: {len} bytes, at least 32 random bytes are required")]
    Hs256SecretTooShort {
        /// The length that was configured.
        len: usize,
    },
    /// The issuer is empty.
    #[error("PADDOCK_JWT_ISSUER is empty")]
    IssuerEmpty,
    /// The audience is empty.
    #[error("PADDOCK_JWT_AUDIENCE is empty")]
    AudienceEmpty,
    /// The public key file (or directory) could not be read.
    #[error("reading PADDOCK_JWT_PUBLIC_KEYS file {}", path.display())]
    PublicKeysRead {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The public key file is not valid PEM, or holds a key that cannot be parsed.
    #[error("PADDOCK_JWT_PUBLIC_KEYS file {} is malformed: {reason}", path.display())]
    PublicKeysMalformed {
        /// The file (or directory).
        path: PathBuf,
        /// What is wrong, without key material.
        reason: String,
    },
    /// The public key file holds a key of an unsupported type or size.
    #[error(
        "PADDOCK_JWT_PUBLIC_KEYS file {}: key #{index} is not supported ({kind}); use RSA (2048 to 8192 bits), EC P-256 or Ed25519 public keys",
        path.display()
    )]
    PublicKeyUnsupported {
        /// The file.
        path: PathBuf,
        /// 1-based position of the PEM block in the file.
        index: usize,
        /// What was found.
        kind: String,
    },
    /// The public key file holds a private key, which must never be deployed to the API.
    #[error(
        "PADDOCK_JWT_PUBLIC_KEYS file {}: key #{index} is a private key; configure public keys only",
        path.display()
    )]
    PrivateKeyConfigured {
        /// The file.
        path: PathBuf,
        /// 1-based position of the PEM block in the file.
        index: usize,
    },
    /// The JWKS URL is not https (plain http only to a loopback address).
    #[error("PADDOCK_JWT_JWKS_URL must be an https URL (plain http only to a loopback address), not `{scheme}:`")]
    JwksUrlScheme {
        /// The scheme that was configured.
        scheme: String,
    },
    /// The HTTP client for the JWKS could not be built (TLS backend initialisation).
    #[error("building the HTTP client for PADDOCK_JWT_JWKS_URL")]
    HttpClient {
        /// The reqwest error.
        #[source]
        source: reqwest::Error,
    },
}
