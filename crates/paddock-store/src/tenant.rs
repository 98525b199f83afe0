//! Tenants. Deletion is soft (`deleted_at`): the id stays valid in usage and audit history, and
//! a deleted tenant answers 404 like a missing one.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use paddock_domain::model::Tenant;
use paddock_types::tenant::{QuotaUse, Quotas, TenantCreate, TenantState};
use paddock_types::TenantId;
use sqlx::types::Json;
use uuid::Uuid;

use sqlx::FromRow;

use crate::audit::{self, NewAuditEvent};
use crate::{parse_state, Conn, StoreError};

#[derive(sqlx::FromRow)]
struct TenantRow {
    id: Uuid,
    name: String,
    display_name: String,
    labels: Json<paddock_types::Labels>,
    max_clusters: Option<i32>,
    max_nodes: Option<i32>,
    max_gpus: Option<i32>,
    use_clusters: i64,
    use_nodes: i64,
    use_gpus: i64,
    state: String,
    generation: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

/// The quota use is `cluster::demand`'s, per tenant row.
const COLUMNS: &str = "id, name, display_name, labels, max_clusters, max_nodes, max_gpus, \
    (select count(*) from clusters c where c.tenant_id = tenants.id and c.deleted_at is null \
       and c.deletion_requested_at is null) as use_clusters, \
    (select coalesce(sum(coalesce(p.autoscale_max, p.count)), 0)::bigint from node_pools p join clusters c on c.id = p.cluster_id \
       where p.tenant_id = tenants.id and p.deleted_at is null and p.deletion_requested_at is null \
         and c.deletion_requested_at is null) as use_nodes, \
    (select coalesce(sum(coalesce(p.autoscale_max, p.count)::bigint * mc.gpu_count), 0)::bigint from node_pools p \
       join machine_classes mc on mc.id = p.machine_class_id join clusters c on c.id = p.cluster_id \
       where p.tenant_id = tenants.id and p.deleted_at is null and p.deletion_requested_at is null \
         and c.deletion_requested_at is null) as use_gpus, \
    state, generation, created_at, updated_at";

/// The two statements of the API's hottest calls, built once rather than on every request.
static GET_SQL: LazyLock<String> =
    LazyLock::new(|| format!("select {COLUMNS} from tenants where id = $1 and deleted_at is null"));
static INSERT_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "with t as (insert into tenants (id, name, display_name, labels, max_clusters, max_nodes, max_gpus) \
         values ($1, $2, $3, $4, $5, $6, $7) returning {COLUMNS}), \
         e as ({}) select * from t",
        audit::insert_sql(8)
    )
});

fn quota(value: Option<i32>) -> Option<u32> {
    value.and_then(|v| u32::try_from(v).ok())
}

fn bind_quota(value: Option<u32>) -> Option<i32> {
    // Validation bounds quotas to 1,000,000, well inside i32.
    value.map(|v| i32::try_from(v).unwrap_or(i32::MAX))
}

impl TryFrom<TenantRow> for Tenant {
    type Error = StoreError;
    fn try_from(r: TenantRow) -> Result<Self, StoreError> {
        let state = parse_state(&r.state, |s| match s {
            "active" => Some(TenantState::Active),
            "suspended" => Some(TenantState::Suspended),
            _ => None,
        })?;
        Ok(Tenant {
            id: TenantId(r.id),
            spec: TenantCreate {
                name: r.name,
                display_name: r.display_name,
                labels: r.labels.0,
                quotas: Quotas {
                    max_clusters: quota(r.max_clusters),
                    max_nodes: quota(r.max_nodes),
                    max_gpus: quota(r.max_gpus),
                },
            },
            quota_use: QuotaUse {
                clusters: u64::try_from(r.use_clusters).unwrap_or(0),
                nodes: u64::try_from(r.use_nodes).unwrap_or(0),
                gpus: u64::try_from(r.use_gpus).unwrap_or(0),
            },
            state,
            generation: r.generation,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

/// Inserts a tenant (state `active`, generation 1) and appends its audit event, in one statement:
/// atomic without a transaction, and one round trip.
pub async fn insert(
    conn: &mut Conn,
    id: TenantId,
    spec: &TenantCreate,
    event: &NewAuditEvent<'_>,
) -> Result<Tenant, StoreError> {
    let query = sqlx::query(&INSERT_SQL)
        .bind(id.uuid())
        .bind(&spec.name)
        .bind(&spec.display_name)
        .bind(Json(&spec.labels))
        .bind(bind_quota(spec.quotas.max_clusters))
        .bind(bind_quota(spec.quotas.max_nodes))
        .bind(bind_quota(spec.quotas.max_gpus));
    let row = audit::bind(query, event).fetch_one(conn).await?;
    TenantRow::from_row(&row)?.try_into()
}

/// A live tenant by id.
pub async fn get(conn: &mut Conn, id: TenantId) -> Result<Option<Tenant>, StoreError> {
    let row: Option<TenantRow> = sqlx::query_as(&GET_SQL).bind(id.uuid()).fetch_optional(conn).await?;
    row.map(Tenant::try_from).transpose()
}

/// A live tenant's name: what the drivers label objects with, without the usage counts [`get`]
/// sums over every cluster and pool of the tenant (a reconcile runs for every cluster).
pub async fn name(conn: &mut Conn, id: TenantId) -> Result<Option<String>, StoreError> {
    Ok(sqlx::query_scalar("select name from tenants where id = $1 and deleted_at is null")
        .bind(id.uuid())
        .fetch_optional(conn)
        .await?)
}

/// A live tenant by id, locked until the transaction ends against other writers of the tenant
/// (its quota checks, its spec). `for no key update`, not `for update`: the foreign-key checks
/// of rows inserted under the tenant (a worker's cluster events, allocations) take `key share`
/// locks, which `for update` would block, and a worker holding a cluster row while it inserts an
/// event would deadlock with a request holding the tenant while it reads that cluster.
pub async fn get_for_update(conn: &mut Conn, id: TenantId) -> Result<Option<Tenant>, StoreError> {
    let row: Option<TenantRow> = sqlx::query_as(&format!(
        "select {COLUMNS} from tenants where id = $1 and deleted_at is null for no key update"
    ))
    .bind(id.uuid())
    .fetch_optional(conn)
    .await?;
    row.map(Tenant::try_from).transpose()
}

/// Live tenants after `after`, by id; `only` limits the list to one tenant (tenant tokens).
pub async fn list(
    conn: &mut Conn,
    only: Option<TenantId>,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<Tenant>, StoreError> {
    let rows: Vec<TenantRow> = sqlx::query_as(&format!(
        "select {COLUMNS} from tenants \
         where deleted_at is null and ($1::uuid is null or id = $1) and ($2::uuid is null or id > $2) \
         order by id limit $3"
    ))
    .bind(only.map(TenantId::uuid))
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(conn)
    .await?;
    rows.into_iter().map(Tenant::try_from).collect()
}

/// Writes a new spec and bumps the generation. The caller holds the row lock.
pub async fn update_spec(conn: &mut Conn, id: TenantId, spec: &TenantCreate) -> Result<Tenant, StoreError> {
    let row: TenantRow = sqlx::query_as(&format!(
        "update tenants set display_name = $2, labels = $3, max_clusters = $4, max_nodes = $5, \
         max_gpus = $6, generation = generation + 1, updated_at = now() \
         where id = $1 and deleted_at is null returning {COLUMNS}"
    ))
    .bind(id.uuid())
    .bind(&spec.display_name)
    .bind(Json(&spec.labels))
    .bind(bind_quota(spec.quotas.max_clusters))
    .bind(bind_quota(spec.quotas.max_nodes))
    .bind(bind_quota(spec.quotas.max_gpus))
    .fetch_one(conn)
    .await?;
    row.try_into()
}

/// Sets the state and bumps the generation. The caller holds the row lock.
pub async fn set_state(conn: &mut Conn, id: TenantId, state: TenantState) -> Result<Tenant, StoreError> {
    let row: TenantRow = sqlx::query_as(&format!(
        "update tenants set state = $2, generation = generation + 1, updated_at = now() \
         where id = $1 and deleted_at is null returning {COLUMNS}"
    ))
    .bind(id.uuid())
    .bind(state.as_str())
    .fetch_one(conn)
    .await?;
    row.try_into()
}

/// Marks a tenant deleted.
pub async fn mark_deleted(conn: &mut Conn, id: TenantId) -> Result<(), StoreError> {
    sqlx::query("update tenants set deleted_at = now(), updated_at = now() where id = $1 and deleted_at is null")
        .bind(id.uuid())
        .execute(conn)
        .await?;
    Ok(())
}

/// Whether the tenant still holds anything that outlives it: clusters (deleting ones included)
/// or machines.
pub async fn has_holdings(conn: &mut Conn, id: TenantId) -> Result<bool, StoreError> {
    let held: bool = sqlx::query_scalar(
        "select exists (select 1 from clusters where tenant_id = $1 and deleted_at is null)          or exists (select 1 from machines where tenant_id = $1 and retired_at is null)",
    )
    .bind(id.uuid())
    .fetch_one(conn)
    .await?;
    Ok(held)
}
