//! JWT verification and minting for the paddock API.
//!
//! This crate owns the answer to "is this bearer token genuine, current and meant for us?".
//! [`Verifier`] checks a token against the keys the operator configured (an HS256 secret, PEM
//! public keys, a JWKS URL, or any mix of them) and returns the validated [`Claims`];
//! [`mint_hs256`] signs tokens for `paddock token` and for tests.
//!
//! Invariants it keeps:
//!
//! - **Algorithms are pinned by key.** Every key carries the one algorithm it may verify: the
//!   HS256 secret only HS256, RSA keys only RS256, EC P-256 keys only ES256, Ed25519 keys only
//!   EdDSA. A token's `alg` header only selects among keys of that algorithm, so `alg: none`,
//!   unlisted algorithms and HS/RS confusion (an HS256 token "signed" with an RSA public key) can
//!   never verify.
//! - **`kid` selection.** When a JWKS URL is configured, a token that carries a `kid` is checked
//!   only against JWKS keys with exactly that `kid`; the HS256 secret and PEM keys (which have no
//!   `kid`) are not tried for it. Without a JWKS URL, a `kid` is ignored and every configured key
//!   of the token's algorithm is tried. A token without a `kid` is tried against every configured
//!   key of its algorithm, from all sources.
//! - **JWKS refresh.** The key set is fetched at start-up (a failure there is only a warning),
//!   refreshed in the background when older than [`VerifierConfig::jwks_refresh`], and refetched
//!   on demand when a token names an unknown `kid` (or no key of its algorithm is loaded). Fetches
//!   are rate-limited (at most one per 10 s by default) and concurrent callers share one fetch.
//!   A failed refresh keeps the previous keys. Symmetric (`oct`) JWKS keys are never used.
//! - **Claims.** `exp` is required, `nbf` is checked when present, both with
//!   [`VerifierConfig::leeway_secs`]; `iss` must equal the configured issuer; `aud` (a string or an
//!   array) must contain the configured audience; `sub` must be a non-empty string; `roles` must
//!   be an array of strings (missing means none); `tenant_id`, when present, must be a UUID.
//! - **Errors are safe to show.** [`AuthError`]'s `Display` never contains token contents, so the
//!   API may put it in a problem `detail`; [`AuthError::code`] gives the stable `code`.
//! - **Secrets stay secret.** [`Secret`] prints as `[redacted]`; nothing here logs a token.

mod claims;
mod der;
mod error;
mod jwks;
mod keys;
mod mint;
mod pem;
mod secret;
mod token;
mod verifier;

pub use claims::Claims;
pub use error::{AuthConfigError, AuthError};
pub use mint::{mint_hs256, MIN_HS256_SECRET_LEN};
pub use secret::Secret;
pub use verifier::{Verifier, VerifierConfig, DEFAULT_JWKS_MIN_REFRESH_INTERVAL};
