//! The durable job queue (table `jobs`, migration `20261130120000_create_jobs.sql`).
//!
//! A service enqueues a job in the **same transaction** as the state change that needs it, so a
//! rolled-back change leaves no job and a committed one always has its job. Workers claim due jobs
//! with `for update skip locked` in one short statement that also sets a lease; a heartbeat renews
//! the lease while the job runs, and a lease that expires (the worker died) lets another worker
//! take the job over. Every function that ends a run is guarded on `(id, locked_by)` and the
//! `running` state, so a worker that lost its lease can never overwrite another worker's result:
//! it gets `false` (or [`Requeue::LeaseLost`]) and must drop the job.
//!
//! Invariants (the schema enforces the first two):
//! - at most one running job per target, whatever the kinds;
//! - at most one queued job per (target, kind): enqueueing while one is queued merges into it
//!   (the earlier `run_at` wins, a newer operation replaces and supersedes the older one);
//!   enqueueing while one *runs* adds one queued follow-up, which starts only after the running
//!   job ends. A request made during a run is therefore never lost, and its run re-reads state
//!   written by the previous run. When the running job would go back to the queue (retry, wait)
//!   while a follow-up of its kind waits, it hands over to the follow-up and ends `cancelled`;
//! - a job linked to an operation moves it in the same statement: claimed -> `running`,
//!   completed -> `succeeded`, failed (or retries exhausted) -> `failed` with a Problem in
//!   `error`. An operation that is no longer pending or running (superseded) is never touched.
//!
//! Enqueueing a due job, and ending a run while another job of the same target is due, sends
//! `pg_notify('paddock_jobs', <kind>)` (delivered at commit) so idle workers wake at once;
//! workers also poll, so a lost notification only costs latency. [`JobListener`] is the workers'
//! end of the channel.
//!
//! The functions expect PostgreSQL's default `read committed` isolation. [`claim`] runs as a
//! statement of its own: call it outside a transaction.

use std::time::Duration;

use chrono::{DateTime, Utc};
use paddock_types::problem::{Problem, RETRIES_EXHAUSTED};
use paddock_types::{JobId, OperationId, TenantId};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{from_json, parse_state, Conn, StoreError};

mod listen;

pub use listen::JobListener;

/// The `LISTEN`/`NOTIFY` channel; the payload is the job kind.
pub const NOTIFY_CHANNEL: &str = "paddock_jobs";

/// HTTP-style status recorded in a retries-exhausted problem: the work could not be done for now.
pub const EXHAUSTED_STATUS: u16 = 503;

/// Unique index: one running job per target.
const RUNNING_TARGET_KEY: &str = "jobs_running_target_key";
/// Unique index: one queued job per (target, kind).
const QUEUED_KEY: &str = "jobs_queued_key";
/// How often a statement that lost a race on one of the two indexes is tried again. Each loss
/// needs another transaction to commit in between, so two turns nearly always suffice.
const RACE_TURNS: usize = 4;

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Waiting for `run_at` and a free target.
    Queued,
    /// Leased by a worker.
    Running,
    /// Done.
    Succeeded,
    /// Failed permanently or ran out of attempts.
    Failed,
    /// Dropped before it ran, or handed over to a newer follow-up job.
    Cancelled,
}

impl JobState {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Queued, Self::Running, Self::Succeeded, Self::Failed, Self::Cancelled]
            .into_iter()
            .find(|state| state.as_str() == s)
    }
}

/// The last transient failure, wait reason or lost lease of a job (`last_error`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastError {
    /// Stable snake_case code, e.g. `bmc_unreachable`, `lease_expired`.
    pub code: String,
    /// Readable message.
    pub message: String,
    /// When it was recorded.
    pub at: DateTime<Utc>,
}

/// Why a run did not finish: a transient error ([`retry`]) or a wait reason ([`wait`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobError {
    /// Stable snake_case code, e.g. `bmc_unreachable`, `insufficient_capacity`.
    pub code: String,
    /// Readable message; it ends up in the operation's problem if retries run out, so it must be
    /// safe to show (no secrets, no internal addresses a tenant should not see).
    pub message: String,
}

impl JobError {
    /// An error with a code and a message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { code: code.into(), message: message.into() }
    }
}

/// A job, as stored.
#[derive(Debug, Clone)]
pub struct Job {
    /// Id.
    pub id: JobId,
    /// Kind, e.g. `machine_enroll`.
    pub kind: String,
    /// Type of the object it works on, e.g. `machine`.
    pub target_type: String,
    /// Id of that object.
    pub target_id: Uuid,
    /// Ids the handler needs besides the target (an object, never a spec snapshot).
    pub payload: serde_json::Value,
    /// The tenant it works for (`None`: the fleet's own job); see [`NewJob::tenant_id`].
    pub tenant_id: Option<TenantId>,
    /// The operation it reports to.
    pub operation_id: Option<OperationId>,
    /// State.
    pub state: JobState,
    /// Runs that ended in a transient failure or a lost lease.
    pub attempts: u32,
    /// Not claimed before this instant.
    pub run_at: DateTime<Utc>,
    /// The worker holding the lease.
    pub locked_by: Option<String>,
    /// End of the lease.
    pub locked_until: Option<DateTime<Utc>>,
    /// Start of the current (or last) run.
    pub started_at: Option<DateTime<Utc>>,
    /// The last transient failure or wait reason.
    pub last_error: Option<LastError>,
    /// When it was first enqueued.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// When it ended.
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct JobRow {
    id: Uuid,
    kind: String,
    target_type: String,
    target_id: Uuid,
    payload: serde_json::Value,
    tenant_id: Option<Uuid>,
    operation_id: Option<Uuid>,
    state: String,
    attempts: i32,
    run_at: DateTime<Utc>,
    locked_by: Option<String>,
    locked_until: Option<DateTime<Utc>>,
    started_at: Option<DateTime<Utc>>,
    last_error: Option<serde_json::Value>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "id, kind, target_type, target_id, payload, tenant_id, operation_id, state, attempts, \
     run_at, locked_by, locked_until, started_at, last_error, created_at, updated_at, finished_at";

impl TryFrom<JobRow> for Job {
    type Error = StoreError;
    fn try_from(r: JobRow) -> Result<Self, StoreError> {
        Ok(Job {
            id: JobId(r.id),
            kind: r.kind,
            target_type: r.target_type,
            target_id: r.target_id,
            payload: r.payload,
            tenant_id: r.tenant_id.map(TenantId),
            operation_id: r.operation_id.map(OperationId),
            state: parse_state(&r.state, JobState::parse)?,
            // The column has `check (attempts >= 0)`.
            attempts: u32::try_from(r.attempts).unwrap_or(0),
            run_at: r.run_at,
            locked_by: r.locked_by,
            locked_until: r.locked_until,
            started_at: r.started_at,
            last_error: r.last_error.map(from_json).transpose()?,
            created_at: r.created_at,
            updated_at: r.updated_at,
            finished_at: r.finished_at,
        })
    }
}

/// What [`enqueue`] writes.
#[derive(Debug, Clone)]
pub struct NewJob<'a> {
    /// Kind, stable snake_case (`machine_enroll`).
    pub kind: &'a str,
    /// Type of the target (`machine`, `cluster`).
    pub target_type: &'a str,
    /// The target; at most one job runs per target at a time.
    pub target_id: Uuid,
    /// Ids only (`{"cluster_id": ...}`); `{}` when the target id is all the handler needs.
    pub payload: serde_json::Value,
    /// The tenant the job works for: a cluster's tenant, the tenant holding a machine. Its jobs
    /// hold at most a worker's tenant slots at once ([`claim`]); `None` for the fleet's own work.
    /// A request merged into a queued job brings its tenant along (the newer view).
    pub tenant_id: Option<TenantId>,
    /// The operation the job reports to.
    pub operation_id: Option<OperationId>,
    /// Earliest start; `None` = now.
    pub run_at: Option<DateTime<Utc>>,
}

/// Retry policy of [`retry`]: capped exponential backoff with jitter.
///
/// After the `n`-th failed attempt the job waits `d * U[0.5, 1]` with
/// `d = min(cap, base * 2^(n-1))` ("equal jitter": never less than half the nominal delay, never
/// more than the cap). The `max_attempts`-th failure fails the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Failed attempts after which the job fails; at least 1.
    pub max_attempts: u32,
    /// Nominal delay after the first failure.
    pub base: Duration,
    /// Largest delay.
    pub cap: Duration,
}

impl RetryPolicy {
    /// The bounds of the delay after the `attempt`-th failure (1-based): `[d / 2, d]`.
    pub fn delay_bounds(&self, attempt: u32) -> (Duration, Duration) {
        let exp = attempt.saturating_sub(1).min(40);
        let nominal = self.base.saturating_mul(2u32.saturating_pow(exp.min(31))).min(self.cap);
        (nominal / 2, nominal)
    }
}

/// How [`retry`] or [`wait`] put a job back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requeue {
    /// Queued again, due at `run_at`.
    Queued {
        /// When it runs again.
        run_at: DateTime<Utc>,
        /// Failed attempts so far.
        attempts: u32,
    },
    /// Out of attempts: failed, with its operation.
    Failed {
        /// Failed attempts.
        attempts: u32,
    },
    /// A follow-up job of the same kind and target was queued during the run: this job ended
    /// `cancelled` and the follow-up, a newer request that re-reads everything, carries on.
    HandedOver {
        /// The follow-up job.
        to: JobId,
    },
    /// The caller no longer holds the lease: nothing was written.
    LeaseLost,
}

/// Open jobs by kind and state (the queue depth gauge).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Depth {
    /// Job kind.
    pub kind: String,
    /// `queued` or `running`.
    pub state: String,
    /// Jobs.
    pub count: i64,
}

/// Milliseconds for an `interval` bind, capped at ten years (a longer delay is a bug, and an
/// unbounded one would overflow PostgreSQL's timestamp range).
fn millis(d: Duration) -> i64 {
    const TEN_YEARS_MS: u128 = 10 * 366 * 24 * 3600 * 1000;
    // Infallible: the value is capped far below i64::MAX.
    i64::try_from(d.as_millis().min(TEN_YEARS_MS)).unwrap_or(i64::MAX)
}

/// Whether `e` is a violation of the unique index `index`.
fn lost_race(e: &StoreError, index: &str) -> bool {
    matches!(e, StoreError::Unique { constraint, .. } if constraint == index)
}

/// Enqueues a job, or merges the request into the queued job of the same kind and target.
///
/// Returns the id of the job that will carry the request out: a new job, the queued one it merged
/// into (its `run_at` becomes the earlier of the two; a new `operation_id` replaces the old one,
/// which is marked superseded if still open; the payload is kept), or a new follow-up job when the
/// job of that kind is running. Call it in the transaction of the state change.
pub async fn enqueue(conn: &mut Conn, job: &NewJob<'_>) -> Result<JobId, StoreError> {
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
            if due {
                notify(conn, job.kind).await?;
            }
            return Ok(JobId(id));
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
        if due {
            notify(conn, job.kind).await?;
        }
        return Ok(JobId(id));
    }
    unreachable_race()
}

/// The last turn of [`enqueue`] either inserts or fails with the unique violation, so the loop
/// never falls through; this keeps the compiler satisfied without a panic.
fn unreachable_race() -> Result<JobId, StoreError> {
    Err(StoreError::Corrupt("enqueue lost every race on jobs_queued_key".to_owned()))
}

async fn supersede(conn: &mut Conn, operation: Uuid) -> Result<(), StoreError> {
    sqlx::query(
        "update operations set state = 'superseded', finished_at = now(), updated_at = now() \
         where id = $1 and state in ('pending', 'running')",
    )
    .bind(operation)
    .execute(conn)
    .await?;
    Ok(())
}

async fn notify(conn: &mut Conn, kind: &str) -> Result<(), StoreError> {
    sqlx::query("select pg_notify($1, $2)").bind(NOTIFY_CHANNEL).bind(kind).execute(conn).await?;
    Ok(())
}

/// The running jobs of the job row `alias`'s tenant that `$2` (the worker) holds: the slots its
/// tenant takes on that worker (0 for a job of no tenant, which no bound applies to).
fn held_by_tenant(alias: &str) -> String {
    format!(
        "(select count(*) from jobs h where h.state = 'running' and h.locked_by = $2 \
           and h.tenant_id = {alias}.tenant_id)"
    )
}

/// Claims up to `limit` due jobs of `kinds` for `worker`, leased for `lease`.
///
/// Takes queued jobs whose `run_at` has come and whose target has no running job, and running
/// jobs whose lease expired (their worker died: the attempt counts as failed, with
/// `last_error.code = lease_expired`), oldest first, at most one per target, and at most
/// `tenant_slots` jobs of one tenant running on this worker at once (those it already runs
/// count): a tenant whose cluster answers slowly holds only that many of the worker's slots,
/// and the others stay for other tenants and the fleet's own jobs. Linked pending operations
/// become `running` in the same statement. Runs as one statement, outside any transaction;
/// `for update skip locked` lets any number of workers claim at once.
///
/// The same statement says how long until the next queued job of `kinds` that `worker` could
/// claim comes due (see [`Claimed::next_due_in`]), so an idle worker makes one statement per poll.
pub async fn claim(
    conn: &mut Conn,
    worker: &str,
    kinds: &[&str],
    lease: Duration,
    limit: u32,
    tenant_slots: u32,
) -> Result<Claimed, StoreError> {
    if limit == 0 || kinds.is_empty() {
        return Ok(Claimed { jobs: Vec::new(), next_due_in: None });
    }
    let sql = claim_statement(limit);
    for _ in 0..RACE_TURNS {
        let rows = sqlx::query(&sql)
            .bind(kinds)
            .bind(worker)
            .bind(millis(lease))
            .bind(i64::from(tenant_slots))
            .fetch_all(&mut *conn)
            .await
            .map_err(StoreError::from);
        match rows {
            Ok(rows) => return Claimed::from_rows(&rows),
            // Another worker started a job of the same target after this statement's snapshot
            // was taken; the statement was undone as a whole. A new snapshot sees that job.
            Err(e) if lost_race(&e, RUNNING_TARGET_KEY) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(Claimed { jobs: Vec::new(), next_due_in: None })
}

/// The statement of [`claim`] for batches of `limit`: `$1` the kinds, `$2` the worker, `$3` the
/// lease in milliseconds, `$4` the slots per tenant.
fn claim_statement(limit: u32) -> String {
    // The run starts when the claim executes (`clock_timestamp()`), not when the statement arrived
    // (`now()`): under load the two differ, and a run must never appear to start before the one it
    // waited for finished.
    // `distinct on (target_id)` keeps one candidate per target (an expired running job before a
    // queued one: the running one holds the target's slot). `for update` cannot be combined with
    // `distinct` or a window, so the rows are locked first and filtered after; the extra locks end
    // with the statement. A tenant already at its bound on this worker is skipped while locking
    // (so its backlog cannot fill the batch); the ranking per tenant then keeps a batch within the
    // slots the tenant has left (the rest of its jobs wait for the next claim). The per-worker
    // count is exact: one worker claims from one loop. The limit is written into the statement
    // (one prepared statement per value): as a parameter, PostgreSQL would plan the statement
    // anew on every call, which costs more than running it.
    let (held_e, held_q, held_r) = (held_by_tenant("e"), held_by_tenant("q"), held_by_tenant("ranked"));
    let held_n = held_by_tenant("n");
    let columns = COLUMNS.split(", ").map(|c| format!("c.{c}")).collect::<Vec<_>>().join(", ");
    format!(
        "with expired as ( \
             select id, target_id, tenant_id, 0 as pri, locked_until as due from jobs e \
             where state = 'running' and locked_until < now() and kind = any($1) \
               and (e.tenant_id is null or {held_e} < $4) \
             order by locked_until limit {limit} \
             for update of e skip locked \
         ), ready as ( \
             select id, target_id, tenant_id, 1 as pri, run_at as due from jobs q \
             where state = 'queued' and run_at <= now() and kind = any($1) \
               and not exists (select 1 from jobs r where r.target_id = q.target_id and r.state = 'running') \
               and (q.tenant_id is null or {held_q} < $4) \
             order by run_at, id limit {limit} \
             for update of q skip locked \
         ), picked as ( \
             select id, pri, due from ( \
                 select id, tenant_id, pri, due, \
                     row_number() over (partition by tenant_id order by pri, due, id) as place \
                 from ( \
                     select distinct on (target_id) id, tenant_id, pri, due \
                     from (select * from expired union all select * from ready) c \
                     order by target_id, pri, due \
                 ) one_per_target \
             ) ranked \
             where ranked.tenant_id is null or ranked.place + {held_r} <= $4 \
             order by pri, due limit {limit} \
         ), stamp as ( \
             select clock_timestamp() as t \
         ), claimed as ( \
             update jobs j set state = 'running', \
                 attempts = j.attempts + case when j.state = 'running' then 1 else 0 end, \
                 last_error = case when j.state = 'running' then jsonb_build_object( \
                     'code', 'lease_expired', \
                     'message', 'the worker running it (' || j.locked_by || ') stopped renewing its lease', \
                     'at', s.t) else j.last_error end, \
                 locked_by = $2, locked_until = s.t + $3 * interval '1 millisecond', \
                 started_at = s.t, updated_at = s.t \
             from picked p, stamp s where j.id = p.id \
             returning j.* \
         ), started as ( \
             update operations o set state = 'running', updated_at = now() \
             from claimed c where o.id = c.operation_id and o.state = 'pending' \
         ), next as ( \
             select greatest(extract(epoch from (n.run_at - now())) * 1000, 0)::float8 as due_ms from jobs n \
             where n.state = 'queued' and n.run_at > now() and n.kind = any($1) \
               and not exists (select 1 from jobs r where r.target_id = n.target_id and r.state = 'running') \
               and n.target_id not in (select target_id from claimed) \
               and (n.tenant_id is null or {held_n} < $4) \
             order by n.run_at limit 1 \
         ) \
         select {columns}, d.due_ms from (select (select due_ms from next) as due_ms) d \
         left join claimed c on true order by c.run_at, c.id"
    )
}

/// What one [`claim`] took, and when to claim again.
#[derive(Debug)]
pub struct Claimed {
    /// The jobs claimed, oldest due first.
    pub jobs: Vec<Job>,
    /// How long until the next queued job of the claimed kinds that the worker could claim comes
    /// due, after those it just claimed: its target free (and not one just claimed), its tenant
    /// below the slots on this worker as they were when the statement started (a job of a tenant
    /// at its bound is not waited for: a run ending wakes the worker anyway). Only jobs due later
    /// count: a due job it did not take is held by another worker's claim or beyond the batch.
    /// At least 20 ms, so it never turns into a spin. `None` when there is none.
    pub next_due_in: Option<Duration>,
}

impl Claimed {
    fn from_rows(rows: &[sqlx::postgres::PgRow]) -> Result<Self, StoreError> {
        use sqlx::{FromRow, Row};
        let mut claimed = Claimed { jobs: Vec::with_capacity(rows.len()), next_due_in: None };
        for row in rows {
            let due_ms: Option<f64> = row.try_get("due_ms")?;
            claimed.next_due_in =
                due_ms.map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1000.0) + Duration::from_millis(20));
            // The one row of a claim that took nothing has no job in it.
            if row.try_get::<Option<Uuid>, _>("id")?.is_some() {
                claimed.jobs.push(Job::try_from(JobRow::from_row(row)?)?);
            }
        }
        Ok(claimed)
    }
}

/// Renews the lease of a running job; `false` when `worker` no longer holds it (the job was
/// taken over after the lease expired, or ended): the caller must stop working on it.
pub async fn heartbeat(conn: &mut Conn, id: JobId, worker: &str, lease: Duration) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "update jobs set locked_until = now() + $3 * interval '1 millisecond' \
         where id = $1 and locked_by = $2 and state = 'running'",
    )
    .bind(id.uuid())
    .bind(worker)
    .bind(millis(lease))
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The tail of every statement that ends a run (`done` returns `id, target_id`): another due job
/// of the same target may start now, so wake the workers of its kind.
const WAKE: &str = "wake as ( \
         select pg_notify('paddock_jobs', q.kind) from jobs q join done d on q.target_id = d.target_id \
         where q.state = 'queued' and q.run_at <= now() and q.id <> d.id \
     )";

/// Marks a run succeeded, and its operation (if still open) `succeeded`. `false` when `worker`
/// no longer holds the lease: nothing was written.
pub async fn complete(conn: &mut Conn, id: JobId, worker: &str) -> Result<bool, StoreError> {
    let sql = format!(
        "with done as ( \
             update jobs set state = 'succeeded', locked_by = null, locked_until = null, \
                 finished_at = now(), updated_at = now() \
             where id = $1 and locked_by = $2 and state = 'running' \
             returning id, target_id, operation_id \
         ), op as ( \
             update operations o set state = 'succeeded', finished_at = now(), updated_at = now() \
             from done d where o.id = d.operation_id and o.state in ('pending', 'running') \
         ), {WAKE} \
         select (select count(*) from done), (select count(*) from wake)"
    );
    let (done, _woken): (i64, i64) = sqlx::query_as(&sql).bind(id.uuid()).bind(worker).fetch_one(conn).await?;
    Ok(done == 1)
}

/// Marks a run permanently failed and its operation (if still open) `failed` with `problem` as
/// its error; `instance` (the operation's path) and `request_id` (the job id, the key of the
/// worker's log lines) are filled in here. `false` when `worker` no longer holds the lease.
pub async fn fail(conn: &mut Conn, id: JobId, worker: &str, problem: &Problem) -> Result<bool, StoreError> {
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
             update operations o set state = 'failed', finished_at = now(), updated_at = now(), \
                 error = $5::jsonb || jsonb_build_object('instance', '/v1/operations/' || o.id, \
                     'request_id', d.id::text) \
             from done d where o.id = d.operation_id and o.state in ('pending', 'running') \
         ), {WAKE} \
         select (select count(*) from done), (select count(*) from wake)"
    );
    let (done, _woken): (i64, i64) = sqlx::query_as(&sql)
        .bind(id.uuid())
        .bind(worker)
        .bind(&problem.code)
        .bind(&problem.detail)
        .bind(problem_json)
        .fetch_one(conn)
        .await?;
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
    conn: &mut Conn,
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
    requeue(conn, id, worker, set, failed_error, |q| {
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
    conn: &mut Conn,
    id: JobId,
    worker: &str,
    reason: &JobError,
    after: Duration,
) -> Result<Requeue, StoreError> {
    let set = "state = case when f.id is not null then 'cancelled' else 'queued' end, \
         run_at = case when f.id is null then now() + $3 * interval '1 millisecond' else j.run_at end, \
         finished_at = case when f.id is not null then now() end, \
         last_error = jsonb_build_object('code', $4::text, 'message', $5::text, 'at', now())";
    requeue(conn, id, worker, set, "null::jsonb", |q| {
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
    conn: &mut Conn,
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
                 finished_at = now(), updated_at = now() \
             from done d where o.id = d.operation_id and o.state in ('pending', 'running') \
               and (d.state = 'failed' or (d.follow_op is not null and d.follow_op <> d.operation_id)) \
         ), {WAKE} \
         select d.state, d.attempts, d.run_at, d.follow_id from done d \
         cross join (select count(*) from wake) w"
    );
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

/// Cancels the queued jobs of a target (all kinds, or only `kinds`); a running job is left to
/// finish. Returns how many were cancelled. Their operations are left alone: the caller
/// supersedes them with the operation that explains why (a deletion, say).
pub async fn cancel_queued(conn: &mut Conn, target_id: Uuid, kinds: Option<&[&str]>) -> Result<u64, StoreError> {
    let done = sqlx::query(
        "update jobs set state = 'cancelled', finished_at = now(), updated_at = now() \
         where target_id = $1 and state = 'queued' and ($2::text[] is null or kind = any($2))",
    )
    .bind(target_id)
    .bind(kinds)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// A job by id.
pub async fn get(conn: &mut Conn, id: JobId) -> Result<Option<Job>, StoreError> {
    let row: Option<JobRow> = sqlx::query_as(&format!("select {COLUMNS} from jobs where id = $1"))
        .bind(id.uuid())
        .fetch_optional(conn)
        .await?;
    row.map(Job::try_from).transpose()
}

/// The jobs of a target, oldest first (its history).
pub async fn list_for_target(conn: &mut Conn, target_id: Uuid) -> Result<Vec<Job>, StoreError> {
    let rows: Vec<JobRow> = sqlx::query_as(&format!("select {COLUMNS} from jobs where target_id = $1 order by id"))
        .bind(target_id)
        .fetch_all(conn)
        .await?;
    rows.into_iter().map(Job::try_from).collect()
}

/// Open (queued or running) jobs by kind and state, for the queue-depth gauge.
pub async fn depth(conn: &mut Conn) -> Result<Vec<Depth>, StoreError> {
    Ok(sqlx::query_as(
        "select kind, state, count(*) as count from jobs where state in ('queued', 'running') \
         group by kind, state order by kind, state",
    )
    .fetch_all(conn)
    .await?)
}

/// Analyzes the `jobs` table when PostgreSQL has no statistics of its columns yet; returns whether
/// it did. Without them (a new database, until autovacuum's first pass: a minute or more) the
/// planner takes the claim's `kind = any($1)` for a rare value, reads every queued job through
/// `jobs_queued_key` and sorts them, so each claim costs in proportion to the backlog (12,600
/// buffers with 4,100 jobs due, against some 400 on the `(run_at, id)` order of `jobs_ready_idx`
/// once any statistics exist, however old: bench/results/fleet.md). Cheap when they
/// exist (one catalog read); the worker runs it once, when the first backlog shows.
pub async fn ensure_statistics(conn: &mut Conn) -> Result<bool, StoreError> {
    let measured: bool = sqlx::query_scalar(
        "select exists (select 1 from pg_stats \
         where schemaname = current_schema() and tablename = 'jobs' and attname = 'kind')",
    )
    .fetch_one(&mut *conn)
    .await?;
    if measured {
        return Ok(false);
    }
    sqlx::query("analyze jobs").execute(conn).await?;
    Ok(true)
}

/// Deletes up to `limit` jobs that finished more than `age` ago; returns how many. Housekeeping:
/// run it periodically until it returns less than `limit`.
pub async fn purge_finished(conn: &mut Conn, age: Duration, limit: u32) -> Result<u64, StoreError> {
    let done = sqlx::query(
        "delete from jobs where id in (select id from jobs \
         where finished_at < now() - $1 * interval '1 millisecond' order by finished_at limit $2)",
    )
    .bind(millis(age))
    .bind(i64::from(limit))
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_bounds_double_per_attempt_and_stop_at_the_cap() {
        let policy = RetryPolicy { max_attempts: 10, base: Duration::from_secs(1), cap: Duration::from_secs(60) };
        assert_eq!(policy.delay_bounds(1), (Duration::from_millis(500), Duration::from_secs(1)));
        assert_eq!(policy.delay_bounds(2), (Duration::from_secs(1), Duration::from_secs(2)));
        assert_eq!(policy.delay_bounds(6), (Duration::from_secs(16), Duration::from_secs(32)));
        assert_eq!(policy.delay_bounds(7), (Duration::from_secs(30), Duration::from_secs(60)));
        assert_eq!(policy.delay_bounds(500), (Duration::from_secs(30), Duration::from_secs(60)));
    }

    #[test]
    fn job_states_round_trip() {
        for s in ["queued", "running", "succeeded", "failed", "cancelled"] {
            assert_eq!(JobState::parse(s).map(JobState::as_str), Some(s));
        }
        assert_eq!(JobState::parse("done"), None);
    }
}
