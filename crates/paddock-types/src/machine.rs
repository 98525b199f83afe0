//! Machines: physical servers reached through their BMC.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::operation::OperationView;
use crate::{ClusterId, Labels, MachineId, NodePoolId, TenantId};

/// Where a machine is in its lifecycle (docs/architecture.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MachineState {
    /// Enrolled; its BMC is being reached.
    Enrolling,
    /// Its inventory is being read and checked against its class.
    Inspecting,
    /// Being wiped.
    Cleaning,
    /// Clean and free.
    Available,
    /// Allocated to a node pool, not yet provisioning.
    Allocated,
    /// Booting the node image and joining its cluster.
    Provisioning,
    /// A ready node of its cluster (billable).
    Active,
    /// Leaving its cluster.
    Releasing,
    /// Provisioning failed; always goes to cleaning.
    ProvisionFailed,
    /// Cleaning failed; quarantined until maintenance or retirement.
    CleanFailed,
    /// Taken out of service by an operator; leaves only through cleaning.
    Maintenance,
    /// Gone for good.
    Retired,
}

impl MachineState {
    /// Every state, in lifecycle order.
    pub const ALL: [MachineState; 12] = [
        Self::Enrolling,
        Self::Inspecting,
        Self::Cleaning,
        Self::Available,
        Self::Allocated,
        Self::Provisioning,
        Self::Active,
        Self::Releasing,
        Self::ProvisionFailed,
        Self::CleanFailed,
        Self::Maintenance,
        Self::Retired,
    ];

    /// The stored and wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enrolling => "enrolling",
            Self::Inspecting => "inspecting",
            Self::Cleaning => "cleaning",
            Self::Available => "available",
            Self::Allocated => "allocated",
            Self::Provisioning => "provisioning",
            Self::Active => "active",
            Self::Releasing => "releasing",
            Self::ProvisionFailed => "provision_failed",
            Self::CleanFailed => "clean_failed",
            Self::Maintenance => "maintenance",
            Self::Retired => "retired",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == s)
    }
}

/// BMC access given at enrollment. `Debug` leaves the password out.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BmcCreate {
    /// Redfish service URL (`https://bmc.example:443`); `sim://<name>` with the simulated driver;
    /// `http://` only with `allow_insecure_http`.
    #[schema(min_length = 1, max_length = 2048, pattern = "^(https?|sim)://", example = "https://10.0.0.17")]
    pub url: String,
    /// The system's `Id` or `UUID`; required when the service lists several systems.
    #[serde(default)]
    #[schema(max_length = 256)]
    pub system_id: Option<String>,
    /// BMC user.
    #[schema(min_length = 1, max_length = 256)]
    pub username: String,
    /// BMC password; stored encrypted, never returned.
    #[schema(min_length = 1, max_length = 1024, format = Password)]
    pub password: String,
    /// PEM CA certificate that signs the BMC's TLS certificate.
    #[serde(default)]
    #[schema(max_length = 65536)]
    pub ca_cert: Option<String>,
    /// Skip TLS verification (discouraged).
    #[serde(default)]
    pub insecure_tls: bool,
    /// Allow a plain `http://` URL (labs, tests); the password then crosses the network in the
    /// clear.
    #[serde(default)]
    pub allow_insecure_http: bool,
}

/// Body of `POST /v1/machines`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "gpu-r07-u12", "machine_class": "gpu-h100x8", "labels": {"rack": "r07"}, "bmc": {"url": "https://10.20.7.12", "username": "paddock", "password": "s3cret-from-the-vault"}}))]
pub struct MachineEnroll {
    /// Unique DNS-1123 label.
    #[schema(min_length = 1, max_length = 63, pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
    pub name: String,
    /// Name of its machine class.
    #[schema(min_length = 1, max_length = 63)]
    pub machine_class: String,
    /// Labels.
    #[serde(default)]
    #[schema(value_type = std::collections::HashMap<String, String>)]
    pub labels: Labels,
    /// BMC access.
    pub bmc: BmcCreate,
}

/// BMC fields of a machine patch. `Debug` leaves the password out.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BmcUpdate {
    /// Redfish service URL.
    #[schema(min_length = 1, max_length = 2048)]
    pub url: Option<String>,
    /// The system's `Id` or `UUID`.
    #[schema(max_length = 256)]
    pub system_id: Option<String>,
    /// BMC user.
    #[schema(min_length = 1, max_length = 256)]
    pub username: Option<String>,
    /// BMC password.
    #[schema(min_length = 1, max_length = 1024, format = Password)]
    pub password: Option<String>,
    /// PEM CA certificate; null removes it.
    #[schema(max_length = 65536)]
    pub ca_cert: Option<String>,
    /// Skip TLS verification.
    pub insecure_tls: Option<bool>,
    /// Allow a plain `http://` URL (labs, tests).
    pub allow_insecure_http: Option<bool>,
}

/// Body of `PATCH /v1/machines/{machine_id}` (JSON merge patch). A change under `bmc` is
/// asynchronous (202 with an operation); a labels-only change answers 200.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"labels": {"rack": "r08"}}))]
pub struct MachineUpdate {
    /// Labels to set; a null value removes that label.
    #[schema(value_type = Option<std::collections::HashMap<String, Option<String>>>)]
    pub labels: Option<serde_json::Value>,
    /// BMC access to change.
    pub bmc: Option<BmcUpdate>,
}

/// Body of `POST /v1/machines/{machine_id}/maintenance`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"reason": "replace PSU 2 (ticket OPS-3141)"}))]
pub struct MaintenanceEnter {
    /// Why the machine leaves service; recorded in the audit trail.
    #[schema(min_length = 1, max_length = 1000)]
    pub reason: String,
}

/// Body of `POST /v1/machines/{machine_id}/force-release`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"reason": "the tenant cluster stopped answering; releasing for the scheduled firmware update"}))]
pub struct MachineForceRelease {
    /// Why the tenancy is ended at once; recorded in the custody ledger and the audit trail.
    #[schema(min_length = 1, max_length = 1000)]
    pub reason: String,
}

/// The most recent error of a machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LastError {
    /// Stable snake_case code, e.g. `bmc_auth_failed`.
    pub code: String,
    /// Readable message.
    pub message: String,
    /// When it happened.
    pub at: DateTime<Utc>,
}

/// BMC access as shown: never the password.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BmcView {
    /// Redfish service URL.
    pub url: String,
    /// The system's `Id` or `UUID`, when known.
    pub system_id: Option<String>,
    /// BMC user.
    pub username: String,
    /// Whether TLS verification is skipped.
    pub insecure_tls: bool,
    /// Whether a CA certificate is configured.
    pub has_ca_cert: bool,
}

/// A machine as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MachineView {
    /// Id.
    pub id: MachineId,
    /// Unique DNS-1123 label.
    pub name: String,
    /// Name of its class.
    pub machine_class: String,
    /// Labels.
    #[schema(value_type = std::collections::HashMap<String, String>)]
    pub labels: Labels,
    /// Lifecycle state.
    pub state: MachineState,
    /// The most recent error, cleared on progress.
    pub last_error: Option<LastError>,
    /// Tenant holding it, when allocated.
    pub tenant_id: Option<TenantId>,
    /// Cluster holding it, when allocated.
    pub cluster_id: Option<ClusterId>,
    /// Node pool holding it, when allocated.
    pub node_pool_id: Option<NodePoolId>,
    /// Kubernetes node name in the tenant cluster.
    pub node_name: Option<String>,
    /// System UUID read from the BMC.
    pub system_uuid: Option<String>,
    /// Inventory read from the BMC (`unverified` where the BMC does not report it).
    #[schema(value_type = Object)]
    pub inventory: serde_json::Value,
    /// The reason given when it entered maintenance.
    pub maintenance_reason: Option<String>,
    /// Its health as its newest report says it (any source); null when none was ever recorded.
    pub health: Option<crate::health::MachineHealth>,
    /// BMC access, without the password.
    pub bmc: BmcView,
    /// Bumped by every spec change.
    pub generation: i64,
    /// `"<generation>"`, also the `ETag` header.
    pub etag: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// A 202 answer about a machine: the machine and the operation that follows the change.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MachineAccepted {
    /// The machine as it is now.
    pub machine: MachineView,
    /// The operation to follow.
    pub operation: OperationView,
}

impl std::fmt::Debug for BmcCreate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BmcCreate")
            .field("url", &self.url)
            .field("system_id", &self.system_id)
            .field("username", &self.username)
            .field("password", &"[redacted]")
            .field("insecure_tls", &self.insecure_tls)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for BmcUpdate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BmcUpdate")
            .field("url", &self.url)
            .field("system_id", &self.system_id)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .field("insecure_tls", &self.insecure_tls)
            .finish_non_exhaustive()
    }
}

/// Filters of the machine list.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MachineFilter {
    /// Only this state; without it, every state but `retired`.
    pub state: Option<MachineState>,
    /// Only this class (by name).
    pub machine_class: Option<String>,
    /// Only machines held by this tenant.
    pub tenant_id: Option<TenantId>,
}
