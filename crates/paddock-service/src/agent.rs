//! The machine agents' side: one-time tokens for a run (a wipe or a provisioning boot), the run's
//! configuration, its NoCloud seed image, and the report that uses the token up (SPEC section 5).
//!
//! A token is 32 random bytes (base64url), stored only as its SHA-256 and never logged; the
//! run's configuration is sealed, bound to its row. Unknown tokens are 404, used ones 409,
//! expired ones 410. A wipe is verified only when the report lists every drive the configuration
//! listed as wiped successfully.

use std::collections::HashSet;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::Utc;
use paddock_domain::secret::Binding;
use paddock_domain::validate::Checks;
use paddock_domain::{Actor, Error, Result};
use paddock_store::agent::{self as store, AgentToken, NewAgentToken};
use paddock_types::agent::{AgentConfigView, AgentMachine, AgentPurpose, AgentReport, AgentResult};
use paddock_types::MachineId;
use rand::RngCore;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::{db, Body, Ctx, Services};

const TOKEN_BYTES: usize = 32;
const UNKNOWN: Error = Error::NotFound { kind: "agent token" };

/// A run an agent token is issued for.
#[derive(Debug, Clone)]
pub struct AgentRun {
    /// The machine.
    pub machine_id: MachineId,
    /// The run (decided and persisted by the worker before the machine boots).
    pub run_id: Uuid,
    /// What the run does.
    pub purpose: AgentPurpose,
    /// The instructions: for a wipe `{"drives": [{"id": ...}, ...]}` (at least one drive).
    pub config: Value,
}

fn binding(id: Uuid) -> Binding<'static> {
    Binding { table: "agent_tokens", column: "config_enc", row: id }
}

/// The SHA-256 of a token as the agent sends it; `None` for anything that is not one of ours.
fn token_hash(token: &str) -> Option<Vec<u8>> {
    let bytes = URL_SAFE_NO_PAD.decode(token.as_bytes()).ok()?;
    (bytes.len() == TOKEN_BYTES).then(|| Sha256::digest(token.as_bytes()).to_vec())
}

/// The drive ids a wipe configuration lists.
fn listed_drives(config: &Value) -> Vec<&str> {
    config["drives"].as_array().map(|d| d.iter().filter_map(|d| d["id"].as_str()).collect()).unwrap_or_default()
}

impl Services {
    /// Issues the token of a run (called by the worker before it boots the machine); returns the
    /// token, which exists nowhere else afterwards.
    pub async fn agent_token_issue(&self, run: &AgentRun, ttl: Duration) -> Result<String> {
        if run.purpose == AgentPurpose::Wipe && listed_drives(&run.config).is_empty() {
            return Err(Error::invalid("config.drives", "a wipe must list at least one drive"));
        }
        let mut raw = [0u8; TOKEN_BYTES];
        rand::rng().fill_bytes(&mut raw);
        let token = URL_SAFE_NO_PAD.encode(raw);
        let hash = Sha256::digest(token.as_bytes());
        let id = Uuid::now_v7();
        let config = serde_json::to_vec(&run.config).map_err(Error::internal)?;
        let sealed = self.cipher.seal(&config, binding(id));
        let expires_at = Utc::now() + chrono::Duration::from_std(ttl).map_err(Error::internal)?;
        let new = NewAgentToken {
            id,
            token_sha256: &hash,
            machine_id: run.machine_id,
            run_id: run.run_id,
            purpose: run.purpose.as_str(),
            config_enc: &sealed,
            expires_at,
        };
        let mut conn = self.store.conn().await.map_err(db)?;
        store::insert(&mut conn, &new).await.map_err(db)?;
        Ok(token)
    }

    /// A live token: 404 unknown, 409 used, 410 expired.
    async fn agent_token(&self, token: &str) -> Result<AgentToken> {
        let hash = token_hash(token).ok_or(UNKNOWN)?;
        let mut conn = self.store.conn().await.map_err(db)?;
        let found = store::get(&mut conn, &hash).await.map_err(db)?.ok_or(UNKNOWN)?;
        if found.used_at.is_some() {
            return Err(Error::conflict("agent_token_used", "this run already reported; its token is used up"));
        }
        if found.expires_at <= Utc::now() {
            return Err(Error::Gone {
                code: "agent_token_expired",
                message: "this run's token has expired".to_owned(),
            });
        }
        Ok(found)
    }

    fn agent_config_of(&self, token: &str, found: &AgentToken) -> Result<AgentConfigView> {
        let config = self.cipher.open(&found.config_enc, binding(found.id)).map_err(Error::internal)?;
        let config: Value = serde_json::from_slice(&config).map_err(Error::internal)?;
        let purpose = AgentPurpose::parse(&found.purpose).ok_or_else(|| Error::internal("unknown agent purpose"))?;
        Ok(AgentConfigView {
            purpose,
            machine: AgentMachine { id: MachineId(found.machine_id), name: found.machine_name.clone() },
            run_id: found.run_id,
            report_url: format!("{}/v1/agent/{token}/report", self.agent_base_url),
            expires_at: found.expires_at,
            config,
        })
    }

    /// `GET /v1/agent/{token}/config`.
    pub async fn agent_config(&self, token: &str) -> Result<AgentConfigView> {
        let found = self.agent_token(token).await?;
        self.agent_config_of(token, &found)
    }

    /// `GET /v1/agent/{token}/seed.iso`: the NoCloud seed (volume `cidata`) the machine boots
    /// with: its hostname and instance id, and a cloud-config that hands the agent its URLs.
    pub async fn agent_seed(&self, token: &str) -> Result<Vec<u8>> {
        let found = self.agent_token(token).await?;
        let config = self.agent_config_of(token, &found)?;
        let meta_data = format!("instance-id: {}\nlocal-hostname: {}\n", found.run_id, found.machine_name);
        let agent = json!({
            "config_url": format!("{}/v1/agent/{token}/config", self.agent_base_url),
            "report_url": config.report_url,
            "purpose": config.purpose,
        });
        let user_data = format!(
            "#cloud-config\nwrite_files:\n  - path: /etc/paddock/agent.json\n    permissions: '0600'\n    content: '{}'\nruncmd:\n  - [paddock-agent, --config, /etc/paddock/agent.json]\n",
            agent
        );
        paddock_seed::seed_iso(meta_data.as_bytes(), user_data.as_bytes(), None).map_err(Error::internal)
    }

    /// `POST /v1/agent/{token}/report`: records how the run ended and uses the token up. The
    /// report is audited under the machine, with the agent as the actor.
    pub async fn agent_report(&self, token: &str, body: &Body, request_id: &str) -> Result<()> {
        let found = self.agent_token(token).await?;
        let actor =
            Actor::from_claims(format!("agent:{}", found.machine_name), Vec::new(), None).map_err(Error::internal)?;
        let ctx = Ctx { actor, request_id: request_id.to_owned() };
        let mut audit = self.audit(&ctx, "agent.report", "machine");
        audit.target(found.machine_id, None);
        let result = async {
            let report: AgentReport = body.decode()?;
            let mut c = Checks::new();
            c.check(report.finished_at >= report.started_at, "finished_at", "must not be before started_at");
            let mut seen = HashSet::new();
            for (i, drive) in report.drives.iter().enumerate() {
                c.text(&format!("drives.{i}.id"), &drive.id, 256);
                c.text(&format!("drives.{i}.method"), &drive.method, 64);
                if let Some(detail) = &drive.detail {
                    c.max_len(&format!("drives.{i}.detail"), detail, 4096);
                }
                c.check(seen.insert(drive.id.as_str()), &format!("drives.{i}.id"), "is reported twice");
            }
            c.finish()?;
            let config = self.agent_config_of(token, &found)?;
            let verified = report.result == AgentResult::Success
                && match config.purpose {
                    // Nothing counts as wiped unless every drive the run listed reports success.
                    AgentPurpose::Wipe => listed_drives(&config.config)
                        .iter()
                        .all(|id| report.drives.iter().any(|d| d.id == *id && d.result == AgentResult::Success)),
                    AgentPurpose::Provision => true,
                };
            let stored = serde_json::to_value(&report).map_err(Error::internal)?;
            let mut tx = self.store.begin().await.map_err(db)?;
            if !store::use_up(&mut tx, found.id, &stored, verified).await.map_err(db)? {
                // Used or expired since it was read: answer as that later state.
                drop(tx);
                let used = || Error::conflict("agent_token_used", "this run already reported; its token is used up");
                return Err(self.agent_token(token).await.err().unwrap_or_else(used));
            }
            // The machine's reconciler carries on at once (it also looks again by itself).
            paddock_store::lifecycle::enqueue_machine(&mut tx, MachineId(found.machine_id)).await.map_err(db)?;
            audit
                .success(&mut tx, json!({ "run_id": found.run_id, "purpose": found.purpose, "verified": verified }))
                .await?;
            crate::commit(tx).await
        }
        .await;
        audit.finish(result).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tokens_of_the_right_shape_are_looked_up() {
        assert!(token_hash(&URL_SAFE_NO_PAD.encode([7u8; 32])).is_some());
        assert!(token_hash(&URL_SAFE_NO_PAD.encode([7u8; 31])).is_none());
        assert!(token_hash("not a token!").is_none());
        assert!(token_hash("").is_none());
    }
}
