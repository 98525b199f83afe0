//! Idempotency keys for `POST`: scoped by (subject, tenant, method, path); the same key and body
//! within 24 h replays the first response, another body is 422, a duplicate in flight is 409. A
//! request in flight holds its key under a lease of [`KEY_LEASE`], renewed every
//! [`KEY_RENEWAL`] while it runs: when its process dies, a retry takes the key over once the
//! lease has run out.
//!
//! The answer is recorded in the transaction of the effect ([`DeferredCommit`]): the audited write
//! of every `POST` leaves its transaction open for a request with a key, the answer is written in
//! it and both commit together. A process that dies before that commit changed nothing (a retry
//! runs the request again); one that dies after it changed the world and recorded the answer (a
//! retry replays it). A retry never runs a committed effect a second time.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use paddock_domain::{Actor, Result};
use paddock_store::idempotency::{self as store};
pub use paddock_store::idempotency::{Claim, IdemKey, StoredResponse};
use paddock_store::Tx;
use uuid::Uuid;

use crate::{commit, fault, Services};

/// Where the audited write of a request with an `Idempotency-Key` leaves its transaction, open,
/// for [`Services::idempotency_complete`] to write the answer in and commit (see the module doc).
/// Given to the services in [`Ctx::deferred_commit`](crate::Ctx::deferred_commit); cloning shares
/// the slot.
#[derive(Clone)]
pub struct DeferredCommit {
    slot: Arc<Mutex<Option<Tx>>>,
    request_id: Arc<str>,
}

impl std::fmt::Debug for DeferredCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredCommit").field("pending", &self.is_pending()).finish_non_exhaustive()
    }
}

impl DeferredCommit {
    /// An empty slot for the request `request_id`.
    pub fn new(request_id: &str) -> Self {
        Self { slot: Arc::default(), request_id: request_id.into() }
    }

    /// Whether a write left its transaction here, not yet committed.
    pub fn is_pending(&self) -> bool {
        self.lock().is_some()
    }

    /// Leaves `tx` here; gives it back when the slot holds one already.
    pub(crate) fn defer(&self, tx: Tx) -> std::result::Result<(), Tx> {
        let mut slot = self.lock();
        if slot.is_some() {
            return Err(tx);
        }
        *slot = Some(tx);
        Ok(())
    }

    fn take(&self) -> Option<Tx> {
        self.lock().take()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Tx>> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The scope of a key for a caller.
pub fn key_scope(actor: &Actor, method: &str, path: &str, key: &str) -> IdemKey {
    IdemKey {
        subject: actor.subject.clone(),
        tenant_scope: actor.tenant_id.map_or(uuid::Uuid::nil(), |t| t.uuid()),
        method: method.to_owned(),
        path: path.to_owned(),
        key: key.to_owned(),
    }
}

/// How long a key in flight stays held without a renewal.
pub const KEY_LEASE: Duration = Duration::from_secs(30);

/// How often a request in flight renews its key's lease.
pub const KEY_RENEWAL: Duration = Duration::from_secs(10);

impl Services {
    /// Claims a key for a request body's hash.
    pub async fn idempotency_claim(&self, key: &IdemKey, hash: &[u8]) -> Result<Claim> {
        let mut conn = self.store.conn().await?;
        Ok(store::claim(&mut conn, key, hash, KEY_LEASE).await?)
    }

    /// Renews the lease of a key in flight; false when it was taken over.
    pub async fn idempotency_renew(&self, key: &IdemKey, holder: Uuid) -> Result<bool> {
        let mut conn = self.store.conn().await?;
        Ok(store::renew(&mut conn, key, holder, KEY_LEASE).await?)
    }

    /// Records the first response to a key; true when it did. With a write's transaction left in
    /// `deferred`, the response is written in it and both commit together: then an error, or
    /// false (the key was taken over meanwhile, its lease having run out), means the effect was
    /// not committed either, and the client must not be told it was. Without one (a refusal, a
    /// request that changed nothing), the response is stored on its own.
    pub async fn idempotency_complete(
        &self,
        key: &IdemKey,
        holder: Uuid,
        response: &StoredResponse,
        deferred: &DeferredCommit,
    ) -> Result<bool> {
        let Some(mut tx) = deferred.take() else {
            let mut conn = self.store.conn().await?;
            return Ok(store::complete(&mut conn, key, holder, response).await?);
        };
        // A key taken over is another request's now: this one's effect is rolled back (dropped).
        if !store::complete(&mut tx, key, holder, response).await? {
            return Ok(false);
        }
        commit(tx).await?;
        fault::reached(fault::AFTER_COMMIT, &deferred.request_id).await;
        Ok(true)
    }

    /// Gives a key up after a server error, so that a retry runs again; a write's transaction
    /// left in `deferred` is rolled back: the client is told the request failed.
    pub async fn idempotency_release(&self, key: &IdemKey, holder: Uuid, deferred: &DeferredCommit) -> Result<()> {
        drop(deferred.take());
        let mut conn = self.store.conn().await?;
        Ok(store::release(&mut conn, key, holder).await?)
    }
}
