//! Remediations: a machine a tenant holds, reported `failed` (or that its tenant asks to
//! replace), swapped for a spare of its class in the same pool.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{ClusterId, MachineId, NodePoolId, TenantId};

/// A node pool's remediation setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NodePoolRemediation {
    /// Whether a `failed` health report of a machine of the pool starts its replacement on its
    /// own (default true). A tenant's `replace` request always does.
    pub automatic: bool,
}

impl Default for NodePoolRemediation {
    fn default() -> Self {
        Self { automatic: true }
    }
}

/// What started a remediation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RemediationSource {
    /// An operator's `failed` health report.
    Operator,
    /// The BMC's `failed` health.
    Bmc,
    /// The tenant's Kubernetes: a Node not Ready past the grace.
    Kubernetes,
    /// The tenant's Slurm: a node drained with a `paddock:hw:` reason.
    Slurm,
    /// The tenant's `replace` request.
    Tenant,
}

impl RemediationSource {
    /// The stored and wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Operator => "operator",
            Self::Bmc => "bmc",
            Self::Kubernetes => "kubernetes",
            Self::Slurm => "slurm",
            Self::Tenant => "tenant",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Operator, Self::Bmc, Self::Kubernetes, Self::Slurm, Self::Tenant]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

/// Where a remediation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RemediationState {
    /// The machine is cordoned and drained; a spare of its class is awaited.
    AwaitingSpare,
    /// A spare is allocated and being provisioned.
    Replacing,
    /// The spare is active; the machine is being released into maintenance.
    Releasing,
    /// The machine carries a Slurm cluster's control pods and volumes (its `system` pool): it is
    /// cordoned and drained, never released automatically; an operator replaces it.
    NeedsOperator,
    /// Over (see `outcome`).
    Ended,
}

impl RemediationState {
    /// The stored and wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AwaitingSpare => "awaiting_spare",
            Self::Replacing => "replacing",
            Self::Releasing => "releasing",
            Self::NeedsOperator => "needs_operator",
            Self::Ended => "ended",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::AwaitingSpare, Self::Replacing, Self::Releasing, Self::NeedsOperator, Self::Ended]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

/// How a remediation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RemediationOutcome {
    /// The spare took over; the machine left the tenancy for maintenance.
    Replaced,
    /// The machine left the tenancy otherwise (its pool scaled down, its cluster deleted, an
    /// operator's intent) before a spare took over.
    Released,
}

impl RemediationOutcome {
    /// The stored and wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Replaced => "replaced",
            Self::Released => "released",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Replaced, Self::Released].into_iter().find(|s| s.as_str() == text)
    }
}

/// A remediation as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RemediationView {
    /// Id.
    pub id: uuid::Uuid,
    /// The machine being replaced.
    pub machine_id: MachineId,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// Its cluster.
    pub cluster_id: ClusterId,
    /// Its pool.
    pub node_pool_id: NodePoolId,
    /// Why: the failed checks of the report that started it, or the tenant's reason.
    pub reason: String,
    /// What started it.
    pub source: RemediationSource,
    /// The health report that started it (none for a tenant's request).
    pub report_id: Option<uuid::Uuid>,
    /// Where it stands.
    pub state: RemediationState,
    /// The spare allocated in its place, once there is one.
    pub spare_machine_id: Option<MachineId>,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// When it ended.
    pub ended_at: Option<DateTime<Utc>>,
    /// How it ended.
    pub outcome: Option<RemediationOutcome>,
    /// The node seconds credited to the tenant for the failed machine, once the credit is
    /// written (when the machine's usage segment closes). Only provider-side evidence (a `failed`
    /// report from the BMC or an operator) earns one: null otherwise (docs/billing.md, "Credits").
    #[schema(minimum = 1)]
    pub credited_seconds: Option<i64>,
}

/// Body of `POST .../machines/{machine_id}/replace`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"reason": "GPU 3 reports uncorrectable ECC errors"}))]
pub struct ReplaceRequest {
    /// Why the machine is replaced (shown in the remediation and the machine's maintenance reason).
    #[schema(min_length = 1, max_length = 1000)]
    pub reason: String,
}

/// The 202 answer of a `replace`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RemediationAccepted {
    /// The remediation it started.
    pub remediation: RemediationView,
    /// The operation to follow: it succeeds when the spare is active and the machine is on its
    /// way out (or has left the cluster).
    pub operation: crate::operation::OperationView,
}
