//! Bearer authentication through the HTTP API: every token that must not pass is a 401
//! problem+json with `WWW-Authenticate: Bearer ...` and writes nothing; clock skew within the
//! leeway (30 s) is tolerated; a valid token whose roles grant nothing is a 403, not a 401.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use paddock_testkit::{admin, token, token_with, Resp, TestApp, TEST_SECRET};
use serde_json::{json, Value};

/// Another secret of valid length, which the API does not know.
const OTHER_SECRET: &[u8] = b"some-other-secret-that-is-also-32-bytes-long";

/// The test RSA private key (the API has no RSA key configured).
const RSA_PRIVATE_PEM: &str = include_str!("../../crates/paddock-auth/tests/keys/rsa_a_TEST_ONLY_private.pem");

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Valid provider-admin claims as JSON, for hand-made tokens.
fn claims() -> Value {
    let now = now();
    json!({
        "sub": "test-user",
        "roles": ["provider:admin"],
        "exp": now + 3600,
        "nbf": now - 5,
        "iat": now,
        "iss": "paddock",
        "aud": "paddock",
    })
}

/// Signs `claims` with `header` and `key`.
fn sign(header: &Header, claims: &Value, key: &EncodingKey) -> String {
    jsonwebtoken::encode(header, claims, key).expect("signing a test token")
}

/// An HS256 token over `claims` with `secret`.
fn hs256(claims: &Value, secret: &[u8]) -> String {
    sign(&Header::new(Algorithm::HS256), claims, &EncodingKey::from_secret(secret))
}

/// HMAC-SHA256, through jsonwebtoken (an HS256 signature over `input`).
fn hmac_sha256(secret: &[u8], input: &[u8]) -> Vec<u8> {
    let sig = jsonwebtoken::crypto::sign(input, &EncodingKey::from_secret(secret), Algorithm::HS256).expect("hmac");
    URL_SAFE_NO_PAD.decode(sig).expect("base64url")
}

/// A token with a hand-written header over `claims`, HMAC-SHA256-signed with `secret` whatever
/// the header says.
fn hand_signed_with(secret: &[u8], header: &str, claims: &Value) -> String {
    let input = format!("{}.{}", b64(header.as_bytes()), b64(claims.to_string().as_bytes()));
    let signature = hmac_sha256(secret, input.as_bytes());
    format!("{input}.{}", b64(&signature))
}

/// [`hand_signed_with`] the test secret.
fn hand_signed(header: &str, claims: &Value) -> String {
    hand_signed_with(TEST_SECRET, header, claims)
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The three segments of a compact token.
fn segments(token: &str) -> [String; 3] {
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "a compact JWS: {token}");
    [parts[0].to_owned(), parts[1].to_owned(), parts[2].to_owned()]
}

/// Asserts a 401 problem with `code` and a Bearer challenge; returns the problem.
#[track_caller]
fn unauthorized(resp: Resp, code: &str) -> Value {
    let challenge = resp.header("www-authenticate").map(str::to_owned);
    let problem = resp.problem(401, code);
    let challenge = challenge.unwrap_or_else(|| panic!("401 without WWW-Authenticate: {problem}"));
    assert!(challenge.starts_with("Bearer"), "challenge is not Bearer: {challenge}");
    if code == "missing_token" {
        // RFC 6750 §3.1: no error code when the request had no credentials at all.
        assert!(!challenge.contains("error="), "challenge of a missing token: {challenge}");
    } else {
        assert!(challenge.contains("error=\"invalid_token\""), "challenge: {challenge}");
    }
    problem
}

/// `GET /v1/tenants` with a raw `Authorization` header value.
async fn list_with_authorization(app: &TestApp, value: &str) -> Resp {
    app.get("/v1/tenants").header("authorization", value).send().await
}

/// `GET /v1/tenants` with a bearer token.
async fn list_with(app: &TestApp, token: &str) -> Resp {
    app.get("/v1/tenants").token(token).send().await
}

/// Every kind of bad token, by name, with the code the API must answer.
fn bad_tokens() -> Vec<(&'static str, String, &'static str)> {
    let now = now();
    let rsa = EncodingKey::from_rsa_pem(RSA_PRIVATE_PEM.as_bytes()).expect("test RSA key");
    let mut kid_header = Header::new(Algorithm::HS256);
    kid_header.kid = Some("rotated-key-2024".to_owned());

    let valid = admin();
    let [h, p, s] = segments(&valid);
    let mut sig = URL_SAFE_NO_PAD.decode(&s).expect("signature is base64url");
    sig[0] ^= 0x01;
    let tampered_signature = format!("{h}.{p}.{}", b64(&sig));

    let none_header = b64(br#"{"alg":"none","typ":"JWT"}"#);
    let none_payload = b64(claims().to_string().as_bytes());

    let mut without_exp = claims();
    without_exp.as_object_mut().expect("object").remove("exp");
    let mut empty_sub = claims();
    empty_sub["sub"] = json!("");
    let edited = |edit: &dyn Fn(&mut Value)| {
        let mut c = claims();
        edit(&mut c);
        hs256(&c, TEST_SECRET)
    };
    // Signed correctly with our secret: refused for the critical extension alone.
    let crit = hand_signed(r#"{"alg":"HS256","crit":["exp"],"exp":1}"#, &claims());

    vec![
        (
            "expired beyond the leeway",
            token_with(|c| {
                c.exp = now - 120;
                c.nbf = Some(now - 3600);
                c.iat = Some(now - 3600);
            }),
            "token_expired",
        ),
        (
            "nbf beyond the leeway",
            token_with(|c| {
                c.nbf = Some(now + 300);
                c.iat = Some(now);
            }),
            "token_not_yet_valid",
        ),
        ("wrong issuer", token_with(|c| c.iss = "someone-else".to_owned()), "invalid_token"),
        ("wrong audience", token_with(|c| c.aud = json!("another-service")), "invalid_token"),
        ("audience list without ours", token_with(|c| c.aud = json!(["a", "b"])), "invalid_token"),
        ("alg none, empty signature", format!("{none_header}.{none_payload}."), "invalid_token"),
        ("alg None, empty signature", format!("{}.{none_payload}.", b64(br#"{"alg":"None"}"#)), "invalid_token"),
        ("alg none, HMAC'd with our secret", hand_signed(r#"{"alg":"none"}"#, &claims()), "invalid_token"),
        ("alg none, a signature of another token", format!("{none_header}.{none_payload}.{s}"), "invalid_token"),
        ("RS256 with the test RSA key", sign(&Header::new(Algorithm::RS256), &claims(), &rsa), "invalid_token"),
        ("HS256 with another secret", hs256(&claims(), OTHER_SECRET), "invalid_token"),
        (
            "unknown kid, another secret",
            sign(&kid_header, &claims(), &EncodingKey::from_secret(OTHER_SECRET)),
            "invalid_token",
        ),
        ("tampered signature", tampered_signature, "invalid_token"),
        ("signature stripped", format!("{h}.{p}."), "invalid_token"),
        ("no exp claim", hs256(&without_exp, TEST_SECRET), "invalid_token"),
        ("empty sub", hs256(&empty_sub, TEST_SECRET), "invalid_token"),
        (
            "no sub",
            edited(&|c| {
                c.as_object_mut().expect("object").remove("sub");
            }),
            "invalid_token",
        ),
        (
            "no iss",
            edited(&|c| {
                c.as_object_mut().expect("object").remove("iss");
            }),
            "invalid_token",
        ),
        (
            "no aud",
            edited(&|c| {
                c.as_object_mut().expect("object").remove("aud");
            }),
            "invalid_token",
        ),
        ("exp as a string", edited(&|c| c["exp"] = json!((now + 3600).to_string())), "invalid_token"),
        ("roles as a string", edited(&|c| c["roles"] = json!("provider:admin")), "invalid_token"),
        ("aud as a number", edited(&|c| c["aud"] = json!(42)), "invalid_token"),
        ("payload not an object", hs256(&json!(["provider:admin"]), TEST_SECRET), "invalid_token"),
        ("critical header extension", crit, "invalid_token"),
        ("tenant role without tenant_id", token(&["tenant:admin"], None), "invalid_token"),
        ("tenant member without tenant_id", token(&["tenant:member"], None), "invalid_token"),
        ("garbage", "not-a-jwt".to_owned(), "invalid_token"),
        ("three garbage segments", "a.b.c".to_owned(), "invalid_token"),
        ("four segments", format!("{valid}.x"), "invalid_token"),
        ("five segments (JWE-shaped)", format!("{h}.{p}.{s}.{s}.{s}"), "invalid_token"),
        ("overlong", "a".repeat(20_000), "invalid_token"),
    ]
}

#[tokio::test]
async fn a_missing_authorization_header_is_401_missing_token() {
    let app = TestApp::new().await;
    let problem = unauthorized(app.get("/v1/tenants").send().await, "missing_token");
    assert_eq!(problem["instance"], "/v1/tenants");
    unauthorized(app.get("/v1/machines").send().await, "missing_token");
    unauthorized(app.get("/v1/machine-classes").send().await, "missing_token");
    unauthorized(app.post("/v1/tenants").json(&json!({ "name": "acme" })).send().await, "missing_token");
    assert_eq!(app.count("tenants").await, 0);
}

#[tokio::test]
async fn every_bad_token_is_401_with_a_bearer_challenge() {
    let app = TestApp::new().await;
    for (what, token, code) in bad_tokens() {
        let resp = list_with(&app, &token).await;
        assert_eq!(resp.status.as_u16(), 401, "{what}: {}", String::from_utf8_lossy(&resp.body));
        let problem = unauthorized(resp, code);
        let detail = problem["detail"].as_str().expect("detail");
        assert!(!detail.contains(&token), "{what}: the detail echoes the token");
        assert!(!detail.contains("paddock-test-secret"), "{what}: the detail leaks the secret");
    }
}

#[tokio::test]
async fn bad_tokens_write_nothing() {
    let app = TestApp::new().await;
    for (what, token, code) in bad_tokens() {
        let resp = app.post("/v1/tenants").token(&token).json(&json!({ "name": "acme" })).send().await;
        assert_eq!(resp.status.as_u16(), 401, "{what}: {}", String::from_utf8_lossy(&resp.body));
        unauthorized(resp, code);
        let resp = app
            .post("/v1/machine-classes")
            .token(&token)
            .json(&json!({ "name": "cpu", "cpu_cores": 8, "memory_gib": 32, "gpu_count": 0 }))
            .send()
            .await;
        unauthorized(resp, code);
    }
    assert_eq!(app.count("tenants").await, 0);
    assert_eq!(app.count("machine_classes").await, 0);
    // The same body with a good token does go through: the refusals were about the token.
    app.post("/v1/tenants").token(&admin()).json(&json!({ "name": "acme" })).send().await.expect(201);
}

#[tokio::test]
async fn expiry_and_not_before_within_the_leeway_are_accepted() {
    let app = TestApp::new().await;
    let now = now();
    let expired_recently = token_with(|c| {
        c.exp = now - 10;
        c.nbf = Some(now - 3600);
        c.iat = Some(now - 3600);
    });
    list_with(&app, &expired_recently).await.expect(200);
    let issued_slightly_ahead = token_with(|c| {
        c.nbf = Some(now + 10);
        c.iat = Some(now + 10);
    });
    list_with(&app, &issued_slightly_ahead).await.expect(200);
    // Just beyond the leeway in either direction.
    unauthorized(list_with(&app, &token_with(|c| c.exp = now - 45)).await, "token_expired");
    unauthorized(list_with(&app, &token_with(|c| c.nbf = Some(now + 45))).await, "token_not_yet_valid");
}

#[tokio::test]
async fn hand_signed_tokens_are_accepted_when_well_formed() {
    // The hand-made tokens of the refusal cases differ from this one in one thing only.
    let app = TestApp::new().await;
    list_with(&app, &hand_signed(r#"{"alg":"HS256","typ":"JWT"}"#, &claims())).await.expect(200);
    // The kid of a token is ignored without a JWKS: our secret still verifies it.
    list_with(&app, &hand_signed(r#"{"alg":"HS256","kid":"anything"}"#, &claims())).await.expect(200);
}

#[tokio::test]
async fn an_audience_list_containing_ours_is_accepted() {
    let app = TestApp::new().await;
    list_with(&app, &token_with(|c| c.aud = json!(["billing", "paddock"]))).await.expect(200);
}

#[tokio::test]
async fn alg_none_is_refused_even_with_valid_claims() {
    let app = TestApp::new().await;
    for alg in ["none", "None", "NONE", "nOnE"] {
        let header = b64(json!({ "alg": alg, "typ": "JWT" }).to_string().as_bytes());
        let payload = b64(claims().to_string().as_bytes());
        unauthorized(list_with(&app, &format!("{header}.{payload}.")).await, "invalid_token");
        let resp = app
            .post("/v1/tenants")
            .token(&format!("{header}.{payload}."))
            .json(&json!({ "name": "acme" }))
            .send()
            .await;
        unauthorized(resp, "invalid_token");
    }
    assert_eq!(app.count("tenants").await, 0);
}

#[tokio::test]
async fn asymmetric_and_foreign_keys_are_refused_when_only_hs256_is_configured() {
    let app = TestApp::new().await;
    let rsa = EncodingKey::from_rsa_pem(RSA_PRIVATE_PEM.as_bytes()).expect("test RSA key");
    for alg in [Algorithm::RS256, Algorithm::RS384, Algorithm::PS256] {
        unauthorized(list_with(&app, &sign(&Header::new(alg), &claims(), &rsa)).await, "invalid_token");
    }
    // The other HMAC sizes are not configured either, even with the right secret.
    for alg in [Algorithm::HS384, Algorithm::HS512] {
        let token = sign(&Header::new(alg), &claims(), &EncodingKey::from_secret(TEST_SECRET));
        unauthorized(list_with(&app, &token).await, "invalid_token");
    }
    unauthorized(list_with(&app, &hs256(&claims(), OTHER_SECRET)).await, "invalid_token");
    // A token of our own secret passes, so the refusals above are about the key.
    list_with(&app, &hs256(&claims(), TEST_SECRET)).await.expect(200);
}

#[tokio::test]
async fn rs256_confusion_with_an_hmac_over_the_public_key_is_refused() {
    // The classic confusion: an attacker HMACs with the (public) RSA key and labels it HS256 or
    // RS256. Neither verifies: the only HS256 key is the configured secret.
    let app = TestApp::new().await;
    let public_pem = include_str!("../../crates/paddock-auth/tests/keys/rsa_a_public.pem");
    for header in [r#"{"alg":"HS256","typ":"JWT"}"#, r#"{"alg":"RS256","typ":"JWT"}"#] {
        let token = hand_signed_with(public_pem.as_bytes(), header, &claims());
        unauthorized(list_with(&app, &token).await, "invalid_token");
    }
}

#[tokio::test]
async fn an_unknown_kid_signed_with_another_secret_is_refused() {
    let app = TestApp::new().await;
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("unknown-key".to_owned());
    let token = sign(&header, &claims(), &EncodingKey::from_secret(OTHER_SECRET));
    unauthorized(list_with(&app, &token).await, "invalid_token");
}

#[tokio::test]
async fn a_tampered_signature_is_refused() {
    let app = TestApp::new().await;
    let [h, p, s] = segments(&admin());
    let sig = URL_SAFE_NO_PAD.decode(&s).expect("base64url signature");
    for i in [0, sig.len() / 2, sig.len() - 1] {
        let mut bad = sig.clone();
        bad[i] ^= 0x80;
        unauthorized(list_with(&app, &format!("{h}.{p}.{}", b64(&bad))).await, "invalid_token");
    }
    // Truncated and extended signatures.
    unauthorized(list_with(&app, &format!("{h}.{p}.{}", b64(&sig[..sig.len() - 1]))).await, "invalid_token");
    let mut longer = sig.clone();
    longer.push(0);
    unauthorized(list_with(&app, &format!("{h}.{p}.{}", b64(&longer))).await, "invalid_token");
    // Not base64url at all.
    unauthorized(list_with(&app, &format!("{h}.{p}.{s}!")).await, "invalid_token");
}

#[tokio::test]
async fn a_payload_escalated_to_provider_admin_keeps_no_power() {
    let app = TestApp::new().await;
    let tenant = crate::common::tenant(&app, "acme").await;
    let tenant_id: uuid::Uuid = crate::common::id(&tenant).parse().expect("uuid");
    let member = token(&["tenant:member"], Some(tenant_id));
    // The genuine token works, within its role.
    list_with(&app, &member).await.expect(200);
    app.post("/v1/tenants").token(&member).json(&json!({ "name": "evil" })).send().await.problem(403, "forbidden");

    let [h, p, s] = segments(&member);
    let mut payload: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(&p).expect("payload")).expect("json");
    payload["roles"] = json!(["provider:admin"]);
    payload.as_object_mut().expect("object").remove("tenant_id");
    let escalated = format!("{h}.{}.{s}", b64(payload.to_string().as_bytes()));
    unauthorized(list_with(&app, &escalated).await, "invalid_token");
    let resp = app.post("/v1/tenants").token(&escalated).json(&json!({ "name": "evil" })).send().await;
    unauthorized(resp, "invalid_token");

    // Also with the tenant kept and only the role changed, and with a later expiry.
    payload["tenant_id"] = json!(tenant_id);
    payload["exp"] = json!(now() + 365 * 86_400);
    let escalated = format!("{h}.{}.{s}", b64(payload.to_string().as_bytes()));
    unauthorized(list_with(&app, &escalated).await, "invalid_token");
    assert_eq!(app.count("tenants").await, 1);
}

#[tokio::test]
async fn garbage_empty_and_non_bearer_authorization_is_401() {
    let app = TestApp::new().await;
    for value in [
        "Bearer",
        "Bearer ",
        "Bearer    ",
        "Bearer not-a-jwt",
        "Bearer a.b.c",
        "Bearer ...",
        "Bearer eyJhbGciOiJIUzI1NiJ9",
        "Basic dXNlcjpwYXNzd29yZA==",
        "Digest username=\"admin\"",
        "Token abc",
        "garbage",
        "",
    ] {
        let resp = list_with_authorization(&app, value).await;
        assert_eq!(resp.status.as_u16(), 401, "Authorization: {value:?}");
        unauthorized(resp, "invalid_token");
    }
    // A valid token under another scheme is not a bearer token either.
    unauthorized(list_with_authorization(&app, &format!("Basic {}", admin())).await, "invalid_token");
    unauthorized(list_with_authorization(&app, &admin()).await, "invalid_token");
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let app = TestApp::new().await;
    for scheme in ["Bearer", "bearer", "BEARER"] {
        list_with_authorization(&app, &format!("{scheme} {}", admin())).await.expect(200);
    }
}

#[tokio::test]
async fn a_tenant_role_without_tenant_id_is_401_not_403() {
    let app = TestApp::new().await;
    for role in ["tenant:admin", "tenant:member"] {
        let problem = unauthorized(list_with(&app, &token(&[role], None)).await, "invalid_token");
        assert!(problem["detail"].as_str().is_some_and(|d| d.contains("tenant_id")), "{problem}");
    }
    // Even alongside a provider role: the token is inconsistent.
    unauthorized(list_with(&app, &token(&["provider:admin", "tenant:admin"], None)).await, "invalid_token");
    // A malformed tenant_id claim is refused too.
    let mut bad_tenant = claims();
    bad_tenant["roles"] = json!(["tenant:admin"]);
    bad_tenant["tenant_id"] = json!("not-a-uuid");
    unauthorized(list_with(&app, &hs256(&bad_tenant, TEST_SECRET)).await, "invalid_token");
}

#[tokio::test]
async fn a_valid_token_of_unknown_roles_only_is_403_not_401() {
    let app = TestApp::new().await;
    for roles in [vec!["root"], vec!["provider:superuser", "admin"], vec![]] {
        let t = token(&roles, None);
        let resp = list_with(&app, &t).await;
        assert!(resp.header("www-authenticate").is_none(), "a 403 is no authentication challenge");
        resp.problem(403, "forbidden");
        let resp = app.post("/v1/tenants").token(&t).json(&json!({ "name": "acme" })).send().await;
        resp.problem(403, "forbidden");
    }
    assert_eq!(app.count("tenants").await, 0);
}

#[tokio::test]
async fn public_endpoints_need_no_token_and_ignore_a_bad_one() {
    let app = TestApp::new().await;
    app.get("/healthz").send().await.expect(200);
    app.get("/healthz").header("authorization", "Bearer garbage").send().await.expect(200);
    app.get("/openapi.json").header("authorization", "Basic abc").send().await.expect(200);
}
