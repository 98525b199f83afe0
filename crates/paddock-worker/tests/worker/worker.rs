//! The worker loop: handlers, outcomes, racing workers, leases, notifications and shutdown.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use paddock_store::job::{JobState, NewJob};
use paddock_types::operation::OperationState;
use paddock_types::JobId;
use paddock_worker::{Outcome, Worker, WorkerConfig, WorkerError};
use tokio::sync::{mpsc, Semaphore};
use uuid::Uuid;

use crate::support::*;

#[tokio::test]
async fn a_worker_runs_jobs_to_completion_and_counts_them() {
    let (db, store) = db().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let h = handler("machine_enroll", move |_job| {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            Outcome::Done
        }
    });
    let target = Uuid::now_v7();
    let op_id = operation(&store, "machine_enroll", target).await;
    let with_op = enqueue(&store, &NewJob { operation_id: Some(op_id), ..new_job("machine_enroll", target) }).await;
    let mut ids = vec![with_op];
    for _ in 0..9 {
        ids.push(enqueue(&store, &new_job("machine_enroll", Uuid::now_v7())).await);
    }
    let worker = Worker::new(store.clone(), "w1", vec![h], config()).expect("worker");
    let running = Running::start(worker);
    until("every job succeeded", || async { db.count("jobs where state = 'succeeded'").await == 10 }).await;
    let metrics = running.worker.metrics();
    running.stop().await;

    assert_eq!(runs.load(Ordering::SeqCst), 10);
    assert_eq!(op(&store, op_id).await.state, OperationState::Succeeded);
    assert_eq!(metrics.get("machine_enroll", "claimed"), 10);
    assert_eq!(metrics.get("machine_enroll", "succeeded"), 10);
    assert_eq!(metrics.total("failed"), 0);
}

/// Handler state of the race tests: per target, how many runs are active right now.
#[derive(Default)]
struct Race {
    active: Mutex<HashMap<Uuid, usize>>,
    overlaps: AtomicUsize,
    runs: Mutex<HashMap<JobId, usize>>,
}

/// Leaves the target's active count when the run ends, even if its future is dropped.
struct Active(Arc<Race>, Uuid);

impl Drop for Active {
    fn drop(&mut self) {
        if let Some(n) = self.0.active.lock().expect("lock").get_mut(&self.1) {
            *n -= 1;
        }
    }
}

async fn workers_racing_never_run_two_jobs_of_one_target_at_once(workers: usize) {
    let (db, store) = db().await;
    let race = Arc::new(Race::default());
    let kinds = ["alpha_sync", "beta_sync", "gamma_sync"];
    let handlers = |race: Arc<Race>| {
        kinds
            .iter()
            .map(|kind| {
                let race = race.clone();
                handler(kind, move |job| {
                    let race = race.clone();
                    async move {
                        {
                            let mut active = race.active.lock().expect("lock");
                            let n = active.entry(job.target_id).or_default();
                            *n += 1;
                            if *n > 1 {
                                race.overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        let _active = Active(race.clone(), job.target_id);
                        *race.runs.lock().expect("lock").entry(job.id).or_default() += 1;
                        // A few milliseconds of "work", different per job.
                        tokio::time::sleep(Duration::from_millis(2 + u64::from(job.id.uuid().as_bytes()[15] % 8)))
                            .await;
                        Outcome::Done
                    }
                })
            })
            .collect::<Vec<_>>()
    };
    let mut running = Vec::new();
    for i in 0..workers {
        let cfg = WorkerConfig { concurrency: 3, ..config() };
        let w = Worker::new(own_store(&db, 6).await, format!("w{i}"), handlers(race.clone()), cfg).expect("worker");
        running.push(Running::start(w));
    }

    // Requests keep arriving while the workers run, every (target, kind) ten times over: some
    // merge into a queued job, some add a follow-up to a running one, some start a new job.
    let targets: Vec<Uuid> = (0..8).map(|_| Uuid::now_v7()).collect();
    let mut requested = Vec::new();
    for _round in 0..10 {
        // One transaction per round, as a service enqueues with its state change.
        let mut tx = store.begin().await.expect("begin");
        for target in &targets {
            for kind in kinds {
                requested.push(paddock_store::job::enqueue(&mut tx, &new_job(kind, *target)).await.expect("enqueue"));
            }
        }
        tx.commit().await.expect("commit");
    }
    until("the queue is drained", || async { db.count("jobs where state in ('queued', 'running')").await == 0 }).await;
    for r in running {
        r.stop().await;
    }

    assert_eq!(race.overlaps.load(Ordering::SeqCst), 0, "two jobs of one target ran at once");
    let runs = race.runs.lock().expect("lock").clone();
    let total = db.count("jobs").await;
    assert_eq!(db.count("jobs where state = 'succeeded'").await, total);
    assert_eq!(runs.len() as i64, total, "every job ran");
    assert!(runs.values().all(|n| *n == 1), "every job ran exactly once: {runs:?}");
    // No request was lost: the job each enqueue returned ran (after the request, as it was still
    // queued or was a fresh follow-up then).
    assert!(requested.iter().all(|id| runs.contains_key(id)));
    assert!(total < requested.len() as i64, "some requests merged into queued jobs");
}

#[tokio::test]
async fn two_workers_racing_never_run_two_jobs_of_one_target_at_once() {
    workers_racing_never_run_two_jobs_of_one_target_at_once(2).await;
}

#[tokio::test]
async fn eight_workers_racing_never_run_two_jobs_of_one_target_at_once() {
    workers_racing_never_run_two_jobs_of_one_target_at_once(8).await;
}

#[tokio::test]
async fn a_failing_job_is_retried_then_fails_with_its_operation() {
    let (_db, store) = db().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let h = handler("machine_enroll", move |_job| {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            Outcome::retry("bmc_unreachable", "the BMC did not answer")
        }
    });
    let target = Uuid::now_v7();
    let op_id = operation(&store, "machine_enroll", target).await;
    let id = enqueue(&store, &NewJob { operation_id: Some(op_id), ..new_job("machine_enroll", target) }).await;
    let worker =
        Worker::new(store.clone(), "w1", vec![h], WorkerConfig { max_attempts: 3, ..config() }).expect("worker");
    let running = Running::start(worker);
    until("the job failed", || async { state(&store, id).await == JobState::Failed }).await;
    let metrics = running.worker.metrics();
    running.stop().await;

    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(get(&store, id).await.attempts, 3);
    let o = op(&store, op_id).await;
    assert_eq!(o.state, OperationState::Failed);
    let p = o.error.expect("problem");
    assert_eq!((p.title.as_str(), p.code.as_str()), ("Retries exhausted", "bmc_unreachable"));
    assert_eq!(p.detail, "gave up after 3 attempts; last error: the BMC did not answer");
    assert_eq!((metrics.get("machine_enroll", "retried"), metrics.get("machine_enroll", "exhausted")), (2, 1));
}

#[tokio::test]
async fn a_permanent_failure_fails_the_operation_with_the_handlers_problem() {
    let (_db, store) = db().await;
    let h = handler("machine_enroll", |_job| async {
        Outcome::fail("inventory_mismatch", "the class asks for 8 GPUs; the BMC reports 4")
    });
    let target = Uuid::now_v7();
    let op_id = operation(&store, "machine_enroll", target).await;
    let id = enqueue(&store, &NewJob { operation_id: Some(op_id), ..new_job("machine_enroll", target) }).await;
    let running = Running::start(Worker::new(store.clone(), "w1", vec![h], config()).expect("worker"));
    until("the job failed", || async { state(&store, id).await == JobState::Failed }).await;
    let metrics = running.worker.metrics();
    running.stop().await;

    let p = op(&store, op_id).await.error.expect("problem");
    assert_eq!(p.type_, format!("{}operation-failed", paddock_types::problem::PROBLEM_BASE));
    assert_eq!((p.title.as_str(), p.status, p.code.as_str()), ("Operation failed", 422, "inventory_mismatch"));
    assert_eq!(p.detail, "the class asks for 8 GPUs; the BMC reports 4");
    assert_eq!(p.instance, format!("/v1/operations/{op_id}"));
    assert_eq!(get(&store, id).await.attempts, 0);
    assert_eq!(metrics.get("machine_enroll", "failed"), 1);
}

#[tokio::test]
async fn waiting_runs_do_not_use_up_attempts() {
    let (_db, store) = db().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let h = handler("machine_enroll", move |_job| {
        let r = r.clone();
        async move {
            if r.fetch_add(1, Ordering::SeqCst) < 4 {
                Outcome::wait(Duration::from_millis(10), "bmc_booting", "the BMC is still booting")
            } else {
                Outcome::Done
            }
        }
    });
    let id = enqueue(&store, &new_job("machine_enroll", Uuid::now_v7())).await;
    // Fewer attempts allowed than waits made: waits must not count.
    let cfg = WorkerConfig { max_attempts: 2, ..config() };
    let running = Running::start(Worker::new(store.clone(), "w1", vec![h], cfg).expect("worker"));
    until("the job succeeded", || async { state(&store, id).await == JobState::Succeeded }).await;
    let metrics = running.worker.metrics();
    running.stop().await;
    assert_eq!(runs.load(Ordering::SeqCst), 5);
    assert_eq!(get(&store, id).await.attempts, 0);
    assert_eq!(metrics.get("machine_enroll", "waited"), 4);
}

#[tokio::test]
async fn a_panicking_handler_costs_one_attempt_not_the_worker() {
    let (_db, store) = db().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let h = handler("machine_enroll", move |_job| {
        let r = r.clone();
        async move {
            if r.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("handler bug (expected by this test)");
            }
            Outcome::Done
        }
    });
    let id = enqueue(&store, &new_job("machine_enroll", Uuid::now_v7())).await;
    let running = Running::start(Worker::new(store.clone(), "w1", vec![h], config()).expect("worker"));
    until("the job succeeded", || async { state(&store, id).await == JobState::Succeeded }).await;
    running.stop().await;
    let j = get(&store, id).await;
    assert_eq!(j.attempts, 1);
    assert_eq!(j.last_error.expect("last_error").code, "handler_panicked");
}

#[tokio::test]
async fn a_job_requested_again_while_running_runs_again_after() {
    let (_db, store) = db().await;
    let (started_tx, mut started) = mpsc::unbounded_channel::<JobId>();
    let gate = Arc::new(Semaphore::new(0));
    let events = Arc::new(Mutex::new(Vec::<(&'static str, JobId)>::new()));
    let (g, e) = (gate.clone(), events.clone());
    let h = handler("cluster_provision", move |job| {
        let (g, e, started_tx) = (g.clone(), e.clone(), started_tx.clone());
        async move {
            e.lock().expect("lock").push(("start", job.id));
            let _ = started_tx.send(job.id);
            // Every run waits for the test's go.
            g.acquire().await.expect("gate").forget();
            e.lock().expect("lock").push(("end", job.id));
            Outcome::Done
        }
    });
    let target = Uuid::now_v7();
    let first = enqueue(&store, &new_job("cluster_provision", target)).await;
    let running = Running::start(Worker::new(store.clone(), "w1", vec![h], config()).expect("worker"));
    assert_eq!(started.recv().await, Some(first));

    // The desired state changes during the run: the request must not be lost.
    let again = enqueue(&store, &new_job("cluster_provision", target)).await;
    assert_ne!(again, first);
    gate.add_permits(1);
    assert_eq!(started.recv().await, Some(again));
    gate.add_permits(1);
    until("the second run succeeded", || async { state(&store, again).await == JobState::Succeeded }).await;
    running.stop().await;

    let events = events.lock().expect("lock").clone();
    assert_eq!(events, vec![("start", first), ("end", first), ("start", again), ("end", again)]);
    let (a, b) = (get(&store, first).await, get(&store, again).await);
    assert_eq!(a.state, JobState::Succeeded);
    assert!(b.started_at.expect("started") >= a.finished_at.expect("finished"));
}

#[tokio::test]
async fn shutdown_stops_claiming_and_lets_the_running_job_finish() {
    let (_db, store) = db().await;
    let (started_tx, mut started) = mpsc::unbounded_channel::<JobId>();
    let h = handler("machine_enroll", move |job| {
        let started_tx = started_tx.clone();
        async move {
            let _ = started_tx.send(job.id);
            tokio::time::sleep(Duration::from_millis(300)).await;
            Outcome::Done
        }
    });
    let a = enqueue(&store, &new_job("machine_enroll", Uuid::now_v7())).await;
    let b = enqueue(&store, &new_job("machine_enroll", Uuid::now_v7())).await;
    let cfg = WorkerConfig { concurrency: 1, ..config() };
    let running = Running::start(Worker::new(store.clone(), "w1", vec![h], cfg).expect("worker"));
    let first = started.recv().await.expect("a run started");
    let second = if first == a { b } else { a };

    // `stop` returns once `run` has returned.
    running.stop().await;
    assert_eq!(state(&store, first).await, JobState::Succeeded, "the running job finished");
    let j = get(&store, second).await;
    assert_eq!((j.state, j.locked_by), (JobState::Queued, None), "nothing new was claimed");
}

#[tokio::test]
async fn shutdown_gives_back_a_job_still_running_after_the_grace_period() {
    let (_db, store) = db().await;
    let (started_tx, mut started) = mpsc::unbounded_channel::<JobId>();
    let h = handler("machine_enroll", move |job| {
        let started_tx = started_tx.clone();
        async move {
            let _ = started_tx.send(job.id);
            std::future::pending::<()>().await;
            Outcome::Done
        }
    });
    let id = enqueue(&store, &new_job("machine_enroll", Uuid::now_v7())).await;
    let cfg = WorkerConfig { shutdown_grace: Duration::from_millis(200), ..config() };
    let running = Running::start(Worker::new(store.clone(), "w1", vec![h], cfg).expect("worker"));
    started.recv().await.expect("started");
    let metrics = running.worker.metrics();
    running.stop().await;

    let j = get(&store, id).await;
    assert_eq!(
        (j.state, j.attempts, j.locked_by),
        (JobState::Queued, 0, None),
        "given back without using up an attempt"
    );
    assert_eq!(j.last_error.expect("reason").code, "worker_stopped");
    assert!(j.run_at <= chrono::Utc::now(), "due at once for another worker");
    assert_eq!(metrics.get("machine_enroll", "released"), 1);
}

#[tokio::test]
async fn a_run_whose_lease_is_taken_over_is_dropped() {
    let (_db, store) = db().await;
    let (started_tx, mut started) = mpsc::unbounded_channel::<JobId>();
    let dropped = Arc::new(AtomicUsize::new(0));
    struct OnDrop(Arc<AtomicUsize>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let d = dropped.clone();
    let h = handler("machine_enroll", move |job| {
        let (started_tx, d) = (started_tx.clone(), d.clone());
        async move {
            let _guard = OnDrop(d);
            let _ = started_tx.send(job.id);
            std::future::pending::<()>().await;
            Outcome::Done
        }
    });
    let id = enqueue(&store, &new_job("machine_enroll", Uuid::now_v7())).await;
    let cfg = WorkerConfig { lease: Duration::from_millis(600), ..config() };
    let running = Running::start(Worker::new(store.clone(), "w1", vec![h], cfg).expect("worker"));
    started.recv().await.expect("started");
    // Another worker owns the job now (as after an expiry and a takeover).
    sqlx::query("update jobs set locked_by = 'thief' where id = $1")
        .bind(id.uuid())
        .execute(store.pool())
        .await
        .expect("steal");
    until("the run was dropped", || async { dropped.load(Ordering::SeqCst) == 1 }).await;
    let metrics = running.worker.metrics();
    until("the loss was counted", || async { metrics.get("machine_enroll", "lease_lost") == 1 }).await;
    running.stop().await;
    let j = get(&store, id).await;
    assert_eq!(
        (j.state, j.locked_by.as_deref()),
        (JobState::Running, Some("thief")),
        "the new owner's row is untouched"
    );
}

#[tokio::test]
async fn a_notification_wakes_an_idle_worker_long_before_its_next_poll() {
    let (db, store) = db().await;
    let h = handler("machine_enroll", |_job| async { Outcome::Done });
    let cfg = WorkerConfig { poll_interval: Duration::from_secs(3600), ..config() };
    let running = Running::start(Worker::new(store.clone(), "w1", vec![h], cfg).expect("worker"));
    until("the worker listens", || async {
        let listening: i64 =
            sqlx::query_scalar("select count(*) from pg_stat_activity where datname = $1 and query like 'LISTEN%'")
                .bind(&db.name)
                .fetch_one(store.pool())
                .await
                .expect("pg_stat_activity");
        listening == 1
    })
    .await;
    // The worker has claimed (nothing) and now sleeps for an hour unless notified.
    let id = enqueue(&store, &new_job("machine_enroll", Uuid::now_v7())).await;
    until("the job succeeded", || async { state(&store, id).await == JobState::Succeeded }).await;
    running.stop().await;
}

#[tokio::test]
async fn a_worker_refuses_bad_settings_and_duplicate_kinds() {
    let (_db, store) = db().await;
    let h = || handler("machine_enroll", |_job| async { Outcome::Done });
    let err =
        Worker::new(store.clone(), "w1", vec![h()], WorkerConfig { concurrency: 0, ..config() }).expect_err("zero");
    assert!(matches!(err, WorkerError::Config { setting: "concurrency", .. }), "{err}");
    let err = Worker::new(store.clone(), "w1", vec![h(), h()], config()).expect_err("dup");
    assert!(matches!(err, WorkerError::DuplicateKind("machine_enroll")), "{err}");
    let err =
        Worker::new(store, "w1", vec![h()], WorkerConfig { backoff_cap: Duration::ZERO, ..config() }).expect_err("cap");
    assert!(matches!(err, WorkerError::Config { setting: "backoff_base", .. }), "{err}");
    assert_ne!(paddock_worker::default_worker_id(), paddock_worker::default_worker_id());
}

/// A store-like error with a cause, as a reconciler meets one.
#[derive(Debug, thiserror::Error)]
#[error("reading the machine failed")]
struct Outer(#[source] std::io::Error);

/// Collects what the worker logs, as JSON lines.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn the_end_of_a_failed_run_is_logged_once_with_the_whole_error_chain() {
    let (db, store) = db().await;
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt().json().with_writer(move || writer.clone()).finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let h = handler("machine_enroll", |_job| async {
        let cause = Outer(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset by peer"));
        Outcome::retry_because("database", cause.to_string(), cause)
    });
    let target = Uuid::now_v7();
    let id = enqueue(&store, &new_job("machine_enroll", target)).await;
    let running = Running::start(Worker::new(store.clone(), "w1", vec![h], config()).expect("worker"));
    until("the run ended", || async { db.count("jobs where attempts >= 1").await == 1 }).await;
    running.stop().await;

    let text = String::from_utf8(log.0.lock().expect("log buffer").clone()).expect("utf-8");
    let ends: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["fields"]["outcome"] == "retried" && e["fields"]["job.attempt"] == 1)
        .collect();
    assert_eq!(ends.len(), 1, "one event for the end of the first run (retries may follow):\n{text}");
    let f = &ends[0]["fields"];
    assert_eq!(f["job.id"], id.to_string(), "{f}");
    assert_eq!(f["job.kind"], "machine_enroll", "{f}");
    assert_eq!(f["target.id"], target.to_string(), "{f}");
    assert_eq!(f["job.attempt"], 1, "{f}");
    assert_eq!(f["code"], "database", "{f}");
    assert_eq!(f["reason"], "reading the machine failed", "the short public message: {f}");
    assert_eq!(f["error.chain"], "reading the machine failed: connection reset by peer", "the whole chain: {f}");
    let stored: String = sqlx::query_scalar("select last_error->>'message' from jobs where id = $1")
        .bind(id.uuid())
        .fetch_one(&db.pool)
        .await
        .expect("job");
    assert_eq!(stored, "reading the machine failed", "the job keeps only the short message");
}

#[tokio::test]
async fn a_tenant_whose_jobs_hang_holds_only_its_slots_and_other_tenants_jobs_still_run() {
    let (db, store) = db().await;
    let (stuck, other) = (Uuid::now_v7(), Uuid::now_v7());
    // The stuck tenant's jobs never end (a tenant API server that does not answer); the others'
    // end at once.
    let h = handler("cluster_reconcile", move |job| async move {
        if job.tenant_id.map(|t| t.0) == Some(stuck) {
            std::future::pending::<()>().await;
        }
        Outcome::Done
    });
    // Its backlog is older than the other tenant's jobs and larger than the worker.
    let enqueue_for = async |tenant: Uuid| {
        let tenant_id = Some(paddock_types::TenantId(tenant));
        enqueue(&store, &NewJob { tenant_id, ..new_job("cluster_reconcile", Uuid::now_v7()) }).await
    };
    for _ in 0..8 {
        enqueue_for(stuck).await;
    }
    let mut others = Vec::new();
    for _ in 0..5 {
        others.push(enqueue_for(other).await);
    }
    let fleet = enqueue(&store, &new_job("cluster_reconcile", Uuid::now_v7())).await;
    let cfg = WorkerConfig { concurrency: 4, tenant_slots: 2, shutdown_grace: Duration::from_millis(200), ..config() };
    let running = Running::start(Worker::new(store.clone(), "w1", vec![h], cfg).expect("worker"));

    until("the other tenant's and the fleet's jobs succeeded", || async {
        db.count("jobs where state = 'succeeded'").await == 6
    })
    .await;
    for id in others.into_iter().chain([fleet]) {
        assert_eq!(state(&store, id).await, JobState::Succeeded);
    }
    let stuck_running = format!("jobs where state = 'running' and tenant_id = '{stuck}'");
    assert_eq!(db.count(&stuck_running).await, 2, "the stuck tenant holds its two slots, no more");
    running.stop().await;
}
