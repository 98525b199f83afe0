//! Elastic pools (docs/tenants.md, "Elastic pools"): the demand checks' jobs and what bounds an
//! autoscaler's target besides the pool's `max`. Two kinds of target share the job kind
//! [`CLUSTER_AUTOSCALE`]:
//! - **the sweep** (one job, a fixed target id, [`FLEET_TARGET_TYPE`]): every
//!   `PADDOCK_AUTOSCALE_INTERVAL` it reads every watched cluster, its pools and its machines in
//!   three statements ([`watched`]), reads each cluster's demand through its driver and decides
//!   in memory; it writes nothing, and arms a cluster's own job where a decision would write.
//!   Enqueued at every worker start (merged into the queued one) and by every cluster job's run;
//! - **a cluster's job** (its target the cluster, so the queue never runs it beside the cluster's
//!   reconcile): reads, decides and writes once, as the sweep or a change of a pool's
//!   autoscaling armed it ([`arm`], in the transaction that made the pool autoscaled).

use std::collections::HashMap;
use std::time::Duration;

use paddock_domain::cluster::NodePool;
use paddock_domain::job_kind::CLUSTER_AUTOSCALE;
use paddock_domain::machine::HELD;
use paddock_types::machine::MachineState;
use paddock_types::{ClusterId, MachineClassId, TenantId};
use serde_json::json;
use uuid::Uuid;

use crate::allocation::{self, HeldMachine};
use crate::{cluster, job, node_pool, Conn, StoreError, Txn};

/// The target type of the sweep.
pub const FLEET_TARGET_TYPE: &str = "fleet";

/// The fixed target id of the sweep: one queued job per (target, kind) keeps it a singleton
/// however many workers enqueue it.
const SWEEP_TARGET: Uuid = Uuid::from_u128(0x7061_6464_6f63_6b00_0000_0000_0000_0002);

/// Queues the cluster's demand check `after` from now (merged into a queued one: the earlier
/// wins).
pub async fn arm(conn: &mut Txn<'_>, tenant: TenantId, cluster: ClusterId, after: Duration) -> Result<(), StoreError> {
    job::arm_cluster(conn, CLUSTER_AUTOSCALE, tenant, cluster, after).await
}

/// Queues the sweep `after` from now (merged into the queued one: the earlier wins).
pub async fn enqueue_sweep(conn: &mut Txn<'_>, after: Duration) -> Result<(), StoreError> {
    let run_at = chrono::Utc::now() + chrono::Duration::from_std(after).unwrap_or(chrono::Duration::MAX);
    let new = job::NewJob {
        kind: CLUSTER_AUTOSCALE,
        target_type: FLEET_TARGET_TYPE,
        target_id: SWEEP_TARGET,
        payload: json!({}),
        tenant_id: None,
        operation_id: None,
        run_at: Some(run_at),
    };
    job::enqueue(conn, &new).await?;
    Ok(())
}

/// A cluster the sweep watches, with what a demand check reads of it.
#[derive(Debug, Clone)]
pub struct Watched {
    /// The cluster, its tenant's name, its sealed admin kubeconfig.
    pub elastic: cluster::ElasticCluster,
    /// Its live pools.
    pub pools: Vec<NodePool>,
    /// The machines it holds.
    pub held: Vec<HeldMachine>,
}

/// Every live cluster with a live autoscaled pool, across tenants, with its pools and machines:
/// three statements however many clusters. Read in the caller's transaction, so the three agree.
pub async fn watched(conn: &mut Conn) -> Result<Vec<Watched>, StoreError> {
    let clusters = cluster::elastic(&mut *conn).await?;
    let ids: Vec<Uuid> = clusters.iter().map(|c| c.cluster.id.uuid()).collect();
    let mut pools: HashMap<ClusterId, Vec<NodePool>> = HashMap::new();
    for pool in node_pool::of_any_clusters(&mut *conn, &ids).await? {
        pools.entry(pool.cluster_id).or_default().push(pool);
    }
    let mut held: HashMap<ClusterId, Vec<HeldMachine>> = HashMap::new();
    for (cluster, machine) in allocation::machines_of_any(&mut *conn, &ids).await? {
        held.entry(cluster).or_default().push(machine);
    }
    Ok(clusters
        .into_iter()
        .map(|elastic| {
            let pools = pools.remove(&elastic.cluster.id).unwrap_or_default();
            let held = held.remove(&elastic.cluster.id).unwrap_or_default();
            Watched { elastic, pools, held }
        })
        .collect())
}

/// What bounds the targets of one cluster's autoscaled pools besides their `max`: per class, the
/// fleet (not retired); and the tenant's quota room.
#[derive(Debug, Clone, Default)]
pub struct Room {
    /// Per class: the fleet's machines (not retired).
    pub fleet: Vec<(MachineClassId, u64)>,
    /// Nodes the tenant may still hold under `max_nodes` (None: unbounded).
    pub nodes: Option<u64>,
    /// GPUs the tenant may still hold under `max_gpus` (None: unbounded).
    pub gpus: Option<u64>,
}

impl Room {
    /// The fleet's machines of `class`.
    pub fn fleet_of(&self, class: MachineClassId) -> u64 {
        self.fleet.iter().find(|(c, _)| *c == class).map_or(0, |(_, n)| *n)
    }
}

/// The [`Room`] of a cluster's pools.
pub async fn room(conn: &mut Conn, tenant: TenantId, cluster: ClusterId) -> Result<Room, StoreError> {
    let held_states: Vec<&str> = HELD.iter().map(|s: &MachineState| s.as_str()).collect();
    let fleet: Vec<(Uuid, i64)> = sqlx::query_as(
        "select m.machine_class_id, count(*) from machines m where m.state <> 'retired' \
         and m.machine_class_id in (select machine_class_id from node_pools where tenant_id = $1 \
           and cluster_id = $2 and autoscale_min is not null and deleted_at is null) \
         group by m.machine_class_id",
    )
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .fetch_all(&mut *conn)
    .await?;
    let (nodes, gpus): (Option<i64>, Option<i64>) = sqlx::query_as(
        "select t.max_nodes - (select count(*) from machines m where m.tenant_id = t.id and m.state = any($2)), \
                t.max_gpus - (select coalesce(sum(c.gpu_count), 0) from machines m \
                  join machine_classes c on c.id = m.machine_class_id where m.tenant_id = t.id and m.state = any($2)) \
         from tenants t where t.id = $1",
    )
    .bind(tenant.uuid())
    .bind(&held_states)
    .fetch_one(&mut *conn)
    .await?;
    let room = |n: Option<i64>| n.map(|n| u64::try_from(n).unwrap_or(0));
    Ok(Room {
        fleet: fleet.into_iter().map(|(c, n)| (MachineClassId(c), u64::try_from(n).unwrap_or(0))).collect(),
        nodes: room(nodes),
        gpus: room(gpus),
    })
}
