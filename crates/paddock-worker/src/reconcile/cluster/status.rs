//! Step 6: readiness, the phase and the status written; what a failed step leaves in it.

use std::time::Duration;

use paddock_domain::cluster::{Cluster, NodePool};
use paddock_domain::driver::DriverError;
use paddock_store::{cluster as store, cluster_event, drift, node_pool, operation, StoreError};
use paddock_types::cluster::{ClusterKind, ClusterPhase, Condition, ConditionStatus, NodePoolStatus};
use paddock_types::operation::{OperationState, OperationStep};

use crate::metrics::{self, Driver};
use crate::reconcile::store_error;
use crate::{failed_problem, Outcome};

use super::{
    ClusterReconciler, Observed, Stop, CONTROL_PLANE_READY, MACHINES_ALLOCATED, MACHINE_WAIT, NAMESPACE_READY,
    NODES_READY, NODE_NOT_READY, RAY_READY, READY, SLURM_READY, STACK_READY,
};

/// How long a cluster stopped on a permanent error waits before it tries again by itself (a
/// spec change tries at once).
const FAILED_WAIT: Duration = Duration::from_secs(3600);

/// What a tenant is told when a platform step fails for a while (the details are the provider's).
const TENANT_RETRYING: &str = "a platform step is being retried; the cluster continues by itself";

/// What a tenant is told when a platform step fails for good.
const TENANT_FAILED: &str = "the cluster could not be set up; the provider has the cause, contact them";

impl ClusterReconciler {
    /// Step 6: `Ready` from the required conditions, the phase, and the status written; the
    /// outcome says when to run again.
    pub(super) async fn status(
        &self,
        cluster: &Cluster,
        pools: &[NodePool],
        pool_status: &[(&NodePool, NodePoolStatus)],
        observed: &mut Observed,
        capacity_wait: Option<Duration>,
        quiet: bool,
    ) -> Result<Outcome, Stop> {
        let mut required = vec![NAMESPACE_READY, CONTROL_PLANE_READY, MACHINES_ALLOCATED, NODES_READY, STACK_READY];
        match cluster.spec.kind {
            ClusterKind::Slurm => required.push(SLURM_READY),
            ClusterKind::Ray => required.push(RAY_READY),
            ClusterKind::Kubernetes => {}
        }
        let missing: Vec<&str> = required.iter().copied().filter(|t| !observed.is_true(t)).collect();
        let ready = missing.is_empty();
        let message = if ready { String::new() } else { format!("not ready: {}", missing.join(", ")) };
        observed.set(READY, ready, if ready { "Ready" } else { "Reconciling" }, &message);
        let (phase, observed_generation) = phase(cluster, ready, observed.faulted, observed.scaling);
        if ready && !Observed::was_true(&cluster.status.conditions, READY) {
            observed.events.push(("Normal", "ClusterReady", "the cluster is ready".to_owned()));
        }
        let outcome = match capacity_wait {
            _ if ready => Outcome::Done,
            Some(after) => Outcome::wait(after, "insufficient_capacity", "waiting for machines"),
            // Each of its machines wakes the cluster when it becomes active or fails (and a
            // released one when it has left): nothing to poll for.
            // A Node that went NotReady wakes nothing: it is polled for.
            None if waits_for_machines(&missing) && !observed.has_reason(NODES_READY, NODE_NOT_READY) => {
                Outcome::wait(MACHINE_WAIT, "waiting_for_machines", message)
            }
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

    /// Writes the run's status, pool counts, events and operation progress in one transaction;
    /// false when the status guard was lost (nothing written).
    #[expect(clippy::too_many_arguments, reason = "one run's whole status, written in one transaction")]
    pub(super) async fn write(
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

    /// A driver failed at `condition`'s step: transient ones retry with backoff, permanent ones
    /// stop the cluster in `failed` with the reason, failing its open operations.
    pub(super) async fn driver_failed(
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
}

/// Whether a run that is not ready waits only for its machines: nodes not ready, and nothing
/// missing that does not follow from them (Slurm waits for its nodes).
fn waits_for_machines(missing: &[&str]) -> bool {
    missing.contains(&NODES_READY) && missing.iter().all(|t| [NODES_READY, SLURM_READY].contains(t))
}

/// The phase and observed generation of a run that found the cluster `ready` or not (docs/api.md);
/// a run that found a fault waiting does not heal (`faulted`) makes it `degraded`, also while it
/// is first provisioned or updated; an autoscaled pool on its way to a new target (`scaling`)
/// makes it `updating`.
fn phase(cluster: &Cluster, ready: bool, faulted: bool, scaling: bool) -> (ClusterPhase, i64) {
    let before = cluster.status.observed_generation;
    if ready {
        (ClusterPhase::Ready, cluster.generation)
    } else if faulted {
        (ClusterPhase::Degraded, before)
    } else if before == 0 {
        (ClusterPhase::Provisioning, 0)
    } else if cluster.generation > before || scaling {
        (ClusterPhase::Updating, before)
    } else {
        (ClusterPhase::Degraded, before)
    }
}

/// Whether a run found the cluster and its pools exactly as their stored status says, with
/// nothing to tell: then writing would change nothing.
pub(super) fn unchanged(
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
pub(super) fn drift_corrected(cluster: &Cluster, observed: &mut Observed) {
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
pub(super) fn spread(interval: Duration) -> Duration {
    interval.mul_f64(rand::Rng::random_range(&mut rand::rng(), 0.9..1.1))
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

fn step_name(condition: &str) -> &'static str {
    match condition {
        NAMESPACE_READY => "namespace",
        CONTROL_PLANE_READY => "control_plane",
        MACHINES_ALLOCATED => "machines",
        NODES_READY => "nodes",
        STACK_READY => "stack",
        SLURM_READY => "slurm",
        RAY_READY => "ray",
        _ => "other",
    }
}
