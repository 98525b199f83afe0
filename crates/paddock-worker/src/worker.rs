//! The claim loop, the runs with their lease watchdogs, and the graceful stop.
//!
//! One loop per worker claims jobs while it has free slots and otherwise sleeps until a run ends,
//! a `paddock_jobs` notification arrives, or the poll interval passes. Each run is a task: the
//! handler's future races a lease watchdog (which renews the lease every third of its length and
//! declares it lost when a renewal is refused or cannot be made before the lease would end) and
//! the forced stop of a shutdown.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use paddock_store::job::{self, Job, JobError, JobListener, Requeue, RetryPolicy, NOTIFY_CHANNEL};
use paddock_store::{Store, StoreError};
use sqlx::pool::PoolConnection;
use sqlx::Postgres;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, error, info, info_span, warn, Instrument};

use crate::metrics::{self, WorkerMetrics};
use crate::{Cause, JobHandler, Outcome};

/// Settings of a [`Worker`].
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Jobs run at once by this worker. Its store's pool needs about `concurrency + 2`
    /// connections (runs, the claim, the `LISTEN` connection).
    pub concurrency: usize,
    /// Of those, how many one tenant's jobs may hold at once (its clusters' and its machines'
    /// jobs): a tenant whose cluster answers slowly stalls at most this many slots, and the rest
    /// stay for other tenants and the fleet's own jobs. At least 1.
    pub tenant_slots: usize,
    /// Length of a lease; renewed every third of it while a job runs. A crashed worker's jobs are
    /// taken over this long after its last renewal.
    pub lease: Duration,
    /// How often an idle worker looks for due jobs (the fallback of notifications, and the way
    /// jobs whose `run_at` comes due are found).
    pub poll_interval: Duration,
    /// Failed attempts after which a job fails.
    pub max_attempts: u32,
    /// Retry delay after the first failure (doubled per failure, with jitter).
    pub backoff_base: Duration,
    /// Largest retry delay.
    pub backoff_cap: Duration,
    /// On shutdown, how long running jobs may take to finish before they are given back to the
    /// queue (without using up an attempt).
    pub shutdown_grace: Duration,
    /// Wake on `paddock_jobs` notifications (`LISTEN`); without it the worker only polls.
    pub listen: bool,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            concurrency: 8,
            tenant_slots: 4,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            max_attempts: 10,
            backoff_base: Duration::from_secs(2),
            backoff_cap: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(30),
            listen: true,
        }
    }
}

/// A worker that cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A setting is out of range.
    #[error("invalid worker setting {setting}: {reason}")]
    Config {
        /// The setting.
        setting: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Two handlers claim the same job kind.
    #[error("two handlers for job kind {0}")]
    DuplicateKind(&'static str),
}

/// A unique worker id for this process: `worker-<pid>-<random>`. Leases are held by worker id,
/// so two live workers must never share one.
pub fn default_worker_id() -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("worker-{}-{}", std::process::id(), &random[..8])
}

/// Claims and runs jobs until told to stop. Cheap to clone.
#[derive(Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("id", &self.inner.id).field("kinds", &self.inner.kinds).finish()
    }
}

struct Inner {
    store: Store,
    id: String,
    handlers: HashMap<&'static str, Arc<dyn JobHandler>>,
    kinds: Vec<&'static str>,
    config: WorkerConfig,
    policy: RetryPolicy,
    metrics: Arc<WorkerMetrics>,
    /// Whether the jobs table's statistics were checked (see [`Inner::measure_queue`]).
    measured: AtomicBool,
}

impl Worker {
    /// A worker named `worker_id` (unique among live workers: see [`default_worker_id`]) running
    /// the kinds of `handlers`.
    pub fn new(
        store: Store,
        worker_id: impl Into<String>,
        handlers: Vec<Arc<dyn JobHandler>>,
        config: WorkerConfig,
    ) -> Result<Self, WorkerError> {
        let invalid = |setting, reason| Err(WorkerError::Config { setting, reason });
        if config.concurrency == 0 {
            return invalid("concurrency", "must be at least 1");
        }
        if config.tenant_slots == 0 {
            return invalid("tenant_slots", "must be at least 1");
        }
        if config.lease < Duration::from_millis(300) {
            return invalid("lease", "must be at least 300 ms");
        }
        if config.poll_interval.is_zero() {
            return invalid("poll_interval", "must be positive");
        }
        if config.max_attempts == 0 {
            return invalid("max_attempts", "must be at least 1");
        }
        if config.backoff_base.is_zero() || config.backoff_cap < config.backoff_base {
            return invalid("backoff_base", "must be positive and at most backoff_cap");
        }
        let id = worker_id.into();
        if id.is_empty() {
            return invalid("worker_id", "must not be empty");
        }
        let mut by_kind = HashMap::new();
        for handler in handlers {
            let kind = handler.kind();
            if by_kind.insert(kind, handler).is_some() {
                return Err(WorkerError::DuplicateKind(kind));
            }
        }
        let mut kinds: Vec<&'static str> = by_kind.keys().copied().collect();
        kinds.sort_unstable();
        let policy =
            RetryPolicy { max_attempts: config.max_attempts, base: config.backoff_base, cap: config.backoff_cap };
        let metrics = Arc::new(WorkerMetrics::new(&kinds));
        let measured = AtomicBool::new(false);
        Ok(Self { inner: Arc::new(Inner { store, id, handlers: by_kind, kinds, config, policy, metrics, measured }) })
    }

    /// The worker id written to `locked_by`.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The metrics of this worker: its job outcomes, and what its handlers observe.
    pub fn metrics(&self) -> Arc<WorkerMetrics> {
        self.inner.metrics.clone()
    }

    /// Claims and runs jobs until `shutdown` completes; then stops claiming, lets running jobs
    /// finish for up to [`WorkerConfig::shutdown_grace`], gives the rest back to the queue and
    /// returns. Database outages are logged and waited out, never returned.
    pub async fn run(&self, shutdown: impl Future<Output = ()> + Send) {
        let inner = &self.inner;
        let concurrency = inner.config.concurrency;
        tokio::pin!(shutdown);
        let wake = Arc::new(Notify::new());
        let listener = inner.config.listen.then(|| tokio::spawn(listen(inner.clone(), wake.clone())));
        // Flipped when the grace period ends: runs still going give their job back.
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut runs = JoinSet::new();
        let mut claim_conn = None;
        let mut failures: u32 = 0;
        // When the next queued job this worker knows of comes due, and whether there is reason
        // to claim: a job may be due (a notification, a deadline reached, a run that gave its
        // job back due now) or waiting for a slot (the last claim filled every free one). A
        // run's end alone is no reason: an idle worker's claims are its poll and its deadlines.
        let mut due_at: Option<Instant> = None;
        let mut claim = true;
        let mut full = false;
        info!(worker.id = %inner.id, kinds = ?inner.kinds, "worker {} started for {:?}", inner.id, inner.kinds);
        loop {
            // Reap every run that already ended, so a burst of short jobs is claimed as one batch.
            while let Some(ended) = runs.try_join_next() {
                claim |= rearm(ended, &mut due_at, full);
            }
            let free = concurrency.saturating_sub(runs.len());
            if free > 0 && claim {
                claim = false;
                match inner.claim(&mut claim_conn, free).await {
                    Ok((claimed_at, jobs, due_in)) => {
                        due_at = due_in.map(|d| Instant::now() + d);
                        full = jobs.len() >= free;
                        if failures > 0 {
                            info!(worker.id = %inner.id, "the job queue is reachable again");
                        }
                        failures = 0;
                        for job in jobs {
                            runs.spawn(run_one(inner.clone(), job, claimed_at, stop_rx.clone()));
                        }
                    }
                    Err(e) => {
                        // Logged once per outage, then quietly retried with backoff.
                        if failures == 0 {
                            warn!(worker.id = %inner.id, error = &e as &dyn std::error::Error, "claiming jobs failed: {}", paddock_domain::error::chain(&e));
                        }
                        failures = failures.saturating_add(1);
                    }
                }
            }
            let pause = if failures > 0 {
                inner.config.poll_interval.max(Duration::from_millis(100 << failures.min(6)))
            } else {
                let due = due_at.map(|at| at.saturating_duration_since(Instant::now()));
                due.map_or(inner.config.poll_interval, |due| due.min(inner.config.poll_interval))
            };
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(ended) = runs.join_next(), if !runs.is_empty() => claim |= rearm(ended, &mut due_at, full),
                () = wake.notified(), if failures == 0 => claim = true,
                () = tokio::time::sleep(pause) => claim = true,
            }
        }

        // Back to the pool: the runs may need it to record their ends.
        drop(claim_conn);
        if let Some(listener) = listener {
            listener.abort();
        }
        drain(inner, runs, &stop_tx).await;
        info!(worker.id = %inner.id, "worker {} stopped", inner.id);
    }
}

/// The shutdown: no new claims; the running jobs get [`WorkerConfig::shutdown_grace`] to end,
/// then those still going are told to give their job back, and are waited for.
async fn drain(inner: &Inner, mut runs: JoinSet<Again>, stop_tx: &watch::Sender<bool>) {
    let grace = inner.config.shutdown_grace;
    info!(worker.id = %inner.id, running = runs.len(), "worker {} stopping: no new claims, waiting up to {grace:?} for {} running jobs", inner.id, runs.len());
    let deadline = tokio::time::sleep(grace);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            ended = runs.join_next() => match ended {
                Some(ended) => {
                    report_panic(ended);
                }
                None => break,
            },
            () = &mut deadline => {
                warn!(worker.id = %inner.id, running = runs.len(), "grace period over: giving {} running jobs back to the queue", runs.len());
                let _ = stop_tx.send(true);
                while let Some(ended) = runs.join_next().await {
                    report_panic(ended);
                }
                break;
            }
        }
    }
}

/// A run's task only ends by panicking when the worker itself has a bug (handler panics are
/// caught in `run_one`); the job's lease then expires and another worker takes it over.
fn report_panic(ended: Result<Again, tokio::task::JoinError>) -> Again {
    ended.unwrap_or_else(|e| {
        error!(error = &e as &dyn std::error::Error, "a job run's task failed: {e}");
        // Its job is still leased: it runs again once the lease expires, which a claim finds.
        Again::Now
    })
}

/// Whether the worker should claim after a run ended (`full`: the last claim filled every free
/// slot, so a freed one may have a due job waiting); a job given back for later moves `due_at`.
fn rearm(ended: Result<Again, tokio::task::JoinError>, due_at: &mut Option<Instant>, full: bool) -> bool {
    match report_panic(ended) {
        Again::Now => true,
        Again::After(after) => {
            let at = Instant::now() + after;
            *due_at = Some(due_at.map_or(at, |due| due.min(at)));
            full || after.is_zero()
        }
        Again::Never => full,
    }
}

/// When a run's job is due again, as far as this worker can tell without asking the queue.
#[derive(Debug, Clone, Copy)]
enum Again {
    /// Unknown (a retry's backoff is the store's, a failed write back): claim to find out.
    Now,
    /// Queued again to run this much later (a wait).
    After(Duration),
    /// Not by this run: it ended, was handed over (the follow-up's enqueue notified), or its
    /// lease was lost.
    Never,
}

impl Inner {
    /// Claims up to `limit` jobs on the loop's own connection (kept between claims: taking one
    /// from the pool each time costs a health-check round trip; dropped on any error, so a broken
    /// one is replaced). Also returns when the claim was sent, the latest instant the leases can
    /// have started (the watchdogs count from there).
    async fn claim(
        &self,
        conn: &mut Option<PoolConnection<Postgres>>,
        limit: usize,
    ) -> Result<(Instant, Vec<Job>, Option<Duration>), StoreError> {
        let c = match conn {
            Some(c) => c,
            None => conn.insert(self.store.conn().await?),
        };
        let limit = u32::try_from(limit).unwrap_or(u32::MAX);
        let sent = Instant::now();
        let slots = u32::try_from(self.config.tenant_slots).unwrap_or(u32::MAX);
        match job::claim(c, &self.id, &self.kinds, self.config.lease, limit, slots).await {
            // With room left, sleep no longer than until the next queued job this worker may take
            // comes due: a job waiting a fraction of the poll interval runs on time.
            Ok(claimed) => {
                let full = claimed.jobs.len() >= limit as usize;
                if full {
                    self.measure_queue(c).await;
                }
                let next = claimed.next_due_in.filter(|_| !full);
                Ok((sent, claimed.jobs, next))
            }
            Err(e) => {
                *conn = None;
                Err(e)
            }
        }
    }

    /// The first time a claim fills every free slot (a backlog), makes sure the jobs table has
    /// statistics: without them each claim reads the whole backlog ([`job::ensure_statistics`]).
    /// Checked once per process, whatever the outcome: statistics once present stay (autovacuum
    /// keeps them fresh), and a failure (say the role may not analyze the table) is logged and
    /// not retried, as the claim stays correct, only slower until autovacuum analyzes the table.
    async fn measure_queue(&self, conn: &mut PoolConnection<Postgres>) {
        if self.measured.load(Ordering::Relaxed) {
            return;
        }
        self.measured.store(true, Ordering::Relaxed);
        match job::ensure_statistics(conn).await {
            Ok(true) => info!(worker.id = %self.id, "analyzed the jobs table, which had no statistics yet"),
            Ok(false) => {}
            Err(e) => {
                warn!(worker.id = %self.id, error = &e as &dyn std::error::Error, "analyzing the jobs table failed: {}", paddock_domain::error::chain(&e))
            }
        }
    }
}

/// Listens on `paddock_jobs` and wakes the claim loop for the kinds this worker runs. After a
/// (re)connection it wakes it anyway: notifications sent meanwhile are lost.
async fn listen(inner: Arc<Inner>, wake: Arc<Notify>) {
    // Consecutive failed (re)connections: the pause before the next one grows with them, and only
    // the first of an outage is logged as a warning.
    let mut failures: u32 = 0;
    loop {
        if failures > 0 {
            tokio::time::sleep(Duration::from_millis(100 << failures.min(7))).await;
        }
        let mut listener = match JobListener::connect(&inner.store).await {
            Ok(listener) => listener,
            Err(e) => {
                if failures == 0 {
                    warn!(worker.id = %inner.id, error = &e as &dyn std::error::Error, "LISTEN {NOTIFY_CHANNEL} failed, polling only until it works: {}", paddock_domain::error::chain(&e));
                }
                failures = failures.saturating_add(1);
                continue;
            }
        };
        failures = 0;
        wake.notify_one();
        let lost = loop {
            match listener.next_kind().await {
                Ok(Some(kind)) => {
                    if inner.handlers.contains_key(kind.as_str()) {
                        wake.notify_one();
                    }
                }
                // The connection dropped and sqlx reconnects; whatever was sent meanwhile is lost.
                Ok(None) => wake.notify_one(),
                Err(e) => break e,
            }
        };
        debug!(worker.id = %inner.id, error = &lost as &dyn std::error::Error, "LISTEN connection lost, reconnecting: {}", paddock_domain::error::chain(&lost));
        // Pause before reconnecting, but warn if that fails too: it is a new outage.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How a run ended, before it is written back.
enum Ended {
    Outcome(Outcome),
    LeaseLost,
    Stopped,
}

/// Runs one claimed job: the handler against the lease watchdog and the forced stop, then writes
/// the outcome back.
async fn run_one(inner: Arc<Inner>, job: Job, claimed_at: Instant, mut stop: watch::Receiver<bool>) -> Again {
    let span = info_span!("job", job.id = %job.id, job.kind = %job.kind, job.attempt = job.attempts + 1, target.id = %job.target_id);
    async move {
        let started = Instant::now();
        inner.metrics.add(&job.kind, "claimed");
        // The claim that took over an expired lease wrote `lease_expired` at the same `now()`
        // as `started_at`.
        let taken_over =
            job.last_error.as_ref().is_some_and(|e| e.code == "lease_expired" && Some(e.at) == job.started_at);
        if taken_over {
            inner.metrics.add(&job.kind, "reclaimed");
            warn!(job.id = %job.id, job.kind = %job.kind, "took over job {} {} after its worker's lease expired", job.kind, job.id);
        }
        // A job that keeps killing its workers (each takeover counts as a failed attempt) is failed
        // rather than run again.
        if job.attempts >= inner.config.max_attempts {
            let last = job.last_error.as_ref().map_or_else(
                || JobError::new("lease_expired", "its worker stopped renewing the lease"),
                |e| JobError::new(e.code.clone(), e.message.clone()),
            );
            let problem = job::retries_exhausted(&job, &last);
            let written = persist(&inner, &job, &Write::Fail(&problem)).await;
            let ended = Ended::Outcome(Outcome::Fail { problem });
            finish_log(&inner, &job, started, &ended, written.map(|w| w.label("exhausted")));
            return Again::Never;
        }
        let Some(handler) = inner.handlers.get(job.kind.as_str()).cloned() else {
            // Unreachable: the claim asks only for kinds with a handler.
            error!(job.id = %job.id, job.kind = %job.kind, "no handler for job kind {}", job.kind);
            return Again::Never;
        };

        let (lost_tx, mut lost_rx) = watch::channel(false);
        let watchdog = tokio::spawn(watchdog(inner.clone(), job.id, claimed_at, lost_tx));
        let ended = {
            // A panicking handler is a transient failure of this attempt, not of the worker. What
            // the handler observes goes to this worker's metrics.
            let run = AssertUnwindSafe(metrics::scope(inner.metrics.clone(), handler.run(&job))).catch_unwind();
            tokio::select! {
                outcome = run => Ended::Outcome(outcome.unwrap_or_else(|_| {
                    Outcome::retry("handler_panicked", "the job handler panicked")
                })),
                Ok(_) = lost_rx.wait_for(|lost| *lost) => Ended::LeaseLost,
                Ok(_) = stop.wait_for(|stop| *stop) => Ended::Stopped,
            }
        };
        watchdog.abort();

        let written = write_back(&inner, &job, &ended).await;
        // The labels are `write_back`'s (`Written::label`): a job handed over, lost or failed is not
        // this run's to bring back.
        let again = match (&ended, &written) {
            (_, Err(_)) => Again::Now,
            (_, Ok("handed_over" | "lease_lost" | "exhausted")) => Again::Never,
            (Ended::Outcome(Outcome::Wait { after, .. }), _) => Again::After(*after),
            (Ended::Stopped, _) => Again::After(Duration::ZERO),
            (Ended::Outcome(Outcome::Retry { .. }), _) => Again::Now,
            _ => Again::Never,
        };
        finish_log(&inner, &job, started, &ended, written);
        again
    }
    .instrument(span)
    .await
}

/// The end of a run, to be written back.
enum Write<'a> {
    Complete,
    Fail(&'a paddock_types::problem::Problem),
    Retry(&'a JobError),
    Wait(&'a JobError, Duration),
}

/// What the store said.
enum Written {
    /// `complete` / `fail`: whether the lease was still held.
    Held(bool),
    /// `retry` / `wait`.
    Requeue(Requeue),
}

impl Written {
    /// The metric label: `ok` when it went as asked.
    fn label(&self, ok: &'static str) -> &'static str {
        match self {
            Written::Held(true) | Written::Requeue(Requeue::Queued { .. }) => ok,
            Written::Held(false) | Written::Requeue(Requeue::LeaseLost) => "lease_lost",
            Written::Requeue(Requeue::Failed { .. }) => "exhausted",
            Written::Requeue(Requeue::HandedOver { .. }) => "handed_over",
        }
    }
}

/// Writes a run's end, retrying a few times while the database is unreachable (the lease still
/// protects the job meanwhile; if every try fails, the lease expires and the job runs again).
async fn persist(inner: &Inner, job: &Job, write: &Write<'_>) -> Result<Written, StoreError> {
    let mut delay = Duration::from_millis(100);
    let mut turn = 0;
    loop {
        turn += 1;
        let result = async {
            let (store, id, worker) = (&inner.store, job.id, inner.id.as_str());
            Ok::<_, StoreError>(match write {
                Write::Complete => Written::Held(job::complete(store, id, worker).await?),
                Write::Fail(problem) => Written::Held(job::fail(store, id, worker, problem).await?),
                Write::Retry(e) => Written::Requeue(job::retry(store, id, worker, e, &inner.policy).await?),
                Write::Wait(reason, after) => Written::Requeue(job::wait(store, id, worker, reason, *after).await?),
            })
        }
        .await;
        match result {
            Err(e @ StoreError::Unavailable(_)) if turn < 4 => {
                debug!(job.id = %job.id, error = &e as &dyn std::error::Error, "recording the end of job {} failed, retrying: {e}", job.id);
                tokio::time::sleep(delay).await;
                delay *= 4;
            }
            other => return other,
        }
    }
}

/// Writes how a run ended back to the queue.
async fn write_back(inner: &Inner, job: &Job, ended: &Ended) -> Result<&'static str, StoreError> {
    Ok(match ended {
        Ended::LeaseLost => "lease_lost",
        Ended::Stopped => {
            // Given back at once, without using up an attempt: the next run starts from the top.
            let reason = JobError::new("worker_stopped", format!("worker {} stopped during the run", inner.id));
            persist(inner, job, &Write::Wait(&reason, Duration::ZERO)).await?.label("released")
        }
        Ended::Outcome(Outcome::Done) => persist(inner, job, &Write::Complete).await?.label("succeeded"),
        Ended::Outcome(Outcome::Wait { after, reason, .. }) => {
            persist(inner, job, &Write::Wait(reason, *after)).await?.label("waited")
        }
        Ended::Outcome(Outcome::Retry { error, .. }) => {
            persist(inner, job, &Write::Retry(error)).await?.label("retried")
        }
        Ended::Outcome(Outcome::Fail { problem }) => persist(inner, job, &Write::Fail(problem)).await?.label("failed"),
    })
}

/// What a run's end says about why: the recorded code and message, and the error behind them.
fn reason(ended: &Ended) -> (Option<&str>, Option<&str>, Option<&Cause>) {
    match ended {
        Ended::Outcome(Outcome::Wait { reason: e, cause, .. } | Outcome::Retry { error: e, cause }) => {
            (Some(e.code.as_str()), Some(e.message.as_str()), cause.as_ref())
        }
        Ended::Outcome(Outcome::Fail { problem }) => (Some(problem.code.as_str()), Some(problem.detail.as_str()), None),
        Ended::Outcome(Outcome::Done) | Ended::LeaseLost | Ended::Stopped => (None, None, None),
    }
}

/// The code of the error a run ended with: a retry, a failure, or a wait because of an error (a
/// driver's outage); not a wait for progress.
fn error_code(ended: &Ended) -> Option<&str> {
    match ended {
        Ended::Outcome(Outcome::Retry { error, .. }) => Some(error.code.as_str()),
        Ended::Outcome(Outcome::Wait { reason, cause: Some(_), .. }) => Some(reason.code.as_str()),
        Ended::Outcome(Outcome::Fail { problem }) => Some(problem.code.as_str()),
        _ => None,
    }
}

/// Counts how a run ended and logs it: one event per run, with the job, its target and attempt,
/// the outcome, the duration, and the whole chain of the error behind it (the one place a job's
/// failure is logged).
fn finish_log(inner: &Inner, job: &Job, started: Instant, ended: &Ended, written: Result<&'static str, StoreError>) {
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let (code, message, cause) = reason(ended);
    let chain = cause.map(|c| paddock_domain::error::chain(c.as_ref()));
    inner.metrics.observe(&job.kind, started.elapsed(), error_code(ended));
    let outcome = match &written {
        Ok(outcome) => {
            inner.metrics.add(&job.kind, outcome);
            *outcome
        }
        Err(_) => "unrecorded",
    };
    macro_rules! event {
        ($level:ident, $($text:tt)+) => {
            $level!(
                job.id = %job.id, job.kind = %job.kind, target.type = %job.target_type, target.id = %job.target_id,
                job.attempt = job.attempts + 1, outcome, duration_ms, code, reason = message, error.chain = chain.as_deref(),
                $($text)+
            )
        };
    }
    match (outcome, &written) {
        (_, Err(e)) => event!(
            error,
            store.error = paddock_domain::error::chain(e).as_str(),
            "could not record the end of job {} {}; it runs again after its lease expires",
            job.kind,
            job.id
        ),
        ("succeeded" | "handed_over" | "released", _) => {
            event!(info, "job {} {} {outcome} after {duration_ms} ms", job.kind, job.id)
        }
        ("waited", _) => event!(debug, "job {} {} waits: {}", job.kind, job.id, message.unwrap_or_default()),
        ("exhausted", _) => event!(error, "job {} {} gave up after {} attempts", job.kind, job.id, job.attempts + 1),
        ("lease_lost", _) => event!(
            warn,
            "lost the lease of job {} {}: its run was dropped, another worker owns it now",
            job.kind,
            job.id
        ),
        _ => event!(
            warn,
            "job {} {} {outcome} after {duration_ms} ms: {}",
            job.kind,
            job.id,
            message.unwrap_or_default()
        ),
    }
}

/// Renews the lease every third of its length; sets `lost` when the worker no longer holds it or
/// could not renew it in time. The local deadline (send time of the last successful renewal plus
/// the lease) never ends after the lease in the database, which starts later, at the server's
/// `now()`: the run is dropped before anyone else can take the job over.
async fn watchdog(inner: Arc<Inner>, id: paddock_types::JobId, claimed_at: Instant, lost: watch::Sender<bool>) {
    let lease = inner.config.lease;
    let every = lease / 3;
    let mut deadline = claimed_at + lease;
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = tokio::time::sleep_until(deadline) => break,
        }
        let sent = Instant::now();
        let renewal = async {
            let mut conn = inner.store.conn().await?;
            job::heartbeat(&mut conn, id, &inner.id, lease).await
        };
        match tokio::time::timeout_at(deadline, renewal).await {
            Ok(Ok(true)) => deadline = sent + lease,
            Ok(Ok(false)) => break,
            Ok(Err(e)) => {
                warn!(job.id = %id, error = &e as &dyn std::error::Error, "renewing the lease of job {id} failed: {}", paddock_domain::error::chain(&e));
            }
            Err(_elapsed) => break,
        }
    }
    let _ = lost.send(true);
}
