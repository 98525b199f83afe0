//! The invariants the chaos test holds the end state to, each a function named for what it holds,
//! and the database snapshot its failure message carries.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::{PgPool, Row};

use super::procs::Api;
use super::ClusterModel;

pub(crate) async fn rows(pool: &PgPool, sql: &str) -> Vec<String> {
    sqlx::query_scalar::<_, String>(sql).fetch_all(pool).await.unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The database's view of the queue and the machines, for failure messages.
pub(crate) async fn db_snapshot(pool: &PgPool) -> String {
    let mut out = String::new();
    let machines = rows(pool, "select state || ': ' || count(*) from machines group by state order by state").await;
    out.push_str(&format!("machines by state: {machines:?}\n"));
    let jobs =
        rows(pool, "select kind || '/' || state || ': ' || count(*) from jobs group by kind, state order by 1").await;
    out.push_str(&format!("jobs by kind/state: {jobs:?}\n"));
    let open = rows(
        pool,
        "select format('%s %s target=%s attempts=%s run_at=%s (%s s from now) locked_by=%s locked_until=%s last_error=%s',
                kind, state, target_id, attempts, run_at, round(extract(epoch from run_at - now())::numeric, 1),
                locked_by, locked_until, last_error)
           from jobs where state in ('queued', 'running', 'failed') order by created_at limit 40",
    )
    .await;
    out.push_str(&format!("open or failed jobs (first 40):\n  {}\n", open.join("\n  ")));
    let ops =
        rows(pool, "select kind || '/' || state || ': ' || count(*) from operations group by kind, state order by 1")
            .await;
    out.push_str(&format!("operations by kind/state: {ops:?}\n"));
    out
}

/// The invariants the test found broken: per invariant (the name of the function that checks
/// it), what it found.
#[derive(Default)]
pub(crate) struct Violations(Vec<(&'static str, Vec<String>)>);

impl Violations {
    /// Records what the invariant `name` found broken (nothing: it holds).
    fn check(&mut self, name: &'static str, found: Vec<String>) {
        if !found.is_empty() {
            self.0.push((name, found));
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The broken invariants' names.
    pub(crate) fn names(&self) -> String {
        self.0.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(", ")
    }

    /// Each finding, led by its invariant's name.
    pub(crate) fn report(&self) -> String {
        let lines = self.0.iter().flat_map(|(name, found)| found.iter().map(move |v| format!("[{name}] {v}")));
        lines.collect::<Vec<_>>().join("\n")
    }
}

/// What the run left behind, for the invariants to judge.
pub(crate) struct EndState<'a> {
    pub(crate) clusters: &'a [ClusterModel],
    /// What still had not converged when the wait ended, and when that was after the last kill.
    pub(crate) pending: &'a [String],
    pub(crate) converged: Duration,
    /// The machines reported failed mid-run.
    pub(crate) failed: &'a [String],
    /// How many kills found a machine's job in each state.
    pub(crate) aimed: &'a BTreeMap<String, usize>,
}

/// Every invariant, judged on the end state.
pub(crate) async fn check(db: &PgPool, api: &Api, end: &EndState<'_>) -> Violations {
    let live: Vec<&ClusterModel> = end.clusters.iter().filter(|c| !c.deleted).collect();
    let mut violations = Violations::default();
    violations.check("every_cluster_converged", every_cluster_converged(end.pending, end.converged));
    violations.check("pools_hold_their_counts", pools_hold_their_counts(db, end.clusters).await);
    violations.check("the_api_shows_the_counts_asked_for", the_api_shows_the_counts_asked_for(api, &live).await);
    violations.check("no_machine_in_two_live_allocations", no_machine_in_two_live_allocations(db).await);
    violations.check("every_allocation_took_a_fresh_clean", every_allocation_took_a_fresh_clean(db).await);
    violations.check("no_machine_available_without_a_clean", no_machine_available_without_a_clean(db).await);
    violations.check("metering_survived_the_kills", metering_survived_the_kills(db).await);
    violations.check("no_activation_went_unbilled", no_activation_went_unbilled(db).await);
    violations.check("no_job_is_stuck", no_job_is_stuck(db).await);
    violations.check("failed_machines_were_swapped_and_credited_once", swapped_and_credited(db, end.failed).await);
    violations.check("no_two_runs_of_a_target_overlapped", super::runs::no_two_runs_of_a_target_overlapped(db).await);
    if end.pending.is_empty() {
        violations.check("no_operation_is_left_open", no_operation_is_left_open(db).await);
    }
    violations.check("the_kills_were_aimed", the_kills_were_aimed(end.aimed));
    violations
}

/// Every live cluster is ready at its generation with exactly its machines, every deleted one
/// gone, every machine available or active, within [`super::CONVERGE_MAX`] of the last kill.
fn every_cluster_converged(pending: &[String], converged: Duration) -> Vec<String> {
    if pending.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "not converged {} s after the last kill ({} items):\n  {}",
        converged.as_secs(),
        pending.len(),
        pending.join("\n  ")
    )]
}

/// Each pool holds exactly its count of active machines (none of a deleted cluster), and no
/// machine in another state.
async fn pools_hold_their_counts(db: &PgPool, clusters: &[ClusterModel]) -> Vec<String> {
    let mut violations = Vec::new();
    let held: BTreeMap<(String, String), i64> = sqlx::query(
        "select node_pool_id::text as pool, state, count(*) as n from machines where node_pool_id is not null group by 1, 2",
    )
    .fetch_all(db)
    .await
    .expect("held machines")
    .iter()
    .map(|r| ((r.get("pool"), r.get("state")), r.get("n")))
    .collect();
    for c in clusters {
        for p in &c.pools {
            let active = held.get(&(p.id.clone(), "active".to_owned())).copied().unwrap_or(0);
            let other: i64 = held.iter().filter(|((pool, s), _)| *pool == p.id && s != "active").map(|(_, n)| n).sum();
            let want = if c.deleted { 0 } else { i64::from(p.count) };
            if active != want || other != 0 {
                violations.push(format!(
                    "pool {}/{} ({}, deleted cluster: {}): wants {want} active machines, holds {active} active and {other} in other states",
                    c.name, p.name, p.id, c.deleted
                ));
            }
        }
    }
    violations
}

/// The API shows each live pool with the count asked for.
async fn the_api_shows_the_counts_asked_for(api: &Api, live: &[&ClusterModel]) -> Vec<String> {
    let mut violations = Vec::new();
    for c in live {
        let (_, view) = api.call(reqwest::Method::GET, &c.path(), None).await;
        for p in &c.pools {
            let shown = view["node_pools"]
                .as_array()
                .and_then(|a| a.iter().find(|v| v["id"] == p.id.as_str()))
                .and_then(|v| v["count"].as_u64());
            if shown != Some(u64::from(p.count)) {
                violations.push(format!(
                    "pool {}/{}: the API shows count {shown:?}, {} was asked for",
                    c.name, p.name, p.count
                ));
            }
        }
    }
    violations
}

/// No machine was ever in two live allocations.
async fn no_machine_in_two_live_allocations(pool: &PgPool) -> Vec<String> {
    rows(
        pool,
        "select format('machine %s: allocation %s [%s, %s) overlaps allocation %s [%s, %s)', m.name,
                a.id, a.allocated_at, a.released_at, b.id, b.allocated_at, b.released_at)
           from machine_allocations a
           join machine_allocations b on a.machine_id = b.machine_id and a.id < b.id
           join machines m on m.id = a.machine_id
          where tstzrange(a.allocated_at, coalesce(a.released_at, 'infinity'), '[)')
             && tstzrange(b.allocated_at, coalesce(b.released_at, 'infinity'), '[)')",
    )
    .await
}

/// Every allocation consumed a clean of its machine completed after the previous tenancy ended
/// (or after enrollment) and before the allocation.
async fn every_allocation_took_a_fresh_clean(pool: &PgPool) -> Vec<String> {
    rows(
        pool,
        "with ordered as (
             select a.*, lag(a.released_at) over (partition by a.machine_id order by a.allocated_at, a.id) as prev_released,
                    lag(a.id) over (partition by a.machine_id order by a.allocated_at, a.id) as prev_id
               from machine_allocations a)
         select format('machine %s: allocation %s at %s (previous %s released %s): its clean %s completed %s (machine %s); any clean in between: %s',
                       m.name, o.id, o.allocated_at, o.prev_id, o.prev_released, c.id, c.completed_at, c.machine_id,
                       exists (select 1 from machine_cleans x where x.machine_id = o.machine_id
                                  and x.completed_at > coalesce(o.prev_released, m.created_at) and x.completed_at <= o.allocated_at))
           from ordered o
           join machines m on m.id = o.machine_id
           left join machine_cleans c on c.id = o.clean_id
          where c.id is null or c.machine_id <> o.machine_id
             or (o.prev_id is not null and o.prev_released is null)
             or c.completed_at <= coalesce(o.prev_released, m.created_at)
             or c.completed_at > o.allocated_at",
    )
    .await
}

/// No machine is available after a tenancy without a clean since (nor with a used clean).
async fn no_machine_available_without_a_clean(pool: &PgPool) -> Vec<String> {
    rows(
        pool,
        "select format('machine %s is available: last allocation %s released %s, its clean_id %s completed %s',
                       m.name, a.id, a.released_at, m.clean_id, c.completed_at)
           from machines m
           left join machine_cleans c on c.id = m.clean_id
           left join lateral (select * from machine_allocations x where x.machine_id = m.id
                               order by x.allocated_at desc, x.id desc limit 1) a on true
          where m.state = 'available'
            and (c.id is null or c.machine_id <> m.id
                 or (a.id is not null and (a.released_at is null or c.completed_at <= a.released_at))
                 or exists (select 1 from machine_allocations u where u.clean_id = m.clean_id))",
    )
    .await
}

/// Metering survived the kills: one segment per allocation that reached `active` (the schema
/// also forbids overlaps); an active machine's is open, every other one closed, and a closed
/// one lies inside its allocation (its close reads the clock just after the release's); no control plane of a deleted cluster is still billed.
async fn metering_survived_the_kills(pool: &PgPool) -> Vec<String> {
    rows(
        pool,
        "select format('machine %s (%s, allocation %s): %s', m.name, m.state, m.allocation_id, problem)
           from (select m.id, 'active without an open segment' as problem from machines m
                  where m.state = 'active' and not exists (select 1 from usage_segments s
                        where s.allocation_id = m.allocation_id and s.end_at is null)
                 union all
                 select s.machine_id, format('segment %s still open', s.id) from usage_segments s
                   join machines m on m.id = s.machine_id
                  where s.kind = 'machine' and s.end_at is null
                    and (m.allocation_id is distinct from s.allocation_id or m.state not in ('active', 'releasing'))
                 union all
                 select s.machine_id, format('segment %s [%s, %s) outside its allocation [%s, %s)', s.id,
                        s.start_at, s.end_at, a.allocated_at, a.released_at)
                   from usage_segments s join machine_allocations a on a.id = s.allocation_id
                  where s.start_at < date_trunc('second', a.allocated_at)
                     or (s.end_at is not null and a.released_at is not null and s.end_at > a.released_at + interval '1 second')
                     or (s.end_at is not null and a.released_at is null)) bad
           join machines m on m.id = bad.id
         union all
         select format('cluster %s: its control plane is still billed after its deletion started', c.id)
           from clusters c join usage_segments s on s.cluster_id = c.id and s.kind = 'control_plane'
          where c.deletion_requested_at is not null and s.end_at is null",
    )
    .await
}

/// No activation went unbilled: an allocation whose machine the ledger saw become `active`
/// has its segment (the activation and the segment are one transaction).
async fn no_activation_went_unbilled(pool: &PgPool) -> Vec<String> {
    rows(
        pool,
        "select format('allocation %s of machine %s reached active but has no usage segment', a.id, a.machine_id)
           from machine_allocations a
          where not exists (select 1 from usage_segments s where s.allocation_id = a.id)
            and exists (select 1 from custody_entries e where e.machine_id = a.machine_id and e.to_state = 'active'
                          and e.at >= a.allocated_at and (a.released_at is null or e.at <= a.released_at))",
    )
    .await
}

/// Each machine reported failed mid-run: its one remediation ended, it is in maintenance (not
/// lost, not back in the fleet), and its credit, written at most once, is exactly the seconds
/// from the report to its segment's close.
async fn swapped_and_credited(pool: &PgPool, failed: &[String]) -> Vec<String> {
    let found: Vec<String> = sqlx::query_scalar(
        "select format('machine %s: state %s, remediations %s (ended %s; states %s, spares %s), \
             credits %s of %s seconds, window %s', \
             m.id, m.state, count(distinct r.id), count(distinct r.id) filter (where r.ended_at is not null), \
             string_agg(distinct r.state, ','), string_agg(distinct r.spare_machine_id::text, ','), \
             (select count(*) from usage_adjustments a where a.machine_id = m.id and a.category = 'credit'), \
             (select sum(-a.node_seconds) from usage_adjustments a where a.machine_id = m.id and a.category = 'credit'), \
             max(w.seconds)) \
         from machines m join machine_remediations r on r.machine_id = m.id \
           left join usage_segments s on s.allocation_id = r.allocation_id \
           left join machine_health_reports h on h.id = r.report_id \
           left join lateral (select extract(epoch from s.end_at - greatest(s.start_at, \
             date_trunc('second', h.observed_at, 'UTC')))::bigint as seconds) w on true \
         where m.id::text = any($1) \
         group by m.id, m.state \
         having m.state <> 'maintenance' or count(distinct r.id) <> 1 \
           or count(distinct r.id) filter (where r.ended_at is not null) <> 1 \
           or (select count(*) from usage_adjustments a where a.machine_id = m.id and a.category = 'credit') \
              <> (case when max(w.seconds) > 0 then 1 else 0 end) \
           or coalesce((select sum(-a.node_seconds) from usage_adjustments a where a.machine_id = m.id \
              and a.category = 'credit'), 0) <> greatest(coalesce(max(w.seconds), 0), 0)",
    )
    .bind(failed)
    .fetch_all(pool)
    .await
    .expect("remediations");
    let remediated: i64 = sqlx::query_scalar(
        "select count(distinct machine_id) from machine_remediations where machine_id::text = any($1)",
    )
    .bind(failed)
    .fetch_one(pool)
    .await
    .expect("count");
    let mut found = found;
    if remediated != failed.len() as i64 {
        found.push(format!("{} of {} machines reported failed have a remediation", remediated, failed.len()));
    }
    found
}

/// No job stuck: none running on an expired lease, none due long ago, none failed.
async fn no_job_is_stuck(pool: &PgPool) -> Vec<String> {
    rows(
        pool,
        "select format('job %s %s target=%s: %s, attempts %s, run_at %s, locked_by %s until %s, last_error %s',
                       id, kind, target_id, state, attempts, run_at, locked_by, locked_until, last_error)
           from jobs
          where (state = 'running' and locked_until < now())
             or (state = 'queued' and run_at < now() - interval '15 seconds')
             or state = 'failed'
          order by created_at",
    )
    .await
}

/// Every operation ended, and none failed (checked only once everything converged).
async fn no_operation_is_left_open(pool: &PgPool) -> Vec<String> {
    rows(
        pool,
        "select format('operation %s %s on %s (generation %s): %s, error %s', id, kind, target_id, target_generation, state, error)
           from operations where state in ('pending', 'running', 'failed') order by created_at",
    )
    .await
}

/// The aim found its moments: a kill hit a machine's job in `provisioning` and one in
/// `releasing`, or the kills around activation and release were luck.
fn the_kills_were_aimed(aimed: &BTreeMap<String, usize>) -> Vec<String> {
    ["provisioning", "releasing"]
        .into_iter()
        .filter(|state| aimed.get(*state).is_none_or(|&n| n == 0))
        .map(|state| format!("no kill was aimed at a machine's job in {state}"))
        .collect()
}
