//! Operations, readable by providers (all) and by tenants (their own).

use paddock_domain::cursor::PageRequest;
use paddock_domain::{Error, Permission, Result};
use paddock_store::operation::{self as store, OperationFilter};
use paddock_types::operation::OperationView;
use paddock_types::{OperationId, TenantId};

use crate::{db, Ctx, Listed, Services};

const NOT_FOUND: Error = Error::NotFound { kind: "operation" };

impl Services {
    /// `GET /v1/operations`: every operation for providers; a tenant token sees its own.
    pub async fn operation_list(
        &self,
        ctx: &Ctx,
        filter: OperationFilter,
        page: PageRequest,
    ) -> Result<Listed<OperationView>> {
        let scope = ctx.actor.authorize(Permission::OperationRead)?;
        let filter = OperationFilter { tenant_id: scope.tenant().or(filter.tenant_id), ..filter };
        self.operation_page(&filter, page).await
    }

    /// `GET /v1/operations/{operation_id}`.
    pub async fn operation_get(&self, ctx: &Ctx, id: OperationId) -> Result<OperationView> {
        let scope = ctx.actor.authorize(Permission::OperationRead)?;
        let mut conn = self.store.conn().await.map_err(db)?;
        store::get(&mut conn, scope.tenant(), id).await.map_err(db)?.ok_or(NOT_FOUND)
    }

    /// `GET /v1/tenants/{tenant_id}/operations`.
    pub async fn tenant_operation_list(
        &self,
        ctx: &Ctx,
        tenant: TenantId,
        filter: OperationFilter,
        page: PageRequest,
    ) -> Result<Listed<OperationView>> {
        ctx.actor.authorize_tenant(Permission::OperationRead, tenant, "tenant")?;
        self.require_tenant(tenant).await?;
        self.operation_page(&OperationFilter { tenant_id: Some(tenant), ..filter }, page).await
    }

    /// `GET /v1/tenants/{tenant_id}/operations/{operation_id}`.
    pub async fn tenant_operation_get(&self, ctx: &Ctx, tenant: TenantId, id: OperationId) -> Result<OperationView> {
        ctx.actor.authorize_tenant(Permission::OperationRead, tenant, "tenant")?;
        let mut conn = self.store.conn().await.map_err(db)?;
        store::get(&mut conn, Some(tenant), id).await.map_err(db)?.ok_or(NOT_FOUND)
    }

    async fn operation_page(&self, filter: &OperationFilter, page: PageRequest) -> Result<Listed<OperationView>> {
        let mut conn = self.store.conn().await.map_err(db)?;
        let items = store::list(&mut conn, filter, page.after, page.limit).await.map_err(db)?;
        let next_cursor = page.next_cursor(&items, |o| o.id.uuid());
        Ok(Listed { items, next_cursor })
    }
}
