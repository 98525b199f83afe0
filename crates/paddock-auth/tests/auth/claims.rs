//! Claim validation: time, issuer, audience, subject, roles, tenant.

use jsonwebtoken::Algorithm;
use paddock_auth::{AuthError, VerifierConfig};
use serde_json::{json, Value};

use crate::common::*;

async fn verify_claims(cfg: VerifierConfig, claims: Value) -> Result<paddock_auth::Claims, AuthError> {
    let verifier = verifier(cfg).await;
    verifier.verify(&sign(Algorithm::HS256, None, &claims)).await
}

fn with_leeway(leeway_secs: u64) -> VerifierConfig {
    VerifierConfig { leeway_secs, ..hs_config() }
}

#[tokio::test]
async fn expired_token_is_rejected() {
    let error = verify_claims(hs_config(), claims_with(json!({"exp": now() - 120}))).await.expect_err("expired");
    assert!(matches!(error, AuthError::Expired), "{error:?}");
    assert_eq!(error.code(), "token_expired");
    assert!(!error.is_server_side());
}

#[tokio::test]
async fn not_yet_valid_token_is_rejected() {
    let error = verify_claims(hs_config(), claims_with(json!({"nbf": now() + 120}))).await.expect_err("not yet valid");
    assert!(matches!(error, AuthError::NotYetValid), "{error:?}");
    assert_eq!(error.code(), "token_not_yet_valid");
}

#[tokio::test]
async fn leeway_tolerates_small_clock_skew_on_exp_and_nbf() {
    // 10 s past expiry / 10 s before nbf: inside the default 30 s leeway.
    let skewed = claims_with(json!({"exp": now() - 10, "nbf": now() + 10}));
    let claims = verify_claims(hs_config(), skewed.clone()).await.expect("within leeway");
    assert_eq!(Some(claims.exp), skewed["exp"].as_i64());
    assert_eq!(claims.nbf, skewed["nbf"].as_i64());

    // Without leeway the same token fails on both counts.
    let expired = verify_claims(with_leeway(0), claims_with(json!({"exp": now() - 10}))).await;
    assert!(matches!(expired, Err(AuthError::Expired)), "{expired:?}");
    let early = verify_claims(with_leeway(0), claims_with(json!({"nbf": now() + 10}))).await;
    assert!(matches!(early, Err(AuthError::NotYetValid)), "{early:?}");

    // A larger leeway stretches further.
    verify_claims(with_leeway(300), claims_with(json!({"exp": now() - 200}))).await.expect("within a 300 s leeway");
}

#[tokio::test]
async fn exp_is_required_and_must_be_a_number() {
    let missing = verify_claims(hs_config(), claims_with(json!({"exp": null}))).await;
    assert!(matches!(missing, Err(AuthError::MissingClaim("exp"))), "{missing:?}");
    let text = verify_claims(hs_config(), claims_with(json!({"exp": "tomorrow"}))).await;
    assert!(matches!(text, Err(AuthError::InvalidClaim("exp"))), "{text:?}");
    let nbf = verify_claims(hs_config(), claims_with(json!({"nbf": "now"}))).await;
    assert!(matches!(nbf, Err(AuthError::InvalidClaim("nbf"))), "{nbf:?}");
}

#[tokio::test]
async fn a_token_must_say_when_it_was_issued_and_live_no_longer_than_the_maximum() {
    let missing = verify_claims(hs_config(), claims_with(json!({"iat": null}))).await;
    assert!(matches!(missing, Err(AuthError::MissingClaim("iat"))), "{missing:?}");
    let ahead = verify_claims(hs_config(), claims_with(json!({"iat": now() + 120}))).await;
    assert!(matches!(ahead, Err(AuthError::InvalidClaim("iat"))), "issued in the future: {ahead:?}");

    // The default maximum is a day: a week-long token is refused although it has not expired.
    let week = claims_with(json!({"iat": now() - 60, "exp": now() + 7 * 86_400}));
    let error = verify_claims(hs_config(), week.clone()).await.expect_err("too long");
    assert!(matches!(error, AuthError::LifetimeTooLong { max_secs: 86_400 }), "{error:?}");
    assert_eq!(error.code(), "invalid_token");
    let day = claims_with(json!({"iat": now() - 60, "exp": now() + 86_400 - 60}));
    verify_claims(hs_config(), day).await.expect("exactly a day");
    // The maximum is a setting.
    let short = VerifierConfig { max_lifetime_secs: 300, ..hs_config() };
    let hour = claims_with(json!({"iat": now(), "exp": now() + 3600}));
    assert!(matches!(verify_claims(short, hour).await, Err(AuthError::LifetimeTooLong { max_secs: 300 })));
    let long = VerifierConfig { max_lifetime_secs: 30 * 86_400, ..hs_config() };
    verify_claims(long, week).await.expect("a week within a 30-day maximum");
}

#[tokio::test]
async fn fractional_numeric_dates_are_accepted() {
    let exp = now() + 600;
    let claims =
        verify_claims(hs_config(), claims_with(json!({"exp": exp as f64 + 0.5}))).await.expect("fractional exp");
    assert_eq!(claims.exp, exp);
}

#[tokio::test]
async fn wrong_or_missing_issuer_is_rejected() {
    let wrong = verify_claims(hs_config(), claims_with(json!({"iss": "someone-else"}))).await;
    assert!(matches!(wrong, Err(AuthError::WrongIssuer)), "{wrong:?}");
    let missing = verify_claims(hs_config(), claims_with(json!({"iss": null}))).await;
    assert!(matches!(missing, Err(AuthError::MissingClaim("iss"))), "{missing:?}");

    let custom = VerifierConfig { issuer: "https://id.example.com".to_owned(), ..hs_config() };
    verify_claims(custom, claims_with(json!({"iss": "https://id.example.com"}))).await.expect("configured issuer");
}

#[tokio::test]
async fn wrong_or_missing_audience_is_rejected() {
    let wrong = verify_claims(hs_config(), claims_with(json!({"aud": "other-service"}))).await;
    assert!(matches!(wrong, Err(AuthError::WrongAudience)), "{wrong:?}");
    let missing = verify_claims(hs_config(), claims_with(json!({"aud": null}))).await;
    assert!(matches!(missing, Err(AuthError::MissingClaim("aud"))), "{missing:?}");
    let number = verify_claims(hs_config(), claims_with(json!({"aud": 7}))).await;
    assert!(matches!(number, Err(AuthError::InvalidClaim("aud"))), "{number:?}");
}

#[tokio::test]
async fn audience_array_must_contain_the_configured_audience() {
    let claims = verify_claims(hs_config(), claims_with(json!({"aud": ["billing", "paddock"]})))
        .await
        .expect("audience in array");
    assert_eq!(claims.aud, json!(["billing", "paddock"]));

    let absent = verify_claims(hs_config(), claims_with(json!({"aud": ["billing", "portal"]}))).await;
    assert!(matches!(absent, Err(AuthError::WrongAudience)), "{absent:?}");
    let empty = verify_claims(hs_config(), claims_with(json!({"aud": []}))).await;
    assert!(matches!(empty, Err(AuthError::WrongAudience)), "{empty:?}");
    let mixed = verify_claims(hs_config(), claims_with(json!({"aud": ["paddock", 1]}))).await;
    assert!(matches!(mixed, Err(AuthError::InvalidClaim("aud"))), "{mixed:?}");
}

#[tokio::test]
async fn subject_is_required_and_not_empty() {
    for sub in [json!(null), json!("")] {
        let result = verify_claims(hs_config(), claims_with(json!({ "sub": sub }))).await;
        assert!(matches!(result, Err(AuthError::MissingClaim("sub"))), "{result:?}");
    }
    let number = verify_claims(hs_config(), claims_with(json!({"sub": 42}))).await;
    assert!(matches!(number, Err(AuthError::InvalidClaim("sub"))), "{number:?}");
}

#[tokio::test]
async fn roles_must_be_an_array_of_strings_and_default_to_none() {
    let none = verify_claims(hs_config(), claims_with(json!({"roles": null}))).await.expect("roles optional");
    assert!(none.roles.is_empty());
    let several = verify_claims(hs_config(), claims_with(json!({"roles": ["a", "b"]}))).await.expect("roles array");
    assert_eq!(several.roles, vec!["a".to_owned(), "b".to_owned()]);
    for bad in [json!("provider:admin"), json!(["ok", 1]), json!({"role": "x"})] {
        let result = verify_claims(hs_config(), claims_with(json!({ "roles": bad }))).await;
        assert!(matches!(result, Err(AuthError::InvalidClaim("roles"))), "{result:?}");
    }
}

#[tokio::test]
async fn tenant_id_must_be_a_uuid_when_present() {
    let absent = verify_claims(hs_config(), claims_with(json!({"tenant_id": null}))).await.expect("tenant optional");
    assert_eq!(absent.tenant_id, None);
    for bad in [json!("tenant-1"), json!(7)] {
        let result = verify_claims(hs_config(), claims_with(json!({ "tenant_id": bad }))).await;
        assert!(matches!(result, Err(AuthError::InvalidClaim("tenant_id"))), "{result:?}");
    }
}

#[tokio::test]
async fn signed_payload_that_is_not_an_object_is_malformed() {
    let verifier = verifier(hs_config()).await;
    for payload in [json!(["array"]), json!("text"), json!(1)] {
        let token = sign(Algorithm::HS256, None, &payload);
        let error = reject(&verifier, &token).await;
        assert!(matches!(error, AuthError::Malformed(_)), "{error:?}");
    }
}

/// Signed payloads a struct-shaped parse could misread: the claims as an array (serde reads a
/// struct from one, by position) and a claim given twice (which one counts is ambiguous).
#[tokio::test]
async fn signed_payload_of_positional_claims_or_a_claim_twice_is_malformed() {
    let verifier = verifier(hs_config()).await;
    let (now, header) = (now(), b64(r#"{"alg":"HS256","typ":"JWT"}"#));
    let positional = json!([now + 600, null, now, "paddock", "paddock", "user-1", ["tenant:admin"], TENANT]);
    let twice =
        format!(r#"{{"sub":"user-1","sub":"admin","iss":"paddock","aud":"paddock","exp":{},"iat":{now}}}"#, now + 600);
    for payload in [positional.to_string(), twice] {
        let input = format!("{header}.{}", b64(&payload));
        let key = encoding_key(Algorithm::HS256);
        let signature = jsonwebtoken::crypto::sign(input.as_bytes(), &key, Algorithm::HS256).expect("sign");
        let error = reject(&verifier, &format!("{input}.{signature}")).await;
        assert!(matches!(error, AuthError::Malformed(_)), "{payload}: {error:?}");
    }
}
