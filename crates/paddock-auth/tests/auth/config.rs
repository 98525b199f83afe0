//! Configurations the verifier refuses, each naming what to fix.

use std::path::{Path, PathBuf};

use paddock_auth::{AuthConfigError, Secret, Verifier, VerifierConfig};

use crate::common::*;

async fn refuse(cfg: VerifierConfig) -> AuthConfigError {
    match Verifier::new(cfg).await {
        Ok(verifier) => panic!("configuration unexpectedly accepted: {verifier:?}"),
        Err(error) => error,
    }
}

fn pem_file(path: &Path) -> VerifierConfig {
    VerifierConfig { public_keys_pem: Some(path.to_owned()), ..VerifierConfig::default() }
}

fn scratch_pem(contents: &str) -> PathBuf {
    let path = scratch_dir("pem").join("keys.pem");
    std::fs::write(&path, contents).expect("write");
    path
}

#[tokio::test]
async fn no_key_source_is_refused() {
    let error = refuse(VerifierConfig::default()).await;
    assert!(matches!(error, AuthConfigError::NoKeyConfigured));
    assert_eq!(
        error.to_string(),
        "no JWT key configured: set PADDOCK_JWT_HS256_SECRET, PADDOCK_JWT_PUBLIC_KEYS or PADDOCK_JWT_JWKS_URL"
    );
}

#[tokio::test]
async fn empty_or_short_hs256_secret_is_refused() {
    let with_secret =
        |bytes: &[u8]| VerifierConfig { hs256_secret: Some(Secret::new(bytes.to_vec())), ..VerifierConfig::default() };
    let empty = refuse(with_secret(b"")).await;
    assert!(matches!(empty, AuthConfigError::Hs256SecretEmpty), "{empty:?}");
    let short = refuse(with_secret(&[7u8; 31])).await;
    assert!(matches!(short, AuthConfigError::Hs256SecretTooShort { len: 31 }), "{short:?}");
    for error in [empty, short] {
        assert!(error.to_string().contains("PADDOCK_JWT_HS256_SECRET"), "{error}");
    }
    Verifier::new(with_secret(&[7u8; 32])).await.expect("32 bytes is enough");
}

#[tokio::test]
async fn missing_pem_file_is_refused_naming_setting_and_file() {
    let path = scratch_dir("missing").join("nope.pem");
    let error = refuse(pem_file(&path)).await;
    assert!(matches!(error, AuthConfigError::PublicKeysRead { .. }), "{error:?}");
    let text = error.to_string();
    assert!(text.contains("PADDOCK_JWT_PUBLIC_KEYS"), "{text}");
    assert!(text.contains(&path.display().to_string()), "{text}");
}

#[tokio::test]
async fn malformed_pem_files_are_refused_naming_setting_and_file() {
    let cases = [
        "",
        "just some text, no PEM here\n",
        "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA\n",
        "-----BEGIN PUBLIC KEY-----\n%%%% not base64 %%%%\n-----END PUBLIC KEY-----\n",
        "-----BEGIN PUBLIC KEY-----\nZ2FyYmFnZSBkZXI=\n-----END PUBLIC KEY-----\n",
        "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END RSA PUBLIC KEY-----\n",
    ];
    for contents in cases {
        let path = scratch_pem(contents);
        let error = refuse(pem_file(&path)).await;
        assert!(matches!(error, AuthConfigError::PublicKeysMalformed { .. }), "{contents:?}: {error:?}");
        let text = error.to_string();
        assert!(text.contains("PADDOCK_JWT_PUBLIC_KEYS"), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");
    }
}

#[tokio::test]
async fn directory_without_pem_files_is_refused() {
    let dir = scratch_dir("empty-dir");
    let error = refuse(pem_file(&dir)).await;
    assert!(matches!(error, AuthConfigError::PublicKeysMalformed { .. }), "{error:?}");
}

#[tokio::test]
async fn unsupported_key_types_are_refused() {
    for (file, expected) in [
        ("unsupported_ec_p384_public.pem", "P-384"),
        ("unsupported_ed448_public.pem", "Ed448"),
        ("unsupported_rsa_1024_public.pem", "1024 bits"),
        ("unsupported_certificate.pem", "certificate"),
    ] {
        let error = refuse(pem_config(file)).await;
        assert!(matches!(error, AuthConfigError::PublicKeyUnsupported { index: 1, .. }), "{file}: {error:?}");
        let text = error.to_string();
        assert!(text.contains(expected), "{text}");
        assert!(text.contains("PADDOCK_JWT_PUBLIC_KEYS") && text.contains(file), "{text}");
    }
}

#[tokio::test]
async fn unsupported_key_after_a_good_one_is_refused_with_its_position() {
    let mut text = String::from_utf8(read_key("rsa_a_public.pem")).expect("utf-8");
    text.push_str(&String::from_utf8(read_key("unsupported_ec_p384_public.pem")).expect("utf-8"));
    let error = refuse(pem_file(&scratch_pem(&text))).await;
    assert!(matches!(error, AuthConfigError::PublicKeyUnsupported { index: 2, .. }), "{error:?}");
}

#[tokio::test]
async fn private_keys_in_the_public_key_file_are_refused() {
    for file in ["rsa_a_TEST_ONLY_private.pem", "ec_p256_TEST_ONLY_private.pem", "ed25519_TEST_ONLY_private.pem"] {
        let error = refuse(pem_config(file)).await;
        assert!(matches!(error, AuthConfigError::PrivateKeyConfigured { .. }), "{file}: {error:?}");
        // The message names the file but never prints key material.
        assert!(!error.to_string().contains("MII"), "{error}");
    }
}

#[tokio::test]
async fn jwks_url_must_be_https_or_loopback_http() {
    for url in [
        "file:///etc/passwd",
        "ftp://id.example.com/jwks",
        "unix:/run/jwks.sock",
        "http://id.example.com/jwks",
        "http://10.0.0.5/jwks",
    ] {
        let error =
            refuse(VerifierConfig { jwks_url: Some(url.parse().expect("url")), ..VerifierConfig::default() }).await;
        assert!(matches!(error, AuthConfigError::JwksUrlScheme { .. }), "{url}: {error:?}");
        assert!(error.to_string().contains("PADDOCK_JWT_JWKS_URL"), "{error}");
    }
}

#[tokio::test]
async fn empty_issuer_or_audience_is_refused() {
    let issuer = refuse(VerifierConfig { issuer: String::new(), ..hs_config() }).await;
    assert!(matches!(issuer, AuthConfigError::IssuerEmpty), "{issuer:?}");
    let audience = refuse(VerifierConfig { audience: String::new(), ..hs_config() }).await;
    assert!(matches!(audience, AuthConfigError::AudienceEmpty), "{audience:?}");
}

#[test]
fn default_config_matches_the_spec_defaults() {
    let cfg = VerifierConfig::default();
    assert_eq!(cfg.issuer, "paddock");
    assert_eq!(cfg.audience, "paddock");
    assert_eq!(cfg.leeway_secs, 30);
    assert_eq!(cfg.jwks_refresh, std::time::Duration::from_secs(300));
    assert!(cfg.hs256_secret.is_none() && cfg.public_keys_pem.is_none() && cfg.jwks_url.is_none());
}
