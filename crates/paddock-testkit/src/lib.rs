//! Test harness: a real PostgreSQL (started by `scripts/test`, found through
//! `PADDOCK_TEST_DATABASE_URL`), one fresh database per test cloned from a template migrated once,
//! the real router with its whole middleware stack, token minting for every role, and a small
//! request builder. Nothing here mocks the store.

mod contract;
mod db;
mod http_client;
pub mod skip;
pub mod slurm_host;
mod slurm_host_db;

use std::sync::Arc;

pub use db::TestDb;
pub use http_client::{Req, Resp};
use paddock_api::{ApiConfig, AppState};
use paddock_auth::{Claims, Secret, Verifier, VerifierConfig};
use paddock_domain::ledger::LedgerKey;
use paddock_domain::secret::Cipher;
use paddock_domain::signing::SigningKey;
use paddock_service::agent::AgentSettings;
use paddock_service::Services;
use paddock_store::Store;

/// The custody ledger key of test apps (`PADDOCK_LEDGER_KEY`).
pub const TEST_LEDGER_KEY: &[u8] = b"paddock-test-ledger-key-of-32-bytes!";

/// The custody ledger key of test apps, for tests that call the store's transitions directly.
pub fn ledger_key() -> LedgerKey {
    LedgerKey::new(TEST_LEDGER_KEY.to_vec())
}

/// The signing key (`PADDOCK_USAGE_SIGNING_KEY`) of test apps: one per test process.
pub fn signing_key() -> SigningKey {
    static PEM: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let pem = PEM.get_or_init(SigningKey::generate_pem);
    // A PEM this crate just generated parses.
    SigningKey::from_pem(pem).expect("a generated signing key")
}

/// The HS256 secret of test apps.
pub const TEST_SECRET: &[u8] = b"paddock-test-secret-of-at-least-32-bytes!";

/// The app under test over its own database.
pub struct TestApp {
    /// The router with every layer, as `paddock api` serves it.
    pub router: axum::Router,
    /// The test's database.
    pub db: TestDb,
    /// The services, for fixtures that the API cannot make yet.
    pub services: Services,
    /// The cipher of secrets at rest.
    pub cipher: Arc<Cipher>,
    /// Where [`TestApp::served`] serves (`http://127.0.0.1:<port>`).
    pub base_url: Option<String>,
}

impl TestApp {
    /// A fresh app over a fresh database.
    pub async fn new() -> TestApp {
        Self::with_config(ApiConfig::default()).await
    }

    /// A fresh app that also serves on a loopback port (its URL in [`TestApp::base_url`]), for
    /// clients outside the process's router calls: machines' agents posting their reports.
    pub async fn served() -> TestApp {
        Self::served_with(|agent| agent).await
    }

    /// [`TestApp::served`] with agent settings changed by `agent` (it gets them with both agent
    /// URLs set to the served address), e.g. the digests of a test's own images.
    pub async fn served_with(agent: impl FnOnce(AgentSettings) -> AgentSettings) -> TestApp {
        Self::served_on_with(TestDb::new().await, agent).await
    }

    /// Like [`TestApp::served`], over a given database (its pool may connect as another role).
    pub async fn served_on(db: TestDb) -> TestApp {
        Self::served_on_with(db, |agent| agent).await
    }

    async fn served_on_with(db: TestDb, agent: impl FnOnce(AgentSettings) -> AgentSettings) -> TestApp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding a loopback port");
        let base = format!("http://{}", listener.local_addr().expect("local address"));
        let settings =
            AgentSettings { base_url: base.clone(), seed_base_url: base.clone(), ..AgentSettings::default() };
        let app = Self::build(db, ApiConfig::default(), Some(&base), Some(agent(settings)), true).await;
        let router = app.router.clone();
        tokio::spawn(async move { axum::serve(listener, router).await.expect("serving the test app") });
        app
    }

    /// Like [`TestApp::served`] (the agent's URLs the served address), with the services changed by
    /// `edit` first (usage settings, the webhook address guard).
    pub async fn served_with_services(edit: impl FnOnce(Services) -> Services) -> TestApp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding a loopback port");
        let base = format!("http://{}", listener.local_addr().expect("local address"));
        let agent = AgentSettings { base_url: base.clone(), seed_base_url: base.clone(), ..AgentSettings::default() };
        let mut app = Self::build(TestDb::new().await, ApiConfig::default(), Some(&base), Some(agent), true).await;
        app.services = edit(app.services);
        app.router =
            paddock_api::router(AppState::new(app.services.clone(), Self::verifier().await, ApiConfig::default()));
        let router = app.router.clone();
        tokio::spawn(async move { axum::serve(listener, router).await.expect("serving the test app") });
        app
    }

    /// A fresh app with API settings (CORS origins).
    pub async fn with_config(config: ApiConfig) -> TestApp {
        Self::build(TestDb::new().await, config, None, None, true).await
    }

    /// A fresh app without a signing key (`PADDOCK_USAGE_SIGNING_KEY` unset).
    pub async fn without_signing_key() -> TestApp {
        Self::build(TestDb::new().await, ApiConfig::default(), None, None, false).await
    }

    /// A fresh app whose services are changed by `edit` first (a signing key, usage settings).
    pub async fn with_services(edit: impl FnOnce(Services) -> Services) -> TestApp {
        let mut app = Self::build(TestDb::new().await, ApiConfig::default(), None, None, true).await;
        app.services = edit(app.services);
        let verifier = Self::verifier().await;
        app.router = paddock_api::router(AppState::new(app.services.clone(), verifier, ApiConfig::default()));
        app
    }

    /// A fresh app with the edge's limits set to `limits` (rate limits, requests in flight).
    pub async fn with_limits(limits: paddock_api::limits::Limits) -> TestApp {
        let mut app = Self::build(TestDb::new().await, ApiConfig::default(), None, None, true).await;
        let state = AppState::new(app.services.clone(), Self::verifier().await, ApiConfig::default());
        app.router = paddock_api::router(state.with_limits(limits));
        app
    }

    async fn verifier() -> Verifier {
        Verifier::new(VerifierConfig {
            hs256_secret: Some(Secret::new(TEST_SECRET.to_vec())),
            ..VerifierConfig::default()
        })
        .await
        .expect("test verifier")
    }

    async fn build(
        db: TestDb,
        config: ApiConfig,
        base_url: Option<&str>,
        agent: Option<AgentSettings>,
        signing: bool,
    ) -> TestApp {
        let cipher = Arc::new(Cipher::new(&Cipher::generate_key(), &[]).expect("generated key is valid"));
        let mut services = Services::new(Store::from_pool(db.pool.clone()), cipher.clone(), ledger_key());
        if signing {
            services = services.with_signing_key(signing_key());
        }
        if let Some(agent) = agent {
            services = services.with_agent(agent);
        }
        let router = paddock_api::router(AppState::new(services.clone(), Self::verifier().await, config));
        TestApp { router, db, services, cipher, base_url: base_url.map(str::to_owned) }
    }

    /// Changes the services behind this app's requests by `edit` (usage settings), from now on. A
    /// served app's listener keeps the services it had.
    pub async fn edit_services(&mut self, edit: impl FnOnce(Services) -> Services) {
        self.services = edit(self.services.clone());
        let state = AppState::new(self.services.clone(), Self::verifier().await, ApiConfig::default());
        self.router = paddock_api::router(state);
    }

    /// A request to the app.
    pub fn req(&self, method: http::Method, path: impl Into<String>) -> Req<'_> {
        Req::new(&self.router, method, path.into())
    }

    /// `GET path`.
    pub fn get(&self, path: impl Into<String>) -> Req<'_> {
        self.req(http::Method::GET, path)
    }

    /// `POST path`.
    pub fn post(&self, path: impl Into<String>) -> Req<'_> {
        self.req(http::Method::POST, path)
    }

    /// `PATCH path`.
    pub fn patch(&self, path: impl Into<String>) -> Req<'_> {
        self.req(http::Method::PATCH, path)
    }

    /// `DELETE path`.
    pub fn delete(&self, path: impl Into<String>) -> Req<'_> {
        self.req(http::Method::DELETE, path)
    }

    /// Rows in `table` (for "nothing was written" assertions).
    pub async fn count(&self, table: &str) -> i64 {
        self.db.count(table).await
    }
}

/// A token for `roles` (and a tenant), valid for an hour.
pub fn token(roles: &[&str], tenant: Option<uuid::Uuid>) -> String {
    token_with(|claims| {
        claims.roles = roles.iter().map(|r| (*r).to_owned()).collect();
        claims.tenant_id = tenant;
    })
}

/// A provider-admin token.
pub fn admin() -> String {
    token(&["provider:admin"], None)
}

/// A token with valid defaults, adjusted by `edit` (for JWT tests).
pub fn token_with(edit: impl FnOnce(&mut Claims)) -> String {
    let now = chrono::Utc::now().timestamp();
    let mut claims = Claims {
        sub: "test-user".to_owned(),
        roles: vec!["provider:admin".to_owned()],
        tenant_id: None,
        exp: now + 3600,
        nbf: Some(now - 5),
        iat: Some(now),
        iss: "paddock".to_owned(),
        aud: serde_json::Value::String("paddock".to_owned()),
    };
    edit(&mut claims);
    paddock_auth::mint_hs256(&Secret::new(TEST_SECRET.to_vec()), &claims).expect("minting a test token")
}

/// Polls `check` until it returns `Some` or the deadline passes.
pub async fn eventually<T, F, Fut>(deadline: std::time::Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let until = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < until, "condition not reached within {deadline:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
