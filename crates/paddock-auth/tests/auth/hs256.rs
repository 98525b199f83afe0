//! HS256: verification, tampering, minting.

use jsonwebtoken::{Algorithm, EncodingKey};
use paddock_auth::{mint_hs256, AuthError, Claims, Secret, Verifier};
use serde_json::json;

use crate::common::*;

#[tokio::test]
async fn hs256_token_verifies_and_returns_its_claims() {
    let verifier = verifier(hs_config()).await;
    let claims = valid_claims();
    let token = sign(Algorithm::HS256, None, &claims);

    let verified = accept(&verifier, &token).await;

    assert_eq!(verified.sub, "user-1");
    assert_eq!(verified.roles, vec!["tenant:admin".to_owned()]);
    assert_eq!(verified.tenant_id, Some(TENANT.parse().expect("uuid")));
    assert_eq!(verified.iss, "paddock");
    assert_eq!(verified.aud, json!("paddock"));
    assert_eq!(Some(verified.exp), claims["exp"].as_i64());
    assert_eq!(verified.iat, claims["iat"].as_i64());
    assert_eq!(verified.nbf, None);
}

#[tokio::test]
async fn hs256_token_signed_with_another_secret_is_a_bad_signature() {
    let verifier = verifier(hs_config()).await;
    let other = EncodingKey::from_secret(b"another-TEST-ONLY-secret-of-enough-length");
    let token = sign_with(Algorithm::HS256, &other, None, &valid_claims());

    assert!(matches!(reject(&verifier, &token).await, AuthError::BadSignature));
}

#[tokio::test]
async fn tampered_signature_is_rejected() {
    let verifier = verifier(hs_config()).await;
    let token = sign(Algorithm::HS256, None, &valid_claims());
    let (input, signature) = token.rsplit_once('.').expect("three segments");
    // Change the first signature character: still valid base64url, different bytes.
    let first = if signature.starts_with('A') { "B" } else { "A" };
    let tampered = format!("{input}.{first}{}", &signature[1..]);

    let error = reject(&verifier, &tampered).await;

    assert!(matches!(error, AuthError::BadSignature), "{error:?}");
    assert_eq!(error.code(), "invalid_token");
}

#[tokio::test]
async fn tampered_payload_is_rejected() {
    let verifier = verifier(hs_config()).await;
    let token = sign(Algorithm::HS256, None, &valid_claims());
    let mut parts = token.split('.');
    let (header, _, signature) = (parts.next().expect("header"), parts.next(), parts.next().expect("signature"));
    let escalated = claims_with(json!({"roles": ["provider:admin"]}));
    let tampered = format!("{header}.{}.{signature}", b64(escalated.to_string()));

    assert!(matches!(reject(&verifier, &tampered).await, AuthError::BadSignature));
}

#[tokio::test]
async fn minted_token_verifies_and_has_no_kid() {
    let secret = Secret::new(SECRET.to_vec());
    let claims = Claims {
        sub: "ops@example.com".to_owned(),
        roles: vec!["provider:admin".to_owned()],
        tenant_id: None,
        exp: now() + 60,
        nbf: Some(now() - 1),
        iat: Some(now()),
        iss: "paddock".to_owned(),
        aud: json!(["paddock", "other"]),
    };

    let token = mint_hs256(&secret, &claims).expect("mint");

    let header = jsonwebtoken::decode_header(&token).expect("header");
    assert_eq!(header.alg, Algorithm::HS256);
    assert_eq!(header.kid, None);
    let verifier = verifier(hs_config()).await;
    assert_eq!(accept(&verifier, &token).await, claims);
}

#[tokio::test]
async fn minting_with_a_short_secret_is_refused() {
    let claims: Claims = serde_json::from_value(valid_claims()).expect("claims");
    let error = mint_hs256(&Secret::new(b"short".to_vec()), &claims).expect_err("refused");
    assert!(matches!(error, AuthError::SigningSecretTooShort));
    assert!(error.is_server_side());
}

#[test]
fn verifier_is_clone_send_and_sync() {
    fn assert_traits<T: Clone + Send + Sync + 'static>() {}
    assert_traits::<Verifier>();
    assert_traits::<paddock_auth::VerifierConfig>();
    fn assert_error<T: std::error::Error + Send + Sync + 'static>() {}
    assert_error::<AuthError>();
    assert_error::<paddock_auth::AuthConfigError>();
}

#[test]
fn secret_never_prints_its_bytes() {
    let secret = Secret::new(SECRET.to_vec());
    assert_eq!(format!("{secret:?}"), "[redacted]");
    assert_eq!(secret.to_string(), "[redacted]");
    let config_debug = format!("{:?}", hs_config());
    assert!(config_debug.contains("[redacted]"), "{config_debug}");
    assert!(!config_debug.contains("TEST-ONLY-secret"), "{config_debug}");
}
