//! Wake-ups: sent after the commit of the jobs they announce, never from inside the transaction
//! that enqueued them (which would queue its commit on PostgreSQL's notify lock), and never needed
//! for a job to run.

use std::time::Duration;

use paddock_store::job::{self, JobState};
use paddock_store::{Txn, Waker};
use paddock_worker::Outcome;
use sqlx::postgres::{PgListener, PgNotification, PgPoolOptions};
use uuid::Uuid;

use crate::support::*;

const LEASE: Duration = Duration::from_secs(30);

async fn listen(store: &paddock_store::Store) -> PgListener {
    let mut listener = PgListener::connect_with(store.pool()).await.expect("listener");
    listener.listen(job::NOTIFY_CHANNEL).await.expect("listen");
    listener
}

async fn next(listener: &mut PgListener) -> PgNotification {
    tokio::time::timeout(Duration::from_secs(20), listener.recv()).await.expect("a notification").expect("recv")
}

/// Sends `marker` on the channel and reads up to it: what arrives before it is every notification
/// committed before it (PostgreSQL delivers them in commit order).
async fn read_to_marker(store: &paddock_store::Store, listener: &mut PgListener) -> Vec<String> {
    sqlx::query("select pg_notify($1, 'marker')")
        .bind(job::NOTIFY_CHANNEL)
        .execute(store.pool())
        .await
        .expect("marker");
    let mut seen = Vec::new();
    loop {
        let n = next(listener).await;
        if n.payload() == "marker" {
            return seen;
        }
        seen.push(n.payload().to_owned());
    }
}

#[tokio::test]
async fn the_enqueuing_transaction_sends_no_notification_the_wake_up_follows_its_commit() {
    let (db, store) = db().await;
    let mut listener = listen(&store).await;
    // The transaction on a connection of its own, so its backend is known and no wake-up can be
    // sent from it once it is back in a pool.
    let own = PgPoolOptions::new().max_connections(1).connect(&db.url).await.expect("pool");
    let mut tx = Txn::new(own.begin().await.expect("begin"), Some(Waker::new(store.pool().clone())));
    let backend: i32 = sqlx::query_scalar("select pg_backend_pid()").fetch_one(&mut *tx).await.expect("pid");
    job::enqueue(&mut tx, &new_job("machine_enroll", Uuid::now_v7())).await.expect("enqueue");
    // A job due later wakes nobody.
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let not_due = job::NewJob { run_at: Some(later), ..new_job("machine_inspect", Uuid::now_v7()) };
    job::enqueue(&mut tx, &not_due).await.expect("enqueue");
    tx.commit().await.expect("commit");

    let n = next(&mut listener).await;
    assert_eq!(n.payload(), "machine_enroll");
    assert_ne!(
        u32::try_from(backend).expect("pid"),
        n.process_id(),
        "the wake-up came from the enqueuing transaction, whose commit then took the notify lock"
    );
    assert_eq!(
        read_to_marker(&store, &mut listener).await,
        Vec::<String>::new(),
        "one wake-up, none for the later job"
    );
}

#[tokio::test]
async fn a_savepoint_wakes_with_its_transaction_and_a_rolled_back_one_never() {
    let (db, store) = db().await;
    let mut listener = listen(&store).await;
    let mut tx = store.begin().await.expect("begin");
    let mut kept = tx.begin().await.expect("savepoint");
    job::enqueue(&mut kept, &new_job("machine_enroll", Uuid::now_v7())).await.expect("enqueue");
    kept.commit().await.expect("release the savepoint");
    let mut undone = tx.begin().await.expect("savepoint");
    job::enqueue(&mut undone, &new_job("machine_inspect", Uuid::now_v7())).await.expect("enqueue");
    undone.rollback().await.expect("roll back the savepoint");
    // Nothing is sent before the transaction commits.
    assert_eq!(read_to_marker(&store, &mut listener).await, Vec::<String>::new());
    tx.commit().await.expect("commit");

    assert_eq!(next(&mut listener).await.payload(), "machine_enroll");
    assert_eq!(read_to_marker(&store, &mut listener).await, Vec::<String>::new(), "nothing for the rolled-back job");
    assert_eq!(db.count("jobs").await, 1);
}

#[tokio::test]
async fn a_run_that_ends_with_a_due_job_of_its_target_wakes_that_kind() {
    let (_db, store) = db().await;
    let target = Uuid::now_v7();
    let first = enqueue(&store, &new_job("machine_enroll", target)).await;
    assert_eq!(claim(&store, "w1", &["machine_enroll"], LEASE, 1).await.len(), 1);
    // Enqueued for later (no wake-up), then due, but its target is busy: it can start only when
    // the run ends.
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let next_job = enqueue(&store, &job::NewJob { run_at: Some(later), ..new_job("machine_inspect", target) }).await;
    make_due(&store, next_job).await;
    let mut listener = listen(&store).await;
    assert!(job::complete(&store, first, "w1").await.expect("complete"));
    assert_eq!(next(&mut listener).await.payload(), "machine_inspect");
}

#[tokio::test]
async fn a_job_whose_wake_up_is_never_sent_still_runs() {
    let (db, store) = db().await;
    let h = handler("machine_enroll", |_job| async { Outcome::Done });
    let running = Running::start(paddock_worker::Worker::new(store.clone(), "w1", vec![h], config()).expect("worker"));
    // A waker whose connections are gone: its wake-up fails, as when the process that enqueued
    // dies right after its commit.
    let gone = PgPoolOptions::new().max_connections(1).connect(&db.url).await.expect("pool");
    gone.close().await;
    let mut listener = listen(&store).await;
    let mut tx = Txn::new(store.pool().begin().await.expect("begin"), Some(Waker::new(gone)));
    let id = job::enqueue(&mut tx, &new_job("machine_enroll", Uuid::now_v7())).await.expect("enqueue");
    tx.commit().await.expect("commit");
    until("the job succeeded", || async { state(&store, id).await == JobState::Succeeded }).await;
    running.stop().await;
    assert_eq!(read_to_marker(&store, &mut listener).await, Vec::<String>::new(), "no wake-up was sent");
}
