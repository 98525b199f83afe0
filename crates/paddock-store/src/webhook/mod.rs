//! Webhook subscriptions (table `webhook_subscriptions`), and in `delivery` the queue of their
//! deliveries. The events themselves are written by triggers (migration
//! `20261206100000_create_webhooks.sql`) in the transaction of the change that causes them.

use chrono::{DateTime, Utc};
use paddock_types::webhook::{WebhookCreate, WebhookView};
use paddock_types::{TenantId, WebhookId};
use uuid::Uuid;

use crate::{Conn, StoreError};

pub mod delivery;

/// A subscription as stored, with its sealed secrets.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct WebhookRow {
    /// Id.
    pub id: Uuid,
    /// Owning tenant; `None` for the provider's.
    pub tenant_id: Option<Uuid>,
    /// Receiver URL.
    pub url: String,
    /// Event names.
    pub events: Vec<String>,
    /// Free text.
    pub description: String,
    /// Delivering or not.
    pub enabled: bool,
    /// Why paddock disabled it.
    pub disabled_reason: Option<String>,
    /// The current secret, sealed.
    pub secret_enc: Vec<u8>,
    /// The secret before the last rotation, sealed.
    pub previous_secret_enc: Option<Vec<u8>>,
    /// Until when the previous secret signs.
    pub previous_secret_until: Option<DateTime<Utc>>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Changed.
    pub updated_at: DateTime<Utc>,
}

impl WebhookRow {
    /// The view (no secret).
    pub fn view(&self) -> WebhookView {
        WebhookView {
            id: WebhookId(self.id),
            tenant_id: self.tenant_id.map(TenantId),
            url: self.url.clone(),
            events: self.events.clone(),
            description: self.description.clone(),
            enabled: self.enabled,
            disabled_reason: self.disabled_reason.clone(),
            previous_secret_expires_at: self.previous_secret_until.filter(|until| *until > Utc::now()),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

const COLUMNS: &str = "id, tenant_id, url, events, description, enabled, disabled_reason, secret_enc, \
    previous_secret_enc, previous_secret_until, created_at, updated_at";

/// Inserts a subscription of `tenant` (`None`: the provider's) with its sealed secret.
pub async fn insert(
    conn: &mut Conn,
    tenant: Option<TenantId>,
    id: WebhookId,
    spec: &WebhookCreate,
    secret_enc: &[u8],
) -> Result<WebhookRow, StoreError> {
    Ok(sqlx::query_as(&format!(
        "insert into webhook_subscriptions (id, tenant_id, url, events, description, enabled, secret_enc) \
         values ($1, $2, $3, $4, $5, $6, $7) returning {COLUMNS}"
    ))
    .bind(id.uuid())
    .bind(tenant.map(TenantId::uuid))
    .bind(&spec.url)
    .bind(&spec.events)
    .bind(&spec.description)
    .bind(spec.enabled)
    .bind(secret_enc)
    .fetch_one(conn)
    .await?)
}

/// The subscriptions of `tenant` (`None`: the provider's), a page after `after`.
pub async fn list(
    conn: &mut Conn,
    tenant: Option<TenantId>,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<WebhookRow>, StoreError> {
    Ok(sqlx::query_as(&format!(
        "select {COLUMNS} from webhook_subscriptions \
         where tenant_id is not distinct from $1 and ($2::uuid is null or id > $2) \
         order by id limit $3"
    ))
    .bind(tenant.map(TenantId::uuid))
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(conn)
    .await?)
}

/// One subscription of `tenant` (`None`: the provider's), locked for update.
pub async fn get_for_update(
    conn: &mut Conn,
    tenant: Option<TenantId>,
    id: WebhookId,
) -> Result<Option<WebhookRow>, StoreError> {
    Ok(sqlx::query_as(&format!(
        "select {COLUMNS} from webhook_subscriptions where tenant_id is not distinct from $1 and id = $2 for update"
    ))
    .bind(tenant.map(TenantId::uuid))
    .bind(id.uuid())
    .fetch_optional(conn)
    .await?)
}

/// One subscription of `tenant` (`None`: the provider's).
pub async fn get(conn: &mut Conn, tenant: Option<TenantId>, id: WebhookId) -> Result<Option<WebhookRow>, StoreError> {
    Ok(sqlx::query_as(&format!(
        "select {COLUMNS} from webhook_subscriptions where tenant_id is not distinct from $1 and id = $2"
    ))
    .bind(tenant.map(TenantId::uuid))
    .bind(id.uuid())
    .fetch_optional(conn)
    .await?)
}

/// Writes a subscription's changed fields. Enabling clears the reason it was disabled and puts
/// the deliveries given up on back in the queue (they held their subjects' later events).
pub async fn update(conn: &mut Conn, id: WebhookId, spec: &WebhookCreate) -> Result<WebhookRow, StoreError> {
    sqlx::query(
        "update webhook_deliveries d set state = 'pending', next_attempt_at = now() \
         from webhook_subscriptions s \
         where s.id = $1 and d.subscription_id = s.id and $2 and not s.enabled and d.state = 'failed'",
    )
    .bind(id.uuid())
    .bind(spec.enabled)
    .execute(&mut *conn)
    .await?;
    Ok(sqlx::query_as(&format!(
        "update webhook_subscriptions set url = $2, events = $3, description = $4, enabled = $5, \
             disabled_reason = case when $5 then null else disabled_reason end, \
             generation = generation + 1, updated_at = now() \
         where id = $1 returning {COLUMNS}"
    ))
    .bind(id.uuid())
    .bind(&spec.url)
    .bind(&spec.events)
    .bind(&spec.description)
    .bind(spec.enabled)
    .fetch_one(conn)
    .await?)
}

/// Replaces the secret: the current one becomes the previous one, signing beside the new one
/// for `overlap`.
pub async fn rotate(
    conn: &mut Conn,
    id: WebhookId,
    secret_enc: &[u8],
    overlap: std::time::Duration,
) -> Result<WebhookRow, StoreError> {
    Ok(sqlx::query_as(&format!(
        "update webhook_subscriptions set previous_secret_enc = secret_enc, secret_enc = $2, \
             previous_secret_until = now() + $3 * interval '1 second', updated_at = now() \
         where id = $1 returning {COLUMNS}"
    ))
    .bind(id.uuid())
    .bind(secret_enc)
    .bind(i64::try_from(overlap.as_secs()).unwrap_or(i64::MAX))
    .fetch_one(conn)
    .await?)
}

/// Deletes a subscription and its deliveries.
pub async fn delete(conn: &mut Conn, id: WebhookId) -> Result<(), StoreError> {
    sqlx::query("delete from webhook_subscriptions where id = $1").bind(id.uuid()).execute(conn).await?;
    Ok(())
}

/// Writes `usage.period_closed` with `view` (`GET /v1/usage/periods/{period}` to the provider)
/// when this transaction inserted the period's row (a concurrent closer that lost the race writes
/// none), and some subscription wants it (`webhook_emit`). Returns whether the row was ours.
pub async fn emit_period_closed(conn: &mut Conn, period: &str, view: &serde_json::Value) -> Result<bool, StoreError> {
    let ours: bool = sqlx::query_scalar(
        "select exists (select 1 from usage_periods where period = $1 \
             and xmin::text::bigint = txid_current() % 4294967296)",
    )
    .bind(period)
    .fetch_one(&mut *conn)
    .await?;
    if ours {
        sqlx::query(
            "select webhook_emit('dev.paddock.usage.period_closed', '/v1/usage/periods/' || $1, null, $2, null)",
        )
        .bind(period)
        .bind(view)
        .execute(conn)
        .await?;
    }
    Ok(ours)
}
