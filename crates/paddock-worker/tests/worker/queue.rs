//! The queue's store functions, one statement at a time.

use std::time::Duration;

use chrono::Utc;
use paddock_store::job::{self, JobError, JobState, NewJob, Requeue, RetryPolicy};
use paddock_store::StoreError;
use paddock_types::operation::OperationState;
use paddock_types::problem::Problem;
use sqlx::postgres::PgListener;
use uuid::Uuid;

use crate::support::*;

const LEASE: Duration = Duration::from_secs(30);

fn policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy { max_attempts, base: Duration::from_secs(1), cap: Duration::from_secs(8) }
}

#[tokio::test]
async fn enqueue_in_a_rolled_back_transaction_leaves_no_job_and_sends_no_notification() {
    let (db, store) = db().await;
    let mut listener = PgListener::connect_with(store.pool()).await.expect("listener");
    listener.listen(job::NOTIFY_CHANNEL).await.expect("listen");

    let target = Uuid::now_v7();
    let mut tx = store.begin().await.expect("begin");
    job::enqueue(&mut tx, &new_job("machine_enroll", target)).await.expect("enqueue");
    tx.rollback().await.expect("rollback");
    assert_eq!(db.count("jobs").await, 0);

    // The committed one notifies, with its kind as payload; the rolled-back one never did.
    let mut tx = store.begin().await.expect("begin");
    job::enqueue(&mut tx, &new_job("machine_inspect", target)).await.expect("enqueue");
    tx.commit().await.expect("commit");
    assert_eq!(db.count("jobs").await, 1);
    let n = tokio::time::timeout(Duration::from_secs(10), listener.recv()).await.expect("notified").expect("recv");
    assert_eq!(n.payload(), "machine_inspect");
}

#[tokio::test]
async fn enqueue_commits_with_the_state_change_that_needs_it() {
    let (_db, store) = db().await;
    let target = Uuid::now_v7();
    let mut tx = store.begin().await.expect("begin");
    let op = {
        let new = paddock_store::operation::NewOperation {
            kind: "machine_enroll",
            target_type: "machine",
            target_id: target,
            tenant_id: None,
            target_generation: 1,
            supersedes: &[],
            context: Default::default(),
        };
        paddock_store::operation::insert(&mut tx, &new).await.expect("operation").id
    };
    let id = job::enqueue(&mut tx, &NewJob { operation_id: Some(op), ..new_job("machine_enroll", target) })
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    let j = get(&store, id).await;
    assert_eq!((j.state, j.operation_id, j.attempts), (JobState::Queued, Some(op), 0));
    assert_eq!(j.payload, serde_json::json!({ "machine_id": target }));
}

#[tokio::test]
async fn a_second_enqueue_while_queued_returns_the_same_job_and_keeps_the_earlier_run_at() {
    let (db, store) = db().await;
    let target = Uuid::now_v7();
    let later = Utc::now() + chrono::Duration::hours(1);
    let first = enqueue(&store, &NewJob { run_at: Some(later), ..new_job("cluster_provision", target) }).await;
    let second = enqueue(&store, &new_job("cluster_provision", target)).await;
    let third = enqueue(&store, &NewJob { run_at: Some(later), ..new_job("cluster_provision", target) }).await;
    assert_eq!(first, second);
    assert_eq!(first, third);
    assert_eq!(db.count("jobs").await, 1);
    // The request "now" pulled the job forward; the later one did not push it back.
    assert!(get(&store, first).await.run_at <= Utc::now());

    // Another kind on the same target is another job.
    let other = enqueue(&store, &new_job("cluster_delete", target)).await;
    assert_ne!(other, first);
}

#[tokio::test]
async fn a_newer_operation_merged_into_a_queued_job_supersedes_the_older_one() {
    let (_db, store) = db().await;
    let target = Uuid::now_v7();
    let op1 = operation(&store, "machine_enroll", target).await;
    let op2 = operation(&store, "machine_update_credentials", target).await;
    let id = enqueue(&store, &NewJob { operation_id: Some(op1), ..new_job("machine_reconcile", target) }).await;
    let same = enqueue(&store, &NewJob { operation_id: Some(op2), ..new_job("machine_reconcile", target) }).await;
    assert_eq!(id, same);
    assert_eq!(get(&store, id).await.operation_id, Some(op2));
    assert_eq!(op(&store, op1).await.state, OperationState::Superseded);
    assert_eq!(op(&store, op2).await.state, OperationState::Pending);
    // A request without an operation keeps the job's operation.
    enqueue(&store, &new_job("machine_reconcile", target)).await;
    assert_eq!(get(&store, id).await.operation_id, Some(op2));
}

#[tokio::test]
async fn an_enqueue_while_running_adds_one_follow_up_that_starts_after_the_run() {
    let (db, store) = db().await;
    let target = Uuid::now_v7();
    let first = enqueue(&store, &new_job("machine_enroll", target)).await;
    let claimed = claim(&store, "w1", &["machine_enroll"], LEASE, 10).await;
    assert_eq!(claimed.len(), 1);

    let follow_up = enqueue(&store, &new_job("machine_enroll", target)).await;
    assert_ne!(follow_up, first, "a request during the run must not merge into the running job");
    assert_eq!(enqueue(&store, &new_job("machine_enroll", target)).await, follow_up);
    assert_eq!(db.count("jobs").await, 2);

    // The follow-up is due, but its target is busy.
    assert!(claim(&store, "w2", &["machine_enroll"], LEASE, 10).await.is_empty());
    assert!(job::complete(&store, first, "w1").await.expect("complete"));
    let next = claim(&store, "w2", &["machine_enroll"], LEASE, 10).await;
    assert_eq!(next.iter().map(|j| j.id).collect::<Vec<_>>(), vec![follow_up]);
}

#[tokio::test]
async fn claim_takes_only_due_jobs_of_its_kinds() {
    let (_db, store) = db().await;
    let due = enqueue(&store, &new_job("machine_enroll", Uuid::now_v7())).await;
    let later = Utc::now() + chrono::Duration::hours(1);
    enqueue(&store, &NewJob { run_at: Some(later), ..new_job("machine_enroll", Uuid::now_v7()) }).await;
    enqueue(&store, &new_job("cluster_provision", Uuid::now_v7())).await;

    let claimed = claim(&store, "w1", &["machine_enroll"], LEASE, 10).await;
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![due]);
    let j = &claimed[0];
    assert_eq!((j.state, j.locked_by.as_deref()), (JobState::Running, Some("w1")));
    assert!(j.locked_until.expect("lease") > Utc::now() + chrono::Duration::seconds(20));
    assert!(claim(&store, "w1", &["machine_enroll"], LEASE, 10).await.is_empty());
    assert!(claim(&store, "w1", &[], LEASE, 10).await.is_empty());
}

#[tokio::test]
async fn claim_starts_at_most_one_job_per_target_whatever_the_kinds() {
    let (_db, store) = db().await;
    let target = Uuid::now_v7();
    let kinds = ["a_kind", "b_kind", "c_kind"];
    for kind in kinds {
        enqueue(&store, &new_job(kind, target)).await;
    }
    let other = enqueue(&store, &new_job("a_kind", Uuid::now_v7())).await;

    let claimed = claim(&store, "w1", &kinds, LEASE, 10).await;
    assert_eq!(claimed.len(), 2, "one job of the shared target and the other target's job");
    assert!(claimed.iter().any(|j| j.id == other));
    let busy = claimed.iter().find(|j| j.target_id == target).expect("one of the target").id;
    assert!(claim(&store, "w2", &kinds, LEASE, 10).await.is_empty());

    // The schema itself refuses a second running job for the target.
    let err = sqlx::query(
        "update jobs set state = 'running', locked_by = 'rogue', locked_until = now() + interval '1 minute' \
         where target_id = $1 and state = 'queued'",
    )
    .bind(target)
    .execute(store.pool())
    .await
    .map_err(StoreError::from)
    .expect_err("unique index");
    assert!(
        matches!(&err, StoreError::Unique { constraint, .. } if constraint == "jobs_running_target_key"),
        "{err:?}"
    );

    // Each completion frees the target for the next kind.
    assert!(job::complete(&store, busy, "w1").await.expect("complete"));
    // A claim may come back empty once under a heavily loaded machine (seen once in a full
    // parallel run; the worker simply claims again at its next poll), so claim like the worker
    // does: again, until a deadline.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let next = loop {
        let next = claim(&store, "w2", &kinds, LEASE, 10).await;
        if !next.is_empty() || std::time::Instant::now() > deadline {
            break next;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(next.len(), 1);
    assert!(job::complete(&store, next[0].id, "w2").await.expect("complete"));
    assert_eq!(claim(&store, "w2", &kinds, LEASE, 10).await.len(), 1);
}

#[tokio::test]
async fn claim_marks_the_operation_running_and_complete_marks_it_succeeded() {
    let (_db, store) = db().await;
    let target = Uuid::now_v7();
    let op_id = operation(&store, "machine_enroll", target).await;
    let id = enqueue(&store, &NewJob { operation_id: Some(op_id), ..new_job("machine_enroll", target) }).await;
    assert_eq!(op(&store, op_id).await.state, OperationState::Pending);

    claim(&store, "w1", &["machine_enroll"], LEASE, 1).await;
    assert_eq!(op(&store, op_id).await.state, OperationState::Running);

    assert!(job::complete(&store, id, "w1").await.expect("complete"));
    let (j, o) = (get(&store, id).await, op(&store, op_id).await);
    assert_eq!((j.state, j.locked_by, j.locked_until), (JobState::Succeeded, None, None));
    assert!(j.finished_at.is_some());
    assert_eq!(o.state, OperationState::Succeeded);
    assert!(o.finished_at.is_some());
    // Completing twice is refused: the run is over.
    assert!(!job::complete(&store, id, "w1").await.expect("complete"));
}

#[tokio::test]
async fn a_superseded_operation_stays_superseded() {
    let (_db, store) = db().await;
    let target = Uuid::now_v7();
    let op1 = operation(&store, "machine_enroll", target).await;
    let id = enqueue(&store, &NewJob { operation_id: Some(op1), ..new_job("machine_enroll", target) }).await;
    claim(&store, "w1", &["machine_enroll"], LEASE, 1).await;
    // A newer change of the same kind supersedes it while the job runs.
    let op2 = operation(&store, "machine_enroll", target).await;
    assert_eq!(op(&store, op1).await.state, OperationState::Superseded);

    assert!(job::complete(&store, id, "w1").await.expect("complete"));
    assert_eq!(op(&store, op1).await.state, OperationState::Superseded);
    assert_eq!(op(&store, op2).await.state, OperationState::Pending);
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_by_another_worker() {
    let (_db, store) = db().await;
    let target = Uuid::now_v7();
    let id = enqueue(&store, &new_job("machine_enroll", target)).await;
    // Worker 1 claims with a 1 ms lease and "crashes": it never renews nor completes.
    let claimed = claim(&store, "w1", &["machine_enroll"], Duration::from_millis(1), 1).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].attempts, 0);

    let taken = loop {
        let taken = claim(&store, "w2", &["machine_enroll"], LEASE, 1).await;
        if !taken.is_empty() {
            break taken;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let j = &taken[0];
    assert_eq!((j.id, j.locked_by.as_deref(), j.attempts), (id, Some("w2"), 1), "the crash counts as an attempt");
    let last = j.last_error.as_ref().expect("last_error");
    assert_eq!(last.code, "lease_expired");
    assert!(last.message.contains("w1"), "{}", last.message);
    // The new lease is the full length, not the expired one.
    assert!(j.locked_until.expect("lease") > Utc::now() + chrono::Duration::seconds(20));
}

#[tokio::test]
async fn a_stale_worker_cannot_end_a_run_after_losing_its_lease() {
    let (_db, store) = db().await;
    let target = Uuid::now_v7();
    let op_id = operation(&store, "machine_enroll", target).await;
    let id = enqueue(&store, &NewJob { operation_id: Some(op_id), ..new_job("machine_enroll", target) }).await;
    claim(&store, "stale", &["machine_enroll"], LEASE, 1).await;
    expire_lease(&store, id).await;
    assert_eq!(claim(&store, "fresh", &["machine_enroll"], LEASE, 1).await.len(), 1);

    let mut conn = store.conn().await.expect("conn");
    let error = JobError::new("boom", "stale failure");
    let problem = problem("stale_problem");
    assert!(!job::heartbeat(&mut conn, id, "stale", LEASE).await.expect("heartbeat"));
    assert!(!job::complete(&store, id, "stale").await.expect("complete"));
    assert!(!job::fail(&store, id, "stale", &problem).await.expect("fail"));
    assert_eq!(job::retry(&store, id, "stale", &error, &policy(3)).await.expect("retry"), Requeue::LeaseLost);
    assert_eq!(job::wait(&store, id, "stale", &error, LEASE).await.expect("wait"), Requeue::LeaseLost);
    let j = get(&store, id).await;
    assert_eq!((j.state, j.locked_by.as_deref(), j.attempts), (JobState::Running, Some("fresh"), 1));
    assert_eq!(op(&store, op_id).await.state, OperationState::Running);

    // The current holder's result stands, and the stale one still cannot touch it.
    assert!(job::heartbeat(&mut conn, id, "fresh", LEASE).await.expect("heartbeat"));
    assert!(job::complete(&store, id, "fresh").await.expect("complete"));
    assert!(!job::fail(&store, id, "stale", &problem).await.expect("fail"));
    assert_eq!(get(&store, id).await.state, JobState::Succeeded);
    assert_eq!(op(&store, op_id).await.state, OperationState::Succeeded);
}

#[tokio::test]
async fn a_heartbeat_keeps_the_lease_from_expiring() {
    let (_db, store) = db().await;
    let id = enqueue(&store, &new_job("machine_enroll", Uuid::now_v7())).await;
    claim(&store, "w1", &["machine_enroll"], Duration::from_millis(1), 1).await;
    let mut conn = store.conn().await.expect("conn");
    // Renewed (even after the old lease ran out, as nobody took the job over meanwhile).
    assert!(job::heartbeat(&mut conn, id, "w1", LEASE).await.expect("heartbeat"));
    assert!(get(&store, id).await.locked_until.expect("lease") > Utc::now() + chrono::Duration::seconds(20));
    assert!(claim(&store, "w2", &["machine_enroll"], LEASE, 1).await.is_empty());
}

/// The database server's clock now.
async fn db_clock(conn: &mut sqlx::PgConnection) -> chrono::DateTime<Utc> {
    sqlx::query_scalar("select clock_timestamp()").fetch_one(conn).await.expect("the database's clock")
}

#[tokio::test]
async fn retry_backoff_doubles_is_capped_and_jittered() {
    let (_db, store) = db().await;
    let policy = RetryPolicy { max_attempts: 100, base: Duration::from_secs(1), cap: Duration::from_secs(8) };
    let mut conn = store.conn().await.expect("conn");
    // Eight jobs retried seven times each: delays after attempt n lie in [d/2, d], d = min(8 s, 2^(n-1) s).
    let mut delays: Vec<Vec<f64>> = vec![Vec::new(); 7];
    for _ in 0..8 {
        let id = enqueue(&store, &new_job("machine_enroll", Uuid::now_v7())).await;
        for n in 1..=7u32 {
            make_due(&store, id).await;
            assert_eq!(claim(&store, "w1", &["machine_enroll"], LEASE, 1).await.len(), 1);
            // The database's clock, which `retry` reads (`now()`), before and after: no slack for
            // the distance between this process's clock and the server's.
            let before = db_clock(&mut conn).await;
            let r = job::retry(&store, id, "w1", &JobError::new("bmc_unreachable", "no route to the BMC"), &policy)
                .await
                .expect("retry");
            let after = db_clock(&mut conn).await;
            let Requeue::Queued { run_at, attempts } = r else { panic!("requeued, not {r:?}") };
            assert_eq!(attempts, n);
            let (lo, hi) = policy.delay_bounds(n);
            let lo = chrono::Duration::from_std(lo).expect("lo");
            let hi = chrono::Duration::from_std(hi).expect("hi");
            assert!(
                run_at >= before + lo && run_at <= after + hi,
                "attempt {n}: {run_at} not in [{lo}, {hi}] after {before}"
            );
            delays[n as usize - 1].push((run_at - before).num_milliseconds() as f64 / 1000.0);
            let j = get(&store, id).await;
            assert_eq!((j.state, j.locked_by), (JobState::Queued, None));
            assert_eq!(j.last_error.expect("last_error").code, "bmc_unreachable");
        }
    }
    // Capped: attempts 5, 6 and 7 all wait at most 8 s. Jittered: the eight jobs did not all
    // draw the same delay for the same attempt.
    for (n, ds) in delays.iter().enumerate().skip(4) {
        assert!(ds.iter().all(|d| *d <= 8.05), "attempt {}: {ds:?}", n + 1);
    }
    for (n, ds) in delays.iter().enumerate() {
        let spread = ds.iter().cloned().fold(f64::MIN, f64::max) - ds.iter().cloned().fold(f64::MAX, f64::min);
        assert!(spread > 0.0, "attempt {}: no jitter in {ds:?}", n + 1);
    }
}

#[tokio::test]
async fn wait_reschedules_without_using_up_an_attempt() {
    let (_db, store) = db().await;
    let target = Uuid::now_v7();
    let op_id = operation(&store, "machine_enroll", target).await;
    let id = enqueue(&store, &NewJob { operation_id: Some(op_id), ..new_job("machine_enroll", target) }).await;
    for _ in 0..5 {
        make_due(&store, id).await;
        assert_eq!(claim(&store, "w1", &["machine_enroll"], LEASE, 1).await.len(), 1);
        let before = Utc::now();
        let r = job::wait(
            &store,
            id,
            "w1",
            &JobError::new("bmc_booting", "the BMC is still booting"),
            Duration::from_secs(60),
        )
        .await
        .expect("wait");
        let Requeue::Queued { run_at, attempts } = r else { panic!("requeued, not {r:?}") };
        assert_eq!(attempts, 0);
        assert!(run_at >= before + chrono::Duration::seconds(59));
    }
    let j = get(&store, id).await;
    assert_eq!((j.state, j.attempts), (JobState::Queued, 0));
    assert_eq!(j.last_error.expect("reason").code, "bmc_booting");
    // The operation is still in progress.
    assert_eq!(op(&store, op_id).await.state, OperationState::Running);
}

#[tokio::test]
async fn the_last_allowed_failure_fails_the_job_and_its_operation_with_a_readable_problem() {
    let (_db, store) = db().await;
    let target = Uuid::now_v7();
    let op_id = operation(&store, "machine_enroll", target).await;
    let id = enqueue(&store, &NewJob { operation_id: Some(op_id), ..new_job("machine_enroll", target) }).await;
    let error = JobError::new("bmc_unreachable", "the BMC at bmc-7 did not answer");
    for n in 1..=3u32 {
        make_due(&store, id).await;
        assert_eq!(claim(&store, "w1", &["machine_enroll"], LEASE, 1).await.len(), 1);
        let r = job::retry(&store, id, "w1", &error, &policy(3)).await.expect("retry");
        if n < 3 {
            assert!(matches!(r, Requeue::Queued { attempts, .. } if attempts == n), "{r:?}");
        } else {
            assert_eq!(r, Requeue::Failed { attempts: 3 });
        }
    }
    let j = get(&store, id).await;
    assert_eq!((j.state, j.attempts, j.locked_by.as_deref()), (JobState::Failed, 3, None));
    assert!(j.finished_at.is_some());
    assert!(claim(&store, "w1", &["machine_enroll"], LEASE, 1).await.is_empty());

    let o = op(&store, op_id).await;
    assert_eq!(o.state, OperationState::Failed);
    assert!(o.finished_at.is_some());
    let p = o.error.expect("problem");
    assert_eq!(p.type_, "https://paddock.dev/problems/retries-exhausted");
    assert_eq!(p.title, "Retries exhausted");
    assert_eq!(p.status, 503);
    assert_eq!(p.code, "bmc_unreachable");
    assert_eq!(p.detail, "gave up after 3 attempts; last error: the BMC at bmc-7 did not answer");
    assert_eq!(p.instance, format!("/v1/operations/{op_id}"));
    assert_eq!(p.request_id, id.to_string());
    // The Rust helper writes the same shape.
    let same = job::retries_exhausted(&j, &error);
    assert_eq!((same.type_, same.detail, same.instance), (p.type_, p.detail, p.instance));
}

fn problem(code: &str) -> Problem {
    Problem {
        type_: "https://paddock.dev/problems/operation-failed".to_owned(),
        title: "Operation failed".to_owned(),
        status: 422,
        detail: "the machine class asks for 8 GPUs; the BMC reports 4".to_owned(),
        instance: String::new(),
        code: code.to_owned(),
        request_id: String::new(),
        errors: Vec::new(),
    }
}

#[tokio::test]
async fn fail_ends_the_job_and_fails_its_operation_with_the_problem() {
    let (_db, store) = db().await;
    let target = Uuid::now_v7();
    let op_id = operation(&store, "machine_enroll", target).await;
    let id = enqueue(&store, &NewJob { operation_id: Some(op_id), ..new_job("machine_enroll", target) }).await;
    claim(&store, "w1", &["machine_enroll"], LEASE, 1).await;
    assert!(job::fail(&store, id, "w1", &problem("inventory_mismatch")).await.expect("fail"));

    let j = get(&store, id).await;
    assert_eq!((j.state, j.attempts), (JobState::Failed, 0));
    assert_eq!(j.last_error.expect("last_error").code, "inventory_mismatch");
    let o = op(&store, op_id).await;
    assert_eq!(o.state, OperationState::Failed);
    let p = o.error.expect("problem");
    assert_eq!((p.code.as_str(), p.status), ("inventory_mismatch", 422));
    assert_eq!(p.detail, "the machine class asks for 8 GPUs; the BMC reports 4");
    assert_eq!(p.instance, format!("/v1/operations/{op_id}"));
    assert_eq!(p.request_id, id.to_string());
}

#[tokio::test]
async fn a_run_that_would_requeue_hands_over_to_a_follow_up_of_its_kind() {
    let (db, store) = db().await;
    let target = Uuid::now_v7();
    let op1 = operation(&store, "machine_enroll", target).await;
    let first = enqueue(&store, &NewJob { operation_id: Some(op1), ..new_job("machine_enroll", target) }).await;
    claim(&store, "w1", &["machine_enroll"], LEASE, 1).await;
    // Requested again during the run, without an operation of its own.
    let follow = enqueue(&store, &new_job("machine_enroll", target)).await;

    let r =
        job::retry(&store, first, "w1", &JobError::new("bmc_unreachable", "timeout"), &policy(5)).await.expect("retry");
    assert_eq!(r, Requeue::HandedOver { to: follow });
    let j = get(&store, first).await;
    assert_eq!(j.state, JobState::Cancelled);
    assert!(j.finished_at.is_some());
    // The follow-up adopted the operation, which is still running.
    let f = get(&store, follow).await;
    assert_eq!((f.state, f.operation_id), (JobState::Queued, Some(op1)));
    assert_eq!(op(&store, op1).await.state, OperationState::Running);
    assert_eq!(db.count("jobs where state = 'queued'").await, 1);

    // With an operation of its own, the follow-up supersedes the older one.
    let claimed = claim(&store, "w1", &["machine_enroll"], LEASE, 1).await;
    assert_eq!(claimed[0].id, follow);
    let op2 = operation(&store, "machine_update_credentials", target).await;
    let follow2 = enqueue(&store, &NewJob { operation_id: Some(op2), ..new_job("machine_enroll", target) }).await;
    let r = job::wait(&store, follow, "w1", &JobError::new("bmc_booting", "booting"), LEASE).await.expect("wait");
    assert_eq!(r, Requeue::HandedOver { to: follow2 });
    assert_eq!(op(&store, op1).await.state, OperationState::Superseded);
    assert_eq!(op(&store, op2).await.state, OperationState::Pending);
}

#[tokio::test]
async fn cancel_depth_and_purge() {
    let (db, store) = db().await;
    let target = Uuid::now_v7();
    enqueue(&store, &new_job("machine_enroll", target)).await;
    enqueue(&store, &new_job("machine_inspect", target)).await;
    enqueue(&store, &new_job("machine_enroll", Uuid::now_v7())).await;
    let running = claim(&store, "w1", &["machine_enroll"], LEASE, 10).await;
    assert_eq!(running.len(), 2);

    let mut conn = store.conn().await.expect("conn");
    let depth = job::depth(&mut conn).await.expect("depth");
    let depth: Vec<_> = depth.iter().map(|d| (d.kind.as_str(), d.state.as_str(), d.count)).collect();
    assert_eq!(depth, vec![("machine_enroll", "running", 2), ("machine_inspect", "queued", 1)]);

    // Only queued jobs are cancelled; the running one finishes.
    assert_eq!(job::cancel_queued(&mut conn, target, Some(&["machine_inspect"][..])).await.expect("cancel"), 1);
    assert_eq!(job::cancel_queued(&mut conn, target, None).await.expect("cancel"), 0);
    for j in &running {
        assert!(job::complete(&store, j.id, "w1").await.expect("complete"));
    }
    assert!(job::depth(&mut conn).await.expect("depth").is_empty());

    assert_eq!(job::purge_finished(&mut conn, Duration::from_secs(3600), 100).await.expect("purge"), 0);
    sqlx::query("update jobs set finished_at = now() - interval '2 hours'").execute(store.pool()).await.expect("age");
    assert_eq!(job::purge_finished(&mut conn, Duration::from_secs(3600), 2).await.expect("purge"), 2);
    assert_eq!(job::purge_finished(&mut conn, Duration::from_secs(3600), 2).await.expect("purge"), 1);
    assert_eq!(db.count("jobs").await, 0);
}

#[tokio::test]
async fn list_for_target_is_the_targets_history() {
    let (_db, store) = db().await;
    let target = Uuid::now_v7();
    let a = enqueue(&store, &new_job("machine_enroll", target)).await;
    claim(&store, "w1", &["machine_enroll"], LEASE, 1).await;
    let b = enqueue(&store, &new_job("machine_enroll", target)).await;
    enqueue(&store, &new_job("machine_enroll", Uuid::now_v7())).await;
    let mut conn = store.conn().await.expect("conn");
    let history = job::list_for_target(&mut conn, target).await.expect("list");
    assert_eq!(
        history.iter().map(|j| (j.id, j.state)).collect::<Vec<_>>(),
        vec![(a, JobState::Running), (b, JobState::Queued)]
    );
}

/// A due job of `tenant` (`None`: the fleet's) on a target of its own.
async fn tenant_job(store: &paddock_store::Store, tenant: Option<Uuid>) -> paddock_types::JobId {
    let tenant_id = tenant.map(paddock_types::TenantId);
    enqueue(store, &NewJob { tenant_id, ..new_job("cluster_reconcile", Uuid::now_v7()) }).await
}

/// The running jobs `worker` holds per tenant (`None` for the fleet's).
async fn held(store: &paddock_store::Store, worker: &str) -> std::collections::HashMap<Option<Uuid>, i64> {
    let rows: Vec<(Option<Uuid>, i64)> = sqlx::query_as(
        "select tenant_id, count(*) from jobs where state = 'running' and locked_by = $1 group by tenant_id",
    )
    .bind(worker)
    .fetch_all(store.pool())
    .await
    .expect("held");
    rows.into_iter().collect()
}

#[tokio::test]
async fn claim_never_gives_one_tenant_more_than_its_slots_on_a_worker() {
    let (_db, store) = db().await;
    let kinds = ["cluster_reconcile"];
    let (busy, quiet) = (Uuid::now_v7(), Uuid::now_v7());
    // The busy tenant's backlog is older than everything else, and larger than a whole batch.
    for _ in 0..12 {
        tenant_job(&store, Some(busy)).await;
    }
    let quiet_job = tenant_job(&store, Some(quiet)).await;
    let fleet_job = tenant_job(&store, None).await;

    // Slots 2 of a batch of 4: the busy tenant gets 2, its other jobs cannot fill the batch.
    let mut claimed = claim_within(&store, "w1", &kinds, LEASE, 4, 2).await;
    claimed.extend(claim_within(&store, "w1", &kinds, LEASE, 4, 2).await);
    let ids: Vec<_> = claimed.iter().map(|j| j.id).collect();
    assert!(ids.contains(&quiet_job) && ids.contains(&fleet_job), "{ids:?}");
    let on_w1 = held(&store, "w1").await;
    assert_eq!(on_w1.get(&Some(busy)), Some(&2), "{on_w1:?}");
    // At its bound: nothing more of it on this worker, and nothing it waits for to sleep on.
    let mut conn = store.conn().await.expect("conn");
    let at_bound = job::claim(&mut conn, "w1", &kinds, LEASE, 4, 2).await.expect("claim");
    assert!(at_bound.jobs.is_empty(), "{at_bound:?}");
    assert_eq!(at_bound.next_due_in, None);

    // The bound is per worker: another worker has slots of its own.
    assert_eq!(claim_within(&store, "w2", &kinds, LEASE, 8, 2).await.len(), 2);
    assert_eq!(held(&store, "w2").await.get(&Some(busy)), Some(&2));

    // A run that ends frees one slot, and only one.
    let one = claimed.iter().find(|j| j.tenant_id.map(|t| t.0) == Some(busy)).expect("a busy job").id;
    assert!(job::complete(&store, one, "w1").await.expect("complete"));
    let next = claim_within(&store, "w1", &kinds, LEASE, 4, 2).await;
    assert_eq!(next.len(), 1, "{next:?}");
    assert_eq!(held(&store, "w1").await.get(&Some(busy)), Some(&2));

    // A job taken over from a dead worker counts too: w2's lapsed leases go to w3 within bound.
    for j in claimed_by(&store, "w2").await {
        expire_lease(&store, j).await;
    }
    let taken = claim_within(&store, "w3", &kinds, LEASE, 8, 1).await;
    assert_eq!(taken.iter().filter(|j| j.tenant_id.map(|t| t.0) == Some(busy)).count(), 1, "{taken:?}");
    assert_eq!(held(&store, "w3").await.get(&Some(busy)), Some(&1));
}

/// The ids of the running jobs `worker` holds.
async fn claimed_by(store: &paddock_store::Store, worker: &str) -> Vec<paddock_types::JobId> {
    let ids: Vec<Uuid> = sqlx::query_scalar("select id from jobs where state = 'running' and locked_by = $1")
        .bind(worker)
        .fetch_all(store.pool())
        .await
        .expect("claimed");
    ids.into_iter().map(paddock_types::JobId).collect()
}
