//! Loading `PADDOCK_JWT_PUBLIC_KEYS`: a PEM file with one or more public keys, or a directory of
//! `*.pem` files. Every block must be a supported public key; anything else refuses start-up.

use std::path::{Path, PathBuf};

use base64::Engine as _;

use crate::der::{self, KeyError};
use crate::error::AuthConfigError;
use crate::keys::VerifyKey;

/// One `-----BEGIN <label>----- ... -----END <label>-----` block.
struct Block {
    label: String,
    der: Vec<u8>,
}

/// Loads every public key from a PEM file, or from each `*.pem` file of a directory (sorted by
/// name). PEM keys have no `kid`.
pub(crate) fn load_public_keys(path: &Path) -> Result<Vec<VerifyKey>, AuthConfigError> {
    // Start-up only: blocking file I/O on a handful of small files is fine here.
    let read_err = |source| AuthConfigError::PublicKeysRead { path: path.to_owned(), source };
    let meta = std::fs::metadata(path).map_err(read_err)?;
    if !meta.is_dir() {
        return load_file(path);
    }
    let mut files: Vec<PathBuf> = Vec::new();
    for entry in std::fs::read_dir(path).map_err(read_err)? {
        let entry_path = entry.map_err(read_err)?.path();
        if entry_path.extension().is_some_and(|ext| ext == "pem") && entry_path.is_file() {
            files.push(entry_path);
        }
    }
    if files.is_empty() {
        return Err(AuthConfigError::PublicKeysMalformed {
            path: path.to_owned(),
            reason: "the directory contains no .pem file".to_owned(),
        });
    }
    files.sort();
    let mut keys = Vec::new();
    for file in &files {
        keys.extend(load_file(file)?);
    }
    Ok(keys)
}

fn load_file(path: &Path) -> Result<Vec<VerifyKey>, AuthConfigError> {
    let malformed = |reason: String| AuthConfigError::PublicKeysMalformed { path: path.to_owned(), reason };
    let bytes =
        std::fs::read(path).map_err(|source| AuthConfigError::PublicKeysRead { path: path.to_owned(), source })?;
    let text = String::from_utf8(bytes).map_err(|_| malformed("not a PEM text file".to_owned()))?;
    let blocks = parse_blocks(&text).map_err(malformed)?;
    if blocks.is_empty() {
        return Err(malformed("no PEM block found".to_owned()));
    }
    let mut keys = Vec::with_capacity(blocks.len());
    for (i, block) in blocks.into_iter().enumerate() {
        let index = i + 1;
        let unsupported = |kind: String| AuthConfigError::PublicKeyUnsupported { path: path.to_owned(), index, kind };
        let parsed = match block.label.as_str() {
            "PUBLIC KEY" => der::parse_spki(&block.der),
            "RSA PUBLIC KEY" => der::parse_rsa_pkcs1(&block.der),
            "CERTIFICATE" => {
                return Err(unsupported(
                    "an X.509 certificate; extract its key with `openssl x509 -pubkey -noout`".to_owned(),
                ))
            }
            label if label.contains("PRIVATE KEY") => {
                return Err(AuthConfigError::PrivateKeyConfigured { path: path.to_owned(), index })
            }
            label => return Err(unsupported(format!("a `{label}` PEM block"))),
        };
        match parsed {
            Ok(key) => keys.push(VerifyKey::public(key, None)),
            Err(KeyError::Malformed(reason)) => return Err(malformed(format!("key #{index}: {reason}"))),
            Err(KeyError::Unsupported(kind)) => return Err(unsupported(kind)),
        }
    }
    Ok(keys)
}

/// Splits PEM text into blocks (RFC 7468). Text outside blocks is ignored, as the RFC allows.
fn parse_blocks(text: &str) -> Result<Vec<Block>, String> {
    let mut blocks = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines().map(str::trim) {
        match current.take() {
            None => {
                if let Some(label) = delimited(line, "-----BEGIN ") {
                    current = Some((label.to_owned(), String::new()));
                } else if line.starts_with("-----END ") {
                    return Err("END line without a BEGIN line".to_owned());
                }
            }
            Some((label, mut body)) => {
                if let Some(end) = delimited(line, "-----END ") {
                    if end != label {
                        return Err(format!("`BEGIN {label}` closed by `END {end}`"));
                    }
                    let der = base64::engine::general_purpose::STANDARD
                        .decode(body.as_bytes())
                        .map_err(|_| format!("the `{label}` block is not valid base64"))?;
                    blocks.push(Block { label, der });
                } else if line.starts_with("-----BEGIN ") {
                    return Err(format!("the `{label}` block has no END line"));
                } else {
                    body.push_str(line);
                    current = Some((label, body));
                }
            }
        }
    }
    if let Some((label, _)) = current {
        return Err(format!("the `{label}` block has no END line"));
    }
    Ok(blocks)
}

/// Returns the label of a `-----BEGIN label-----` / `-----END label-----` line.
fn delimited<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    line.strip_prefix(prefix)?.strip_suffix("-----")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_split_and_surrounding_text_ignored() {
        let text = "comment\n-----BEGIN A-----\nAAEC\n-----END A-----\n\n-----BEGIN B-----\nAw==\n-----END B-----\n";
        let blocks = parse_blocks(text).expect("valid PEM");
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].label, "A");
        assert_eq!(blocks[0].der, vec![0, 1, 2]);
        assert_eq!(blocks[1].der, vec![3]);
    }

    #[test]
    fn unbalanced_or_undecodable_blocks_are_errors() {
        assert!(parse_blocks("-----BEGIN A-----\nAAEC\n").is_err());
        assert!(parse_blocks("-----BEGIN A-----\nAAEC\n-----END B-----\n").is_err());
        assert!(parse_blocks("-----END A-----\n").is_err());
        assert!(parse_blocks("-----BEGIN A-----\n!!!!\n-----END A-----\n").is_err());
        assert!(parse_blocks("no pem here").expect("no blocks").is_empty());
    }
}
