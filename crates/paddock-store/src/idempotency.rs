//! Idempotency keys: the first response to a key is stored and replayed for 24 hours.

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
    /// This request owns the key now; run it and then `complete` or `release`.
    Claimed,
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

/// Claims a key for a request whose body hashes to `hash`. Keys older than 24 h are forgotten.
pub async fn claim(conn: &mut Conn, key: &IdemKey, hash: &[u8]) -> Result<Claim, StoreError> {
    // Forget an expired use of this key first, so the insert below can claim it anew.
    sqlx::query(
        "delete from idempotency_keys where subject = $1 and tenant_scope = $2 and method = $3 \
         and path = $4 and key = $5 and created_at < now() - interval '24 hours'",
    )
    .bind(&key.subject)
    .bind(key.tenant_scope)
    .bind(&key.method)
    .bind(&key.path)
    .bind(&key.key)
    .execute(&mut *conn)
    .await?;
    let inserted = sqlx::query(
        "insert into idempotency_keys (subject, tenant_scope, method, path, key, request_hash) \
         values ($1, $2, $3, $4, $5, $6) on conflict do nothing",
    )
    .bind(&key.subject)
    .bind(key.tenant_scope)
    .bind(&key.method)
    .bind(&key.path)
    .bind(&key.key)
    .bind(hash)
    .execute(&mut *conn)
    .await?;
    if inserted.rows_affected() == 1 {
        return Ok(Claim::Claimed);
    }
    let row: Option<KeyRow> = sqlx::query_as(
        "select request_hash, response_status, response_headers, response_body from idempotency_keys \
         where subject = $1 and tenant_scope = $2 and method = $3 and path = $4 and key = $5",
    )
    .bind(&key.subject)
    .bind(key.tenant_scope)
    .bind(&key.method)
    .bind(&key.path)
    .bind(&key.key)
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

/// Stores the response of a claimed key.
pub async fn complete(conn: &mut Conn, key: &IdemKey, response: &StoredResponse) -> Result<(), StoreError> {
    sqlx::query(
        "update idempotency_keys set response_status = $6, response_headers = $7, response_body = $8, \
         completed_at = now() where subject = $1 and tenant_scope = $2 and method = $3 and path = $4 and key = $5",
    )
    .bind(&key.subject)
    .bind(key.tenant_scope)
    .bind(&key.method)
    .bind(&key.path)
    .bind(&key.key)
    .bind(response.response_status)
    .bind(&response.response_headers)
    .bind(&response.response_body)
    .execute(conn)
    .await?;
    Ok(())
}

/// Releases a claimed key without a response (the request failed with a server error), so a
/// retry with the same key runs again.
pub async fn release(conn: &mut Conn, key: &IdemKey) -> Result<(), StoreError> {
    sqlx::query(
        "delete from idempotency_keys where subject = $1 and tenant_scope = $2 and method = $3 \
         and path = $4 and key = $5 and response_status is null",
    )
    .bind(&key.subject)
    .bind(key.tenant_scope)
    .bind(&key.method)
    .bind(&key.path)
    .bind(&key.key)
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
