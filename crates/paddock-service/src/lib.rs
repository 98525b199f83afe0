//! Use-cases shared by the API and the worker. Each public function takes the caller's context,
//! checks policy before any lookup (403), scopes every tenant-owned read (404 for a foreign
//! tenant), checks preconditions (412) and state (409), validates (422), writes, and records an
//! audit event in the same transaction. A refused call is audited too, as a failure.

pub mod agent;
mod audit;
pub mod autoscale;
mod chain_cache;
pub mod cluster;
pub mod credentials;
mod custody;
pub mod fault;
mod gauges;
mod health;
mod housekeeping;
pub mod idempotency;
mod machine;
mod machine_class;
mod operation;
pub mod remediation;
pub mod scim;
mod tenant;
pub mod usage;
pub mod webhook;

use std::sync::Arc;

pub use audit::AuditTrail;
use audit::Done;
pub use gauges::label_value;
pub use machine::MachineChange;
use paddock_domain::ledger::LedgerKey;
use paddock_domain::secret::Cipher;
use paddock_domain::signing::SigningKey;
use paddock_domain::{Actor, Error, Result};
use paddock_store::Store;
use serde::de::DeserializeOwned;

/// Who is calling, and which request this is.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The authenticated caller.
    pub actor: Actor,
    /// The request id, recorded in audit events: the client's (`x-request-id`) when it sent one.
    pub request_id: String,
    /// The id the server gave the request, recorded beside the client's: the one a client cannot
    /// choose, so two calls that sent the same request id stay apart on the trail.
    pub server_request_id: uuid::Uuid,
    /// Set for a request whose answer must be recorded with its effect (an `Idempotency-Key`):
    /// the audited write leaves its transaction here instead of committing it.
    pub deferred_commit: Option<idempotency::DeferredCommit>,
}

impl Ctx {
    /// The context of work that is no HTTP request (seeding, tests), under `request_id`.
    pub fn internal(actor: Actor, request_id: &str) -> Self {
        Self {
            actor,
            request_id: request_id.to_owned(),
            server_request_id: uuid::Uuid::now_v7(),
            deferred_commit: None,
        }
    }
}

/// A JSON request body, decoded only after the caller was authorized, so that the order of
/// checks (401, 403, 404, 412/409, then the body: 413, 415, 400, 422) holds for bodies too. A body
/// the edge could not accept (wrong media type, too large) carries that refusal until decoded.
/// `Debug` shows its length only: a body may hold a BMC password.
pub struct Body {
    bytes: std::result::Result<Vec<u8>, Error>,
    shape: Option<&'static dyn BodyShape>,
}

/// The shape a request's body must have, as its operation documents it (the OpenAPI schema):
/// every field that does not fit is reported at once, in the document's terms and bounds.
pub trait BodyShape: Send + Sync {
    /// The field errors of `value` read as `reading`, none when it fits.
    fn check(&self, value: &serde_json::Value, reading: Reading<'_>) -> Vec<paddock_types::problem::FieldError>;
}

/// How a body is read.
#[derive(Debug, Clone, Copy)]
pub enum Reading<'a> {
    /// As the whole request: every required field present.
    Whole,
    /// As a JSON merge patch: any field may be left out, and the `immutable` top-level fields are
    /// left to `paddock_domain::json::apply_patch` (repeated unchanged, they are no change).
    Patch {
        /// The fields a patch may repeat but not change.
        immutable: &'a [&'a str],
    },
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.bytes {
            Ok(bytes) => write!(f, "Body({} bytes)", bytes.len()),
            Err(refusal) => f.debug_tuple("Body").field(refusal).finish(),
        }
    }
}

impl Body {
    /// A body of these bytes.
    pub fn bytes(bytes: Vec<u8>) -> Self {
        Self { bytes: Ok(bytes), shape: None }
    }

    /// A body the edge refused; decoding it yields `error`.
    pub fn refused(error: Error) -> Self {
        Self { bytes: Err(error), shape: None }
    }

    /// The same body, checked against `shape` when decoded.
    pub fn with_shape(self, shape: Option<&'static dyn BodyShape>) -> Self {
        Self { shape, ..self }
    }

    /// A body from a value (seeding, tests).
    pub fn json(value: &impl serde::Serialize) -> Self {
        Self::bytes(serde_json::to_vec(value).unwrap_or_default())
    }

    /// Decodes the body into a request type: 400 for bad syntax; 422 when the type refuses it,
    /// naming every field that does not fit the documented shape at once (and the type's own
    /// refusal if it names another field). A body the type takes goes on to the service's checks.
    pub fn decode<T: DeserializeOwned + serde::Serialize>(&self) -> Result<T> {
        let value = self.value()?;
        paddock_domain::json::from_value(value.clone())
            .map_err(|e| self.refusal(&value, Reading::Whole, e.into_error()))
    }

    /// The body as a JSON value (merge patches): 400 for bad syntax.
    pub fn value(&self) -> Result<serde_json::Value> {
        let bytes = match &self.bytes {
            Ok(bytes) => bytes,
            Err(refusal) => return Err(refusal.clone_refusal()),
        };
        paddock_domain::json::parse(bytes).map_err(paddock_domain::json::DecodeError::into_error)
    }

    /// Applies `patch` (this body's merge patch, perhaps with fields the service took out) to
    /// `current` with `paddock_domain::json::apply_patch`; a refusal names every field of the
    /// patch that does not fit the documented shape, as [`Body::decode`] does.
    pub fn apply_patch<S: serde::Serialize + DeserializeOwned>(
        &self,
        current: &S,
        patch: &serde_json::Value,
        immutable: &[&str],
    ) -> Result<S> {
        paddock_domain::json::apply_patch(current, patch, immutable)
            .map_err(|e| self.refusal(patch, Reading::Patch { immutable }, e))
    }

    /// `error`, with every field of `value` that does not fit the documented shape: those in the
    /// document's terms first, then the errors of `error` on other fields.
    fn refusal(&self, value: &serde_json::Value, reading: Reading<'_>, error: Error) -> Error {
        let mut errors = self.shape.map(|shape| shape.check(value, reading)).unwrap_or_default();
        if errors.is_empty() {
            return error;
        }
        if let Error::Invalid(own) = error {
            let other: Vec<_> = own.into_iter().filter(|e| !errors.iter().any(|s| s.field == e.field)).collect();
            errors.extend(other);
        }
        Error::Invalid(errors)
    }
}

/// A page of results and the cursor of the next one.
#[derive(Debug)]
pub struct Listed<T> {
    /// The items.
    pub items: Vec<T>,
    /// The next page's cursor, `None` at the end.
    pub next_cursor: Option<String>,
}

/// The services, cheap to clone.
#[derive(Clone, Debug)]
pub struct Services {
    store: Store,
    cipher: Arc<Cipher>,
    agent: Arc<agent::AgentSettings>,
    /// Issues tenant kubeconfigs; `None` without a cluster driver.
    credentials: Option<credentials::CredentialsDriver>,
    /// The custody ledger's HMAC key (`PADDOCK_LEDGER_KEY`, see `custody`): every process that
    /// moves machines writes sealed entries, so there is no service without it.
    ledger_key: Arc<LedgerKey>,
    /// The provider's Ed25519 key (`PADDOCK_USAGE_SIGNING_KEY`): closed periods' manifests and
    /// ledger checkpoints; `None`: what needs it answers 409 naming the setting.
    signing_key: Option<Arc<SigningKey>>,
    /// Metering settings (close grace, FOCUS provider name).
    usage: Arc<usage::UsageSettings>,
    /// The exports running per caller (`usage::export`).
    exports: Arc<usage::ExportSlots>,
    /// The `/metrics` gauges' last read (`gauges`).
    gauges: Arc<gauges::GaugeCache>,
    /// The isolation report's verdicts on custody chains (`chain_cache`).
    chains: Arc<chain_cache::ChainCache>,
    /// Where webhooks may go (`PADDOCK_WEBHOOK_INSECURE_HTTP`, `PADDOCK_WEBHOOK_ALLOWED_NETWORKS`).
    webhook_guard: Arc<paddock_domain::webhook::AddressGuard>,
    /// The POSIX ids given to the tenants' users and groups (`PADDOCK_IDENTITY_ID_RANGE`).
    identity_range: paddock_domain::scim::IdRange,
}

impl Services {
    /// Services over a store, sealing secrets with `cipher` and custody entries with `ledger_key`.
    pub fn new(store: Store, cipher: Arc<Cipher>, ledger_key: LedgerKey) -> Self {
        Self {
            store,
            cipher,
            agent: Arc::default(),
            credentials: None,
            ledger_key: Arc::new(ledger_key),
            signing_key: None,
            usage: Arc::default(),
            exports: Arc::default(),
            gauges: Arc::default(),
            chains: Arc::default(),
            webhook_guard: Arc::default(),
            identity_range: paddock_domain::scim::IdRange::default(),
        }
    }

    /// Sets where webhooks may go.
    pub fn with_webhook_guard(mut self, guard: paddock_domain::webhook::AddressGuard) -> Self {
        self.webhook_guard = Arc::new(guard);
        self
    }

    /// Where webhooks may go (for the worker's deliveries).
    pub fn webhook_guard(&self) -> &Arc<paddock_domain::webhook::AddressGuard> {
        &self.webhook_guard
    }

    /// Sets the provider's signing key (`PADDOCK_USAGE_SIGNING_KEY`).
    pub fn with_signing_key(mut self, key: SigningKey) -> Self {
        self.signing_key = Some(Arc::new(key));
        self
    }

    /// The provider's signing key, if configured.
    pub fn signing_key(&self) -> Option<&Arc<SigningKey>> {
        self.signing_key.as_ref()
    }

    /// Sets the URL machines reach the agent endpoints at and BMCs fetch seeds from (both
    /// `PADDOCK_AGENT_BASE_URL` and `PADDOCK_AGENT_SEED_BASE_URL`), keeping the other settings.
    pub fn with_agent_base_url(mut self, url: &str) -> Self {
        let url = url.trim_end_matches('/').to_owned();
        let settings = agent::AgentSettings { base_url: url.clone(), seed_base_url: url, ..(*self.agent).clone() };
        self.agent = Arc::new(settings);
        self
    }

    /// Sets what the agent endpoints need from the configuration.
    pub fn with_agent(mut self, settings: agent::AgentSettings) -> Self {
        let base_url = settings.base_url.trim_end_matches('/').to_owned();
        let seed_base_url = settings.seed_base_url.trim_end_matches('/').to_owned();
        self.agent = Arc::new(agent::AgentSettings { base_url, seed_base_url, ..settings });
        self
    }

    /// The store (for the worker and health checks).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The cipher of secrets at rest (for the worker, which opens BMC passwords and kubeconfigs).
    pub fn cipher(&self) -> &Arc<Cipher> {
        &self.cipher
    }

    /// The URL machines reach the agent endpoints at.
    pub fn agent_base_url(&self) -> &str {
        &self.agent.base_url
    }

    /// The agent endpoints' settings (URLs, CA, image digests).
    pub fn agent_settings(&self) -> &agent::AgentSettings {
        &self.agent
    }

    /// Whether the database answers and is migrated.
    pub async fn ready(&self) -> bool {
        self.store.ready().await.unwrap_or(false)
    }
}

/// Commits a transaction.
pub(crate) async fn commit(tx: paddock_store::Tx) -> Result<()> {
    Ok(tx.commit().await.map_err(paddock_store::StoreError::from)?)
}

#[cfg(test)]
mod body_tests {
    use super::Body;

    #[test]
    fn a_body_never_prints_its_content() {
        let body = Body::json(&serde_json::json!({ "bmc": { "password": "hunter2-bmc-password" } }));
        let shown = format!("{body:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.starts_with("Body(") && shown.ends_with(" bytes)"), "{shown}");
    }
}
