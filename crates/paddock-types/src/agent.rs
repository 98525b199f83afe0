//! What the machine agents (the wipe image and the node's first boot) fetch and report, with the
//! one-time token of their run in the path instead of a JWT.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::MachineId;

/// What a run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentPurpose {
    /// Wipe every listed drive.
    Wipe,
    /// Install the node OS and join the tenant cluster.
    Provision,
}

impl AgentPurpose {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Wipe => "wipe",
            Self::Provision => "provision",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Wipe, Self::Provision].into_iter().find(|p| p.as_str() == s)
    }
}

/// Success or failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentResult {
    /// Done.
    Success,
    /// Not done.
    Failure,
}

/// The machine a run is for.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentMachine {
    /// Machine id.
    pub id: MachineId,
    /// Machine name.
    pub name: String,
}

/// `GET /v1/agent/{token}/config`: what the agent is to do.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentConfigView {
    /// What the run does.
    pub purpose: AgentPurpose,
    /// The machine.
    pub machine: AgentMachine,
    /// The run.
    pub run_id: uuid::Uuid,
    /// Where to post the report.
    pub report_url: String,
    /// When the token expires.
    pub expires_at: DateTime<Utc>,
    /// The run's instructions: for a wipe `{"drives": [{"id", ...}]}`, for a provisioning boot the
    /// join configuration.
    #[schema(value_type = Object)]
    pub config: serde_json::Value,
}

/// One drive of a wipe report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DriveReport {
    /// The drive's id, as the configuration listed it.
    #[schema(min_length = 1, max_length = 256)]
    pub id: String,
    /// How it was wiped (`nvme-format`, `blkdiscard`, `overwrite`, ...).
    #[schema(min_length = 1, max_length = 64)]
    pub method: String,
    /// Whether it was wiped.
    pub result: AgentResult,
    /// Anything worth keeping (tool output, error).
    #[serde(default)]
    #[schema(max_length = 4096)]
    pub detail: Option<String>,
}

/// `POST /v1/agent/{token}/report`: how the run ended. It uses the token up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentReport {
    /// Overall result.
    pub result: AgentResult,
    /// Per drive (wipes).
    #[serde(default)]
    #[schema(max_items = 256)]
    pub drives: Vec<DriveReport>,
    /// When the run started.
    pub started_at: DateTime<Utc>,
    /// When it finished.
    pub finished_at: DateTime<Utc>,
}

/// The bytes of a file, for the OpenAPI document (a binary string).
#[derive(Debug, Clone, ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct BinaryFile(pub Vec<u8>);
