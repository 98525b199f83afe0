//! Machine health reports: what an operator (and, later, the BMC and the tenant's cluster) says
//! about a machine's health, recorded as it was said.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::MachineId;

/// A machine's health, or one check's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthStatus {
    /// Fit for work.
    Healthy,
    /// Works, with a fault worth watching.
    Degraded,
    /// Not fit for work.
    Failed,
}

impl HealthStatus {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Degraded => "degraded",
            Self::Failed => "failed",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "healthy" => Some(Self::Healthy),
            "degraded" => Some(Self::Degraded),
            "failed" => Some(Self::Failed),
            _ => None,
        }
    }
}

/// Who said it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthSource {
    /// A provider's operator, through the API.
    Operator,
    /// The machine's BMC (Redfish `Status.HealthRollup`, else `Status.Health`), read by the
    /// power sync; recorded when its rating changes.
    Bmc,
    /// The tenant's Kubernetes: the machine's Node not Ready for longer than
    /// `PADDOCK_NODE_NOT_READY_GRACE` (failed), then Ready again (healthy). The tenant controls
    /// its kubelet, so this alone is never provider-side evidence.
    Kubernetes,
    /// The tenant's Slurm: the machine's Slurm node drained with a reason that starts with
    /// `paddock:hw:` (failed), then no longer drained (healthy), read through slurmrestd. The
    /// tenant controls its drain reasons, so this alone is never provider-side evidence.
    Slurm,
    /// The machine class's acceptance image, booted by paddock after a wipe before the machine
    /// enters the fleet or returns from maintenance (recorded when it fails or times out).
    Acceptance,
}

impl HealthSource {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Operator => "operator",
            Self::Bmc => "bmc",
            Self::Kubernetes => "kubernetes",
            Self::Slurm => "slurm",
            Self::Acceptance => "acceptance",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "operator" => Some(Self::Operator),
            "bmc" => Some(Self::Bmc),
            "kubernetes" => Some(Self::Kubernetes),
            "slurm" => Some(Self::Slurm),
            "acceptance" => Some(Self::Acceptance),
            _ => None,
        }
    }
}

/// One check of a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    /// What was checked: lowercase letters, digits, `.`, `_` and `-`, e.g. `gpu.ecc` or `nvlink`.
    #[schema(min_length = 1, max_length = 63, pattern = "^[a-z0-9][a-z0-9._-]*$")]
    pub name: String,
    /// Its result.
    pub status: HealthStatus,
    /// What was seen, for people.
    #[serde(default)]
    #[schema(max_length = 1000)]
    pub detail: String,
}

/// Body of `POST /v1/machines/{machine_id}/health-reports`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"status": "failed", "checks": [{"name": "gpu.ecc", "status": "failed",
    "detail": "GPU 3: 41 uncorrectable ECC errors"}], "observed_at": "2026-12-06T02:00:00Z"}))]
pub struct HealthReportCreate {
    /// The machine's health as a whole.
    pub status: HealthStatus,
    /// The checks behind it.
    #[serde(default)]
    #[schema(max_items = 64)]
    pub checks: Vec<HealthCheck>,
    /// When it was observed (default: when it is recorded); not in the future.
    pub observed_at: Option<DateTime<Utc>>,
}

/// A recorded health report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HealthReportView {
    /// Id.
    pub id: uuid::Uuid,
    /// The machine.
    pub machine_id: MachineId,
    /// The machine's health as a whole.
    pub status: HealthStatus,
    /// The checks behind it.
    pub checks: Vec<HealthCheck>,
    /// Who said it.
    pub source: HealthSource,
    /// The operator who reported it (provider views only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reporter: Option<String>,
    /// When it was observed.
    pub observed_at: DateTime<Utc>,
    /// When paddock recorded it.
    pub recorded_at: DateTime<Utc>,
}

/// A machine's health in the provider's machine view: what its newest report says (any source;
/// `null` when no report was ever recorded). A report is never aged out: `observed_at` and
/// `source` say how fresh it is and who said it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MachineHealth {
    /// The machine's health as a whole, as the report says it.
    pub status: HealthStatus,
    /// Who said it.
    pub source: HealthSource,
    /// When it was observed.
    pub observed_at: DateTime<Utc>,
    /// The report (`GET /v1/machines/{machine_id}/health-reports` lists it).
    pub report_id: uuid::Uuid,
    /// Its checks: what failed, and why.
    pub checks: Vec<HealthCheck>,
}
