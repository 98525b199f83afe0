//! [`VerifyKey`]: one configured key, pinned to the single algorithm it may verify.

use jsonwebtoken::{Algorithm, DecodingKey};

use crate::der::PublicKey;

/// The algorithms paddock accepts, one per key type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyAlg {
    /// HMAC-SHA256 with the shared secret.
    Hs256,
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    Rs256,
    /// ECDSA on P-256 with SHA-256.
    Es256,
    /// Ed25519.
    EdDsa,
}

impl KeyAlg {
    /// Maps a JOSE `alg` header value (case-sensitive, RFC 7515) to an accepted algorithm.
    /// `none` and every other algorithm map to `None`.
    pub(crate) fn from_header(alg: &str) -> Option<Self> {
        match alg {
            "HS256" => Some(Self::Hs256),
            "RS256" => Some(Self::Rs256),
            "ES256" => Some(Self::Es256),
            "EdDSA" => Some(Self::EdDsa),
            _ => None,
        }
    }

    /// Returns the jsonwebtoken algorithm.
    pub(crate) fn jwt(self) -> Algorithm {
        match self {
            Self::Hs256 => Algorithm::HS256,
            Self::Rs256 => Algorithm::RS256,
            Self::Es256 => Algorithm::ES256,
            Self::EdDsa => Algorithm::EdDSA,
        }
    }
}

/// A verification key together with the only algorithm it may be used with.
#[derive(Clone)]
pub(crate) struct VerifyKey {
    /// The pinned algorithm.
    pub(crate) alg: KeyAlg,
    /// The JWKS `kid`; `None` for the HS256 secret and PEM keys.
    pub(crate) kid: Option<String>,
    /// The key material.
    key: DecodingKey,
}

impl VerifyKey {
    /// Wraps the HS256 secret.
    pub(crate) fn hs256(secret: &[u8]) -> Self {
        Self { alg: KeyAlg::Hs256, kid: None, key: DecodingKey::from_secret(secret) }
    }

    /// Wraps a classified public key; its type decides its algorithm.
    pub(crate) fn public(key: PublicKey, kid: Option<String>) -> Self {
        let (alg, key) = match key {
            PublicKey::Rsa(pkcs1) => (KeyAlg::Rs256, DecodingKey::from_rsa_der(&pkcs1)),
            PublicKey::EcP256(point) => (KeyAlg::Es256, DecodingKey::from_ec_der(&point)),
            PublicKey::Ed25519(raw) => (KeyAlg::EdDsa, DecodingKey::from_ed_der(&raw)),
        };
        Self { alg, kid, key }
    }

    /// Wraps RSA components from a JWK (already size-checked).
    pub(crate) fn rsa_components(n: &[u8], e: &[u8], kid: Option<String>) -> Self {
        Self { alg: KeyAlg::Rs256, kid, key: DecodingKey::from_rsa_raw_components(n, e) }
    }

    /// Checks `signature` (base64url) over `message` with this key's own algorithm.
    ///
    /// The algorithm always comes from the key, never from the token: that is what makes
    /// algorithm confusion impossible. An error from the crypto layer counts as "does not verify".
    pub(crate) fn verifies(&self, signature: &str, message: &[u8]) -> bool {
        match jsonwebtoken::crypto::verify(signature, message, &self.key, self.alg.jwt()) {
            Ok(valid) => valid,
            Err(error) => {
                tracing::debug!(%error, "signature check failed with an error");
                false
            }
        }
    }
}

impl std::fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyKey").field("alg", &self.alg).field("kid", &self.kid).finish_non_exhaustive()
    }
}
