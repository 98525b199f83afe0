//! `paddock`: one binary for every process of the control plane.
//! `serve` (API and worker), `api`, `worker`, `migrate`, `reseal`, `check-config`, `openapi`,
//! `token`, `dev`.

mod config;
mod console;
mod dev;
mod http;
mod reference;
mod server;
mod validate;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use paddock_auth::Claims;
use paddock_domain::{Actor, Role};

use config::{LogFormat, Settings};
use validate::Process;

/// jemalloc rather than glibc's malloc: a request's allocations are often freed on another tokio
/// worker than the one that made them, and under glibc that cost paddock's API (more and larger
/// allocations per request than the bare stack) some 10% of its GET rate against api-bare with
/// the same allocator (bench/results/api-load.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Debug, Parser)]
#[command(name = "paddock", version, about = "Control plane for fully isolated managed clusters on bare metal")]
struct Cli {
    #[command(flatten)]
    settings: Settings,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Migrate, then run the API and the worker in one process.
    Serve,
    /// Run the API only (any number of API processes may share one database).
    Api,
    /// Run the worker only (any number of workers may share one database).
    Worker,
    /// Apply the database migrations and exit.
    Migrate,
    /// Ask the workers to seal every secret again under the current encryption key (for key
    /// rotation: the old keys can be retired once the `reseal` job has succeeded).
    Reseal,
    /// Check the configuration as PROCESS would at its start, and list every problem (exit 1), or
    /// say it is fine (exit 0). Reads nothing but the settings: no database, no listener.
    CheckConfig {
        /// The process whose start to check.
        #[arg(value_enum, default_value = "serve")]
        process: Process,
    },
    /// Write the OpenAPI document.
    Openapi {
        /// Where to write it; `-` for standard output.
        #[arg(long, short, default_value = "openapi/openapi.json")]
        output: PathBuf,
    },
    /// Write the configuration reference (every setting: variable, flag, default, meaning).
    ConfigReference {
        /// Where to write it; `-` for standard output.
        #[arg(long, short, default_value = reference::DEFAULT_PATH)]
        output: PathBuf,
    },
    /// Mint a token with the configured HS256 secret.
    Token {
        /// Role (repeatable): provider:admin, provider:operator, billing:reader, tenant:admin, tenant:member.
        #[arg(long = "role", required = true)]
        roles: Vec<String>,
        /// Tenant id: required with the tenant roles (tenant:admin, tenant:member).
        #[arg(long)]
        tenant: Option<uuid::Uuid>,
        /// Subject.
        #[arg(long, default_value = "operator")]
        sub: String,
        /// Lifetime in seconds (1 to PADDOCK_TOKEN_MAX_LIFETIME).
        #[arg(long, default_value_t = 3600)]
        ttl: i64,
    },
    /// Run paddock on its embedded default: a private PostgreSQL, demo data, simulated drivers.
    Dev(dev::DevArgs),
    /// Set the demand the simulated drivers report for one node pool (what slurmrestd, or a
    /// `kubernetes` cluster's scheduler, would show): for elastic pools in `paddock dev` and
    /// demos. Writes the simulated world in PADDOCK_DATABASE_URL (`paddock dev` prints it).
    SimDemand {
        /// The cluster's id.
        #[arg(long)]
        cluster: uuid::Uuid,
        /// The pool's name.
        #[arg(long)]
        pool: String,
        /// Jobs pending in the pool's partitions (unschedulable pods for `kubernetes`).
        #[arg(long, default_value_t = 0)]
        pending_jobs: u32,
        /// The nodes they ask for.
        #[arg(long, default_value_t = 0)]
        pending_nodes: u32,
        /// The pool's nodes running something (the rest are idle).
        #[arg(long, default_value_t = 0)]
        busy_nodes: u32,
        /// The nodes the widest pending job asks for, of those asked (a Slurm job of several
        /// nodes, listed as job `1`; 0: none singled out).
        #[arg(long, default_value_t = 0)]
        widest_job_nodes: u32,
    },
}

fn init_logging(settings: &Settings) {
    let filter = tracing_subscriber::EnvFilter::try_new(&settings.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match settings.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Pretty => builder.init(),
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut settings = cli.settings;
    settings.simulated_defaults();
    match cli.command {
        Command::Openapi { output } => write_document(&output, &paddock_api::openapi_json()),
        Command::ConfigReference { output } => write_document(&output, &reference::markdown()),
        Command::Token { roles, tenant, sub, ttl } => {
            let secret = settings.hs256_secret()?.context("`paddock token` needs PADDOCK_JWT_HS256_SECRET")?;
            println!("{}", mint(&secret, &settings, sub, roles, tenant, ttl)?);
            Ok(())
        }
        Command::CheckConfig { process } => {
            settings.validate(process)?;
            println!("the configuration is valid for `paddock {}`", config::name(process));
            Ok(())
        }
        Command::Dev(args) => {
            init_logging(&settings);
            dev::run(settings, args)
        }
        Command::SimDemand { cluster, pool, pending_jobs, pending_nodes, busy_nodes, widest_job_nodes } => {
            let url = settings.database_url()?.to_owned();
            let demand = paddock_sim::SimDemand { pending_jobs, pending_nodes, busy_nodes, widest_job_nodes };
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let store = paddock_store::Store::connect_lazy(&url, 1)?;
                let mut conn = store.conn().await.context("connecting to the database")?;
                let id = paddock_types::ClusterId(cluster);
                paddock_sim::set_demand_on(&mut conn, id, &pool, demand)
                    .await
                    .context("setting the simulated demand (is this a database of the simulated drivers?)")
            })?;
            println!("pool {pool} of cluster {cluster}: {pending_jobs} pending, {pending_nodes} nodes asked, {busy_nodes} busy");
            Ok(())
        }
        command => {
            init_logging(&settings);
            let process = match command {
                Command::Serve => Process::Serve,
                Command::Api => Process::Api,
                Command::Worker => Process::Worker,
                Command::Migrate => Process::Migrate,
                _ => Process::Reseal,
            };
            settings.validate(process)?;
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            runtime.block_on(async {
                match command {
                    Command::Serve => {
                        server::serve(&settings, server::Roles { api: true, worker: true, migrate: true }).await
                    }
                    Command::Api => {
                        server::serve(&settings, server::Roles { api: true, worker: false, migrate: false }).await
                    }
                    Command::Worker => {
                        server::serve(&settings, server::Roles { api: false, worker: true, migrate: false }).await
                    }
                    Command::Migrate => server::migrate(&settings).await,
                    Command::Reseal => server::reseal(&settings).await,
                    _ => unreachable!("handled above"),
                }
            })
        }
    }
}

/// Writes a generated document (the OpenAPI document, the configuration reference) to a file,
/// or to standard output for `-`.
fn write_document(output: &std::path::Path, text: &str) -> anyhow::Result<()> {
    if output.as_os_str() == "-" {
        use std::io::Write;
        // A closed pipe (`| head`) is not an error worth a panic.
        let _ = std::io::stdout().write_all(text.as_bytes());
    } else {
        std::fs::write(output, text).with_context(|| format!("writing {}", output.display()))?;
        eprintln!("wrote {}", output.display());
    }
    Ok(())
}

/// Refuses the claims a paddock server would refuse or ignore: an unknown role (it grants
/// nothing), a tenant role without its tenant (the token is refused), an empty subject.
fn check_claims(sub: &str, roles: &[String], tenant: Option<uuid::Uuid>) -> anyhow::Result<()> {
    let known = || Role::ALL.map(Role::as_str).join(", ");
    if let Some(unknown) = roles.iter().find(|r| Role::parse(r).is_none()) {
        anyhow::bail!("unknown role `{unknown}`: the roles are {} (a server ignores any other)", known());
    }
    if sub.is_empty() {
        anyhow::bail!("--sub must not be empty: a server refuses a token without a subject");
    }
    if Actor::from_claims(sub.to_owned(), roles.to_vec(), tenant.map(paddock_types::TenantId)).is_err() {
        let role = roles.iter().find(|r| Role::parse(r).is_some_and(Role::is_tenant_role)).map_or("", String::as_str);
        anyhow::bail!(
            "{role} acts within one tenant: add --tenant <tenant id> (a server refuses a tenant role without it)"
        );
    }
    Ok(())
}

/// Mints an HS256 token for `paddock token` and `paddock dev`.
pub(crate) fn mint(
    secret: &paddock_auth::Secret,
    settings: &Settings,
    sub: String,
    roles: Vec<String>,
    tenant: Option<uuid::Uuid>,
    ttl: i64,
) -> anyhow::Result<String> {
    check_claims(&sub, &roles, tenant)?;
    let max = i64::try_from(settings.token_max_lifetime).unwrap_or(i64::MAX);
    if !(1..=max).contains(&ttl) {
        anyhow::bail!(
            "--ttl must be between 1 and {max} seconds (PADDOCK_TOKEN_MAX_LIFETIME): a longer token is refused"
        );
    }
    let now = chrono::Utc::now().timestamp();
    let claims = Claims {
        sub,
        roles,
        tenant_id: tenant,
        exp: now + ttl,
        nbf: Some(now - 5),
        iat: Some(now),
        iss: settings.jwt_issuer.clone(),
        aud: serde_json::Value::String(settings.jwt_audience.clone()),
    };
    paddock_auth::mint_hs256(secret, &claims).context("minting the token")
}
