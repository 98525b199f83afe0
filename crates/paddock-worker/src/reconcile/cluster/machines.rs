//! Step 3: machines released, allocated all or nothing, and handed to provisioning.

use std::time::Duration;

use chrono::Utc;
use paddock_domain::cluster::{set_condition, Cluster, NodePool};
use paddock_domain::driver::RegisteredNode;
use paddock_domain::machine::HELD;
use paddock_store::allocation::{self, Allocation, HeldMachine, Need};
use paddock_store::{lifecycle, node_pool, operation, remediation, Conn, StoreError};
use paddock_types::cluster::{ConditionStatus, NodePoolStatus};
use paddock_types::machine::MachineState;
use paddock_types::{MachineId, NodePoolId};

use crate::metrics::{self};

use super::{ClusterReconciler, Observed, Stop, MACHINES_ALLOCATED, NODES_READY, NODE_NOT_READY};

/// How long a cluster waiting for machines sleeps at most: a machine that becomes available
/// wakes the first waiting cluster of its class at once; this is the fallback. A cluster held
/// back by an earlier one sleeps only until that one's head timeout ends.
const CAPACITY_WAIT: Duration = Duration::from_secs(60);

/// What a tenant is told while its cluster waits for machines: nothing about the fleet, free
/// capacity or other tenants (docs/architecture.md, cluster reconciler step 3).
const TENANT_WAITING: &str = "waiting for machines of the requested class to become available; \
    the cluster continues by itself";

impl ClusterReconciler {
    /// Step 3, once the control plane is up: allocated machines, which wait for it, go on to be
    /// provisioned by their own jobs.
    pub(super) async fn start_provisioning(&self, held: &[HeldMachine]) -> Result<(), StoreError> {
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

    /// Releases surplus machines, marks emptied deleting pools deleted and allocates the
    /// shortfall, in one transaction, then hands allocated machines over in a second one; while
    /// the cluster waits for capacity (or quota), how long until it tries again. `held` are the
    /// machines the pools count; `awaiting`, those that wait for a spare (see [`MachinePlan::of`]).
    pub(super) async fn machines(
        &self,
        cluster: &Cluster,
        pools: &[NodePool],
        held: &[HeldMachine],
        awaiting: &[HeldMachine],
        observed: &mut Observed,
    ) -> Result<Option<Duration>, Stop> {
        let plan = MachinePlan::of(pools, held, awaiting);
        if plan.release.is_empty() && plan.gone_pools.is_empty() && plan.needs.is_empty() {
            observed.set(MACHINES_ALLOCATED, true, "Allocated", "");
            return Ok(None);
        }
        let mut tx = self.services.store().begin().await?;
        for m in &plan.release {
            // A machine under remediation leaves for maintenance, and its ledger says so.
            remediation::keep_out_of_service(&mut tx, m.id).await?;
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
            operation::succeed(&mut tx, pool.uuid(), None, &[operation::done(operation::step::RELEASE_MACHINES)])
                .await?;
        }
        // The allocation comes last: it takes its classes' lock, which every allocator of those
        // classes waits for until this transaction commits.
        let asked = if plan.needs.is_empty() {
            observed.set(MACHINES_ALLOCATED, true, "Allocated", "");
            Asked::default()
        } else {
            self.allocate(&mut tx, cluster, &plan.needs, observed).await?
        };
        tx.commit().await.map_err(StoreError::from)?;
        if let Some((machines, waited)) = asked.allocated {
            let mut tx = self.services.store().begin().await?;
            allocation::hand_over(&mut tx, &machines, &plan.needs).await?;
            tx.commit().await.map_err(StoreError::from)?;
            metrics::observe(|w| w.allocated(waited));
        }
        Ok(asked.waiting)
    }

    /// Allocates `needs` all or nothing in the caller's transaction (see [`Asked`]).
    async fn allocate(
        &self,
        conn: &mut Conn,
        cluster: &Cluster,
        needs: &[Need],
        observed: &mut Observed,
    ) -> Result<Asked, StoreError> {
        let (tenant, id, timeout) = (cluster.tenant_id, cluster.id, self.settings.allocation_head_timeout);
        let waited = allocation::waited(conn, tenant, id).await?;
        let outcome = allocation::allocate(conn, self.services.ledger_key(), tenant, id, needs, timeout).await?;
        // The details are the provider's (logged); the tenant's message says only what to expect.
        match &outcome {
            Allocation::Allocated(machines) => {
                // The spares of the cluster's remediations, linked in the allocation's transaction.
                remediation::link_spares(conn, tenant, id, machines).await?;
                observed.set(MACHINES_ALLOCATED, true, "Allocated", "");
                let message = format!("{} machine(s) allocated", machines.len());
                observed.events.push(("Normal", "MachinesAllocated", message));
                return Ok(Asked { waiting: None, allocated: Some((machines.clone(), waited)) });
            }
            Allocation::Behind { until, .. } => {
                tracing::info!(tenant = %tenant, cluster = %id, outcome = ?outcome, "the cluster waits for machines");
                self.insufficient(observed, "InsufficientCapacity", TENANT_WAITING);
                // Nothing wakes it when the one in front stops holding it back: it wakes itself.
                let left = (*until - Utc::now()).to_std().unwrap_or_default();
                let waiting = Some(CAPACITY_WAIT.min(left + Duration::from_millis(100)));
                return Ok(Asked { waiting, allocated: None });
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
        Ok(Asked { waiting: Some(CAPACITY_WAIT), allocated: None })
    }

    fn insufficient(&self, observed: &mut Observed, reason: &'static str, message: &str) {
        let was = observed.conditions.iter().find(|c| c.type_ == MACHINES_ALLOCATED).map(|c| c.reason.clone());
        observed.set(MACHINES_ALLOCATED, false, reason, message);
        if was.as_deref() != Some(reason) {
            observed.events.push(("Warning", reason, message.to_owned()));
        }
    }
}

/// How an allocation request in step 3 ended, for the run.
#[derive(Default)]
struct Asked {
    /// While the cluster waits for capacity (or quota): how long until it tries again.
    waiting: Option<Duration>,
    /// The machines it got, and how long it had waited for them.
    allocated: Option<(Vec<MachineId>, Duration)>,
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
    /// The plan for `held`, the machines the pools count, and `awaiting`, the machines under
    /// remediation that wait for a spare (oldest first): the shortfall gives spares to the oldest;
    /// those beyond it get none (the pool holds enough without them: a scale-down overtook their
    /// failure, or more failed than it lacks), so they are released at once, into maintenance
    /// (`keep_out_of_service`), instead of waiting for ever.
    fn of(pools: &[NodePool], held: &[HeldMachine], awaiting: &[HeldMachine]) -> Self {
        let mut plan = Self::default();
        for pool in pools {
            // An autoscaled pool's target is its status (`desired_count`), anyone else's `count`.
            let want = if pool.deleting { 0 } else { pool.status.desired_count as usize };
            let mut holding: Vec<&HeldMachine> =
                held.iter().filter(|m| m.node_pool_id == pool.id && HELD.contains(&m.state)).collect();
            let shortfall = want.saturating_sub(holding.len());
            plan.release.extend(awaiting.iter().filter(|m| m.node_pool_id == pool.id).skip(shortfall).cloned());
            if holding.len() > want {
                // Give back the machines that serve least first: not yet provisioned, then
                // provisioning, then active (those a scale-down found idle first); the newest
                // first within each.
                let busy = |m: &HeldMachine| !m.node_name.as_ref().is_some_and(|n| pool.release_first.contains(n));
                holding.sort_by_key(|m| (release_rank(m.state), busy(m), std::cmp::Reverse(m.id.uuid())));
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

/// Step 3's `NodesReady`: every wanted node ready, every held machine active, and the Node of
/// every active machine Ready in the tenant cluster (`registered`: the tenant cluster's Nodes, read
/// when it answers); each pool's status. An active machine whose Node went NotReady (or was
/// removed) makes the condition false with `NodeNotReady` and is not counted ready; what follows
/// is the health checks' to decide, not this step's.
pub(super) fn nodes<'a>(
    pools: &'a [NodePool],
    held: &[HeldMachine],
    registered: Option<&[RegisteredNode]>,
    observed: &mut Observed,
) -> Vec<(&'a NodePool, NodePoolStatus)> {
    let lost: Vec<&HeldMachine> = match registered {
        Some(nodes) => held.iter().filter(|m| m.state == MachineState::Active && !node_ready(m, nodes)).collect(),
        None => Vec::new(),
    };
    let pool_status = pool_statuses(pools, held, &lost);
    let (ready_nodes, wanted_nodes) = pool_status
        .iter()
        .filter(|(p, _)| !p.deleting)
        .fold((0, 0), |(r, w), (p, s)| (r + s.ready.min(p.status.desired_count), w + p.status.desired_count));
    let nodes_ready =
        ready_nodes == wanted_nodes && lost.is_empty() && held.iter().all(|m| m.state == MachineState::Active);
    let mut message = format!("{ready_nodes} of {wanted_nodes} nodes ready");
    let reason = if nodes_ready {
        "Ready"
    } else if lost.is_empty() {
        "Provisioning"
    } else {
        let names: Vec<String> = lost.iter().map(|m| m.node_name.clone().unwrap_or_else(|| m.id.to_string())).collect();
        message.push_str(&format!("; not ready: {}", names.join(", ")));
        NODE_NOT_READY
    };
    observed.set(NODES_READY, nodes_ready, reason, &message);
    pool_status
}

/// Whether the Node of active machine `m` is registered and Ready.
fn node_ready(m: &HeldMachine, nodes: &[RegisteredNode]) -> bool {
    let uuid = m.system_uuid.as_deref().unwrap_or_default().trim();
    !uuid.is_empty() && nodes.iter().any(|n| n.ready && n.system_uuid.eq_ignore_ascii_case(uuid))
}

/// Each pool's ready (active, its Node not `lost`) and allocated (held) counts and its conditions.
fn pool_statuses<'a>(
    pools: &'a [NodePool],
    held: &[HeldMachine],
    lost: &[&HeldMachine],
) -> Vec<(&'a NodePool, NodePoolStatus)> {
    let now = Utc::now();
    pools
        .iter()
        .map(|pool| {
            let mine = held.iter().filter(|m| m.node_pool_id == pool.id);
            let pool_lost = lost.iter().filter(|l| l.node_pool_id == pool.id).count();
            let active = mine.clone().filter(|m| m.state == MachineState::Active).count();
            let ready = active - pool_lost;
            let allocated = mine.filter(|m| HELD.contains(&m.state)).count();
            let mut conditions = pool.status.conditions.clone();
            let want = pool.status.desired_count as usize;
            let (status, reason) = match (ready >= want, pool_lost) {
                (true, _) => (ConditionStatus::True, "Ready"),
                (false, 0) => (ConditionStatus::False, "Provisioning"),
                (false, _) => (ConditionStatus::False, NODE_NOT_READY),
            };
            let message = format!("{ready} of {want} nodes ready");
            set_condition(&mut conditions, NODES_READY, status, reason, &message, now);
            let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
            let status = NodePoolStatus {
                ready: count(ready),
                allocated: count(allocated),
                desired_count: pool.status.desired_count,
                conditions,
            };
            (pool, status)
        })
        .collect()
}
