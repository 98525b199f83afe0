//! Tenants: provider-managed customers.

use paddock_domain::cursor::PageRequest;
use paddock_domain::model::Tenant;
use paddock_domain::precondition::IfMatch;
use paddock_domain::{validate, Error, Permission, Result};
use paddock_store::tenant;
use paddock_types::tenant::{TenantCreate, TenantState};
use paddock_types::TenantId;
use serde_json::json;

use crate::{Body, Ctx, Done, Listed, Services};

const NOT_FOUND: Error = Error::NotFound { kind: "tenant" };

/// Fills server defaults: the display name defaults to the name.
fn normalize(mut spec: TenantCreate) -> TenantCreate {
    if spec.display_name.trim().is_empty() {
        spec.display_name = spec.name.clone();
    }
    spec
}

impl Services {
    /// Creates a tenant.
    pub async fn tenant_create(&self, ctx: &Ctx, body: &Body) -> Result<Tenant> {
        self.audited(ctx, "tenant.create", "tenant", async |audit| {
            ctx.actor.authorize(Permission::TenantWrite)?;
            let spec = normalize(body.decode::<TenantCreate>()?);
            validate::tenant(&spec)?;
            let id = TenantId::new();
            audit.target(id.uuid(), Some(id));
            // One statement writes the tenant and its audit event: no transaction needed, unless
            // the answer is to be recorded with it (an idempotent request).
            let event = audit.success_event(json!({ "name": spec.name }));
            if ctx.deferred_commit.is_some() {
                let mut tx = self.store.begin().await?;
                let value = tenant::insert(&mut tx, id, &spec, &event).await?;
                return Ok(Done::RecordedIn { tx, value });
            }
            let mut conn = self.store.conn().await?;
            Ok(Done::Recorded(tenant::insert(&mut conn, id, &spec, &event).await?))
        })
        .await
    }

    /// Lists tenants; a tenant token sees only its own tenant.
    pub async fn tenant_list(&self, ctx: &Ctx, page: PageRequest) -> Result<Listed<Tenant>> {
        let scope = ctx.actor.authorize(Permission::TenantRead)?;
        let mut conn = self.store.conn().await?;
        let items = tenant::list(&mut conn, scope.tenant(), page.after, page.limit).await?;
        let next_cursor = page.next_cursor(&items, |t| t.id.uuid());
        Ok(Listed { items, next_cursor })
    }

    /// Reads one tenant.
    pub async fn tenant_get(&self, ctx: &Ctx, id: TenantId) -> Result<Tenant> {
        ctx.actor.authorize_tenant(Permission::TenantRead, id, "tenant")?;
        self.require_tenant(id).await
    }

    /// 404 unless the tenant exists (and is not deleted).
    pub(crate) async fn require_tenant(&self, id: TenantId) -> Result<Tenant> {
        let mut conn = self.store.conn().await?;
        tenant::get(&mut conn, id).await?.ok_or(NOT_FOUND)
    }

    /// Applies a JSON merge patch to a tenant's spec. A patch that changes nothing keeps the
    /// generation (and so the etag).
    pub async fn tenant_update(&self, ctx: &Ctx, id: TenantId, body: &Body, if_match: &IfMatch) -> Result<Tenant> {
        self.audited(ctx, "tenant.update", "tenant", async |audit| {
            audit.target(id.uuid(), Some(id));
            ctx.actor.authorize(Permission::TenantWrite)?;
            let mut tx = self.store.begin().await?;
            let current = tenant::get_for_update(&mut tx, id).await?.ok_or(NOT_FOUND)?;
            if_match.check(current.generation)?;
            let patch = body.value()?;
            let spec = normalize(body.apply_patch(&current.spec, &patch, &["name"])?);
            validate::tenant(&spec)?;
            // A patch that changes nothing keeps the generation (and the etag), but is audited.
            let changed = spec != current.spec;
            let value = if changed { tenant::update_spec(&mut tx, id, &spec).await? } else { current };
            Ok(Done::Commit { tx, value, details: json!({ "patch": patch, "changed": changed }) })
        })
        .await
    }

    /// Suspends a tenant: its own writes get 409; its clusters keep running. Idempotent.
    pub async fn tenant_suspend(&self, ctx: &Ctx, id: TenantId) -> Result<Tenant> {
        self.tenant_set_state(ctx, id, TenantState::Suspended, "tenant.suspend").await
    }

    /// Resumes a suspended tenant. Idempotent.
    pub async fn tenant_resume(&self, ctx: &Ctx, id: TenantId) -> Result<Tenant> {
        self.tenant_set_state(ctx, id, TenantState::Active, "tenant.resume").await
    }

    async fn tenant_set_state(
        &self,
        ctx: &Ctx,
        id: TenantId,
        state: TenantState,
        action: &'static str,
    ) -> Result<Tenant> {
        self.audited(ctx, action, "tenant", async |audit| {
            audit.target(id.uuid(), Some(id));
            ctx.actor.authorize(Permission::TenantWrite)?;
            let mut tx = self.store.begin().await?;
            let current = tenant::get_for_update(&mut tx, id).await?.ok_or(NOT_FOUND)?;
            let value = if current.state == state { current } else { tenant::set_state(&mut tx, id, state).await? };
            Ok(Done::Commit { tx, value, details: json!({ "state": state.as_str() }) })
        })
        .await
    }

    /// Deletes a tenant; 409 while it still holds clusters or machines.
    pub async fn tenant_delete(&self, ctx: &Ctx, id: TenantId, if_match: &IfMatch) -> Result<()> {
        self.audited(ctx, "tenant.delete", "tenant", async |audit| {
            audit.target(id.uuid(), Some(id));
            ctx.actor.authorize(Permission::TenantWrite)?;
            let mut tx = self.store.begin().await?;
            let current = tenant::get_for_update(&mut tx, id).await?.ok_or(NOT_FOUND)?;
            if_match.check(current.generation)?;
            if tenant::has_holdings(&mut tx, id).await? {
                return Err(Error::conflict(
                    "tenant_not_empty",
                    "the tenant still has clusters or machines; delete them first",
                ));
            }
            tenant::mark_deleted(&mut tx, id).await?;
            Ok(Done::Commit { tx, value: (), details: json!({ "name": current.spec.name }) })
        })
        .await
    }
}
