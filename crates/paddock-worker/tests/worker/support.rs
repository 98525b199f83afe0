//! Fixtures shared by the tests.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use paddock_store::job::{self, Job, NewJob};
use paddock_store::operation::{self, NewOperation};
use paddock_store::Store;
use paddock_testkit::TestDb;
use paddock_types::operation::OperationView;
use paddock_types::{JobId, OperationId};
use paddock_worker::{JobHandler, Outcome, Worker, WorkerConfig};
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

/// Everything logged in this test binary, kept so that a test can scan it for secrets.
static LOGGED: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

/// A log writer into [`LOGGED`] and the test output.
struct Tee;

impl std::io::Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGGED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend_from_slice(buf);
        // Captured by the test harness, like `with_test_writer`: shown only for a failing test.
        print!("{}", String::from_utf8_lossy(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Logs paddock's crates at debug (or what `RUST_LOG` says) to the test output and to a buffer
/// [`logged`] returns.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "warn,paddock_worker=debug,paddock_service=debug,paddock_api=debug,paddock_redfish=debug,paddock_store=debug",
        )
    });
    let _ = tracing_subscriber::fmt().with_writer(|| Tee).with_env_filter(filter).try_init();
}

/// Everything logged so far in this test binary.
pub fn logged() -> String {
    String::from_utf8_lossy(&LOGGED.lock().unwrap_or_else(std::sync::PoisonError::into_inner)).into_owned()
}

/// A fresh database and a store over it.
pub async fn db() -> (TestDb, Store) {
    init_tracing();
    let db = TestDb::new().await;
    let store = Store::from_pool(db.pool.clone());
    (db, store)
}

/// A store with its own pool, as another worker process would have.
pub async fn own_store(db: &TestDb, connections: u32) -> Store {
    let pool = PgPoolOptions::new().max_connections(connections).connect(&db.url).await.expect("connect");
    Store::from_pool(pool)
}

/// A job of `kind` on `target`, due now, with no operation.
pub fn new_job(kind: &'static str, target: Uuid) -> NewJob<'static> {
    NewJob {
        kind,
        target_type: "machine",
        target_id: target,
        payload: serde_json::json!({ "machine_id": target }),
        tenant_id: None,
        operation_id: None,
        run_at: None,
    }
}

/// Enqueues in a transaction of its own.
pub async fn enqueue(store: &Store, new: &NewJob<'_>) -> JobId {
    let mut tx = store.begin().await.expect("begin");
    let id = job::enqueue(&mut tx, new).await.expect("enqueue");
    tx.commit().await.expect("commit");
    id
}

/// A pending operation on `target`.
pub async fn operation(store: &Store, kind: &str, target: Uuid) -> OperationId {
    let mut conn = store.conn().await.expect("conn");
    let new = NewOperation {
        kind,
        target_type: "machine",
        target_id: target,
        tenant_id: None,
        target_generation: 1,
        supersedes: &[],
        context: Default::default(),
    };
    operation::insert(&mut conn, &new).await.expect("operation").id
}

/// An operation as the API would show it.
pub async fn op(store: &Store, id: OperationId) -> OperationView {
    let mut conn = store.conn().await.expect("conn");
    operation::get(&mut conn, None, id).await.expect("get operation").expect("operation exists")
}

/// A job as stored.
pub async fn get(store: &Store, id: JobId) -> Job {
    let mut conn = store.conn().await.expect("conn");
    job::get(&mut conn, id).await.expect("get job").expect("job exists")
}

/// Claims for `worker`.
pub async fn claim(store: &Store, worker: &str, kinds: &[&str], lease: Duration, limit: u32) -> Vec<Job> {
    claim_within(store, worker, kinds, lease, limit, u32::MAX).await
}

/// Claims like [`claim`], with at most `tenant_slots` running jobs of one tenant on `worker`.
pub async fn claim_within(
    store: &Store,
    worker: &str,
    kinds: &[&str],
    lease: Duration,
    limit: u32,
    tenant_slots: u32,
) -> Vec<Job> {
    let mut conn = store.conn().await.expect("conn");
    job::claim(&mut conn, worker, kinds, lease, limit, tenant_slots).await.expect("claim").jobs
}

/// Ends the lease of a running job now, as if its worker had died `lease` ago.
pub async fn expire_lease(store: &Store, id: JobId) {
    sqlx::query("update jobs set locked_until = now() - interval '1 second' where id = $1 and state = 'running'")
        .bind(id.uuid())
        .execute(store.pool())
        .await
        .expect("expire lease");
}

/// Makes a queued job due now (skips its backoff).
pub async fn make_due(store: &Store, id: JobId) {
    sqlx::query("update jobs set run_at = now() where id = $1 and state = 'queued'")
        .bind(id.uuid())
        .execute(store.pool())
        .await
        .expect("make due");
}

/// A handler from a closure.
pub struct FnHandler<F> {
    kind: &'static str,
    run: F,
}

impl<F, Fut> JobHandler for FnHandler<F>
where
    F: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn run<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        Box::pin((self.run)(job.clone()))
    }
}

/// A handler of `kind` running `run`.
pub fn handler<F, Fut>(kind: &'static str, run: F) -> Arc<dyn JobHandler>
where
    F: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    Arc::new(FnHandler { kind, run })
}

/// Settings for tests: short leases and backoffs, quick polling.
pub fn config() -> WorkerConfig {
    WorkerConfig {
        concurrency: 4,
        tenant_slots: 4,
        lease: Duration::from_secs(5),
        poll_interval: Duration::from_millis(50),
        max_attempts: 5,
        backoff_base: Duration::from_millis(10),
        backoff_cap: Duration::from_millis(40),
        shutdown_grace: Duration::from_secs(10),
        listen: true,
    }
}

/// A running worker and the means to stop it.
pub struct Running {
    pub worker: Worker,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Starts `worker` in a task.
    pub fn start(worker: Worker) -> Running {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let w = worker.clone();
        let task = tokio::spawn(async move {
            w.run(async {
                let _ = stopped.await;
            })
            .await;
        });
        Running { worker, stop, task }
    }

    /// Signals shutdown and waits until `run` returns.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.expect("worker task");
    }
}

/// Polls `check` until it holds (deadline 30 s).
pub async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if check().await {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The state of a job, as stored.
pub async fn state(store: &Store, id: JobId) -> job::JobState {
    get(store, id).await.state
}
