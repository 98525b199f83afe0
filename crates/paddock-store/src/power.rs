//! The power sync's bookkeeping: which machines are due for a power check, the drift
//! count of each, the fleet-wide job and the per-machine correction jobs, and the guarded moves
//! out of service after repeated drift.
//!
//! `power_checked_at` and `power_drift_count` are bookkeeping: writing them bumps neither
//! `status_version` nor `updated_at`, so a check never makes a reconciler's guarded write lose a
//! race. Moves out of service are guarded on state and status version like every other status
//! write, and recorded in the custody ledger in the same transaction.

use std::time::Duration;

use paddock_domain::job_kind::{MachineJob, Payload, MACHINE_RECONCILE, POWER_SYNC};
use paddock_domain::ledger::LedgerKey;
use paddock_types::machine::MachineState;
use paddock_types::MachineId;
use serde_json::{json, Value};
use sqlx::Connection;
use uuid::Uuid;

use crate::custody::{self, WORKER_ACTOR};
use crate::{job, Conn, StoreError, Txn};

/// The target type of the one fleet-wide power-sync job.
pub const FLEET_TARGET_TYPE: &str = "fleet";

/// The target type of a per-machine correction job.
pub const MACHINE_TARGET_TYPE: &str = "machine";

/// The fixed target id of the fleet-wide job: one queued job per (target, kind) keeps it a
/// singleton however many workers enqueue it at start.
const FLEET_TARGET: Uuid = Uuid::from_u128(0x7061_6464_6f63_6b00_0000_0000_0000_0001);

/// The states whose power is known: off for `available`, `maintenance` and `clean_failed`, on for
/// `active`. Every other state is mid-flow, and the machine reconciler owns its power.
pub const STABLE_STATES: [MachineState; 4] =
    [MachineState::Available, MachineState::Active, MachineState::Maintenance, MachineState::CleanFailed];

/// Whether a machine in `state` should be powered on; `None` for states the power sync leaves
/// alone.
pub fn expected_power_on(state: MachineState) -> Option<bool> {
    match state {
        MachineState::Active => Some(true),
        MachineState::Available | MachineState::Maintenance | MachineState::CleanFailed => Some(false),
        _ => None,
    }
}

fn stable_names() -> Vec<&'static str> {
    STABLE_STATES.iter().map(|s| s.as_str()).collect()
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Enqueues the fleet-wide job to run now (merged into the queued one, if any). Called at worker
/// start: idempotent, and any number of workers share the one job.
pub async fn enqueue_fleet_job(conn: &mut Txn<'_>) -> Result<(), StoreError> {
    let new = job::NewJob {
        kind: POWER_SYNC,
        target_type: FLEET_TARGET_TYPE,
        target_id: FLEET_TARGET,
        payload: json!({}),
        tenant_id: None,
        operation_id: None,
        run_at: None,
    };
    job::enqueue(conn, &new).await?;
    Ok(())
}

/// Enqueues a correction job for a machine whose power drifted. It shares the machine's target
/// with `machine_reconcile`, so the queue never runs the two at once.
pub async fn enqueue_correction(conn: &mut Txn<'_>, machine: MachineId) -> Result<(), StoreError> {
    let new = job::NewJob {
        kind: POWER_SYNC,
        target_type: MACHINE_TARGET_TYPE,
        target_id: machine.uuid(),
        payload: MachineJob { machine_id: machine }.to_value(),
        tenant_id: None,
        operation_id: None,
        run_at: None,
    };
    job::enqueue(conn, &new).await?;
    Ok(())
}

/// Up to `limit` machines in stable states not checked for `interval` (never-checked first, then
/// the oldest check), skipping machines with an open job of their own (a reconcile or a
/// correction queued or running): those are being worked on, and are looked at next time.
pub async fn due(conn: &mut Conn, interval: Duration, limit: u32) -> Result<Vec<MachineId>, StoreError> {
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "select m.id from machines m \
         where m.state = any($1) \
           and (m.power_checked_at is null or m.power_checked_at <= now() - $2 * interval '1 millisecond') \
           and not exists (select 1 from jobs j where j.target_id = m.id and j.state in ('queued', 'running')) \
         order by m.power_checked_at nulls first, m.id limit $3",
    )
    .bind(stable_names())
    .bind(millis(interval))
    .bind(i64::from(limit))
    .fetch_all(conn)
    .await?;
    Ok(ids.into_iter().map(MachineId).collect())
}

/// How long until the next machine [`due`] would pick comes due (zero when one is due now);
/// `None` when there is no such machine.
pub async fn next_due_in(conn: &mut Conn, interval: Duration) -> Result<Option<Duration>, StoreError> {
    let millis_left: Option<f64> = sqlx::query_scalar(
        "select (case when bool_or(m.power_checked_at is null) then 0 \
             else greatest(extract(epoch from (min(m.power_checked_at) + $2 * interval '1 millisecond' - now())) \
                 * 1000, 0) end)::float8 \
         from machines m where m.state = any($1) \
           and not exists (select 1 from jobs j where j.target_id = m.id and j.state in ('queued', 'running')) \
         having count(*) > 0",
    )
    .bind(stable_names())
    .bind(millis(interval))
    .fetch_optional(conn)
    .await?;
    Ok(millis_left.map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1000.0)))
}

/// Whether the machine has a `machine_reconcile` job queued or running.
pub async fn reconcile_pending(conn: &mut Conn, machine: MachineId) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(
        "select exists (select 1 from jobs where target_id = $1 and kind = $2 and state in ('queued', 'running'))",
    )
    .bind(machine.uuid())
    .bind(MACHINE_RECONCILE)
    .fetch_one(conn)
    .await?)
}

/// Records a check that found the power as expected (or could not tell: `reset` false): stamps
/// `power_checked_at`, and with `reset` clears the drift count.
pub async fn record_check(conn: &mut Conn, machine: MachineId, reset: bool) -> Result<(), StoreError> {
    sqlx::query(
        "update machines set power_checked_at = now(), \
         power_drift_count = case when $2 then 0 else power_drift_count end where id = $1",
    )
    .bind(machine.uuid())
    .bind(reset)
    .execute(conn)
    .await?;
    Ok(())
}

/// Records a check that found the power drifted while the machine was still in `state` at
/// `status_version`; returns the drift count now, or `None` when the machine moved on (then the
/// drift is no longer a drift of the state it was read in).
pub async fn record_drift(
    conn: &mut Conn,
    machine: MachineId,
    state: MachineState,
    status_version: i64,
) -> Result<Option<u32>, StoreError> {
    let count: Option<i32> = sqlx::query_scalar(
        "update machines set power_checked_at = now(), power_drift_count = power_drift_count + 1 \
         where id = $1 and state = $2 and status_version = $3 returning power_drift_count",
    )
    .bind(machine.uuid())
    .bind(state.as_str())
    .bind(status_version)
    .fetch_optional(conn)
    .await?;
    // The column has `check (power_drift_count >= 0)`.
    Ok(count.map(|c| u32::try_from(c).unwrap_or(0)))
}

/// The machine's drift count.
pub async fn drift_count(conn: &mut Conn, machine: MachineId) -> Result<u32, StoreError> {
    let count: Option<i32> = sqlx::query_scalar("select power_drift_count from machines where id = $1")
        .bind(machine.uuid())
        .fetch_optional(conn)
        .await?;
    Ok(count.and_then(|c| u32::try_from(c).ok()).unwrap_or(0))
}

/// Moves an `available` machine to `maintenance` with `reason` (the maintenance reason) and a
/// `last_error` of `code`/`message`, guarded on state and status version; records the move in
/// the custody ledger with `evidence`, in the same transaction. The drift count restarts: the
/// machine leaves maintenance only through cleaning, and is judged afresh afterwards. False when
/// someone else moved the machine first.
#[expect(clippy::too_many_arguments, reason = "the guarded move, its reason and its evidence: all distinct values")]
pub async fn to_maintenance(
    conn: &mut Conn,
    key: &LedgerKey,
    machine: MachineId,
    from: MachineState,
    status_version: i64,
    reason: &str,
    code: &str,
    message: &str,
    evidence: &Value,
) -> Result<bool, StoreError> {
    let mut tx = conn.begin().await?;
    let done = sqlx::query(
        "update machines set state = 'maintenance', maintenance_reason = $4, \
         last_error = jsonb_build_object('code', $5::text, 'message', $6::text, 'at', now()), \
         power_drift_count = 0, status_version = status_version + 1, updated_at = now() \
         where id = $1 and state = $2 and status_version = $3",
    )
    .bind(machine.uuid())
    .bind(from.as_str())
    .bind(status_version)
    .bind(reason)
    .bind(code)
    .bind(message)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() != 1 {
        return Ok(false);
    }
    custody::append(&mut tx, key, machine, Some(from), MachineState::Maintenance, WORKER_ACTOR, message, evidence)
        .await?;
    tx.commit().await?;
    Ok(true)
}

/// Records the intent to take a machine that holds a tenancy (`active`) out of service with
/// `reason`, as an operator's maintenance request would (bumping the generation), with a
/// `last_error` of `code`/`message`; guarded on state and status version, and only when no
/// maintenance is requested yet. The machine reconciler then releases it through cleaning (every
/// exit from a tenancy passes through cleaning) into maintenance, recording each move. The
/// caller enqueues the machine's reconcile job in the same transaction. False when the machine
/// moved on or already has an intent.
pub async fn request_maintenance(
    conn: &mut Conn,
    machine: MachineId,
    from: MachineState,
    status_version: i64,
    reason: &str,
    code: &str,
    message: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "update machines set maintenance_reason = $4, \
         last_error = jsonb_build_object('code', $5::text, 'message', $6::text, 'at', now()), \
         power_drift_count = 0, generation = generation + 1, status_version = status_version + 1, \
         updated_at = now() \
         where id = $1 and state = $2 and status_version = $3 and maintenance_reason is null",
    )
    .bind(machine.uuid())
    .bind(from.as_str())
    .bind(status_version)
    .bind(reason)
    .bind(code)
    .bind(message)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}
