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
//!
//! The steps live one file each: `control_plane` (steps 1 and 2), `machines` (3), `stack` (4 and
//! 5), `status` (6) and `delete`; `drift_check` is the check of a cluster at rest.

mod autoscale;
mod control_plane;
mod delete;
mod drift_check;
mod health;
mod identity;
mod machines;
mod remediation;
mod stack;
mod status;

pub use autoscale::Autoscaler;
pub use drift_check::DriftCheck;
pub use identity::IdentitySync;
use machines::nodes;
use status::drift_corrected;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use futures::FutureExt;
use paddock_domain::cluster::{set_condition, Cluster, NodePool};
use paddock_domain::driver::{ClusterRef, DriverError, KubeDrivers};
use paddock_domain::job_kind::{ClusterJob, Payload, CLUSTER_RECONCILE};
use paddock_service::Services;
use paddock_store::allocation::{self, HeldMachine};
use paddock_store::{cluster as store, node_pool, StoreError};
use paddock_types::cluster::{ClusterKind, ClusterPhase, Condition, ConditionStatus};
use paddock_types::machine::MachineState;
use paddock_types::{ClusterId, TenantId};

use super::{cluster_ref, store_error, Drivers, Settings, DRIVER_NOT_CONFIGURED, DRIVER_WAIT};
use crate::{Job, JobHandler, Outcome};

/// How long a cluster waiting only for its own machines (to become active, or to leave) sleeps at
/// most: each machine's transition wakes it at once; this is the fallback.
const MACHINE_WAIT: Duration = Duration::from_secs(60);

const CONTROL_PLANE_READY: &str = "ControlPlaneReady";

const NAMESPACE_READY: &str = "NamespaceReady";

const MACHINES_ALLOCATED: &str = "MachinesAllocated";

const NODES_READY: &str = "NodesReady";

/// `NodesReady`'s reason when the Node of an active machine is not Ready.
const NODE_NOT_READY: &str = "NodeNotReady";

const STACK_READY: &str = "StackReady";

const SLURM_READY: &str = "SlurmReady";

const RAY_READY: &str = "RayReady";
/// A Slurm cluster's nodes as its Slurm sees them: false while Slurm holds the node of an active
/// machine down. Not required for `Ready`: Slurm runs, and resuming a node is the tenant's call.
const SLURM_NODES_UP: &str = "SlurmNodesUp";
/// `SlurmNodesUp`'s reason (and its event's) while a node is down.
const SLURM_NODE_DOWN: &str = "SlurmNodeDown";

const READY: &str = "Ready";

const MACHINES_RELEASED: &str = "MachinesReleased";

const SLURM_REMOVED: &str = "SlurmRemoved";

const RAY_REMOVED: &str = "RayRemoved";

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
    /// A driver found a fault that waiting does not heal (a crash-looping slurmctld): the
    /// cluster is `degraded`, whatever its generation.
    faulted: bool,
    /// An autoscaled pool is on its way to a new target (machines to allocate, provision or
    /// release): the cluster is `updating`, not `degraded`, until it gets there.
    scaling: bool,
}

impl Observed {
    fn set(&mut self, type_: &str, ok: bool, reason: &str, message: &str) {
        let status = ConditionStatus::from(ok);
        set_condition(&mut self.conditions, type_, status, reason, message, self.now);
    }

    fn has_reason(&self, type_: &str, reason: &str) -> bool {
        self.conditions.iter().any(|c| c.type_ == type_ && c.reason == reason)
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
            faulted: false,
            scaling: autoscale::scaling(&pools, &held),
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
        let Some(cluster) = store::get(&mut tx, tenant, id).await? else {
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
        let open = self.remediations(cluster, held, observed).await?;
        let allocating = remediation::for_allocation(held, pools, &open);
        let awaiting = remediation::awaiting_spare(held, pools, &open);
        let capacity_wait = self.machines(cluster, pools, &allocating, &awaiting, observed).await?;
        let access = self.tenant_access(run, &cp)?;
        if let Some(access) = &access {
            self.start_provisioning(held).await?;
            self.drain_failed(kube, cluster, pools, held, access, &open).await;
        }
        let registered = match &access {
            Some(access) if held.iter().any(|m| m.state == MachineState::Active) => {
                Some(kube.nodes.registered_nodes(access).await.map_err(|e| Stop::Driver(NODES_READY, e))?)
            }
            _ => None,
        };
        let ready_for_work = remediation::for_readiness(held, pools, &open);
        let pool_status = nodes(pools, &ready_for_work, registered.as_deref(), observed);
        remediation::condition(&open, capacity_wait.is_some(), observed);
        if let Some(registered) = &registered {
            self.node_health(held, registered).await?;
        }
        match &access {
            Some(access) => {
                if self.stack(kube, cluster, access, observed).await? {
                    self.slurm(kube, run, access, observed).await?;
                    if observed.is_true(SLURM_READY) {
                        self.slurm_health(kube, cluster, held, access, observed).await?;
                        self.wake_identity_sync(cluster).await?;
                    }
                    self.ray(kube, run, access, observed).await?;
                } else if cluster.spec.kind == ClusterKind::Slurm && cluster.spec.slurm.is_some() {
                    observed.set(SLURM_READY, false, "WaitingForStack", "waiting for the tenant base stack");
                } else if cluster.spec.kind == ClusterKind::Ray {
                    observed.set(RAY_READY, false, "WaitingForStack", "waiting for the tenant base stack");
                }
            }
            None => {
                let message = "waiting for the control plane";
                observed.set(STACK_READY, false, "WaitingForControlPlane", message);
                if cluster.spec.kind == ClusterKind::Slurm {
                    observed.set(SLURM_READY, false, "WaitingForControlPlane", message);
                }
                if cluster.spec.kind == ClusterKind::Ray {
                    observed.set(RAY_READY, false, "WaitingForControlPlane", message);
                }
            }
        }
        if at_rest(cluster) && !observed.changed.is_empty() {
            drift_corrected(cluster, observed);
        }
        let quiet = mode == Mode::DriftCheck;
        self.status(cluster, pools, &pool_status, observed, capacity_wait.filter(|_| cp.ready), quiet).await
    }

    async fn no_driver(&self, tenant: TenantId, id: ClusterId) -> Outcome {
        let message = "no Kubernetes driver is configured (PADDOCK_KUBE_DRIVER=none); the cluster waits";
        let result = async {
            let mut conn = self.services.store().conn().await?;
            // A lost race on the status guard means another writer moved on: read again, once
            // per attempt (the next run re-reads anyway).
            for _ in 0..3 {
                let Some(current) = store::get(&mut conn, tenant, id).await? else {
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

fn bad_payload(e: serde_json::Error) -> BoxFuture<'static, Outcome> {
    let detail = format!("the job's payload is not a cluster's: {e}");
    async move { Outcome::fail("bad_job", detail) }.boxed()
}
