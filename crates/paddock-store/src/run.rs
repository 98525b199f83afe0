//! Agent runs (docs/security.md): a wipe in `cleaning` or a provisioning boot in `provisioning`,
//! decided and recorded on the machine before it boots (`run_id`), then its boot
//! (`run_booted_at`), the agent's report (in `agent_tokens`, see `agent`) and the media ejected
//! after it (`run_finished_at`). Every write is guarded on the machine's state and status version
//! read before it. A run's end is a lifecycle transition (`lifecycle::complete_clean`,
//! `lifecycle::end_run`, `lifecycle::activate`).

use chrono::{DateTime, Utc};
use paddock_domain::ledger::LedgerKey;
use paddock_types::machine::MachineState;
use paddock_types::MachineId;
use serde_json::{json, Value};
use sqlx::Connection;
use uuid::Uuid;

use crate::custody::{self, WORKER_ACTOR};
use crate::{Conn, StoreError};

/// A machine's holder as the start of a run returns it: allocation, tenant, cluster, pool.
type Holder = (Option<Uuid>, Option<Uuid>, Option<Uuid>, Option<Uuid>);

/// Purpose of an agent run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunPurpose {
    /// A wipe in `cleaning`.
    Wipe,
    /// A provisioning boot in `provisioning`.
    Provision,
    /// An acceptance image's boot in `cleaning`, after a verified wipe (see `acceptance`).
    Acceptance,
}

impl RunPurpose {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Wipe => "wipe",
            Self::Provision => "provision",
            Self::Acceptance => "acceptance",
        }
    }
}

/// The agent run a machine is in.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The run.
    pub run_id: Uuid,
    /// `wipe` or `provision`.
    pub run_purpose: String,
    /// When the machine was last booted into the run's media.
    pub run_booted_at: Option<DateTime<Utc>>,
    /// When the media were ejected and the boot device set back to disk after the report.
    pub run_finished_at: Option<DateTime<Utc>>,
    /// The agent's report of the run, once it arrived.
    pub report: Option<RunReport>,
}

/// The columns of [`RunRow`], from `machines m` joined with [`REPORT_JOIN`].
pub(crate) const RUN_COLUMNS: &str = "m.run_id, m.run_purpose, m.run_booted_at, m.run_finished_at, \
     r.verified as report_verified, r.failure as report_failure, r.report as report_body, r.used_at as report_used_at";

/// The first report of the machine's current run (a token is used once; a run has one report).
pub(crate) const REPORT_JOIN: &str = " left join lateral (select coalesce(t.verified, false) as verified, t.failure, \
     t.report, t.used_at from agent_tokens t \
     where t.machine_id = m.id and t.run_id = m.run_id and t.used_at is not null order by t.used_at limit 1) r on true";

/// A machine's run and its report as read with [`RUN_COLUMNS`].
#[derive(sqlx::FromRow)]
pub(crate) struct RunRow {
    run_id: Option<Uuid>,
    run_purpose: Option<String>,
    run_booted_at: Option<DateTime<Utc>>,
    run_finished_at: Option<DateTime<Utc>>,
    report_verified: Option<bool>,
    report_failure: Option<String>,
    report_body: Option<Value>,
    report_used_at: Option<DateTime<Utc>>,
}

impl RunRow {
    /// The run, if the machine is in one.
    pub(crate) fn into_run(self) -> Option<Run> {
        let (Some(run_id), Some(run_purpose)) = (self.run_id, self.run_purpose) else {
            return None;
        };
        let report = match (self.report_used_at, self.report_body) {
            (Some(used_at), Some(report)) => Some(RunReport {
                verified: self.report_verified.unwrap_or(false),
                failure: self.report_failure,
                report,
                used_at,
            }),
            _ => None,
        };
        Some(Run {
            run_id,
            run_purpose,
            run_booted_at: self.run_booted_at,
            run_finished_at: self.run_finished_at,
            report,
        })
    }
}

/// The run of a machine, with its report, if it is in one.
pub async fn run_of(conn: &mut Conn, id: MachineId) -> Result<Option<Run>, StoreError> {
    let row: Option<RunRow> = sqlx::query_as(&format!(
        "select {RUN_COLUMNS} from machines m{REPORT_JOIN} where m.id = $1 and m.run_id is not null"
    ))
    .bind(id.uuid())
    .fetch_optional(conn)
    .await?;
    Ok(row.and_then(RunRow::into_run))
}

/// Starts a run for a machine in `state` (decided before the machine boots, so a crash re-enters
/// the same run), optionally moving it to `to` in the same write. Guarded. A move is recorded in
/// the custody ledger in the same transaction.
pub async fn start_run(
    conn: &mut Conn,
    key: &LedgerKey,
    id: MachineId,
    state: MachineState,
    status_version: i64,
    to: MachineState,
    purpose: RunPurpose,
) -> Result<bool, StoreError> {
    let run_id = Uuid::now_v7();
    let mut tx = conn.begin().await?;
    let holder: Option<Holder> = sqlx::query_as(
        "update machines set state = $4, run_id = $5, run_purpose = $6, run_booted_at = null, run_finished_at = null, \
         last_error = null, status_version = status_version + 1, updated_at = now() \
         where id = $1 and state = $2 and status_version = $3 \
         returning allocation_id, tenant_id, cluster_id, node_pool_id",
    )
    .bind(id.uuid())
    .bind(state.as_str())
    .bind(status_version)
    .bind(to.as_str())
    .bind(run_id)
    .bind(purpose.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    let Some((allocation, tenant, cluster, pool)) = holder else {
        return Ok(false);
    };
    if state != to {
        let reason = match purpose {
            RunPurpose::Wipe => "wipe started",
            RunPurpose::Provision => "provisioning started: booting the node OS with the cluster's join configuration",
            RunPurpose::Acceptance => "acceptance started",
        };
        let evidence = json!({
            "run_id": run_id, "purpose": purpose.as_str(), "allocation_id": allocation,
            "tenant_id": tenant, "cluster_id": cluster, "node_pool_id": pool,
        });
        custody::append(&mut tx, key, id, Some(state), to, WORKER_ACTOR, reason, &evidence).await?;
    }
    tx.commit().await?;
    Ok(true)
}

/// Records that the machine booted into its run's media (now). Guarded.
pub async fn mark_booted(
    conn: &mut Conn,
    id: MachineId,
    state: MachineState,
    status_version: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "update machines set run_booted_at = now(), last_error = null, status_version = status_version + 1, \
         updated_at = now() where id = $1 and state = $2 and status_version = $3 and run_id is not null",
    )
    .bind(id.uuid())
    .bind(state.as_str())
    .bind(status_version)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records that the run's media were ejected and the boot device set back to disk. Guarded.
pub async fn mark_finished(
    conn: &mut Conn,
    id: MachineId,
    state: MachineState,
    status_version: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "update machines set run_finished_at = now(), status_version = status_version + 1, updated_at = now() \
         where id = $1 and state = $2 and status_version = $3 and run_id is not null",
    )
    .bind(id.uuid())
    .bind(state.as_str())
    .bind(status_version)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Ends every unused token of a run now: a re-issued boot of the same run gets a fresh token, and
/// the lost one (its plain text existed only in the seed of a boot that is being replaced) can no
/// longer report.
pub async fn expire_unused_tokens(conn: &mut Conn, run_id: Uuid) -> Result<(), StoreError> {
    sqlx::query("update agent_tokens set expires_at = least(expires_at, now()) where run_id = $1 and used_at is null")
        .bind(run_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// The agent's report of a run, if it arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    /// Whether the report proves the run (a wipe: every drive wiped, with complete evidence,
    /// from the configured image).
    pub verified: bool,
    /// Why it does not, naming each drive that falls short (`drive nvme1: verification missing`).
    pub failure: Option<String>,
    /// The report as the agent sent it.
    pub report: Value,
    /// When it arrived.
    pub used_at: DateTime<Utc>,
}
