//! [`mint_hs256`]: signing tokens with the shared secret, for `paddock token` and tests.

use jsonwebtoken::{Algorithm, EncodingKey, Header};

use crate::claims::Claims;
use crate::error::AuthError;
use crate::secret::Secret;

/// The shortest HS256 secret accepted, in bytes (the HMAC-SHA256 output size, RFC 7518 §3.2).
pub const MIN_HS256_SECRET_LEN: usize = 32;

/// Signs `claims` as an HS256 JWT (header `{"typ":"JWT","alg":"HS256"}`, no `kid`).
///
/// The claims are signed as given; the caller chooses `exp`, `iss` and `aud` so that a
/// [`crate::Verifier`] with the same secret accepts them.
pub fn mint_hs256(secret: &Secret, claims: &Claims) -> Result<String, AuthError> {
    if secret.len() < MIN_HS256_SECRET_LEN {
        return Err(AuthError::SigningSecretTooShort);
    }
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &EncodingKey::from_secret(secret.expose()))
        .map_err(|source| AuthError::Signing { source })
}
