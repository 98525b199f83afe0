//! Elastic pools (docs/tenants.md, "Elastic pools"): the demand checks' job and what bounds an
//! autoscaler's target besides the pool's `max`. Every cluster with an autoscaled pool has one
//! queued [`CLUSTER_AUTOSCALE`] job; it shares the cluster's target with its reconcile job, so
//! the queue never runs the two at once. It is armed in the transaction that makes a pool
//! autoscaled, and by [`arm_unarmed`] at every worker start.

use std::time::Duration;

use paddock_domain::job_kind::CLUSTER_AUTOSCALE;
use paddock_domain::machine::HELD;
use paddock_types::machine::MachineState;
use paddock_types::{ClusterId, MachineClassId, TenantId};
use uuid::Uuid;

use crate::{job, Conn, StoreError};

/// Queues the cluster's demand check `after` from now (merged into a queued one: the earlier
/// wins).
pub async fn arm(conn: &mut Conn, tenant: TenantId, cluster: ClusterId, after: Duration) -> Result<(), StoreError> {
    job::arm_cluster(conn, CLUSTER_AUTOSCALE, tenant, cluster, after).await
}

/// Arms the demand check of every live cluster with an autoscaled pool that has none queued or
/// running, each due at a random moment within `interval`; how many it armed. One read and one
/// insert, however many clusters.
pub async fn arm_unarmed(conn: &mut Conn, interval: Duration) -> Result<u64, StoreError> {
    let unarmed: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "select distinct c.tenant_id, c.id from clusters c join node_pools p on p.cluster_id = c.id \
         where p.autoscale_min is not null and p.deleted_at is null and p.deletion_requested_at is null \
           and c.deletion_requested_at is null and c.deleted_at is null \
           and not exists (select 1 from jobs j where j.target_id = c.id and j.kind = $1 \
                           and j.state in ('queued', 'running'))",
    )
    .bind(CLUSTER_AUTOSCALE)
    .fetch_all(&mut *conn)
    .await?;
    job::arm_clusters(conn, CLUSTER_AUTOSCALE, &unarmed, interval).await
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
