//! Malformed token strings and the safety of error messages.

use jsonwebtoken::Algorithm;
use paddock_auth::AuthError;
use serde_json::json;

use crate::common::*;

#[tokio::test]
async fn malformed_token_strings_are_rejected_as_malformed() {
    let verifier = verifier(hs_config()).await;
    let valid = sign(Algorithm::HS256, None, &valid_claims());
    let (header, rest) = valid.split_once('.').expect("segments");
    let (payload, signature) = rest.split_once('.').expect("segments");
    let cases = [
        String::new(),
        "   ".to_owned(),
        "garbage".to_owned(),
        format!("{header}.{payload}"),
        format!("{header}.{payload}.{signature}.extra"),
        format!("{header}.{payload}.{signature}.a.b"),
        "!!!.@@@.###".to_owned(),
        format!("{header}.***.{signature}"),
        format!("{header}.{payload}.***"),
        format!("{header}=.{payload}.{signature}"),
        format!("Bearer {valid}"),
        format!("{}.{payload}.{signature}", b64("not json")),
        format!("{}.{payload}.{signature}", b64(r#"{"typ":"JWT"}"#)),
        format!("{}.{payload}.{signature}", b64(r#"{"alg":256}"#)),
        format!("{}.{payload}.{signature}", b64(r#"["HS256"]"#)),
        format!("{valid}{}", "A".repeat(20_000)),
    ];
    for token in cases {
        let error = reject(&verifier, &token).await;
        assert!(matches!(error, AuthError::Malformed(_)), "{token:.60}: {error:?}");
        assert_eq!(error.code(), "invalid_token");
    }
}

#[tokio::test]
async fn crit_header_extensions_are_refused() {
    let verifier = verifier(hs_config()).await;
    let token = forge(&json!({"alg": "HS256", "crit": ["exp"], "exp": 1}), &valid_claims(), "c2ln");
    assert!(matches!(reject(&verifier, &token).await, AuthError::Malformed(_)));
}

#[tokio::test]
async fn error_messages_never_echo_token_contents() {
    let verifier = verifier(hs_config()).await;
    let marker = "SECRET-MARKER-in-token";
    let tokens = [
        sign(Algorithm::HS256, None, &claims_with(json!({"sub": marker, "exp": now() - 999}))),
        sign(Algorithm::HS256, None, &claims_with(json!({"sub": marker, "iss": marker}))),
        sign(Algorithm::HS256, None, &claims_with(json!({"sub": marker, "aud": marker}))),
        sign(Algorithm::HS256, None, &claims_with(json!({"sub": marker, "roles": marker}))),
        forge(&json!({"alg": marker}), &valid_claims(), "c2ln"),
        forge(&json!({"alg": "HS256", "kid": marker}), &valid_claims(), "c2ln"),
        marker.to_owned(),
    ];
    for token in tokens {
        let error = reject(&verifier, &token).await;
        let text = format!("{error} / {error:?}");
        assert!(!text.contains(marker), "{text}");
        assert!(!text.contains(&token), "{text}");
    }
}
