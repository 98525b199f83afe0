//! A cluster's events (what its reconciler did, for its tenant). Every query takes the tenant and
//! filters on it.

use chrono::{DateTime, Utc};
use paddock_types::cluster::ClusterEventView;
use paddock_types::{ClusterId, TenantId};
use uuid::Uuid;

use crate::{Conn, StoreError};

/// Appends a cluster event.
pub async fn insert(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
    type_: &str,
    reason: &str,
    message: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "insert into cluster_events (id, tenant_id, cluster_id, type, reason, message) values ($1, $2, $3, $4, $5, $6)",
    )
    .bind(Uuid::now_v7())
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .bind(type_)
    .bind(reason)
    .bind(message)
    .execute(conn)
    .await?;
    Ok(())
}

#[derive(sqlx::FromRow)]
struct EventRow {
    id: Uuid,
    at: DateTime<Utc>,
    #[sqlx(rename = "type")]
    type_: String,
    reason: String,
    message: String,
}

/// A cluster's events after `after`, oldest first.
pub async fn list(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<ClusterEventView>, StoreError> {
    let rows: Vec<EventRow> = sqlx::query_as(
        "select id, at, type, reason, message from cluster_events where tenant_id = $1 and cluster_id = $2 \
         and ($3::uuid is null or id > $3) order by id limit $4",
    )
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| ClusterEventView { id: r.id, at: r.at, type_: r.type_, reason: r.reason, message: r.message })
        .collect())
}
