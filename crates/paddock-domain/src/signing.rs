//! Ed25519 signatures over canonical JSON (RFC 8785), made with the provider's signing key
//! (`PADDOCK_USAGE_SIGNING_KEY`): closed billing periods' manifests (docs/billing.md) and custody
//! ledger checkpoints (section 5), so that a billing system or an auditor can check them with the
//! published public key alone, without trusting the database.
//!
//! The key is a PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`), as `openssl genpkey -algorithm
//! ed25519` writes it; its id is the first 16 hex digits of the SHA-256 of the raw public key.
//! A signature is the standard base64 of the 64 signature bytes over the UTF-8 of the value's
//! canonical JSON; `openssl pkeyutl -verify -pubin -inkey <public PEM> -rawin -in <canonical JSON>
//! -sigfile <signature bytes>` checks it.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::ledger::canonical_json;

/// The DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410): the 32 key bytes follow.
const SPKI_PREFIX: [u8; 12] = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];

/// A signing key that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SigningKeyError {
    /// Not a PEM block labelled `PRIVATE KEY`.
    #[error("not a PEM private key (expected -----BEGIN PRIVATE KEY-----)")]
    NotPem,
    /// The PEM body is not base64.
    #[error("the PEM body is not base64")]
    Base64(#[source] base64::DecodeError),
    /// Not an Ed25519 PKCS#8 key.
    #[error("not an Ed25519 PKCS#8 private key: {0}")]
    NotEd25519(String),
}

/// The provider's Ed25519 signing key.
pub struct SigningKey {
    pair: Ed25519KeyPair,
    key_id: String,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey").field("key_id", &self.key_id).finish_non_exhaustive()
    }
}

/// A published public key (`GET /v1/usage/signing-key`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PublicKey {
    /// The key's id, as signatures name it.
    pub key_id: String,
    /// Always `Ed25519`.
    pub algorithm: &'static str,
    /// The raw 32-byte public key, standard base64.
    pub public_key: String,
    /// The same key as a SubjectPublicKeyInfo PEM (`-----BEGIN PUBLIC KEY-----`), for openssl.
    pub public_key_pem: String,
}

/// A signature and the key that made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Signature {
    /// Standard base64 of the 64 signature bytes.
    pub signature: String,
    /// The signing key's id.
    pub key_id: String,
}

impl SigningKey {
    /// Parses a PKCS#8 PEM Ed25519 private key (with or without its public key).
    pub fn from_pem(pem: &str) -> Result<Self, SigningKeyError> {
        let der = pem_body(pem, "PRIVATE KEY")?;
        let pair =
            Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|e| SigningKeyError::NotEd25519(e.to_string()))?;
        let key_id = key_id(pair.public_key().as_ref());
        Ok(Self { pair, key_id })
    }

    /// A new random key, as PKCS#8 PEM (what `paddock dev` keeps in its secrets directory).
    pub fn generate_pem() -> String {
        let rng = ring::rand::SystemRandom::new();
        // Generating from the system's randomness only fails when it has none: nothing works then.
        let der = Ed25519KeyPair::generate_pkcs8(&rng).expect("the system's random number generator");
        pem_encode("PRIVATE KEY", der.as_ref())
    }

    /// The key's id.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The public half, to publish.
    pub fn public_key(&self) -> PublicKey {
        let raw = self.pair.public_key().as_ref();
        let mut spki = SPKI_PREFIX.to_vec();
        spki.extend_from_slice(raw);
        PublicKey {
            key_id: self.key_id.clone(),
            algorithm: "Ed25519",
            public_key: STANDARD.encode(raw),
            public_key_pem: pem_encode("PUBLIC KEY", &spki),
        }
    }

    /// Signs the canonical JSON of `value`.
    pub fn sign(&self, value: &Value) -> Signature {
        let sig = self.pair.sign(canonical_json(value).as_bytes());
        Signature { signature: STANDARD.encode(sig.as_ref()), key_id: self.key_id.clone() }
    }

    /// Whether `signature` (standard base64) is this key's signature of `value`'s canonical JSON.
    pub fn verifies(&self, value: &Value, signature: &str) -> bool {
        verify(self.pair.public_key().as_ref(), value, signature)
    }
}

/// Whether `signature` (standard base64) is a valid signature of `value`'s canonical JSON by the
/// raw 32-byte Ed25519 `public_key`.
pub fn verify(public_key: &[u8], value: &Value, signature: &str) -> bool {
    let Ok(sig) = STANDARD.decode(signature) else { return false };
    UnparsedPublicKey::new(&ED25519, public_key).verify(canonical_json(value).as_bytes(), &sig).is_ok()
}

fn key_id(public_key: &[u8]) -> String {
    hex::encode(&Sha256::digest(public_key)[..8])
}

/// The DER inside the one PEM block labelled `label`.
fn pem_body(pem: &str, label: &str) -> Result<Vec<u8>, SigningKeyError> {
    let (begin, end) = (format!("-----BEGIN {label}-----"), format!("-----END {label}-----"));
    let start = pem.find(&begin).ok_or(SigningKeyError::NotPem)? + begin.len();
    let stop = pem[start..].find(&end).ok_or(SigningKeyError::NotPem)? + start;
    let body: String = pem[start..stop].chars().filter(|c| !c.is_ascii_whitespace()).collect();
    STANDARD.decode(body).map_err(SigningKeyError::Base64)
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    let body = STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// `openssl genpkey -algorithm ed25519` (PKCS#8 v1, no public key inside), and the public key
    /// `openssl pkey -pubout` printed for it.
    const OPENSSL_KEY: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEILVEM4ab6iDPCRkKssM/pX//JP/KOfDwh54avZ9Ymmwy
-----END PRIVATE KEY-----
";
    const OPENSSL_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAUkVrBFI9O6Dvo23MeZT0MPJdIEVjSAMWVyYmE4eoL+0=
-----END PUBLIC KEY-----
";

    #[test]
    fn an_openssl_key_signs_canonical_json_that_verifies_with_its_public_key() {
        let key = SigningKey::from_pem(OPENSSL_KEY).expect("key");
        assert_eq!(key.public_key().public_key_pem, OPENSSL_PUBLIC);
        let raw = STANDARD.decode(key.public_key().public_key).expect("base64");
        let value = json!({"b": 1, "a": [true, null, "x"]});
        let signed = key.sign(&value);
        assert_eq!(signed.key_id, key.key_id());
        assert!(verify(&raw, &value, &signed.signature));
        // Member order does not matter (canonical JSON); any change of content does.
        assert!(verify(&raw, &json!({"a": [true, null, "x"], "b": 1}), &signed.signature));
        assert!(!verify(&raw, &json!({"b": 2, "a": [true, null, "x"]}), &signed.signature));
        assert!(!verify(&raw, &value, "not base64!"));
    }

    /// What docs/billing.md tells a billing system to run: openssl checks our signature.
    #[test]
    fn openssl_verifies_a_signature() {
        let dir = std::env::temp_dir().join(format!("paddock-signing-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("dir");
        let key = SigningKey::from_pem(&SigningKey::generate_pem()).expect("key");
        let value = json!({"period": "2026-11", "totals": {"node_seconds": 3600}});
        let signed = key.sign(&value);
        std::fs::write(dir.join("pub.pem"), key.public_key().public_key_pem).expect("write");
        std::fs::write(dir.join("data"), canonical_json(&value)).expect("write");
        std::fs::write(dir.join("sig"), STANDARD.decode(&signed.signature).expect("base64")).expect("write");
        let check = |data: &str| {
            std::process::Command::new("openssl")
                .args(["pkeyutl", "-verify", "-pubin", "-inkey", "pub.pem", "-rawin", "-in", data, "-sigfile", "sig"])
                .current_dir(&dir)
                .output()
                .expect("openssl runs (the test suite installs it)")
        };
        let ok = check("data");
        assert!(ok.status.success(), "openssl: {}", String::from_utf8_lossy(&ok.stderr));
        std::fs::write(dir.join("other"), canonical_json(&json!({"period": "2026-12"}))).expect("write");
        assert!(!check("other").status.success(), "another document must not verify");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn generated_keys_parse_and_differ() {
        let (a, b) = (SigningKey::generate_pem(), SigningKey::generate_pem());
        let (ka, kb) = (SigningKey::from_pem(&a).expect("a"), SigningKey::from_pem(&b).expect("b"));
        assert_ne!(ka.key_id(), kb.key_id());
        assert_eq!(ka.key_id().len(), 16);
    }

    #[test]
    fn other_inputs_are_refused_with_a_reason() {
        assert!(matches!(SigningKey::from_pem("hello"), Err(SigningKeyError::NotPem)));
        let rsa_like = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        assert!(matches!(SigningKey::from_pem(rsa_like), Err(SigningKeyError::NotEd25519(_))));
        let garbage = "-----BEGIN PRIVATE KEY-----\n!!!!\n-----END PRIVATE KEY-----\n";
        assert!(matches!(SigningKey::from_pem(garbage), Err(SigningKeyError::Base64(_))));
    }
}
