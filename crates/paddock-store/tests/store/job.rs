//! The queue's due times: what `next_due_in` and `claim` see of jobs due later, and of jobs whose
//! target is busy. (Lease expiry and takeover, a stale worker's completion and the merging of
//! queued jobs are tested in `paddock-worker/tests/worker/queue.rs`.)

use std::time::Duration;

use chrono::Utc;
use paddock_store::job::{self, JobState, NewJob};
use uuid::Uuid;

use crate::support::db;

const LEASE: Duration = Duration::from_secs(30);

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
    assert_eq!(job::next_due_in(&mut conn, "w2", &["a_kind"], u32::MAX).await.expect("empty"), None);

    let later = Utc::now() + chrono::Duration::minutes(10);
    let target = Uuid::now_v7();
    job::enqueue(&mut conn, &NewJob { run_at: Some(later), ..new_job("a_kind", target) }).await.expect("later");
    job::enqueue(&mut conn, &new_job("b_kind", Uuid::now_v7())).await.expect("other kind");
    let due_in = job::next_due_in(&mut conn, "w2", &["a_kind"], u32::MAX).await.expect("due").expect("a job");
    assert!(due_in > Duration::from_secs(9 * 60) && due_in <= Duration::from_secs(10 * 60 + 1), "{due_in:?}");
    assert!(
        job::claim(&mut conn, "w1", &["a_kind"], LEASE, 10, u32::MAX).await.expect("claim").is_empty(),
        "not due yet"
    );

    // A due job whose target runs another job is neither due nor claimable until that run ends.
    let busy = Uuid::now_v7();
    job::enqueue(&mut conn, &new_job("c_kind", busy)).await.expect("runs");
    let running = job::claim(&mut conn, "w1", &["c_kind"], LEASE, 1, u32::MAX).await.expect("claim");
    assert_eq!(running.len(), 1);
    let queued = job::enqueue(&mut conn, &new_job("a_kind", busy)).await.expect("queued behind");
    assert!(
        job::next_due_in(&mut conn, "w2", &["a_kind"], u32::MAX).await.expect("due").expect("a job")
            > Duration::from_secs(60)
    );
    assert!(job::claim(&mut conn, "w2", &["a_kind"], LEASE, 10, u32::MAX).await.expect("claim").is_empty());

    assert!(job::complete(&mut conn, running[0].id, "w1").await.expect("complete"));
    assert!(
        job::next_due_in(&mut conn, "w2", &["a_kind"], u32::MAX).await.expect("due").expect("a job")
            < Duration::from_secs(1)
    );
    let claimed = job::claim(&mut conn, "w2", &["a_kind"], LEASE, 10, u32::MAX).await.expect("claim");
    assert_eq!(claimed.iter().map(|j| (j.id, j.state)).collect::<Vec<_>>(), vec![(queued, JobState::Running)]);
}

#[tokio::test]
async fn a_merged_request_keeps_the_earlier_due_time_either_way() {
    let (_db, store) = db().await;
    let mut conn = store.conn().await.expect("conn");
    let target = Uuid::now_v7();
    let soon = Utc::now() + chrono::Duration::minutes(1);
    let later = Utc::now() + chrono::Duration::hours(1);
    let first = job::enqueue(&mut conn, &NewJob { run_at: Some(soon), ..new_job("a_kind", target) }).await.expect("1");
    let second =
        job::enqueue(&mut conn, &NewJob { run_at: Some(later), ..new_job("a_kind", target) }).await.expect("2");
    assert_eq!(first, second, "one queued job per target and kind");
    let run_at = job::get(&mut conn, first).await.expect("get").expect("job").run_at;
    assert!((run_at - soon).num_milliseconds().abs() < 5, "a later request does not delay it");

    let now = job::enqueue(&mut conn, &new_job("a_kind", target)).await.expect("now");
    assert_eq!(now, first);
    assert!(
        job::get(&mut conn, first).await.expect("get").expect("job").run_at <= Utc::now(),
        "an earlier one hastens it"
    );
    assert_eq!(job::list_for_target(&mut conn, target).await.expect("list").len(), 1);
}
