//! Enqueueing: a new job, or a request merged into the queued job of its kind and target.

use paddock_types::{JobId, OperationId, TenantId};
use uuid::Uuid;

use super::{NewJob, RACE_TURNS};
use crate::operation::end_running_steps;
use crate::{Conn, StoreError, Txn};

/// Enqueues a job, or merges the request into the queued job of the same kind and target.
///
/// Returns the id of the job that will carry the request out: a new job, the queued one it merged
/// into (its `run_at` becomes the earlier of the two; a new `operation_id` replaces the old one,
/// which is marked superseded if still open; the payload is kept), or a new follow-up job when the
/// job of that kind is running. Call it in the transaction of the state change; a job due now
/// wakes the workers of its kind once that transaction commits ([`Tx::commit`]).
pub async fn enqueue(tx: &mut Txn<'_>, job: &NewJob<'_>) -> Result<JobId, StoreError> {
    let due = enqueue_in(tx, job).await?;
    if due.1 {
        tx.wake_after_commit(job.kind);
    }
    Ok(due.0)
}

/// [`enqueue`]'s statements: the job, and whether it is due now.
async fn enqueue_in(conn: &mut Conn, job: &NewJob<'_>) -> Result<(JobId, bool), StoreError> {
    let op = job.operation_id.map(OperationId::uuid);
    for turn in 0..RACE_TURNS {
        // The common case: no queued job of this kind for the target yet.
        let last_turn = turn + 1 == RACE_TURNS;
        let insert = format!(
            "insert into jobs (id, kind, target_type, target_id, payload, operation_id, run_at, tenant_id) \
             values ($1, $2, $3, $4, $5, $6, coalesce($7, now()), $8) {} \
             returning id, run_at <= now()",
            // On the last turn a plain insert, so a lost race surfaces as the real unique
            // violation instead of an invented error (practically unreachable).
            if last_turn { "" } else { "on conflict (target_id, kind) where state = 'queued' do nothing" }
        );
        let inserted: Option<(Uuid, bool)> = sqlx::query_as(&insert)
            .bind(JobId::new().uuid())
            .bind(job.kind)
            .bind(job.target_type)
            .bind(job.target_id)
            .bind(&job.payload)
            .bind(op)
            .bind(job.run_at)
            .bind(job.tenant_id.map(TenantId::uuid))
            .fetch_optional(&mut *conn)
            .await?;
        if let Some((id, due)) = inserted {
            return Ok((JobId(id), due));
        }
        // A queued job exists: lock it (a claim skips locked rows, so it cannot start under us)
        // and merge. The sub-select reads the operation it carried before the update.
        let merged: Option<(Uuid, Option<Uuid>, bool)> = sqlx::query_as(
            "update jobs j set run_at = least(j.run_at, coalesce($3, now())), \
                 operation_id = coalesce($4, j.operation_id), tenant_id = $5, updated_at = now() \
             from (select id, operation_id from jobs \
                   where target_id = $1 and kind = $2 and state = 'queued' for update) old \
             where j.id = old.id \
             returning j.id, old.operation_id, j.run_at <= now()",
        )
        .bind(job.target_id)
        .bind(job.kind)
        .bind(job.run_at)
        .bind(op)
        .bind(job.tenant_id.map(TenantId::uuid))
        .fetch_optional(&mut *conn)
        .await?;
        let Some((id, old_op, due)) = merged else {
            // It was claimed between the two statements: insert on the next turn.
            continue;
        };
        if let (Some(old), Some(new)) = (old_op, op) {
            if old != new {
                // The job now reports to the newer operation; the older one would otherwise
                // stay open forever with nothing to finish it.
                supersede(conn, old).await?;
            }
        }
        return Ok((JobId(id), due));
    }
    unreachable_race()
}

/// The last turn of [`enqueue`] either inserts or fails with the unique violation, so the loop
/// never falls through; this keeps the compiler satisfied without a panic.
fn unreachable_race() -> Result<(JobId, bool), StoreError> {
    Err(StoreError::Corrupt("enqueue lost every race on jobs_queued_key".to_owned()))
}

async fn supersede(conn: &mut Conn, operation: Uuid) -> Result<(), StoreError> {
    sqlx::query(&format!(
        "update operations o set state = 'superseded', steps = {}, finished_at = now(), updated_at = now() \
         where id = $1 and state in ('pending', 'running')",
        end_running_steps("o", "superseded")
    ))
    .bind(operation)
    .execute(conn)
    .await?;
    Ok(())
}
