//! The worker: runs the jobs of the durable queue (`paddock_store::job`).
//!
//! A [`Worker`] claims due jobs of the kinds it has [`JobHandler`]s for, up to
//! [`WorkerConfig::concurrency`] at a time, each under a lease that a heartbeat renews while the
//! handler runs. What the handler returns ([`Outcome`]) is written back guarded on the lease, in
//! the same statement as the linked operation's state. Any number of workers, in any number of
//! processes, may run against one database: `for update skip locked` hands each job to one of
//! them, and the schema keeps at most one job per target running.
//!
//! Crash safety comes from the handlers, not from here: a job runs *at least* once. A worker that
//! dies mid-run leaves its lease to expire, and another worker runs the job again from the top;
//! a worker that loses its lease (a long network partition) drops the run at the latest when the
//! lease would have ended, before anyone else can take it over. Handlers therefore follow
//! STYLE.md section 5: re-read desired state, check each step's postcondition, name external
//! objects from ids, guard status writes.
//!
//! Idle cost is one indexed query per [`WorkerConfig::poll_interval`]; enqueues wake idle workers
//! at once through `LISTEN paddock_jobs`.

mod metrics;
pub mod reconcile;
pub mod webhook;
mod worker;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
pub use metrics::{OutcomeCount, WorkerMetrics};
pub use paddock_store::job::{Job, JobError};
use paddock_types::problem::{Problem, OPERATION_FAILED};
pub use worker::{default_worker_id, Worker, WorkerConfig, WorkerError};

/// Carries out the jobs of one kind.
///
/// `run` is called once per claim and may be called again for the same job (after a crash, a lost
/// lease or a retry), so it must be idempotent and start from the top. Its future may be dropped
/// at an `.await` when the lease is lost or a shutdown's grace period ends: treat every await
/// point as a possible crash point. It must not block the thread.
pub trait JobHandler: Send + Sync + 'static {
    /// The job kind, stable snake_case (`machine_enroll`).
    fn kind(&self) -> &'static str;

    /// Runs the job once and says how it ended.
    fn run<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome>;
}

/// The error behind a retry or a wait, kept whole so that the worker logs its chain once, where
/// the run ends. Never shown to users: they see the [`JobError`]'s short message.
pub type Cause = Arc<dyn std::error::Error + Send + Sync>;

/// How a run ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The target converged: the job succeeds, and its operation with it.
    Done,
    /// Not ready yet (a BMC still booting, no free machines): run again after `after`, without
    /// using up an attempt. The operation stays running.
    Wait {
        /// Delay before the next run.
        after: Duration,
        /// Why, recorded as the job's `last_error`.
        reason: JobError,
        /// The error behind it, if any (logged with its chain, never stored).
        cause: Option<Cause>,
    },
    /// A transient failure: run again after the backoff; after the worker's `max_attempts` the
    /// job and its operation fail with a `retries-exhausted` problem.
    Retry {
        /// What went wrong; its message may end up in the operation's problem.
        error: JobError,
        /// The error behind it, if any (logged with its chain, never stored).
        cause: Option<Cause>,
    },
    /// A permanent failure: the job and its operation fail with `problem`.
    Fail {
        /// The operation's error (`instance` and `request_id` are filled in by the store).
        problem: Problem,
    },
}

impl Outcome {
    /// [`Outcome::Wait`] with a reason code and message.
    pub fn wait(after: Duration, code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Wait { after, reason: JobError::new(code, message), cause: None }
    }

    /// [`Outcome::Retry`] with an error code and message.
    pub fn retry(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Retry { error: JobError::new(code, message), cause: None }
    }

    /// [`Outcome::Retry`] for a failed call: `message` is the short public text, `cause` the
    /// error itself, whose whole chain the worker logs when the run ends.
    pub fn retry_because(
        code: impl Into<String>,
        message: impl Into<String>,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Retry { error: JobError::new(code, message), cause: Some(Arc::new(cause)) }
    }

    /// [`Outcome::Wait`] for a failed call, as [`Outcome::retry_because`].
    pub fn wait_because(
        after: Duration,
        code: impl Into<String>,
        message: impl Into<String>,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Wait { after, reason: JobError::new(code, message), cause: Some(Arc::new(cause)) }
    }

    /// [`Outcome::Fail`] with an `operation-failed` problem (status 422: the request cannot be
    /// carried out as it stands), a stable `code` and a `detail` safe to show to the user.
    pub fn fail(code: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::fail_with_status(422, code, detail)
    }

    /// [`Outcome::Fail`] with an `operation-failed` problem and an explicit status.
    pub fn fail_with_status(status: u16, code: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::Fail { problem: failed_problem(status, code.into(), detail.into()) }
    }
}

/// An `operation-failed` problem (`instance` and `request_id` are filled in by the store).
pub(crate) fn failed_problem(status: u16, code: String, detail: String) -> Problem {
    Problem {
        type_: OPERATION_FAILED.uri(),
        title: OPERATION_FAILED.title.to_owned(),
        status,
        detail,
        instance: String::new(),
        code,
        request_id: String::new(),
        errors: Vec::new(),
    }
}
