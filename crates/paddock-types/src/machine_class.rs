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
    /// Bumped by every spec change.
    pub generation: i64,
    /// `"<generation>"`, also the `ETag` header.
    pub etag: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}
