//! The machine agents' side (docs/security.md): a run's tokens (a wipe or a provisioning boot), its
//! NoCloud seed image, its configuration, and the report that uses the run up.
//!
//! Tokens. The seed token is 32 random bytes (base64url), the only secret in a URL: the BMC fetches
//! `{PADDOCK_AGENT_SEED_BASE_URL}/v1/agent/seed/{seed_token}.iso` as virtual media. The agent token
//! is derived from it, `HMAC-SHA256(key, "paddock-agent-token" 0x00 seed_token)` (base64url), where
//! the key is `PADDOCK_ENCRYPTION_KEY` (the current key first, then `PADDOCK_ENCRYPTION_OLD_KEYS`,
//! so a rotation does not strand a run in flight; see `Cipher::derive`). Neither token is stored:
//! the server keeps the SHA-256 of each, computes the agent token when the seed is generated and
//! writes it into the seed's `paddock/agent.json`. The machine sends it as
//! `Authorization: Bearer <agent_token>` to `{PADDOCK_AGENT_BASE_URL}/v1/agent/config` and
//! `/v1/agent/report`. Unknown tokens are 404, a used run 409, an expired one 410; hashes are
//! compared in constant time where they are compared in memory. Tokens never reach logs, metric
//! labels, audit events or problems.
//!
//! The run's configuration is sealed, bound to its row. A wipe is verified only when its report's
//! evidence is complete (see `paddock_domain::agent`); why not is kept with the report.

use std::collections::HashSet;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::Utc;
use paddock_domain::agent::{
    ct_eq, is_sha256_hex, judge_acceptance, judge_provision, judge_wipe, Run, SIMULATED_OS_IMAGE_SHA256,
    SIMULATED_WIPE_IMAGE_SHA256,
};
use paddock_domain::secret::{Binding, SecretString};
use paddock_domain::validate::Checks;
use paddock_domain::{Actor, Error, Result};
use paddock_store::agent::{self as store, AgentToken, NewAgentToken, TokenKind};
use paddock_types::agent::{AgentConfigView, AgentMachine, AgentPurpose, AgentReport, AgentRunConfig, AgentSeed};
use paddock_types::MachineId;
use rand::RngCore;
use serde_json::json;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::audit::Done;
use crate::{Body, Ctx, Services};

const TOKEN_BYTES: usize = 32;
/// The label of the agent token's derivation (see the module documentation).
const AGENT_TOKEN_LABEL: &str = "paddock-agent-token";
const UNKNOWN: Error = Error::NotFound { kind: "agent token" };

/// What the agent endpoints need from the configuration (docs/configuration.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSettings {
    /// `PADDOCK_AGENT_BASE_URL`, no trailing slash: what machines call.
    pub base_url: String,
    /// `PADDOCK_AGENT_SEED_BASE_URL`, no trailing slash: what BMCs fetch seeds from.
    pub seed_base_url: String,
    /// PEM of the CA that signs the agent endpoint's certificate, handed to the agent in its
    /// seed; `None` for a certificate from a CA the image already trusts.
    pub ca_cert: Option<String>,
    /// `PADDOCK_WIPE_IMAGE_SHA256`: the only image a wipe report may name.
    pub wipe_image_sha256: String,
    /// `PADDOCK_OS_IMAGE_SHA256`: the only image a provisioning report may name.
    pub os_image_sha256: String,
}

impl Default for AgentSettings {
    /// Loopback URLs and the simulated images' digests (`paddock dev`, tests).
    fn default() -> Self {
        Self {
            base_url: "http://127.0.0.1:8080".to_owned(),
            seed_base_url: "http://127.0.0.1:8080".to_owned(),
            ca_cert: None,
            wipe_image_sha256: SIMULATED_WIPE_IMAGE_SHA256.to_owned(),
            os_image_sha256: SIMULATED_OS_IMAGE_SHA256.to_owned(),
        }
    }
}

/// A run agent tokens are issued for.
#[derive(Debug, Clone)]
pub struct AgentRun {
    /// The machine.
    pub machine_id: MachineId,
    /// The run (decided and persisted by the worker before the machine boots).
    pub run_id: Uuid,
    /// The instructions, which say what the run does: for a wipe a `WipeConfig` (at least one
    /// drive), for a provisioning boot a `ProvisionConfig`.
    pub config: AgentRunConfig,
}

fn binding(id: Uuid) -> Binding<'static> {
    Binding { table: "agent_tokens", column: "config_enc", row: id }
}

/// The SHA-256 of a token as sent; `None` for anything that is not one of ours.
fn token_hash(token: &str) -> Option<[u8; 32]> {
    let bytes = URL_SAFE_NO_PAD.decode(token.as_bytes()).ok()?;
    (bytes.len() == TOKEN_BYTES).then(|| Sha256::digest(token.as_bytes()).into())
}

fn random_token() -> String {
    let mut raw = [0u8; TOKEN_BYTES];
    rand::rng().fill_bytes(&mut raw);
    URL_SAFE_NO_PAD.encode(raw)
}

fn used() -> Error {
    Error::conflict("agent_token_used", "this run already reported; its tokens are used up")
}

impl Services {
    /// The agent tokens a seed token derives to, under each configured key (current first).
    fn agent_tokens(&self, seed_token: &str) -> Vec<String> {
        self.cipher.derive(AGENT_TOKEN_LABEL, seed_token.as_bytes()).iter().map(|t| URL_SAFE_NO_PAD.encode(t)).collect()
    }

    /// Issues the tokens of a run's boot (called by the worker before it boots the machine), ending
    /// the unused tokens of its earlier boots; returns the seed token, which exists nowhere else
    /// afterwards. Put it in a URL with [`Services::agent_seed_url`].
    pub async fn agent_token_issue(&self, run: &AgentRun, ttl: Duration) -> Result<SecretString> {
        if let AgentRunConfig::Wipe(wipe) = &run.config {
            if wipe.drives.is_empty() {
                return Err(Error::invalid("config.drives", "a wipe must list at least one drive"));
            }
        }
        let seed_token = random_token();
        let agent_token = self.agent_tokens(&seed_token).swap_remove(0);
        let id = Uuid::now_v7();
        let config = serde_json::to_vec(&run.config).map_err(Error::internal)?;
        let sealed = self.cipher.seal(&config, binding(id)).map_err(Error::internal)?;
        let expires_at = Utc::now() + chrono::Duration::from_std(ttl).map_err(Error::internal)?;
        let nonce = random_token();
        let new = NewAgentToken {
            id,
            seed_sha256: &Sha256::digest(seed_token.as_bytes()),
            agent_sha256: &Sha256::digest(agent_token.as_bytes()),
            machine_id: run.machine_id,
            run_id: run.run_id,
            purpose: run.config.purpose().as_str(),
            config_enc: &sealed,
            nonce: &nonce,
            expires_at,
        };
        // A run has one live token: the unused ones of an earlier boot of the run end as this one
        // is stored, in one transaction.
        let mut tx = self.store.begin().await?;
        paddock_store::run::expire_unused_tokens(&mut tx, run.run_id).await?;
        store::insert(&mut tx, &new).await?;
        crate::commit(tx).await?;
        Ok(SecretString::new(seed_token))
    }

    /// The URL the BMC fetches a run's seed from: the only agent URL with a secret in it.
    pub fn agent_seed_url(&self, seed_token: &SecretString) -> SecretString {
        SecretString::new(format!("{}/v1/agent/seed/{}.iso", self.agent.seed_base_url, seed_token.expose()))
    }

    /// A live run by one of its tokens: 404 unknown, 409 used, 410 expired.
    async fn agent_run(&self, kind: TokenKind, token: &str) -> Result<AgentToken> {
        let hash = token_hash(token).ok_or(UNKNOWN)?;
        let mut conn = self.store.conn().await?;
        let found = store::get(&mut conn, kind, &hash).await?.ok_or(UNKNOWN)?;
        if found.used_at.is_some() {
            return Err(used());
        }
        if found.expires_at <= Utc::now() {
            return Err(Error::Gone {
                code: "agent_token_expired",
                message: "this run's tokens have expired".to_owned(),
            });
        }
        Ok(found)
    }

    fn agent_config_of(&self, found: &AgentToken) -> Result<AgentConfigView> {
        let config = self.cipher.open(&found.config_enc, binding(found.id)).map_err(Error::internal)?;
        let purpose = AgentPurpose::parse(&found.purpose).ok_or_else(|| Error::internal("unknown agent purpose"))?;
        // Sealed as the run's purpose's configuration: decoded as that one, not by guessing.
        let config = match purpose {
            AgentPurpose::Wipe => serde_json::from_slice(&config).map(AgentRunConfig::Wipe),
            AgentPurpose::Provision => serde_json::from_slice(&config).map(AgentRunConfig::Provision),
            AgentPurpose::Acceptance => serde_json::from_slice(&config).map(AgentRunConfig::Acceptance),
        }
        .map_err(Error::internal)?;
        Ok(AgentConfigView {
            purpose,
            machine: AgentMachine { id: MachineId(found.machine_id), name: found.machine_name.clone() },
            run_id: found.run_id,
            nonce: found.nonce.clone(),
            expires_at: found.expires_at,
            config,
        })
    }

    /// `GET /v1/agent/config` with the run's agent token.
    pub async fn agent_config(&self, agent_token: &str) -> Result<AgentConfigView> {
        let found = self.agent_run(TokenKind::Agent, agent_token).await?;
        self.agent_config_of(&found)
    }

    /// `GET /v1/agent/seed/{seed_token}.iso`: the run's seed, generated now: NoCloud `meta-data`
    /// (instance id, hostname) and `user-data`, and `paddock/agent.json` with the agent token.
    pub async fn agent_seed(&self, seed_token: &str) -> Result<Vec<u8>> {
        let found = self.agent_run(TokenKind::Seed, seed_token).await?;
        let agent_token = self
            .agent_tokens(seed_token)
            .into_iter()
            .find(|t| ct_eq(&Sha256::digest(t.as_bytes()), &found.agent_sha256))
            // A key rotated away since the run was issued: its agent token cannot be had again.
            .ok_or(UNKNOWN)?;
        let seed = AgentSeed {
            agent_url: self.agent.base_url.clone(),
            agent_token,
            ca_cert: self.agent.ca_cert.clone(),
            machine_id: MachineId(found.machine_id),
            run_id: found.run_id,
        };
        let agent_json = serde_json::to_vec_pretty(&seed).map_err(Error::internal)?;
        let meta_data = format!("instance-id: {}\nlocal-hostname: {}\n", found.run_id, found.machine_name);
        let user_data =
            "#cloud-config\n# paddock: the run's agent reads paddock/agent.json from this volume (label cidata)\n";
        paddock_seed::agent_seed_iso(meta_data.as_bytes(), user_data.as_bytes(), &agent_json).map_err(Error::internal)
    }

    /// `POST /v1/agent/report` with the run's agent token: records how the run ended and whether
    /// it proves the run, and uses the run up. Audited under the machine, with the agent as the
    /// actor.
    pub async fn agent_report(
        &self,
        agent_token: &str,
        body: &Body,
        request_id: String,
        server_request_id: Uuid,
    ) -> Result<()> {
        let found = self.agent_run(TokenKind::Agent, agent_token).await?;
        let actor =
            Actor::from_claims(format!("agent:{}", found.machine_name), Vec::new(), None).map_err(Error::internal)?;
        let ctx = Ctx { actor, request_id, server_request_id, deferred_commit: None };
        self.audited(&ctx, "agent.report", "machine", async |audit| {
            audit.target(found.machine_id, None);
            let report: AgentReport = body.decode()?;
            check_report(&report, &found.nonce)?;
            let config = self.agent_config_of(&found)?;
            let run = Run { issued_at: found.created_at, received_at: Utc::now() };
            let verdict = match &config.config {
                AgentRunConfig::Wipe(wipe) => judge_wipe(&run, &wipe.drives, &report, &self.agent.wipe_image_sha256),
                AgentRunConfig::Provision(_) => judge_provision(&run, &report, &self.agent.os_image_sha256),
                // The class's image, as it was when the run was issued (sealed with the run).
                AgentRunConfig::Acceptance(acceptance) => judge_acceptance(&run, &report, &acceptance.image_sha256),
            };
            let failure = verdict.err();
            let verified = failure.is_none();
            let stored = serde_json::to_value(&report).map_err(Error::internal)?;
            let mut tx = self.store.begin().await?;
            if !store::use_up(&mut tx, found.id, &stored, verified, failure.as_deref()).await? {
                // Used or expired since it was read: answer as that later state.
                drop(tx);
                return Err(self.agent_run(TokenKind::Agent, agent_token).await.err().unwrap_or_else(used));
            }
            // The machine's reconciler carries on at once (it also looks again by itself).
            paddock_store::lifecycle::enqueue_machine(&mut tx, MachineId(found.machine_id), None).await?;
            let details = json!({
                "run_id": found.run_id, "purpose": found.purpose, "verified": verified, "failure": failure,
                "image_sha256": report.image_sha256,
            });
            Ok(Done::Commit { tx, value: (), details })
        })
        .await
    }
}

/// What a report must satisfy to be recorded at all (422 otherwise, and the run stays open):
/// well-formed values and the run's nonce when it echoes one (a report without one is recorded
/// and fails: see `judge_wipe`). Whether its evidence proves the run
/// is decided afterwards, by the domain's rules.
fn check_report(report: &AgentReport, nonce: &str) -> Result<()> {
    let mut c = Checks::new();
    c.check(report.finished_at >= report.started_at, "finished_at", "must not be before started_at");
    c.check(is_sha256_hex(&report.image_sha256), "image_sha256", "must be 64 lower-case hex digits");
    if let Some(echo) = &report.nonce {
        c.check(ct_eq(echo.as_bytes(), nonce.as_bytes()), "nonce", "is not this run's nonce");
    }
    c.check(report.drives.len() <= 256, "drives", "must list at most 256 drives");
    c.check(report.devices.len() <= 1024, "devices", "must list at most 1024 devices");
    let mut seen = HashSet::new();
    for (i, drive) in report.drives.iter().enumerate() {
        if let Some(id) = &drive.id {
            c.text(&format!("drives[{i}].id"), id, 256);
            c.check(seen.insert(id.as_str()), &format!("drives[{i}].id"), "is reported twice");
        }
        c.text(&format!("drives[{i}].method"), &drive.method, 64);
        if let Some(detail) = &drive.detail {
            c.max_len(&format!("drives[{i}].detail"), detail, 4096);
        }
        let identity = &drive.identity;
        for (field, value) in
            [("model", &identity.model), ("serial", &identity.serial), ("wwn", &identity.wwn), ("eui", &identity.eui)]
        {
            if let Some(value) = value {
                c.max_len(&format!("drives[{i}].identity.{field}"), value, 256);
            }
        }
        if let Some(protocol) = &identity.protocol {
            c.max_len(&format!("drives[{i}].identity.protocol"), protocol, 64);
        }
        if let Some(v) = &drive.verification {
            let field = format!("drives[{i}].verification.sha256");
            c.check(is_sha256_hex(&v.sha256), &field, "must be 64 lower-case hex digits");
        }
    }
    paddock_domain::validate::health_checks(&mut c, &report.checks);
    for (i, device) in report.devices.iter().enumerate() {
        c.text(&format!("devices[{i}].name"), &device.name, 64);
        c.max_len(&format!("devices[{i}].reason"), &device.reason, 1024);
    }
    if let Some(failure) = &report.failure {
        let code = &failure.code;
        let snake = code.starts_with(|ch: char| ch.is_ascii_lowercase())
            && code.chars().all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_');
        c.check(snake && code.len() <= 64, "failure.code", "must be snake_case, at most 64 characters");
        c.max_len("failure.message", &failure.message, 1024);
    }
    c.finish()
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

    #[test]
    fn agent_tokens_are_derived_under_every_key_current_first() {
        use paddock_domain::secret::Cipher;
        let old = Cipher::generate_key();
        let before = Cipher::new(&old, &[]).expect("key");
        let after = Cipher::new(&Cipher::generate_key(), &[old]).expect("keys");
        let derived = |c: &Cipher| -> Vec<String> {
            c.derive(AGENT_TOKEN_LABEL, b"seed").iter().map(|t| URL_SAFE_NO_PAD.encode(t)).collect()
        };
        let (before, after) = (derived(&before), derived(&after));
        assert_eq!(before.len(), 1);
        assert_eq!(after.len(), 2);
        assert_eq!(after[1], before[0], "a rotated key still derives the run's agent token");
        assert_ne!(after[0], before[0]);
        assert!(token_hash(&before[0]).is_some(), "an agent token has a token's shape");
    }
}
