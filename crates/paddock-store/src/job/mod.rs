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
//! Enqueueing a due job, and ending a run while another job of the same target is due, wakes idle
//! workers of its kind with `pg_notify('paddock_jobs', <kind>)`, sent *after* the commit by the
//! store's [`Waker`](crate::Waker) (a notification sent in the transaction would queue its commit
//! on PostgreSQL's notify lock: see [`Txn`](crate::Txn)); workers also poll, so a lost
//! notification only costs latency. [`JobListener`] is the workers' end of the channel.
//!
//! The functions expect PostgreSQL's default `read committed` isolation. [`claim`] runs as a
//! statement of its own: call it outside a transaction.
//!
//! The steps of a job's life live one file each: `enqueue`, `claim` (with the lease's heartbeat),
//! `finish` (the end of a run: complete, fail, retry, wait); what reads or tidies the queue stays
//! here.

use std::time::Duration;

use chrono::{DateTime, Utc};
use paddock_types::{JobId, OperationId, TenantId};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{from_json, parse_state, Conn, StoreError};

mod claim;
mod enqueue;
mod finish;
mod listen;
mod periodic;

pub use claim::{claim, heartbeat, Claimed};
pub use enqueue::enqueue;
pub use finish::{complete, fail, retries_exhausted, retry, wait};
pub use listen::JobListener;
pub use periodic::{arm_cluster, arm_clusters};

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
