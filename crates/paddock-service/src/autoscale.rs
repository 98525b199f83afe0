//! Elastic pools (docs/tenants.md, "Elastic pools"): what a tenant's patch may do to an
//! autoscaled pool, and the write of an autoscaler's decision: the pool's target (status: its
//! generation and etag do not move), an operation with the decision's reason, a cluster event,
//! and the cluster's reconcile job that reaches the target through the pool-resize machinery,
//! all in one transaction.

use paddock_domain::autoscale::{Direction, Scale, ScaleMemory, DEMAND_FITS};
use paddock_domain::cluster::{NodePool, NodePoolSpec};
use paddock_domain::{Error, Result};
use paddock_store::node_pool::{self, ScaleWrite};
use paddock_store::{cluster_event, Txn};
use paddock_types::cluster::{Condition, ConditionStatus};
use paddock_types::operation::OperationView;
use paddock_types::{ClusterId, TenantId};

use crate::operation::{accept_explained, Accepted, Target};
use crate::Services;

/// The operation kind of a scaling decision.
pub const NODE_POOL_SCALE: &str = "node_pool_scale";

/// A patched pool spec as it is stored, and an autoscaled pool's target after the patch: 409
/// `autoscaled_count` when the patch sets `count` on a pool that stays autoscaled (its size is
/// the autoscaler's). Turning autoscaling off keeps the current target as `count` unless the
/// patch sets one; new bounds clamp `count` (the initial size) and the target into them.
pub(crate) fn patched(
    current: &NodePool,
    mut spec: NodePoolSpec,
    patch: &serde_json::Value,
) -> Result<(NodePoolSpec, Option<u32>)> {
    let sets_count = patch.get("count").is_some_and(|c| !c.is_null());
    let Some(a) = spec.autoscaling else {
        if current.spec.autoscaling.is_some() && !sets_count {
            spec.count = current.status.desired_count;
        }
        return Ok((spec, None));
    };
    if sets_count {
        return Err(Error::conflict(
            "autoscaled_count",
            "`count` of an autoscaled pool is the autoscaler's (its target is `status.desired_count`): change \
             `autoscaling.min` or `autoscaling.max`, or turn autoscaling off (`\"autoscaling\": null`) to set `count`",
        ));
    }
    if a.min > a.max {
        // `validate_pool` names the field.
        return Ok((spec, None));
    }
    spec.count = spec.count.clamp(a.min, a.max);
    let from = if current.spec.autoscaling.is_some() { current.status.desired_count } else { current.spec.count };
    Ok((spec, Some(from.clamp(a.min, a.max))))
}

/// The event and the demand checks of an accepted patch of a pool's autoscaling.
pub(crate) async fn changed(
    conn: &mut Txn<'_>,
    current: &NodePool,
    spec: &NodePoolSpec,
    desired: Option<u32>,
) -> Result<()> {
    let (tenant, cluster) = (current.tenant_id, current.cluster_id);
    if spec.autoscaling == current.spec.autoscaling {
        return Ok(());
    }
    let message = match (spec.autoscaling, desired) {
        (Some(a), Some(target)) => {
            format!("node pool {} is autoscaled between {} and {} machines (target {target})", spec.name, a.min, a.max)
        }
        _ => format!("node pool {} is no longer autoscaled; it keeps {} machines", spec.name, spec.count),
    };
    cluster_event::insert(conn, tenant, cluster, "Normal", "NodePoolAutoscalingChanged", &message).await?;
    if spec.autoscaling.is_some() {
        paddock_store::autoscale::arm(conn, tenant, cluster, std::time::Duration::ZERO).await?;
    }
    Ok(())
}

/// One pool's decision as the autoscaler writes it.
#[derive(Debug, Clone)]
pub struct PoolDecision<'a> {
    /// The pool as the autoscaler read it (its generation guards the write).
    pub pool: &'a NodePool,
    /// Its memory after this look.
    pub memory: ScaleMemory,
    /// A new target, when it moves.
    pub scale: Option<Scale>,
    /// Idle Node names of the pool, given back first when it shrinks.
    pub idle_node_names: Vec<String>,
    /// The pool's conditions, when its `DemandFits` changes (a pending job wider than the pool's
    /// partition can ever be appeared, left or changed).
    pub conditions: Option<Vec<Condition>>,
}

impl Services {
    /// Writes the autoscaler's decisions for one cluster's pools in one transaction: each pool's
    /// target, memory and changed conditions (guarded by the generation read: a spec change in
    /// between wins), a Warning event when a pending job wider than a pool can ever be appears; for
    /// each moved target, a `node_pool_scale` operation with the reason (superseding the pool's
    /// earlier one), a cluster event, and the cluster's reconcile job. The operations created.
    pub async fn autoscale_write(
        &self,
        tenant: TenantId,
        cluster: ClusterId,
        decisions: &[PoolDecision<'_>],
    ) -> Result<Vec<OperationView>> {
        let mut tx = self.store.begin().await?;
        let mut operations = Vec::new();
        for d in decisions {
            let target = d.scale.as_ref().map_or(d.pool.status.desired_count, |s| s.to);
            let write = ScaleWrite {
                target,
                memory: d.memory,
                scaled: d.scale.is_some(),
                release_first: &d.idle_node_names,
                conditions: d.conditions.as_deref(),
            };
            if !node_pool::set_scale(&mut tx, tenant, d.pool.id, d.pool.generation, &write).await? {
                continue;
            }
            if let Some(never) = d.conditions.iter().flatten().find(|c| c.type_ == DEMAND_FITS) {
                if never.status == ConditionStatus::False {
                    // The tenant is told once per change of what can never run: the condition
                    // stays as it is while the same jobs wait.
                    let message = format!("node pool {}: {}", d.pool.spec.name, never.message);
                    cluster_event::insert(&mut tx, tenant, cluster, "Warning", "NodePoolDemandExceedsMax", &message)
                        .await?;
                }
            }
            let Some(scale) = &d.scale else { continue };
            let change = Accepted {
                kind: NODE_POOL_SCALE,
                generation: d.pool.generation,
                supersedes: &["node_pool_create"],
                reconcile: true,
            };
            let target_of = Target::Cluster { tenant, cluster, pool: Some(d.pool.id) };
            operations.push(accept_explained(&mut tx, target_of, change, &scale.reason).await?);
            let (reason, verb) = match scale.direction {
                Direction::Up => ("NodePoolScaledUp", "grows"),
                Direction::Down => ("NodePoolScaledDown", "shrinks"),
            };
            let message = format!(
                "node pool {} {verb} from {} to {} machines: {}",
                d.pool.spec.name, scale.from, scale.to, scale.reason
            );
            cluster_event::insert(&mut tx, tenant, cluster, "Normal", reason, &message).await?;
        }
        crate::commit(tx).await?;
        Ok(operations)
    }
}
