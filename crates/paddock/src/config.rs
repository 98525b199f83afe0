//! The one configuration of a paddock process: parsed once (flags with environment fallbacks, the
//! names of SPEC section 9), validated, then passed down as typed parts. No other code reads the
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

/// Settings shared by every command.
#[derive(Debug, Clone, Args)]
pub struct Settings {
    /// PostgreSQL URL.
    #[arg(long, env = "PADDOCK_DATABASE_URL", hide_env_values = true, global = true)]
    pub database_url: Option<String>,
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
    /// Kubernetes driver.
    #[arg(long, env = "PADDOCK_KUBE_DRIVER", value_enum, default_value = "none", global = true)]
    pub kube_driver: KubeDriver,
    /// BMC driver.
    #[arg(long, env = "PADDOCK_BMC_DRIVER", value_enum, default_value = "none", global = true)]
    pub bmc_driver: BmcDriver,
    /// Kubeconfig of the platform cluster (default: in-cluster configuration).
    #[arg(long, env = "PADDOCK_KUBECONFIG", global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// URL machines use to reach `/v1/agent/...` (default: http:// + the listen address).
    #[arg(long, env = "PADDOCK_AGENT_BASE_URL", global = true)]
    pub agent_base_url: Option<url::Url>,
    /// The provider's wipe image.
    #[arg(long, env = "PADDOCK_WIPE_IMAGE_URL", global = true)]
    pub wipe_image_url: Option<url::Url>,
    /// The node OS image.
    #[arg(long, env = "PADDOCK_OS_IMAGE_URL", global = true)]
    pub os_image_url: Option<url::Url>,
    /// Directory of upstream stack manifests, by stack version.
    #[arg(long, env = "PADDOCK_STACKS_DIR", global = true)]
    pub stacks_dir: Option<PathBuf>,
    /// Lifetime of agent tokens, seconds.
    #[arg(long, env = "PADDOCK_AGENT_TOKEN_TTL", default_value_t = 3600, global = true)]
    pub agent_token_ttl: u64,
    /// Origins allowed for the portal, comma-separated.
    #[arg(long, env = "PADDOCK_CORS_ORIGINS", value_delimiter = ',', global = true)]
    pub cors_origins: Vec<String>,
    /// Log filter.
    /// Jobs one worker process runs at once.
    #[arg(long, env = "PADDOCK_WORKER_CONCURRENCY", default_value_t = 8, global = true)]
    pub worker_concurrency: usize,

    /// Seconds a running job's lease lasts (renewed every third of it); a crashed worker's jobs
    /// are taken over this long after its last renewal.
    #[arg(long, env = "PADDOCK_WORKER_LEASE", default_value_t = 30, global = true)]
    pub worker_lease: u64,

    /// Seconds between two power checks of a machine at rest (`available`, `maintenance`,
    /// `clean_failed`: off; `active`: on); a drift is corrected, repeated drift takes the machine
    /// out of service.
    #[arg(long, env = "PADDOCK_POWER_SYNC_INTERVAL", default_value_t = 300, global = true)]
    pub power_sync_interval: u64,

    /// Scales every latency of the simulated drivers (1 = their dev defaults, 0 = none); for
    /// demos, tests and benchmarks. Not part of the production configuration.
    #[arg(long, env = "PADDOCK_SIM_LATENCY_SCALE", default_value_t = 1.0, global = true, hide = true)]
    pub sim_latency_scale: f64,

    // Operations: the schema owner, the database's time limit, the shutdown.
    /// URL of a role that owns the schema, for `paddock migrate` (the runtime role may then lack
    /// ownership); default: the database URL.
    #[arg(long, env = "PADDOCK_MIGRATE_DATABASE_URL", hide_env_values = true, global = true)]
    pub migrate_database_url: Option<String>,
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
fn secret_value(direct: &Option<String>, file: &Option<PathBuf>, name: &str) -> anyhow::Result<Option<String>> {
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

impl Settings {
    /// The database URL, required by every command that talks to PostgreSQL.
    pub fn database_url(&self) -> anyhow::Result<&str> {
        self.database_url.as_deref().context("PADDOCK_DATABASE_URL is required (or run `paddock dev`)")
    }

    /// The URL `paddock migrate` uses: the schema owner's when given.
    pub fn migrate_database_url(&self) -> anyhow::Result<&str> {
        match &self.migrate_database_url {
            Some(url) => Ok(url),
            None => self.database_url(),
        }
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

    /// The custody ledger's HMAC key (its UTF-8 bytes), if configured. Without one the ledger
    /// still records every transition, unsealed, and verification says so.
    pub fn ledger_key(&self) -> anyhow::Result<Option<LedgerKey>> {
        let key = secret_value(&self.ledger_key, &self.ledger_key_file, "PADDOCK_LEDGER_KEY")?;
        Ok(key.map(|k| LedgerKey::new(k.into_bytes())))
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

    /// Checks the settings that later stages use, so a bad value stops the process at start.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.signing_key()?;
        if let Some(key) = secret_value(&self.ledger_key, &self.ledger_key_file, "PADDOCK_LEDGER_KEY")? {
            if key.len() < 32 {
                bail!("PADDOCK_LEDGER_KEY must be at least 32 characters");
            }
        }
        if self.agent_token_ttl == 0 || self.agent_token_ttl > 7 * 24 * 3600 {
            bail!("PADDOCK_AGENT_TOKEN_TTL must be between 1 and 604800 seconds");
        }
        if self.kube_driver == KubeDriver::Kubernetes && self.stacks_dir.is_none() {
            bail!("PADDOCK_KUBE_DRIVER=kubernetes needs PADDOCK_STACKS_DIR (the tenant base stack's manifests; see scripts/stacks-fetch)");
        }
        if self.bmc_driver == BmcDriver::Redfish {
            if self.wipe_image_url.is_none() {
                bail!("PADDOCK_BMC_DRIVER=redfish needs PADDOCK_WIPE_IMAGE_URL (the image machines boot to be wiped)");
            }
            if self.os_image_url.is_none() {
                bail!("PADDOCK_BMC_DRIVER=redfish needs PADDOCK_OS_IMAGE_URL (the node OS image machines are provisioned with)");
            }
        }
        if !(1..=256).contains(&self.worker_concurrency) {
            bail!("PADDOCK_WORKER_CONCURRENCY must be between 1 and 256");
        }
        if !(3..=600).contains(&self.worker_lease) {
            bail!("PADDOCK_WORKER_LEASE must be between 3 and 600 seconds");
        }
        if !(10..=86_400).contains(&self.power_sync_interval) {
            bail!("PADDOCK_POWER_SYNC_INTERVAL must be between 10 and 86400 seconds");
        }
        if self.database_statement_timeout > 3600 {
            bail!("PADDOCK_DATABASE_STATEMENT_TIMEOUT must be at most 3600 seconds (0 = no limit)");
        }
        if !(1..=3600).contains(&self.shutdown_grace) {
            bail!("PADDOCK_SHUTDOWN_GRACE must be between 1 and 3600 seconds");
        }
        if !(0.0..=100.0).contains(&self.sim_latency_scale) {
            bail!("PADDOCK_SIM_LATENCY_SCALE must be between 0 and 100");
        }
        if let Some(dir) = &self.stacks_dir {
            if !dir.is_dir() {
                bail!("PADDOCK_STACKS_DIR {} is not a directory", dir.display());
            }
        }
        Ok(())
    }
}
