//! Bearer authentication. A middleware step verifies the token once per request and leaves the
//! result in the request's extensions: the `Caller` extractor turns it into the service context
//! (or a 401), and the idempotency step scopes keys by it.

use axum::extract::{FromRequestParts, Request};
use http::header;
use http::request::Parts;
use paddock_auth::Verifier;
use paddock_domain::Actor;
use paddock_service::idempotency::DeferredCommit;
use paddock_service::Ctx;
use paddock_types::TenantId;

use crate::context;
use crate::error::ApiError;

/// What authentication concluded about a request.
#[derive(Clone, Debug)]
pub enum Authn {
    /// A verified caller.
    Caller(Actor),
    /// No token, or a token that does not verify.
    Refused {
        /// Stable code.
        code: &'static str,
        /// Safe message.
        message: String,
        /// The refusal is on our side (keys unavailable): 503, not 401.
        server_side: bool,
    },
}

/// Verifies the request's bearer token, if any, and leaves the [`Authn`] in its extensions.
pub async fn identify(verifier: &Verifier, req: &mut Request) {
    // The agents' bearer is their run's agent token, not a JWT: their handlers read it.
    if req.uri().path().starts_with("/v1/agent/") {
        return;
    }
    let outcome = match bearer(req.headers().get(header::AUTHORIZATION)) {
        None => Authn::Refused {
            code: "missing_token",
            message: "this request needs an `Authorization: Bearer <token>` header".to_owned(),
            server_side: false,
        },
        Some(Err(())) => Authn::Refused {
            code: "invalid_token",
            message: "the Authorization header is not a Bearer token".to_owned(),
            server_side: false,
        },
        // A tenant's SCIM token is no JWT: the SCIM routes check it (`crate::scim::ScimAuth`).
        Some(Ok(token)) if token.starts_with(paddock_domain::scim::TOKEN_PREFIX) => Authn::Refused {
            code: "invalid_token",
            message: "a SCIM token is accepted only under /v1/tenants/{tenant_id}/scim/v2/".to_owned(),
            server_side: false,
        },
        Some(Ok(token)) => match verifier.verify(token).await {
            Ok(claims) => match Actor::from_claims(claims.sub, claims.roles, claims.tenant_id.map(TenantId)) {
                Ok(actor) => Authn::Caller(actor),
                Err(e) => Authn::Refused { code: "invalid_token", message: e.to_string(), server_side: false },
            },
            Err(e) => Authn::Refused { code: e.code(), message: e.to_string(), server_side: e.is_server_side() },
        },
    };
    req.extensions_mut().insert(outcome);
}

/// The token of an `Authorization: Bearer` header; `Err` for another scheme or garbage.
pub(crate) fn bearer(value: Option<&http::HeaderValue>) -> Option<Result<&str, ()>> {
    let value = value?.to_str().map_err(|_| ());
    Some(value.and_then(|v| {
        let (scheme, token) = v.split_once(' ').ok_or(())?;
        let token = token.trim();
        if scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() {
            Ok(token)
        } else {
            Err(())
        }
    }))
}

/// The authenticated caller of a handler.
#[derive(Debug, Clone)]
pub struct Caller(pub Ctx);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        // Taken, not cloned: the handler's one `Caller` is the last reader of the request's
        // authentication (the rate limit and the idempotency step read it before).
        match parts.extensions.remove::<Authn>() {
            Some(Authn::Caller(actor)) => {
                let (request_id, server_request_id) = context::ids();
                // Set by the idempotency step: the write leaves its transaction for the answer.
                let deferred_commit = parts.extensions.get::<DeferredCommit>().cloned();
                // Every authenticated route refuses what its query should not hold, also a route
                // that reads no parameter (`extract::Query`).
                crate::extract::check_query_of(parts)?;
                Ok(Caller(Ctx { actor, request_id, server_request_id, deferred_commit }))
            }
            Some(Authn::Refused { server_side: true, .. }) => {
                Err(ApiError::Domain(paddock_domain::Error::Unavailable(None)))
            }
            Some(Authn::Refused { code, message, .. }) => Err(ApiError::Unauthenticated { code, message }),
            None => Err(ApiError::Unauthenticated {
                code: "missing_token",
                message: "authentication is required".to_owned(),
            }),
        }
    }
}
