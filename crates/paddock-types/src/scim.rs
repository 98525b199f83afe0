//! A tenant's SCIM bearer tokens: what its identity provider authenticates with when it pushes
//! users and groups to `/v1/tenants/{tenant_id}/scim/v2/...`. The SCIM resources themselves are
//! SCIM's own JSON (RFC 7643), described by SCIM's discovery endpoints, not by these types.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{ScimTokenId, TenantId};

/// Body of `POST /v1/tenants/{tenant_id}/scim-tokens`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"description": "Okta provisioning"}))]
pub struct ScimTokenCreate {
    /// Free text: which identity provider holds the token.
    #[serde(default)]
    #[schema(max_length = 200)]
    pub description: String,
}

/// A SCIM token as the API shows it (never the token itself).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ScimTokenView {
    /// Id.
    pub id: ScimTokenId,
    /// The tenant whose people the token manages.
    pub tenant_id: TenantId,
    /// Free text.
    pub description: String,
    /// Who created it (the JWT's `sub`).
    pub created_by: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// When it was revoked; null while it is valid.
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A new SCIM token with its secret: the answer of its creation, the only time it is shown.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ScimTokenWithSecret {
    /// The token's record.
    #[serde(flatten)]
    pub scim_token: ScimTokenView,
    /// `pdk_scim_` and the base64url of 32 random bytes: the identity provider's bearer token.
    pub token: String,
}
