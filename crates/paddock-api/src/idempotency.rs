//! The `Idempotency-Key` middleware for `POST`. The first request with a key runs to completion
//! in its own task (even when the client goes away), and its answer is stored, in the transaction
//! of the request's effect, and replayed; a server error releases the key (and rolls the effect
//! back) so that a retry runs again.

use axum::body::{to_bytes, Body};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderName, HeaderValue, Method, StatusCode};
use paddock_service::idempotency::{key_scope, Claim, DeferredCommit, IdemKey, StoredResponse, KEY_RENEWAL};
use sha2::{Digest, Sha256};

use crate::auth::Authn;
use crate::context;
use crate::error::ApiError;
use crate::extract::BODY_LIMIT;
use crate::state::AppState;

/// The request header.
pub static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// Headers of a stored answer that are replayed.
const REPLAYED_HEADERS: [HeaderName; 3] = [header::CONTENT_TYPE, header::LOCATION, header::ETAG];

/// Whether a request is one [`idempotency`] applies to: a `POST` with an `Idempotency-Key`.
pub fn applies(req: &Request) -> bool {
    req.method() == Method::POST && req.headers().contains_key(&IDEMPOTENCY_KEY)
}

/// Honours the idempotency key of a request it [`applies`] to (a step of the `/v1` routes'
/// middleware): validates the key, then runs the request once per key and replays its answer.
pub async fn idempotency(state: &AppState, req: Request, next: Next) -> Response {
    let key = req.headers().get(&IDEMPOTENCY_KEY).and_then(|k| k.to_str().ok());
    let Some(key) = key.filter(|k| !k.is_empty() && k.len() <= 255 && k.bytes().all(|b| b.is_ascii_graphic())) else {
        return ApiError::Domain(paddock_domain::Error::BadRequest {
            code: "invalid_idempotency_key",
            message: "Idempotency-Key must be 1 to 255 visible ASCII characters".to_owned(),
        })
        .into_response();
    };
    // Unauthenticated requests get their 401 from the handler; nothing to scope a key by.
    let Some(Authn::Caller(actor)) = req.extensions().get::<Authn>() else {
        return next.run(req).await;
    };
    let scope = key_scope(actor, req.method().as_str(), req.uri().path(), key);
    let (parts, body) = req.into_parts();
    let Ok(bytes) = to_bytes(body, BODY_LIMIT).await else {
        return ApiError::Domain(paddock_domain::Error::PayloadTooLarge { limit: BODY_LIMIT }).into_response();
    };
    let hash = Sha256::digest(&bytes);
    let services = &state.services;
    match services.idempotency_claim(&scope, &hash).await {
        Err(e) => ApiError::from(e).into_response(),
        Ok(Claim::Mismatch) => ApiError::IdempotencyMismatch.into_response(),
        Ok(Claim::InFlight) => ApiError::IdempotencyInFlight.into_response(),
        Ok(Claim::Replay(stored)) => replay(stored),
        Ok(Claim::Claimed(holder)) => {
            let mut req = Request::from_parts(parts, Body::from(bytes));
            let deferred = DeferredCommit::new(&context::ids().0);
            req.extensions_mut().insert(deferred.clone());
            let run = tokio::spawn(context::scope(context::current(), next.run(req)));
            let response = match holding(state, &scope, holder, run).await {
                Ok(response) => response,
                Err(e) => ApiError::Domain(paddock_domain::Error::internal(e)).into_response(),
            };
            answer(state, &scope, holder, &deferred, response).await
        }
    }
}

/// Records the first answer to a key and gives it back: a server error releases the key (and
/// rolls back a write left open); any other answer is written in the transaction the request's
/// write left open, and that commit is what makes the answer true, so when it fails the client
/// gets the failure instead (see `paddock_service::idempotency`).
async fn answer(
    state: &AppState,
    scope: &IdemKey,
    holder: uuid::Uuid,
    deferred: &DeferredCommit,
    response: Response,
) -> Response {
    let services = &state.services;
    let (parts, body) = response.into_parts();
    let body = match to_bytes(body, usize::MAX).await {
        Ok(body) => body,
        Err(e) => {
            let _ = services.idempotency_release(scope, holder, deferred).await;
            return ApiError::Domain(paddock_domain::Error::internal(e)).into_response();
        }
    };
    if parts.status.is_server_error() {
        if let Err(e) = services.idempotency_release(scope, holder, deferred).await {
            tracing::warn!(error = &e as &dyn std::error::Error, "could not release an idempotency key");
        }
        return Response::from_parts(parts, Body::from(body));
    }
    let headers: serde_json::Map<String, serde_json::Value> = REPLAYED_HEADERS
        .iter()
        .filter_map(|name| {
            let value = parts.headers.get(name)?.to_str().ok()?;
            Some((name.as_str().to_owned(), value.into()))
        })
        .collect();
    let stored = StoredResponse {
        response_status: i32::from(parts.status.as_u16()),
        response_headers: headers.into(),
        response_body: body.to_vec(),
    };
    let effect = deferred.is_pending();
    match services.idempotency_complete(scope, holder, &stored, deferred).await {
        Ok(true) => {}
        // The key was taken over (this request outlived its lease): the retry that holds it now
        // makes the change; this one's was rolled back.
        Ok(false) if effect => return ApiError::IdempotencyInFlight.into_response(),
        Err(e) if effect => {
            // Nothing was committed: the key goes back, and the client learns the request failed.
            let _ = services.idempotency_release(scope, holder, deferred).await;
            return ApiError::from(e).into_response();
        }
        // The request changed nothing; a retry runs it again.
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(error = &e as &dyn std::error::Error, "could not record the idempotent response");
        }
    }
    Response::from_parts(parts, Body::from(body))
}

/// Awaits the request's run, renewing the key's lease every [`KEY_RENEWAL`] meanwhile (a failed
/// renewal is retried at the next tick; the lease outlasts two of them).
async fn holding(
    state: &AppState,
    scope: &IdemKey,
    holder: uuid::Uuid,
    mut run: tokio::task::JoinHandle<Response>,
) -> Result<Response, tokio::task::JoinError> {
    let mut tick = tokio::time::interval(KEY_RENEWAL);
    tick.tick().await;
    loop {
        tokio::select! {
            done = &mut run => return done,
            _ = tick.tick() => {
                if let Err(e) = state.services.idempotency_renew(scope, holder).await {
                    tracing::warn!(error = &e as &dyn std::error::Error, "could not renew an idempotency key's lease");
                }
            }
        }
    }
}

fn replay(stored: StoredResponse) -> Response {
    let status =
        u16::try_from(stored.response_status).ok().and_then(|s| StatusCode::from_u16(s).ok()).unwrap_or(StatusCode::OK);
    let mut response = (status, stored.response_body).into_response();
    if let Some(headers) = stored.response_headers.as_object() {
        for (name, value) in headers {
            if let (Ok(name), Some(Ok(value))) =
                (HeaderName::try_from(name.as_str()), value.as_str().map(HeaderValue::from_str))
            {
                response.headers_mut().insert(name, value);
            }
        }
    }
    response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
    response
}
