//! RS256, ES256 and EdDSA with PEM keys; algorithm pinning and confusion attacks.

use std::path::PathBuf;

use jsonwebtoken::{Algorithm, EncodingKey};
use paddock_auth::{AuthError, VerifierConfig};
use serde_json::json;

use crate::common::*;

/// One PEM file holding the RSA A, EC P-256 and Ed25519 public keys.
fn combined_pem() -> PathBuf {
    let dir = scratch_dir("combined");
    let mut text = String::from("Test-only public keys; text outside blocks is ignored.\n");
    for name in ["rsa_a_public.pem", "ec_p256_public.pem", "ed25519_public.pem"] {
        text.push_str(&String::from_utf8(read_key(name)).expect("utf-8"));
    }
    let path = dir.join("keys.pem");
    std::fs::write(&path, text).expect("write");
    path
}

#[tokio::test]
async fn rs256_token_verifies_with_an_rsa_public_key() {
    let verifier = verifier(pem_config("rsa_a_public.pem")).await;
    let token = sign(Algorithm::RS256, None, &valid_claims());
    assert_eq!(accept(&verifier, &token).await.sub, "user-1");
}

#[tokio::test]
async fn rs256_token_verifies_with_a_pkcs1_rsa_public_key() {
    let verifier = verifier(pem_config("rsa_a_public_pkcs1.pem")).await;
    let token = sign(Algorithm::RS256, None, &valid_claims());
    assert_eq!(accept(&verifier, &token).await.sub, "user-1");
}

#[tokio::test]
async fn es256_token_verifies_with_a_p256_public_key() {
    let verifier = verifier(pem_config("ec_p256_public.pem")).await;
    let token = sign(Algorithm::ES256, None, &valid_claims());
    assert_eq!(accept(&verifier, &token).await.sub, "user-1");
}

#[tokio::test]
async fn eddsa_token_verifies_with_an_ed25519_public_key() {
    let verifier = verifier(pem_config("ed25519_public.pem")).await;
    let token = sign(Algorithm::EdDSA, None, &valid_claims());
    assert_eq!(accept(&verifier, &token).await.sub, "user-1");
}

#[tokio::test]
async fn pem_file_with_several_keys_verifies_every_algorithm() {
    let verifier =
        verifier(VerifierConfig { public_keys_pem: Some(combined_pem()), ..VerifierConfig::default() }).await;
    for alg in [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA] {
        let token = sign(alg, None, &valid_claims());
        assert_eq!(accept(&verifier, &token).await.sub, "user-1", "{alg:?}");
    }
}

#[tokio::test]
async fn pem_directory_loads_every_pem_file() {
    let dir = scratch_dir("dir");
    for name in ["rsa_b_public.pem", "ec_p256_public.pem"] {
        std::fs::copy(key_path(name), dir.join(name)).expect("copy");
    }
    std::fs::write(dir.join("README.txt"), "not a key, and not a .pem file").expect("write");
    let verifier = verifier(VerifierConfig { public_keys_pem: Some(dir), ..VerifierConfig::default() }).await;

    let rs = sign_with(Algorithm::RS256, &rsa_b_key(), None, &valid_claims());
    accept(&verifier, &rs).await;
    accept(&verifier, &sign(Algorithm::ES256, None, &valid_claims())).await;
}

#[tokio::test]
async fn rs256_token_from_another_key_is_a_bad_signature() {
    let verifier = verifier(pem_config("rsa_a_public.pem")).await;
    let token = sign_with(Algorithm::RS256, &rsa_b_key(), None, &valid_claims());
    assert!(matches!(reject(&verifier, &token).await, AuthError::BadSignature));
}

#[tokio::test]
async fn token_algorithm_must_match_a_configured_key_type() {
    let rsa_only = verifier(pem_config("rsa_a_public.pem")).await;
    for alg in [Algorithm::ES256, Algorithm::EdDSA, Algorithm::HS256] {
        let token = sign(alg, None, &valid_claims());
        let error = reject(&rsa_only, &token).await;
        assert!(matches!(error, AuthError::UnsupportedAlgorithm), "{alg:?}: {error:?}");
    }
    let hs_only = verifier(hs_config()).await;
    let token = sign(Algorithm::RS256, None, &valid_claims());
    assert!(matches!(reject(&hs_only, &token).await, AuthError::UnsupportedAlgorithm));
}

#[tokio::test]
async fn rewriting_the_alg_header_does_not_move_a_signature_to_another_key() {
    let verifier =
        verifier(VerifierConfig { public_keys_pem: Some(combined_pem()), ..VerifierConfig::default() }).await;
    let token = sign(Algorithm::ES256, None, &valid_claims());
    let (_, rest) = token.split_once('.').expect("segments");
    for alg in ["RS256", "EdDSA"] {
        let relabelled = format!("{}.{rest}", b64(json!({"alg": alg, "typ": "JWT"}).to_string()));
        let error = reject(&verifier, &relabelled).await;
        assert!(matches!(error, AuthError::BadSignature), "{alg}: {error:?}");
    }
}

#[tokio::test]
async fn algorithms_other_than_the_four_pinned_ones_are_rejected() {
    let verifier = verifier(VerifierConfig {
        hs256_secret: hs_config().hs256_secret,
        public_keys_pem: Some(combined_pem()),
        ..VerifierConfig::default()
    })
    .await;
    // Properly signed with a configured RSA key, but with an algorithm we never accept.
    for alg in [Algorithm::RS512, Algorithm::PS256] {
        let token = sign(alg, None, &valid_claims());
        let error = reject(&verifier, &token).await;
        assert!(matches!(error, AuthError::UnsupportedAlgorithm), "{alg:?}: {error:?}");
    }
    for alg in ["HS384", "HS512", "ES384", "RS384", "PS512", "Ed25519", "hs256", "", "none"] {
        let token = forge(&json!({"alg": alg}), &valid_claims(), "c2ln");
        let error = reject(&verifier, &token).await;
        assert!(matches!(error, AuthError::UnsupportedAlgorithm), "{alg}: {error:?}");
    }
}

#[tokio::test]
async fn alg_none_is_rejected_in_every_spelling() {
    let verifier = verifier(VerifierConfig {
        hs256_secret: hs_config().hs256_secret,
        public_keys_pem: Some(combined_pem()),
        ..VerifierConfig::default()
    })
    .await;
    for alg in ["none", "None", "NONE", "nOnE"] {
        for signature in ["", "c2ln"] {
            let token = forge(&json!({"alg": alg, "typ": "JWT"}), &valid_claims(), signature);
            let error = reject(&verifier, &token).await;
            assert!(matches!(error, AuthError::UnsupportedAlgorithm), "{alg}: {error:?}");
            assert_eq!(error.code(), "invalid_token");
        }
    }
    // The classic two-segment form is not even a JWS.
    let two = format!("{}.{}", b64(r#"{"alg":"none"}"#), b64(valid_claims().to_string()));
    assert!(matches!(reject(&verifier, &two).await, AuthError::Malformed(_)));
}

#[tokio::test]
async fn hs256_signed_with_the_rsa_public_key_is_rejected_when_only_rsa_is_configured() {
    let verifier = verifier(pem_config("rsa_a_public.pem")).await;
    for public in ["rsa_a_public.pem", "rsa_a_public_pkcs1.pem"] {
        let confused = EncodingKey::from_secret(&read_key(public));
        let token = sign_with(Algorithm::HS256, &confused, None, &valid_claims());
        let error = reject(&verifier, &token).await;
        assert!(matches!(error, AuthError::UnsupportedAlgorithm), "{public}: {error:?}");
    }
}

#[tokio::test]
async fn hs256_signed_with_the_rsa_public_key_is_rejected_when_a_secret_is_configured_too() {
    let verifier = verifier(VerifierConfig {
        hs256_secret: hs_config().hs256_secret,
        public_keys_pem: Some(key_path("rsa_a_public.pem")),
        ..VerifierConfig::default()
    })
    .await;
    let confused = EncodingKey::from_secret(&read_key("rsa_a_public.pem"));
    let token = sign_with(Algorithm::HS256, &confused, None, &valid_claims());
    assert!(matches!(reject(&verifier, &token).await, AuthError::BadSignature));
    // Both legitimate kinds still work side by side.
    accept(&verifier, &sign(Algorithm::HS256, None, &valid_claims())).await;
    accept(&verifier, &sign(Algorithm::RS256, None, &valid_claims())).await;
}

#[tokio::test]
async fn token_kid_is_ignored_when_no_jwks_is_configured() {
    let verifier = verifier(pem_config("rsa_a_public.pem")).await;
    let token = sign(Algorithm::RS256, Some("some-kid"), &valid_claims());
    accept(&verifier, &token).await;
    let hs = super::common::verifier(hs_config()).await;
    accept(&hs, &sign(Algorithm::HS256, Some("some-kid"), &valid_claims())).await;
}
