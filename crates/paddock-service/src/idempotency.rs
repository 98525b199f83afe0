//! Idempotency keys for `POST`: scoped by (subject, tenant, method, path); the same key and body
//! within 24 h replays the first response, another body is 422, a duplicate in flight is 409.

use paddock_domain::{Actor, Result};
use paddock_store::idempotency::{self as store, Claim, IdemKey, StoredResponse};

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

impl Services {
    /// Claims a key for a request body's hash.
    pub async fn idempotency_claim(&self, key: &IdemKey, hash: &[u8]) -> Result<Claim> {
        let mut conn = self.store.conn().await?;
        Ok(store::claim(&mut conn, key, hash).await?)
    }

    /// Stores the first response to a key.
    pub async fn idempotency_complete(&self, key: &IdemKey, response: &StoredResponse) -> Result<()> {
        let mut conn = self.store.conn().await?;
        Ok(store::complete(&mut conn, key, response).await?)
    }

    /// Gives a key up after a server error, so that a retry runs again.
    pub async fn idempotency_release(&self, key: &IdemKey) -> Result<()> {
        let mut conn = self.store.conn().await?;
        Ok(store::release(&mut conn, key).await?)
    }
}
