//! A tenant's people over SCIM 2.0 (`/v1/tenants/{tenant_id}/scim/v2/...`): users and groups
//! its identity provider creates, replaces, patches and deletes (`user`, `group`), the SCIM
//! bearer tokens it authenticates with (`token`), and the discovery documents. The caller is
//! either one of the tenant's SCIM tokens or a JWT caller allowed to manage the tenant's people
//! (tenant:admin of the tenant, provider:admin). Every write runs under the tenant's identity lock
//! and is audited. While the tenant is suspended its identity provider may only take access
//! away: delete users and groups, deactivate users, remove members.

mod group;
mod search;
mod token;
mod user;

pub use search::SearchScope;

use paddock_domain::scim::filter::Filter;
use paddock_domain::scim::resource::project;
use paddock_domain::scim::{invalid_value, IdRange, LIST_RESPONSE, MAX_RESULTS};
use paddock_domain::{Error, Permission, Result, Scope};
use paddock_store::{identity, tenant, Tx};
use paddock_types::tenant::TenantState;
use paddock_types::{ScimTokenId, TenantId};
use serde_json::{json, Value};

use crate::{Ctx, Services};

/// Who calls a SCIM endpoint.
#[derive(Debug, Clone)]
pub struct ScimCaller {
    /// The request's context: for a SCIM token, an actor named `scim-token:<id>` that holds no
    /// role (it is only ever let in through `token`).
    pub ctx: Ctx,
    /// The SCIM token's id and tenant, when a token authenticated the call.
    pub token: Option<(ScimTokenId, TenantId)>,
}

impl ScimCaller {
    /// A call authenticated by a SCIM token of `tenant`.
    pub fn token(id: ScimTokenId, tenant: TenantId, request_id: String, server_request_id: uuid::Uuid) -> Self {
        // An actor without roles: no permission of the rest of the API is ever granted to it.
        let actor = paddock_domain::Actor {
            subject: format!("scim-token:{id}"),
            roles: Vec::new(),
            raw_roles: vec!["scim-token".to_owned()],
            tenant_id: None,
        };
        let ctx = Ctx { actor, request_id, server_request_id, deferred_commit: None };
        Self { ctx, token: Some((id, tenant)) }
    }

    /// The tenant a call's audit event is filed under: a token's own tenant (never the tenant of
    /// a path it may not reach), else the path's.
    fn audit_tenant(&self, tenant: TenantId) -> TenantId {
        self.token.map_or(tenant, |(_, own)| own)
    }
}

/// The query of a list (`GET /Users`, `GET /Groups`), as sent.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// `filter`.
    pub filter: Option<String>,
    /// `startIndex` (1-based).
    pub start_index: Option<String>,
    /// `count`.
    pub count: Option<String>,
    /// `attributes`.
    pub attributes: Option<String>,
    /// `excludedAttributes`.
    pub excluded_attributes: Option<String>,
}

/// Whether a write takes access away only (allowed while the tenant is suspended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// It may give someone access.
    Grants,
    /// It only takes access away.
    LocksOut,
}

/// The tenant's SCIM base path, which `meta.location` and `$ref` values start with.
pub fn base_path(tenant: TenantId) -> String {
    format!("/v1/tenants/{tenant}/scim/v2")
}

impl Services {
    /// Sets the range of POSIX ids given to users and groups (`PADDOCK_IDENTITY_ID_RANGE`).
    pub fn with_identity_range(mut self, range: IdRange) -> Self {
        self.identity_range = range;
        self
    }

    /// 404 unless `caller` may manage `tenant`'s people (a token of another tenant, or a tenant
    /// user of another tenant, gets the answer of a missing tenant); 403 for a role that may never.
    fn scim_authorize(&self, caller: &ScimCaller, tenant: TenantId) -> Result<Scope> {
        match caller.token {
            Some((_, own)) if own == tenant => Ok(Scope::Tenant(own)),
            Some(_) => Err(Error::NotFound { kind: "tenant" }),
            None => caller.ctx.actor.authorize_tenant(Permission::IdentityWrite, tenant, "tenant"),
        }
    }

    /// Checks the caller and the tenant for a read (404 for a missing tenant).
    pub async fn scim_read_check(&self, caller: &ScimCaller, tenant: TenantId) -> Result<()> {
        self.scim_authorize(caller, tenant)?;
        self.require_tenant(tenant).await.map(|_| ())
    }

    /// Opens a write of `tenant`'s people: its transaction, the tenant (404 when missing) and
    /// the tenant's identity lock.
    async fn scim_begin(&self, tenant_id: TenantId) -> Result<(Tx, TenantState)> {
        let mut tx = self.store.begin().await?;
        let t = tenant::get(&mut tx, tenant_id).await?.ok_or(Error::NotFound { kind: "tenant" })?;
        identity::lock(&mut tx, tenant_id).await?;
        // Every Slurm cluster of the tenant syncs its people again, promptly: queued in the
        // write's own transaction, so a refused write (rolled back) wakes nothing.
        for cluster in paddock_store::cluster::slurm_clusters(&mut tx, tenant_id).await? {
            paddock_store::lifecycle::enqueue_identity_sync(&mut tx, tenant_id, cluster).await?;
        }
        Ok((tx, t.state))
    }

    /// 409 `tenant_suspended` for a write of the tenant's own that may give access while the
    /// tenant is suspended (the provider's writes, and lock-outs, still apply).
    fn scim_suspension(scope: Scope, state: TenantState, change: Change) -> Result<()> {
        if matches!(scope, Scope::Tenant(_)) && state == TenantState::Suspended && change == Change::Grants {
            return Err(Error::conflict(
                "tenant_suspended",
                "the tenant is suspended: its identity provider may only delete users and groups, deactivate users and remove members",
            ));
        }
        Ok(())
    }

    /// A number for a new user or group: the given one, else the lowest free one of the range
    /// (409 when the range is full).
    async fn scim_number(&self, tx: &mut Tx, tenant: TenantId, given: Option<i32>) -> Result<i32> {
        if let Some(n) = given {
            return Ok(n);
        }
        let range = self.identity_range;
        let last = i32::try_from(range.last).unwrap_or(i32::MAX);
        let first = i32::try_from(range.first).unwrap_or(i32::MAX);
        identity::next_number(tx, tenant, first, last, &range.reserved()).await?.ok_or_else(|| {
            Error::conflict("identity_ids_exhausted", format!("every POSIX id of the range {range} is in use"))
        })
    }
}

/// The uniqueness error of a number another user or group holds.
fn number_taken(attr: &str, n: i32) -> Error {
    paddock_domain::scim::uniqueness(format!("{attr} {n} is held by another user or group of the tenant"))
}

/// A parsed list query: the filter, and the page (1-based start, count).
fn parse_list(q: &ListQuery) -> Result<(Option<Filter>, usize, usize)> {
    let filter = q.filter.as_deref().map(Filter::parse).transpose()?;
    let int = |name: &str, v: &Option<String>| -> Result<Option<i64>> {
        v.as_deref()
            .map(|s| s.trim().parse::<i64>().map_err(|_| invalid_value(format!("{name} must be an integer"))))
            .transpose()
    };
    // RFC 7644 section 3.4.2.4: a start below 1 is 1, a negative count is 0.
    let start = int("startIndex", &q.start_index)?.unwrap_or(1).max(1);
    let count = int("count", &q.count)?.unwrap_or(MAX_RESULTS as i64).clamp(0, MAX_RESULTS as i64);
    Ok((filter, usize::try_from(start).unwrap_or(usize::MAX), count as usize))
}

/// A `ListResponse` of the resources that match, the page asked for, projected.
fn list_response(rendered: Vec<Value>, filter: Option<&Filter>, start: usize, count: usize, q: &ListQuery) -> Value {
    let matching: Vec<Value> = rendered.into_iter().filter(|r| filter.is_none_or(|f| f.matches(r))).collect();
    let total = matching.len();
    let page: Vec<Value> = matching
        .into_iter()
        .skip(start - 1)
        .take(count)
        .map(|mut r| {
            project(&mut r, q.attributes.as_deref(), q.excluded_attributes.as_deref());
            r
        })
        .collect();
    json!({
        "schemas": [LIST_RESPONSE],
        "totalResults": total,
        "startIndex": start,
        "itemsPerPage": page.len(),
        "Resources": page,
    })
}

/// The lookup an `attr eq "value"` filter allows (`name_attr` is `userName` or `displayName`).
fn lookup<'a>(filter: Option<&'a Filter>, name_attr: &str) -> identity::Lookup<'a> {
    match filter.and_then(Filter::simple_eq) {
        Some((attr, v)) if attr.eq_ignore_ascii_case(name_attr) => identity::Lookup::Name(v),
        Some((attr, v)) if attr.eq_ignore_ascii_case("externalId") => identity::Lookup::ExternalId(v),
        // An id that is not a UUID names nothing: the max UUID, which paddock never issues.
        Some((attr, v)) if attr.eq_ignore_ascii_case("id") => {
            identity::Lookup::Id(uuid::Uuid::try_parse(v).unwrap_or(uuid::Uuid::max()))
        }
        _ => identity::Lookup::All,
    }
}
