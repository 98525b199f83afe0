//! Secrets at rest: AES-256-GCM under a configured key. Each value carries the id of the key that
//! sealed it, and is bound to its table, column and row through the associated data, so a
//! ciphertext copied to another row or column does not decrypt. Older keys stay readable for
//! rotation; new values are always sealed with the current key.

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Format version of a sealed value.
const VERSION: u8 = 1;
const KEY_ID_LEN: usize = 4;
const NONCE_LEN: usize = 12;

/// A string that never shows itself in logs.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(String);

impl SecretString {
    /// Wraps a secret.
    pub fn new(value: String) -> Self {
        Self(value)
    }

    /// The secret itself; call only where it is used.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::fmt::Display for SecretString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Why a key or a sealed value was refused.
#[derive(Debug, thiserror::Error)]
pub enum CipherError {
    /// The configured key is not 32 bytes of base64.
    #[error("encryption key must be 32 bytes, base64-encoded")]
    BadKey,
    /// No configured key has the id the value was sealed with.
    #[error("no configured key matches the sealed value (key id {0})")]
    UnknownKey(String),
    /// The value is corrupt, or bound to another row.
    #[error("sealed value does not verify")]
    Corrupt,
    /// The value could not be sealed (longer than [`MAX_PLAINTEXT`], or the AEAD refused it).
    #[error("the value could not be encrypted ({0} bytes)")]
    Seal(usize),
}

/// The longest value sealed: far above any kubeconfig, password or agent configuration, far below
/// what AES-GCM can take, so a runaway value is refused instead of stored.
pub const MAX_PLAINTEXT: usize = 4 << 20;

struct Key {
    id: [u8; KEY_ID_LEN],
    aead: Aes256Gcm,
    /// The key's bytes, kept for [`Cipher::derive`] (HMAC, with a label per use).
    raw: [u8; 32],
}

impl Key {
    fn from_base64(encoded: &str) -> Result<Self, CipherError> {
        let bytes = STANDARD.decode(encoded.trim()).map_err(|_| CipherError::BadKey)?;
        if bytes.len() != 32 {
            return Err(CipherError::BadKey);
        }
        let digest = Sha256::digest(&bytes);
        let mut id = [0u8; KEY_ID_LEN];
        id.copy_from_slice(&digest[..KEY_ID_LEN]);
        let aead = Aes256Gcm::new_from_slice(&bytes).map_err(|_| CipherError::BadKey)?;
        let mut raw = [0u8; 32];
        raw.copy_from_slice(&bytes);
        Ok(Self { id, aead, raw })
    }
}

/// Seals and opens secrets.
pub struct Cipher {
    current: Key,
    old: Vec<Key>,
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cipher([redacted])")
    }
}

/// Where a sealed value lives; it becomes the associated data.
#[derive(Debug, Clone, Copy)]
pub struct Binding<'a> {
    /// Table name.
    pub table: &'a str,
    /// Column name.
    pub column: &'a str,
    /// Row id.
    pub row: uuid::Uuid,
}

impl Binding<'_> {
    fn aad(&self) -> String {
        format!("paddock:{}:{}:{}", self.table, self.column, self.row)
    }
}

impl Cipher {
    /// A cipher from the current key and older keys, each 32 bytes in base64.
    pub fn new(current: &str, old: &[String]) -> Result<Self, CipherError> {
        Ok(Self {
            current: Key::from_base64(current)?,
            old: old.iter().map(|k| Key::from_base64(k)).collect::<Result<_, _>>()?,
        })
    }

    /// A fresh random key in the configuration's encoding (for `paddock dev` and tests).
    pub fn generate_key() -> String {
        STANDARD.encode(Aes256Gcm::generate_key(OsRng))
    }

    /// Seals `plaintext` for `binding` with the current key. A failure is an error, never an
    /// empty ciphertext.
    pub fn seal(&self, plaintext: &[u8], binding: Binding<'_>) -> Result<Vec<u8>, CipherError> {
        if plaintext.len() > MAX_PLAINTEXT {
            return Err(CipherError::Seal(plaintext.len()));
        }
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let aad = binding.aad();
        let ciphertext = self
            .current
            .aead
            .encrypt(&nonce, Payload { msg: plaintext, aad: aad.as_bytes() })
            .map_err(|_| CipherError::Seal(plaintext.len()))?;
        let mut out = Vec::with_capacity(1 + KEY_ID_LEN + NONCE_LEN + ciphertext.len());
        out.push(VERSION);
        out.extend_from_slice(&self.current.id);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ciphertext);
        Ok(out)
    }

    /// Opens a value sealed for `binding` by the current or an older key.
    pub fn open(&self, sealed: &[u8], binding: Binding<'_>) -> Result<Vec<u8>, CipherError> {
        if sealed.len() < 1 + KEY_ID_LEN + NONCE_LEN + 16 || sealed[0] != VERSION {
            return Err(CipherError::Corrupt);
        }
        let key_id = &sealed[1..1 + KEY_ID_LEN];
        let key = std::iter::once(&self.current)
            .chain(&self.old)
            .find(|k| k.id == key_id)
            .ok_or_else(|| CipherError::UnknownKey(hex_id(key_id)))?;
        let nonce = Nonce::from_slice(&sealed[1 + KEY_ID_LEN..1 + KEY_ID_LEN + NONCE_LEN]);
        let aad = binding.aad();
        key.aead
            .decrypt(nonce, Payload { msg: &sealed[1 + KEY_ID_LEN + NONCE_LEN..], aad: aad.as_bytes() })
            .map_err(|_| CipherError::Corrupt)
    }

    /// HMAC-SHA256 of `label`, a zero byte and `data` under each configured key, the current one
    /// first: a value derived under the server key that needs no storage (the agent tokens of
    /// docs/security.md use the label `paddock-agent-token`). Older keys come after, so a value
    /// derived before a rotation can still be recognised.
    pub fn derive(&self, label: &str, data: &[u8]) -> Vec<[u8; 32]> {
        std::iter::once(&self.current)
            .chain(&self.old)
            .map(|key| {
                // HMAC takes keys of any length: this cannot fail.
                let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key.raw).expect("HMAC accepts any key length");
                mac.update(label.as_bytes());
                mac.update(&[0]);
                mac.update(data);
                mac.finalize().into_bytes().into()
            })
            .collect()
    }

    /// The id of the current key, as sealed values carry it (bytes 1 to 4).
    pub fn current_key_id(&self) -> &[u8] {
        &self.current.id
    }

    /// Opens a value sealed for `binding` and, if an older key sealed it, seals it again under
    /// the current key; `None` when it is under the current key already.
    pub fn reseal(&self, sealed: &[u8], binding: Binding<'_>) -> Result<Option<Vec<u8>>, CipherError> {
        if !self.needs_rotation(sealed) {
            return Ok(None);
        }
        let plaintext = self.open(sealed, binding)?;
        self.seal(&plaintext, binding).map(Some)
    }

    /// Whether `sealed` was sealed with an older key and should be re-sealed.
    pub fn needs_rotation(&self, sealed: &[u8]) -> bool {
        sealed.get(1..1 + KEY_ID_LEN).is_some_and(|id| id != self.current.id)
    }
}

fn hex_id(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(row: uuid::Uuid) -> Binding<'static> {
        Binding { table: "machines", column: "bmc_password_enc", row }
    }

    #[test]
    fn seal_open_round_trip_and_row_binding() {
        let cipher = Cipher::new(&Cipher::generate_key(), &[]).expect("key");
        let row = uuid::Uuid::now_v7();
        let sealed = cipher.seal(b"hunter2", binding(row)).expect("seals");
        assert_eq!(cipher.open(&sealed, binding(row)).expect("opens"), b"hunter2");
        assert!(matches!(cipher.open(&sealed, binding(uuid::Uuid::now_v7())), Err(CipherError::Corrupt)));
        let mut tampered = sealed.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert!(cipher.open(&tampered, binding(row)).is_err());
    }

    #[test]
    fn rotation_reads_old_keys() {
        let old_key = Cipher::generate_key();
        let old = Cipher::new(&old_key, &[]).expect("key");
        let row = uuid::Uuid::now_v7();
        let sealed = old.seal(b"s", binding(row)).expect("seals");
        let new = Cipher::new(&Cipher::generate_key(), &[old_key]).expect("keys");
        assert_eq!(new.open(&sealed, binding(row)).expect("old key opens"), b"s");
        assert!(new.needs_rotation(&sealed));
        let without = Cipher::new(&Cipher::generate_key(), &[]).expect("key");
        assert!(matches!(without.open(&sealed, binding(row)), Err(CipherError::UnknownKey(_))));
    }

    #[test]
    fn a_value_that_cannot_be_sealed_is_an_error_not_an_empty_ciphertext() {
        let cipher = Cipher::new(&Cipher::generate_key(), &[]).expect("key");
        let row = uuid::Uuid::now_v7();
        let huge = vec![0u8; MAX_PLAINTEXT + 1];
        assert!(matches!(cipher.seal(&huge, binding(row)), Err(CipherError::Seal(n)) if n == huge.len()));
        let largest = cipher.seal(&huge[1..], binding(row)).expect("the largest value seals");
        assert_eq!(cipher.open(&largest, binding(row)).expect("opens").len(), MAX_PLAINTEXT);
    }

    #[test]
    fn bad_keys_are_refused() {
        assert!(Cipher::new("short", &[]).is_err());
        assert!(Cipher::new(&STANDARD.encode([0u8; 16]), &[]).is_err());
    }

    #[test]
    fn secrets_do_not_print() {
        assert_eq!(format!("{:?}", SecretString::new("pw".into())), "[redacted]");
    }
}
