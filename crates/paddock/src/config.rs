//! The one configuration of a paddock process: parsed once (flags with environment fallbacks, the
//! names of docs/configuration.md), validated, then passed down as typed parts. No other code reads the
//! environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use paddock_auth::{Secret, VerifierConfig};
use paddock_domain::ledger::LedgerKey;
use paddock_domain::secret::Cipher;
use paddock_domain::signing::SigningKey;

/// The host of the simulated images' URLs: the simulated BMCs never fetch them.
pub const SIMULATED_IMAGE_HOST: &str = "images.paddock.invalid";

/// Kubernetes driver choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KubeDriver {
    /// The platform cluster through the Kubernetes API.
    Kubernetes,
    /// In-process simulation (dev, demos, benchmarks).
    Simulated,
    /// No driver: jobs that need one wait with `driver_not_configured`.
    None,
}

/// BMC driver choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BmcDriver {
    /// Redfish over HTTPS.
    Redfish,
    /// In-process simulation (dev, demos, benchmarks).
    Simulated,
    /// No driver: jobs that need one wait with `driver_not_configured`.
    None,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable.
    Pretty,
    /// One JSON object per line.
    Json,
}

/// Settings shared by every command. Its `Debug` shows no secret (see below).
#[derive(Clone, Args)]
pub struct Settings {
    /// PostgreSQL URL.
    #[arg(long, env = "PADDOCK_DATABASE_URL", hide_env_values = true, global = true)]
    pub database_url: Option<String>,
    /// PostgreSQL URL of a role that owns the schema, for migrating (`paddock migrate`, and
    /// `paddock serve` before it serves); the role of PADDOCK_DATABASE_URL then gets only what it
    /// needs (SELECT and INSERT on the custody ledger). Default: PADDOCK_DATABASE_URL, one role.
    #[arg(long, env = "PADDOCK_MIGRATE_DATABASE_URL", hide_env_values = true, global = true)]
    pub migrate_database_url: Option<String>,
    /// Most database connections per process.
    #[arg(long, env = "PADDOCK_DATABASE_MAX_CONNECTIONS", default_value_t = 16, global = true)]
    pub database_max_connections: u32,
    /// API listen address.
    #[arg(long, env = "PADDOCK_LISTEN", default_value = "127.0.0.1:8080", global = true)]
    pub listen: SocketAddr,
    /// A separate listener for `/metrics` (then off the API listener); a `paddock worker` has no
    /// other.
    #[arg(long, env = "PADDOCK_METRICS_LISTEN", global = true)]
    pub metrics_listen: Option<SocketAddr>,
    /// A separate listener for the agents' endpoints (`/v1/agent/...`), e.g. on the provisioning
    /// network: then they are served there only (404 on PADDOCK_LISTEN), and nothing else is (no
    /// other route, no `/openapi.json`). Default: none, they are served on PADDOCK_LISTEN.
    #[arg(long, env = "PADDOCK_AGENT_LISTEN", global = true)]
    pub agent_listen: Option<SocketAddr>,
    /// Shared secret for HS256 tokens.
    #[arg(long, env = "PADDOCK_JWT_HS256_SECRET", hide_env_values = true, global = true)]
    pub jwt_hs256_secret: Option<String>,
    /// File holding the HS256 secret.
    #[arg(long, env = "PADDOCK_JWT_HS256_SECRET_FILE", global = true)]
    pub jwt_hs256_secret_file: Option<PathBuf>,
    /// PEM public keys (RS256/ES256/EdDSA): a file or a directory of .pem files.
    #[arg(long, env = "PADDOCK_JWT_PUBLIC_KEYS", global = true)]
    pub jwt_public_keys: Option<PathBuf>,
    /// JWKS endpoint of the provider's identity service.
    #[arg(long, env = "PADDOCK_JWT_JWKS_URL", global = true)]
    pub jwt_jwks_url: Option<url::Url>,
    /// Required `iss`.
    #[arg(long, env = "PADDOCK_JWT_ISSUER", default_value = "paddock", global = true)]
    pub jwt_issuer: String,
    /// Required `aud`.
    #[arg(long, env = "PADDOCK_JWT_AUDIENCE", default_value = "paddock", global = true)]
    pub jwt_audience: String,
    /// Longest `exp - iat` accepted in a JWT, seconds (a token without `iat` is refused).
    #[arg(long, env = "PADDOCK_TOKEN_MAX_LIFETIME", default_value_t = 86_400, global = true)]
    pub token_max_lifetime: u64,
    /// 32-byte key, base64, for secrets at rest.
    #[arg(long, env = "PADDOCK_ENCRYPTION_KEY", hide_env_values = true, global = true)]
    pub encryption_key: Option<String>,
    /// File holding the encryption key.
    #[arg(long, env = "PADDOCK_ENCRYPTION_KEY_FILE", global = true)]
    pub encryption_key_file: Option<PathBuf>,
    /// Older encryption keys still accepted for reading, comma-separated.
    #[arg(long, env = "PADDOCK_ENCRYPTION_OLD_KEYS", hide_env_values = true, value_delimiter = ',', global = true)]
    pub encryption_old_keys: Vec<String>,
    /// HMAC key of the custody ledger.
    #[arg(long, env = "PADDOCK_LEDGER_KEY", hide_env_values = true, global = true)]
    pub ledger_key: Option<String>,
    /// File holding the ledger key.
    #[arg(long, env = "PADDOCK_LEDGER_KEY_FILE", global = true)]
    pub ledger_key_file: Option<PathBuf>,
    /// Ed25519 private key (PKCS#8 PEM) signing closed billing periods and ledger checkpoints.
    #[arg(long, env = "PADDOCK_USAGE_SIGNING_KEY", hide_env_values = true, global = true)]
    pub usage_signing_key: Option<String>,
    /// File holding the signing key.
    #[arg(long, env = "PADDOCK_USAGE_SIGNING_KEY_FILE", global = true)]
    pub usage_signing_key_file: Option<PathBuf>,
    /// Seconds after a billing period's end before it may be closed.
    #[arg(long, env = "PADDOCK_USAGE_CLOSE_GRACE", default_value_t = 3600, global = true)]
    pub usage_close_grace: u32,
    /// The provider's name in FOCUS exports (unset: the FOCUS export answers 409).
    #[arg(long, env = "PADDOCK_BILLING_PROVIDER_NAME", global = true)]
    pub billing_provider_name: Option<String>,
    /// Usage exports one caller (JWT subject) may run at once per API process; one more is
    /// answered 429 with Retry-After.
    #[arg(long, env = "PADDOCK_USAGE_EXPORT_MAX_PER_CALLER", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..), global = true)]
    pub usage_export_max_per_caller: u32,
    /// Seconds a usage export waits for the client to read on before it is cut off.
    #[arg(long, env = "PADDOCK_USAGE_EXPORT_IDLE_TIMEOUT", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..), global = true)]
    pub usage_export_idle_timeout: u64,
    /// Seconds a usage export may run in all before it is cut off.
    #[arg(long, env = "PADDOCK_USAGE_EXPORT_MAX_DURATION", default_value_t = 3600,
          value_parser = clap::value_parser!(u64).range(1..), global = true)]
    pub usage_export_max_duration: u64,
    /// Kubernetes driver.
    #[arg(long, env = "PADDOCK_KUBE_DRIVER", value_enum, default_value = "none", global = true)]
    pub kube_driver: KubeDriver,
    /// BMC driver.
    #[arg(long, env = "PADDOCK_BMC_DRIVER", value_enum, default_value = "none", global = true)]
    pub bmc_driver: BmcDriver,
    /// Kubeconfig of the platform cluster (default: in-cluster configuration).
    #[arg(long, env = "PADDOCK_KUBECONFIG", global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// A ClusterRole the worker binds its own account to in each tenant namespace it makes (a
    /// RoleBinding in that namespace), for an account whose platform-cluster role only creates
    /// namespaces (the chart's). Default: none, the account works in every namespace.
    #[arg(long, env = "PADDOCK_KUBE_NAMESPACE_ROLE", global = true)]
    pub kube_namespace_role: Option<String>,
    /// URL machines use to reach `/v1/agent/config` and `/report`; https unless
    /// PADDOCK_AGENT_INSECURE_HTTP=true (default: http:// + PADDOCK_AGENT_LISTEN, else the
    /// listen address, for labs).
    #[arg(long, env = "PADDOCK_AGENT_BASE_URL", global = true)]
    pub agent_base_url: Option<url::Url>,
    /// URL the BMCs fetch seed images from (`/v1/agent/seed/...`); default PADDOCK_AGENT_BASE_URL.
    #[arg(long, env = "PADDOCK_AGENT_SEED_BASE_URL", global = true)]
    pub agent_seed_base_url: Option<url::Url>,
    /// Allow plain `http` agent URLs (labs, tests).
    #[arg(long, env = "PADDOCK_AGENT_INSECURE_HTTP", default_value_t = false, action = clap::ArgAction::Set, global = true)]
    pub agent_insecure_http: bool,
    /// The API's public URL, the `source` of every webhook event (CloudEvents); default
    /// `http://` + PADDOCK_LISTEN.
    #[arg(long, env = "PADDOCK_PUBLIC_URL", global = true)]
    pub public_url: Option<url::Url>,
    /// Allow plain `http` webhook URLs (labs, tests); otherwise only `https`.
    #[arg(long, env = "PADDOCK_WEBHOOK_INSECURE_HTTP", default_value_t = false, action = clap::ArgAction::Set, global = true)]
    pub webhook_insecure_http: bool,
    /// Comma-separated CIDRs webhooks may go to although they are loopback, private, link-local,
    /// CGNAT or reserved (e.g. `10.20.0.0/16` for a receiver on the provider's network).
    #[arg(long, env = "PADDOCK_WEBHOOK_ALLOWED_NETWORKS", value_delimiter = ',', global = true)]
    pub webhook_allowed_networks: Vec<String>,
    /// The POSIX ids (`first-last`) paddock gives the users (`uidNumber`) and groups (`gidNumber`)
    /// a tenant's identity provider pushes over SCIM without naming one; ids it names must be
    /// inside too. It must start at 1000 or above (past the system ids and the images' `slurm`
    /// user 401); 65534 and 65535 are never given. Each tenant has the whole range.
    #[arg(long, env = "PADDOCK_IDENTITY_ID_RANGE", default_value = "10000-59999", global = true)]
    pub identity_id_range: String,
    /// PEM file of the CA that signs the agent endpoint's TLS certificate, handed to the agents in
    /// their seed (unset: the endpoint's certificate is from a CA the images trust).
    #[arg(long, env = "PADDOCK_AGENT_CA_CERT_FILE", global = true)]
    pub agent_ca_cert_file: Option<PathBuf>,
    /// SHA-256 (hex) of the wipe image: recorded in the ledger; a wipe report naming another fails.
    #[arg(long, env = "PADDOCK_WIPE_IMAGE_SHA256", global = true)]
    pub wipe_image_sha256: Option<String>,
    /// SHA-256 (hex) of the node OS image: a provisioning report naming another fails.
    #[arg(long, env = "PADDOCK_OS_IMAGE_SHA256", global = true)]
    pub os_image_sha256: Option<String>,
    /// The provider's wipe image.
    #[arg(long, env = "PADDOCK_WIPE_IMAGE_URL", global = true)]
    pub wipe_image_url: Option<url::Url>,
    /// The node OS image.
    #[arg(long, env = "PADDOCK_OS_IMAGE_URL", global = true)]
    pub os_image_url: Option<url::Url>,
    /// Directory of upstream stack manifests, by stack version.
    #[arg(long, env = "PADDOCK_STACKS_DIR", global = true)]
    pub stacks_dir: Option<PathBuf>,
    /// Where tenant clusters pull their Slurm images from, replacing every registry of the stacks'
    /// Slurm catalogues, MariaDB's included (names and tags kept: `<registry>/slurmctld:<tag>`,
    /// `<registry>/mariadb:<tag>`), e.g. a mirror `registry.example:5000/slurm`: a host, an
    /// optional port and path, no scheme, tag or trailing `/`. Unset: the catalogues' own.
    #[arg(long, env = "PADDOCK_SLURM_IMAGE_REGISTRY", global = true)]
    pub slurm_image_registry: Option<String>,
    /// Lifetime of a run's agent tokens, seconds (longer than the longest wipe).
    #[arg(long, env = "PADDOCK_AGENT_TOKEN_TTL", default_value_t = 21_600, global = true)]
    pub agent_token_ttl: u64,
    /// Lifetime of a node's bootstrap token, seconds (deleted once the Node has registered).
    #[arg(long, env = "PADDOCK_JOIN_TOKEN_TTL", default_value_t = 900, global = true)]
    pub join_token_ttl: u64,
    /// Seconds a release may wait for the Slurm drain and the Node's removal before it is forced.
    #[arg(long, env = "PADDOCK_RELEASE_TIMEOUT", default_value_t = 1800, global = true)]
    pub release_timeout: u64,
    /// Seconds a waiting allocation may hold back later requests of its machine class.
    #[arg(long, env = "PADDOCK_ALLOCATION_HEAD_TIMEOUT", default_value_t = 600, global = true)]
    pub allocation_head_timeout: u64,
    /// Origins allowed for the portal, comma-separated.
    #[arg(long, env = "PADDOCK_CORS_ORIGINS", value_delimiter = ',', global = true)]
    pub cors_origins: Vec<String>,
    /// The console's sign-in through the provider's OIDC issuer (docs/console.md): the issuer's
    /// discovery document, `<issuer>/.well-known/openid-configuration` (https; plain http only to
    /// a loopback address). Set with PADDOCK_CONSOLE_OIDC_CLIENT_ID and
    /// PADDOCK_CONSOLE_OIDC_REDIRECT_URI, or none of them (then the console takes pasted tokens
    /// only).
    #[arg(long, env = "PADDOCK_CONSOLE_OIDC_DISCOVERY_URL", global = true)]
    pub console_oidc_discovery_url: Option<url::Url>,
    /// The console's client id at the OIDC issuer (a public client: authorization code with PKCE,
    /// no secret).
    #[arg(long, env = "PADDOCK_CONSOLE_OIDC_CLIENT_ID", global = true)]
    pub console_oidc_client_id: Option<String>,
    /// Where the issuer sends the browser back: the console's own URL, ending in `/console/`
    /// (https; plain http only to a loopback address), registered at the issuer as is.
    #[arg(long, env = "PADDOCK_CONSOLE_OIDC_REDIRECT_URI", global = true)]
    pub console_oidc_redirect_uri: Option<url::Url>,
    /// The scopes the console asks the issuer for, space-separated; `openid` among them (its ID
    /// token carries the nonce), plus whatever puts paddock's audience, `roles` and `tenant_id`
    /// into the access token at that issuer.
    #[arg(long, env = "PADDOCK_CONSOLE_OIDC_SCOPES", default_value = "openid", global = true)]
    pub console_oidc_scopes: String,
    /// Jobs one worker process runs at once.
    #[arg(long, env = "PADDOCK_WORKER_CONCURRENCY", default_value_t = 8, global = true)]
    pub worker_concurrency: usize,
    /// Of those, how many one tenant's jobs may hold at once (its clusters' and machines').
    #[arg(long, env = "PADDOCK_WORKER_TENANT_SLOTS", default_value_t = 4, global = true)]
    pub worker_tenant_slots: usize,

    /// Seconds a running job's lease lasts (renewed every third of it); a crashed worker's jobs
    /// are taken over this long after its last renewal.
    #[arg(long, env = "PADDOCK_WORKER_LEASE", default_value_t = 30, global = true)]
    pub worker_lease: u64,

    /// Seconds between two power checks of a machine at rest (`available`, `maintenance`,
    /// `clean_failed`: off; `active`: on); a drift is corrected, repeated drift takes the machine
    /// out of service. The same read records a health report when the BMC's rating changes.
    #[arg(long, env = "PADDOCK_POWER_SYNC_INTERVAL", default_value_t = 300, global = true)]
    pub power_sync_interval: u64,

    /// Seconds between two drift checks of a ready cluster (0 = never): its objects are read and
    /// what was changed or removed behind paddock's back is restored and named in the cluster's
    /// events. Each cluster's check is spread by a tenth either way.
    #[arg(long, env = "PADDOCK_DRIFT_INTERVAL", default_value_t = 600, global = true)]
    pub drift_interval: u64,

    /// Seconds an active machine's Node may stay not Ready in its tenant cluster before a `failed`
    /// health report (source `kubernetes`) is recorded; the Node Ready again records a `healthy`
    /// one. A ready cluster sees a Node go not Ready at its next drift check.
    #[arg(long, env = "PADDOCK_NODE_NOT_READY_GRACE", default_value_t = 300, global = true)]
    pub node_not_ready_grace: u64,

    /// Seconds between two reads of the demand of a cluster's autoscaled pools (Slurm's pending
    /// jobs and idle nodes, or a `kubernetes` cluster's unschedulable pods): how soon an elastic
    /// pool starts to grow after work arrives, at the cost of one check per cluster per interval.
    #[arg(long, env = "PADDOCK_AUTOSCALE_INTERVAL", default_value_t = 15, global = true)]
    pub autoscale_interval: u64,

    /// Scales every latency of the simulated drivers (1 = their dev defaults, 0 = none); for
    /// demos, tests and benchmarks. Not part of the production configuration.
    #[arg(long, env = "PADDOCK_SIM_LATENCY_SCALE", default_value_t = 1.0, global = true, hide = true)]
    pub sim_latency_scale: f64,

    // Operations: the database's time limit, the shutdown.
    /// Longest a database statement may run (lock waits included), seconds; a slower one is
    /// cancelled and its request answered 503 with Retry-After (0 = no limit). Not applied to the
    /// migrations of `paddock migrate` and `paddock serve`.
    #[arg(long, env = "PADDOCK_DATABASE_STATEMENT_TIMEOUT", default_value_t = 30, global = true)]
    pub database_statement_timeout: u64,
    /// Seconds a stopping process (SIGTERM) takes to finish its requests in flight and its
    /// running jobs; the jobs still running then are given back to the queue. Keep it below the
    /// orchestrator's own grace period (Kubernetes: terminationGracePeriodSeconds).
    #[arg(long, env = "PADDOCK_SHUTDOWN_GRACE", default_value_t = 25, global = true)]
    pub shutdown_grace: u64,

    // The HTTP edge's limits (defaults far above what bench/api-load drives).
    /// Seconds a client has to send a request's headers before its connection is closed.
    #[arg(long, env = "PADDOCK_HTTP_HEADER_READ_TIMEOUT", default_value_t = 10, global = true)]
    pub http_header_read_timeout: u64,
    /// Seconds a request may take, its body included; a slower one is answered 503.
    #[arg(long, env = "PADDOCK_HTTP_REQUEST_TIMEOUT", default_value_t = 30, global = true)]
    pub http_request_timeout: u64,
    /// Requests in flight at once per process; more are answered 503 with Retry-After.
    #[arg(long, env = "PADDOCK_HTTP_MAX_IN_FLIGHT", default_value_t = 1024, global = true)]
    pub http_max_in_flight: usize,
    /// Requests per second one caller (a verified JWT subject, an agent token once a route has
    /// accepted it, else the client address: made-up tokens and unmatched paths included) may
    /// sustain; more are answered 429 with Retry-After.
    #[arg(long, env = "PADDOCK_RATE_LIMIT_PER_SECOND", default_value_t = 50_000, global = true)]
    pub rate_limit_per_second: u32,
    /// Requests one caller may send at once above its rate.
    #[arg(long, env = "PADDOCK_RATE_LIMIT_BURST", default_value_t = 100_000, global = true)]
    pub rate_limit_burst: u32,

    /// Log filter (`tracing` EnvFilter syntax, e.g. `info,paddock_worker=debug`).
    #[arg(long, env = "PADDOCK_LOG", default_value = "info", global = true)]
    pub log: String,
    /// Log format.
    #[arg(long, env = "PADDOCK_LOG_FORMAT", value_enum, default_value = "pretty", global = true)]
    pub log_format: LogFormat,
}

/// The configuration spelling of a choice.
pub fn name(value: impl ValueEnum) -> String {
    value.to_possible_value().map(|v| v.get_name().to_owned()).unwrap_or_default()
}

/// A secret given directly or through a `_FILE` variant (trailing newline removed).
pub(crate) fn secret_value(
    direct: &Option<String>,
    file: &Option<PathBuf>,
    name: &str,
) -> anyhow::Result<Option<String>> {
    match (direct, file) {
        (Some(_), Some(_)) => bail!("set {name} or {name}_FILE, not both"),
        (Some(v), None) => Ok(Some(v.clone())),
        (None, Some(path)) => {
            let v = std::fs::read_to_string(path).with_context(|| format!("reading {name}_FILE {}", path.display()))?;
            Ok(Some(v.trim_end_matches(['\n', '\r']).to_owned()))
        }
        (None, None) => Ok(None),
    }
}

/// Shows what is configured, never a secret: the database URL's password, the JWT secret and the
/// keys print as whether they are set. A setting added later is left out (`..`) until it is
/// listed here, so a new secret cannot leak through it by accident.
impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |v: &Option<String>, file: &Option<PathBuf>| match (v, file) {
            (Some(_), _) => "<set>",
            (None, Some(_)) => "<from file>",
            (None, None) => "<unset>",
        };
        let database = self.database_url.as_deref().map(redacted_url);
        f.debug_struct("Settings")
            .field("database_url", &database)
            .field("listen", &self.listen)
            .field("metrics_listen", &self.metrics_listen)
            .field("agent_listen", &self.agent_listen)
            .field("jwt_hs256_secret", &set(&self.jwt_hs256_secret, &self.jwt_hs256_secret_file))
            .field("jwt_public_keys", &self.jwt_public_keys)
            .field("jwt_jwks_url", &self.jwt_jwks_url.as_ref().map(url::Url::as_str))
            .field("encryption_key", &set(&self.encryption_key, &self.encryption_key_file))
            .field("encryption_old_keys", &self.encryption_old_keys.len())
            .field("ledger_key", &set(&self.ledger_key, &self.ledger_key_file))
            .field("usage_signing_key", &set(&self.usage_signing_key, &self.usage_signing_key_file))
            .field("kube_driver", &self.kube_driver)
            .field("kube_namespace_role", &self.kube_namespace_role)
            .field("bmc_driver", &self.bmc_driver)
            .field("agent_base_url", &self.agent_base_url.as_ref().map(url::Url::as_str))
            .field("agent_seed_base_url", &self.agent_seed_base_url.as_ref().map(url::Url::as_str))
            .field("agent_insecure_http", &self.agent_insecure_http)
            .field("public_url", &self.public_url.as_ref().map(url::Url::as_str))
            .field("webhook_insecure_http", &self.webhook_insecure_http)
            .field("webhook_allowed_networks", &self.webhook_allowed_networks)
            .field("identity_id_range", &self.identity_id_range)
            .field("stacks_dir", &self.stacks_dir)
            .field("slurm_image_registry", &self.slurm_image_registry)
            .field("console_oidc_discovery_url", &self.console_oidc_discovery_url.as_ref().map(url::Url::as_str))
            .field("console_oidc_client_id", &self.console_oidc_client_id)
            .finish_non_exhaustive()
    }
}

/// A URL with its password (and anything that does not parse) replaced.
fn redacted_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut url) => {
            if url.password().is_some() {
                let _ = url.set_password(Some("<redacted>"));
            }
            url.to_string()
        }
        Err(_) => "<unparsable>".to_owned(),
    }
}

impl Settings {
    /// The database URL, required by every command that talks to PostgreSQL.
    pub fn database_url(&self) -> anyhow::Result<&str> {
        self.database_url.as_deref().context("PADDOCK_DATABASE_URL is required (or run `paddock dev`)")
    }

    /// The URL migrations run with: PADDOCK_MIGRATE_DATABASE_URL, else PADDOCK_DATABASE_URL.
    pub fn migrate_database_url(&self) -> anyhow::Result<&str> {
        match &self.migrate_database_url {
            Some(url) => Ok(url),
            None => self.database_url(),
        }
    }

    /// The HTTP edge's limits of a request.
    pub fn limits(&self) -> paddock_api::limits::Limits {
        paddock_api::limits::Limits {
            request_timeout: std::time::Duration::from_secs(self.http_request_timeout),
            max_in_flight: self.http_max_in_flight,
            rate_per_second: self.rate_limit_per_second,
            rate_burst: self.rate_limit_burst,
        }
    }

    /// The header-read timeout of HTTP connections.
    pub fn header_read_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.http_header_read_timeout)
    }

    /// The statement timeout, None for no limit.
    pub fn statement_timeout(&self) -> Option<std::time::Duration> {
        (self.database_statement_timeout > 0).then(|| std::time::Duration::from_secs(self.database_statement_timeout))
    }

    /// The HS256 secret, if configured.
    pub fn hs256_secret(&self) -> anyhow::Result<Option<Secret>> {
        Ok(secret_value(&self.jwt_hs256_secret, &self.jwt_hs256_secret_file, "PADDOCK_JWT_HS256_SECRET")?
            .map(|s| Secret::new(s.into_bytes())))
    }

    /// Token verification settings; the verifier itself refuses a configuration without keys.
    pub fn verifier(&self) -> anyhow::Result<VerifierConfig> {
        Ok(VerifierConfig {
            hs256_secret: self.hs256_secret()?,
            public_keys_pem: self.jwt_public_keys.clone(),
            jwks_url: self.jwt_jwks_url.clone(),
            issuer: self.jwt_issuer.clone(),
            audience: self.jwt_audience.clone(),
            max_lifetime_secs: self.token_max_lifetime,
            ..VerifierConfig::default()
        })
    }

    /// The cipher for secrets at rest; required by every process that writes or reads them.
    pub fn cipher(&self) -> anyhow::Result<Arc<Cipher>> {
        let key = secret_value(&self.encryption_key, &self.encryption_key_file, "PADDOCK_ENCRYPTION_KEY")?
            .context("PADDOCK_ENCRYPTION_KEY (or PADDOCK_ENCRYPTION_KEY_FILE) is required: 32 bytes, base64 (`openssl rand -base64 32`)")?;
        let cipher = Cipher::new(&key, &self.encryption_old_keys)
            .context("PADDOCK_ENCRYPTION_KEY or PADDOCK_ENCRYPTION_OLD_KEYS is malformed")?;
        Ok(Arc::new(cipher))
    }

    /// The custody ledger's HMAC key (its UTF-8 bytes), required by every process that serves or
    /// works: each custody entry is sealed by the process that writes it (`paddock dev` makes one).
    pub fn ledger_key(&self) -> anyhow::Result<LedgerKey> {
        let key = secret_value(&self.ledger_key, &self.ledger_key_file, "PADDOCK_LEDGER_KEY")?.context(
            "PADDOCK_LEDGER_KEY (or PADDOCK_LEDGER_KEY_FILE) is required: the custody ledger's HMAC key, at least 32 characters (`openssl rand -base64 32`)",
        )?;
        Ok(LedgerKey::new(key.into_bytes()))
    }

    /// The provider's Ed25519 signing key, if configured (closing a billing period and the ledger
    /// checkpoints need it).
    pub fn signing_key(&self) -> anyhow::Result<Option<SigningKey>> {
        let Some(pem) =
            secret_value(&self.usage_signing_key, &self.usage_signing_key_file, "PADDOCK_USAGE_SIGNING_KEY")?
        else {
            return Ok(None);
        };
        let key = SigningKey::from_pem(&pem).context(
            "PADDOCK_USAGE_SIGNING_KEY is malformed (an Ed25519 PKCS#8 PEM: `openssl genpkey -algorithm ed25519`)",
        )?;
        Ok(Some(key))
    }

    /// What the agent endpoints need (docs/security.md, docs/configuration.md): their URLs (the machines' and the
    /// BMCs'), the CA the agents are to trust, and the two images' digests (the simulated images'
    /// when not configured, which only the simulated machines report).
    pub fn agent(&self) -> anyhow::Result<paddock_service::agent::AgentSettings> {
        let defaults = paddock_service::agent::AgentSettings::default();
        let base_url = match &self.agent_base_url {
            Some(url) => url.to_string(),
            None => format!("http://{}", self.agent_listen.unwrap_or(self.listen)),
        };
        let seed_base_url = self.agent_seed_base_url.as_ref().map_or_else(|| base_url.clone(), ToString::to_string);
        let ca_cert = match &self.agent_ca_cert_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading PADDOCK_AGENT_CA_CERT_FILE {}", path.display()))?,
            ),
            None => None,
        };
        Ok(paddock_service::agent::AgentSettings {
            base_url,
            seed_base_url,
            ca_cert,
            wipe_image_sha256: self.wipe_image_sha256.clone().unwrap_or(defaults.wipe_image_sha256),
            os_image_sha256: self.os_image_sha256.clone().unwrap_or(defaults.os_image_sha256),
        })
    }

    /// The POSIX ids given to the tenants' people (PADDOCK_IDENTITY_ID_RANGE).
    pub fn identity_range(&self) -> anyhow::Result<paddock_domain::scim::IdRange> {
        self.identity_id_range.parse().map_err(|why| {
            anyhow::anyhow!("PADDOCK_IDENTITY_ID_RANGE {:?} is not a range of ids: {why}", self.identity_id_range)
        })
    }

    /// Where webhooks may go (PADDOCK_WEBHOOK_INSECURE_HTTP, PADDOCK_WEBHOOK_ALLOWED_NETWORKS).
    pub fn webhook_guard(&self) -> anyhow::Result<paddock_domain::webhook::AddressGuard> {
        let allowed = self
            .webhook_allowed_networks
            .iter()
            .filter(|n| !n.trim().is_empty())
            .map(|n| n.parse().context("PADDOCK_WEBHOOK_ALLOWED_NETWORKS"))
            .collect::<anyhow::Result<_>>()?;
        Ok(paddock_domain::webhook::AddressGuard { insecure_http: self.webhook_insecure_http, allowed })
    }

    /// The CloudEvents `source` of webhook events: PADDOCK_PUBLIC_URL, or `http://` + the listen
    /// address.
    pub fn public_url(&self) -> String {
        match &self.public_url {
            Some(url) => url.as_str().trim_end_matches('/').to_owned(),
            None => format!("http://{}", self.listen),
        }
    }

    /// The simulated BMC driver boots simulated images: their URLs default to the simulated ones
    /// (`paddock dev` and `paddock serve` alike), or every machine would wait in cleaning for a
    /// wipe image that is never configured (docs/configuration.md).
    pub fn simulated_defaults(&mut self) {
        if self.bmc_driver == BmcDriver::Simulated {
            let sim_image = |name: &str| url::Url::parse(&format!("http://{SIMULATED_IMAGE_HOST}/{name}"));
            if let (None, Ok(url)) = (&self.wipe_image_url, sim_image("wipe.iso")) {
                self.wipe_image_url = Some(url);
            }
            if let (None, Ok(url)) = (&self.os_image_url, sim_image("node-os.iso")) {
                self.os_image_url = Some(url);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        settings: Settings,
    }

    #[test]
    fn debug_shows_no_secret() {
        let cli = Cli::try_parse_from([
            "paddock",
            "--database-url=postgres://paddock:db-password-1@db.example:5432/paddock",
            "--jwt-hs256-secret=jwt-secret-2-of-at-least-32-bytes-long",
            "--encryption-key=encryption-key-3",
            "--encryption-old-keys=old-key-4",
            "--ledger-key=ledger-key-5-of-at-least-32-bytes-long",
            "--usage-signing-key=signing-key-6",
        ])
        .expect("parses");
        let shown = format!("{:?}", cli.settings);
        for secret in
            ["db-password-1", "jwt-secret-2", "encryption-key-3", "old-key-4", "ledger-key-5", "signing-key-6"]
        {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("postgres://paddock:%3Credacted%3E@db.example:5432/paddock"), "{shown}");
        assert!(shown.contains("jwt_hs256_secret: \"<set>\""), "{shown}");
        assert!(shown.contains("ledger_key: \"<set>\""), "{shown}");
    }

    #[test]
    fn the_simulated_bmc_driver_boots_simulated_images_unless_told_otherwise() {
        let parse = |args: &[&str]| {
            let cli = Cli::try_parse_from(std::iter::once("paddock").chain(args.iter().copied())).expect("arguments");
            let mut settings = cli.settings;
            settings.simulated_defaults();
            settings.wipe_image_url.map(|u| u.to_string())
        };
        assert_eq!(parse(&["--bmc-driver=simulated"]).as_deref(), Some("http://images.paddock.invalid/wipe.iso"));
        let chosen = ["--bmc-driver=simulated", "--wipe-image-url=https://images.example/w.iso"];
        assert_eq!(parse(&chosen).as_deref(), Some("https://images.example/w.iso"));
        assert_eq!(parse(&["--bmc-driver=none"]), None);
    }
}
