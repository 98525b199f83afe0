//! A transaction, and the wake-ups of the jobs it enqueued, sent once it has committed.
//!
//! A transaction that calls `pg_notify` takes PostgreSQL's notify lock at commit (one lock for the
//! whole database) and holds it through its commit's WAL flush, so every such commit waits for the
//! one before it to be flushed: commits that enqueue jobs, the API's and the workers' alike, go one
//! flush at a time instead of sharing flushes. So no transaction that writes notifies.
//! [`job::enqueue`](crate::job::enqueue) notes the kind of a due job in its [`Txn`], and
//! [`Txn::commit`] hands the kinds to the store's [`Waker`] after the commit. The waker sends them
//! from a task of its own, all kinds that came in meanwhile in one statement, in a transaction
//! that writes nothing and commits without waiting for its flush (`synchronous_commit = off`), so
//! it holds the notify lock only for the moment it takes to queue the notifications.
//!
//! A wake-up is only ever a shortcut: workers also poll the queue (every second by default), so one
//! that is never sent (the process died after the commit, the statement failed) costs latency, not
//! a job. A wake-up always follows the commit of its job, so a worker it wakes sees the job.

use std::collections::BTreeSet;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use sqlx::postgres::{PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{PgConnection, PgPool, Postgres};
use tokio::sync::mpsc;

use crate::job::NOTIFY_CHANNEL;

/// A transaction of the store ([`Store::begin`](crate::Store::begin)).
pub type Tx = Txn<'static>;

/// A transaction, or a savepoint in one ([`Txn::begin`]). It dereferences to the connection the
/// query functions take (`&mut *tx`, or `&mut tx` where a `&mut Conn` is expected).
#[derive(Debug)]
pub struct Txn<'c> {
    inner: sqlx::Transaction<'c, Postgres>,
    /// Kinds of due jobs enqueued in it.
    wakes: BTreeSet<String>,
    after: After<'c>,
}

/// Where a committed transaction's wake-ups go.
#[derive(Debug)]
enum After<'c> {
    /// To the store's waker; without one, they are sent in the transaction, at its commit.
    Waker(Option<Waker>),
    /// A savepoint's go to its transaction, which sends them when it commits.
    Outer(&'c mut BTreeSet<String>),
}

impl<'c> Txn<'c> {
    /// A transaction whose wake-ups go to `waker`. Without one, [`Txn::commit`] sends them in
    /// the transaction (through PostgreSQL's notify lock): for a transaction begun outside a
    /// [`Store`](crate::Store).
    pub fn new(inner: sqlx::Transaction<'c, Postgres>, waker: Option<Waker>) -> Self {
        Self { inner, wakes: BTreeSet::new(), after: After::Waker(waker) }
    }

    /// A savepoint in this transaction: its wake-ups join this transaction's when it commits.
    pub async fn begin(&mut self) -> Result<Txn<'_>, sqlx::Error> {
        let conn: &mut PgConnection = &mut self.inner;
        let inner = sqlx::Connection::begin(conn).await?;
        Ok(Txn { inner, wakes: BTreeSet::new(), after: After::Outer(&mut self.wakes) })
    }

    /// Commits, then wakes the workers of the kinds of due jobs enqueued in it.
    pub async fn commit(mut self) -> Result<(), sqlx::Error> {
        if matches!(self.after, After::Waker(None)) && !self.wakes.is_empty() {
            let kinds: Vec<String> = std::mem::take(&mut self.wakes).into_iter().collect();
            sqlx::query("select pg_notify($1, kind) from unnest($2::text[]) as kind")
                .bind(NOTIFY_CHANNEL)
                .bind(&kinds)
                .execute(&mut *self.inner)
                .await?;
        }
        self.inner.commit().await?;
        match self.after {
            After::Waker(Some(waker)) => waker.wake(self.wakes),
            After::Waker(None) => {}
            After::Outer(outer) => outer.extend(self.wakes),
        }
        Ok(())
    }

    /// Rolls back; nothing is woken.
    pub async fn rollback(self) -> Result<(), sqlx::Error> {
        self.inner.rollback().await
    }

    /// Notes that a job of `kind` is due once this transaction commits.
    pub(crate) fn wake_after_commit(&mut self, kind: &str) {
        if !self.wakes.contains(kind) {
            self.wakes.insert(kind.to_owned());
        }
    }
}

impl Deref for Txn<'_> {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.inner
    }
}

impl DerefMut for Txn<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.inner
    }
}

/// Queries run on the transaction's connection, so `&mut *tx` is an executor as with sqlx's own
/// transaction.
impl<'c> sqlx::Executor<'c> for &'c mut Txn<'_> {
    type Database = Postgres;

    fn fetch_many<'e, 'q, E>(self, query: E) -> BoxStream<'e, Result<sqlx::Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: sqlx::Execute<'q, Postgres>,
        'q: 'e,
        E: 'q,
    {
        let conn: &'c mut PgConnection = &mut self.inner;
        conn.fetch_many(query)
    }

    fn fetch_optional<'e, 'q, E>(self, query: E) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: sqlx::Execute<'q, Postgres>,
        'q: 'e,
        E: 'q,
    {
        let conn: &'c mut PgConnection = &mut self.inner;
        conn.fetch_optional(query)
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        let conn: &'c mut PgConnection = &mut self.inner;
        conn.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(self, sql: &'q str) -> BoxFuture<'e, Result<sqlx::Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        let conn: &'c mut PgConnection = &mut self.inner;
        conn.describe(sql)
    }
}

/// Sends `pg_notify('paddock_jobs', <kind>)` for the kinds it is given, outside their
/// transactions: see the module doc. Cloning shares it.
#[derive(Debug, Clone)]
pub struct Waker(Arc<WakerInner>);

#[derive(Debug)]
struct WakerInner {
    pool: PgPool,
    /// The sending task's inbox; started on the first wake-up, again if its runtime ended.
    inbox: Mutex<Option<mpsc::UnboundedSender<String>>>,
}

impl Waker {
    /// A waker sending over connections of `pool`.
    pub fn new(pool: PgPool) -> Self {
        Self(Arc::new(WakerInner { pool, inbox: Mutex::new(None) }))
    }

    /// Queues wake-ups for `kinds`; returns at once. Outside a Tokio runtime nothing is sent.
    pub fn wake(&self, kinds: impl IntoIterator<Item = String>) {
        let mut kinds = kinds.into_iter().peekable();
        if kinds.peek().is_none() {
            return;
        }
        let mut inbox = self.0.inbox.lock().unwrap_or_else(PoisonError::into_inner);
        for kind in kinds {
            let kind = match inbox.as_ref() {
                Some(sender) => match sender.send(kind) {
                    Ok(()) => continue,
                    Err(mpsc::error::SendError(kind)) => kind,
                },
                None => kind,
            };
            // No task yet, or its runtime ended: start one on the current runtime.
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return;
            };
            let (tx, rx) = mpsc::unbounded_channel();
            runtime.spawn(send_wakes(self.0.pool.clone(), rx));
            // Infallible: the receiver was just moved into the task, which is alive.
            let _ = tx.send(kind);
            *inbox = Some(tx);
        }
    }
}

/// The waker's task: sends what came in, one statement for everything queued meanwhile. Ends when
/// every [`Waker`] of its store is gone.
async fn send_wakes(pool: PgPool, mut inbox: mpsc::UnboundedReceiver<String>) {
    while let Some(first) = inbox.recv().await {
        let mut kinds = BTreeSet::from([first]);
        while let Ok(kind) = inbox.try_recv() {
            kinds.insert(kind);
        }
        let kinds: Vec<String> = kinds.into_iter().collect();
        if let Err(e) = notify(&pool, &kinds).await {
            // The workers' polls find the jobs; an unreachable database is reported elsewhere.
            tracing::debug!(
                error = &e as &dyn std::error::Error,
                "sending job wake-ups failed, the workers' polls will find the jobs: {}",
                paddock_domain::error::chain(&e)
            );
        }
    }
}

/// One `pg_notify` per kind, in one statement whose transaction does not wait for its commit to be
/// flushed (it writes nothing that must survive a crash).
async fn notify(pool: &PgPool, kinds: &[String]) -> Result<(), sqlx::Error> {
    sqlx::query(
        "select set_config('synchronous_commit', 'off', true), pg_notify($1, kind) \
         from unnest($2::text[]) as kind",
    )
    .bind(NOTIFY_CHANNEL)
    .bind(kinds)
    .execute(pool)
    .await?;
    Ok(())
}
