//! Clusters: spec, status, secrets and deletion ([`crate::node_pool`] holds their node pools,
//! [`crate::cluster_event`] their events). Every query takes the tenant and filters on it.

use chrono::{DateTime, Utc};
use paddock_domain::cluster::{Cluster, ClusterSpec, Demand};
use paddock_types::cluster::{
    ClusterKind, ClusterPhase, ClusterStatus, Condition, Endpoints, Isolation, RaySpec, SlurmSpec,
};
use paddock_types::{ClusterId, NodePoolId, TenantId};
use sqlx::types::Json;
use uuid::Uuid;

use crate::{from_json, parse_state, Conn, StoreError};

#[derive(sqlx::FromRow)]
struct ClusterRow {
    id: Uuid,
    tenant_id: Uuid,
    name: String,
    kind: String,
    kubernetes_version: String,
    slurm: Option<serde_json::Value>,
    ray: Option<serde_json::Value>,
    stack_version: String,
    generation: i64,
    status_version: i64,
    phase: String,
    conditions: serde_json::Value,
    observed_generation: i64,
    endpoints: serde_json::Value,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    deletion_requested_at: Option<DateTime<Utc>>,
    identity_sync: Option<serde_json::Value>,
}

const CLUSTER_COLUMNS: &str =
    "id, tenant_id, name, kind, kubernetes_version, slurm, ray, stack_version, generation, status_version, \
     phase, conditions, observed_generation, endpoints, created_at, updated_at, deletion_requested_at, identity_sync";

impl TryFrom<ClusterRow> for Cluster {
    type Error = StoreError;
    fn try_from(r: ClusterRow) -> Result<Self, StoreError> {
        let kind = parse_state(&r.kind, |s| match s {
            "slurm" => Some(ClusterKind::Slurm),
            "kubernetes" => Some(ClusterKind::Kubernetes),
            "ray" => Some(ClusterKind::Ray),
            _ => None,
        })?;
        let slurm: Option<SlurmSpec> = r.slurm.map(from_json).transpose()?;
        let ray: Option<RaySpec> = r.ray.map(from_json).transpose()?;
        let conditions: Vec<Condition> = from_json(r.conditions)?;
        let endpoints: Endpoints = from_json(r.endpoints)?;
        Ok(Cluster {
            id: ClusterId(r.id),
            tenant_id: TenantId(r.tenant_id),
            spec: ClusterSpec {
                name: r.name,
                kind,
                isolation: Isolation::PrivateNodes,
                kubernetes_version: r.kubernetes_version,
                slurm,
                ray,
            },
            status: ClusterStatus {
                phase: parse_state(&r.phase, ClusterPhase::parse)?,
                conditions,
                observed_generation: r.observed_generation,
                endpoints,
                identity: r.identity_sync.map(from_json).transpose()?,
            },
            stack_version: r.stack_version,
            generation: r.generation,
            status_version: r.status_version,
            deleting: r.deletion_requested_at.is_some(),
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

/// Inserts a cluster (phase `pending`) on the base stack `stack_version`.
pub async fn insert(
    conn: &mut Conn,
    tenant: TenantId,
    id: ClusterId,
    spec: &ClusterSpec,
    stack_version: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "insert into clusters (id, tenant_id, name, kind, isolation, kubernetes_version, slurm, ray, stack_version) \
         values ($1, $2, $3, $4, 'private-nodes', $5, $6, $7, $8)",
    )
    .bind(id.uuid())
    .bind(tenant.uuid())
    .bind(&spec.name)
    .bind(spec.kind.as_str())
    .bind(&spec.kubernetes_version)
    .bind(spec.slurm.as_ref().map(Json))
    .bind(spec.ray.as_ref().map(Json))
    .bind(stack_version)
    .execute(conn)
    .await?;
    Ok(())
}

/// A tenant's live cluster.
pub async fn get(conn: &mut Conn, tenant: TenantId, id: ClusterId) -> Result<Option<Cluster>, StoreError> {
    select(conn, tenant, id, "").await
}

/// A tenant's live cluster, its row locked until the transaction ends.
pub async fn get_for_update(conn: &mut Conn, tenant: TenantId, id: ClusterId) -> Result<Option<Cluster>, StoreError> {
    select(conn, tenant, id, " for update").await
}

async fn select(conn: &mut Conn, tenant: TenantId, id: ClusterId, lock: &str) -> Result<Option<Cluster>, StoreError> {
    let row: Option<ClusterRow> = sqlx::query_as(&format!(
        "select {CLUSTER_COLUMNS} from clusters where tenant_id = $1 and id = $2 and deleted_at is null{lock}"
    ))
    .bind(tenant.uuid())
    .bind(id.uuid())
    .fetch_optional(conn)
    .await?;
    row.map(Cluster::try_from).transpose()
}

/// A cluster as the demand sweep reads it: with its tenant's name, its sealed admin kubeconfig
/// and when it was last said that its demand cannot be read.
#[derive(sqlx::FromRow)]
struct ElasticRow {
    #[sqlx(flatten)]
    cluster: ClusterRow,
    tenant_name: Option<String>,
    admin_kubeconfig_enc: Option<Vec<u8>>,
    unreadable_at: Option<DateTime<Utc>>,
}

/// A cluster with an autoscaled pool, as the demand sweep reads it.
#[derive(Debug, Clone)]
pub struct ElasticCluster {
    /// The cluster.
    pub cluster: Cluster,
    /// Its tenant's name.
    pub tenant_name: String,
    /// Its sealed admin kubeconfig, once written.
    pub admin_kubeconfig: Option<Vec<u8>>,
    /// Its last `AutoscalingUnavailable` event, if any.
    pub unreadable_at: Option<DateTime<Utc>>,
}

/// Every live cluster, not being deleted, with a live autoscaled pool, ACROSS TENANTS (the demand
/// sweep's one read of its clusters, a provider-side job like the power sync's), by id. A
/// cluster whose tenant is gone is left out.
pub async fn elastic(conn: &mut Conn) -> Result<Vec<ElasticCluster>, StoreError> {
    let rows: Vec<ElasticRow> = sqlx::query_as(&format!(
        "select {CLUSTER_COLUMNS}, admin_kubeconfig_enc, \
                (select t.name from tenants t where t.id = clusters.tenant_id and t.deleted_at is null) as tenant_name, \
                (select max(e.at) from cluster_events e where e.cluster_id = clusters.id \
                   and e.reason = 'AutoscalingUnavailable') as unreadable_at \
         from clusters where deleted_at is null and deletion_requested_at is null \
           and exists (select 1 from node_pools p where p.cluster_id = clusters.id and p.autoscale_min is not null \
                       and p.deleted_at is null and p.deletion_requested_at is null) \
         order by id"
    ))
    .fetch_all(conn)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let Some(tenant_name) = row.tenant_name else { continue };
        out.push(ElasticCluster {
            cluster: Cluster::try_from(row.cluster)?,
            tenant_name,
            admin_kubeconfig: row.admin_kubeconfig_enc,
            unreadable_at: row.unreadable_at,
        });
    }
    Ok(out)
}

/// A tenant's live clusters after `after`, by id.
pub async fn list(
    conn: &mut Conn,
    tenant: TenantId,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<Cluster>, StoreError> {
    let rows: Vec<ClusterRow> = sqlx::query_as(&format!(
        "select {CLUSTER_COLUMNS} from clusters where tenant_id = $1 and deleted_at is null \
         and ($2::uuid is null or id > $2) order by id limit $3"
    ))
    .bind(tenant.uuid())
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(conn)
    .await?;
    rows.into_iter().map(Cluster::try_from).collect()
}

/// Writes a new spec and base stack version and bumps the generation. The caller holds the row
/// lock.
pub async fn update_spec(
    conn: &mut Conn,
    tenant: TenantId,
    id: ClusterId,
    spec: &ClusterSpec,
    stack_version: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "update clusters set kubernetes_version = $3, slurm = $4, stack_version = $5, ray = $6, \
         generation = generation + 1, updated_at = now() where tenant_id = $1 and id = $2",
    )
    .bind(tenant.uuid())
    .bind(id.uuid())
    .bind(&spec.kubernetes_version)
    .bind(spec.slurm.as_ref().map(Json))
    .bind(stack_version)
    .bind(spec.ray.as_ref().map(Json))
    .execute(conn)
    .await?;
    Ok(())
}

/// Bumps the generation after a change of one of its pools (the cluster's desired state changed).
pub async fn touch(conn: &mut Conn, tenant: TenantId, id: ClusterId) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar(
        "update clusters set generation = generation + 1, updated_at = now() where tenant_id = $1 and id = $2 \
         returning generation",
    )
    .bind(tenant.uuid())
    .bind(id.uuid())
    .fetch_one(conn)
    .await?)
}

/// Asks for deletion: bumps the generation and shows the `deleting` phase at once.
pub async fn request_deletion(conn: &mut Conn, tenant: TenantId, id: ClusterId) -> Result<(), StoreError> {
    sqlx::query(
        "update clusters set deletion_requested_at = now(), phase = 'deleting', generation = generation + 1, \
         status_version = status_version + 1, updated_at = now() \
         where tenant_id = $1 and id = $2 and deletion_requested_at is null",
    )
    .bind(tenant.uuid())
    .bind(id.uuid())
    .execute(&mut *conn)
    .await?;
    crate::usage::close_control_plane_segment(conn, tenant, id).await?;
    Ok(())
}

/// What a tenant asks for in total (live clusters and their live pools' desired counts, an
/// autoscaled pool's `max`), with
/// the demand of one pool (`except`) left out, for a change that replaces it.
pub async fn demand(conn: &mut Conn, tenant: TenantId, except: Option<NodePoolId>) -> Result<Demand, StoreError> {
    let (clusters, nodes, gpus): (i64, i64, i64) = sqlx::query_as(
        "select (select count(*) from clusters where tenant_id = $1 and deleted_at is null and deletion_requested_at is null), \
                coalesce(sum(coalesce(p.autoscale_max, p.count)), 0)::bigint, coalesce(sum(coalesce(p.autoscale_max, p.count)::bigint * mc.gpu_count), 0)::bigint \
         from node_pools p join machine_classes mc on mc.id = p.machine_class_id \
         join clusters c on c.id = p.cluster_id \
         where p.tenant_id = $1 and p.deleted_at is null and p.deletion_requested_at is null \
           and c.deletion_requested_at is null and ($2::uuid is null or p.id <> $2)",
    )
    .bind(tenant.uuid())
    .bind(except.map(NodePoolId::uuid))
    .fetch_one(conn)
    .await?;
    let unsigned = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(Demand { clusters: unsigned(clusters), nodes: unsigned(nodes), gpus: unsigned(gpus) })
}

/// Writes a cluster's conditions, guarded on the status version read with them; false when
/// someone else wrote the status first (re-read and decide again). Never bumps the generation.
pub async fn set_conditions(
    conn: &mut Conn,
    tenant: TenantId,
    id: ClusterId,
    status_version: i64,
    conditions: &[Condition],
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "update clusters set conditions = $4, status_version = status_version + 1, updated_at = now() \
         where tenant_id = $1 and id = $2 and status_version = $3",
    )
    .bind(tenant.uuid())
    .bind(id.uuid())
    .bind(status_version)
    .bind(Json(conditions))
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records a completed sync of the tenant's people into the cluster's Slurm (its counts and time,
/// `status.identity`). Not guarded by the status version: the sync job and the reconciler share
/// the cluster as their job target, so they never run at once, and this column is the sync's own.
pub async fn set_identity_sync(
    conn: &mut Conn,
    tenant: TenantId,
    id: ClusterId,
    sync: &paddock_types::cluster::IdentitySync,
) -> Result<(), StoreError> {
    sqlx::query("update clusters set identity_sync = $3 where tenant_id = $1 and id = $2 and deleted_at is null")
        .bind(tenant.uuid())
        .bind(id.uuid())
        .bind(Json(sync))
        .execute(conn)
        .await?;
    Ok(())
}

/// The tenant's live `slurm` clusters that are not being deleted: those a change of its people
/// wakes the identity sync of.
pub async fn slurm_clusters(conn: &mut Conn, tenant: TenantId) -> Result<Vec<ClusterId>, StoreError> {
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "select id from clusters where tenant_id = $1 and kind = 'slurm' and deleted_at is null \
         and deletion_requested_at is null order by id",
    )
    .bind(tenant.uuid())
    .fetch_all(conn)
    .await?;
    Ok(ids.into_iter().map(ClusterId).collect())
}

/// A cluster's observed state as the reconciler writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusWrite<'a> {
    /// Phase.
    pub phase: ClusterPhase,
    /// Conditions.
    pub conditions: &'a [Condition],
    /// Endpoints.
    pub endpoints: &'a Endpoints,
    /// The generation the status describes.
    pub observed_generation: i64,
}

/// Writes a cluster's status, guarded on the status version read before; false when someone else
/// wrote first. Writes nothing (and answers true) when nothing changed, so a cluster at rest does
/// not churn its row. Never bumps the generation.
pub async fn set_status(
    conn: &mut Conn,
    tenant: TenantId,
    id: ClusterId,
    status_version: i64,
    status: &StatusWrite<'_>,
) -> Result<bool, StoreError> {
    let (phase, conditions, endpoints) = (status.phase.as_str(), Json(status.conditions), Json(status.endpoints));
    let done = sqlx::query(
        "update clusters set phase = $4, conditions = $5, endpoints = $6, observed_generation = $7, \
         status_version = status_version + 1, updated_at = now() \
         where tenant_id = $1 and id = $2 and status_version = $3 \
           and (phase, conditions, endpoints, observed_generation) is distinct from ($4, $5::jsonb, $6::jsonb, $7)",
    )
    .bind(tenant.uuid())
    .bind(id.uuid())
    .bind(status_version)
    .bind(phase)
    .bind(conditions)
    .bind(endpoints)
    .bind(status.observed_generation)
    .execute(&mut *conn)
    .await?;
    if done.rows_affected() == 1 {
        return Ok(true);
    }
    // Unchanged, or lost the guard: only the latter is a lost race.
    let current: Option<i64> =
        sqlx::query_scalar("select status_version from clusters where tenant_id = $1 and id = $2")
            .bind(tenant.uuid())
            .bind(id.uuid())
            .fetch_optional(conn)
            .await?;
    Ok(current == Some(status_version))
}

/// The sealed admin kubeconfig of a cluster's control plane, if stored.
pub async fn admin_kubeconfig(conn: &mut Conn, tenant: TenantId, id: ClusterId) -> Result<Option<Vec<u8>>, StoreError> {
    sealed(conn, tenant, id, "admin_kubeconfig_enc").await
}

/// A cluster's sealed secrets, as stored (each `None` until written).
#[derive(Debug, Clone, Default, sqlx::FromRow)]
pub struct SealedSecrets {
    /// The control plane's admin kubeconfig (`admin_kubeconfig_enc`).
    pub admin_kubeconfig: Option<Vec<u8>>,
    /// The Slurm secrets (`slurm_secrets_enc`).
    pub slurm_secrets: Option<Vec<u8>>,
}

/// Both sealed secrets of a tenant's cluster in one read (the reconciler's, once per run).
pub async fn sealed_secrets(conn: &mut Conn, tenant: TenantId, id: ClusterId) -> Result<SealedSecrets, StoreError> {
    let row: Option<SealedSecrets> = sqlx::query_as(
        "select admin_kubeconfig_enc as admin_kubeconfig, slurm_secrets_enc as slurm_secrets \
         from clusters where tenant_id = $1 and id = $2",
    )
    .bind(tenant.uuid())
    .bind(id.uuid())
    .fetch_optional(conn)
    .await?;
    Ok(row.unwrap_or_default())
}

/// One sealed column of a tenant's cluster (`column` is one of ours, never input).
async fn sealed(
    conn: &mut Conn,
    tenant: TenantId,
    id: ClusterId,
    column: &'static str,
) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(sqlx::query_scalar::<_, Option<Vec<u8>>>(&format!(
        "select {column} from clusters where tenant_id = $1 and id = $2"
    ))
    .bind(tenant.uuid())
    .bind(id.uuid())
    .fetch_optional(conn)
    .await?
    .flatten())
}

/// Stores the sealed admin kubeconfig (bound to `clusters`, `admin_kubeconfig_enc`, the id).
pub async fn set_admin_kubeconfig(
    conn: &mut Conn,
    tenant: TenantId,
    id: ClusterId,
    sealed: Option<&[u8]>,
) -> Result<(), StoreError> {
    sqlx::query("update clusters set admin_kubeconfig_enc = $3 where tenant_id = $1 and id = $2")
        .bind(tenant.uuid())
        .bind(id.uuid())
        .bind(sealed)
        .execute(conn)
        .await?;
    Ok(())
}

/// Marks a cluster and its pools deleted (every external object confirmed gone): they answer 404
/// from now on. Forgets the admin kubeconfig. Returns the ids of the pools it marked.
pub async fn mark_deleted(conn: &mut Conn, tenant: TenantId, id: ClusterId) -> Result<Vec<Uuid>, StoreError> {
    sqlx::query(
        "update clusters set deleted_at = now(), waiting_since = null, admin_kubeconfig_enc = null, \
         updated_at = now() where tenant_id = $1 and id = $2 and deleted_at is null",
    )
    .bind(tenant.uuid())
    .bind(id.uuid())
    .execute(&mut *conn)
    .await?;
    Ok(sqlx::query_scalar(
        "update node_pools set deleted_at = now(), updated_at = now() \
         where tenant_id = $1 and cluster_id = $2 and deleted_at is null returning id",
    )
    .bind(tenant.uuid())
    .bind(id.uuid())
    .fetch_all(conn)
    .await?)
}

/// The sealed Slurm secrets of a cluster, if generated.
pub async fn slurm_secrets(conn: &mut Conn, tenant: TenantId, id: ClusterId) -> Result<Option<Vec<u8>>, StoreError> {
    sealed(conn, tenant, id, "slurm_secrets_enc").await
}

/// Stores a cluster's sealed Slurm secrets unless some are already stored (they are generated
/// once: a second writer loses and reads the first one's).
pub async fn init_slurm_secrets(
    conn: &mut Conn,
    tenant: TenantId,
    id: ClusterId,
    sealed: &[u8],
) -> Result<(), StoreError> {
    sqlx::query(
        "update clusters set slurm_secrets_enc = $3 where tenant_id = $1 and id = $2 and slurm_secrets_enc is null",
    )
    .bind(tenant.uuid())
    .bind(id.uuid())
    .bind(sealed)
    .execute(conn)
    .await?;
    Ok(())
}
