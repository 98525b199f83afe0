//! Operations: what a 202 returns, so an asynchronous change can be followed to its end.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::problem::Problem;
use crate::{OperationId, TenantId};

/// Progress of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OperationState {
    /// Accepted, not started.
    Pending,
    /// Being carried out.
    Running,
    /// Done.
    Succeeded,
    /// Ended with `error`.
    Failed,
    /// A newer change to the same target replaced it.
    Superseded,
}

impl OperationState {
    /// The stored and wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Superseded => "superseded",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Pending, Self::Running, Self::Succeeded, Self::Failed, Self::Superseded]
            .into_iter()
            .find(|state| state.as_str() == s)
    }
}

/// What an operation acts on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OperationTarget {
    /// Resource type: `machine`, `cluster`, `node_pool`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Resource id.
    pub id: Uuid,
}

/// One step of an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OperationStep {
    /// Step name.
    pub name: String,
    /// Step state.
    pub state: OperationState,
    /// When it started.
    pub started_at: Option<DateTime<Utc>>,
    /// When it finished.
    pub finished_at: Option<DateTime<Utc>>,
}

/// An operation as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct OperationView {
    /// Id.
    pub id: OperationId,
    /// Kind, e.g. `machine_enroll`.
    pub kind: String,
    /// What it acts on.
    pub target: OperationTarget,
    /// Tenant it belongs to; null for provider-side objects such as machines.
    pub tenant_id: Option<TenantId>,
    /// Progress.
    pub state: OperationState,
    /// The operation's whole step plan, in order, from the moment it is accepted (every step
    /// `pending` then), each step with its progress.
    pub steps: Vec<OperationStep>,
    /// Name of the step being carried out.
    pub current_step: Option<String>,
    /// Why it failed.
    pub error: Option<Problem>,
    /// Why paddock started it on its own, for people: an autoscaler's decision says what it saw
    /// (`scale_up: 3 pending jobs need 2 nodes`, `scale_down: idle 600 s`); null for an
    /// operation a request started.
    pub reason: Option<String>,
    /// When it was accepted.
    pub created_at: DateTime<Utc>,
    /// When it ended.
    pub finished_at: Option<DateTime<Utc>>,
}

/// Filters of the operation lists.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OperationFilter {
    /// Only this tenant's operations.
    pub tenant_id: Option<TenantId>,
    /// Only operations on this object.
    pub target_id: Option<Uuid>,
    /// Only this state.
    pub state: Option<OperationState>,
}
