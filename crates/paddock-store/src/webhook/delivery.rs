//! The delivery queue: events fanned out to subscriptions, claimed under a lease with
//! `for update skip locked` (so several workers never hold the same delivery, and a dead
//! worker's claim expires), one subject at a time per subscription, in event order.

use std::time::Duration;

use chrono::{DateTime, Utc};
use paddock_types::webhook::{DeliveryAttempt, DeliveryState, DeliveryView};
use paddock_types::{WebhookDeliveryId, WebhookId};
use uuid::Uuid;

use crate::{Conn, StoreError};

/// How long after an event's fan-out its delivery is retried before the subscription is disabled.
pub const RETRY_WINDOW: Duration = Duration::from_secs(3 * 24 * 3600);

/// How long events (and their deliveries) are kept.
pub const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Fans up to `limit` new events out to the enabled subscriptions that want them: a provider
/// subscription gets every event it names; a tenant's only its tenant's events that tenants see.
/// One fan-out runs at a time (an advisory lock), in event order. Returns the events fanned out.
pub async fn fan_out(conn: &mut Conn, limit: u32) -> Result<u64, StoreError> {
    let done: i64 = sqlx::query_scalar(
        "with lock as (select pg_try_advisory_xact_lock(hashtext('paddock_webhook_fan_out')) as got), \
         ev as ( \
             select e.id, e.seq, e.type, e.subject, e.tenant_id, e.data_tenant is not null as shared \
             from webhook_events e, lock where lock.got and not e.fanned_out \
             order by e.seq limit $1 for update of e \
         ), ins as ( \
             insert into webhook_deliveries (id, subscription_id, event_id, event_seq, subject) \
             select gen_random_uuid(), s.id, ev.id, ev.seq, ev.subject \
             from ev join webhook_subscriptions s on s.enabled \
                 and substr(ev.type, 13) = any(s.events) \
                 and (s.tenant_id is null or (s.tenant_id = ev.tenant_id and ev.shared)) \
             on conflict do nothing \
         ), marked as ( \
             update webhook_events e set fanned_out = true from ev where e.id = ev.id returning 1 \
         ) \
         select count(*) from marked",
    )
    .bind(i64::from(limit))
    .fetch_one(conn)
    .await?;
    Ok(u64::try_from(done).unwrap_or(0))
}

/// When the next pending delivery whose time has not come yet comes due (a retry), if any.
pub async fn next_due(conn: &mut Conn) -> Result<Option<DateTime<Utc>>, StoreError> {
    Ok(sqlx::query_scalar(
        "select min(next_attempt_at) from webhook_deliveries where state = 'pending' and next_attempt_at > now()",
    )
    .fetch_one(conn)
    .await?)
}

/// Whether an event waits to be fanned out (a probe of the partial index of such events).
pub async fn new_events(conn: &mut Conn) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar("select exists (select 1 from webhook_events where not fanned_out)").fetch_one(conn).await?)
}

/// The work not done yet, for the metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Events not yet fanned out.
    pub unfanned_events: i64,
    /// Deliveries to enabled subscriptions not yet delivered (held ones included).
    pub pending_deliveries: i64,
    /// How long the oldest of them has waited (zero: none).
    pub oldest_pending: Duration,
}

/// Reads the [`Backlog`].
pub async fn backlog(conn: &mut Conn) -> Result<Backlog, StoreError> {
    let (unfanned_events, pending_deliveries, oldest_ms): (i64, i64, i64) = sqlx::query_as(
        "select (select count(*) from webhook_events where not fanned_out), count(d.id), \
             coalesce(extract(epoch from now() - min(d.created_at)) * 1000, 0)::bigint \
         from webhook_deliveries d join webhook_subscriptions s on s.id = d.subscription_id and s.enabled \
         where d.state = 'pending'",
    )
    .fetch_one(conn)
    .await?;
    let oldest_pending = Duration::from_millis(u64::try_from(oldest_ms).unwrap_or(0));
    Ok(Backlog { unfanned_events, pending_deliveries, oldest_pending })
}

/// A claimed delivery, with what its request needs.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Claimed {
    /// The delivery.
    pub id: Uuid,
    /// Tries before this one.
    pub attempts: i32,
    /// The event's id (`webhook-id`, CloudEvents `id`).
    pub event_id: Uuid,
    /// `dev.paddock.<name>`.
    pub event_type: String,
    /// The resource path.
    pub subject: String,
    /// When the event happened.
    pub time: DateTime<Utc>,
    /// The event's data as the subscription's audience sees it.
    pub data: serde_json::Value,
    /// The subscription.
    pub subscription_id: Uuid,
    /// Where to POST.
    pub url: String,
    /// The sealed current secret.
    pub secret_enc: Vec<u8>,
    /// The sealed previous secret, while it still signs.
    pub previous_secret_enc: Option<Vec<u8>>,
}

/// Claims up to `limit` due deliveries for `worker` under `lease`: of enabled subscriptions, each
/// the oldest undelivered event of its (subscription, subject), whose lease (if any) expired.
/// One statement, outside any transaction.
pub async fn claim(conn: &mut Conn, worker: &str, lease: Duration, limit: u32) -> Result<Vec<Claimed>, StoreError> {
    Ok(sqlx::query_as(
        "with picked as ( \
             select d.id from webhook_deliveries d \
             join webhook_subscriptions s on s.id = d.subscription_id and s.enabled \
             where d.state = 'pending' and d.next_attempt_at <= now() \
               and (d.locked_until is null or d.locked_until < now()) \
               and not exists (select 1 from webhook_deliveries p where p.subscription_id = d.subscription_id \
                   and p.subject = d.subject and p.event_seq < d.event_seq and p.state <> 'delivered') \
             order by d.next_attempt_at, d.event_seq limit $3 \
             for update of d skip locked \
         ), claimed as ( \
             update webhook_deliveries d set locked_by = $1, \
                 locked_until = clock_timestamp() + $2 * interval '1 millisecond' \
             from picked where d.id = picked.id \
             returning d.id, d.attempts, d.event_id, d.subscription_id \
         ) \
         select c.id, c.attempts, e.id as event_id, e.type as event_type, e.subject, e.occurred_at as time, \
             case when s.tenant_id is null then e.data_provider else e.data_tenant end as data, \
             s.id as subscription_id, s.url, s.secret_enc, \
             case when s.previous_secret_until > now() then s.previous_secret_enc end as previous_secret_enc \
         from claimed c join webhook_events e on e.id = c.event_id \
         join webhook_subscriptions s on s.id = c.subscription_id",
    )
    .bind(worker)
    .bind(millis(lease))
    .bind(i64::from(limit))
    .fetch_all(conn)
    .await?)
}

/// How one try ended.
#[derive(Debug, Clone)]
pub struct Tried {
    /// The receiver's status, if it answered.
    pub status: Option<u16>,
    /// How long the try took.
    pub latency: Duration,
    /// What went wrong (no answer, or not 2xx).
    pub error: Option<String>,
    /// The receiver answered 410 Gone: disable the subscription at once.
    pub gone: bool,
}

/// What [`record`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Delivered.
    Delivered,
    /// Tried again later.
    Retry,
    /// Given up: the subscription was disabled.
    Disabled,
    /// The worker no longer held the delivery: nothing was written.
    LeaseLost,
}

/// Records a try of a delivery `worker` holds: delivered (2xx), or back in the queue after an
/// exponential backoff from `base` (at most `cap`) with jitter, or, past the retry window or on a
/// 410, given up with the subscription disabled and the reason recorded.
pub async fn record(
    conn: &mut Conn,
    id: Uuid,
    worker: &str,
    tried: &Tried,
    base: Duration,
    cap: Duration,
) -> Result<Recorded, StoreError> {
    let ok = tried.error.is_none();
    let row: Option<(String,)> = sqlx::query_as(
        "with d0 as ( \
             select d.id, d.subscription_id, d.attempts, d.created_at from webhook_deliveries d \
             where d.id = $1 and d.locked_by = $2 and d.state = 'pending' for update \
         ), verdict as ( \
             select d0.*, case when $3 then 'delivered' \
                 when $7 or d0.created_at + $8 * interval '1 millisecond' < now() then 'failed' \
                 else 'pending' end as verdict_state from d0 \
         ), upd as ( \
             update webhook_deliveries d set state = v.verdict_state, attempts = d.attempts + 1, \
                 locked_by = null, locked_until = null, last_status = $4, last_latency_ms = $5, last_error = $6, \
                 delivered_at = case when v.verdict_state = 'delivered' then now() end, \
                 next_attempt_at = case when v.verdict_state = 'pending' then now() + \
                     least($10::float8, $9::float8 * power(2::float8, least(d.attempts, 40))) \
                     * (0.5 + random() * 0.5) * interval '1 millisecond' else d.next_attempt_at end \
             from verdict v where d.id = v.id returning v.verdict_state \
         ), tries as ( \
             insert into webhook_attempts (delivery_id, attempt, status, latency_ms, error) \
             select v.id, v.attempts + 1, $4, $5, $6 from verdict v \
         ), disabled as ( \
             update webhook_subscriptions s set enabled = false, updated_at = now(), \
                 disabled_reason = case when $7 then 'the receiver answered 410 Gone' \
                     else 'deliveries failed for 3 days; last error: ' || coalesce($6, '') end \
             from verdict v where s.id = v.subscription_id and v.verdict_state = 'failed' \
         ) \
         select verdict_state from upd",
    )
    .bind(id)
    .bind(worker)
    .bind(ok)
    .bind(tried.status.map(i32::from))
    .bind(i32::try_from(tried.latency.as_millis()).unwrap_or(i32::MAX))
    .bind(&tried.error)
    .bind(tried.gone)
    .bind(millis(RETRY_WINDOW))
    .bind(millis(base) as f64)
    .bind(millis(cap) as f64)
    .fetch_optional(conn)
    .await?;
    Ok(match row.as_ref().map(|(next,)| next.as_str()) {
        None => Recorded::LeaseLost,
        Some("delivered") => Recorded::Delivered,
        Some("failed") => Recorded::Disabled,
        Some(_) => Recorded::Retry,
    })
}

/// Deletes events (and their deliveries) older than [`RETENTION`].
pub async fn expire(conn: &mut Conn) -> Result<u64, StoreError> {
    let done = sqlx::query("delete from webhook_events where occurred_at < now() - $1 * interval '1 millisecond'")
        .bind(millis(RETENTION))
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}

#[derive(sqlx::FromRow)]
struct DeliveryRow {
    id: Uuid,
    event_id: Uuid,
    event_type: String,
    subject: String,
    state: String,
    attempts: i32,
    next_attempt_at: DateTime<Utc>,
    last_status: Option<i32>,
    last_latency_ms: Option<i32>,
    last_error: Option<String>,
    delivered_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    tries: serde_json::Value,
}

const DELIVERY_SELECT: &str = "select d.id, d.event_id, e.type as event_type, d.subject, d.state, d.attempts, \
     d.next_attempt_at, d.last_status, d.last_latency_ms, d.last_error, d.delivered_at, d.created_at, \
     coalesce((select jsonb_agg(jsonb_build_object('attempt', a.attempt, 'at', a.at, 'status', a.status, \
         'latency_ms', a.latency_ms, 'error', a.error) order by a.attempt) \
         from (select * from webhook_attempts a where a.delivery_id = d.id order by a.attempt desc limit 20) a), \
         '[]') as tries \
     from webhook_deliveries d join webhook_events e on e.id = d.event_id";

impl DeliveryRow {
    fn view(self) -> Result<DeliveryView, StoreError> {
        let state = match self.state.as_str() {
            "pending" => DeliveryState::Pending,
            "delivered" => DeliveryState::Delivered,
            "failed" => DeliveryState::Failed,
            other => return Err(StoreError::Corrupt(format!("unknown delivery state {other:?}"))),
        };
        let tries: Vec<DeliveryAttempt> = crate::from_json(self.tries)?;
        Ok(DeliveryView {
            id: WebhookDeliveryId(self.id),
            event_id: self.event_id.to_string(),
            event_type: self.event_type,
            subject: self.subject,
            state,
            attempts: self.attempts,
            next_attempt_at: (state == DeliveryState::Pending).then_some(self.next_attempt_at),
            last_status: self.last_status,
            last_latency_ms: self.last_latency_ms,
            last_error: self.last_error,
            delivered_at: self.delivered_at,
            created_at: self.created_at,
            tries,
        })
    }
}

/// The deliveries of a subscription, newest first, a page before `before`.
pub async fn list(
    conn: &mut Conn,
    subscription: WebhookId,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<DeliveryView>, StoreError> {
    let rows: Vec<DeliveryRow> = sqlx::query_as(&format!(
        "{DELIVERY_SELECT} where d.subscription_id = $1 and ($2::uuid is null or d.id > $2) \
         order by d.id limit $3"
    ))
    .bind(subscription.uuid())
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(conn)
    .await?;
    rows.into_iter().map(DeliveryRow::view).collect()
}

/// Puts a delivery of `subscription` back in the queue, due now; `None` when it has none of
/// that id.
pub async fn redeliver(
    conn: &mut Conn,
    subscription: WebhookId,
    id: WebhookDeliveryId,
) -> Result<Option<DeliveryView>, StoreError> {
    let found = sqlx::query(
        "update webhook_deliveries set state = 'pending', next_attempt_at = now(), delivered_at = null \
         where id = $1 and subscription_id = $2",
    )
    .bind(id.uuid())
    .bind(subscription.uuid())
    .execute(&mut *conn)
    .await?;
    if found.rows_affected() == 0 {
        return Ok(None);
    }
    let row: DeliveryRow =
        sqlx::query_as(&format!("{DELIVERY_SELECT} where d.id = $1")).bind(id.uuid()).fetch_one(conn).await?;
    row.view().map(Some)
}
