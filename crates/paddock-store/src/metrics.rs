//! Gauges read at scrape time.

use crate::{Conn, StoreError};

/// Machines by state (retired ones included).
pub async fn machines_by_state(conn: &mut Conn) -> Result<Vec<(String, i64)>, StoreError> {
    Ok(sqlx::query_as("select state, count(*) from machines group by state order by state").fetch_all(conn).await?)
}
