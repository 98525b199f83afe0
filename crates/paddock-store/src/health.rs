//! Machine health reports: appended, never changed (the table refuses updates and deletes).

use chrono::{DateTime, Utc};
use paddock_domain::ledger::LedgerKey;
use paddock_types::health::{HealthCheck, HealthReportView, HealthSource, HealthStatus};
use paddock_types::remediation::RemediationSource;
use paddock_types::MachineId;
use sqlx::types::Json;
use uuid::Uuid;

use crate::{from_json, parse_state, remediation, Conn, StoreError, Txn};

/// A report to record.
#[derive(Debug, Clone)]
pub struct NewReport<'a> {
    /// The machine.
    pub machine: MachineId,
    /// Its health as a whole.
    pub status: HealthStatus,
    /// The checks behind it.
    pub checks: &'a [HealthCheck],
    /// Who said it.
    pub source: HealthSource,
    /// The operator's subject.
    pub reporter: &'a str,
    /// When it was observed (`None`: now).
    pub observed_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct ReportRow {
    id: Uuid,
    machine_id: Uuid,
    status: String,
    checks: serde_json::Value,
    source: String,
    reporter: String,
    observed_at: DateTime<Utc>,
    recorded_at: DateTime<Utc>,
}

impl ReportRow {
    fn view(self) -> Result<HealthReportView, StoreError> {
        Ok(HealthReportView {
            id: self.id,
            machine_id: MachineId(self.machine_id),
            status: parse_state(&self.status, HealthStatus::parse)?,
            checks: from_json(self.checks)?,
            source: parse_state(&self.source, HealthSource::parse)?,
            reporter: Some(self.reporter),
            observed_at: self.observed_at,
            recorded_at: self.recorded_at,
        })
    }
}

const COLUMNS: &str = "r.id, r.machine_id, r.status, r.checks, r.source, r.reporter, r.observed_at, r.recorded_at";

/// Records a report against the machine's current tenancy, if it is in one (its tenant then reads
/// it). `None` when the machine does not exist.
pub async fn insert(
    conn: &mut Txn<'_>,
    key: &LedgerKey,
    new: &NewReport<'_>,
) -> Result<Option<HealthReportView>, StoreError> {
    let row: Option<ReportRow> = sqlx::query_as(&format!(
        "with r as ( \
           insert into machine_health_reports \
             (id, machine_id, allocation_id, status, checks, source, reporter, observed_at, recorded_at) \
           select $1, m.id, m.allocation_id, $3, $4, $5, $6, coalesce($7, now()), now() from machines m where m.id = $2 \
           returning *) \
         select {COLUMNS} from r"
    ))
    .bind(Uuid::now_v7())
    .bind(new.machine.uuid())
    .bind(new.status.as_str())
    .bind(Json(new.checks))
    .bind(new.source.as_str())
    .bind(new.reporter)
    .bind(new.observed_at)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(report) = row.map(ReportRow::view).transpose()? else {
        return Ok(None);
    };
    if report.status == HealthStatus::Failed {
        let failed = Failed { report: report.id, machine: report.machine_id, source: report.source };
        remediate(conn, key, &failed, new.reporter, &report.checks).await?;
    }
    Ok(Some(report))
}

/// A `failed` report: which, of what machine, from whom.
#[derive(Debug, Clone, Copy)]
struct Failed {
    report: Uuid,
    machine: MachineId,
    source: HealthSource,
}

/// Starts the remediation of a machine a `failed` report is about (see
/// [`crate::remediation::start`]: only while a tenant holds it, where its pool remediates on its
/// own, and once while one is open), in the report's transaction.
async fn remediate(
    conn: &mut Txn<'_>,
    key: &LedgerKey,
    failed: &Failed,
    actor: &str,
    checks: &[HealthCheck],
) -> Result<(), StoreError> {
    let Failed { report, machine, source } = *failed;
    let reason = failure_reason(source, checks);
    let source = match source {
        HealthSource::Operator => RemediationSource::Operator,
        HealthSource::Bmc => RemediationSource::Bmc,
        HealthSource::Kubernetes => RemediationSource::Kubernetes,
        HealthSource::Slurm => RemediationSource::Slurm,
        // An acceptance runs in `cleaning`, outside any tenancy: there is nothing to remediate
        // (the machine goes to maintenance instead).
        HealthSource::Acceptance => return Ok(()),
    };
    let start = remediation::Start { machine, reason: &reason, source, report_id: Some(report), actor };
    remediation::start(conn, key, &start).await?;
    Ok(())
}

/// A remediation's reason from a failed report: its failed checks (`name: detail`), at most
/// [`REASON_MAX`] characters.
fn failure_reason(source: HealthSource, checks: &[HealthCheck]) -> String {
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| c.status == HealthStatus::Failed)
        .map(|c| if c.detail.is_empty() { c.name.clone() } else { format!("{}: {}", c.name, c.detail) })
        .collect();
    let reason = if failed.is_empty() {
        format!("a failed health report ({})", source.as_str())
    } else {
        format!("failed health check ({}): {}", source.as_str(), failed.join("; "))
    };
    reason.chars().take(REASON_MAX).collect()
}

/// The longest reason a remediation (and the machine's maintenance reason) carries.
pub const REASON_MAX: usize = 900;

/// A machine's reports, newest first, before the keyset position `before` (an id).
pub async fn of_machine(
    conn: &mut Conn,
    machine: MachineId,
    before: Option<Uuid>,
    limit: u32,
) -> Result<Vec<HealthReportView>, StoreError> {
    let rows: Vec<ReportRow> = sqlx::query_as(&format!(
        "select {COLUMNS} from machine_health_reports r \
         where r.machine_id = $1 and ($2::uuid is null or r.id < $2) order by r.id desc limit $3"
    ))
    .bind(machine.uuid())
    .bind(before)
    .bind(i64::from(limit))
    .fetch_all(conn)
    .await?;
    rows.into_iter().map(ReportRow::view).collect()
}

/// The reports recorded during the machine's current tenancy, if `tenant`'s `cluster` holds it,
/// newest first, before `before`; without the reporter (a provider's operator is not the
/// tenant's to know).
pub async fn of_tenancy(
    conn: &mut Conn,
    tenant: paddock_types::TenantId,
    cluster: paddock_types::ClusterId,
    machine: MachineId,
    before: Option<Uuid>,
    limit: u32,
) -> Result<Vec<HealthReportView>, StoreError> {
    let rows: Vec<ReportRow> = sqlx::query_as(&format!(
        "select {COLUMNS} from machine_health_reports r join machines m on m.allocation_id = r.allocation_id \
         where m.id = $3 and m.tenant_id = $1 and m.cluster_id = $2 and r.machine_id = $3 \
           and ($4::uuid is null or r.id < $4) order by r.id desc limit $5"
    ))
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .bind(machine.uuid())
    .bind(before)
    .bind(i64::from(limit))
    .fetch_all(conn)
    .await?;
    rows.into_iter().map(|row| Ok(HealthReportView { reporter: None, ..row.view()? })).collect()
}

/// Records each machine's rating by `source` (one check each) where it differs from the last
/// report of that source on the machine (a machine is presumed healthy until a source says
/// otherwise), against the machine's current tenancy, in one statement; returns how many reports
/// were written. The sources paddock reads itself (the BMC, the tenant's Kubernetes) use it, so a
/// rating that holds is recorded once, not at every read. A `failed` rating starts the machine's
/// remediation (see [`insert`]), so the caller passes a transaction.
pub async fn record_changes(
    conn: &mut Txn<'_>,
    key: &LedgerKey,
    source: HealthSource,
    ratings: &[(MachineId, HealthCheck)],
) -> Result<u64, StoreError> {
    let ids: Vec<Uuid> = ratings.iter().map(|_| Uuid::now_v7()).collect();
    let machines: Vec<Uuid> = ratings.iter().map(|(m, _)| m.uuid()).collect();
    let statuses: Vec<&str> = ratings.iter().map(|(_, c)| c.status.as_str()).collect();
    let checks: Vec<serde_json::Value> = ratings.iter().map(|(_, c)| serde_json::json!([c])).collect();
    let written: Vec<(Uuid, Uuid, String)> = sqlx::query_as(
        "insert into machine_health_reports \
           (id, machine_id, allocation_id, status, checks, source, reporter, observed_at, recorded_at) \
         select r.id, m.id, m.allocation_id, r.status, r.checks, $1, 'paddock', now(), now() \
         from unnest($2::uuid[], $3::uuid[], $4::text[], $5::jsonb[]) as r(id, machine_id, status, checks) \
         join machines m on m.id = r.machine_id \
         where r.status <> coalesce((select x.status from machine_health_reports x \
           where x.machine_id = m.id and x.source = $1 order by x.id desc limit 1), 'healthy') \
         returning id, machine_id, status",
    )
    .bind(source.as_str())
    .bind(&ids)
    .bind(&machines)
    .bind(&statuses)
    .bind(&checks)
    .fetch_all(&mut *conn)
    .await?;
    for (id, machine, status) in &written {
        if status == HealthStatus::Failed.as_str() {
            let checks: Vec<HealthCheck> =
                ratings.iter().filter(|(m, _)| m.uuid() == *machine).map(|(_, c)| c.clone()).collect();
            let failed = Failed { report: *id, machine: MachineId(*machine), source };
            remediate(conn, key, &failed, crate::custody::WORKER_ACTOR, &checks).await?;
        }
    }
    Ok(u64::try_from(written.len()).unwrap_or(u64::MAX))
}
