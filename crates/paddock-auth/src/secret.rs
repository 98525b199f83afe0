//! [`Secret`]: key material that never shows up in logs or debug output.

use std::fmt;

/// Secret bytes (such as the HS256 key) whose `Debug` and `Display` print `[redacted]`.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Wraps secret bytes.
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }

    /// Returns the secret bytes; call this only where the key is actually used.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// Returns the length of the secret in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Returns whether the secret is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<Vec<u8>> for Secret {
    fn from(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }
}

impl From<String> for Secret {
    fn from(text: String) -> Self {
        Self(text.into_bytes())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_debug_and_display_are_redacted() {
        let secret = Secret::new(b"hunter2-hunter2-hunter2-hunter2!".to_vec());
        assert_eq!(format!("{secret:?}"), "[redacted]");
        assert_eq!(format!("{secret}"), "[redacted]");
        assert_eq!(format!("{:?}", Some(secret.clone())), "Some([redacted])");
        assert_eq!(secret.expose(), b"hunter2-hunter2-hunter2-hunter2!");
    }
}
