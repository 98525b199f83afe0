//! A cluster's periodic job (its drift check, its demand check): one queued job of the kind per
//! cluster, armed in the transaction that makes the cluster need it, and at every worker start
//! for the clusters that have none.

use std::time::Duration;

use chrono::Utc;
use paddock_domain::job_kind::{ClusterJob, Payload};
use paddock_types::{ClusterId, JobId, TenantId};
use uuid::Uuid;

use super::{enqueue, NewJob};
use crate::{Conn, StoreError, Txn};

/// Queues the cluster's `kind` job `after` from now (merged into a queued one: the earlier wins).
pub async fn arm_cluster(
    conn: &mut Txn<'_>,
    kind: &str,
    tenant: TenantId,
    cluster: ClusterId,
    after: Duration,
) -> Result<(), StoreError> {
    let run_at = Utc::now() + chrono::Duration::from_std(after).unwrap_or(chrono::Duration::MAX);
    let new = NewJob {
        kind,
        target_type: "cluster",
        target_id: cluster.uuid(),
        payload: ClusterJob { tenant_id: tenant, cluster_id: cluster }.to_value(),
        tenant_id: Some(tenant),
        operation_id: None,
        run_at: Some(run_at),
    };
    enqueue(conn, &new).await?;
    Ok(())
}

/// Queues a `kind` job for each of `clusters` (tenant id, cluster id), each due at a random moment
/// within `spread` (so a fleet armed at once runs evenly); a cluster that has one queued keeps it.
/// How many it queued: one insert, however many clusters.
pub async fn arm_clusters(
    conn: &mut Conn,
    kind: &str,
    clusters: &[(Uuid, Uuid)],
    spread: Duration,
) -> Result<u64, StoreError> {
    if clusters.is_empty() {
        return Ok(0);
    }
    let (mut ids, mut targets, mut tenants, mut payloads) = (vec![], vec![], vec![], vec![]);
    for &(tenant, cluster) in clusters {
        ids.push(JobId::new().uuid());
        targets.push(cluster);
        tenants.push(tenant);
        payloads.push(ClusterJob { tenant_id: TenantId(tenant), cluster_id: ClusterId(cluster) }.to_value());
    }
    let span_ms = i64::try_from(spread.as_millis()).unwrap_or(i64::MAX);
    let armed = sqlx::query(
        "insert into jobs (id, kind, target_type, target_id, payload, run_at, tenant_id) \
         select id, $1, 'cluster', target, payload, now() + random() * $6 * interval '1 millisecond', tenant \
         from unnest($2::uuid[], $3::uuid[], $4::jsonb[], $5::uuid[]) as u(id, target, payload, tenant) \
         on conflict (target_id, kind) where state = 'queued' do nothing",
    )
    .bind(kind)
    .bind(&ids)
    .bind(&targets)
    .bind(&payloads)
    .bind(&tenants)
    .bind(span_ms)
    .execute(conn)
    .await?;
    Ok(armed.rows_affected())
}
