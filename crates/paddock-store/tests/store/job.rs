//! The queue's due times: what `claim` takes and says is due next of jobs due later, and of jobs whose
//! target is busy. (Lease expiry and takeover, a stale worker's completion and the merging of
//! queued jobs are tested in `paddock-worker/tests/worker/queue.rs`.)

use std::time::Duration;

use chrono::Utc;
use paddock_store::job::{self, JobState, NewJob};
use uuid::Uuid;

use crate::support::db;

const LEASE: Duration = Duration::from_secs(30);

/// `job::enqueue` in a transaction of its own.
async fn enqueue(store: &paddock_store::Store, new: &NewJob<'_>, what: &str) -> paddock_types::JobId {
    let mut tx = store.begin().await.expect("begin");
    let id = job::enqueue(&mut tx, new).await.expect(what);
    tx.commit().await.expect("commit");
    id
}

fn new_job(kind: &'static str, target: Uuid) -> NewJob<'static> {
    NewJob {
        kind,
        target_type: "machine",
        target_id: target,
        payload: serde_json::json!({}),
        tenant_id: None,
        operation_id: None,
        run_at: None,
    }
}

#[tokio::test]
async fn the_next_due_time_skips_busy_targets_and_other_kinds() {
    let (_db, store) = db().await;
    let mut conn = store.conn().await.expect("conn");
    let empty = job::claim(&mut conn, "w2", &["a_kind"], LEASE, 10, u32::MAX).await.expect("empty");
    assert!(empty.jobs.is_empty() && empty.next_due_in.is_none(), "{empty:?}");

    let later = Utc::now() + chrono::Duration::minutes(10);
    let target = Uuid::now_v7();
    enqueue(&store, &NewJob { run_at: Some(later), ..new_job("a_kind", target) }, "later").await;
    enqueue(&store, &new_job("b_kind", Uuid::now_v7()), "other kind").await;
    let not_yet = job::claim(&mut conn, "w1", &["a_kind"], LEASE, 10, u32::MAX).await.expect("claim");
    assert!(not_yet.jobs.is_empty(), "not due yet: {not_yet:?}");
    let due_in = not_yet.next_due_in.expect("a job");
    assert!(due_in > Duration::from_secs(9 * 60) && due_in <= Duration::from_secs(10 * 60 + 1), "{due_in:?}");

    // A job due later whose target runs another job is not waited for while that run lasts, nor
    // is one whose target this very claim took.
    let busy = Uuid::now_v7();
    enqueue(&store, &new_job("c_kind", busy), "runs").await;
    let soon = Utc::now() + chrono::Duration::seconds(30);
    let queued = enqueue(&store, &NewJob { run_at: Some(soon), ..new_job("a_kind", busy) }, "queued behind").await;
    let running = job::claim(&mut conn, "w1", &["c_kind", "a_kind"], LEASE, 1, u32::MAX).await.expect("claim");
    assert_eq!(running.jobs.len(), 1);
    let due_in = running.next_due_in.expect("the one due in 10 minutes");
    assert!(due_in > Duration::from_secs(60), "the busy target's job is not waited for: {due_in:?}");
    let behind = job::claim(&mut conn, "w2", &["a_kind"], LEASE, 10, u32::MAX).await.expect("claim");
    assert!(behind.jobs.is_empty());
    assert!(behind.next_due_in.expect("a job") > Duration::from_secs(60), "{behind:?}");

    // Once that run ends, it is.
    assert!(job::complete(&store, running.jobs[0].id, "w1").await.expect("complete"));
    let free = job::claim(&mut conn, "w2", &["a_kind"], LEASE, 10, u32::MAX).await.expect("claim");
    assert!(free.jobs.is_empty());
    let due_in = free.next_due_in.expect("a job");
    assert!(due_in <= Duration::from_secs(31), "{due_in:?}");
    sqlx::query("update jobs set run_at = now() where id = $1")
        .bind(queued.uuid())
        .execute(store.pool())
        .await
        .expect("due");
    let claimed = job::claim(&mut conn, "w2", &["a_kind"], LEASE, 10, u32::MAX).await.expect("claim");
    assert_eq!(claimed.jobs.iter().map(|j| (j.id, j.state)).collect::<Vec<_>>(), vec![(queued, JobState::Running)]);
}

#[tokio::test]
async fn a_merged_request_keeps_the_earlier_due_time_either_way() {
    let (_db, store) = db().await;
    let mut conn = store.conn().await.expect("conn");
    let target = Uuid::now_v7();
    let soon = Utc::now() + chrono::Duration::minutes(1);
    let later = Utc::now() + chrono::Duration::hours(1);
    let first = enqueue(&store, &NewJob { run_at: Some(soon), ..new_job("a_kind", target) }, "1").await;
    let second = enqueue(&store, &NewJob { run_at: Some(later), ..new_job("a_kind", target) }, "2").await;
    assert_eq!(first, second, "one queued job per target and kind");
    let run_at = job::get(&mut conn, first).await.expect("get").expect("job").run_at;
    assert!((run_at - soon).num_milliseconds().abs() < 5, "a later request does not delay it");

    let now = enqueue(&store, &new_job("a_kind", target), "now").await;
    assert_eq!(now, first);
    assert!(
        job::get(&mut conn, first).await.expect("get").expect("job").run_at <= Utc::now(),
        "an earlier one hastens it"
    );
    assert_eq!(job::list_for_target(&mut conn, target).await.expect("list").len(), 1);
}

/// The plan PostgreSQL picks for the claim's read of due jobs (the `ready` part of `claim`, its
/// ordering and kinds), as text.
async fn ready_plan(store: &paddock_store::Store, kinds: &[&str]) -> String {
    let rows: Vec<String> = sqlx::query_scalar(
        "explain select id from jobs q where state = 'queued' and run_at <= now() and kind = any($1) \
         order by run_at, id limit 8",
    )
    .bind(kinds)
    .fetch_all(store.pool())
    .await
    .expect("explain");
    rows.join("\n")
}

#[tokio::test]
async fn a_backlog_on_a_table_without_statistics_gets_them_and_the_claim_reads_in_due_order() {
    let (_db, store) = db().await;
    let mut conn = store.conn().await.expect("conn");
    let kinds = ["a_kind", "b_kind"];
    let backlog = |n: usize| {
        let store = store.clone();
        async move {
            for i in 0..n {
                enqueue(&store, &new_job(kinds[i % 2], Uuid::now_v7()), "enqueue").await;
            }
        }
    };
    backlog(40).await;
    assert!(job::ensure_statistics(&mut conn).await.expect("analyze"), "a new table has no statistics");
    assert!(!job::ensure_statistics(&mut conn).await.expect("check"), "once is enough");

    // Statistics of 40 jobs still steer the plan when the backlog is a hundred times larger:
    // the due jobs are read in order from `jobs_ready_idx` and the read stops at the limit.
    backlog(4_000).await;
    let plan = ready_plan(&store, &kinds).await;
    assert!(plan.contains("Index Scan using jobs_ready_idx") && !plan.contains("Sort"), "{plan}");
    let claimed = job::claim(&mut conn, "w1", &kinds, LEASE, 8, u32::MAX).await.expect("claim");
    assert_eq!(claimed.jobs.len(), 8);
}
