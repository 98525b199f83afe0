//! Drift checks of ready clusters (docs/architecture.md): every ready cluster has one queued
//! [`CLUSTER_DRIFT_CHECK`] job, due a drift interval after the last check (spread, so clusters that
//! became ready together do not wake together). The job shares the cluster's target with its
//! reconcile job, so the queue never runs the two at once. It is armed in the transaction that
//! writes a ready status, and by [`arm_unarmed`] at every worker start (clusters that were ready
//! before drift checks existed, or while they were switched off).

use std::time::Duration;

use paddock_domain::job_kind::CLUSTER_DRIFT_CHECK;
use paddock_types::{ClusterId, TenantId};
use uuid::Uuid;

use crate::{job, Conn, StoreError, Txn};

/// Queues the cluster's drift check `after` from now (merged into a queued one: the earlier wins).
pub async fn arm(conn: &mut Txn<'_>, tenant: TenantId, cluster: ClusterId, after: Duration) -> Result<(), StoreError> {
    job::arm_cluster(conn, CLUSTER_DRIFT_CHECK, tenant, cluster, after).await
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
    job::arm_clusters(conn, CLUSTER_DRIFT_CHECK, &unarmed, interval).await
}
