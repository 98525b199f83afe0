//! `/Groups`: a tenant's groups of people. Members are users of the same tenant (a group is no
//! member of another); a group's `gidNumber` is the given one or the lowest free one of the
//! provider's range, kept through later changes that do not name another.

use paddock_domain::scim::resource::{parse_group, project, render_group, GroupInput, GroupRecord};
use paddock_domain::scim::{invalid_value, patch, POSIX_GROUP_SCHEMA};
use paddock_domain::{Error, Result};
use paddock_store::identity::{self, Lookup};
use paddock_store::Tx;
use paddock_types::TenantId;
use serde_json::{json, Value};
use uuid::Uuid;

use super::{base_path, list_response, lookup, number_taken, parse_list, Change, ListQuery, ScimCaller};
use crate::{Body, Done, Services};

const NOT_FOUND: Error = Error::NotFound { kind: "group" };

fn details(g: &GroupInput) -> Value {
    json!({ "displayName": g.display_name, "members": g.members.len() })
}

impl Services {
    /// Creates a group (201); 409 `uniqueness` for a taken `displayName` or `gidNumber`.
    pub async fn scim_group_create(&self, caller: &ScimCaller, tenant: TenantId, body: &Body) -> Result<Value> {
        self.audited(&caller.ctx, "identity.group.create", "identity_group", async |audit| {
            audit.target_tenant(caller.audit_tenant(tenant));
            let scope = self.scim_authorize(caller, tenant)?;
            let (mut tx, state) = self.scim_begin(tenant).await?;
            Self::scim_suspension(scope, state, Change::Grants)?;
            let input = parse_group(&body.value()?, &self.identity_range)?;
            let id = Uuid::now_v7();
            audit.target(id, Some(tenant));
            let gid = self.scim_number(&mut tx, tenant, input.gid_number).await?;
            identity::group_insert(&mut tx, tenant, id, &input.display_name, input.external_id.as_deref(), gid).await?;
            if !identity::claim_number(&mut tx, tenant, gid, None, Some(id)).await? {
                return Err(number_taken("gidNumber", gid));
            }
            scim_members(&mut tx, tenant, id, &input.members).await?;
            let value = self.scim_group_render(&mut tx, tenant, id).await?;
            Ok(Done::Commit { tx, value, details: details(&input) })
        })
        .await
    }

    /// One group, projected by `attributes` / `excludedAttributes`.
    pub async fn scim_group_get(
        &self,
        caller: &ScimCaller,
        tenant: TenantId,
        id: Uuid,
        projection: (Option<&str>, Option<&str>),
    ) -> Result<Value> {
        self.scim_read_check(caller, tenant).await?;
        let mut conn = self.store.conn().await?;
        let mut value = self.scim_group_render(&mut conn, tenant, id).await?;
        project(&mut value, projection.0, projection.1);
        Ok(value)
    }

    /// The groups that match the query's filter, a page of them.
    pub async fn scim_group_list(&self, caller: &ScimCaller, tenant: TenantId, q: &ListQuery) -> Result<Value> {
        self.scim_read_check(caller, tenant).await?;
        let (filter, start, count) = parse_list(q)?;
        let mut conn = self.store.conn().await?;
        let base = base_path(tenant);
        let groups = identity::groups(&mut conn, tenant, lookup(filter.as_ref(), "displayName")).await?;
        let rendered = groups.iter().map(|g| render_group(g, &base)).collect();
        Ok(list_response(rendered, filter.as_ref(), start, count, q))
    }

    /// Replaces a group (PUT), its members included.
    pub async fn scim_group_replace(
        &self,
        caller: &ScimCaller,
        tenant: TenantId,
        id: Uuid,
        body: &Body,
    ) -> Result<Value> {
        self.scim_group_write(caller, tenant, id, "identity.group.replace", |_| body.value()).await
    }

    /// Patches a group (members added, removed, replaced), then checks the result as a PUT is.
    pub async fn scim_group_patch(
        &self,
        caller: &ScimCaller,
        tenant: TenantId,
        id: Uuid,
        body: &Body,
    ) -> Result<Value> {
        self.scim_group_write(caller, tenant, id, "identity.group.patch", |current| {
            let mut resource = current.clone();
            patch::apply(&mut resource, &body.value()?, &[POSIX_GROUP_SCHEMA])?;
            Ok(resource)
        })
        .await
    }

    /// Deletes a group: its members leave it. Allowed while the tenant is suspended.
    pub async fn scim_group_delete(&self, caller: &ScimCaller, tenant: TenantId, id: Uuid) -> Result<()> {
        self.audited(&caller.ctx, "identity.group.delete", "identity_group", async |audit| {
            audit.target_tenant(caller.audit_tenant(tenant));
            self.scim_authorize(caller, tenant)?;
            audit.target(id, Some(tenant));
            let (mut tx, _) = self.scim_begin(tenant).await?;
            if !identity::group_delete(&mut tx, tenant, id).await? {
                return Err(NOT_FOUND);
            }
            Ok(Done::Commit { tx, value: (), details: json!({}) })
        })
        .await
    }

    async fn scim_group_write(
        &self,
        caller: &ScimCaller,
        tenant: TenantId,
        id: Uuid,
        action: &'static str,
        next: impl FnOnce(&Value) -> Result<Value>,
    ) -> Result<Value> {
        self.audited(&caller.ctx, action, "identity_group", async |audit| {
            audit.target_tenant(caller.audit_tenant(tenant));
            let scope = self.scim_authorize(caller, tenant)?;
            audit.target(id, Some(tenant));
            let (mut tx, state) = self.scim_begin(tenant).await?;
            let current = self.scim_group_record(&mut tx, tenant, id).await?;
            let input = parse_group(&next(&render_group(&current, &base_path(tenant)))?, &self.identity_range)?;
            Self::scim_suspension(scope, state, change(&current, &input))?;
            let gid = input.gid_number.unwrap_or(current.gid_number);
            let external = input.external_id.as_deref();
            identity::group_update(&mut tx, tenant, id, &input.display_name, external, gid).await?;
            if !identity::claim_number(&mut tx, tenant, gid, None, Some(id)).await? {
                return Err(number_taken("gidNumber", gid));
            }
            scim_members(&mut tx, tenant, id, &input.members).await?;
            let value = self.scim_group_render(&mut tx, tenant, id).await?;
            Ok(Done::Commit { tx, value, details: details(&input) })
        })
        .await
    }

    async fn scim_group_record(
        &self,
        conn: &mut paddock_store::Conn,
        tenant: TenantId,
        id: Uuid,
    ) -> Result<GroupRecord> {
        identity::groups(conn, tenant, Lookup::Id(id)).await?.pop().ok_or(NOT_FOUND)
    }

    async fn scim_group_render(&self, conn: &mut paddock_store::Conn, tenant: TenantId, id: Uuid) -> Result<Value> {
        Ok(render_group(&self.scim_group_record(conn, tenant, id).await?, &base_path(tenant)))
    }
}

/// A change of a group takes access away only when it removes members and changes nothing else.
fn change(current: &GroupRecord, next: &GroupInput) -> Change {
    let kept = next.members.iter().all(|m| current.members.iter().any(|(c, _)| c == m));
    let same = next.display_name == current.display_name && next.gid_number.is_none_or(|g| g == current.gid_number);
    if kept && same {
        Change::LocksOut
    } else {
        Change::Grants
    }
}

/// Sets a group's members: each must be a user of the tenant (400 `invalidValue` otherwise).
async fn scim_members(tx: &mut Tx, tenant: TenantId, group: Uuid, members: &[Uuid]) -> Result<()> {
    let known: std::collections::HashSet<Uuid> =
        identity::users_existing(tx, tenant, members).await?.into_iter().collect();
    if let Some(unknown) = members.iter().find(|m| !known.contains(m)) {
        return Err(invalid_value(format!("member {unknown} is not a user of this tenant")));
    }
    identity::members_set(tx, tenant, group, members).await?;
    Ok(())
}
