//! Gauges read at scrape time.

use crate::{Conn, StoreError};

/// One gauge's count under its two labels.
pub type Count = (String, String, i64);

/// Machines by state and class (retired ones included).
pub async fn machines_by_state_and_class(conn: &mut Conn) -> Result<Vec<Count>, StoreError> {
    Ok(sqlx::query_as(
        "select m.state, c.name, count(*) from machines m join machine_classes c on c.id = m.machine_class_id \
         group by m.state, c.name order by m.state, c.name",
    )
    .fetch_all(conn)
    .await?)
}

/// The machine classes' names (every class has a series of each state, zero or not).
pub async fn class_names(conn: &mut Conn) -> Result<Vec<String>, StoreError> {
    Ok(sqlx::query_scalar("select name from machine_classes order by name").fetch_all(conn).await?)
}

/// Clusters not yet deleted, by phase and kind.
pub async fn clusters_by_phase_and_kind(conn: &mut Conn) -> Result<Vec<Count>, StoreError> {
    Ok(sqlx::query_as(
        "select phase, kind, count(*) from clusters where deleted_at is null group by phase, kind order by phase, kind",
    )
    .fetch_all(conn)
    .await?)
}

/// Clusters waiting in line for machines (docs/architecture.md, cluster reconciler step 3): how
/// many, and how long the one
/// waiting longest has waited, in seconds (0 when none waits).
pub async fn waiting_for_machines(conn: &mut Conn) -> Result<(i64, f64), StoreError> {
    Ok(sqlx::query_as(
        "select count(*), coalesce(extract(epoch from now() - min(waiting_since))::float8, 0) from clusters \
         where waiting_since is not null and deleted_at is null",
    )
    .fetch_one(conn)
    .await?)
}
