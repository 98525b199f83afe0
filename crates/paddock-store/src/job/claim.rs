//! Claiming due jobs under a lease, and renewing the lease while a job runs.

use std::time::Duration;

use paddock_types::JobId;
use uuid::Uuid;

use super::{lost_race, millis, Job, JobRow, COLUMNS, RACE_TURNS, RUNNING_TARGET_KEY};
use crate::{Conn, StoreError};

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
