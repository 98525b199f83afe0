//! `/Users`: a tenant's people. A user's `uidNumber` is the given one or the lowest free one of
//! the provider's range, and is kept through every later replace or patch that does not name
//! another; its `gidNumber` is its own group's (equal to its uid) unless given.

use paddock_domain::scim::resource::{parse_user, project, render_user, UserInput, UserRecord};
use paddock_domain::scim::{patch, POSIX_USER_SCHEMA};
use paddock_domain::{Error, Result};
use paddock_store::identity::{self, Lookup};
use paddock_types::TenantId;
use serde_json::{json, Value};
use uuid::Uuid;

use super::{base_path, list_response, lookup, number_taken, parse_list, Change, ListQuery, ScimCaller};
use crate::{Body, Done, Services};

const NOT_FOUND: Error = Error::NotFound { kind: "user" };

fn details(u: &UserInput) -> Value {
    json!({ "userName": u.user_name, "active": u.active, "ssh_public_keys": u.ssh_public_keys.len() })
}

impl Services {
    /// Creates a user (201); 409 `uniqueness` for a taken `userName` or `uidNumber`.
    pub async fn scim_user_create(&self, caller: &ScimCaller, tenant: TenantId, body: &Body) -> Result<Value> {
        self.audited(&caller.ctx, "identity.user.create", "identity_user", async |audit| {
            audit.target_tenant(caller.audit_tenant(tenant));
            let scope = self.scim_authorize(caller, tenant)?;
            let (mut tx, state) = self.scim_begin(tenant).await?;
            Self::scim_suspension(scope, state, Change::Grants)?;
            let input = parse_user(&body.value()?, &self.identity_range)?;
            let id = Uuid::now_v7();
            audit.target(id, Some(tenant));
            let uid = self.scim_number(&mut tx, tenant, input.uid_number).await?;
            let gid = input.gid_number.unwrap_or(uid);
            identity::user_insert(&mut tx, tenant, id, &input, uid, gid).await?;
            if !identity::claim_number(&mut tx, tenant, uid, Some(id), None).await? {
                return Err(number_taken("uidNumber", uid));
            }
            let value = self.scim_user_render(&mut tx, tenant, id).await?;
            Ok(Done::Commit { tx, value, details: details(&input) })
        })
        .await
    }

    /// One user, projected by `attributes` / `excludedAttributes`.
    pub async fn scim_user_get(
        &self,
        caller: &ScimCaller,
        tenant: TenantId,
        id: Uuid,
        projection: (Option<&str>, Option<&str>),
    ) -> Result<Value> {
        self.scim_read_check(caller, tenant).await?;
        let mut conn = self.store.conn().await?;
        let mut value = self.scim_user_render(&mut conn, tenant, id).await?;
        project(&mut value, projection.0, projection.1);
        Ok(value)
    }

    /// The users that match the query's filter, a page of them.
    pub async fn scim_user_list(&self, caller: &ScimCaller, tenant: TenantId, q: &ListQuery) -> Result<Value> {
        self.scim_read_check(caller, tenant).await?;
        let (filter, start, count) = parse_list(q)?;
        let mut conn = self.store.conn().await?;
        let base = base_path(tenant);
        let users = identity::users(&mut conn, tenant, lookup(filter.as_ref(), "userName")).await?;
        let rendered = users.iter().map(|u| render_user(u, &base)).collect();
        Ok(list_response(rendered, filter.as_ref(), start, count, q))
    }

    /// Replaces a user (PUT): what the body leaves out is cleared, except the numbers, which are
    /// kept unless the body names others.
    pub async fn scim_user_replace(
        &self,
        caller: &ScimCaller,
        tenant: TenantId,
        id: Uuid,
        body: &Body,
    ) -> Result<Value> {
        self.scim_user_write(caller, tenant, id, "identity.user.replace", |_| body.value()).await
    }

    /// Patches a user (RFC 7644 section 3.5.2), then checks the result as a PUT is checked.
    pub async fn scim_user_patch(&self, caller: &ScimCaller, tenant: TenantId, id: Uuid, body: &Body) -> Result<Value> {
        self.scim_user_write(caller, tenant, id, "identity.user.patch", |current| {
            let mut resource = current.clone();
            patch::apply(&mut resource, &body.value()?, &[POSIX_USER_SCHEMA])?;
            Ok(resource)
        })
        .await
    }

    /// Deletes a user: it leaves its groups and every cluster of the tenant. Allowed while the
    /// tenant is suspended.
    pub async fn scim_user_delete(&self, caller: &ScimCaller, tenant: TenantId, id: Uuid) -> Result<()> {
        self.audited(&caller.ctx, "identity.user.delete", "identity_user", async |audit| {
            audit.target_tenant(caller.audit_tenant(tenant));
            self.scim_authorize(caller, tenant)?;
            audit.target(id, Some(tenant));
            let (mut tx, _) = self.scim_begin(tenant).await?;
            if !identity::user_delete(&mut tx, tenant, id).await? {
                return Err(NOT_FOUND);
            }
            Ok(Done::Commit { tx, value: (), details: json!({}) })
        })
        .await
    }

    /// A replace or a patch: `next` makes the new resource from the current one (rendered).
    async fn scim_user_write(
        &self,
        caller: &ScimCaller,
        tenant: TenantId,
        id: Uuid,
        action: &'static str,
        next: impl FnOnce(&Value) -> Result<Value>,
    ) -> Result<Value> {
        self.audited(&caller.ctx, action, "identity_user", async |audit| {
            audit.target_tenant(caller.audit_tenant(tenant));
            let scope = self.scim_authorize(caller, tenant)?;
            audit.target(id, Some(tenant));
            let (mut tx, state) = self.scim_begin(tenant).await?;
            let current = self.scim_user_record(&mut tx, tenant, id).await?;
            let input = parse_user(&next(&render_user(&current, &base_path(tenant)))?, &self.identity_range)?;
            // A user left inactive can reach nothing, whatever else changed.
            let change = if input.active { Change::Grants } else { Change::LocksOut };
            Self::scim_suspension(scope, state, change)?;
            let uid = input.uid_number.unwrap_or(current.uid_number);
            let gid = input.gid_number.unwrap_or(current.gid_number);
            identity::user_update(&mut tx, tenant, id, &input, uid, gid).await?;
            if !identity::claim_number(&mut tx, tenant, uid, Some(id), None).await? {
                return Err(number_taken("uidNumber", uid));
            }
            let value = self.scim_user_render(&mut tx, tenant, id).await?;
            Ok(Done::Commit { tx, value, details: details(&input) })
        })
        .await
    }

    async fn scim_user_record(&self, conn: &mut paddock_store::Conn, tenant: TenantId, id: Uuid) -> Result<UserRecord> {
        identity::users(conn, tenant, Lookup::Id(id)).await?.pop().ok_or(NOT_FOUND)
    }

    async fn scim_user_render(&self, conn: &mut paddock_store::Conn, tenant: TenantId, id: Uuid) -> Result<Value> {
        Ok(render_user(&self.scim_user_record(conn, tenant, id).await?, &base_path(tenant)))
    }
}
