//! The end of a run: succeeded, failed, or back to the queue (a retry or a wait).

use std::time::Duration;

use chrono::{DateTime, Utc};
use paddock_types::problem::{Problem, RETRIES_EXHAUSTED};
use paddock_types::JobId;
use uuid::Uuid;

use super::{
    lost_race, millis, Job, JobError, JobState, Requeue, RetryPolicy, EXHAUSTED_STATUS, QUEUED_KEY, RACE_TURNS,
};
use crate::operation::end_running_steps;
use crate::{parse_state, Store, StoreError};

/// The tail of every statement that ends a run (`done` returns `id, target_id`): the kinds of the
/// other due jobs of the same target, which may start now. Their workers are woken once the
/// statement has committed ([`Store::wake`]), not by a `pg_notify` in it, which would queue its
/// commit on PostgreSQL's notify lock (see [`Txn`](crate::Txn)).
const WAKE: &str = "wake as ( \
         select coalesce(array_agg(distinct q.kind), '{}') as kinds from jobs q join done d on q.target_id = d.target_id \
         where q.state = 'queued' and q.run_at <= now() and q.id <> d.id \
     )";

/// Marks a run succeeded, and its operation (if still open) `succeeded`. `false` when `worker`
/// no longer holds the lease: nothing was written.
pub async fn complete(store: &Store, id: JobId, worker: &str) -> Result<bool, StoreError> {
    let sql = format!(
        "with done as ( \
             update jobs set state = 'succeeded', locked_by = null, locked_until = null, \
                 finished_at = now(), updated_at = now() \
             where id = $1 and locked_by = $2 and state = 'running' \
             returning id, target_id, operation_id \
         ), op as ( \
             update operations o set state = 'succeeded', steps = {steps}, current_step = null, \
                 finished_at = now(), updated_at = now() \
             from done d where o.id = d.operation_id and o.state in ('pending', 'running') \
         ), {WAKE} \
         select (select count(*) from done), (select kinds from wake)",
        steps = end_running_steps("o", "succeeded"),
    );
    let mut conn = store.conn().await?;
    let (done, woken): (i64, Vec<String>) =
        sqlx::query_as(&sql).bind(id.uuid()).bind(worker).fetch_one(&mut *conn).await?;
    store.wake(woken);
    Ok(done == 1)
}

/// Marks a run permanently failed and its operation (if still open) `failed` with `problem` as
/// its error; `instance` (the operation's path) and `request_id` (the job id, the key of the
/// worker's log lines) are filled in here. `false` when `worker` no longer holds the lease.
pub async fn fail(store: &Store, id: JobId, worker: &str, problem: &Problem) -> Result<bool, StoreError> {
    let problem_json =
        serde_json::to_value(problem).map_err(|e| StoreError::Corrupt(format!("problem is not JSON: {e}")))?;
    let sql = format!(
        "with done as ( \
             update jobs set state = 'failed', locked_by = null, locked_until = null, \
                 last_error = jsonb_build_object('code', $3::text, 'message', $4::text, 'at', now()), \
                 finished_at = now(), updated_at = now() \
             where id = $1 and locked_by = $2 and state = 'running' \
             returning id, target_id, operation_id \
         ), op as ( \
             update operations o set state = 'failed', steps = {steps}, finished_at = now(), updated_at = now(), \
                 error = $5::jsonb || jsonb_build_object('instance', '/v1/operations/' || o.id, \
                     'request_id', d.id::text) \
             from done d where o.id = d.operation_id and o.state in ('pending', 'running') \
         ), {WAKE} \
         select (select count(*) from done), (select kinds from wake)",
        steps = end_running_steps("o", "failed"),
    );
    let mut conn = store.conn().await?;
    let (done, woken): (i64, Vec<String>) = sqlx::query_as(&sql)
        .bind(id.uuid())
        .bind(worker)
        .bind(&problem.code)
        .bind(&problem.detail)
        .bind(problem_json)
        .fetch_one(&mut *conn)
        .await?;
    store.wake(woken);
    Ok(done == 1)
}

/// The problem recorded on an operation whose job ran out of attempts (the same shape [`retry`]
/// writes); for a worker that finds a taken-over job already past its attempts.
pub fn retries_exhausted(job: &Job, last: &JobError) -> Problem {
    Problem {
        type_: RETRIES_EXHAUSTED.uri(),
        title: RETRIES_EXHAUSTED.title.to_owned(),
        status: EXHAUSTED_STATUS,
        detail: format!("gave up after {} attempts; last error: {}", job.attempts, last.message),
        instance: job.operation_id.map(|op| format!("/v1/operations/{op}")).unwrap_or_default(),
        code: last.code.clone(),
        request_id: job.id.to_string(),
        errors: Vec::new(),
    }
}

/// Ends a run with a transient error: attempts + 1 and back to the queue after the policy's
/// backoff, or, at the policy's `max_attempts`, `failed` with the operation failed
/// (`retries-exhausted` problem whose `code` is the error's code).
pub async fn retry(
    store: &Store,
    id: JobId,
    worker: &str,
    error: &JobError,
    policy: &RetryPolicy,
) -> Result<Requeue, StoreError> {
    // The delay is computed by PostgreSQL from the stored attempt count, so the decision and the
    // write are one atomic step. `power` is bounded to keep the double far from overflow.
    let set = "attempts = j.attempts + 1, \
         state = case when f.id is not null then 'cancelled' \
                      when j.attempts + 1 >= $3 then 'failed' else 'queued' end, \
         run_at = case when f.id is null and j.attempts + 1 < $3 then now() + \
             least($5::float8, $4::float8 * power(2::float8, least(j.attempts, 40))) \
             * (0.5 + random() * 0.5) * interval '1 millisecond' else j.run_at end, \
         finished_at = case when f.id is not null or j.attempts + 1 >= $3 then now() end, \
         last_error = jsonb_build_object('code', $6::text, 'message', $7::text, 'at', now())";
    let failed_error = "jsonb_build_object('type', $8::text, 'title', $9::text, 'status', $10::int, \
         'detail', format('gave up after %s attempts; last error: %s', d.attempts, $7::text), \
         'instance', '/v1/operations/' || o.id, 'code', $6::text, 'request_id', d.id::text)";
    let policy_max = i32::try_from(policy.max_attempts.max(1)).unwrap_or(i32::MAX);
    requeue(store, id, worker, set, failed_error, |q| {
        q.bind(policy_max)
            .bind(millis(policy.base) as f64)
            .bind(millis(policy.cap) as f64)
            .bind(error.code.clone())
            .bind(error.message.clone())
            .bind(RETRIES_EXHAUSTED.uri())
            .bind(RETRIES_EXHAUSTED.title)
            .bind(i32::from(EXHAUSTED_STATUS))
    })
    .await
}

/// Ends a run that must wait (a BMC still booting, no capacity yet): back to the queue, due
/// after `after`, with `reason` as `last_error`, **without** using up an attempt. The operation
/// stays `running`.
pub async fn wait(
    store: &Store,
    id: JobId,
    worker: &str,
    reason: &JobError,
    after: Duration,
) -> Result<Requeue, StoreError> {
    let set = "state = case when f.id is not null then 'cancelled' else 'queued' end, \
         run_at = case when f.id is null then now() + $3 * interval '1 millisecond' else j.run_at end, \
         finished_at = case when f.id is not null then now() end, \
         last_error = jsonb_build_object('code', $4::text, 'message', $5::text, 'at', now())";
    requeue(store, id, worker, set, "null::jsonb", |q| {
        q.bind(millis(after)).bind(reason.code.clone()).bind(reason.message.clone())
    })
    .await
}

type Query<'q> = sqlx::query::QueryAs<'q, sqlx::Postgres, RequeueRow, sqlx::postgres::PgArguments>;

#[derive(sqlx::FromRow)]
struct RequeueRow {
    state: String,
    attempts: i32,
    run_at: DateTime<Utc>,
    follow_id: Option<Uuid>,
    woken: Vec<String>,
}

/// The shared statement of [`retry`] and [`wait`]. `set` assigns the job's columns (`j` is the
/// job, `f` the follow-up or nulls; parameters from `$3` bound by `bind`); `failed_error` is the
/// operation error when the job ends `failed`.
///
/// A queued follow-up of the same kind and target (enqueued during the run) cannot coexist with
/// this job queued again (`jobs_queued_key`). It is the newer request and re-reads everything, so
/// this job ends `cancelled` and hands its operation over: the follow-up adopts it when it has
/// none; when it has its own, the older one is superseded.
async fn requeue(
    store: &Store,
    id: JobId,
    worker: &str,
    set: &str,
    failed_error: &str,
    bind: impl for<'q> Fn(Query<'q>) -> Query<'q>,
) -> Result<Requeue, StoreError> {
    let sql = format!(
        "with cur as ( \
             select id, target_id, kind, operation_id from jobs \
             where id = $1 and locked_by = $2 and state = 'running' for update \
         ), follow as ( \
             select q.id, q.operation_id from jobs q join cur c on q.target_id = c.target_id and q.kind = c.kind \
             where q.state = 'queued' for update of q \
         ), adopt as ( \
             update jobs q set operation_id = c.operation_id, updated_at = now() \
             from follow f, cur c where q.id = f.id and f.operation_id is null and c.operation_id is not null \
         ), done as ( \
             update jobs j set {set}, locked_by = null, locked_until = null, updated_at = now() \
             from cur c left join follow f on true where j.id = c.id \
             returning j.id, j.target_id, j.operation_id, j.state, j.attempts, j.run_at, \
                 f.id as follow_id, f.operation_id as follow_op \
         ), op as ( \
             update operations o set \
                 state = case when d.state = 'failed' then 'failed' else 'superseded' end, \
                 error = case when d.state = 'failed' then {failed_error} end, \
                 steps = case when d.state = 'failed' then {failed_steps} else {superseded_steps} end, \
                 finished_at = now(), updated_at = now() \
             from done d where o.id = d.operation_id and o.state in ('pending', 'running') \
               and (d.state = 'failed' or (d.follow_op is not null and d.follow_op <> d.operation_id)) \
         ), {WAKE} \
         select d.state, d.attempts, d.run_at, d.follow_id, w.kinds as woken from done d cross join wake w",
        failed_steps = end_running_steps("o", "failed"),
        superseded_steps = end_running_steps("o", "superseded"),
    );
    let mut conn = store.conn().await?;
    for _ in 0..RACE_TURNS {
        let q = bind(sqlx::query_as::<_, RequeueRow>(&sql).bind(id.uuid()).bind(worker));
        let row = match q.fetch_optional(&mut *conn).await.map_err(StoreError::from) {
            Ok(row) => row,
            // A follow-up was enqueued after this statement's snapshot: the statement was undone;
            // a new snapshot sees the follow-up and hands over to it.
            Err(e) if lost_race(&e, QUEUED_KEY) => continue,
            Err(e) => return Err(e),
        };
        let Some(row) = row else {
            return Ok(Requeue::LeaseLost);
        };
        store.wake(row.woken);
        let attempts = u32::try_from(row.attempts).unwrap_or(0);
        return Ok(match (parse_state(&row.state, JobState::parse)?, row.follow_id) {
            (JobState::Cancelled, Some(to)) => Requeue::HandedOver { to: JobId(to) },
            (JobState::Failed, _) => Requeue::Failed { attempts },
            (JobState::Queued, _) => Requeue::Queued { run_at: row.run_at, attempts },
            (state, _) => return Err(StoreError::Corrupt(format!("requeue left job {id} {}", state.as_str()))),
        });
    }
    Ok(Requeue::LeaseLost)
}
