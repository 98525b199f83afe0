//! Idempotency keys: the first response to a key is stored and replayed for 24 hours. A key in
//! flight is held under a lease (renewed by its request while it runs) and taken over when the
//! lease has run out: its process died.

use std::time::Duration;

use uuid::Uuid;

use crate::{Conn, StoreError};

/// The scope of a key: (subject, tenant, method, path, key).
#[derive(Debug, Clone)]
pub struct IdemKey {
    /// Caller subject.
    pub subject: String,
    /// Caller tenant, nil for provider tokens.
    pub tenant_scope: Uuid,
    /// HTTP method.
    pub method: String,
    /// Request path.
    pub path: String,
    /// The `Idempotency-Key` header.
    pub key: String,
}

/// Binds a key's scope as `$1` to `$5` (subject, tenant, method, path, key): every statement
/// here names the key this way.
macro_rules! bind_key {
    ($query:expr, $key:expr) => {
        $query.bind(&$key.subject).bind($key.tenant_scope).bind(&$key.method).bind(&$key.path).bind(&$key.key)
    };
}

/// A stored response.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StoredResponse {
    /// Status code.
    pub response_status: i32,
    /// Headers worth replaying (content type, location, etag).
    pub response_headers: serde_json::Value,
    /// Body bytes.
    pub response_body: Vec<u8>,
}

/// What a claim found.
#[derive(Debug)]
pub enum Claim {
    /// This request owns the key now, as this holder: run it, [`renew`] the lease while it
    /// runs, then [`complete`] or [`release`].
    Claimed(Uuid),
    /// The key was used with the same body: replay this response.
    Replay(StoredResponse),
    /// The first request with this key is still running.
    InFlight,
    /// The key was used with another body.
    Mismatch,
}

#[derive(sqlx::FromRow)]
struct KeyRow {
    request_hash: Vec<u8>,
    response_status: Option<i32>,
    response_headers: Option<serde_json::Value>,
    response_body: Option<Vec<u8>>,
}

/// Claims a key for a request whose body hashes to `hash`, leased for `lease`. Keys older than
/// 24 h are forgotten, and so is a use still in flight whose lease ran out (its process died).
pub async fn claim(conn: &mut Conn, key: &IdemKey, hash: &[u8], lease: Duration) -> Result<Claim, StoreError> {
    // Forget an expired or abandoned use of this key first, so the insert below can claim it anew.
    bind_key!(
        sqlx::query(
            "delete from idempotency_keys where subject = $1 and tenant_scope = $2 and method = $3 \
         and path = $4 and key = $5 and (created_at < now() - interval '24 hours' \
           or (response_status is null and lease_until < clock_timestamp()))",
        ),
        key
    )
    .execute(&mut *conn)
    .await?;
    let holder = Uuid::now_v7();
    let inserted = bind_key!(sqlx::query(
        "insert into idempotency_keys (subject, tenant_scope, method, path, key, request_hash, holder, lease_until) \
         values ($1, $2, $3, $4, $5, $6, $7, clock_timestamp() + $8 * interval '1 millisecond') \
         on conflict do nothing",
    ), key)
    .bind(hash)
    .bind(holder)
    .bind(millis(lease))
    .execute(&mut *conn)
    .await?;
    if inserted.rows_affected() == 1 {
        return Ok(Claim::Claimed(holder));
    }
    let row: Option<KeyRow> = bind_key!(
        sqlx::query_as(
            "select request_hash, response_status, response_headers, response_body from idempotency_keys \
         where subject = $1 and tenant_scope = $2 and method = $3 and path = $4 and key = $5",
        ),
        key
    )
    .fetch_optional(conn)
    .await?;
    Ok(match row {
        // Released between our insert and select: the caller may simply retry.
        None => Claim::InFlight,
        Some(r) if r.request_hash != hash => Claim::Mismatch,
        Some(KeyRow {
            response_status: Some(response_status),
            response_headers: Some(response_headers),
            response_body: Some(response_body),
            ..
        }) => Claim::Replay(StoredResponse { response_status, response_headers, response_body }),
        Some(_) => Claim::InFlight,
    })
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Extends the lease of a key `holder` still holds; false when it lost the key (taken over).
pub async fn renew(conn: &mut Conn, key: &IdemKey, holder: Uuid, lease: Duration) -> Result<bool, StoreError> {
    let renewed = bind_key!(
        sqlx::query(
            "update idempotency_keys set lease_until = clock_timestamp() + $7 * interval '1 millisecond' \
         where subject = $1 and tenant_scope = $2 and method = $3 and path = $4 and key = $5 \
           and holder = $6 and response_status is null",
        ),
        key
    )
    .bind(holder)
    .bind(millis(lease))
    .execute(conn)
    .await?;
    Ok(renewed.rows_affected() == 1)
}

/// Stores the response of a key `holder` claimed; false (nothing stored) when it lost the key
/// meanwhile. Run in the transaction of the request's effect, it commits with it.
pub async fn complete(
    conn: &mut Conn,
    key: &IdemKey,
    holder: Uuid,
    response: &StoredResponse,
) -> Result<bool, StoreError> {
    let done = bind_key!(
        sqlx::query(
            "update idempotency_keys set response_status = $7, response_headers = $8, response_body = $9, \
         completed_at = now() where subject = $1 and tenant_scope = $2 and method = $3 and path = $4 and key = $5 \
         and holder = $6",
        ),
        key
    )
    .bind(holder)
    .bind(response.response_status)
    .bind(&response.response_headers)
    .bind(&response.response_body)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Releases a key `holder` claimed, without a response (the request failed with a server
/// error), so a retry with the same key runs again.
pub async fn release(conn: &mut Conn, key: &IdemKey, holder: Uuid) -> Result<(), StoreError> {
    bind_key!(
        sqlx::query(
            "delete from idempotency_keys where subject = $1 and tenant_scope = $2 and method = $3 \
         and path = $4 and key = $5 and holder = $6 and response_status is null",
        ),
        key
    )
    .bind(holder)
    .execute(conn)
    .await?;
    Ok(())
}

/// Deletes keys older than 24 hours; returns how many.
pub async fn purge_expired(conn: &mut Conn) -> Result<u64, StoreError> {
    let done = sqlx::query("delete from idempotency_keys where created_at < now() - interval '24 hours'")
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}
