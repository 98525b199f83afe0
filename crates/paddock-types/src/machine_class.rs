//! Machine classes: hardware profiles that node pools ask for.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::MachineClassId;

/// Body of `POST /v1/machine-classes`; also the spec a merge patch is applied to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "gpu-h100x8", "cpu_cores": 192, "memory_gib": 2048, "gpu_model": "NVIDIA H100 80GB HBM3", "gpu_count": 8, "description": "8x H100 SXM, 3.2 Tb/s", "price": {"currency": "USD", "node_hour": "24.00"}}))]
pub struct MachineClassCreate {
    /// Unique DNS-1123 label.
    #[schema(min_length = 1, max_length = 63, pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
    pub name: String,
    /// CPU cores.
    #[schema(minimum = 1, maximum = 65536)]
    pub cpu_cores: u32,
    /// Memory in GiB.
    #[schema(minimum = 1, maximum = 1048576)]
    pub memory_gib: u32,
    /// GPU model, empty when the class has no GPU.
    #[serde(default)]
    #[schema(max_length = 100)]
    pub gpu_model: String,
    /// GPUs per machine.
    #[schema(minimum = 0, maximum = 64)]
    pub gpu_count: u32,
    /// Free text.
    #[serde(default)]
    #[schema(max_length = 1000)]
    pub description: String,
    /// List price used by the FOCUS export; null: none (the FOCUS export then answers 409).
    #[serde(default)]
    pub price: Option<MachineClassPrice>,
    /// The acceptance image a machine of the class boots after the wipe of its enrollment and
    /// of every return from maintenance, before it becomes `available` (docs/acceptance.md);
    /// null: none, the machine is available once wiped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptance: Option<MachineClassAcceptance>,
}

/// A machine class's acceptance image: booted through the BMC's virtual media in a run of its own
/// (with the run's seed, like the wipe), it checks the machine and reports; a failed or missing
/// report keeps the machine out of the fleet, in `maintenance` with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"image_url": "https://images.example.net/accept-h100-2026.12.iso", "image_sha256": "5d0c3f5e8a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5", "timeout_seconds": 14400}))]
pub struct MachineClassAcceptance {
    /// Where the BMC fetches the image (`https`).
    #[schema(
        min_length = 9,
        max_length = 2048,
        pattern = "^https://",
        example = "https://images.example.net/accept.iso"
    )]
    pub image_url: String,
    /// SHA-256 of the image (64 lower-case hex digits): a report naming another image fails the
    /// acceptance. It must differ from the wipe image's (`PADDOCK_WIPE_IMAGE_SHA256`).
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub image_sha256: String,
    /// How long the image may take from its boot to its report, in seconds (a GPU burn-in takes
    /// hours); no report by then fails the acceptance (`acceptance_timed_out`).
    #[serde(default = "default_acceptance_timeout")]
    #[schema(minimum = 60, maximum = 259200, default = 3600)]
    pub timeout_seconds: u32,
}

/// An acceptance's timeout when the class does not say: one hour.
pub const DEFAULT_ACCEPTANCE_TIMEOUT_SECONDS: u32 = 3600;

fn default_acceptance_timeout() -> u32 {
    DEFAULT_ACCEPTANCE_TIMEOUT_SECONDS
}

/// A machine class's list price per node hour. Every change is kept in a history: the FOCUS
/// export prices each row with the price in force at its `ChargePeriodStart`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MachineClassPrice {
    /// ISO 4217 code, e.g. `USD`.
    #[schema(pattern = "^[A-Z]{3}$", example = "USD")]
    pub currency: String,
    /// Price of one node hour, a decimal string with at most 6 places, e.g. `"2.75"`.
    #[schema(pattern = "^[0-9]{1,15}(\\.[0-9]{1,6})?$", example = "2.75")]
    pub node_hour: String,
}

/// Body of `PATCH /v1/machine-classes/{name}` (JSON merge patch). `name` cannot change, and the
/// hardware fields cannot change while machines of the class are enrolled.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"description": "8x H100 SXM", "price": {"currency": "USD", "node_hour": "22.50"}}))]
pub struct MachineClassUpdate {
    /// CPU cores.
    #[schema(minimum = 1, maximum = 65536)]
    pub cpu_cores: Option<u32>,
    /// Memory in GiB.
    #[schema(minimum = 1, maximum = 1048576)]
    pub memory_gib: Option<u32>,
    /// GPU model.
    #[schema(max_length = 100)]
    pub gpu_model: Option<String>,
    /// GPUs per machine.
    #[schema(minimum = 0, maximum = 64)]
    pub gpu_count: Option<u32>,
    /// Free text.
    #[schema(max_length = 1000)]
    pub description: Option<String>,
    /// The list price (null removes it; a change is audited and kept in the price history).
    pub price: Option<MachineClassPrice>,
    /// The acceptance image (null removes it). A change applies to the runs that start after it.
    pub acceptance: Option<MachineClassAcceptance>,
}

/// A machine class as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MachineClassView {
    /// Id.
    pub id: MachineClassId,
    /// Unique DNS-1123 label.
    pub name: String,
    /// CPU cores.
    pub cpu_cores: u32,
    /// Memory in GiB.
    pub memory_gib: u32,
    /// GPU model, empty when none.
    pub gpu_model: String,
    /// GPUs per machine.
    pub gpu_count: u32,
    /// Free text.
    pub description: String,
    /// List price, if any.
    pub price: Option<MachineClassPrice>,
    /// The acceptance image, if any.
    pub acceptance: Option<MachineClassAcceptance>,
    /// Bumped by every spec change.
    pub generation: i64,
    /// `"<generation>"`, also the `ETag` header.
    pub etag: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}
