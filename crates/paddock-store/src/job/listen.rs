//! The other end of [`NOTIFY_CHANNEL`]: what wakes an idle worker when a job is enqueued.

use sqlx::postgres::PgListener;

use super::NOTIFY_CHANNEL;
use crate::{Store, StoreError};

/// A connection of its own (opened with the pool's options, outside the pool) listening on
/// [`NOTIFY_CHANNEL`].
#[derive(Debug)]
pub struct JobListener(PgListener);

impl JobListener {
    /// Connects and listens.
    pub async fn connect(store: &Store) -> Result<Self, StoreError> {
        let mut listener = PgListener::connect_with(store.pool()).await?;
        listener.listen(NOTIFY_CHANNEL).await?;
        Ok(Self(listener))
    }

    /// The kind of the next job enqueued (or come due when a run ended); `None` when the
    /// connection dropped and was opened again, which loses whatever was sent meanwhile. An error
    /// ends the listener: connect again.
    pub async fn next_kind(&mut self) -> Result<Option<String>, StoreError> {
        Ok(self.0.try_recv().await?.map(|n| n.payload().to_owned()))
    }
}
