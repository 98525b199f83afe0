//! A tenant's SCIM bearer tokens: created by its tenant:admin (or provider:admin), shown once,
//! stored as their SHA-256, revoked at will.

use paddock_domain::cursor::PageRequest;
use paddock_domain::scim::{new_token, token_hash};
use paddock_domain::{Error, Permission, Result, Scope};
use paddock_store::{scim_token as store, tenant};
use paddock_types::scim::{ScimTokenCreate, ScimTokenView, ScimTokenWithSecret};
use paddock_types::tenant::TenantState;
use paddock_types::{ScimTokenId, TenantId};
use serde_json::json;

use crate::{Body, Ctx, Done, Listed, Services};

const NOT_FOUND: Error = Error::NotFound { kind: "scim_token" };

impl Services {
    /// Creates a SCIM token of `tenant`; the answer carries the token, shown this once. A tenant
    /// user may not while the tenant is suspended (409 `tenant_suspended`).
    pub async fn scim_token_create(&self, ctx: &Ctx, tenant_id: TenantId, body: &Body) -> Result<ScimTokenWithSecret> {
        self.audited(ctx, "scim_token.create", "scim_token", async |audit| {
            audit.target_tenant(tenant_id);
            let scope = ctx.actor.authorize_tenant(Permission::IdentityWrite, tenant_id, "tenant")?;
            let mut tx = self.store.begin().await?;
            let t = tenant::get(&mut tx, tenant_id).await?.ok_or(Error::NotFound { kind: "tenant" })?;
            if matches!(scope, Scope::Tenant(_)) && t.state == TenantState::Suspended {
                return Err(Error::conflict(
                    "tenant_suspended",
                    "the tenant is suspended: no new SCIM token is issued (existing ones still take people away)",
                ));
            }
            let spec: ScimTokenCreate = body.decode()?;
            if spec.description.chars().count() > 200 || spec.description.chars().any(char::is_control) {
                return Err(Error::invalid(
                    "description",
                    "must be at most 200 characters, without control characters",
                ));
            }
            let id = ScimTokenId::new();
            audit.target(id.uuid(), Some(tenant_id));
            let token = new_token();
            let view =
                store::insert(&mut tx, tenant_id, id, &spec.description, &token_hash(&token), &ctx.actor.subject)
                    .await?;
            let details = json!({ "description": spec.description });
            Ok(Done::Commit { tx, value: ScimTokenWithSecret { scim_token: view, token }, details })
        })
        .await
    }

    /// The SCIM tokens of `tenant` (never the tokens themselves).
    pub async fn scim_token_list(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        page: PageRequest,
    ) -> Result<Listed<ScimTokenView>> {
        ctx.actor.authorize_tenant(Permission::IdentityWrite, tenant_id, "tenant")?;
        self.require_tenant(tenant_id).await?;
        let mut conn = self.store.conn().await?;
        let items = store::list(&mut conn, tenant_id, page.after, page.limit).await?;
        let next_cursor = page.next_cursor(&items, |t| t.id.uuid());
        Ok(Listed { items, next_cursor })
    }

    /// Revokes a SCIM token: from now on it is refused (401). Allowed while the tenant is
    /// suspended: it takes access away.
    pub async fn scim_token_revoke(&self, ctx: &Ctx, tenant_id: TenantId, id: ScimTokenId) -> Result<ScimTokenView> {
        self.audited(ctx, "scim_token.revoke", "scim_token", async |audit| {
            audit.target(id.uuid(), Some(tenant_id));
            ctx.actor.authorize_tenant(Permission::IdentityWrite, tenant_id, "tenant")?;
            let mut tx = self.store.begin().await?;
            tenant::get(&mut tx, tenant_id).await?.ok_or(Error::NotFound { kind: "tenant" })?;
            let value = store::revoke(&mut tx, tenant_id, id).await?.ok_or(NOT_FOUND)?;
            Ok(Done::Commit { tx, value, details: json!({}) })
        })
        .await
    }

    /// The token and tenant of a valid SCIM bearer token; `None` for an unknown or revoked one.
    pub async fn scim_token_find(&self, token: &str) -> Result<Option<(ScimTokenId, TenantId)>> {
        let mut conn = self.store.conn().await?;
        Ok(store::find(&mut conn, &token_hash(token)).await?)
    }
}
