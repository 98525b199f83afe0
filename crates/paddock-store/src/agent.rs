//! Agent tokens: looked up by the SHA-256 of the token, never by the token itself.

use chrono::{DateTime, Utc};
use paddock_types::MachineId;
use uuid::Uuid;

use crate::{Conn, StoreError};

/// A token to store.
#[derive(Debug)]
pub struct NewAgentToken<'a> {
    /// Row id, decided first: the sealed configuration is bound to it.
    pub id: Uuid,
    /// SHA-256 of the token.
    pub token_sha256: &'a [u8],
    /// The machine.
    pub machine_id: MachineId,
    /// The run (a wipe or a provisioning boot) it belongs to.
    pub run_id: Uuid,
    /// `wipe` or `provision`.
    pub purpose: &'a str,
    /// The run's configuration, sealed.
    pub config_enc: &'a [u8],
    /// End of validity.
    pub expires_at: DateTime<Utc>,
}

/// A stored token.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AgentToken {
    /// Row id.
    pub id: Uuid,
    /// The machine.
    pub machine_id: Uuid,
    /// Its name (for the agent's configuration and the seed's hostname).
    pub machine_name: String,
    /// The run.
    pub run_id: Uuid,
    /// `wipe` or `provision`.
    pub purpose: String,
    /// The sealed configuration.
    pub config_enc: Vec<u8>,
    /// End of validity.
    pub expires_at: DateTime<Utc>,
    /// When the report used it up.
    pub used_at: Option<DateTime<Utc>>,
    /// Whether the report proved the run.
    pub verified: Option<bool>,
}

/// Stores a token.
pub async fn insert(conn: &mut Conn, t: &NewAgentToken<'_>) -> Result<(), StoreError> {
    sqlx::query(
        "insert into agent_tokens (id, token_sha256, machine_id, run_id, purpose, config_enc, expires_at) \
         values ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(t.id)
    .bind(t.token_sha256)
    .bind(t.machine_id.uuid())
    .bind(t.run_id)
    .bind(t.purpose)
    .bind(t.config_enc)
    .bind(t.expires_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// The token whose SHA-256 is `token_sha256`.
pub async fn get(conn: &mut Conn, token_sha256: &[u8]) -> Result<Option<AgentToken>, StoreError> {
    Ok(sqlx::query_as(
        "select t.id, t.machine_id, m.name as machine_name, t.run_id, t.purpose, t.config_enc, t.expires_at, \
         t.used_at, t.verified from agent_tokens t join machines m on m.id = t.machine_id where t.token_sha256 = $1",
    )
    .bind(token_sha256)
    .fetch_optional(conn)
    .await?)
}

/// Uses a token up with its report; false when it was already used (or expired) meanwhile.
pub async fn use_up(conn: &mut Conn, id: Uuid, report: &serde_json::Value, verified: bool) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "update agent_tokens set used_at = now(), report = $2, verified = $3 \
         where id = $1 and used_at is null and expires_at > now()",
    )
    .bind(id)
    .bind(report)
    .bind(verified)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}
