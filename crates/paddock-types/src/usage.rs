//! Usage (docs/billing.md): records clipped to a range, aggregates by window and group, billing
//! periods and adjustments. Seconds are exact integers; hours are derived decimal strings.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{ClusterId, MachineId, NodePoolId, TenantId};

/// What a usage record measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum UsageKind {
    /// A machine held by a node pool.
    Machine,
    /// A cluster's control plane.
    ControlPlane,
    /// A correction recorded by the provider.
    Adjustment,
}

impl UsageKind {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Machine => "machine",
            Self::ControlPlane => "control_plane",
            Self::Adjustment => "adjustment",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Machine, Self::ControlPlane, Self::Adjustment].into_iter().find(|k| k.as_str() == s)
    }
}

/// What an adjustment is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AdjustmentCategory {
    /// A correction of recorded usage (the default).
    #[default]
    Correction,
    /// Seconds given back to the tenant: written by paddock for a machine that failed while the
    /// tenant held it (provider-side evidence only, see docs/billing.md), or granted by the
    /// provider. A FOCUS `Credit` row.
    Credit,
}

impl AdjustmentCategory {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Correction => "correction",
            Self::Credit => "credit",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Correction, Self::Credit].into_iter().find(|c| c.as_str() == s)
    }
}

/// One usage record, clipped to the queried range (and to `as_of` while open).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UsageRecord {
    /// The segment's (or adjustment's) id.
    pub id: uuid::Uuid,
    /// What it measures.
    pub kind: UsageKind,
    /// The tenant billed.
    pub tenant_id: TenantId,
    /// The cluster (null only for an adjustment without one).
    pub cluster_id: Option<ClusterId>,
    /// The node pool (machine records; adjustments that name one).
    pub node_pool_id: Option<NodePoolId>,
    /// The machine (machine records; adjustments that name one).
    pub machine_id: Option<MachineId>,
    /// The machine class's name (machine records and adjustments).
    pub machine_class: Option<String>,
    /// GPUs per machine of the class when the segment opened.
    #[schema(minimum = 0)]
    pub gpu_count: i32,
    /// Clipped start (an adjustment: when it was recorded).
    pub start: DateTime<Utc>,
    /// Clipped end, exclusive (an adjustment: equal to `start`).
    pub end: DateTime<Utc>,
    /// Machine seconds inside the range.
    pub node_seconds: i64,
    /// `node_seconds` × `gpu_count`.
    pub gpu_seconds: i64,
    /// Control-plane seconds inside the range.
    pub control_plane_seconds: i64,
    /// What an adjustment is (adjustments only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<AdjustmentCategory>,
}

/// A page of records with the snapshot they were read at.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageRecordPage {
    /// Records ordered by (start, id).
    pub items: Vec<UsageRecord>,
    /// Opaque cursor of the next page (it carries `as_of`), null at the end.
    pub next_cursor: Option<String>,
    /// The watermark the page was read at.
    pub as_of: DateTime<Utc>,
}

/// Sums of seconds, with derived hours.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UsageTotals {
    /// Machine seconds.
    pub node_seconds: i64,
    /// GPU seconds.
    pub gpu_seconds: i64,
    /// Control-plane seconds.
    pub control_plane_seconds: i64,
    /// `node_seconds / 3600`, 6 places, half-even.
    #[schema(example = "1.500000")]
    pub node_hours: String,
    /// `gpu_seconds / 3600`, 6 places, half-even.
    pub gpu_hours: String,
}

/// One window × group of an aggregate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UsageAggregateItem {
    /// Window start (UTC-aligned, clipped to the range).
    pub window_start: DateTime<Utc>,
    /// Window end, exclusive (clipped to the range).
    pub window_end: DateTime<Utc>,
    /// The group's tenant, when grouped by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<TenantId>,
    /// The group's cluster, when grouped by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<ClusterId>,
    /// The group's node pool, when grouped by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_pool_id: Option<NodePoolId>,
    /// The group's machine class, when grouped by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine_class: Option<String>,
    /// The sums of the group.
    #[serde(flatten)]
    pub totals: UsageTotals,
}

/// An aggregate: the groups, their totals and the snapshot.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageAggregate {
    /// Windows × groups ordered by window, then group.
    pub items: Vec<UsageAggregateItem>,
    /// The sums over every item.
    pub totals: UsageTotals,
    /// The watermark the aggregate was read at.
    pub as_of: DateTime<Utc>,
}

/// A correction, recorded in the open period (`POST /v1/usage/adjustments`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"tenant_id": "0193a9c4-5b7e-7c3d-9f21-4a8e6d2b1c07", "machine_class": "gpu-h100x8", "node_seconds": -3600, "gpu_seconds": -28800, "control_plane_seconds": 0, "corrects_period": "2026-11", "category": "credit", "reason": "credit for the 1 h outage of 2026-11-14 (INC-208)"}))]
pub struct UsageAdjustmentCreate {
    /// The tenant corrected.
    pub tenant_id: TenantId,
    /// The cluster, if the correction concerns one: one of the tenant's (422 otherwise).
    #[serde(default)]
    pub cluster_id: Option<ClusterId>,
    /// The node pool, if it concerns one: a pool of `cluster_id`, which it then requires (422
    /// otherwise).
    #[serde(default)]
    pub node_pool_id: Option<NodePoolId>,
    /// The machine, if it concerns one: a machine the tenant held (in `cluster_id` and
    /// `node_pool_id` when given; 422 otherwise).
    #[serde(default)]
    pub machine_id: Option<MachineId>,
    /// `correction` (default) or `credit` (a FOCUS `Credit` row).
    #[serde(default)]
    pub category: AdjustmentCategory,
    /// The machine class's name.
    #[schema(max_length = 63, pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
    pub machine_class: String,
    /// Signed machine seconds, at most 10^12 either way.
    #[schema(minimum = -1000000000000.0, maximum = 1000000000000.0)]
    pub node_seconds: i64,
    /// Signed GPU seconds, at most 10^12 either way.
    #[schema(minimum = -1000000000000.0, maximum = 1000000000000.0)]
    pub gpu_seconds: i64,
    /// Signed control-plane seconds, at most 10^12 either way.
    #[schema(minimum = -1000000000000.0, maximum = 1000000000000.0)]
    pub control_plane_seconds: i64,
    /// The period corrected (`YYYY-MM`), if any.
    #[serde(default)]
    #[schema(pattern = "^[0-9]{4}-(0[1-9]|1[0-2])$")]
    pub corrects_period: Option<String>,
    /// Why.
    #[schema(min_length = 1, max_length = 1000)]
    pub reason: String,
}

/// A recorded adjustment.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageAdjustmentView {
    /// Its id (also its record's id).
    pub id: uuid::Uuid,
    /// The tenant corrected.
    pub tenant_id: TenantId,
    /// The cluster, if any.
    pub cluster_id: Option<ClusterId>,
    /// The node pool, if any.
    pub node_pool_id: Option<NodePoolId>,
    /// The machine, if any.
    pub machine_id: Option<MachineId>,
    /// What it is.
    pub category: AdjustmentCategory,
    /// The remediation a credit paddock wrote is for (null for the provider's adjustments).
    pub remediation_id: Option<uuid::Uuid>,
    /// The machine class's name.
    pub machine_class: String,
    /// Signed machine seconds.
    pub node_seconds: i64,
    /// Signed GPU seconds.
    pub gpu_seconds: i64,
    /// Signed control-plane seconds.
    pub control_plane_seconds: i64,
    /// The period corrected, if any.
    pub corrects_period: Option<String>,
    /// Why.
    pub reason: String,
    /// When it was recorded (the open period it lands in).
    pub recorded_at: DateTime<Utc>,
}

/// A billing period's state.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsagePeriodView {
    /// `YYYY-MM`.
    pub period: String,
    /// First second of the month (UTC).
    pub start: DateTime<Utc>,
    /// First second of the next month, exclusive.
    pub end: DateTime<Utc>,
    /// `open`, or `closed` once its manifest is signed.
    #[schema(example = "closed")]
    pub state: String,
    /// The earliest time it may be closed (end + `PADDOCK_USAGE_CLOSE_GRACE`).
    pub closable_at: DateTime<Utc>,
    /// The signed manifest, once closed.
    pub closed: Option<UsagePeriodClosed>,
}

/// A closed period's signed manifest.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsagePeriodClosed {
    /// The manifest (`version` 2: row count, totals per tenant and class, `prices`: every list
    /// price in force during the period as `{machine_class, effective_from, currency, node_hour}`,
    /// with which its FOCUS export is priced, and the SHA-256 of the canonical NDJSON export at
    /// the closing watermark).
    #[schema(value_type = Object)]
    pub manifest: serde_json::Value,
    /// Ed25519 signature over the manifest's RFC 8785 canonical JSON, base64.
    pub signature: String,
    /// The signing key's id (see `GET /v1/usage/signing-key`).
    pub key_id: String,
}

/// The provider's published verification key(s).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageSigningKeys {
    /// The keys, the current one first.
    pub keys: Vec<UsageSigningKey>,
}

/// One verification key.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageSigningKey {
    /// Key id, as in `key_id` of a signature.
    pub key_id: String,
    /// `Ed25519`.
    pub algorithm: String,
    /// The raw 32-byte public key, standard base64.
    pub public_key: String,
    /// The SubjectPublicKeyInfo PEM (`openssl pkeyutl -verify -pubin -inkey`).
    pub public_key_pem: String,
}
