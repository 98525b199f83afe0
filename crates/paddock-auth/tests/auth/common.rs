//! Shared helpers: test-only keys, token signing and forging, a JWKS server.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use paddock_auth::{AuthError, Claims, Secret, Verifier, VerifierConfig};
use serde_json::{json, Value};

/// The HS256 secret of the tests (40 bytes).
pub const SECRET: &[u8] = b"paddock-auth-TEST-ONLY-secret-0123456789";
/// The tenant in [`valid_claims`].
pub const TENANT: &str = "0190f0a8-6c3e-7b4e-9a55-3f1e2d4c5b6a";

pub fn key_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/keys").join(name)
}

pub fn read_key(name: &str) -> Vec<u8> {
    std::fs::read(key_path(name)).expect("test key file exists")
}

/// A fresh scratch directory under the target dir.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("paddock-auth")
        .join(format!("{name}-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

pub fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock after 1970").as_secs() as i64
}

/// Claims the default [`VerifierConfig`] accepts.
pub fn valid_claims() -> Value {
    json!({
        "sub": "user-1",
        "roles": ["tenant:admin"],
        "tenant_id": TENANT,
        "iss": "paddock",
        "aud": "paddock",
        "exp": now() + 600,
        "iat": now(),
    })
}

/// `valid_claims()` with `changes` merged in (a `null` removes the claim).
pub fn claims_with(changes: Value) -> Value {
    let mut claims = valid_claims();
    let map = claims.as_object_mut().expect("object");
    for (name, value) in changes.as_object().expect("object") {
        if value.is_null() {
            map.remove(name);
        } else {
            map.insert(name.clone(), value.clone());
        }
    }
    claims
}

/// The encoding key of the test-only private key for `alg`.
pub fn encoding_key(alg: Algorithm) -> EncodingKey {
    match alg {
        Algorithm::HS256 => EncodingKey::from_secret(SECRET),
        Algorithm::RS256 | Algorithm::RS512 | Algorithm::PS256 => {
            EncodingKey::from_rsa_pem(&read_key("rsa_a_TEST_ONLY_private.pem")).expect("rsa key")
        }
        Algorithm::ES256 => EncodingKey::from_ec_pem(&read_key("ec_p256_TEST_ONLY_private.pem")).expect("ec key"),
        Algorithm::EdDSA => EncodingKey::from_ed_pem(&read_key("ed25519_TEST_ONLY_private.pem")).expect("ed key"),
        other => panic!("no test key for {other:?}"),
    }
}

pub fn rsa_b_key() -> EncodingKey {
    EncodingKey::from_rsa_pem(&read_key("rsa_b_TEST_ONLY_private.pem")).expect("rsa key b")
}

/// Signs `claims` with the test key for `alg`.
pub fn sign(alg: Algorithm, kid: Option<&str>, claims: &Value) -> String {
    sign_with(alg, &encoding_key(alg), kid, claims)
}

pub fn sign_with(alg: Algorithm, key: &EncodingKey, kid: Option<&str>, claims: &Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, key).expect("sign test token")
}

pub fn b64(bytes: impl AsRef<[u8]>) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Builds a token from raw parts, for tokens no honest library would make.
pub fn forge(header: &Value, claims: &Value, signature: &str) -> String {
    format!("{}.{}.{signature}", b64(header.to_string()), b64(claims.to_string()))
}

pub fn hs_config() -> VerifierConfig {
    VerifierConfig { hs256_secret: Some(Secret::new(SECRET.to_vec())), ..VerifierConfig::default() }
}

pub fn pem_config(file: &str) -> VerifierConfig {
    VerifierConfig { public_keys_pem: Some(key_path(file)), ..VerifierConfig::default() }
}

pub async fn verifier(cfg: VerifierConfig) -> Verifier {
    Verifier::new(cfg).await.expect("valid verifier config")
}

/// Verifies and expects a rejection.
pub async fn reject(verifier: &Verifier, token: &str) -> AuthError {
    match verifier.verify(token).await {
        Ok(claims) => panic!("token unexpectedly accepted: {claims:?}"),
        Err(error) => error,
    }
}

pub async fn accept(verifier: &Verifier, token: &str) -> Claims {
    verifier.verify(token).await.expect("token accepted")
}

/// A test-only public JWK from tests/keys/<name>.jwk.json.
pub fn jwk(name: &str) -> Value {
    serde_json::from_slice(&read_key(&format!("{name}.jwk.json"))).expect("jwk json")
}

/// A JWKS endpoint on 127.0.0.1 whose document (or failure) the test controls.
pub struct JwksServer {
    pub url: url::Url,
    state: Arc<ServerState>,
    task: tokio::task::JoinHandle<()>,
}

struct ServerState {
    /// `None` answers 503.
    document: Mutex<Option<Value>>,
    hits: AtomicUsize,
}

async fn serve_jwks(State(state): State<Arc<ServerState>>) -> Response {
    state.hits.fetch_add(1, Ordering::SeqCst);
    let document = state.document.lock().expect("lock").clone();
    match document {
        Some(document) => axum::Json(document).into_response(),
        None => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

impl JwksServer {
    /// Starts serving `{"keys": keys}`, or failing when `keys` is `None`.
    pub async fn start(keys: Option<Vec<Value>>) -> Self {
        let state = Arc::new(ServerState {
            document: Mutex::new(keys.map(|keys| json!({ "keys": keys }))),
            hits: AtomicUsize::new(0),
        });
        let app = axum::Router::new()
            .route("/.well-known/jwks.json", axum::routing::get(serve_jwks))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("serve");
        });
        let url = format!("http://{addr}/.well-known/jwks.json").parse().expect("url");
        Self { url, state, task }
    }

    pub fn serve(&self, keys: Vec<Value>) {
        *self.state.document.lock().expect("lock") = Some(json!({ "keys": keys }));
    }

    pub fn serve_document(&self, document: Value) {
        *self.state.document.lock().expect("lock") = Some(document);
    }

    pub fn hits(&self) -> usize {
        self.state.hits.load(Ordering::SeqCst)
    }

    pub fn config(&self) -> VerifierConfig {
        VerifierConfig { jwks_url: Some(self.url.clone()), ..VerifierConfig::default() }
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
