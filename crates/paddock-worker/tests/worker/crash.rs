//! A worker process killed with SIGKILL in the middle of a job: after its lease expires another
//! worker takes the job over and completes it.

use std::process::{Command, Stdio};
use std::time::Duration;

use paddock_store::job::{JobState, NewJob};
use paddock_store::Store;
use paddock_types::operation::OperationState;
use paddock_worker::{Outcome, Worker, WorkerConfig};
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use crate::support::*;

/// Set only in the child process: the database it works on.
const CHILD_ENV: &str = "PADDOCK_CRASH_TEST_DATABASE_URL";
/// The child's worker id.
const CHILD_WORKER: &str = "crash-child";

/// Records that `worker` started a run of `job` (in the test's own table).
async fn mark(pool: &sqlx::PgPool, job: Uuid, worker: &str) {
    sqlx::query("insert into crash_marks (job_id, worker) values ($1, $2)")
        .bind(job)
        .bind(worker)
        .execute(pool)
        .await
        .expect("mark");
}

/// Not a test of its own: the body of the child process the crash test starts and kills. Without
/// [`CHILD_ENV`] it returns at once.
#[tokio::test]
async fn child_process_of_the_crash_test() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let pool = PgPoolOptions::new().max_connections(4).connect(&url).await.expect("connect");
    let marks = pool.clone();
    let h = handler("machine_enroll", move |job| {
        let marks = marks.clone();
        async move {
            mark(&marks, job.id.uuid(), CHILD_WORKER).await;
            // Busy "forever": the parent kills the process here. Bounded, should the parent die.
            tokio::time::sleep(Duration::from_secs(60)).await;
            Outcome::Done
        }
    });
    let cfg = WorkerConfig { lease: Duration::from_secs(1), ..config() };
    let worker = Worker::new(Store::from_pool(pool), CHILD_WORKER, vec![h], cfg).expect("worker");
    worker.run(tokio::time::sleep(Duration::from_secs(90))).await;
}

#[tokio::test]
async fn a_worker_killed_mid_job_leaves_the_job_to_another_worker_after_its_lease() {
    let (db, store) = db().await;
    sqlx::query("create table crash_marks (job_id uuid not null, worker text not null, at timestamptz not null default clock_timestamp())")
        .execute(store.pool())
        .await
        .expect("marks table");
    let target = Uuid::now_v7();
    let op_id = operation(&store, "machine_enroll", target).await;
    let id = enqueue(&store, &NewJob { operation_id: Some(op_id), ..new_job("machine_enroll", target) }).await;

    let exe = std::env::current_exe().expect("test binary");
    let mut child = Command::new(exe)
        .args(["--exact", "crash::child_process_of_the_crash_test", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &db.url)
        .stdout(Stdio::null())
        .spawn()
        .expect("starting the child worker");
    let pool = store.pool().clone();
    let started = async {
        loop {
            let n: i64 = sqlx::query_scalar("select count(*) from crash_marks").fetch_one(&pool).await.expect("marks");
            if n > 0 {
                return;
            }
            assert!(child.try_wait().expect("child status").is_none(), "the child worker exited early");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), started).await.expect("the child started the job");
    let j = get(&store, id).await;
    assert_eq!((j.state, j.locked_by.as_deref()), (JobState::Running, Some(CHILD_WORKER)));
    assert_eq!(op(&store, op_id).await.state, OperationState::Running);

    // SIGKILL: no shutdown, no release, nothing written.
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    assert_eq!(get(&store, id).await.locked_by.as_deref(), Some(CHILD_WORKER));

    let marks = pool.clone();
    let h = handler("machine_enroll", move |job| {
        let marks = marks.clone();
        async move {
            mark(&marks, job.id.uuid(), "survivor").await;
            Outcome::Done
        }
    });
    let running = Running::start(Worker::new(store.clone(), "survivor", vec![h], config()).expect("worker"));
    let s = &store;
    until("the survivor completed the job", || async move { state(s, id).await == JobState::Succeeded }).await;
    let metrics = running.worker.metrics();
    running.stop().await;

    let j = get(&store, id).await;
    assert_eq!(j.attempts, 1, "the killed run counts as a failed attempt");
    let last = j.last_error.expect("last_error");
    assert_eq!(last.code, "lease_expired");
    assert!(last.message.contains(CHILD_WORKER), "{}", last.message);
    let workers: Vec<String> = sqlx::query_scalar("select worker from crash_marks where job_id = $1 order by at")
        .bind(id.uuid())
        .fetch_all(&pool)
        .await
        .expect("marks");
    assert_eq!(workers, vec![CHILD_WORKER.to_owned(), "survivor".to_owned()]);
    assert_eq!(op(&store, op_id).await.state, OperationState::Succeeded);
    assert_eq!(metrics.get("machine_enroll", "reclaimed"), 1);
}
