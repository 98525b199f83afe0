//! PostgreSQL access: the only place with SQL. `Store` owns the pool; each module holds the
//! queries of one resource as free functions over a connection, so a service composes them in one
//! transaction (`let mut tx = store.begin().await?; ...; tx.commit().await?`).
//! Tenant-owned rows are always read with the tenant in the `where` clause.

pub mod acceptance;
pub mod agent;
pub mod allocation;
pub mod audit;
pub mod autoscale;
pub mod cluster;
pub mod cluster_event;
pub mod credit;
pub mod custody;
pub mod drift;
mod error;
pub mod health;
pub mod idempotency;
pub mod identity;
pub mod job;
pub mod lifecycle;
pub mod machine;
pub mod machine_class;
pub mod metrics;
pub mod node_pool;
pub mod operation;
pub mod power;
pub mod remediation;
pub mod reseal;
pub mod run;
pub mod scim_token;
pub mod tenant;
mod tx;
pub mod usage;
pub mod webhook;

use std::time::Duration;

pub use error::StoreError;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres};

/// The embedded migrations; every process and test uses this one static.
pub static MIGRATOR: Migrator = sqlx::migrate!("../../migrations");

/// A connection, as the query functions take it (`&mut *tx` or `&mut *pooled`).
pub use sqlx::PgConnection as Conn;
pub use tx::{Tx, Txn, Waker};

/// The database.
#[derive(Clone, Debug)]
pub struct Store {
    pool: PgPool,
    waker: Waker,
}

impl Store {
    /// Connects lazily: the process starts (and `/readyz` reports) even while the database is down.
    pub fn connect_lazy(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        Self::connect_lazy_with_timeout(url, max_connections, None)
    }

    /// [`Store::connect_lazy`], every statement of every connection limited to
    /// `statement_timeout` (PostgreSQL's `statement_timeout`, lock waits included): a slower one
    /// is cancelled, which maps to [`StoreError::Unavailable`].
    pub fn connect_lazy_with_timeout(
        url: &str,
        max_connections: u32,
        statement_timeout: Option<Duration>,
    ) -> Result<Self, StoreError> {
        let mut options: PgConnectOptions = url.parse().map_err(StoreError::Config)?;
        // No JIT compilation: paddock's statements are short, and the planner's estimates switch
        // it on for the usage aggregates over `generate_series`, where compiling took most of the
        // time (BENCHMARKS.md, usage metering: provider month 3.3 s with it, 1.8 s without).
        options = options.options([("jit", "off")]);
        if let Some(timeout) = statement_timeout {
            let ms = timeout.as_millis().to_string();
            options = options.options([("statement_timeout", ms.as_str())]);
        }
        // No ping before every acquire (sqlx's default): it doubles the round trips of a read. A
        // connection that died is found by the query itself, which maps to 503 and is retried.
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with(options.application_name("paddock"));
        Ok(Self::from_pool(pool))
    }

    /// Wraps an existing pool (tests).
    pub fn from_pool(pool: PgPool) -> Self {
        Self { waker: Waker::new(pool.clone()), pool }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies pending migrations. Safe when several processes start at once: sqlx holds an
    /// advisory lock while it migrates.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await.map_err(StoreError::Migrate)
    }

    /// Grants `runtime` what the serving processes need and no more (the migrations'
    /// `paddock_grant_runtime`: every table, but only SELECT and INSERT on the custody ledger and
    /// its checkpoints). Run by `paddock migrate` as the schema's owner, after migrating; a no-op
    /// when `runtime` is the connected role itself.
    pub async fn grant_runtime(&self, runtime: &str) -> Result<(), StoreError> {
        sqlx::query("select paddock_grant_runtime($1)").bind(runtime).execute(&self.pool).await?;
        Ok(())
    }

    /// How the connected role could rewrite the custody ledger, if it can: as a superuser, as
    /// the ledger's owner (an owner may drop or disable the append-only triggers), or holding
    /// UPDATE, DELETE or TRUNCATE on the ledger or its checkpoints (what a single role that
    /// migrated the schema has). `None`: it may only read and append, the two-role split of
    /// `paddock_grant_runtime`. The role's name comes first.
    pub async fn ledger_rewrite_access(&self) -> Result<(String, Option<&'static str>), StoreError> {
        let (role, superuser, owner, rewrite): (String, bool, bool, bool) = sqlx::query_as(
            "select current_user::text,                coalesce((select rolsuper from pg_roles where rolname = current_user), false),                pg_has_role(current_user, (select relowner from pg_class where oid = 'custody_entries'::regclass),                  'USAGE'),                exists (select 1 from unnest(array['custody_entries', 'custody_checkpoints']) as t(name),                  unnest(array['UPDATE', 'DELETE', 'TRUNCATE']) as p(privilege)                  where has_table_privilege(current_user, t.name, p.privilege))",
        )
        .fetch_one(&self.pool)
        .await?;
        let how = if superuser {
            Some("it is a superuser")
        } else if owner {
            Some("it owns the ledger's tables")
        } else if rewrite {
            Some("it holds UPDATE, DELETE or TRUNCATE on the ledger's tables")
        } else {
            None
        };
        Ok((role, how))
    }

    /// Starts a transaction.
    pub async fn begin(&self) -> Result<Tx, StoreError> {
        Ok(Tx::new(self.pool.begin().await?, Some(self.waker.clone())))
    }

    /// Wakes idle workers of `kinds` (jobs of those kinds are due), from outside any transaction:
    /// for a statement that committed on its own (a run's end) what [`Tx::commit`] does for a
    /// transaction. Returns at once; see [`Waker`].
    pub fn wake(&self, kinds: impl IntoIterator<Item = String>) {
        self.waker.wake(kinds);
    }

    /// A pooled connection for reads outside a transaction.
    pub async fn conn(&self) -> Result<sqlx::pool::PoolConnection<Postgres>, StoreError> {
        Ok(self.pool.acquire().await?)
    }

    /// Whether the database answers and every embedded migration is applied.
    pub async fn ready(&self) -> Result<bool, StoreError> {
        let latest = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
        let applied: Option<i64> = sqlx::query_scalar("select max(version) from _sqlx_migrations where success")
            .fetch_one(&self.pool)
            .await
            .or_else(|e| match &e {
                // No migrations table yet: reachable but not migrated.
                sqlx::Error::Database(db) if db.code().as_deref() == Some("42P01") => Ok(None),
                _ => Err(e),
            })?;
        Ok(applied.is_some_and(|v| v >= latest))
    }
}

/// The role a database URL connects as (its user, or the default a client would use).
pub fn role_of(url: &str) -> Result<String, StoreError> {
    let options: PgConnectOptions = url.parse().map_err(StoreError::Config)?;
    Ok(options.get_username().to_owned())
}

/// Decodes a stored enum spelling; a value the code does not know means the row is corrupt.
fn parse_state<T>(value: &str, parse: impl Fn(&str) -> Option<T>) -> Result<T, StoreError> {
    parse(value).ok_or_else(|| StoreError::Corrupt(format!("unknown state {value:?}")))
}

/// Decodes a stored JSON column.
fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, StoreError> {
    serde_json::from_value(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}
