//! Agent runs (SPEC section 5): a wipe in `cleaning` or a provisioning boot in `provisioning`,
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
}

impl RunPurpose {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Wipe => "wipe",
            Self::Provision => "provision",
        }
    }
}

/// The agent run a machine is in.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Run {
    /// The run.
    pub run_id: Uuid,
    /// `wipe` or `provision`.
    pub run_purpose: String,
    /// When the machine was last booted into the run's media.
    pub run_booted_at: Option<DateTime<Utc>>,
    /// When the media were ejected and the boot device set back to disk after the report.
    pub run_finished_at: Option<DateTime<Utc>>,
}

/// The run of a machine, if it is in one.
pub async fn run_of(conn: &mut Conn, id: MachineId) -> Result<Option<Run>, StoreError> {
    Ok(sqlx::query_as(
        "select run_id, run_purpose, run_booted_at, run_finished_at from machines where id = $1 and run_id is not null",
    )
    .bind(id.uuid())
    .fetch_optional(conn)
    .await?)
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
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
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

/// The report of `run_id` on `machine`, if one arrived.
pub async fn run_report(conn: &mut Conn, machine: MachineId, run_id: Uuid) -> Result<Option<RunReport>, StoreError> {
    Ok(sqlx::query_as(
        "select coalesce(verified, false) as verified, failure, report, used_at from agent_tokens \
         where machine_id = $1 and run_id = $2 and used_at is not null order by used_at limit 1",
    )
    .bind(machine.uuid())
    .bind(run_id)
    .fetch_optional(conn)
    .await?)
}
