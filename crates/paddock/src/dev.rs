//! `paddock dev`: the embedded default. A private PostgreSQL from the machine's server binaries in
//! a local data directory, migrations, demo data (machine classes and a tenant), generated secrets
//! kept beside the data so tokens survive restarts, a provider-admin token and curl examples, and
//! the API with the worker on 127.0.0.1:8080. Ctrl-C stops everything it started.

use std::path::{Path, PathBuf};

use anyhow::Context;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use clap::Args;
use paddock_domain::secret::Cipher;
use paddock_domain::signing::SigningKey;
use paddock_domain::{Actor, Error, Role};
use paddock_pgembed::{find_binaries, PgCluster, PgOptions};
use paddock_service::{Body, Ctx, Services};
use paddock_types::machine_class::{MachineClassCreate, MachineClassPrice};
use paddock_types::tenant::{Quotas, TenantCreate};
use rand::RngCore;
use serde_json::json;

use crate::config::{BmcDriver, KubeDriver, Settings};
use crate::server::{self, Roles};

/// Options of `paddock dev`.
#[derive(Debug, Clone, Args)]
pub struct DevArgs {
    /// Where the private PostgreSQL cluster and the generated secrets live.
    #[arg(long, default_value = ".paddock-dev")]
    pub data_dir: PathBuf,
    /// Directory of the PostgreSQL server binaries (initdb, pg_ctl), if not found on their own.
    #[arg(long, env = "PADDOCK_PG_BIN_DIR")]
    pub pg_bin_dir: Option<PathBuf>,
}

/// Reads a generated secret, or makes and keeps it.
fn kept_secret(dir: &Path, name: &str, make: impl FnOnce() -> String) -> anyhow::Result<String> {
    let path = dir.join(name);
    if let Ok(value) = std::fs::read_to_string(&path) {
        return Ok(value.trim().to_owned());
    }
    let value = make();
    std::fs::write(&path, &value).with_context(|| format!("writing {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(value)
}

fn random_base64(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    STANDARD.encode(buf)
}

/// Runs the dev environment until Ctrl-C.
pub fn run(mut settings: Settings, args: DevArgs) -> anyhow::Result<()> {
    // The address first: a taken port stops dev before it starts anything or prints a token.
    let listener = server::bind(settings.listen).with_context(|| {
        format!(
            "paddock dev cannot listen on {}: stop what listens there, or choose another address with \
             --listen (PADDOCK_LISTEN), e.g. `--listen 127.0.0.1:8081`, or `--listen 127.0.0.1:0` for any free port",
            settings.listen
        )
    })?;
    settings.listen = listener.local_addr()?;
    let bin = find_binaries(args.pg_bin_dir.as_deref())?;
    std::fs::create_dir_all(&args.data_dir).with_context(|| format!("creating {}", args.data_dir.display()))?;
    let data_dir = std::path::absolute(&args.data_dir)?;
    let secrets = data_dir.join("secrets");
    std::fs::create_dir_all(&secrets)?;
    // Where `paddock token` reads the secret from, for the banner's hints.
    let secret_file = settings
        .jwt_hs256_secret_file
        .clone()
        .or_else(|| settings.jwt_hs256_secret.is_none().then(|| secrets.join("jwt-hs256-secret")));
    eprintln!("paddock dev: starting PostgreSQL {} from {}", bin.version, bin.bin_dir.display());
    let pg = PgCluster::start(PgOptions { data_dir: data_dir.join("pgdata"), port: None, bin })?;
    eprintln!("paddock dev: PostgreSQL data in {}", pg.data_dir().display());
    pg.create_database("paddock")?;

    // Explicit settings win; otherwise dev makes (and keeps) its own.
    if settings.database_url.is_none() {
        settings.database_url = Some(pg.url("paddock"));
    }
    if settings.jwt_hs256_secret.is_none() && settings.jwt_hs256_secret_file.is_none() {
        settings.jwt_hs256_secret = Some(kept_secret(&secrets, "jwt-hs256-secret", || random_base64(48))?);
    }
    if settings.encryption_key.is_none() && settings.encryption_key_file.is_none() {
        settings.encryption_key = Some(kept_secret(&secrets, "encryption-key", Cipher::generate_key)?);
    }
    if settings.ledger_key.is_none() && settings.ledger_key_file.is_none() {
        settings.ledger_key = Some(kept_secret(&secrets, "ledger-key", || random_base64(32))?);
    }
    if settings.usage_signing_key.is_none() && settings.usage_signing_key_file.is_none() {
        settings.usage_signing_key = Some(kept_secret(&secrets, "usage-signing-key.pem", SigningKey::generate_pem)?);
    }
    // The demo classes carry prices, so the FOCUS export works in dev too: it needs a provider name.
    if settings.billing_provider_name.is_none() {
        settings.billing_provider_name = Some("paddock dev".to_owned());
    }
    // `dev` runs on the simulated drivers unless a driver was chosen explicitly.
    if std::env::var_os("PADDOCK_KUBE_DRIVER").is_none() && settings.kube_driver == KubeDriver::None {
        settings.kube_driver = KubeDriver::Simulated;
    }
    if std::env::var_os("PADDOCK_BMC_DRIVER").is_none() && settings.bmc_driver == BmcDriver::None {
        settings.bmc_driver = BmcDriver::Simulated;
    }
    // `dev` serves its agents on the loopback listener over plain http (docs/configuration.md).
    if std::env::var_os("PADDOCK_AGENT_INSECURE_HTTP").is_none() {
        settings.agent_insecure_http = true;
    }
    settings.simulated_defaults();
    settings.validate(crate::validate::Process::Serve)?;

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = runtime.block_on(async {
        let services = server::services(&settings, settings.database_url()?).await?;
        services.store().migrate().await.context("migrating the dev database")?;
        let tenant = seed(&services, settings.bmc_driver == BmcDriver::Simulated).await?;
        print_welcome(&settings, tenant, secret_file.as_deref())?;
        let roles = Roles { api: true, worker: true, migrate: false };
        server::run(&settings, services, roles, Some(listener), server::shutdown_signal()).await
    });
    drop(runtime);
    eprintln!("paddock dev: stopping PostgreSQL");
    pg.stop()?;
    result
}

/// An image URL the simulated BMCs accept (they never fetch it).
/// The simulated machines `dev` enrolls: (name, class).
const SIM_MACHINES: [(&str, &str); 8] = [
    ("node-001", "cpu-standard"),
    ("node-002", "cpu-standard"),
    ("node-003", "cpu-standard"),
    ("node-004", "cpu-standard"),
    ("node-101", "gpu-h100x8"),
    ("node-102", "gpu-h100x8"),
    ("node-103", "gpu-h100x8"),
    ("node-104", "gpu-h100x8"),
];

/// Demo data: three machine classes, a tenant, and (with the simulated BMC) eight simulated
/// machines. Already present is fine (a restart).
async fn seed(services: &Services, simulated: bool) -> anyhow::Result<uuid::Uuid> {
    let actor = Actor::from_claims("paddock-dev".into(), vec![Role::ProviderAdmin.as_str().into()], None)?;
    let ctx = Ctx::internal(actor, "paddock-dev-seed");
    let classes = [
        ("cpu-standard", 64, 512, "", 0, "Dual-socket CPU server", "1.2"),
        ("gpu-h100x8", 112, 2048, "NVIDIA H100 80GB SXM", 8, "HGX H100 8-GPU server", "24"),
        ("gpu-l40sx4", 64, 768, "NVIDIA L40S", 4, "PCIe L40S inference server", "6.5"),
    ];
    for (name, cpu_cores, memory_gib, gpu_model, gpu_count, description, node_hour) in classes {
        let spec = MachineClassCreate {
            name: name.into(),
            cpu_cores,
            memory_gib,
            gpu_model: gpu_model.into(),
            gpu_count,
            description: description.into(),
            price: Some(MachineClassPrice { currency: "USD".into(), node_hour: node_hour.into() }),
            acceptance: None,
        };
        ignore_taken(services.machine_class_create(&ctx, &Body::json(&spec)).await.map(|_| ()))?;
    }
    let spec = TenantCreate {
        name: "acme".into(),
        display_name: "ACME Research".into(),
        labels: [("plan".to_owned(), "demo".to_owned())].into(),
        quotas: Quotas { max_clusters: Some(5), max_nodes: Some(32), max_gpus: Some(128) },
    };
    ignore_taken(services.tenant_create(&ctx, &Body::json(&spec)).await.map(|_| ()))?;
    if simulated {
        for (name, class) in SIM_MACHINES {
            let enroll = json!({
                "name": name, "machine_class": class,
                "bmc": { "url": format!("sim://{name}"), "username": "admin", "password": "simulated" }
            });
            ignore_taken(services.machine_enroll(&ctx, &Body::json(&enroll)).await.map(|_| ()))?;
        }
    }
    let page = paddock_domain::cursor::PageRequest::parse(Some("1000"), None)?;
    let tenants = services.tenant_list(&ctx, page).await?;
    let acme = tenants.items.iter().find(|t| t.spec.name == "acme").context("the demo tenant is missing")?;
    Ok(acme.id.uuid())
}

fn ignore_taken(result: Result<(), Error>) -> anyhow::Result<()> {
    match result {
        Ok(()) | Err(Error::Conflict { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// `text` as one shell word.
fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-=:+@%,".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// The command that mints more tokens, as a shell runs it after `cargo run` (the binary by its
/// path: `paddock` is on no PATH then), with the settings tokens must match.
fn token_command(settings: &Settings, secret_file: Option<&Path>) -> String {
    let mut words = Vec::new();
    match secret_file {
        Some(file) => words.push(shell_word(&format!("PADDOCK_JWT_HS256_SECRET_FILE={}", file.display()))),
        None => words.push("PADDOCK_JWT_HS256_SECRET=<the secret you gave>".to_owned()),
    }
    for (name, value) in
        [("PADDOCK_JWT_ISSUER", &settings.jwt_issuer), ("PADDOCK_JWT_AUDIENCE", &settings.jwt_audience)]
    {
        if value != "paddock" {
            words.push(shell_word(&format!("{name}={value}")));
        }
    }
    let exe = std::env::current_exe().map_or_else(|_| "paddock".to_owned(), |p| p.display().to_string());
    words.push(shell_word(&exe));
    words.push("token".to_owned());
    words.join(" ")
}

fn print_welcome(settings: &Settings, tenant: uuid::Uuid, secret_file: Option<&Path>) -> anyhow::Result<()> {
    let secret = settings.hs256_secret()?.context("dev always has an HS256 secret")?;
    let ttl = i64::try_from(settings.token_max_lifetime).unwrap_or(i64::MAX).min(24 * 3600);
    let admin = crate::mint(&secret, settings, "dev-admin".into(), vec!["provider:admin".into()], None, ttl)?;
    let tenant_admin =
        crate::mint(&secret, settings, "dev-tenant".into(), vec!["tenant:admin".into()], Some(tenant), ttl)?;
    let base = format!("http://{}", settings.listen);
    let enroll = json!({
        "name": "node-201", "machine_class": "gpu-l40sx4",
        "bmc": {"url": "sim://node-201", "username": "admin", "password": "secret"}
    });
    let cluster = json!({
        "name": "hpc", "kind": "slurm", "isolation": "private-nodes",
        "node_pools": [{"name": "gpu", "machine_class": "gpu-h100x8", "count": 2},
                       {"name": "system", "machine_class": "cpu-standard", "count": 1, "role": "system"}]
    });
    let simulated = settings.kube_driver == KubeDriver::Simulated && settings.bmc_driver == BmcDriver::Simulated;
    let note = if simulated {
        "(simulated: eight sim:// machines are enrolled and get wiped in a few seconds)"
    } else {
        "(jobs that need a missing driver wait with driver_not_configured)"
    };
    // A closed stdout (a pipe whose reader went away) is no reason to stop serving.
    use std::io::Write;
    let _ = writeln!(
        std::io::stdout(),
        r#"
paddock dev is running on {base}  (Ctrl-C stops it and its PostgreSQL)
  console    {base}/console/  (sign in with a token below)
  database   {db}
  drivers    kube={kube} bmc={bmc} {note}

The API, a provider admin token (24 h), and a tenant admin token for the demo tenant `acme`
(the README's tour starts from these four lines):
  export B={base}
  export TOKEN={admin}
  export TENANT_TOKEN={tenant_admin}
  export TID={tenant}

Try:
  curl -s {base}/v1/tenants -H "Authorization: Bearer $TOKEN"
  curl -s {base}/v1/machine-classes -H "Authorization: Bearer $TOKEN"
  curl -s -X POST {base}/v1/machines -H "Authorization: Bearer $TOKEN" \
       -H 'Content-Type: application/json' -d '{enroll}'
  curl -s {base}/v1/machines -H "Authorization: Bearer $TOKEN"
Create a Slurm cluster as the tenant and watch it go ready:
  curl -s -X POST {base}/v1/tenants/{tenant}/clusters -H "Authorization: Bearer $TENANT_TOKEN" \
       -H 'Content-Type: application/json' -d '{cluster}'
  curl -s {base}/v1/tenants/{tenant}/clusters -H "Authorization: Bearer $TENANT_TOKEN"
  curl -s {base}/openapi.json | head
More tokens (roles: provider:admin, provider:operator, billing:reader, tenant:admin and
tenant:member, the tenant roles with --tenant):
  {token} --role provider:operator
  {token} --role tenant:member --tenant {tenant}
"#,
        db = settings.database_url.as_deref().unwrap_or_default(),
        kube = crate::config::name(settings.kube_driver),
        bmc = crate::config::name(settings.bmc_driver),
        token = token_command(settings, secret_file),
    );
    Ok(())
}
