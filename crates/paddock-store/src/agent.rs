//! Agent tokens (docs/security.md): a run's row is found by the SHA-256 of its seed token (the BMC's
//! seed fetch) or of its agent token (the agent's bearer), never by a token itself.

use chrono::{DateTime, Utc};
use paddock_types::MachineId;
use uuid::Uuid;

use crate::{Conn, StoreError};

/// A run's tokens to store.
#[derive(Debug)]
pub struct NewAgentToken<'a> {
    /// Row id, decided first: the sealed configuration is bound to it.
    pub id: Uuid,
    /// SHA-256 of the seed token.
    pub seed_sha256: &'a [u8],
    /// SHA-256 of the agent token derived from it.
    pub agent_sha256: &'a [u8],
    /// The machine.
    pub machine_id: MachineId,
    /// The run (a wipe or a provisioning boot) it belongs to.
    pub run_id: Uuid,
    /// `wipe` or `provision`.
    pub purpose: &'a str,
    /// The run's configuration, sealed.
    pub config_enc: &'a [u8],
    /// The run's nonce (base64url; not a secret).
    pub nonce: &'a str,
    /// End of validity.
    pub expires_at: DateTime<Utc>,
}

/// A stored run's tokens.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AgentToken {
    /// Row id.
    pub id: Uuid,
    /// SHA-256 of the agent token (compared when the seed derives it again).
    pub agent_sha256: Vec<u8>,
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
    /// The run's nonce.
    pub nonce: String,
    /// When it was issued.
    pub created_at: DateTime<Utc>,
    /// End of validity.
    pub expires_at: DateTime<Utc>,
    /// When the report used it up.
    pub used_at: Option<DateTime<Utc>>,
    /// Whether the report proved the run.
    pub verified: Option<bool>,
}

/// Which token a lookup is by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// The seed token (the seed image's URL).
    Seed,
    /// The agent token (the bearer of `config` and `report`).
    Agent,
}

/// Stores a run's tokens.
pub async fn insert(conn: &mut Conn, t: &NewAgentToken<'_>) -> Result<(), StoreError> {
    sqlx::query(
        "insert into agent_tokens (id, seed_sha256, agent_sha256, machine_id, run_id, purpose, config_enc, nonce, \
         expires_at) values ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(t.id)
    .bind(t.seed_sha256)
    .bind(t.agent_sha256)
    .bind(t.machine_id.uuid())
    .bind(t.run_id)
    .bind(t.purpose)
    .bind(t.config_enc)
    .bind(t.nonce)
    .bind(t.expires_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// The run whose seed or agent token (by `kind`) has the SHA-256 `sha256`.
pub async fn get(conn: &mut Conn, kind: TokenKind, sha256: &[u8]) -> Result<Option<AgentToken>, StoreError> {
    let column = match kind {
        TokenKind::Seed => "seed_sha256",
        TokenKind::Agent => "agent_sha256",
    };
    Ok(sqlx::query_as(&format!(
        "select t.id, t.agent_sha256, t.machine_id, m.name as machine_name, t.run_id, t.purpose, t.config_enc, \
         t.nonce, t.created_at, t.expires_at, t.used_at, t.verified from agent_tokens t join machines m on m.id = t.machine_id \
         where t.{column} = $1"
    ))
    .bind(sha256)
    .fetch_optional(conn)
    .await?)
}

/// Uses a run up with its report and verdict (`failure` says why it does not prove the run);
/// false when it was already used (or expired) meanwhile.
pub async fn use_up(
    conn: &mut Conn,
    id: Uuid,
    report: &serde_json::Value,
    verified: bool,
    failure: Option<&str>,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "update agent_tokens set used_at = now(), report = $2, verified = $3, failure = $4 \
         where id = $1 and used_at is null and expires_at > now()",
    )
    .bind(id)
    .bind(report)
    .bind(verified)
    .bind(failure)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}
