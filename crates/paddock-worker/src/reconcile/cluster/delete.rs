//! Deletion: Slurm (or Ray) removed, every machine released, the control plane and the namespace gone.

use std::time::Duration;

use paddock_domain::driver::{KubeDrivers, Removal};
use paddock_domain::machine::HELD;
use paddock_store::allocation::HeldMachine;
use paddock_store::{cluster as store, cluster_event, lifecycle, operation, StoreError};
use paddock_types::cluster::{ClusterKind, ClusterPhase, ConditionStatus};
use paddock_types::operation::{OperationState, OperationStep};

use crate::reconcile::open_access;
use crate::Outcome;

use super::status::unchanged;
use super::{
    ClusterReconciler, Observed, Run, Stop, CONTROL_PLANE_READY, MACHINES_RELEASED, MACHINE_WAIT, NAMESPACE_READY,
    RAY_READY, RAY_REMOVED, READY, SLURM_READY, SLURM_REMOVED,
};

impl ClusterReconciler {
    /// Deletion: Slurm removed, every machine released to cleaning, then the control plane and the
    /// namespace removed; the cluster is marked deleted only when all of that is confirmed.
    pub(super) async fn delete(
        &self,
        kube: &KubeDrivers,
        run: &Run<'_>,
        observed: &mut Observed,
    ) -> Result<Outcome, Stop> {
        let Run { cluster, reference, held, sealed, .. } = *run;
        // Remediations whose machine has left end here too (the machine went to maintenance).
        self.end_remediations(cluster).await?;
        // Slurm goes first, while its nodes still exist, so nothing of it outlives them; then the
        // machines, through cleaning.
        let endpoint = cluster.status.endpoints.kubernetes_api.as_deref();
        let access =
            open_access(self.services.cipher(), reference.clone(), endpoint, sealed.admin_kubeconfig.as_deref())?;
        // Once removed, Slurm is not asked again: the control plane's deletion that follows takes
        // the tenant API server with it, and a later run could not reach it.
        // A Ray cluster's RayCluster likewise goes before the machines are released.
        let workload = match cluster.spec.kind {
            ClusterKind::Slurm => Some((SLURM_REMOVED, SLURM_READY, "Slurm")),
            ClusterKind::Ray => Some((RAY_REMOVED, RAY_READY, "Ray")),
            ClusterKind::Kubernetes => None,
        };
        if let (Some((removed, condition, what)), Some(access)) = (workload, &access) {
            if observed.is_true(removed) {
                return self.release_and_remove(kube, run, observed).await;
            }
            let removal = match cluster.spec.kind {
                ClusterKind::Ray => kube.ray.remove_ray(access).await,
                _ => kube.slurm.remove_slurm(access).await,
            };
            match removal.map_err(|e| Stop::Driver(condition, e))? {
                Removal::Gone => {
                    observed.set(removed, true, "Removed", "");
                    if held.is_empty() {
                        // Recorded before the control plane goes (and the tenant API server with
                        // it), so a crash cannot lose it.
                        let (stage, poll) = (DeleteStage::Machines, self.settings.poll);
                        return self.deleting(run, observed, stage, &format!("{what} removed"), poll).await;
                    }
                    // The machines' release goes on in this run; its status write records this
                    // first (a crash before it asks again, while the tenant API server is there).
                }
                Removal::Deleting => {
                    let (stage, poll) = (DeleteStage::Workload, self.settings.poll);
                    return self.deleting(run, observed, stage, &format!("deleting {what}"), poll).await;
                }
            }
        }
        self.release_and_remove(kube, run, observed).await
    }

    /// Deletion once Slurm or Ray is gone (or the cluster has neither): every machine released,
    /// then the control plane and the namespace removed.
    async fn release_and_remove(
        &self,
        kube: &KubeDrivers,
        run: &Run<'_>,
        observed: &mut Observed,
    ) -> Result<Outcome, Stop> {
        let Run { cluster, reference, held, .. } = *run;
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
}

/// Where a deletion is: the step being carried out (the reconciler's order in docs/architecture.md, reversed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum DeleteStage {
    /// Slurm's (or Ray's) removal.
    Workload,
    Machines,
    ControlPlane,
    Namespace,
    Gone,
}

/// A deletion's steps: the ones before `stage` succeeded (each at its condition's transition
/// where it has one), `stage` running; Slurm's removal only for a Slurm cluster, Ray's only for
/// a Ray cluster.
fn delete_steps(kind: ClusterKind, observed: &Observed, stage: DeleteStage) -> Vec<OperationStep> {
    let transition = |type_: &str| {
        observed
            .conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == ConditionStatus::True)
            .map(|c| c.last_transition_time)
    };
    let workload = match kind {
        ClusterKind::Ray => Some(("remove_ray", transition(RAY_REMOVED))),
        ClusterKind::Slurm => Some(("remove_slurm", transition(SLURM_REMOVED))),
        ClusterKind::Kubernetes => None,
    };
    let all = [
        (DeleteStage::Workload, workload.map_or("remove_slurm", |w| w.0), workload.and_then(|w| w.1)),
        (DeleteStage::Machines, "release_machines", transition(MACHINES_RELEASED)),
        (DeleteStage::ControlPlane, "delete_control_plane", None),
        (DeleteStage::Namespace, "delete_namespace", None),
    ];
    all.into_iter()
        .filter(|(s, ..)| workload.is_some() || *s != DeleteStage::Workload)
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
