//! Credits (docs/billing.md, "Credits"): the seconds of a failed machine that its tenant could
//! not use, given back as one `credit` adjustment per remediation.
//!
//! Only provider-side evidence earns one: a `failed` report from the machine's BMC or from an
//! operator. The tenant controls its Slurm drain reasons and its kubelet, so a report from its
//! Kubernetes (or its own `replace`) swaps the machine but credits nothing; a provider may still
//! grant a credit by an adjustment. The credit covers the machine from the first such report of
//! the tenancy (while the remediation was open, or the one that started it) until its usage
//! segment closed, and is written in the transaction that closes the segment, at the second it
//! closed. The unique key on `remediation_id` makes every further attempt write nothing.

use uuid::Uuid;

use crate::{Conn, StoreError};

/// The sources of health reports that are provider-side evidence (`machine_health_reports.source`).
pub const PROVIDER_SOURCES: [&str; 2] = ["operator", "bmc"];

/// Writes the credit of the remediation of the tenancy whose closed machine segment is `segment`,
/// if it earned one: a provider-side `failed` report that the segment outlasted. Returns the
/// adjustment's id; `None` when none is earned or it was written already. The caller's
/// transaction is a usage writer (it closed the segment, or joins here). The segment is read by
/// its key and the remediation by its allocation (an index each): this runs at every close.
pub async fn write(conn: &mut Conn, segment: Uuid) -> Result<Option<Uuid>, StoreError> {
    crate::usage::join_writers(conn).await?;
    let written: Option<Uuid> = sqlx::query_scalar(
        "insert into usage_adjustments (id, tenant_id, cluster_id, node_pool_id, machine_id, machine_class, \
           node_seconds, gpu_seconds, control_plane_seconds, corrects_period, reason, actor, recorded_at, \
           category, remediation_id) \
         select $2, s.tenant_id, s.cluster_id, s.node_pool_id, s.machine_id, s.machine_class, \
           -w.seconds, -w.seconds * s.gpu_count, 0, null, \
           'credit for remediation ' || r.id || ': the machine was reported failed (' || f.source || ' report ' \
             || f.id || ') and its tenant could not use it from then on; ' || r.reason, \
           'paddock', s.end_at, 'credit', r.id \
         from usage_segments s \
         join machine_remediations r on r.allocation_id = s.allocation_id \
         cross join lateral (select h.id, h.source, h.observed_at from machine_health_reports h \
           where h.machine_id = r.machine_id and h.allocation_id = r.allocation_id and h.status = 'failed' \
             and h.source = any($3) and (h.id = r.report_id or h.recorded_at >= r.started_at) \
           order by h.recorded_at, h.id limit 1) f \
         cross join lateral (select extract(epoch from s.end_at \
           - greatest(s.start_at, date_trunc('second', f.observed_at, 'UTC')))::bigint as seconds) w \
         where s.id = $1 and s.kind = 'machine' and s.end_at is not null and w.seconds > 0 \
         on conflict (remediation_id) where remediation_id is not null do nothing \
         returning id",
    )
    .bind(segment)
    .bind(Uuid::now_v7())
    .bind(&PROVIDER_SOURCES[..])
    .fetch_optional(conn)
    .await?;
    Ok(written)
}
