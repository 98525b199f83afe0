//! Simulated drivers: a fleet of BMCs ([`SimBmc`]), the machines' agents ([`SimAgent`]), the
//! platform cluster, the tenant control planes, the tenant clusters' nodes, base stack and Slurm
//! ([`SimKube`]), all in-process and deterministic, with configurable latencies ([`SimConfig`]) and
//! fault injection ([`MachineFault`], [`ClusterFault`]). The dev default (`paddock dev`), demos and
//! benchmarks run on them.
//!
//! The simulated world lives in PostgreSQL, so every worker process, and a restarted one, sees one
//! consistent world, but in a schema of its own ([`SCHEMA`], `paddock_sim`) with migrations of its
//! own ([`MIGRATOR`], applied by [`migrate`] only where a simulated driver is chosen): a production
//! database holds nothing of it. Every write is an idempotent upsert or a guarded update, so a
//! repeated call converges; times come from the database's clock.
//!
//! What is simulated, and how:
//! - A machine (`sim://<name>`) is created on first contact: two drives, powered off, two virtual
//!   media devices, its system UUID the UUID v5 of its BMC URL ([`system_uuid`]). Destructive
//!   calls check `BmcAccess::system_uuid` like the real driver. Its inserted media are kept the
//!   way a BMC keeps them, the seed URL (which carries the run's seed token) included.
//! - The agent plays a booted wipe image or OS installer against paddock's *real* agent endpoints:
//!   it reads `paddock/agent.json` from the seed image the BMC's URL serves, then calls
//!   `{agent_url}/v1/agent/config` and `/report` with the agent token as its bearer.
//! - A provisioned machine becomes a Node of the cluster its join configuration names once it
//!   restarts from disk, and Ready `node_ready_latency` later. A machine behind a real BMC (the
//!   Redfish driver with the simulated cluster drivers: the VM testbed) has no simulated agent:
//!   its Node registers once paddock holds the verified report of its provisioning boot and has
//!   restarted it from disk, as paddock's records show (the join is simulated, the boot is not).
//!
//! This proves nothing about the real drivers (`paddock_redfish`, `paddock_kube`): it only lets
//! the rest of paddock run end to end without hardware or Kubernetes.

mod agent;
mod bmc;
mod kube;

use std::sync::Arc;
use std::time::Duration;

use paddock_domain::bmc::{BmcDriver, InventoryDrive};
use paddock_domain::driver::KubeDrivers;
use paddock_store::Store;
use paddock_types::ClusterId;
use serde::Serialize;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

pub use agent::SimAgent;
pub use bmc::{SimBmc, SYSTEM_ID};
pub use kube::{endpoint, namespace_name, SimKube};

/// The schema the simulated world lives in; its tables are always named with it.
pub const SCHEMA: &str = "paddock_sim";

/// The simulated world's migrations (`crates/paddock-sim/migrations`), apart from paddock's own.
/// Run them with [`migrate`], which applies them inside [`SCHEMA`].
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// Creates [`SCHEMA`] if needed and applies the pending [`MIGRATOR`] migrations there, keeping their
/// bookkeeping (`_sqlx_migrations`, one per `search_path`) in that schema too, apart from paddock's
/// own. Run it wherever a simulated driver is chosen, before the world is used. Safe when several
/// processes start at once, and a no-op when everything is applied.
pub async fn migrate(store: &Store) -> Result<(), SimError> {
    // A pool of its own whose sessions see only the simulated world's schema, so the migrator's
    // bookkeeping lands there; the store's sessions keep theirs.
    let options = store.pool().connect_options().as_ref().clone().options([("search_path", SCHEMA)]);
    let pool = PgPoolOptions::new().max_connections(1).connect_with(options).await?;
    let migrated = migrate_on(&pool).await;
    pool.close().await;
    migrated
}

/// Serializes the creation of [`SCHEMA`] (`create schema if not exists` racing another one fails
/// with a unique violation). The migrator takes its own lock for the migrations.
const SCHEMA_LOCK: i64 = 0x7061_6464_6f63_6b53; // "paddockS"

async fn migrate_on(pool: &PgPool) -> Result<(), SimError> {
    let mut tx = pool.begin().await?;
    sqlx::query("select pg_advisory_xact_lock($1)").bind(SCHEMA_LOCK).execute(&mut *tx).await?;
    sqlx::query(&format!("create schema if not exists {SCHEMA}")).execute(&mut *tx).await?;
    tx.commit().await?;
    MIGRATOR.run(pool).await.map_err(SimError::Migrate)
}

/// Latencies of the simulated world. Every one counts from the call that starts the change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Added to every BMC call (and what a `bmc_timeout` machine waits before failing).
    pub bmc_latency: Duration,
    /// From a boot from media until the agent reports.
    pub boot_latency: Duration,
    /// From a restart from disk until the machine's Node is Ready.
    pub node_ready_latency: Duration,
    /// From the first `ensure_control_plane` until it is ready.
    pub control_plane_latency: Duration,
    /// From the first `ensure_stack` until it is ready.
    pub stack_latency: Duration,
    /// From the moment every pool with a count has a node until Slurm is ready.
    pub slurm_latency: Duration,
    /// From the first removal call until the object is gone.
    pub delete_latency: Duration,
    /// How often the agent looks for machines with a report due.
    pub agent_poll: Duration,
}

impl Default for SimConfig {
    /// Small, dev-friendly values: a demo cluster comes up in a few seconds.
    fn default() -> Self {
        Self {
            bmc_latency: Duration::from_millis(50),
            boot_latency: Duration::from_secs(2),
            node_ready_latency: Duration::from_secs(1),
            control_plane_latency: Duration::from_secs(1),
            stack_latency: Duration::from_millis(500),
            slurm_latency: Duration::from_secs(1),
            delete_latency: Duration::from_millis(500),
            agent_poll: Duration::from_millis(200),
        }
    }
}

impl SimConfig {
    /// No latency anywhere (tests); the agent still polls every 20 ms.
    pub fn zero() -> Self {
        Self {
            bmc_latency: Duration::ZERO,
            boot_latency: Duration::ZERO,
            node_ready_latency: Duration::ZERO,
            control_plane_latency: Duration::ZERO,
            stack_latency: Duration::ZERO,
            slurm_latency: Duration::ZERO,
            delete_latency: Duration::ZERO,
            agent_poll: Duration::from_millis(20),
        }
    }
}

/// A fault of one simulated machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MachineFault {
    /// Every BMC call fails (Transient, `bmc_timeout`) after the configured latency.
    BmcTimeout,
    /// Every BMC call fails (AuthFailed, `bmc_auth_failed`).
    AuthFails,
    /// The BMC has one virtual media device: a boot from media is a CapabilityGap.
    SingleVirtualMedia,
    /// The wipe agent reports its first listed drive as failed.
    WipeFails,
    /// The agent never reports.
    NeverReports,
    /// A provisioned machine registers its Node but never becomes Ready.
    NeverJoins,
    /// The BMC rates the system `Critical` (Redfish `Status.HealthRollup`); without it, `OK`.
    HealthCritical,
    /// The acceptance image reports its `memory` check failed.
    AcceptanceFails,
    /// The acceptance image never reports (the wipe image still does).
    AcceptanceNeverReports,
}

impl MachineFault {
    /// Every machine fault.
    pub const ALL: [Self; 9] = [
        Self::BmcTimeout,
        Self::AuthFails,
        Self::SingleVirtualMedia,
        Self::WipeFails,
        Self::NeverReports,
        Self::NeverJoins,
        Self::HealthCritical,
        Self::AcceptanceFails,
        Self::AcceptanceNeverReports,
    ];

    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BmcTimeout => "bmc_timeout",
            Self::AuthFails => "auth_fails",
            Self::SingleVirtualMedia => "single_virtual_media",
            Self::WipeFails => "wipe_fails",
            Self::NeverReports => "never_reports",
            Self::NeverJoins => "never_joins",
            Self::HealthCritical => "health_critical",
            Self::AcceptanceFails => "acceptance_fails",
            Self::AcceptanceNeverReports => "acceptance_never_reports",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.as_str() == s)
    }
}

/// A fault of one simulated tenant cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClusterFault {
    /// The tenant control plane never becomes ready.
    ControlPlaneNeverReady,
    /// Every call into the tenant cluster (nodes, stack, Slurm) fails (Transient,
    /// `tenant_unreachable`).
    TenantUnreachable,
}

impl ClusterFault {
    /// Every cluster fault.
    pub const ALL: [Self; 2] = [Self::ControlPlaneNeverReady, Self::TenantUnreachable];

    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ControlPlaneNeverReady => "control_plane_never_ready",
            Self::TenantUnreachable => "tenant_unreachable",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.as_str() == s)
    }
}

/// A failure of the simulation's own bookkeeping (its database), or a bad argument.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The database failed.
    #[error("the simulated world's database failed")]
    Database(#[source] sqlx::Error),
    /// Its migrations failed.
    #[error("migrating the simulated world's schema (paddock_sim) failed")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    /// The store could not hand out a connection.
    #[error("the simulated world's database is unavailable")]
    Store(#[source] paddock_store::StoreError),
    /// Not a `sim://<name>` URL or name.
    #[error("{0:?} is not a simulated machine (expected sim://<name>)")]
    NotSimulated(String),
}

impl From<sqlx::Error> for SimError {
    fn from(e: sqlx::Error) -> Self {
        Self::Database(e)
    }
}

impl From<paddock_store::StoreError> for SimError {
    fn from(e: paddock_store::StoreError) -> Self {
        Self::Store(e)
    }
}

/// A simulated machine as the world holds it (for tests and demos).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SimMachine {
    /// `sim://<name>`.
    pub bmc_url: String,
    /// The name.
    pub name: String,
    /// Its system UUID ([`system_uuid`] of the name).
    pub system_uuid: String,
    /// Powered on.
    pub power_on: bool,
    /// The one-time boot device (`cd`), `None` = disk.
    pub boot_override: Option<String>,
    /// The inserted image.
    pub image_url: Option<String>,
    /// Whether a seed is inserted (its URL holds a token, so it is not copied here).
    pub seed_inserted: bool,
    /// Boots from media so far.
    pub boot_seq: i64,
    /// The last boot the agent reported or gave up on.
    pub reported_seq: i64,
    /// Whether it was restarted from disk since its last boot from media.
    pub booted_from_disk: bool,
    /// Its faults.
    pub faults: Vec<MachineFault>,
}

/// A simulated tenant cluster Node (for tests and demos).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SimNode {
    /// The cluster.
    pub cluster_id: ClusterId,
    /// The Node name.
    pub node_name: String,
    /// The machine's system UUID.
    pub system_uuid: String,
    /// Whether the Node object exists (the machine restarted from disk).
    pub joined: bool,
    /// Whether it is Ready.
    pub ready: bool,
    /// Its labels.
    pub labels: serde_json::Value,
    /// Its taints.
    pub taints: serde_json::Value,
}

/// The demand knob of one simulated pool ([`SimWorld::set_demand`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SimDemand {
    /// Jobs pending in the pool's partitions (unschedulable pods, for a `kubernetes` cluster).
    pub pending_jobs: u32,
    /// The nodes they ask for.
    pub pending_nodes: u32,
    /// The pool's nodes running something (at most the nodes it has); the others are idle.
    pub busy_nodes: u32,
    /// The nodes the widest of the pending jobs asks for, of `pending_nodes` (a `slurm` job of
    /// several nodes, listed by its id `1`); 0 or 1: none is singled out.
    pub widest_job_nodes: u32,
}

/// [`SimWorld::set_demand`] on a connection of the world's database (`paddock sim-demand`).
pub async fn set_demand_on(
    conn: &mut sqlx::PgConnection,
    cluster: ClusterId,
    pool: &str,
    demand: SimDemand,
) -> Result<(), SimError> {
    let int = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
    sqlx::query(
        "insert into paddock_sim.demand (cluster_id, pool, pending_jobs, pending_nodes, busy_nodes, widest_job_nodes)
         values ($1, $2, $3, $4, $5, $6)
         on conflict (cluster_id, pool) do update set pending_jobs = excluded.pending_jobs,
           pending_nodes = excluded.pending_nodes, busy_nodes = excluded.busy_nodes,
           widest_job_nodes = excluded.widest_job_nodes, updated_at = now()",
    )
    .bind(cluster.uuid())
    .bind(pool)
    .bind(int(demand.pending_jobs))
    .bind(int(demand.pending_nodes))
    .bind(int(demand.busy_nodes))
    .bind(int(demand.widest_job_nodes))
    .execute(conn)
    .await?;
    Ok(())
}

/// The prefix of simulated BMC URLs.
pub const SIM_SCHEME: &str = "sim://";

/// The name in a `sim://<name>` URL (a trailing `/` is ignored); `None` for anything else.
pub fn machine_name(bmc_url: &str) -> Option<&str> {
    let name = bmc_url.strip_prefix(SIM_SCHEME)?.trim_end_matches('/');
    let valid = !name.is_empty() && !name.contains(['/', '?', '#', '@', ' ']);
    valid.then_some(name)
}

/// The system UUID of the simulated machine `name`: the UUID v5 of `sim://<name>` in the URL
/// namespace, so it is the same in every process, database and run.
pub fn system_uuid(name: &str) -> String {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, format!("{SIM_SCHEME}{name}").as_bytes()).to_string()
}

/// A duration as microseconds for SQL (`$n * interval '1 microsecond'`), saturating.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

pub(crate) struct Inner {
    pub(crate) store: Store,
    pub(crate) config: SimConfig,
    /// Boots this process's BMCs made: the agent wakes for them instead of polling an idle world.
    pub(crate) boots: Boots,
}

/// What the simulated BMCs of one process tell its agents: a boot was made, and when the first
/// one not reported yet comes due (its `booted_at` plus the boot latency).
#[derive(Default)]
pub(crate) struct Boots {
    made: tokio::sync::Notify,
    next_due: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Boots {
    /// A boot was just made: it comes due after `latency`.
    pub(crate) fn made(&self, latency: Duration) {
        let due = std::time::Instant::now() + latency;
        let mut next = self.next_due.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *next = Some(next.map_or(due, |at| at.min(due)));
        drop(next);
        self.made.notify_one();
    }

    /// How long an agent that found nothing to do may wait: until the next boot it knows of
    /// comes due, at most `idle`; a boot that came due is forgotten once waited for (the pass
    /// after it claims it).
    pub(crate) fn idle_wait(&self, poll: Duration, idle: Duration) -> Duration {
        let mut next = self.next_due.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = std::time::Instant::now();
        match *next {
            Some(at) if at > now => (at - now).min(idle),
            Some(_) => {
                *next = None;
                poll
            }
            None => idle,
        }
    }

    /// Until a boot is made (or one was made since the last call).
    pub(crate) async fn wait(&self) {
        self.made.notified().await;
    }
}

/// The simulated world: hands out the drivers and the agent, and lets tests inject faults.
#[derive(Clone)]
pub struct SimWorld {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SimWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimWorld").field("config", &self.inner.config).finish_non_exhaustive()
    }
}

impl SimWorld {
    /// The world stored in `store`'s database, which [`migrate`] has prepared.
    pub fn new(store: Store, config: SimConfig) -> Self {
        Self { inner: Arc::new(Inner { store, config, boots: Boots::default() }) }
    }

    /// Its latencies.
    pub fn config(&self) -> &SimConfig {
        &self.inner.config
    }

    /// The simulated BMC driver (`sim://<name>` URLs).
    pub fn bmc(&self) -> Arc<dyn BmcDriver> {
        Arc::new(self.sim_bmc())
    }

    /// The simulated BMC driver as its concrete type.
    pub fn sim_bmc(&self) -> SimBmc {
        SimBmc { inner: self.inner.clone() }
    }

    /// The simulated cluster-side drivers, all backed by one [`SimKube`].
    pub fn kube(&self) -> KubeDrivers {
        let kube = Arc::new(self.sim_kube());
        KubeDrivers {
            platform: kube.clone(),
            control_plane: kube.clone(),
            nodes: kube.clone(),
            stack: kube.clone(),
            slurm: kube.clone(),
            ray: kube.clone(),
            credentials: kube,
        }
    }

    /// The simulated cluster-side drivers as their concrete type.
    pub fn sim_kube(&self) -> SimKube {
        SimKube { inner: self.inner.clone() }
    }

    /// The simulated agents of every machine, reaching paddock's agent endpoints with `http`.
    /// Run it next to the drivers: `tokio::spawn(world.agent(http).run(shutdown))`.
    pub fn agent(&self, http: reqwest::Client) -> SimAgent {
        SimAgent { inner: self.inner.clone(), http }
    }

    /// Turns a fault of the machine `name` (`sim://<name>`) on or off; creates the machine's
    /// record if it was never contacted. Idempotent.
    pub async fn set_machine_fault(&self, name: &str, fault: MachineFault, on: bool) -> Result<(), SimError> {
        let url = format!("{SIM_SCHEME}{name}");
        machine_name(&url).ok_or_else(|| SimError::NotSimulated(name.to_owned()))?;
        let mut conn = self.inner.store.conn().await?;
        bmc::ensure_machine(&mut conn, &url).await?;
        sqlx::query(
            "update paddock_sim.machines set faults = case when $3
                 then array(select distinct f from unnest(array_append(faults, $2)) as f order by f)
                 else array_remove(faults, $2) end,
               updated_at = now()
             where bmc_url = $1",
        )
        .bind(&url)
        .bind(fault.as_str())
        .bind(on)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// Sets what inspection reports as the machine's CPU cores and memory (`None` = not
    /// reported); creates the machine's record if it was never contacted.
    pub async fn set_machine_hardware(
        &self,
        name: &str,
        cpu_cores: Option<u32>,
        memory_gib: Option<u32>,
    ) -> Result<(), SimError> {
        let url = format!("{SIM_SCHEME}{name}");
        machine_name(&url).ok_or_else(|| SimError::NotSimulated(name.to_owned()))?;
        let mut conn = self.inner.store.conn().await?;
        bmc::ensure_machine(&mut conn, &url).await?;
        sqlx::query(
            "update paddock_sim.machines set cpu_cores = $2, memory_gib = $3, updated_at = now() where bmc_url = $1",
        )
        .bind(&url)
        .bind(cpu_cores.map(i64::from))
        .bind(memory_gib.map(i64::from))
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// Sets the drives inspection reports for the machine (instead of its two default drives);
    /// creates the machine's record if it was never contacted. For tests whose machine is real
    /// block devices behind a simulated BMC.
    pub async fn set_machine_drives(&self, name: &str, drives: &[InventoryDrive]) -> Result<(), SimError> {
        let url = format!("{SIM_SCHEME}{name}");
        machine_name(&url).ok_or_else(|| SimError::NotSimulated(name.to_owned()))?;
        let mut conn = self.inner.store.conn().await?;
        bmc::ensure_machine(&mut conn, &url).await?;
        sqlx::query("update paddock_sim.machines set drives = $2, updated_at = now() where bmc_url = $1")
            .bind(&url)
            .bind(sqlx::types::Json(drives))
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// Turns a fault of the tenant cluster `cluster` on or off. Idempotent.
    pub async fn set_cluster_fault(&self, cluster: ClusterId, fault: ClusterFault, on: bool) -> Result<(), SimError> {
        let mut conn = self.inner.store.conn().await?;
        sqlx::query("insert into paddock_sim.clusters (cluster_id) values ($1) on conflict (cluster_id) do nothing")
            .bind(cluster.uuid())
            .execute(&mut *conn)
            .await?;
        sqlx::query(
            "update paddock_sim.clusters set faults = case when $3
                 then array(select distinct f from unnest(array_append(faults, $2)) as f order by f)
                 else array_remove(faults, $2) end,
               updated_at = now()
             where cluster_id = $1",
        )
        .bind(cluster.uuid())
        .bind(fault.as_str())
        .bind(on)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// Sets the demand of the pool named `pool` of the tenant cluster `cluster`: what its
    /// slurmrestd (or, for a `kubernetes` cluster, its scheduler) reports from now on. Idempotent.
    pub async fn set_demand(&self, cluster: ClusterId, pool: &str, demand: SimDemand) -> Result<(), SimError> {
        let mut conn = self.inner.store.conn().await?;
        set_demand_on(&mut conn, cluster, pool, demand).await
    }

    /// Drains the simulated Slurm node on the Node `node_name` of the tenant cluster `cluster`
    /// with `reason`, or resumes it (`None`), as a tenant's admin would with `scontrol update
    /// nodename=... state=drain reason="..."` (or `state=resume`): what its slurmrestd reports
    /// from now on. False when the cluster has no such Node.
    pub async fn set_slurm_drain(
        &self,
        cluster: ClusterId,
        node_name: &str,
        reason: Option<&str>,
    ) -> Result<bool, SimError> {
        let sql = "update paddock_sim.nodes set slurm_drain_reason = $3 where cluster_id = $1 and node_name = $2";
        self.set_slurm_node(sql, cluster, node_name, reason).await
    }

    /// Marks the simulated Slurm node on the Node `node_name` of the tenant cluster `cluster`
    /// down with Slurm's `reason` (as slurmctld does when a node's slurmd registers after an
    /// unexpected reboot, `Node unexpectedly rebooted`), or up again (`None`, as a tenant's
    /// `scontrol update nodename=... state=resume`). False when the cluster has no such Node.
    pub async fn set_slurm_down(
        &self,
        cluster: ClusterId,
        node_name: &str,
        reason: Option<&str>,
    ) -> Result<bool, SimError> {
        let sql = "update paddock_sim.nodes set slurm_down_reason = $3 where cluster_id = $1 and node_name = $2";
        self.set_slurm_node(sql, cluster, node_name, reason).await
    }

    /// Runs `sql`, an update of one Slurm node's column to `$3`: whether the node was found.
    async fn set_slurm_node(
        &self,
        sql: &'static str,
        cluster: ClusterId,
        node_name: &str,
        reason: Option<&str>,
    ) -> Result<bool, SimError> {
        let mut conn = self.inner.store.conn().await?;
        let done = sqlx::query(sql).bind(cluster.uuid()).bind(node_name).bind(reason).execute(&mut *conn).await?;
        Ok(done.rows_affected() == 1)
    }

    /// The simulated Slurm accounting of cluster `cluster` (empty before its first sync).
    pub async fn slurmdb(&self, cluster: ClusterId) -> Result<paddock_domain::slurm_identity::Slurmdb, SimError> {
        let mut conn = self.inner.store.conn().await?;
        let state: Option<serde_json::Value> =
            sqlx::query_scalar("select state from paddock_sim.slurmdb where cluster_id = $1")
                .bind(cluster.uuid())
                .fetch_optional(&mut *conn)
                .await?;
        Ok(state.and_then(|s| serde_json::from_value(s).ok()).unwrap_or_default())
    }

    /// Replaces the simulated Slurm accounting of cluster `cluster`, as a tenant's admin with
    /// `sacctmgr` would change it behind paddock's back.
    pub async fn set_slurmdb(
        &self,
        cluster: ClusterId,
        db: &paddock_domain::slurm_identity::Slurmdb,
    ) -> Result<(), SimError> {
        let mut conn = self.inner.store.conn().await?;
        sqlx::query(
            "insert into paddock_sim.slurmdb (cluster_id, state) values ($1, $2) \
             on conflict (cluster_id) do update set state = excluded.state, updated_at = now()",
        )
        .bind(cluster.uuid())
        .bind(sqlx::types::Json(db))
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// The simulated machine `name`, if it was ever contacted.
    pub async fn machine(&self, name: &str) -> Result<Option<SimMachine>, SimError> {
        let mut conn = self.inner.store.conn().await?;
        bmc::machine_get(&mut conn, &format!("{SIM_SCHEME}{name}")).await
    }

    /// The simulated Nodes of the tenant cluster `cluster`, by name.
    pub async fn nodes(&self, cluster: ClusterId) -> Result<Vec<SimNode>, SimError> {
        let mut conn = self.inner.store.conn().await?;
        kube::nodes_list(&mut conn, cluster).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_sim_urls_only() {
        assert_eq!(machine_name("sim://node-1"), Some("node-1"));
        assert_eq!(machine_name("sim://node-1/"), Some("node-1"));
        assert_eq!(machine_name("sim://"), None);
        assert_eq!(machine_name("sim://a/b"), None);
        assert_eq!(machine_name("https://bmc.example"), None);
    }

    #[test]
    fn system_uuids_are_uuid_v5_of_the_url() {
        let a = system_uuid("node-1");
        assert_eq!(a, system_uuid("node-1"));
        assert_ne!(a, system_uuid("node-2"));
        let parsed = uuid::Uuid::parse_str(&a).expect("a UUID");
        assert_eq!(parsed.get_version_num(), 5);
    }

    #[test]
    fn fault_spellings_round_trip() {
        for f in MachineFault::ALL {
            assert_eq!(MachineFault::parse(f.as_str()), Some(f));
        }
        for f in ClusterFault::ALL {
            assert_eq!(ClusterFault::parse(f.as_str()), Some(f));
        }
        assert_eq!(MachineFault::parse("nope"), None);
    }
}
