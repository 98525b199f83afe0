//! Acceptance (docs/acceptance.md): the run a machine of a class with an acceptance image makes
//! after the verified wipe of its enrollment or of its return from maintenance, before it
//! becomes `available`. The machine stays in `cleaning` throughout: the wipe's clean is recorded
//! (and becomes the machine's `clean_id`) when the wipe is verified, and the acceptance run takes
//! the wipe run's place on the machine (`run_purpose = 'acceptance'`), with tokens of its own.
//! A passed acceptance makes the machine `available`; a failed or timed-out one sends it to
//! `maintenance` with the reason, and records a `failed` health report with source `acceptance`.
//! Each step appends its custody entry in the same transaction, guarded like every lifecycle write.

use paddock_domain::ledger::LedgerKey;
use paddock_types::health::{HealthCheck, HealthSource, HealthStatus};
use paddock_types::machine::MachineState;
use paddock_types::machine_class::MachineClassAcceptance;
use paddock_types::{MachineClassId, MachineId};
use serde_json::{json, Value};
use sqlx::Connection;
use uuid::Uuid;

use crate::custody::{self, WORKER_ACTOR};
use crate::{health, lifecycle, Conn, StoreError, Txn};

/// Whether the machine's current stay in `cleaning` is one an acceptance follows: it began at the
/// machine's enrollment (from `inspecting`) or at its return from maintenance. A stay that ends a
/// tenancy (from `releasing` or `provision_failed`) is only wiped: the machine was accepted when
/// it entered the fleet, and a fault seen in a tenancy is a health report's to raise.
pub async fn due(conn: &mut Conn, id: MachineId) -> Result<bool, StoreError> {
    // Every move into cleaning appended a custody entry in its transaction; the entries within
    // the stay (cleaning -> cleaning) are skipped.
    let from: Option<Option<String>> = sqlx::query_scalar(
        "select from_state from custody_entries where machine_id = $1 and to_state = 'cleaning' \
         and from_state is distinct from 'cleaning' order by seq desc limit 1",
    )
    .bind(id.uuid())
    .fetch_optional(conn)
    .await?;
    Ok(matches!(from.flatten().as_deref(), Some("inspecting" | "maintenance")))
}

/// Records the verified wipe of run `wipe_run` as the machine's clean and starts its acceptance
/// run in the wipe run's place, the machine staying in `cleaning` (guarded on its status version
/// and on the wipe run). The custody entry carries the clean's evidence and the image to boot.
/// Returns how long the machine has been in cleaning (the wipe's duration, for the wipe's
/// metric); `None` when someone else moved the machine first (nothing written).
pub async fn start_after_wipe(
    conn: &mut Conn,
    key: &LedgerKey,
    id: MachineId,
    status_version: i64,
    wipe_run: Uuid,
    evidence: &Value,
    acceptance: &MachineClassAcceptance,
) -> Result<Option<std::time::Duration>, StoreError> {
    let mut tx = conn.begin().await?;
    let clean_id = Uuid::now_v7();
    sqlx::query(
        "insert into machine_cleans (id, machine_id, run_id, method, evidence, completed_at) \
         values ($1, $2, $3, 'agent', $4, clock_timestamp()) on conflict (run_id) do nothing",
    )
    .bind(clean_id)
    .bind(id.uuid())
    .bind(wipe_run)
    .bind(evidence)
    .execute(&mut *tx)
    .await?;
    let run_id = Uuid::now_v7();
    let moved: Option<(Uuid, Option<f64>)> = sqlx::query_as(
        "update machines m set clean_id = c.id, run_id = $4, run_purpose = 'acceptance', run_booted_at = null, \
         run_finished_at = null, last_error = null, status_version = m.status_version + 1, updated_at = now() \
         from machine_cleans c \
         where m.id = $1 and m.state = 'cleaning' and m.status_version = $2 and m.run_id = $3 \
           and c.run_id = $3 and c.machine_id = m.id \
         returning c.id, extract(epoch from c.completed_at - \
           (select max(e.at) from custody_entries e where e.machine_id = m.id and e.to_state = 'cleaning' \
              and e.from_state is distinct from 'cleaning'))::float8",
    )
    .bind(id.uuid())
    .bind(status_version)
    .bind(wipe_run)
    .bind(run_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((clean_id, in_cleaning)) = moved else {
        return Ok(None);
    };
    let evidence = json!({
        "clean": evidence,
        "clean_id": clean_id,
        "acceptance": {
            "run_id": run_id,
            "image_url": acceptance.image_url,
            "image_sha256": acceptance.image_sha256,
            "timeout_seconds": acceptance.timeout_seconds,
        },
    });
    let (from, to) = (MachineState::Cleaning, MachineState::Cleaning);
    let reason = "verified wipe: every listed drive wiped; acceptance started";
    custody::append(&mut tx, key, id, Some(from), to, WORKER_ACTOR, reason, &evidence).await?;
    tx.commit().await?;
    let seconds = std::time::Duration::try_from_secs_f64(in_cleaning.unwrap_or(0.0)).unwrap_or_default();
    Ok(Some(seconds))
}

/// A passed acceptance: the machine becomes `available` on the clean its wipe recorded (guarded
/// on the acceptance run), with the report as the custody entry's evidence; wakes the first
/// cluster waiting for its class. False when someone else moved the machine first.
pub async fn pass(
    conn: &mut Txn<'_>,
    key: &LedgerKey,
    id: MachineId,
    status_version: i64,
    run_id: Uuid,
    evidence: &Value,
) -> Result<bool, StoreError> {
    let mut tx = conn.begin().await?;
    let moved: Option<(Uuid, Option<Uuid>)> = sqlx::query_as(
        "update machines set state = 'available', run_id = null, run_purpose = null, run_booted_at = null, \
         run_finished_at = null, last_error = null, status_version = status_version + 1, updated_at = now() \
         where id = $1 and state = 'cleaning' and status_version = $2 and run_id = $3 \
           and run_purpose = 'acceptance' and clean_id is not null \
         returning machine_class_id, clean_id",
    )
    .bind(id.uuid())
    .bind(status_version)
    .bind(run_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((class, clean_id)) = moved else {
        return Ok(false);
    };
    let evidence = json!({ "acceptance": evidence, "clean_id": clean_id });
    let (from, to) = (MachineState::Cleaning, MachineState::Available);
    custody::append(&mut tx, key, id, Some(from), to, WORKER_ACTOR, "acceptance passed", &evidence).await?;
    lifecycle::wake_waiting(&mut tx, &[MachineClassId(class)]).await?;
    tx.commit().await?;
    Ok(true)
}

/// Why an acceptance failed.
#[derive(Debug, Clone)]
pub struct Failure<'a> {
    /// `acceptance_failed` or `acceptance_timed_out`: the machine's `last_error.code`.
    pub code: &'a str,
    /// The reason, for people: the machine's `last_error.message` and maintenance reason.
    pub message: &'a str,
    /// The checks the image reported (none for a timeout).
    pub checks: &'a [HealthCheck],
}

/// A failed (or timed-out) acceptance: the machine goes to `maintenance` with the reason (it
/// leaves only when an operator returns it, which wipes and accepts it again), and a `failed`
/// health report with source `acceptance` is recorded, in one transaction. False when someone
/// else moved the machine first (nothing written).
pub async fn fail(
    conn: &mut Txn<'_>,
    key: &LedgerKey,
    id: MachineId,
    status_version: i64,
    failure: &Failure<'_>,
) -> Result<bool, StoreError> {
    let mut tx = conn.begin().await?;
    let error = Some((failure.code, failure.message));
    let (from, to) = (MachineState::Cleaning, MachineState::Maintenance);
    let reason = format!("{}: {}", failure.code, failure.message);
    let reason: String = reason.chars().take(health::REASON_MAX).collect();
    if !lifecycle::end_run(&mut tx, key, id, from, status_version, to, error, Some(&reason)).await? {
        return Ok(false);
    }
    // The image's checks; where none of them failed (a timeout, another image, no checks), one
    // more names why the acceptance did.
    let mut checks = failure.checks.to_vec();
    if checks.iter().all(|c| c.status == HealthStatus::Healthy) {
        checks.push(HealthCheck {
            name: "acceptance".to_owned(),
            status: HealthStatus::Failed,
            detail: failure.message.chars().take(1000).collect(),
        });
    }
    let report = health::NewReport {
        machine: id,
        status: HealthStatus::Failed,
        checks: &checks,
        source: HealthSource::Acceptance,
        reporter: WORKER_ACTOR,
        observed_at: None,
    };
    health::insert(&mut tx, key, &report).await?;
    tx.commit().await?;
    Ok(true)
}
