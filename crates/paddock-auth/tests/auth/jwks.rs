//! JWKS: kid selection, refresh on unknown kid, rotation, rate limiting, outages.

use std::time::{Duration, Instant};

use jsonwebtoken::{Algorithm, EncodingKey};
use paddock_auth::{AuthError, Verifier, VerifierConfig};
use serde_json::json;

use crate::common::*;

/// A verifier that may refetch the JWKS at any time (no rate limit).
async fn eager_verifier(cfg: VerifierConfig) -> Verifier {
    Verifier::with_jwks_min_refresh_interval(cfg, Duration::ZERO).await.expect("valid verifier config")
}

fn rsa_b_token(kid: Option<&str>) -> String {
    sign_with(Algorithm::RS256, &rsa_b_key(), kid, &valid_claims())
}

#[tokio::test]
async fn jwks_keys_verify_rs256_es256_and_eddsa_tokens_by_kid() {
    let server = JwksServer::start(Some(vec![jwk("rsa_a"), jwk("ec_p256"), jwk("ed25519")])).await;
    let verifier = verifier(server.config()).await;
    for (alg, kid) in [(Algorithm::RS256, "rsa-a"), (Algorithm::ES256, "ec-1"), (Algorithm::EdDSA, "ed-1")] {
        let token = sign(alg, Some(kid), &valid_claims());
        assert_eq!(accept(&verifier, &token).await.sub, "user-1", "{alg:?}");
    }
    assert_eq!(server.hits(), 1, "everything was served from the start-up fetch");
}

#[tokio::test]
async fn token_without_kid_is_tried_against_every_jwks_key_of_its_algorithm() {
    let server = JwksServer::start(Some(vec![jwk("rsa_a"), jwk("rsa_b")])).await;
    let verifier = verifier(server.config()).await;
    accept(&verifier, &sign(Algorithm::RS256, None, &valid_claims())).await;
    accept(&verifier, &rsa_b_token(None)).await;
}

#[tokio::test]
async fn token_kid_selects_only_the_key_with_that_kid() {
    let server = JwksServer::start(Some(vec![jwk("rsa_a"), jwk("rsa_b")])).await;
    let verifier = verifier(server.config()).await;
    // Signed by key B but naming key A: key B is not tried.
    let error = reject(&verifier, &rsa_b_token(Some("rsa-a"))).await;
    assert!(matches!(error, AuthError::BadSignature), "{error:?}");
}

#[tokio::test]
async fn unknown_kid_refreshes_the_jwks_once_then_fails() {
    let server = JwksServer::start(Some(vec![jwk("rsa_a")])).await;
    let verifier = eager_verifier(server.config()).await;
    assert_eq!(server.hits(), 1);

    let error = reject(&verifier, &sign(Algorithm::RS256, Some("nobody"), &valid_claims())).await;

    assert!(matches!(error, AuthError::UnknownKey), "{error:?}");
    assert_eq!(error.code(), "invalid_token");
    assert_eq!(server.hits(), 2, "exactly one refresh for the unknown kid");
}

#[tokio::test]
async fn rotated_key_verifies_after_the_unknown_kid_refresh() {
    let server = JwksServer::start(Some(vec![jwk("rsa_a")])).await;
    let verifier = eager_verifier(server.config()).await;
    accept(&verifier, &sign(Algorithm::RS256, Some("rsa-a"), &valid_claims())).await;

    // The identity service rotates: key B in, key A out.
    server.serve(vec![jwk("rsa_b")]);

    let claims = accept(&verifier, &rsa_b_token(Some("rsa-b"))).await;
    assert_eq!(claims.sub, "user-1");
    assert_eq!(server.hits(), 2);
    // The retired key is gone after the refresh.
    let error = reject(&verifier, &sign(Algorithm::RS256, Some("rsa-a"), &valid_claims())).await;
    assert!(matches!(error, AuthError::UnknownKey), "{error:?}");
}

#[tokio::test]
async fn unknown_kid_refresh_is_rate_limited() {
    let server = JwksServer::start(Some(vec![jwk("rsa_a")])).await;
    // `new` allows one fetch per 10 s, and the start-up fetch just happened.
    let verifier = verifier(server.config()).await;
    server.serve(vec![jwk("rsa_b")]);

    for _ in 0..5 {
        let error = reject(&verifier, &rsa_b_token(Some("rsa-b"))).await;
        assert!(matches!(error, AuthError::UnknownKey), "{error:?}");
    }
    assert_eq!(server.hits(), 1, "no refetch within the rate limit");
}

#[tokio::test]
async fn concurrent_unknown_kid_requests_share_one_refresh() {
    let server = JwksServer::start(Some(vec![jwk("rsa_a")])).await;
    let verifier = eager_verifier(server.config()).await;
    server.serve(vec![jwk("rsa_a"), jwk("rsa_b")]);
    let token = rsa_b_token(Some("rsa-b"));

    // Polled together: all of them look up the kid before the first fetch completes.
    let (a, b, c, d, e, f) = tokio::join!(
        verifier.verify(&token),
        verifier.verify(&token),
        verifier.verify(&token),
        verifier.verify(&token),
        verifier.verify(&token),
        verifier.verify(&token),
    );

    for result in [a, b, c, d, e, f] {
        result.expect("verified after the shared refresh");
    }
    assert_eq!(server.hits(), 2, "start-up fetch plus one shared refresh");
}

#[tokio::test]
async fn failed_first_fetch_does_not_prevent_startup_and_keys_load_lazily() {
    let server = JwksServer::start(None).await;
    let verifier = eager_verifier(server.config()).await;
    assert_eq!(server.hits(), 1, "start-up fetch attempted");
    let token = sign(Algorithm::RS256, Some("rsa-a"), &valid_claims());

    let error = reject(&verifier, &token).await;
    assert!(matches!(error, AuthError::KeysUnavailable), "{error:?}");
    assert_eq!(error.code(), "token_keys_unavailable");
    assert!(error.is_server_side());

    server.serve(vec![jwk("rsa_a")]);
    accept(&verifier, &token).await;
}

#[tokio::test]
async fn unreachable_jwks_yields_keys_unavailable() {
    // Reserve a port, then close it: connections are refused.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let verifier = eager_verifier(VerifierConfig {
        jwks_url: Some(format!("http://{addr}/jwks").parse().expect("url")),
        ..VerifierConfig::default()
    })
    .await;

    let error = reject(&verifier, &sign(Algorithm::ES256, None, &valid_claims())).await;
    assert!(matches!(error, AuthError::KeysUnavailable), "{error:?}");
}

#[tokio::test]
async fn static_keys_keep_working_while_the_jwks_is_down() {
    let server = JwksServer::start(None).await;
    let verifier = verifier(VerifierConfig {
        hs256_secret: hs_config().hs256_secret,
        public_keys_pem: Some(key_path("ec_p256_public.pem")),
        ..server.config()
    })
    .await;
    accept(&verifier, &sign(Algorithm::HS256, None, &valid_claims())).await;
    accept(&verifier, &sign(Algorithm::ES256, None, &valid_claims())).await;
}

#[tokio::test]
async fn token_with_kid_is_not_checked_against_static_keys_when_a_jwks_is_configured() {
    let server = JwksServer::start(Some(vec![jwk("rsa_a")])).await;
    let verifier = verifier(VerifierConfig {
        hs256_secret: hs_config().hs256_secret,
        public_keys_pem: Some(key_path("ec_p256_public.pem")),
        ..server.config()
    })
    .await;
    let hs = reject(&verifier, &sign(Algorithm::HS256, Some("ops"), &valid_claims())).await;
    assert!(matches!(hs, AuthError::UnknownKey), "{hs:?}");
    let es = reject(&verifier, &sign(Algorithm::ES256, Some("pem"), &valid_claims())).await;
    assert!(matches!(es, AuthError::UnknownKey), "{es:?}");
    // Without a kid both static keys are used.
    accept(&verifier, &sign(Algorithm::HS256, None, &valid_claims())).await;
    accept(&verifier, &sign(Algorithm::ES256, None, &valid_claims())).await;
}

#[tokio::test]
async fn symmetric_jwks_keys_are_never_used() {
    let shared = b"a-TEST-ONLY-symmetric-key-published-in-a-jwks";
    let server = JwksServer::start(Some(vec![
        json!({"kty": "oct", "kid": "sym", "alg": "HS256", "k": b64(shared)}),
        jwk("rsa_a"),
    ]))
    .await;
    let verifier = eager_verifier(server.config()).await;
    let key = EncodingKey::from_secret(shared);
    for kid in [Some("sym"), None] {
        let token = sign_with(Algorithm::HS256, &key, kid, &valid_claims());
        let error = reject(&verifier, &token).await;
        assert!(matches!(error, AuthError::UnknownKey | AuthError::UnsupportedAlgorithm), "{kid:?}: {error:?}");
    }
    assert_eq!(server.hits(), 1, "HS256 tokens never trigger a JWKS fetch");
}

#[tokio::test]
async fn hs256_token_naming_an_rsa_jwks_kid_is_rejected() {
    let server = JwksServer::start(Some(vec![jwk("rsa_a")])).await;
    let verifier = verifier(server.config()).await;
    // The attacker knows key A's public bytes (PEM and raw modulus) and its kid.
    let modulus = jwk("rsa_a")["n"].as_str().expect("n").to_owned();
    for secret in [read_key("rsa_a_public.pem"), modulus.into_bytes()] {
        let token = sign_with(Algorithm::HS256, &EncodingKey::from_secret(&secret), Some("rsa-a"), &valid_claims());
        let error = reject(&verifier, &token).await;
        assert!(matches!(error, AuthError::UnsupportedAlgorithm), "{error:?}");
    }
}

#[tokio::test]
async fn unsupported_jwks_keys_are_skipped_and_the_rest_used() {
    let server = JwksServer::start(None).await;
    server.serve_document(json!({"keys": [
        {"kty": "RSA", "kid": "enc", "use": "enc", "n": "AQAB", "e": "AQAB"},
        {"kty": "EC", "kid": "p384", "crv": "P-384", "x": "AA", "y": "AA"},
        {"kty": "OKP", "kid": "x", "crv": "X25519", "x": "AA"},
        {"kty": "RSA", "kid": "weak", "n": b64([0xffu8; 128]), "e": "AQAB"},
        {"kty": "QUANTUM", "kid": "future"},
        jwk("ec_p256"),
    ]}));
    let verifier = verifier(server.config()).await;
    accept(&verifier, &sign(Algorithm::ES256, Some("ec-1"), &valid_claims())).await;
}

#[tokio::test]
async fn jwks_is_refreshed_periodically_when_used() {
    let server = JwksServer::start(Some(vec![jwk("rsa_a")])).await;
    let verifier = eager_verifier(VerifierConfig { jwks_refresh: Duration::ZERO, ..server.config() }).await;
    server.serve(vec![jwk("rsa_b")]);
    // No kid, and key A is still loaded: only the periodic (background) refresh can pick up B.
    let token = rsa_b_token(None);

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match verifier.verify(&token).await {
            Ok(_) => break,
            Err(AuthError::BadSignature) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("key B never became usable: {error:?}"),
        }
    }
    assert!(server.hits() >= 2);
}

#[tokio::test]
async fn invalid_jwks_document_keeps_the_previous_keys() {
    let server = JwksServer::start(Some(vec![jwk("rsa_a")])).await;
    let verifier = eager_verifier(server.config()).await;
    server.serve_document(json!({"not": "a jwks"}));
    // The unknown kid forces a refresh, which fails; key A stays usable.
    let error = reject(&verifier, &rsa_b_token(Some("rsa-b"))).await;
    assert!(matches!(error, AuthError::KeysUnavailable), "{error:?}");
    accept(&verifier, &sign(Algorithm::RS256, Some("rsa-a"), &valid_claims())).await;
    assert_eq!(server.hits(), 2);
}

#[tokio::test]
async fn a_redirecting_jwks_endpoint_is_not_followed() {
    // The keys are one hop away, behind a redirect: a verifier that followed it would accept.
    let keys = JwksServer::start(Some(vec![jwk("ec_p256")])).await;
    let target = keys.config().jwks_url.expect("url").to_string();
    let app = axum::Router::new().route(
        "/jwks",
        axum::routing::get(move || {
            let target = target.clone();
            async move { axum::response::Redirect::temporary(&target) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let redirector = tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    let verifier = eager_verifier(VerifierConfig {
        jwks_url: Some(format!("http://{addr}/jwks").parse().expect("url")),
        ..VerifierConfig::default()
    })
    .await;
    let error = reject(&verifier, &sign(Algorithm::ES256, Some("ec-1"), &valid_claims())).await;
    assert!(matches!(error, AuthError::KeysUnavailable), "{error:?}");
    assert_eq!(keys.hits(), 0, "the redirect's target was fetched");
    redirector.abort();
}
