//! Tenants: the provider's customers.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Labels, TenantId};

/// Whether a tenant may change its own objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TenantState {
    /// Normal operation.
    Active,
    /// The tenant's own writes are refused with 409; its clusters keep running.
    Suspended,
}

impl TenantState {
    /// The stored and wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Suspended => "suspended",
        }
    }
}

/// Limits on what a tenant may request; null means unlimited. Checked against desired counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Quotas {
    /// Most clusters the tenant may have.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 1000000)]
    pub max_clusters: Option<u32>,
    /// Most nodes over all of the tenant's node pools.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 1000000)]
    pub max_nodes: Option<u32>,
    /// Most GPUs over all of the tenant's node pools.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 1000000)]
    pub max_gpus: Option<u32>,
}

/// What a tenant uses of its [`Quotas`]: the same desired counts the quotas are checked against
/// (live clusters not being deleted, and their live pools' node and GPU counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QuotaUse {
    /// Clusters, against `quotas.max_clusters`.
    pub clusters: u64,
    /// Nodes over all node pools, against `quotas.max_nodes`.
    pub nodes: u64,
    /// GPUs over all node pools, against `quotas.max_gpus`.
    pub gpus: u64,
}

/// Body of `POST /v1/tenants`; also the spec a merge patch is applied to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "acme", "display_name": "Acme Research", "labels": {"billing-account": "a-1042"}, "quotas": {"max_clusters": 4, "max_nodes": 64, "max_gpus": 512}}))]
pub struct TenantCreate {
    /// Unique DNS-1123 label.
    #[schema(min_length = 1, max_length = 40, pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
    pub name: String,
    /// Human-readable name; defaults to `name`.
    #[serde(default)]
    #[schema(max_length = 200)]
    pub display_name: String,
    /// Free-form labels (Kubernetes label syntax).
    #[serde(default)]
    #[schema(value_type = std::collections::HashMap<String, String>)]
    pub labels: Labels,
    /// Quotas; all unlimited by default.
    #[serde(default)]
    pub quotas: Quotas,
}

/// Body of `PATCH /v1/tenants/{tenant_id}` (JSON merge patch). `name` cannot change.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"display_name": "Acme Research Ltd", "quotas": {"max_gpus": 1024}, "labels": {"billing-account": null}}))]
pub struct TenantUpdate {
    /// New display name; null resets it to the name.
    #[schema(max_length = 200)]
    pub display_name: Option<String>,
    /// Labels to set; a null value removes that label.
    #[schema(value_type = Option<std::collections::HashMap<String, Option<String>>>)]
    pub labels: Option<serde_json::Value>,
    /// Quotas to change; a null value means unlimited.
    pub quotas: Option<Quotas>,
}

/// A tenant as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantView {
    /// Id.
    pub id: TenantId,
    /// Unique DNS-1123 label.
    pub name: String,
    /// Human-readable name.
    pub display_name: String,
    /// Labels.
    #[schema(value_type = std::collections::HashMap<String, String>)]
    pub labels: Labels,
    /// Quotas.
    pub quotas: Quotas,
    /// What it uses of its quotas now.
    pub quota_use: QuotaUse,
    /// `active` or `suspended`.
    pub state: TenantState,
    /// Bumped by every spec change.
    pub generation: i64,
    /// `"<generation>"`, also the `ETag` header.
    pub etag: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}
