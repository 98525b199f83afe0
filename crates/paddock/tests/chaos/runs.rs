//! The run journal: every run of every job, which worker process held it and for how long, kept
//! in the test's own database by a trigger on `jobs` (the test's, not a migration: production
//! keeps no such table). It measures what the queue promises across processes: a job is taken
//! over only after its lease expired, and no two runs of one target ever overlap.
//!
//! A run starts when a job becomes `running` under a worker (a claim, or a takeover after the
//! lease ran out); its lease end follows every heartbeat; it ends when its holder finishes it. A
//! run that was taken over never ends in the journal: its holder was killed, and the latest it
//! may still have acted is its lease's end (the worker drops a run before its lease ends).

use sqlx::PgPool;

/// The journal's table and trigger, installed before any process starts.
const INSTALL: [&str; 3] = [
    "create table chaos_runs ( \
         id bigserial primary key, \
         job_id uuid not null, \
         target_id uuid not null, \
         worker text not null, \
         started_at timestamptz not null, \
         lease_until timestamptz not null, \
         ended_at timestamptz)",
    "create function chaos_journal() returns trigger language plpgsql security definer as $$ \
     begin \
         if new.state = 'running' \
            and (old.state is distinct from 'running' or old.locked_by is distinct from new.locked_by) then \
             insert into chaos_runs (job_id, target_id, worker, started_at, lease_until) \
             values (new.id, new.target_id, new.locked_by, clock_timestamp(), new.locked_until); \
         elsif new.state = 'running' then \
             update chaos_runs set lease_until = new.locked_until \
              where job_id = new.id and worker = new.locked_by and ended_at is null; \
         elsif old.state = 'running' then \
             update chaos_runs set ended_at = clock_timestamp() \
              where job_id = new.id and worker = old.locked_by and ended_at is null; \
         end if; \
         return new; \
     end $$",
    "create trigger chaos_journal after update on jobs for each row execute function chaos_journal()",
];

/// Installs the journal in the test's database.
pub async fn install(pool: &PgPool) {
    for sql in INSTALL {
        sqlx::query(sql).execute(pool).await.unwrap_or_else(|e| panic!("installing the run journal: {e}\n{sql}"));
    }
}

/// No run of a target began before the previous run of that target (by any worker) ended, or, if
/// it was taken over, before its lease ran out.
pub async fn no_two_runs_of_a_target_overlapped(pool: &PgPool) -> Vec<String> {
    super::invariants::rows(
        pool,
        "select format('target %s: run of job %s by %s from %s overlaps the run of job %s by %s from %s \
                        (ended %s, lease until %s)', \
                       b.target_id, b.job_id, b.worker, b.started_at, a.job_id, a.worker, a.started_at, \
                       a.ended_at, a.lease_until) \
           from chaos_runs a join chaos_runs b \
             on b.target_id = a.target_id and b.id <> a.id and b.started_at >= a.started_at \
          where b.started_at < coalesce(a.ended_at, a.lease_until) \
          order by b.started_at limit 20",
    )
    .await
}

/// What the journal saw: runs, takeovers, worker processes, jobs run by more than one process.
pub async fn summary(pool: &PgPool) -> String {
    let row: (i64, i64, i64, i64) = sqlx::query_as(
        "select count(*), \
                count(*) filter (where ended_at is null), \
                count(distinct worker), \
                (select count(*) from (select job_id from chaos_runs group by job_id \
                                        having count(distinct worker) > 1) s) \
           from chaos_runs",
    )
    .fetch_one(pool)
    .await
    .expect("the run journal");
    let (runs, killed, workers, shared) = row;
    format!(
        "{runs} job runs by {workers} worker processes, {killed} cut short by a kill (their jobs taken over once the lease ran out), \
         {shared} jobs run by more than one process"
    )
}
