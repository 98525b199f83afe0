//! Remediations of the cluster's machines (docs/architecture.md, "The state machines"): a
//! machine reported `failed` (or that its tenant asked to replace) is drained (Slurm, then the
//! Node), leaves its pool's count so that step 3 allocates a spare of its class through the
//! normal allocation, and, once the spare is active, is released into maintenance. Each move is
//! one guarded write, so a run repeated after a crash neither allocates twice nor loses a machine.

use paddock_domain::cluster::{Cluster, NodePool};
use paddock_domain::driver::{KubeDrivers, NodeRef, SlurmVersion, TenantAccess};
use paddock_domain::machine::HELD;
use paddock_store::allocation::HeldMachine;
use paddock_store::{operation, remediation, StoreError};
use paddock_types::cluster::ClusterKind;
use paddock_types::machine::MachineState;
use paddock_types::remediation::{RemediationState, RemediationView};
use sqlx::{Acquire, PgConnection};

use super::{ClusterReconciler, Observed, NODES_READY};

/// `NodesReady`'s reason while a failed machine waits for a spare.
pub(super) const AWAITING_SPARE: &str = "AwaitingSpare";

/// `NodesReady`'s reason while a failed machine of the system pool waits for an operator.
const AWAITING_OPERATOR: &str = "AwaitingOperator";

/// What the tenant is told while a spare is awaited: nothing about the fleet.
const TENANT_AWAITING_SPARE: &str = "a machine failed and is being replaced; its replacement waits for a machine \
    of its class to become available; the cluster continues by itself";

/// What the tenant is told about a failed machine of its system pool.
const TENANT_AWAITING_OPERATOR: &str = "a machine of the system pool failed; it carries Slurm's control pods and \
    their volumes, so it is not replaced automatically: the provider's operators replace it";

impl ClusterReconciler {
    /// Ends the remediations whose machine left the tenancy (a deleting cluster's, each run). A
    /// cluster without open remediations costs one read and no transaction.
    pub(super) async fn end_remediations(&self, cluster: &Cluster) -> Result<(), StoreError> {
        let mut conn = self.services.store().conn().await?;
        end_departed(&mut conn, cluster).await.map(drop)
    }

    /// Ends the remediations whose machine left the tenancy, releases the machines whose spare is
    /// active, puts back in line those whose spare was lost; the open remediations after that.
    /// One connection; a transaction only where a row moves.
    pub(super) async fn remediations(
        &self,
        cluster: &Cluster,
        held: &[HeldMachine],
        observed: &mut Observed,
    ) -> Result<Vec<RemediationView>, StoreError> {
        let mut conn = self.services.store().conn().await?;
        // A tenant's `replace` operation succeeds when its machine has left (or is leaving).
        let open = end_departed(&mut conn, cluster).await?;
        let mut moved = false;
        for r in open.iter().filter(|r| r.state == RemediationState::Replacing) {
            let Some(spare) = r.spare_machine_id else { continue };
            match held.iter().find(|m| m.id == spare).map(|m| m.state) {
                Some(MachineState::Active) => {
                    let mut tx = self.services.store().begin().await?;
                    if remediation::release_replaced(&mut tx, self.services.ledger_key(), r).await? {
                        let done = [operation::done(operation::step::RECONCILE)];
                        operation::succeed(&mut tx, r.id, None, &done).await?;
                        tx.commit().await?;
                        let message = format!("machine {} is replaced by machine {spare}", r.machine_id);
                        observed.events.push(("Normal", "MachineReplaced", message));
                        moved = true;
                    }
                }
                // Still provisioning: nothing to write.
                Some(state) if HELD.contains(&state) => {}
                _ => moved |= remediation::spare_lost(&mut conn, r.id, spare).await?,
            }
        }
        if !moved {
            return Ok(open);
        }
        remediation::open_of_cluster(&mut conn, cluster.tenant_id, cluster.id).await
    }

    /// Drains the failed machines still serving (Slurm first, then the Node: cordoned, its pods
    /// evicted) so that no new work lands on them, best effort: the release drains them again.
    /// A machine of the system pool is left alone: its Node carries Slurm's control pods.
    pub(super) async fn drain_failed(
        &self,
        kube: &KubeDrivers,
        cluster: &Cluster,
        pools: &[NodePool],
        held: &[HeldMachine],
        access: &TenantAccess,
        open: &[RemediationView],
    ) {
        let draining = [RemediationState::AwaitingSpare, RemediationState::Replacing];
        for r in open.iter().filter(|r| draining.contains(&r.state)) {
            let Some(m) = held.iter().find(|m| m.id == r.machine_id && m.state == MachineState::Active) else {
                continue;
            };
            let Some(pool) = pools.iter().find(|p| p.id == m.node_pool_id) else { continue };
            let node = NodeRef {
                machine_id: m.id,
                node_pool_id: pool.id,
                pool_name: pool.spec.name.clone(),
                node_name: m.node_name.clone().unwrap_or_else(|| paddock_domain::driver::node_name(m.id)),
                system_uuid: m.system_uuid.clone().unwrap_or_default(),
                labels: pool.spec.labels.clone(),
                taints: pool.spec.taints.clone(),
            };
            if let (ClusterKind::Slurm, Some(slurm)) = (cluster.spec.kind, &cluster.spec.slurm) {
                let version =
                    SlurmVersion { stack_version: cluster.stack_version.clone(), version: slurm.version.clone() };
                if let Err(e) = kube.slurm.drain_node(access, &version, &node.node_name).await {
                    let chain = paddock_domain::error::chain(&e);
                    tracing::warn!(machine.id = %m.id, "the Slurm node of failed machine {} is not drained yet: {chain}", m.id);
                }
            }
            if let Err(e) = kube.nodes.drain_node(access, &node).await {
                let chain = paddock_domain::error::chain(&e);
                tracing::warn!(machine.id = %m.id, "the Node of failed machine {} is not drained yet: {chain}", m.id);
            }
        }
    }
}

/// The machines step 3 counts in their pools: without those being replaced (awaiting or
/// provisioning their spare, or released for it: a run that released one read it still
/// active), so that their pool's count asks for a spare and never gives a spare back as
/// surplus. A machine of the
/// system pool waiting for an operator stays counted (no spare is allocated for it), and so does
/// one of a deleting pool: it is released with its pool (into maintenance, see
/// `keep_out_of_service`).
pub(super) fn for_allocation(held: &[HeldMachine], pools: &[NodePool], open: &[RemediationView]) -> Vec<HeldMachine> {
    let states = [RemediationState::AwaitingSpare, RemediationState::Replacing, RemediationState::Releasing];
    without(held, pools, open, &states)
}

/// The machines whose remediation awaits a spare, oldest remediation first (the order in which
/// the allocation links spares, `remediation::link_spares`); none of a deleting pool, which gives
/// back all it holds anyway. Step 3 releases those its pool's shortfall leaves without a spare.
pub(super) fn awaiting_spare(held: &[HeldMachine], pools: &[NodePool], open: &[RemediationView]) -> Vec<HeldMachine> {
    let mut waiting: Vec<&RemediationView> =
        open.iter().filter(|r| r.state == RemediationState::AwaitingSpare).collect();
    waiting.sort_by_key(|r| (r.started_at, r.id));
    waiting
        .iter()
        .filter_map(|r| held.iter().find(|m| m.id == r.machine_id && HELD.contains(&m.state)))
        .filter(|m| !pools.iter().any(|p| p.id == m.node_pool_id && p.deleting))
        .cloned()
        .collect()
}

/// The machines `NodesReady` counts: none under remediation is ready for work.
pub(super) fn for_readiness(held: &[HeldMachine], pools: &[NodePool], open: &[RemediationView]) -> Vec<HeldMachine> {
    let states = [
        RemediationState::AwaitingSpare,
        RemediationState::Replacing,
        RemediationState::Releasing,
        RemediationState::NeedsOperator,
    ];
    without(held, pools, open, &states)
}

fn without(
    held: &[HeldMachine],
    pools: &[NodePool],
    open: &[RemediationView],
    states: &[RemediationState],
) -> Vec<HeldMachine> {
    held.iter()
        .filter(|m| {
            let deleting = pools.iter().any(|p| p.id == m.node_pool_id && p.deleting);
            deleting || !open.iter().any(|r| r.machine_id == m.id && states.contains(&r.state))
        })
        .cloned()
        .collect()
}

/// `NodesReady` while a failed machine waits for a spare (`waiting`: the allocation found none)
/// or for an operator; nothing else changes it.
pub(super) fn condition(open: &[RemediationView], waiting: bool, observed: &mut Observed) {
    if open.iter().any(|r| r.state == RemediationState::NeedsOperator) {
        observed.set(NODES_READY, false, AWAITING_OPERATOR, TENANT_AWAITING_OPERATOR);
    } else if waiting && open.iter().any(|r| r.state == RemediationState::AwaitingSpare) {
        observed.set(NODES_READY, false, AWAITING_SPARE, TENANT_AWAITING_SPARE);
    }
}

/// Reads the cluster's open remediations and ends those whose machine left the tenancy (with
/// their operations), in one transaction only when there are such; the open ones left.
async fn end_departed(conn: &mut PgConnection, cluster: &Cluster) -> Result<Vec<RemediationView>, StoreError> {
    let open = remediation::open_with_departure(conn, cluster.tenant_id, cluster.id).await?;
    if !open.iter().any(|(_, departed)| *departed) {
        return Ok(open.into_iter().map(|(r, _)| r).collect());
    }
    let mut tx = conn.begin().await?;
    let ended = remediation::end_departed(&mut tx, cluster.tenant_id, cluster.id).await?;
    for id in &ended {
        operation::succeed(&mut tx, *id, None, &[operation::done(operation::step::RECONCILE)]).await?;
    }
    tx.commit().await?;
    Ok(open.into_iter().map(|(r, _)| r).filter(|r| !ended.contains(&r.id)).collect())
}
