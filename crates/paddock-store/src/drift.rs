//! Drift checks of ready clusters (docs/architecture.md): every ready cluster has one queued
//! [`CLUSTER_DRIFT_CHECK`] job, due a drift interval after the last check (spread, so clusters that
//! became ready together do not wake together). The job shares the cluster's target with its
//! reconcile job, so the queue never runs the two at once. It is armed in the transaction that
//! writes a ready status, and by [`arm_unarmed`] at every worker start (clusters that were ready
//! before drift checks existed, or while they were switched off).

use std::time::Duration;

use chrono::Utc;
use paddock_domain::job_kind::{ClusterJob, Payload, CLUSTER_DRIFT_CHECK};
use paddock_types::{ClusterId, JobId, TenantId};
use uuid::Uuid;

use crate::{job, Conn, StoreError};

/// Queues the cluster's drift check `after` from now (merged into a queued one: the earlier wins).
pub async fn arm(conn: &mut Conn, tenant: TenantId, cluster: ClusterId, after: Duration) -> Result<(), StoreError> {
    let run_at = Utc::now() + chrono::Duration::from_std(after).unwrap_or(chrono::Duration::MAX);
    let new = job::NewJob {
        kind: CLUSTER_DRIFT_CHECK,
        target_type: "cluster",
        target_id: cluster.uuid(),
        payload: ClusterJob { tenant_id: tenant, cluster_id: cluster }.to_value(),
        tenant_id: Some(tenant),
        operation_id: None,
        run_at: Some(run_at),
    };
    job::enqueue(conn, &new).await?;
    Ok(())
}

/// Arms the drift check of every ready cluster that has none queued or running, each due at a
/// random moment within `interval` (so a fleet armed at once is checked evenly); how many it
/// armed. One read and one insert, however many clusters.
pub async fn arm_unarmed(conn: &mut Conn, interval: Duration) -> Result<u64, StoreError> {
    let unarmed: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "select c.tenant_id, c.id from clusters c \
         where c.phase = 'ready' and c.deletion_requested_at is null and c.deleted_at is null \
           and not exists (select 1 from jobs j where j.target_id = c.id and j.kind = $1 \
                           and j.state in ('queued', 'running'))",
    )
    .bind(CLUSTER_DRIFT_CHECK)
    .fetch_all(&mut *conn)
    .await?;
    if unarmed.is_empty() {
        return Ok(0);
    }
    let (mut ids, mut targets, mut tenants, mut payloads) = (vec![], vec![], vec![], vec![]);
    for (tenant, cluster) in unarmed {
        ids.push(JobId::new().uuid());
        targets.push(cluster);
        tenants.push(tenant);
        payloads.push(ClusterJob { tenant_id: TenantId(tenant), cluster_id: ClusterId(cluster) }.to_value());
    }
    let span_ms = i64::try_from(interval.as_millis()).unwrap_or(i64::MAX);
    let armed = sqlx::query(
        "insert into jobs (id, kind, target_type, target_id, payload, run_at, tenant_id) \
         select id, $1, 'cluster', target, payload, now() + random() * $6 * interval '1 millisecond', tenant \
         from unnest($2::uuid[], $3::uuid[], $4::jsonb[], $5::uuid[]) as u(id, target, payload, tenant) \
         on conflict (target_id, kind) where state = 'queued' do nothing",
    )
    .bind(CLUSTER_DRIFT_CHECK)
    .bind(&ids)
    .bind(&targets)
    .bind(&payloads)
    .bind(&tenants)
    .bind(span_ms)
    .execute(conn)
    .await?;
    Ok(armed.rows_affected())
}
