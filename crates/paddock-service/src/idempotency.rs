//! Idempotency keys for `POST`: scoped by (subject, tenant, method, path); the same key and body
//! within 24 h replays the first response, another body is 422, a duplicate in flight is 409. A
//! request in flight holds its key under a lease of [`KEY_LEASE`], renewed every
//! [`KEY_RENEWAL`] while it runs: when its process dies, a retry takes the key over once the
//! lease has run out.

use std::time::Duration;

use paddock_domain::{Actor, Result};
use paddock_store::idempotency::{self as store};
pub use paddock_store::idempotency::{Claim, IdemKey, StoredResponse};
use uuid::Uuid;

use crate::Services;

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

    /// Stores the first response to a key.
    pub async fn idempotency_complete(&self, key: &IdemKey, holder: Uuid, response: &StoredResponse) -> Result<()> {
        let mut conn = self.store.conn().await?;
        Ok(store::complete(&mut conn, key, holder, response).await?)
    }

    /// Gives a key up after a server error, so that a retry runs again.
    pub async fn idempotency_release(&self, key: &IdemKey, holder: Uuid) -> Result<()> {
        let mut conn = self.store.conn().await?;
        Ok(store::release(&mut conn, key, holder).await?)
    }
}
