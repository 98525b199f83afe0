//! Gauges read at scrape time.

use crate::{Conn, StoreError};

/// Live (not retired) and retired machines by state.
pub async fn machines_by_state(conn: &mut Conn) -> Result<Vec<(String, i64)>, StoreError> {
    Ok(sqlx::query_as("select state, count(*) from machines group by state order by state").fetch_all(conn).await?)
}

/// Operations not yet finished, by state (the queue depth until the job queue exists).
pub async fn open_operations(conn: &mut Conn) -> Result<Vec<(String, i64)>, StoreError> {
    Ok(sqlx::query_as(
        "select state, count(*) from operations where state in ('pending', 'running') group by state order by state",
    )
    .fetch_all(conn)
    .await?)
}
