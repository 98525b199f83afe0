//! Webhook subscriptions and their deliveries.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{TenantId, WebhookDeliveryId, WebhookId};

/// Body of `POST /v1/webhooks` and `POST /v1/tenants/{tenant_id}/webhooks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"url": "https://hooks.example.com/paddock", "events": ["cluster.ready", "operation.failed"]}))]
pub struct WebhookCreate {
    /// Where events are POSTed: `https` (plain `http` only when the provider allows it), never a
    /// loopback, private, link-local or reserved address.
    #[schema(max_length = 2048)]
    pub url: String,
    /// The events wanted, without the `dev.paddock.` prefix: `operation.succeeded`,
    /// `operation.failed`, `cluster.ready`, `cluster.degraded`, `cluster.deleted`,
    /// `node_pool.scaled`, `remediation.started`, `remediation.ended`, and for the provider
    /// `machine.state_changed`, `machine.quarantined`, `machine.health_reported`,
    /// `usage.period_closed`.
    #[schema(min_items = 1, max_items = 20)]
    pub events: Vec<String>,
    /// Free text.
    #[serde(default)]
    #[schema(max_length = 1000)]
    pub description: String,
    /// Whether events are delivered (default true).
    #[serde(default = "enabled_default")]
    pub enabled: bool,
}

fn enabled_default() -> bool {
    true
}

/// Body of `PATCH .../webhooks/{webhook_id}` (JSON merge patch). Enabling a disabled
/// subscription clears its `disabled_reason`; its held events are then delivered.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"enabled": true}))]
pub struct WebhookUpdate {
    /// Where events are POSTed.
    #[schema(max_length = 2048)]
    pub url: Option<String>,
    /// The events wanted.
    #[schema(min_items = 1, max_items = 20)]
    pub events: Option<Vec<String>>,
    /// Free text.
    #[schema(max_length = 1000)]
    pub description: Option<String>,
    /// Whether events are delivered.
    pub enabled: Option<bool>,
}

/// A webhook subscription as the API shows it (never its secret).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WebhookView {
    /// Id.
    pub id: WebhookId,
    /// The tenant whose events it receives; null for a provider subscription.
    pub tenant_id: Option<TenantId>,
    /// Where events are POSTed.
    pub url: String,
    /// The events wanted.
    pub events: Vec<String>,
    /// Free text.
    pub description: String,
    /// Whether events are delivered.
    pub enabled: bool,
    /// Why paddock disabled it (deliveries failed for 3 days, or the receiver answered 410).
    pub disabled_reason: Option<String>,
    /// When the secret before the last rotation stops signing.
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// A subscription with its signing secret: the answer of a creation and of a rotation, the only
/// times the secret is shown.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WebhookWithSecret {
    /// The subscription.
    #[serde(flatten)]
    pub webhook: WebhookView,
    /// `whsec_` and the base64 of 32 random bytes: the key of the `webhook-signature` HMAC.
    pub secret: String,
}

/// Where a delivery is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Not delivered yet (waiting for its turn, or for its next try).
    Pending,
    /// The receiver answered 2xx.
    Delivered,
    /// Given up: the subscription was disabled; a redelivery puts it back.
    Failed,
}

/// One try of a delivery.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeliveryAttempt {
    /// 1 for the first.
    pub attempt: i32,
    /// When it was made.
    pub at: DateTime<Utc>,
    /// The receiver's HTTP status; null when none came (refused address, timeout, connection).
    pub status: Option<i32>,
    /// How long it took, in milliseconds.
    pub latency_ms: i32,
    /// What went wrong, when it did.
    pub error: Option<String>,
}

/// One event's delivery to one subscription.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeliveryView {
    /// Id.
    pub id: WebhookDeliveryId,
    /// The event's id (CloudEvents `id`, also the `webhook-id` header).
    pub event_id: String,
    /// The event's type.
    pub event_type: String,
    /// The event's subject (the resource path).
    pub subject: String,
    /// Where it is.
    pub state: DeliveryState,
    /// Tries so far.
    pub attempts: i32,
    /// When the next try is due (pending ones).
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// The last answer's HTTP status.
    pub last_status: Option<i32>,
    /// The last try's latency in milliseconds.
    pub last_latency_ms: Option<i32>,
    /// The last error.
    pub last_error: Option<String>,
    /// When it was delivered.
    pub delivered_at: Option<DateTime<Utc>>,
    /// When the event was fanned out to the subscription.
    pub created_at: DateTime<Utc>,
    /// The tries, oldest first (the last 20).
    pub tries: Vec<DeliveryAttempt>,
}
