//! Running the API and the worker, with graceful shutdown: on SIGTERM or Ctrl-C the process
//! reports not-ready, stops accepting, and finishes the requests in flight.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use paddock_api::metrics::{metrics_router, Exposition, MetricsSource, Sources};
use paddock_api::{ApiConfig, AppState};
use paddock_auth::Verifier;
use paddock_service::Services;
use paddock_store::Store;
use paddock_worker::reconcile::{
    self, Autoscaler, ClusterReconciler, DriftCheck, Drivers, IdentitySync, MachineReconciler, PowerCycle, PowerSync,
    PowerSyncSettings, Resealer,
};
use paddock_worker::{default_worker_id, JobHandler, Worker, WorkerConfig};
use tokio::sync::watch;

use crate::config::{BmcDriver, KubeDriver, Settings};

/// Which parts a process runs.
#[derive(Debug, Clone, Copy)]
pub struct Roles {
    /// Serve the HTTP API.
    pub api: bool,
    /// Run the worker.
    pub worker: bool,
    /// Apply migrations first.
    pub migrate: bool,
}

/// `paddock migrate`: applies the migrations as PADDOCK_MIGRATE_DATABASE_URL's role (else
/// PADDOCK_DATABASE_URL's); with two roles, then grants the runtime role (PADDOCK_DATABASE_URL's
/// user) what it needs: everything but UPDATE, DELETE and TRUNCATE on the custody ledger.
pub async fn migrate(settings: &Settings) -> anyhow::Result<()> {
    let store = Store::connect_lazy(settings.migrate_database_url()?, 2)?;
    store.migrate().await.context("migrating the database")?;
    if settings.migrate_database_url.is_some() {
        let runtime = paddock_store::role_of(settings.database_url()?)?;
        store.grant_runtime(&runtime).await.with_context(|| format!("granting the runtime role {runtime}"))?;
        tracing::info!(role = %runtime, "database migrated; runtime role {runtime} granted");
    } else {
        tracing::info!("database migrated");
    }
    store.pool().close().await;
    Ok(())
}

/// Enqueues the re-seal job for the workers (`paddock reseal`): every sealed value is sealed
/// again under `PADDOCK_ENCRYPTION_KEY`; once the job has succeeded the keys in
/// `PADDOCK_ENCRYPTION_OLD_KEYS` can be retired.
pub async fn reseal(settings: &Settings) -> anyhow::Result<()> {
    let store = Store::connect_lazy(settings.database_url()?, 1)?;
    let mut tx = store.begin().await.context("connecting to the database")?;
    paddock_store::reseal::enqueue(&mut tx).await.context("enqueuing the re-seal job")?;
    tx.commit().await.context("enqueuing the re-seal job")?;
    store.pool().close().await;
    tracing::info!("re-seal job enqueued: a worker seals every secret again under the current key");
    Ok(())
}

/// Builds the services from the settings.
pub async fn services(settings: &Settings, database_url: &str) -> anyhow::Result<Services> {
    let store = Store::connect_lazy_with_timeout(
        database_url,
        settings.database_max_connections,
        settings.statement_timeout(),
    )?;
    let usage = paddock_service::usage::UsageSettings {
        close_grace: chrono::Duration::seconds(i64::from(settings.usage_close_grace)),
        billing_provider_name: settings.billing_provider_name.clone().filter(|name| !name.trim().is_empty()),
        export_max_per_caller: settings.usage_export_max_per_caller as usize,
        export_idle_timeout: std::time::Duration::from_secs(settings.usage_export_idle_timeout),
        export_max_duration: std::time::Duration::from_secs(settings.usage_export_max_duration),
    };
    let mut services = Services::new(store, settings.cipher()?, settings.ledger_key()?)
        .with_agent(settings.agent()?)
        .with_usage_settings(usage)
        .with_webhook_guard(settings.webhook_guard()?)
        .with_identity_range(settings.identity_range()?);
    if let Some(key) = settings.signing_key()? {
        services = services.with_signing_key(key);
    }
    Ok(services)
}

/// Runs the chosen parts until a shutdown signal.
pub async fn serve(settings: &Settings, roles: Roles) -> anyhow::Result<()> {
    let services = services(settings, settings.database_url()?).await?;
    if roles.migrate {
        migrate(settings).await?;
    }
    // After migrating (the check reads the ledger's tables); `paddock dev`, which runs a private
    // one-role database, skips it.
    tokio::spawn(check_ledger_access(services.store().clone()));
    run(settings, services, Roles { migrate: false, ..roles }, None, shutdown_signal()).await
}

/// Binds the API's address ahead of serving (`paddock dev`, so that a taken port stops it
/// before it prints anything).
pub fn bind(listen: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(listen)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Runs the chosen parts over ready services until `shutdown` completes; the API on `listener`
/// when it is bound already (else on PADDOCK_LISTEN).
pub async fn run(
    settings: &Settings,
    services: Services,
    roles: Roles,
    listener: Option<std::net::TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    if roles.migrate {
        migrate(settings).await?;
    }
    // Flipped by the shutdown signal: the API drains while the worker finishes its jobs, both
    // within PADDOCK_SHUTDOWN_GRACE.
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let signal = {
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        })
    };
    // Both roles need the drivers: the worker all of them, the API the one that issues tenant
    // kubeconfigs (`GET .../kubeconfig`).
    let (drivers, agent) = drivers(settings, services.store()).await?;
    let services = match &drivers.kube {
        Some(kube) => services.with_credentials(kube.credentials.clone()),
        None => services,
    };
    let worker = if roles.worker { Some(build_worker(settings, &services, drivers)?) } else { None };
    let deliverer = if roles.worker { Some(build_deliverer(settings, &services)?) } else { None };
    let sources = Sources(match (&worker, &deliverer) {
        (Some(w), Some(d)) => {
            let (jobs, deliveries) = (w.metrics(), d.metrics());
            Arc::new([
                Arc::new(move |out: &mut String| jobs.render(out)) as MetricsSource,
                Arc::new(move |out: &mut String| deliveries.render(out)) as MetricsSource,
            ])
        }
        (Some(w), None) => {
            let jobs = w.metrics();
            Arc::new([Arc::new(move |out: &mut String| jobs.render(out)) as MetricsSource])
        }
        _ => Arc::new([]),
    });
    let worker = worker.map(|worker| {
        if let Some(agent) = agent {
            tokio::spawn(agent.run(stop_rx.clone()));
        }
        if let Some(deliverer) = deliverer {
            let mut stop = stop_rx.clone();
            tokio::spawn(async move {
                deliverer
                    .run(async move {
                        let _ = stop.changed().await;
                    })
                    .await
            });
        }
        let drift_interval = Duration::from_secs(settings.drift_interval);
        tokio::spawn(run_worker(services.clone(), worker, drift_interval, stop_rx.clone()))
    });
    let api = if roles.api {
        let verifier = Verifier::new(settings.verifier()?).await.context("JWT configuration")?;
        let console = paddock_api::console::ConsoleConfig { oidc: settings.console_oidc()? };
        let config = ApiConfig { cors_origins: settings.cors_origins.clone(), console };
        let state = AppState::new(services.clone(), verifier, config).with_limits(settings.limits());
        let state = state.with_agent_routes(settings.agent_listen.is_none());
        Some(state.with_metrics(sources.clone(), settings.metrics_listen.is_none()))
    } else {
        None
    };
    let metrics = match settings.metrics_listen {
        Some(listen) => {
            let exposition = match &api {
                Some(state) => state.exposition(),
                None => Exposition { http: None, services: services.clone(), sources },
            };
            Some(tokio::spawn(
                serve_metrics(listen, settings.header_read_timeout(), exposition, stop_rx.clone()).await?,
            ))
        }
        None => None,
    };
    let result = match api {
        Some(state) => serve_api(settings, state, listener, stop_rx.clone()).await,
        None => {
            let _ = stop_rx.clone().wait_for(|stop| *stop).await;
            Ok(())
        }
    };
    signal.abort();
    let _ = stop_tx.send(true);
    if let Some(worker) = worker {
        let _ = worker.await;
    }
    if let Some(metrics) = metrics {
        let _ = metrics.await;
    }
    result
}

/// Warns, once the database answers, when the role serving requests and running jobs could
/// rewrite the custody ledger: the ledger's MACs still expose an edit, but the two-role split
/// (`PADDOCK_MIGRATE_DATABASE_URL`) is what keeps a compromised process from deleting its tail.
/// Off the request path: a database that is not up yet delays no start.
async fn check_ledger_access(store: Store) {
    match store.ledger_rewrite_access().await {
        Ok((role, Some(how))) => tracing::warn!(
            db.role = %role,
            "the database role {role} that serves requests can rewrite the custody ledger ({how}): run `paddock \
             migrate` with PADDOCK_MIGRATE_DATABASE_URL naming a role that owns the schema, and serve as another \
             role, which may then only read and append the ledger"
        ),
        Ok((role, None)) => {
            tracing::info!(db.role = %role, "the database role {role} may only read and append the custody ledger");
        }
        Err(e) => tracing::warn!(
            error = &e as &dyn std::error::Error,
            "could not check whether the database role can rewrite the custody ledger"
        ),
    }
}

/// The worker, with the handlers of every reconcile job kind, and the settings' lifecycle.
fn build_worker(settings: &Settings, services: &Services, drivers: Drivers) -> anyhow::Result<Worker> {
    let lifecycle = lifecycle(settings);
    let power_sync = PowerSyncSettings {
        interval: Duration::from_secs(settings.power_sync_interval),
        ..PowerSyncSettings::default()
    };
    let config = WorkerConfig {
        concurrency: settings.worker_concurrency,
        tenant_slots: settings.worker_tenant_slots,
        lease: Duration::from_secs(settings.worker_lease),
        shutdown_grace: Duration::from_secs(settings.shutdown_grace),
        ..WorkerConfig::default()
    };
    let clusters = ClusterReconciler::new(services.clone(), drivers.clone(), lifecycle.clone());
    let handlers: Vec<Arc<dyn JobHandler>> = vec![
        Arc::new(MachineReconciler::new(services.clone(), drivers.clone(), lifecycle.clone())),
        Arc::new(PowerCycle::new(PowerSync::new(services.clone(), drivers.clone(), power_sync.clone()))),
        Arc::new(PowerSync::new(services.clone(), drivers.clone(), power_sync)),
        Arc::new(DriftCheck(clusters.clone())),
        Arc::new(Autoscaler(clusters.clone())),
        Arc::new(IdentitySync(clusters.clone())),
        Arc::new(clusters),
        Arc::new(Resealer::new(services.clone())),
    ];
    Worker::new(services.store().clone(), default_worker_id(), handlers, config).context("the worker's settings")
}

/// The webhook deliveries, made by every worker (claims keep two from sending the same try).
fn build_deliverer(settings: &Settings, services: &Services) -> anyhow::Result<paddock_worker::webhook::Deliverer> {
    use paddock_worker::webhook::{Deliverer, DeliveryConfig, SystemLookup};
    let config = DeliveryConfig::new(settings.public_url(), default_worker_id());
    Deliverer::new(
        services.store().clone(),
        services.cipher().clone(),
        services.webhook_guard().clone(),
        Arc::new(SystemLookup),
        config,
    )
    .context("the webhook deliveries")
}

/// The worker: runs the reconcile jobs of the durable queue, and does the housekeeping.
async fn run_worker(services: Services, worker: Worker, drift_interval: Duration, mut stop: watch::Receiver<bool>) {
    let store = services.store().clone();
    // The power sync's one fleet-wide job: merged into the queued one when another worker (or an
    // earlier start) enqueued it already, so this runs one check round now and costs nothing more.
    // A failure is not fatal: the next start enqueues it again.
    let enqueued = async {
        let mut tx = store.begin().await?;
        paddock_store::power::enqueue_fleet_job(&mut tx).await?;
        Ok::<_, paddock_store::StoreError>(tx.commit().await?)
    }
    .await;
    if let Err(e) = enqueued {
        tracing::warn!(error = &e as &dyn std::error::Error, "the power sync's job could not be enqueued");
    }
    // The drift checks of ready clusters that have none (ready before drift checks existed, or
    // while they were off), spread over one interval. A failure is not fatal: the next start
    // arms them.
    if !drift_interval.is_zero() {
        let armed = async {
            let mut conn = store.conn().await?;
            paddock_store::drift::arm_unarmed(&mut conn, drift_interval).await
        }
        .await;
        match armed {
            Ok(0) => {}
            Ok(n) => tracing::info!(clusters = n, "armed the drift checks of {n} ready clusters"),
            Err(e) => tracing::warn!(error = &e as &dyn std::error::Error, "the drift checks could not be armed"),
        }
    }
    // The demand sweep of elastic pools: merged into the queued one when another worker (or an
    // earlier start) enqueued it already. A failure is not fatal: a cluster's demand check and the
    // next start enqueue it again.
    let enqueued = async {
        let mut tx = store.begin().await?;
        paddock_store::autoscale::enqueue_sweep(&mut tx, Duration::ZERO).await?;
        Ok::<_, paddock_store::StoreError>(tx.commit().await?)
    }
    .await;
    if let Err(e) = enqueued {
        tracing::warn!(error = &e as &dyn std::error::Error, "the demand sweep could not be enqueued");
    }
    tracing::info!(worker.id = worker.id(), "worker {} started", worker.id());
    let mut jobs_stop = stop.clone();
    let jobs = worker.run(async move {
        let _ = jobs_stop.changed().await;
    });
    let housekeeping = async {
        let mut tick = tokio::time::interval(Duration::from_secs(600));
        loop {
            tokio::select! {
                _ = tick.tick() => housekeeping(&services).await,
                _ = stop.changed() => break,
            }
        }
    };
    tokio::join!(jobs, housekeeping);
    tracing::info!("worker stopped");
}

/// Serves the API (and the agents' listener, PADDOCK_AGENT_LISTEN) until `stop` turns true, then
/// drains the requests in flight for up to PADDOCK_SHUTDOWN_GRACE (those still running then are
/// dropped with their connections).
async fn serve_api(
    settings: &Settings,
    state: AppState,
    bound: Option<std::net::TcpListener>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let listener = match bound {
        Some(listener) => tokio::net::TcpListener::from_std(listener),
        None => tokio::net::TcpListener::bind(settings.listen).await,
    }
    .with_context(|| format!("listening on {}", settings.listen))?;
    tracing::info!(listen = %settings.listen, "API listening on http://{}", settings.listen);
    let agents = match settings.agent_listen {
        Some(listen) => Some(serve_agents(listen, settings.header_read_timeout(), &state, stop.clone()).await?),
        None => None,
    };
    let draining = state.clone();
    let app = paddock_api::router(state);
    let mut deadline = stop.clone();
    let served = crate::http::serve(listener, app, settings.header_read_timeout(), async move {
        let _ = stop.wait_for(|stop| *stop).await;
        draining.start_draining();
        tracing::info!("shutting down: finishing requests in flight");
    });
    let served = async move {
        match agents {
            Some(agents) => {
                tokio::join!(served, agents);
            }
            None => served.await,
        }
    };
    let grace = Duration::from_secs(settings.shutdown_grace);
    tokio::select! {
        () = served => Ok(()),
        _ = async {
            let _ = deadline.wait_for(|stop| *stop).await;
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!("shutdown grace period ({grace:?}) over: dropping the requests still in flight");
            Ok(())
        }
    }
}

/// Binds the agents' listener (`PADDOCK_AGENT_LISTEN`) and returns the future serving their routes
/// alone there until `stop` turns true.
async fn serve_agents(
    listen: SocketAddr,
    header_read_timeout: Duration,
    state: &AppState,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<impl std::future::Future<Output = ()>> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen} (PADDOCK_AGENT_LISTEN)"))?;
    tracing::info!(listen = %listen, "agent endpoints on http://{listen}/v1/agent/ (and only there)");
    let app = paddock_api::agent_router(state.clone());
    Ok(async move {
        crate::http::serve(listener, app, header_read_timeout, async move {
            let _ = stop.wait_for(|stop| *stop).await;
        })
        .await;
    })
}

/// Binds the metrics listener (`PADDOCK_METRICS_LISTEN`) and returns the future serving it until
/// `stop` turns true.
async fn serve_metrics(
    listen: SocketAddr,
    header_read_timeout: Duration,
    exposition: Exposition,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<impl std::future::Future<Output = ()>> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen} (PADDOCK_METRICS_LISTEN)"))?;
    tracing::info!(listen = %listen, "metrics on http://{listen}/metrics");
    Ok(async move {
        crate::http::serve(listener, metrics_router(exposition), header_read_timeout, async move {
            let _ = stop.wait_for(|stop| *stop).await;
        })
        .await;
    })
}

/// The drivers the settings choose, and the simulated machines' agent when the BMC is simulated.
async fn drivers(settings: &Settings, store: &Store) -> anyhow::Result<(Drivers, Option<paddock_sim::SimAgent>)> {
    let simulated = sim_world(settings, store).await?;
    let mut drivers = Drivers::default();
    let mut agent = None;
    match settings.kube_driver {
        KubeDriver::Simulated => drivers.kube = simulated.as_ref().map(paddock_sim::SimWorld::kube),
        KubeDriver::None => {}
        KubeDriver::Kubernetes => drivers.kube = Some(kubernetes(settings).await?),
    }
    match settings.bmc_driver {
        BmcDriver::Simulated => {
            if let Some(world) = &simulated {
                drivers.bmc = Some(world.bmc());
                agent = Some(world.agent(reqwest::Client::new()));
            }
        }
        BmcDriver::None => {}
        BmcDriver::Redfish => {
            // One limiter per process: at most one call in flight per machine, a few per BMC host.
            let limiter = paddock_redfish::BmcLimiter::new(REDFISH_CALLS_PER_HOST);
            drivers.bmc = Some(Arc::new(paddock_redfish::RedfishBmc::new(limiter)));
        }
    }
    Ok((drivers, agent))
}

/// The simulated world when a simulated driver is chosen, its schema migrated first (by every
/// process that runs one, whatever its roles: it is no part of paddock's own schema).
async fn sim_world(settings: &Settings, store: &Store) -> anyhow::Result<Option<paddock_sim::SimWorld>> {
    if settings.kube_driver != KubeDriver::Simulated && settings.bmc_driver != BmcDriver::Simulated {
        return Ok(None);
    }
    paddock_sim::migrate(store)
        .await
        .context("PADDOCK_KUBE_DRIVER or PADDOCK_BMC_DRIVER=simulated: preparing the simulated world")?;
    Ok(Some(paddock_sim::SimWorld::new(store.clone(), sim_config(settings.sim_latency_scale))))
}

/// The real cluster-side drivers: the platform cluster from `PADDOCK_KUBECONFIG` (or in-cluster),
/// Kamaji control planes, and inside tenant clusters their nodes, the base stack from
/// `PADDOCK_STACKS_DIR`, Slurm through Slinky and the tenant's credentials.
async fn kubernetes(settings: &Settings) -> anyhow::Result<paddock_domain::driver::KubeDrivers> {
    let platform = paddock_kube::KubePlatform::connect(settings.kubeconfig.as_deref())
        .await
        .context("PADDOCK_KUBE_DRIVER=kubernetes: connecting to the platform cluster (PADDOCK_KUBECONFIG)")?
        .with_namespace_role(settings.kube_namespace_role.clone());
    let stacks_dir = settings.stacks_dir.clone().context("PADDOCK_KUBE_DRIVER=kubernetes needs PADDOCK_STACKS_DIR")?;
    let stack = paddock_kube::KubeTenantStack::new(stacks_dir);
    // A stack whose files are missing or do not match their pinned digests is not fatal here:
    // each cluster on it shows it in its StackReady condition, and fixing the directory heals them.
    for definition in stack.definitions() {
        if let Err(e) = stack.verify(&definition.version) {
            tracing::warn!(
                stack.version = %definition.version,
                error = %e.message_chain(),
                "a tenant base stack in PADDOCK_STACKS_DIR cannot be applied as it is"
            );
        }
    }
    // Slurm runs the images of each cluster's own stack definition.
    let catalog =
        paddock_kube::slurm::SlurmCatalog::of(stack.definitions()).with_registry(settings.slurm_image_registry.clone());
    let slurm = paddock_kube::slurm::SlinkySettings { catalog, ..paddock_kube::slurm::SlinkySettings::default() };
    // Ray likewise runs the images of the cluster's stack's Ray catalogue.
    let ray = paddock_kube::ray::RaySettings {
        catalog: paddock_kube::ray::RayCatalog::of(stack.definitions()),
        ..paddock_kube::ray::RaySettings::default()
    };
    let control_plane = paddock_kube::KamajiBackend::new(platform.client().clone())
        .with_namespace_role(settings.kube_namespace_role.clone());
    Ok(paddock_domain::driver::KubeDrivers {
        platform: Arc::new(platform),
        control_plane: Arc::new(control_plane),
        nodes: Arc::new(paddock_kube::KubeTenantNodes::new()),
        stack: Arc::new(stack),
        slurm: Arc::new(paddock_kube::SlinkyDriver::with_service_proxy(slurm)),
        ray: Arc::new(paddock_kube::KubeRayDriver::with_pod_proxy(ray)),
        credentials: Arc::new(paddock_kube::KubeTenantCredentials::new()),
    })
}

/// Redfish calls in flight at once per BMC host (a chassis manager may front many machines).
const REDFISH_CALLS_PER_HOST: usize = 4;

/// The simulated drivers' latencies, scaled (`PADDOCK_SIM_LATENCY_SCALE`).
fn sim_config(scale: f64) -> paddock_sim::SimConfig {
    let base = paddock_sim::SimConfig::default();
    let f = |d: Duration| d.mul_f64(scale);
    paddock_sim::SimConfig {
        bmc_latency: f(base.bmc_latency),
        boot_latency: f(base.boot_latency),
        node_ready_latency: f(base.node_ready_latency),
        control_plane_latency: f(base.control_plane_latency),
        stack_latency: f(base.stack_latency),
        slurm_latency: f(base.slurm_latency),
        delete_latency: f(base.delete_latency),
        // Polling stays reasonable whatever the scale.
        agent_poll: f(base.agent_poll).max(Duration::from_millis(20)),
    }
}

/// The lifecycle settings from the configuration.
fn lifecycle(settings: &Settings) -> reconcile::Settings {
    reconcile::Settings {
        wipe_image_url: settings.wipe_image_url.as_ref().map(ToString::to_string),
        os_image_url: settings.os_image_url.as_ref().map(ToString::to_string),
        agent_token_ttl: Duration::from_secs(settings.agent_token_ttl),
        join_token_ttl: Duration::from_secs(settings.join_token_ttl),
        release_timeout: Duration::from_secs(settings.release_timeout),
        allocation_head_timeout: Duration::from_secs(settings.allocation_head_timeout),
        drift_interval: Duration::from_secs(settings.drift_interval),
        node_not_ready_grace: Duration::from_secs(settings.node_not_ready_grace),
        autoscale_interval: Duration::from_secs(settings.autoscale_interval),
        // The simulated world answers at once; polling it often costs little.
        poll: if settings.kube_driver == KubeDriver::Simulated {
            Duration::from_secs(1).mul_f64(settings.sim_latency_scale.clamp(0.05, 5.0))
        } else {
            reconcile::Settings::default().poll
        },
        ..reconcile::Settings::default()
    }
}

/// Forgets expired idempotency keys and long-finished jobs.
async fn housekeeping(services: &Services) {
    match services.purge_expired_idempotency_keys().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(count = n, "forgot {n} expired idempotency keys"),
        Err(e) => tracing::warn!(error = &e as &dyn std::error::Error, "purging idempotency keys failed"),
    }
    match services.purge_finished_jobs().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(count = n, "deleted {n} jobs finished over a week ago"),
        Err(e) => tracing::warn!(error = &e as &dyn std::error::Error, "purging finished jobs failed"),
    }
}

/// Completes on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
