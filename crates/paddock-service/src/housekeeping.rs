//! Periodic clean-up the worker does: forgetting what no longer matters.

use std::time::Duration;

use paddock_domain::Result;
use paddock_store::{idempotency, job};

use crate::Services;

/// Finished jobs are kept this long for their history, then deleted.
pub const FINISHED_JOB_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

impl Services {
    /// Forgets idempotency keys older than 24 hours; returns how many.
    pub async fn purge_expired_idempotency_keys(&self) -> Result<u64> {
        let mut conn = self.store.conn().await?;
        Ok(idempotency::purge_expired(&mut conn).await?)
    }

    /// Deletes jobs that finished more than a week ago, in batches; returns how many.
    pub async fn purge_finished_jobs(&self) -> Result<u64> {
        const BATCH: u32 = 1000;
        let mut conn = self.store.conn().await?;
        let mut total = 0;
        loop {
            let n = job::purge_finished(&mut conn, FINISHED_JOB_RETENTION, BATCH).await?;
            total += n;
            if n < u64::from(BATCH) {
                return Ok(total);
            }
        }
    }
}
