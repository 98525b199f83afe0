//! The cluster reconciler: docs/architecture.md, converged from the top on every run.
//!
//! 1. isolation on the platform cluster; 2. the tenant control plane (its admin kubeconfig stored
//!    sealed); 3. machines: surplus released, shortfall allocated all or nothing, first come first
//!    served (the cluster waits with `MachinesAllocated=False`/`InsufficientCapacity` and is woken
//!    when machines free up), allocated machines provisioned by their own jobs; 4. the tenant base
//!    stack; 5. Slurm (`kind: slurm`); 6. status: conditions, phase, endpoints, pool counts, and
//!    `observed_generation` once everything is ready, which completes the operations created for
//!    that generation (docs/api.md).
//!
//! Deletion removes Slurm, releases every machine (they go back through cleaning), then removes
//! the control plane and the namespace, and only when each is confirmed gone marks the cluster
//! deleted (404 from then on).
//!
//! A run writes status with a guard on the version it read; allocation and releases happen in
//! their own short transactions, each idempotent, so a crash anywhere repeats at most a driver
//! call that converges anyway.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use futures::FutureExt;
use paddock_domain::cluster::{set_condition, Cluster, NodePool};
use paddock_domain::driver::{
    ClusterRef, ControlPlaneSpec, ControlPlaneStatus, DriverError, KubeDrivers, Removal, SlurmDesired, SlurmPool,
    SlurmSecrets, TenantAccess,
};
use paddock_domain::job_kind::{ClusterJob, Payload, CLUSTER_DRIFT_CHECK, CLUSTER_RECONCILE};
use paddock_domain::machine::HELD;
use paddock_domain::secret::{Binding, SecretString};
use paddock_service::Services;
use paddock_store::allocation::{self, Allocation, HeldMachine, Need};
use paddock_store::{cluster as store, cluster_event, drift, lifecycle, node_pool, operation, Conn, StoreError};
use paddock_types::cluster::{ClusterKind, ClusterPhase, Condition, ConditionStatus, NodePoolStatus};
use paddock_types::machine::MachineState;
use paddock_types::operation::{OperationState, OperationStep};
use paddock_types::{ClusterId, NodePoolId, TenantId};
use serde_json::{json, Value};

use super::{
    access, cluster_ref, kubeconfig_binding, open_access, store_error, Drivers, Settings, DRIVER_NOT_CONFIGURED,
    DRIVER_WAIT,
};
use crate::metrics::{self, Driver};
use crate::{failed_problem, Job, JobHandler, Outcome};

/// How long a cluster waiting for machines sleeps at most: a machine that becomes available
/// wakes the first waiting cluster of its class at once; this is the fallback. A cluster held
/// back by an earlier one sleeps only until that one's head timeout ends.
const CAPACITY_WAIT: Duration = Duration::from_secs(60);

/// How long a cluster waiting only for its own machines (to become active, or to leave) sleeps at
/// most: each machine's transition wakes it at once; this is the fallback.
const MACHINE_WAIT: Duration = Duration::from_secs(60);

/// How long a cluster stopped on a permanent error waits before it tries again by itself (a
/// spec change tries at once).
const FAILED_WAIT: Duration = Duration::from_secs(3600);

/// What a tenant is told while its cluster waits for machines: nothing about the fleet, free
/// capacity or other tenants (docs/architecture.md, cluster reconciler step 3).
const TENANT_WAITING: &str = "waiting for machines of the requested class to become available; \
    the cluster continues by itself";

/// What a tenant is told when a platform step fails for a while (the details are the provider's).
const TENANT_RETRYING: &str = "a platform step is being retried; the cluster continues by itself";

/// What a tenant is told when a platform step fails for good.
const TENANT_FAILED: &str = "the cluster could not be set up; the provider has the cause, contact them";

const CONTROL_PLANE_READY: &str = "ControlPlaneReady";
const NAMESPACE_READY: &str = "NamespaceReady";
const MACHINES_ALLOCATED: &str = "MachinesAllocated";
const NODES_READY: &str = "NodesReady";
const STACK_READY: &str = "StackReady";
const SLURM_READY: &str = "SlurmReady";
const READY: &str = "Ready";
const MACHINES_RELEASED: &str = "MachinesReleased";
const SLURM_REMOVED: &str = "SlurmRemoved";

/// Converges clusters and their node pools.
#[derive(Clone)]
pub struct ClusterReconciler {
    services: Services,
    drivers: Drivers,
    settings: Arc<Settings>,
}

impl std::fmt::Debug for ClusterReconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterReconciler").field("drivers", &self.drivers).finish_non_exhaustive()
    }
}

/// The status a run works out, written at its end in one guarded statement.
struct Observed {
    conditions: Vec<Condition>,
    endpoints: paddock_types::cluster::Endpoints,
    events: Vec<(&'static str, &'static str, String)>,
    now: DateTime<Utc>,
    /// What the drivers had to create or correct in this run (`Kind namespace/name`).
    changed: Vec<String>,
}

impl Observed {
    fn set(&mut self, type_: &str, ok: bool, reason: &str, message: &str) {
        let status = ConditionStatus::from(ok);
        set_condition(&mut self.conditions, type_, status, reason, message, self.now);
    }

    fn is_true(&self, type_: &str) -> bool {
        self.conditions.iter().any(|c| c.type_ == type_ && c.status == ConditionStatus::True)
    }

    fn was_true(before: &[Condition], type_: &str) -> bool {
        before.iter().any(|c| c.type_ == type_ && c.status == ConditionStatus::True)
    }
}

/// What a run starts from ([`ClusterReconciler::load`]).
struct Loaded {
    cluster: Cluster,
    pools: Vec<NodePool>,
    reference: ClusterRef,
    held: Vec<HeldMachine>,
    sealed: store::SealedSecrets,
}

/// A run's input, borrowed by its steps.
#[derive(Clone, Copy)]
struct Run<'a> {
    cluster: &'a Cluster,
    pools: &'a [NodePool],
    reference: &'a ClusterRef,
    held: &'a [HeldMachine],
    sealed: &'a store::SealedSecrets,
}

/// Why a run was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The cluster's reconcile job: a spec change, a machine that moved, a retry.
    Reconcile,
    /// A drift check ([`CLUSTER_DRIFT_CHECK`]): only a cluster at rest is looked at, and a run
    /// that finds everything as it was writes nothing.
    DriftCheck,
}

/// Whether a cluster is at rest: ready at its current generation and not being deleted. What a
/// run must correct on such a cluster changed behind paddock's back.
fn at_rest(cluster: &Cluster) -> bool {
    !cluster.deleting
        && cluster.status.phase == ClusterPhase::Ready
        && cluster.status.observed_generation == cluster.generation
}

/// Why a run stops early.
enum Stop {
    /// A driver failed; the status shows it.
    Driver(&'static str, DriverError),
    /// The database failed.
    Store(StoreError),
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        Stop::Store(e)
    }
}

impl ClusterReconciler {
    /// A reconciler over `services` with `drivers`.
    pub fn new(services: Services, drivers: Drivers, settings: Settings) -> Self {
        Self { services, drivers, settings: Arc::new(settings) }
    }

    async fn reconcile(&self, tenant: TenantId, id: ClusterId, mode: Mode) -> Outcome {
        let Some(kube) = self.drivers.kube.clone() else {
            return self.no_driver(tenant, id).await;
        };
        let Loaded { cluster, pools, reference, held, sealed } = match self.load(tenant, id).await {
            Ok(Some(found)) => found,
            // Gone (deleted, or never existed): nothing to converge.
            Ok(None) => return Outcome::Done,
            Err(e) => return store_error(e),
        };
        if mode == Mode::DriftCheck && !at_rest(&cluster) {
            // Its reconcile job owns it until it is ready again, and then arms the next check.
            return Outcome::Done;
        }
        let mut observed = Observed {
            conditions: cluster.status.conditions.clone(),
            endpoints: cluster.status.endpoints.clone(),
            events: Vec::new(),
            now: Utc::now(),
            changed: Vec::new(),
        };
        let run = Run { cluster: &cluster, pools: &pools, reference: &reference, held: &held, sealed: &sealed };
        let result = if cluster.deleting {
            self.delete(&kube, &run, &mut observed).await
        } else {
            self.converge(&kube, &run, &mut observed, mode).await
        };
        match result {
            Ok(outcome) => outcome,
            Err(Stop::Store(e)) => store_error(e),
            Err(Stop::Driver(step, e)) => self.driver_failed(&cluster, observed, step, e).await,
        }
    }

    /// What a run starts from, read in one transaction: one consistent view, one commit.
    async fn load(&self, tenant: TenantId, id: ClusterId) -> Result<Option<Loaded>, StoreError> {
        let mut tx = self.services.store().begin().await?;
        let Some(cluster) = store::get(&mut tx, tenant, id, false).await? else {
            return Ok(None);
        };
        let Some(reference) = cluster_ref(&mut tx, tenant, id, &cluster.spec.name).await? else {
            return Ok(None);
        };
        let pools = node_pool::of_cluster(&mut tx, tenant, id).await?;
        let held = allocation::machines_of(&mut tx, tenant, id).await?;
        let sealed = store::sealed_secrets(&mut tx, tenant, id).await?;
        tx.commit().await?;
        Ok(Some(Loaded { cluster, pools, reference, held, sealed }))
    }

    /// One run over the cluster reconciler's steps (docs/architecture.md), in order; the status is written at the end.
    async fn converge(
        &self,
        kube: &KubeDrivers,
        run: &Run<'_>,
        observed: &mut Observed,
        mode: Mode,
    ) -> Result<Outcome, Stop> {
        let Run { cluster, pools, reference, held, .. } = *run;
        self.isolation(kube, reference, observed).await?;
        let cp = self.control_plane(kube, run, observed).await?;
        let capacity_wait = self.machines(cluster, pools, held, observed).await?;
        let access = self.tenant_access(run, &cp)?;
        if access.is_some() {
            self.start_provisioning(held).await?;
        }
        let pool_status = nodes(pools, held, observed);
        match &access {
            Some(access) => {
                if self.stack(kube, cluster, access, observed).await? {
                    self.slurm(kube, run, access, observed).await?;
                } else if cluster.spec.kind == ClusterKind::Slurm && cluster.spec.slurm.is_some() {
                    observed.set(SLURM_READY, false, "WaitingForStack", "waiting for the tenant base stack");
                }
            }
            None => {
                let message = "waiting for the control plane";
                observed.set(STACK_READY, false, "WaitingForControlPlane", message);
                if cluster.spec.kind == ClusterKind::Slurm {
                    observed.set(SLURM_READY, false, "WaitingForControlPlane", message);
                }
            }
        }
        if at_rest(cluster) && !observed.changed.is_empty() {
            drift_corrected(cluster, observed);
        }
        let quiet = mode == Mode::DriftCheck;
        self.status(cluster, pools, &pool_status, observed, capacity_wait.filter(|_| cp.ready), quiet).await
    }

    /// Step 1: the cluster's namespace and its isolation on the platform cluster.
    async fn isolation(&self, kube: &KubeDrivers, reference: &ClusterRef, observed: &mut Observed) -> Result<(), Stop> {
        let isolation =
            kube.platform.ensure_isolation(reference).await.map_err(|e| Stop::Driver(NAMESPACE_READY, e))?;
        observed.changed.extend(isolation.changed);
        observed.set(NAMESPACE_READY, true, "Ready", "");
        Ok(())
    }

    /// Step 2: the tenant control plane; its admin kubeconfig is stored sealed and its endpoint
    /// shown.
    async fn control_plane(
        &self,
        kube: &KubeDrivers,
        run: &Run<'_>,
        observed: &mut Observed,
    ) -> Result<ControlPlaneStatus, Stop> {
        let Run { cluster, reference, sealed, .. } = *run;
        let spec = ControlPlaneSpec {
            cluster: reference.clone(),
            kubernetes_version: cluster.spec.kubernetes_version.clone(),
            replicas: self.settings.control_plane_replicas,
            service_type: self.settings.service_type,
            datastore: None,
        };
        let mut cp =
            kube.control_plane.ensure_control_plane(&spec).await.map_err(|e| Stop::Driver(CONTROL_PLANE_READY, e))?;
        observed.changed.append(&mut cp.changed);
        if let Some(kubeconfig) = &cp.admin_kubeconfig {
            self.store_kubeconfig(cluster, kubeconfig, sealed.admin_kubeconfig.as_deref()).await?;
        }
        if let Some(endpoint) = &cp.endpoint {
            observed.endpoints.kubernetes_api = Some(format!("https://{endpoint}"));
        }
        let reason = if cp.ready { "Ready" } else { "Provisioning" };
        observed.set(CONTROL_PLANE_READY, cp.ready, reason, &cp.reason);
        Ok(cp)
    }

    /// Access to the tenant cluster, once its control plane is ready.
    fn tenant_access(&self, run: &Run<'_>, cp: &ControlPlaneStatus) -> Result<Option<TenantAccess>, StoreError> {
        if !cp.ready {
            return Ok(None);
        }
        if let (Some(kubeconfig), Some(endpoint)) = (&cp.admin_kubeconfig, &cp.endpoint) {
            // The kubeconfig the control plane just reported (and `control_plane` stored): not
            // read back.
            return access(run.reference.clone(), endpoint, kubeconfig.clone()).map(Some);
        }
        let sealed = run.sealed.admin_kubeconfig.as_deref();
        open_access(self.services.cipher(), run.reference.clone(), cp.endpoint.as_deref(), sealed)
    }

    /// Step 3, once the control plane is up: allocated machines, which wait for it, go on to be
    /// provisioned by their own jobs.
    async fn start_provisioning(&self, held: &[HeldMachine]) -> Result<(), StoreError> {
        let waiting: Vec<_> = held.iter().filter(|m| m.state == MachineState::Allocated).map(|m| m.id).collect();
        if waiting.is_empty() {
            return Ok(());
        }
        let mut tx = self.services.store().begin().await?;
        for machine in waiting {
            lifecycle::enqueue_machine(&mut tx, machine, None).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Step 4: the tenant base stack; true once it is ready.
    async fn stack(
        &self,
        kube: &KubeDrivers,
        cluster: &Cluster,
        access: &TenantAccess,
        observed: &mut Observed,
    ) -> Result<bool, Stop> {
        let stack =
            kube.stack.ensure_stack(access, &cluster.stack_version).await.map_err(|e| Stop::Driver(STACK_READY, e))?;
        observed.changed.extend(stack.changed);
        observed.set(STACK_READY, stack.ready, if stack.ready { "Ready" } else { "Applying" }, &stack.reason);
        Ok(stack.ready)
    }

    /// Step 5 (`kind: slurm`), on the ready base stack: Slurm, with its endpoints.
    async fn slurm(
        &self,
        kube: &KubeDrivers,
        run: &Run<'_>,
        access: &TenantAccess,
        observed: &mut Observed,
    ) -> Result<(), Stop> {
        let Run { cluster, pools, held, sealed, .. } = *run;
        let (ClusterKind::Slurm, Some(slurm)) = (cluster.spec.kind, &cluster.spec.slurm) else {
            return Ok(());
        };
        let secrets = self.slurm_secrets(cluster, sealed.slurm_secrets.clone()).await?;
        let desired = slurm_desired(cluster, slurm, pools, held, secrets);
        let status = kube.slurm.ensure_slurm(access, &desired).await.map_err(|e| Stop::Driver(SLURM_READY, e))?;
        observed.changed.extend(status.changed);
        observed.set(SLURM_READY, status.ready, if status.ready { "Ready" } else { "Applying" }, &status.reason);
        observed.endpoints.slurm_rest_api = status.rest_api;
        observed.endpoints.login_ssh = status.login_ssh;
        observed.endpoints.login_ssh_host_keys = status.login_ssh_host_keys;
        Ok(())
    }

    /// Step 6: `Ready` from the required conditions, the phase, and the status written; the
    /// outcome says when to run again.
    async fn status(
        &self,
        cluster: &Cluster,
        pools: &[NodePool],
        pool_status: &[(&NodePool, NodePoolStatus)],
        observed: &mut Observed,
        capacity_wait: Option<Duration>,
        quiet: bool,
    ) -> Result<Outcome, Stop> {
        let mut required = vec![NAMESPACE_READY, CONTROL_PLANE_READY, MACHINES_ALLOCATED, NODES_READY, STACK_READY];
        if cluster.spec.kind == ClusterKind::Slurm {
            required.push(SLURM_READY);
        }
        let missing: Vec<&str> = required.iter().copied().filter(|t| !observed.is_true(t)).collect();
        let ready = missing.is_empty();
        let message = if ready { String::new() } else { format!("not ready: {}", missing.join(", ")) };
        observed.set(READY, ready, if ready { "Ready" } else { "Reconciling" }, &message);
        let (phase, observed_generation) = phase(cluster, ready);
        if ready && !Observed::was_true(&cluster.status.conditions, READY) {
            observed.events.push(("Normal", "ClusterReady", "the cluster is ready".to_owned()));
        }
        let outcome = match capacity_wait {
            _ if ready => Outcome::Done,
            Some(after) => Outcome::wait(after, "insufficient_capacity", "waiting for machines"),
            // Each of its machines wakes the cluster when it becomes active or fails (and a
            // released one when it has left): nothing to poll for.
            None if waits_for_machines(&missing) => Outcome::wait(MACHINE_WAIT, "waiting_for_machines", message),
            None => Outcome::wait(self.settings.poll, "converging", message),
        };
        if (quiet || !ready) && unchanged(cluster, pool_status, observed, phase, observed_generation) {
            // Found as its status says (a drift check at rest, or a converging run that saw no
            // progress): nothing to write. A run that finds the cluster ready always writes: it
            // finishes the generation's operations and arms the next drift check.
            return Ok(outcome);
        }
        let steps = steps(&observed.conditions, &required);
        let written = self.write(cluster, pools, pool_status, observed, phase, observed_generation, &steps).await?;
        if !written {
            return Ok(Outcome::wait(Duration::ZERO, "status_conflict", "the status changed under the run; again"));
        }
        Ok(outcome)
    }

    /// Releases surplus machines, marks emptied deleting pools deleted and allocates the
    /// shortfall, in one transaction; while the cluster waits for capacity (or quota), how long
    /// until it tries again.
    async fn machines(
        &self,
        cluster: &Cluster,
        pools: &[NodePool],
        held: &[HeldMachine],
        observed: &mut Observed,
    ) -> Result<Option<Duration>, Stop> {
        let plan = MachinePlan::of(pools, held);
        if plan.release.is_empty() && plan.gone_pools.is_empty() && plan.needs.is_empty() {
            observed.set(MACHINES_ALLOCATED, true, "Allocated", "");
            return Ok(None);
        }
        let mut tx = self.services.store().begin().await?;
        for m in &plan.release {
            if lifecycle::begin_release(&mut tx, self.services.ledger_key(), m.id, m.state, m.status_version).await? {
                lifecycle::enqueue_machine(&mut tx, m.id, None).await?;
            }
        }
        if !plan.release.is_empty() {
            let message = format!("{} machine(s) are being released", plan.release.len());
            observed.events.push(("Normal", "MachinesReleasing", message));
        }
        for pool in &plan.gone_pools {
            node_pool::mark_deleted(&mut tx, cluster.tenant_id, *pool).await?;
            operation::succeed(&mut tx, pool.uuid(), None, &[]).await?;
        }
        let (waiting, allocated) = if plan.needs.is_empty() {
            observed.set(MACHINES_ALLOCATED, true, "Allocated", "");
            (None, None)
        } else {
            self.allocate(&mut tx, cluster, &plan.needs, observed).await?
        };
        tx.commit().await.map_err(StoreError::from)?;
        if let Some(waited) = allocated {
            metrics::observe(|w| w.allocated(waited));
        }
        Ok(waiting)
    }

    /// Allocates `needs` all or nothing in the caller's transaction; when the cluster waits, how
    /// long until it tries again; when it got its machines, how long it had waited for them.
    async fn allocate(
        &self,
        conn: &mut Conn,
        cluster: &Cluster,
        needs: &[Need],
        observed: &mut Observed,
    ) -> Result<(Option<Duration>, Option<Duration>), StoreError> {
        let (tenant, id, timeout) = (cluster.tenant_id, cluster.id, self.settings.allocation_head_timeout);
        let waited = allocation::waited(conn, tenant, id).await?;
        let outcome = allocation::allocate(conn, self.services.ledger_key(), tenant, id, needs, timeout).await?;
        // The details are the provider's (logged); the tenant's message says only what to expect.
        match &outcome {
            Allocation::Allocated(machines) => {
                observed.set(MACHINES_ALLOCATED, true, "Allocated", "");
                let message = format!("{} machine(s) allocated", machines.len());
                observed.events.push(("Normal", "MachinesAllocated", message));
                return Ok((None, Some(waited)));
            }
            Allocation::Behind { until, .. } => {
                tracing::info!(tenant = %tenant, cluster = %id, outcome = ?outcome, "the cluster waits for machines");
                self.insufficient(observed, "InsufficientCapacity", TENANT_WAITING);
                // Nothing wakes it when the one in front stops holding it back: it wakes itself.
                let left = (*until - Utc::now()).to_std().unwrap_or_default();
                return Ok((Some(CAPACITY_WAIT.min(left + Duration::from_millis(100))), None));
            }
            Allocation::Short { .. } => {
                tracing::info!(tenant = %tenant, cluster = %id, outcome = ?outcome, "the cluster waits for machines");
                self.insufficient(observed, "InsufficientCapacity", TENANT_WAITING);
            }
            Allocation::OverQuota { quota, limit, would_hold } => {
                let message = format!("the tenant's {quota} quota ({limit}) would be exceeded ({would_hold})");
                self.insufficient(observed, "QuotaExceeded", &message);
            }
        }
        Ok((Some(CAPACITY_WAIT), None))
    }

    fn insufficient(&self, observed: &mut Observed, reason: &'static str, message: &str) {
        let was = observed.conditions.iter().find(|c| c.type_ == MACHINES_ALLOCATED).map(|c| c.reason.clone());
        observed.set(MACHINES_ALLOCATED, false, reason, message);
        if was.as_deref() != Some(reason) {
            observed.events.push(("Warning", reason, message.to_owned()));
        }
    }

    /// The cluster's Slurm secrets: generated once, stored sealed, then always the stored ones
    /// (`stored`, read with the run's input).
    async fn slurm_secrets(&self, cluster: &Cluster, mut stored: Option<Vec<u8>>) -> Result<SlurmSecrets, StoreError> {
        let binding = Binding { table: "clusters", column: "slurm_secrets_enc", row: cluster.id.uuid() };
        if stored.is_none() {
            let mut conn = self.services.store().conn().await?;
            let fresh = json!({
                "slurm_key": random_base64(1024),
                "jwt_hs256_key": random_base64(64),
                "database_password": random_alphanumeric(32),
            });
            let sealed = self.services.cipher().seal(fresh.to_string().as_bytes(), binding)?;
            store::init_slurm_secrets(&mut conn, cluster.tenant_id, cluster.id, &sealed).await?;
            // Read back: a concurrent run's secrets win if it stored them first.
            stored = store::slurm_secrets(&mut conn, cluster.tenant_id, cluster.id).await?;
        }
        let sealed = stored
            .ok_or_else(|| StoreError::Corrupt(format!("the Slurm secrets of cluster {} vanished", cluster.id)))?;
        let corrupt = |what: &str| StoreError::Corrupt(format!("the Slurm secrets of cluster {}: {what}", cluster.id));
        let opened = self.services.cipher().open(&sealed, binding).map_err(|e| corrupt(&e.to_string()))?;
        let value: Value = serde_json::from_slice(&opened).map_err(|e| corrupt(&e.to_string()))?;
        let field = |k: &str| {
            value[k]
                .as_str()
                .map(|s| SecretString::new(s.to_owned()))
                .ok_or_else(|| corrupt(&format!("{k} is missing")))
        };
        Ok(SlurmSecrets {
            slurm_key: field("slurm_key")?,
            jwt_hs256_key: field("jwt_hs256_key")?,
            database_password: field("database_password")?,
        })
    }

    /// Deletion: Slurm removed, every machine released to cleaning, then the control plane and the
    /// namespace removed; the cluster is marked deleted only when all of that is confirmed.
    async fn delete(&self, kube: &KubeDrivers, run: &Run<'_>, observed: &mut Observed) -> Result<Outcome, Stop> {
        let Run { cluster, reference, held, sealed, .. } = *run;
        // Slurm goes first, while its nodes still exist, so nothing of it outlives them; then the
        // machines, through cleaning.
        let endpoint = cluster.status.endpoints.kubernetes_api.as_deref();
        let access =
            open_access(self.services.cipher(), reference.clone(), endpoint, sealed.admin_kubeconfig.as_deref())?;
        // Once removed, Slurm is not asked again: the control plane's deletion that follows takes
        // the tenant API server with it, and a later run could not reach it.
        let slurm_removed = observed.is_true(SLURM_REMOVED);
        if let (ClusterKind::Slurm, Some(access), false) = (cluster.spec.kind, &access, slurm_removed) {
            match kube.slurm.remove_slurm(access).await.map_err(|e| Stop::Driver(SLURM_READY, e))? {
                Removal::Gone => {
                    observed.set(SLURM_REMOVED, true, "Removed", "");
                    if held.is_empty() {
                        // Recorded before the control plane goes (and the tenant API server with
                        // it), so a crash cannot lose it.
                        let (stage, poll) = (DeleteStage::Machines, self.settings.poll);
                        return self.deleting(run, observed, stage, "Slurm removed", poll).await;
                    }
                    // The machines' release goes on in this run; its status write records this
                    // first (a crash before it asks again, while the tenant API server is there).
                }
                Removal::Deleting => {
                    let (stage, poll) = (DeleteStage::Slurm, self.settings.poll);
                    return self.deleting(run, observed, stage, "deleting Slurm", poll).await;
                }
            }
        }
        if !held.is_empty() {
            self.release_all(held).await?;
            let message = format!("{} machine(s) are still being released", held.len());
            observed.set(MACHINES_RELEASED, false, "Releasing", &message);
            // Each machine wakes the cluster when its tenancy has ended.
            return self.deleting(run, observed, DeleteStage::Machines, &message, MACHINE_WAIT).await;
        }
        observed.set(MACHINES_RELEASED, true, "Released", "");
        let removal = kube
            .control_plane
            .delete_control_plane(reference)
            .await
            .map_err(|e| Stop::Driver(CONTROL_PLANE_READY, e))?;
        if removal == Removal::Deleting {
            let (stage, poll) = (DeleteStage::ControlPlane, self.settings.poll);
            return self.deleting(run, observed, stage, "deleting the control plane", poll).await;
        }
        let removal = kube.platform.remove_isolation(reference).await.map_err(|e| Stop::Driver(NAMESPACE_READY, e))?;
        if removal == Removal::Deleting {
            let (stage, poll) = (DeleteStage::Namespace, self.settings.poll);
            return self.deleting(run, observed, stage, "deleting the namespace", poll).await;
        }
        let mut tx = self.services.store().begin().await?;
        let pool_ids = store::mark_deleted(&mut tx, cluster.tenant_id, cluster.id).await?;
        cluster_event::insert(
            &mut tx,
            cluster.tenant_id,
            cluster.id,
            "Normal",
            "ClusterDeleted",
            "the cluster is gone",
        )
        .await?;
        let steps = delete_steps(cluster.spec.kind, observed, DeleteStage::Gone);
        operation::succeed(&mut tx, cluster.id.uuid(), None, &steps).await?;
        for pool in pool_ids {
            operation::succeed(&mut tx, pool, None, &steps).await?;
        }
        tx.commit().await.map_err(StoreError::from)?;
        Ok(Outcome::Done)
    }

    /// Starts the release of every machine the deleting cluster still holds, in one transaction.
    async fn release_all(&self, held: &[HeldMachine]) -> Result<(), StoreError> {
        let holding: Vec<_> = held.iter().filter(|m| HELD.contains(&m.state)).collect();
        if holding.is_empty() {
            // All on their way out already.
            return Ok(());
        }
        let mut tx = self.services.store().begin().await?;
        for m in holding {
            if lifecycle::begin_release(&mut tx, self.services.ledger_key(), m.id, m.state, m.status_version).await? {
                lifecycle::enqueue_machine(&mut tx, m.id, None).await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    /// Writes the deleting status, when it changed, and waits `after`.
    async fn deleting(
        &self,
        run: &Run<'_>,
        observed: &mut Observed,
        stage: DeleteStage,
        message: &str,
        after: Duration,
    ) -> Result<Outcome, Stop> {
        observed.set(READY, false, "Deleting", message);
        let (cluster, pools) = (run.cluster, run.pools);
        let generation = cluster.status.observed_generation;
        if !unchanged(cluster, &[], observed, ClusterPhase::Deleting, generation) {
            let steps = delete_steps(cluster.spec.kind, observed, stage);
            self.write(cluster, pools, &[], observed, ClusterPhase::Deleting, generation, &steps).await?;
        }
        Ok(Outcome::wait(after, "deleting", message.to_owned()))
    }

    /// Writes the run's status, pool counts, events and operation progress in one transaction;
    /// false when the status guard was lost (nothing written).
    #[expect(clippy::too_many_arguments, reason = "one run's whole status, written in one transaction")]
    async fn write(
        &self,
        cluster: &Cluster,
        pools: &[NodePool],
        pool_status: &[(&NodePool, NodePoolStatus)],
        observed: &Observed,
        phase: ClusterPhase,
        observed_generation: i64,
        steps: &[OperationStep],
    ) -> Result<bool, StoreError> {
        let (tenant, id) = (cluster.tenant_id, cluster.id);
        let mut tx = self.services.store().begin().await?;
        let status = store::StatusWrite {
            phase,
            conditions: &observed.conditions,
            endpoints: &observed.endpoints,
            observed_generation,
        };
        if !store::set_status(&mut tx, tenant, id, cluster.status_version, &status).await? {
            return Ok(false);
        }
        let ready = phase == ClusterPhase::Ready;
        for (pool, status) in pool_status {
            let pool_observed = ready.then_some(pool.generation);
            node_pool::set_status(&mut tx, tenant, pool.id, status, pool_observed).await?;
        }
        for (type_, reason, message) in &observed.events {
            cluster_event::insert(&mut tx, tenant, id, type_, reason, message).await?;
        }
        let mut targets = vec![id.uuid()];
        targets.extend(pools.iter().map(|p| p.id.uuid()));
        if ready {
            if !self.settings.drift_interval.is_zero() {
                drift::arm(&mut tx, tenant, id, spread(self.settings.drift_interval)).await?;
            }
            // The control plane is billed from the first time the cluster is ready (docs/billing.md).
            paddock_store::usage::open_control_plane_segment(&mut tx, tenant, id).await?;
            operation::succeed(&mut tx, id.uuid(), Some(cluster.generation), steps).await?;
            for pool in pools {
                operation::succeed(&mut tx, pool.id.uuid(), Some(pool.generation), steps).await?;
            }
        } else {
            operation::progress(&mut tx, &targets, steps).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Stores the control plane's admin kubeconfig sealed, when it differs from `stored` (read
    /// with the run's input).
    async fn store_kubeconfig(
        &self,
        cluster: &Cluster,
        kubeconfig: &[u8],
        stored: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        let binding = kubeconfig_binding(cluster.id);
        let same = stored
            .and_then(|sealed| self.services.cipher().open(sealed, binding).ok())
            .is_some_and(|opened| opened == kubeconfig);
        if !same {
            let mut conn = self.services.store().conn().await?;
            let sealed = self.services.cipher().seal(kubeconfig, binding)?;
            store::set_admin_kubeconfig(&mut conn, cluster.tenant_id, cluster.id, Some(&sealed)).await?;
        }
        Ok(())
    }

    /// A driver failed at `condition`'s step: transient ones retry with backoff, permanent ones
    /// stop the cluster in `failed` with the reason, failing its open operations.
    async fn driver_failed(
        &self,
        cluster: &Cluster,
        mut observed: Observed,
        condition: &str,
        e: DriverError,
    ) -> Outcome {
        metrics::driver_failed(Driver::Kube, &e.code);
        let permanent = !e.is_transient();
        // The driver's message is the provider's (logged with the cluster); the tenant's is generic.
        let tenant_message = if permanent { TENANT_FAILED } else { TENANT_RETRYING };
        let (tenant, id) = (cluster.tenant_id, cluster.id);
        tracing::warn!(tenant = %tenant, cluster = %id, step = condition, code = %e.code, permanent,
            error = %e.message, "a cluster step failed");
        observed.set(condition, false, &e.code, tenant_message);
        observed.set(READY, false, &e.code, tenant_message);
        let phase = if permanent {
            observed.events.push(("Warning", "ReconcileFailed", tenant_message.to_owned()));
            ClusterPhase::Failed
        } else if cluster.deleting {
            ClusterPhase::Deleting
        } else {
            cluster.status.phase
        };
        let result = async {
            let generation = cluster.status.observed_generation;
            let pools: Vec<NodePool> = Vec::new();
            if !self.write(cluster, &pools, &[], &observed, phase, generation, &[]).await? {
                return Ok(());
            }
            if permanent {
                let mut conn = self.services.store().conn().await?;
                let problem = failed_problem(422, e.code.clone(), tenant_message.to_owned());
                let mut targets = vec![cluster.id.uuid()];
                let pools = node_pool::of_cluster(&mut conn, cluster.tenant_id, cluster.id).await?;
                targets.extend(pools.iter().map(|p| p.id.uuid()));
                operation::fail_open(&mut conn, &targets, &problem).await?;
            }
            Ok::<_, StoreError>(())
        }
        .await;
        if let Err(se) = result {
            return store_error(se);
        }
        if permanent {
            Outcome::wait(FAILED_WAIT, e.code, e.message)
        } else {
            Outcome::retry(e.code, e.message)
        }
    }

    async fn no_driver(&self, tenant: TenantId, id: ClusterId) -> Outcome {
        let message = "no Kubernetes driver is configured (PADDOCK_KUBE_DRIVER=none); the cluster waits";
        let result = async {
            let mut conn = self.services.store().conn().await?;
            // A lost race on the status guard means another writer moved on: read again, once
            // per attempt (the next run re-reads anyway).
            for _ in 0..3 {
                let Some(current) = store::get(&mut conn, tenant, id, false).await? else {
                    return Ok(false);
                };
                let mut conditions = current.status.conditions.clone();
                if !set_condition(
                    &mut conditions,
                    READY,
                    ConditionStatus::False,
                    "DriverNotConfigured",
                    message,
                    Utc::now(),
                ) {
                    return Ok(true);
                }
                if store::set_conditions(&mut conn, tenant, id, current.status_version, &conditions).await? {
                    return Ok(true);
                }
            }
            Ok(true)
        }
        .await;
        match result {
            Ok(false) => Outcome::Done,
            Ok(true) => Outcome::wait(DRIVER_WAIT, DRIVER_NOT_CONFIGURED, message),
            Err(e) => store_error(e),
        }
    }
}

/// What step 3 does to a cluster's pools.
#[derive(Default)]
struct MachinePlan {
    /// Surplus machines to give back.
    release: Vec<HeldMachine>,
    /// The shortfall to allocate.
    needs: Vec<Need>,
    /// Deleting pools that hold no machine any more.
    gone_pools: Vec<NodePoolId>,
}

impl MachinePlan {
    fn of(pools: &[NodePool], held: &[HeldMachine]) -> Self {
        let mut plan = Self::default();
        for pool in pools {
            let want = if pool.deleting { 0 } else { pool.spec.count as usize };
            let mut holding: Vec<&HeldMachine> =
                held.iter().filter(|m| m.node_pool_id == pool.id && HELD.contains(&m.state)).collect();
            if holding.len() > want {
                // Give back the machines that serve least first: not yet provisioned, then
                // provisioning, then active; the newest first within each.
                holding.sort_by_key(|m| (release_rank(m.state), std::cmp::Reverse(m.id.uuid())));
                plan.release.extend(holding.iter().take(holding.len() - want).map(|m| (*m).clone()));
            } else if holding.len() < want {
                let count = u32::try_from(want - holding.len()).unwrap_or(u32::MAX);
                plan.needs.push(Need {
                    node_pool_id: pool.id,
                    machine_class_id: pool.machine_class_id,
                    gpu_count: pool.gpu_count,
                    count,
                });
            }
            if pool.deleting && !held.iter().any(|m| m.node_pool_id == pool.id) {
                plan.gone_pools.push(pool.id);
            }
        }
        plan
    }
}

/// The order in which surplus machines are given back.
fn release_rank(state: MachineState) -> u8 {
    match state {
        MachineState::Allocated => 0,
        MachineState::Provisioning => 1,
        _ => 2,
    }
}

/// Step 3's `NodesReady`: every wanted node ready and every held machine active; each pool's
/// status.
fn nodes<'a>(
    pools: &'a [NodePool],
    held: &[HeldMachine],
    observed: &mut Observed,
) -> Vec<(&'a NodePool, NodePoolStatus)> {
    let pool_status = pool_statuses(pools, held);
    let (ready_nodes, wanted_nodes) = pool_status
        .iter()
        .filter(|(p, _)| !p.deleting)
        .fold((0, 0), |(r, w), (p, s)| (r + s.ready.min(p.spec.count), w + p.spec.count));
    let nodes_ready = ready_nodes == wanted_nodes && held.iter().all(|m| m.state == MachineState::Active);
    observed.set(
        NODES_READY,
        nodes_ready,
        if nodes_ready { "Ready" } else { "Provisioning" },
        &format!("{ready_nodes} of {wanted_nodes} nodes ready"),
    );
    pool_status
}

/// Whether a run that is not ready waits only for its machines: nodes not ready, and nothing
/// missing that does not follow from them (Slurm waits for its nodes).
fn waits_for_machines(missing: &[&str]) -> bool {
    missing.contains(&NODES_READY) && missing.iter().all(|t| [NODES_READY, SLURM_READY].contains(t))
}

/// The phase and observed generation of a run that found the cluster `ready` or not (docs/api.md).
fn phase(cluster: &Cluster, ready: bool) -> (ClusterPhase, i64) {
    let before = cluster.status.observed_generation;
    if ready {
        (ClusterPhase::Ready, cluster.generation)
    } else if before == 0 {
        (ClusterPhase::Provisioning, 0)
    } else if cluster.generation > before {
        (ClusterPhase::Updating, before)
    } else {
        (ClusterPhase::Degraded, before)
    }
}

/// Whether a run found the cluster and its pools exactly as their stored status says, with
/// nothing to tell: then writing would change nothing.
fn unchanged(
    cluster: &Cluster,
    pool_status: &[(&NodePool, NodePoolStatus)],
    observed: &Observed,
    phase: ClusterPhase,
    observed_generation: i64,
) -> bool {
    let ready = phase == ClusterPhase::Ready;
    phase == cluster.status.phase
        && observed_generation == cluster.status.observed_generation
        && observed.conditions == cluster.status.conditions
        && observed.endpoints == cluster.status.endpoints
        && observed.events.is_empty()
        && pool_status
            .iter()
            .all(|(pool, status)| *status == pool.status && (!ready || pool.observed_generation == pool.generation))
}

/// The cluster's event for what a run on a cluster at rest had to restore: drift, named object by
/// object (the first few).
fn drift_corrected(cluster: &Cluster, observed: &mut Observed) {
    const NAMED: usize = 8;
    let changed = &observed.changed;
    let mut named = changed.iter().take(NAMED).cloned().collect::<Vec<_>>().join(", ");
    if changed.len() > NAMED {
        named.push_str(&format!(" and {} more", changed.len() - NAMED));
    }
    tracing::warn!(tenant = %cluster.tenant_id, cluster = %cluster.id, changed = ?changed,
        "cluster {} had drifted: restored {} object(s)", cluster.id, changed.len());
    let message = format!("restored what had been changed or removed behind paddock's back: {named}");
    observed.events.push(("Warning", "DriftCorrected", message));
}

/// `interval`, give or take a tenth at random, so clusters that were checked together drift apart.
fn spread(interval: Duration) -> Duration {
    interval.mul_f64(rand::Rng::random_range(&mut rand::rng(), 0.9..1.1))
}

/// Each pool's ready (active) and allocated (held) counts and its conditions.
fn pool_statuses<'a>(pools: &'a [NodePool], held: &[HeldMachine]) -> Vec<(&'a NodePool, NodePoolStatus)> {
    let now = Utc::now();
    pools
        .iter()
        .map(|pool| {
            let mine = held.iter().filter(|m| m.node_pool_id == pool.id);
            let ready = mine.clone().filter(|m| m.state == MachineState::Active).count();
            let allocated = mine.filter(|m| HELD.contains(&m.state)).count();
            let mut conditions = pool.status.conditions.clone();
            let want = pool.spec.count as usize;
            let (status, reason) =
                if ready >= want { (ConditionStatus::True, "Ready") } else { (ConditionStatus::False, "Provisioning") };
            let message = format!("{ready} of {want} nodes ready");
            set_condition(&mut conditions, NODES_READY, status, reason, &message, now);
            let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
            (pool, NodePoolStatus { ready: count(ready), allocated: count(allocated), conditions })
        })
        .collect()
}

fn random_base64(bytes: usize) -> String {
    use base64::Engine;
    let mut raw = vec![0u8; bytes];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut raw);
    base64::engine::general_purpose::STANDARD.encode(raw)
}

fn random_alphanumeric(len: usize) -> String {
    use rand::Rng;
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::rng();
    (0..len).map(|_| char::from(CHARS[rng.random_range(0..CHARS.len())])).collect()
}

fn slurm_desired(
    cluster: &Cluster,
    spec: &paddock_types::cluster::SlurmSpec,
    pools: &[NodePool],
    held: &[HeldMachine],
    secrets: SlurmSecrets,
) -> SlurmDesired {
    let pools = pools
        .iter()
        .filter(|p| !p.deleting)
        .map(|p| SlurmPool {
            node_pool_id: p.id,
            name: p.spec.name.clone(),
            count: p.spec.count,
            node_names: held
                .iter()
                .filter(|m| m.node_pool_id == p.id && m.state == MachineState::Active)
                .filter_map(|m| m.node_name.clone())
                .collect(),
            gpus_per_node: p.gpu_count,
            taints: p.spec.taints.clone(),
        })
        .collect();
    SlurmDesired { spec: spec.clone(), stack_version: cluster.stack_version.clone(), pools, secrets }
}

/// The operation steps, from the conditions: succeeded up to the first one not true, which is
/// running; the rest pending.
fn steps(conditions: &[Condition], required: &[&str]) -> Vec<OperationStep> {
    let mut running_seen = false;
    required
        .iter()
        .map(|type_| {
            let condition = conditions.iter().find(|c| c.type_ == *type_);
            let done = condition.is_some_and(|c| c.status == ConditionStatus::True);
            // When a step finished is its condition's last transition; when a step started the
            // operation's own history says (`operation::merge`), so none is given here.
            let (state, finished_at) = if done && !running_seen {
                (OperationState::Succeeded, condition.map(|c| c.last_transition_time))
            } else if !running_seen {
                running_seen = true;
                (OperationState::Running, None)
            } else {
                (OperationState::Pending, None)
            };
            OperationStep { name: step_name(type_).to_owned(), state, started_at: None, finished_at }
        })
        .collect()
}

/// Where a deletion is: the step being carried out (the reconciler's order in docs/architecture.md, reversed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum DeleteStage {
    Slurm,
    Machines,
    ControlPlane,
    Namespace,
    Gone,
}

/// A deletion's steps: the ones before `stage` succeeded (each at its condition's transition
/// where it has one), `stage` running; Slurm's removal only for a Slurm cluster.
fn delete_steps(kind: ClusterKind, observed: &Observed, stage: DeleteStage) -> Vec<OperationStep> {
    let transition = |type_: &str| {
        observed
            .conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == ConditionStatus::True)
            .map(|c| c.last_transition_time)
    };
    let all = [
        (DeleteStage::Slurm, "remove_slurm", transition(SLURM_REMOVED)),
        (DeleteStage::Machines, "release_machines", transition(MACHINES_RELEASED)),
        (DeleteStage::ControlPlane, "delete_control_plane", None),
        (DeleteStage::Namespace, "delete_namespace", None),
    ];
    all.into_iter()
        .filter(|(s, ..)| kind == ClusterKind::Slurm || *s != DeleteStage::Slurm)
        .filter(|(s, ..)| *s <= stage)
        .map(|(s, name, at)| {
            let done = s < stage;
            OperationStep {
                name: name.to_owned(),
                state: if done { OperationState::Succeeded } else { OperationState::Running },
                started_at: None,
                finished_at: if done { Some(at.unwrap_or(observed.now)) } else { None },
            }
        })
        .collect()
}

fn step_name(condition: &str) -> &'static str {
    match condition {
        NAMESPACE_READY => "namespace",
        CONTROL_PLANE_READY => "control_plane",
        MACHINES_ALLOCATED => "machines",
        NODES_READY => "nodes",
        STACK_READY => "stack",
        SLURM_READY => "slurm",
        _ => "other",
    }
}

impl JobHandler for ClusterReconciler {
    fn kind(&self) -> &'static str {
        CLUSTER_RECONCILE
    }

    fn run<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        match ClusterJob::from_value(&job.payload) {
            Ok(c) => async move {
                let outcome = self.reconcile(c.tenant_id, c.cluster_id, Mode::Reconcile).await;
                super::patient(outcome, job, self.settings.outage_wait)
            }
            .boxed(),
            Err(e) => bad_payload(e),
        }
    }
}

/// The [`CLUSTER_DRIFT_CHECK`] handler: the cluster reconciler's run on a cluster at rest, queued
/// again for the next check; what it cannot settle in one run goes to the cluster's reconcile job.
#[derive(Clone, Debug)]
pub struct DriftCheck(pub ClusterReconciler);

impl DriftCheck {
    async fn check(&self, tenant: TenantId, id: ClusterId) -> Outcome {
        let interval = self.0.settings.drift_interval;
        if interval.is_zero() {
            // Drift checks were switched off: the queued ones end as they come due.
            return Outcome::Done;
        }
        match self.0.reconcile(tenant, id, Mode::DriftCheck).await {
            Outcome::Done => {
                Outcome::wait(spread(interval), "at_rest", "the cluster is ready; waiting for its next drift check")
            }
            // Not ready any more (its status says why) or a failure: the reconcile job takes over,
            // with its retries, and arms the next check once the cluster is ready again.
            _ => {
                let handed = async {
                    let mut conn = self.0.services.store().conn().await?;
                    lifecycle::enqueue_cluster(&mut conn, tenant, id).await
                }
                .await;
                match handed {
                    Ok(()) => Outcome::Done,
                    Err(e) => store_error(e),
                }
            }
        }
    }
}

impl JobHandler for DriftCheck {
    fn kind(&self) -> &'static str {
        CLUSTER_DRIFT_CHECK
    }

    fn run<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        match ClusterJob::from_value(&job.payload) {
            Ok(c) => self.check(c.tenant_id, c.cluster_id).boxed(),
            Err(e) => bad_payload(e),
        }
    }
}

fn bad_payload(e: serde_json::Error) -> BoxFuture<'static, Outcome> {
    let detail = format!("the job's payload is not a cluster's: {e}");
    async move { Outcome::fail("bad_job", detail) }.boxed()
}
