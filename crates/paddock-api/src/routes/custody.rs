//! `/v1/custody/checkpoint` and `/v1/custody/verify`: signed heads of every machine's custody
//! chain, and the check that the chains still reach them (docs/api.md, docs/security.md).

use axum::extract::State;
use axum::response::Response;
use paddock_types::custody::{CustodyCheckpoint, CustodyVerification, CustodyVerify};
use paddock_types::problem::Problem;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::respond;
use crate::state::AppState;

/// Issues a signed checkpoint of every machine's custody chain.
///
/// Every machine's chain head (`seq` and MAC of its newest entry), signed
/// with the provider's Ed25519 key (`PADDOCK_USAGE_SIGNING_KEY`, public key at
/// `GET /v1/usage/signing-key`), for the provider to archive outside the database. Each one
/// issued is recorded; the isolation report names the latest. 409 `signing_key_missing` without
/// a signing key.
#[utoipa::path(get, path = "/v1/custody/checkpoint", operation_id = "custody_checkpoint_view", tag = "machines",
    responses(
        (status = 200, description = "The signed checkpoint", body = CustodyCheckpoint),
        (status = "default", description = "Problem", body = Problem, content_type = "application/problem+json")),
    security(("bearer" = [])))]
pub async fn custody_checkpoint_view(State(s): State<AppState>, Caller(ctx): Caller) -> Result<Response, ApiError> {
    Ok(respond::ok(&s.services.custody_checkpoint(&ctx).await?))
}

/// Verifies the ledger against an archived checkpoint.
///
/// Per machine, whether its chain still
/// reaches the checkpointed head and verifies as a whole, so a truncated tail or a restored older
/// copy of the ledger is found. A checkpoint not signed by this paddock's key is 422.
#[utoipa::path(post, path = "/v1/custody/verify", operation_id = "custody_verify", tag = "machines",
    request_body = CustodyVerify,
    responses(
        (status = 200, description = "The verification, per machine", body = CustodyVerification),
        (status = "default", description = "Problem", body = Problem, content_type = "application/problem+json")),
    security(("bearer" = [])))]
pub async fn custody_verify(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    Ok(respond::ok(&s.services.custody_verify(&ctx, &body).await?))
}
