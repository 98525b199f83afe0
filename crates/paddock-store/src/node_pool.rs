//! Node pools of clusters: spec, observed status and the machines they hold. Every query takes the
//! tenant and filters on it.

use chrono::{DateTime, Utc};
use paddock_domain::autoscale::ScaleMemory;
use paddock_domain::cluster::{NodePool, NodePoolSpec};
use paddock_types::cluster::{Condition, NodePoolAutoscaling, NodePoolRole, NodePoolStatus, PoolMachineView, Taint};
use paddock_types::health::HealthStatus;
use paddock_types::machine::MachineState;
use paddock_types::remediation::NodePoolRemediation;
use paddock_types::{ClusterId, Labels, MachineClassId, MachineId, NodePoolId, TenantId};
use sqlx::types::Json;
use uuid::Uuid;

use crate::{from_json, parse_state, Conn, StoreError};

#[derive(sqlx::FromRow)]
struct PoolRow {
    id: Uuid,
    tenant_id: Uuid,
    cluster_id: Uuid,
    name: String,
    machine_class_id: Uuid,
    machine_class: String,
    gpu_count: i32,
    cpu_cores: i32,
    memory_gib: i32,
    count: i32,
    labels: Json<Labels>,
    taints: Json<Vec<Taint>>,
    role: String,
    remediation_automatic: bool,
    generation: i64,
    observed_generation: i64,
    ready: i32,
    allocated: i32,
    conditions: serde_json::Value,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    deletion_requested_at: Option<DateTime<Utc>>,
    autoscale_min: Option<i32>,
    autoscale_max: Option<i32>,
    scale_down_delay_seconds: Option<i32>,
    scale_up_delay_seconds: Option<i32>,
    desired_count: Option<i32>,
    scale_up_since: Option<DateTime<Utc>>,
    scale_down_since: Option<DateTime<Utc>>,
    release_first: Vec<String>,
}

impl PoolRow {
    fn autoscaling(&self) -> Option<NodePoolAutoscaling> {
        Some(NodePoolAutoscaling {
            min: unsigned(self.autoscale_min?),
            max: unsigned(self.autoscale_max?),
            scale_down_delay_seconds: unsigned(self.scale_down_delay_seconds?),
            scale_up_delay_seconds: unsigned(self.scale_up_delay_seconds?),
        })
    }
}

const POOL_SELECT: &str =
    "select p.id, p.tenant_id, p.cluster_id, p.name, p.machine_class_id, mc.name as machine_class, \
     mc.gpu_count, mc.cpu_cores, mc.memory_gib, p.count, p.labels, p.taints, p.role, p.remediation_automatic, p.generation, p.observed_generation, p.ready, p.allocated, p.conditions, p.created_at, \
     p.updated_at, p.deletion_requested_at, \
     p.autoscale_min, p.autoscale_max, p.scale_down_delay_seconds, p.scale_up_delay_seconds, p.desired_count, \
     p.scale_up_since, p.scale_down_since, p.release_first from node_pools p join machine_classes mc on mc.id = p.machine_class_id";

fn unsigned(v: i32) -> u32 {
    // Check constraints and validation keep these non-negative.
    u32::try_from(v).unwrap_or(0)
}

impl TryFrom<PoolRow> for NodePool {
    type Error = StoreError;
    fn try_from(r: PoolRow) -> Result<Self, StoreError> {
        let autoscaling = r.autoscaling();
        Ok(NodePool {
            id: NodePoolId(r.id),
            tenant_id: TenantId(r.tenant_id),
            cluster_id: ClusterId(r.cluster_id),
            machine_class_id: MachineClassId(r.machine_class_id),
            spec: NodePoolSpec {
                name: r.name,
                machine_class: r.machine_class,
                count: unsigned(r.count),
                labels: r.labels.0,
                taints: r.taints.0,
                role: NodePoolRole::parse(&r.role)
                    .ok_or_else(|| StoreError::Corrupt(format!("node pool {} has the role {:?}", r.id, r.role)))?,
                remediation: NodePoolRemediation { automatic: r.remediation_automatic },
                autoscaling,
            },
            gpu_count: unsigned(r.gpu_count),
            class_size: (unsigned(r.cpu_cores), unsigned(r.memory_gib)),
            status: NodePoolStatus {
                ready: unsigned(r.ready),
                allocated: unsigned(r.allocated),
                desired_count: unsigned(r.desired_count.unwrap_or(r.count)),
                conditions: from_json(r.conditions)?,
            },
            generation: r.generation,
            observed_generation: r.observed_generation,
            deleting: r.deletion_requested_at.is_some(),
            scaling: ScaleMemory { up_since: r.scale_up_since, down_since: r.scale_down_since },
            release_first: r.release_first,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

/// Inserts a node pool.
pub async fn insert(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
    id: NodePoolId,
    class: MachineClassId,
    spec: &NodePoolSpec,
) -> Result<(), StoreError> {
    sqlx::query(
        "insert into node_pools (id, tenant_id, cluster_id, name, machine_class_id, count, labels, taints, role, \
         remediation_automatic, autoscale_min, autoscale_max, scale_down_delay_seconds, scale_up_delay_seconds, \
         desired_count) values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
         case when $11::int is null then null else $6 end)",
    )
    .bind(id.uuid())
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .bind(&spec.name)
    .bind(class.uuid())
    .bind(i32::try_from(spec.count).unwrap_or(i32::MAX))
    .bind(Json(&spec.labels))
    .bind(Json(&spec.taints))
    .bind(spec.role.as_str())
    .bind(spec.remediation.automatic)
    .bind(spec.autoscaling.map(|a| db_int(a.min)))
    .bind(spec.autoscaling.map(|a| db_int(a.max)))
    .bind(spec.autoscaling.map(|a| db_int(a.scale_down_delay_seconds)))
    .bind(spec.autoscaling.map(|a| db_int(a.scale_up_delay_seconds)))
    .execute(conn)
    .await?;
    Ok(())
}

fn db_int(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

/// The live pools of a cluster (deleting ones included), by id.
pub async fn of_cluster(conn: &mut Conn, tenant: TenantId, cluster: ClusterId) -> Result<Vec<NodePool>, StoreError> {
    let rows: Vec<PoolRow> = sqlx::query_as(&format!(
        "{POOL_SELECT} where p.tenant_id = $1 and p.cluster_id = $2 and p.deleted_at is null order by p.id"
    ))
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .fetch_all(conn)
    .await?;
    rows.into_iter().map(NodePool::try_from).collect()
}

/// The live pools of many clusters of a tenant (for list views), by id.
pub async fn of_clusters(conn: &mut Conn, tenant: TenantId, clusters: &[Uuid]) -> Result<Vec<NodePool>, StoreError> {
    let rows: Vec<PoolRow> = sqlx::query_as(&format!(
        "{POOL_SELECT} where p.tenant_id = $1 and p.cluster_id = any($2) and p.deleted_at is null order by p.id"
    ))
    .bind(tenant.uuid())
    .bind(clusters)
    .fetch_all(conn)
    .await?;
    rows.into_iter().map(NodePool::try_from).collect()
}

/// The live pools of `clusters` ACROSS TENANTS (the demand sweep reads every watched cluster's
/// pools at once; each pool carries its tenant), by id.
pub async fn of_any_clusters(conn: &mut Conn, clusters: &[Uuid]) -> Result<Vec<NodePool>, StoreError> {
    let rows: Vec<PoolRow> =
        sqlx::query_as(&format!("{POOL_SELECT} where p.cluster_id = any($1) and p.deleted_at is null order by p.id"))
            .bind(clusters)
            .fetch_all(conn)
            .await?;
    rows.into_iter().map(NodePool::try_from).collect()
}

/// One live pool of a cluster.
pub async fn get(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
    id: NodePoolId,
) -> Result<Option<NodePool>, StoreError> {
    select(conn, tenant, cluster, id, "").await
}

/// One live pool of a cluster, its row locked until the transaction ends.
pub async fn get_for_update(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
    id: NodePoolId,
) -> Result<Option<NodePool>, StoreError> {
    select(conn, tenant, cluster, id, " for update of p").await
}

async fn select(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
    id: NodePoolId,
    lock: &str,
) -> Result<Option<NodePool>, StoreError> {
    let row: Option<PoolRow> = sqlx::query_as(&format!(
        "{POOL_SELECT} where p.tenant_id = $1 and p.cluster_id = $2 and p.id = $3 and p.deleted_at is null{lock}"
    ))
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .bind(id.uuid())
    .fetch_optional(conn)
    .await?;
    row.map(NodePool::try_from).transpose()
}

/// Writes a pool's new count, labels, taints and autoscaling, bumping its generation; an
/// autoscaled pool's target becomes `desired` (the service keeps it within the new bounds), and
/// the autoscaler's memory starts over.
pub async fn update_spec(
    conn: &mut Conn,
    tenant: TenantId,
    id: NodePoolId,
    spec: &NodePoolSpec,
    desired: Option<u32>,
) -> Result<(), StoreError> {
    sqlx::query(
        "update node_pools set count = $3, labels = $4, taints = $5, autoscale_min = $6, autoscale_max = $7, \
         scale_down_delay_seconds = $8, scale_up_delay_seconds = $9, desired_count = $10, scale_up_since = null, \
         scale_down_since = null, generation = generation + 1, updated_at = now() \
         where tenant_id = $1 and id = $2",
    )
    .bind(tenant.uuid())
    .bind(id.uuid())
    .bind(db_int(spec.count))
    .bind(Json(&spec.labels))
    .bind(Json(&spec.taints))
    .bind(spec.autoscaling.map(|a| db_int(a.min)))
    .bind(spec.autoscaling.map(|a| db_int(a.max)))
    .bind(spec.autoscaling.map(|a| db_int(a.scale_down_delay_seconds)))
    .bind(spec.autoscaling.map(|a| db_int(a.scale_up_delay_seconds)))
    .bind(desired.filter(|_| spec.autoscaling.is_some()).map(db_int))
    .execute(conn)
    .await?;
    Ok(())
}

/// The autoscaler's write of one autoscaled pool: its target (status: the generation and etag do
/// not move), its memory, and the idle Node names to give back first. Guarded by the generation
/// it decided on (a spec change in between wins); false when the guard was lost.
pub async fn set_scale(
    conn: &mut Conn,
    tenant: TenantId,
    id: NodePoolId,
    generation: i64,
    write: &ScaleWrite<'_>,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "update node_pools set desired_count = $4, scale_up_since = $5, scale_down_since = $6, \
           release_first = case when $8 then $7 else release_first end, \
           last_scaled_at = case when $8 then now() else last_scaled_at end, \
           conditions = coalesce($9::jsonb, conditions), \
           status_version = status_version + 1, updated_at = now() \
         where tenant_id = $1 and id = $2 and generation = $3 and autoscale_min is not null \
           and deleted_at is null and deletion_requested_at is null",
    )
    .bind(tenant.uuid())
    .bind(id.uuid())
    .bind(generation)
    .bind(db_int(write.target))
    .bind(write.memory.up_since)
    .bind(write.memory.down_since)
    .bind(write.release_first)
    .bind(write.scaled)
    .bind(write.conditions.map(Json))
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// What [`set_scale`] writes.
#[derive(Debug, Clone, Copy)]
pub struct ScaleWrite<'a> {
    /// The target.
    pub target: u32,
    /// The autoscaler's memory.
    pub memory: ScaleMemory,
    /// Whether the target moved now (then `release_first` is written too).
    pub scaled: bool,
    /// The idle Node names to give back first.
    pub release_first: &'a [String],
    /// The pool's conditions, when the autoscaler changed one (its `DemandFits`).
    pub conditions: Option<&'a [Condition]>,
}

/// Asks for a pool's deletion.
pub async fn request_deletion(conn: &mut Conn, tenant: TenantId, id: NodePoolId) -> Result<(), StoreError> {
    sqlx::query(
        "update node_pools set deletion_requested_at = now(), generation = generation + 1, updated_at = now() \
         where tenant_id = $1 and id = $2 and deletion_requested_at is null",
    )
    .bind(tenant.uuid())
    .bind(id.uuid())
    .execute(conn)
    .await?;
    Ok(())
}

#[derive(sqlx::FromRow)]
struct PoolMachineRow {
    id: Uuid,
    node_pool_id: Uuid,
    name: String,
    machine_class: String,
    state: String,
    node_name: Option<String>,
    health: Option<String>,
}

/// The machines a tenant's cluster holds (only those of `pool`, when given; only `machine`, when
/// given), as the tenant may see them (never BMC details), by id after `after`.
pub async fn machines(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
    of: MachinesOf,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<PoolMachineView>, StoreError> {
    let rows: Vec<PoolMachineRow> = sqlx::query_as(
        "select m.id, m.node_pool_id, m.name, c.name as machine_class, m.state, m.node_name, \
           (select r.status from machine_health_reports r where r.allocation_id = m.allocation_id \
             order by r.id desc limit 1) as health \
         from machines m join machine_classes c on c.id = m.machine_class_id \
         where m.tenant_id = $1 and m.cluster_id = $2 and m.node_pool_id is not null \
           and ($3::uuid is null or m.node_pool_id = $3) and ($4::uuid is null or m.id = $4) \
           and ($5::uuid is null or m.id > $5) \
         order by m.id limit $6",
    )
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .bind(of.pool.map(NodePoolId::uuid))
    .bind(of.machine.map(MachineId::uuid))
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(conn)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(PoolMachineView {
                id: MachineId(r.id),
                node_pool_id: NodePoolId(r.node_pool_id),
                name: r.name,
                machine_class: r.machine_class,
                state: parse_state(&r.state, MachineState::parse)?,
                node_name: r.node_name,
                health: r.health.as_deref().map(|h| parse_state(h, HealthStatus::parse)).transpose()?,
            })
        })
        .collect()
}

/// Which of a cluster's machines [`machines`] lists.
#[derive(Debug, Clone, Copy, Default)]
pub struct MachinesOf {
    /// Only this pool's.
    pub pool: Option<NodePoolId>,
    /// Only this machine.
    pub machine: Option<MachineId>,
}

/// Writes a pool's observed state (only the cluster's reconcile job writes it, one at a time), and
/// its observed generation when given. Writes nothing when nothing changed.
pub async fn set_status(
    conn: &mut Conn,
    tenant: TenantId,
    id: NodePoolId,
    status: &NodePoolStatus,
    observed_generation: Option<i64>,
) -> Result<(), StoreError> {
    sqlx::query(
        "update node_pools set ready = $3, allocated = $4, conditions = $5, \
         observed_generation = coalesce($6, observed_generation), \
         status_version = status_version + 1, updated_at = now() \
         where tenant_id = $1 and id = $2 and (ready, allocated, conditions, observed_generation) \
           is distinct from ($3, $4, $5::jsonb, coalesce($6, observed_generation))",
    )
    .bind(tenant.uuid())
    .bind(id.uuid())
    .bind(i32::try_from(status.ready).unwrap_or(i32::MAX))
    .bind(i32::try_from(status.allocated).unwrap_or(i32::MAX))
    .bind(Json(&status.conditions))
    .bind(observed_generation)
    .execute(conn)
    .await?;
    Ok(())
}

/// Marks a pool deleted (every machine released): it answers 404 from now on.
pub async fn mark_deleted(conn: &mut Conn, tenant: TenantId, id: NodePoolId) -> Result<(), StoreError> {
    sqlx::query(
        "update node_pools set deleted_at = now(), updated_at = now() \
         where tenant_id = $1 and id = $2 and deleted_at is null",
    )
    .bind(tenant.uuid())
    .bind(id.uuid())
    .execute(conn)
    .await?;
    Ok(())
}

/// The machines a cluster's live pools of a class ask for (an autoscaled pool's current
/// target), `except` one pool (being changed).
pub async fn class_count(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
    class: MachineClassId,
    except: Option<NodePoolId>,
) -> Result<u64, StoreError> {
    let n: i64 = sqlx::query_scalar(
        "select coalesce(sum(coalesce(desired_count, count)), 0)::bigint from node_pools \
         where tenant_id = $1 and cluster_id = $2 \
         and machine_class_id = $3 and deleted_at is null and deletion_requested_at is null \
         and id is distinct from $4",
    )
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .bind(class.uuid())
    .bind(except.map(|p| p.uuid()))
    .fetch_one(conn)
    .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}
