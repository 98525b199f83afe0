//! OpenSSH public keys as the cluster view shows a login node's host keys (docs/api.md,
//! `endpoints`): the key line without its comment, and its SHA-256 fingerprint exactly as
//! `ssh-keygen -l -E sha256` prints it (`SHA256:` and the unpadded base64 of the SHA-256 of the
//! key blob), so a user compares it with what `ssh` shows on first connect.

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use base64::Engine;
use paddock_types::cluster::SshHostKey;
use sha2::{Digest, Sha256};

/// The host key algorithms sshd serves (OpenSSH's `HostKeyAlgorithms` for plain keys).
const ALGORITHMS: [&str; 5] =
    ["ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa"];

/// Why a line is not an OpenSSH host public key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SshKeyError {
    /// Fewer than two fields.
    #[error("not an OpenSSH public key line (`<algorithm> <base64> [comment]`)")]
    Shape,
    /// An algorithm sshd does not serve host keys of.
    #[error("unsupported host key algorithm {0:?}")]
    Algorithm(String),
    /// The key blob is not base64.
    #[error("the key is not base64")]
    Base64,
    /// The blob does not start with the algorithm named in the line.
    #[error("the key blob does not name the algorithm {0:?}")]
    Blob(String),
}

/// The key types a user's `authorized_keys` line may have: the host key types and the security
/// key (FIDO) types.
const USER_ALGORITHMS: [&str; 2] = ["sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com"];

/// Checks one user's OpenSSH public key line (`<algorithm> <base64> [comment]`, as in a `.pub`
/// file, no `authorized_keys` options): a known key type whose blob names that type.
pub fn user_key(line: &str) -> Result<(), SshKeyError> {
    let algorithm = line.split_whitespace().next().unwrap_or_default();
    if USER_ALGORITHMS.contains(&algorithm) {
        let encoded = line.split_whitespace().nth(1).ok_or(SshKeyError::Shape)?;
        let blob = STANDARD.decode(encoded).map_err(|_| SshKeyError::Base64)?;
        let named = blob
            .get(..4)
            .map(|len| u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize)
            .and_then(|len| blob.get(4..4 + len));
        return if named == Some(algorithm.as_bytes()) { Ok(()) } else { Err(SshKeyError::Blob(algorithm.to_owned())) };
    }
    host_key(line).map(|_| ())
}

/// Parses one OpenSSH public key line (`<algorithm> <base64> [comment]`, as in a `.pub` file) into
/// the host key the cluster view shows. The comment is dropped.
pub fn host_key(line: &str) -> Result<SshHostKey, SshKeyError> {
    let mut fields = line.split_whitespace();
    let (Some(algorithm), Some(encoded)) = (fields.next(), fields.next()) else {
        return Err(SshKeyError::Shape);
    };
    if !ALGORITHMS.contains(&algorithm) {
        return Err(SshKeyError::Algorithm(algorithm.chars().take(64).collect()));
    }
    let blob = STANDARD.decode(encoded).map_err(|_| SshKeyError::Base64)?;
    // The blob starts with the algorithm as an SSH string: a big-endian u32 length, then the bytes.
    let named = blob
        .get(..4)
        .map(|len| u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize)
        .and_then(|len| blob.get(4..4 + len));
    if named != Some(algorithm.as_bytes()) {
        return Err(SshKeyError::Blob(algorithm.to_owned()));
    }
    Ok(SshHostKey {
        algorithm: algorithm.to_owned(),
        fingerprint: format!("SHA256:{}", STANDARD_NO_PAD.encode(Sha256::digest(&blob))),
        public_key: format!("{algorithm} {encoded}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Generated with `ssh-keygen -t ed25519` / `-t ecdsa -b 384`; the fingerprints are what
    // `ssh-keygen -l -E sha256 -f <file>.pub` printed for them.
    const ED25519: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL2AmpA4kI/TYTmjC3Vf+h3HQc/vvGHZNgUIITHqcjcJ root@slurm-login";
    const ED25519_FINGERPRINT: &str = "SHA256:gZv72HZq4UhmTQ3QmrF3VWb5PXSV+UVu9JVQwPE7sL0";
    const ECDSA: &str = "ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBIoBvNgCu2hJmSJlW8dfSUHXUDrFIFl8qg682OdYKNPVYpEgl2glugIdJSivajUvIZ++IQQBWPxZrQxp/xb33XDIQHo0/QaWSfDiiLXSEUljBSiOIwyDVW9vVhDoD52jCQ== root@vm";
    const ECDSA_FINGERPRINT: &str = "SHA256:V8+WJa9xTFYBqReKNqoDtjzfgUus901mfO5qfrqY6Gk";

    #[test]
    fn fingerprints_are_those_ssh_keygen_prints() {
        let key = host_key(ED25519).expect("a host key");
        assert_eq!(key.algorithm, "ssh-ed25519");
        assert_eq!(key.fingerprint, ED25519_FINGERPRINT);
        assert_eq!(key.public_key, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL2AmpA4kI/TYTmjC3Vf+h3HQc/vvGHZNgUIITHqcjcJ");
        let key = host_key(&format!("  {ECDSA}\n")).expect("a host key");
        assert_eq!((key.algorithm.as_str(), key.fingerprint.as_str()), ("ecdsa-sha2-nistp384", ECDSA_FINGERPRINT));
        assert!(!key.public_key.contains("root@vm"), "the comment is dropped");
    }

    #[test]
    fn lines_that_are_not_host_keys_are_refused() {
        assert_eq!(host_key(""), Err(SshKeyError::Shape));
        assert_eq!(host_key("ssh-ed25519"), Err(SshKeyError::Shape));
        assert_eq!(host_key("ssh-dss AAAA"), Err(SshKeyError::Algorithm("ssh-dss".into())));
        assert_eq!(host_key("ssh-ed25519 not*base64"), Err(SshKeyError::Base64));
        // An ECDSA blob labelled as ed25519, and a blob too short to name anything.
        let ecdsa_blob = ECDSA.split(' ').nth(1).expect("a blob");
        assert_eq!(host_key(&format!("ssh-ed25519 {ecdsa_blob}")), Err(SshKeyError::Blob("ssh-ed25519".into())));
        assert_eq!(host_key("ssh-rsa AAAA"), Err(SshKeyError::Blob("ssh-rsa".into())));
    }
}
