//! The audit trail of one mutating call: a success event written inside the call's transaction,
//! or a failure event written on its own when the call is refused. [`Services::audited`] is the
//! one envelope every audited write of the services runs in.

use std::ops::AsyncFnOnce;

use paddock_domain::cursor::PageRequest;
use paddock_domain::{Error, Permission, Result};
use paddock_store::audit::{self, NewAuditEvent};
use paddock_store::{Conn, Store, Tx};
use paddock_types::audit::{AuditEventView, AuditFilter, AuditOutcome};
use paddock_types::TenantId;
use serde_json::Value;
use uuid::Uuid;

use crate::{commit, Ctx, Listed, Services};

/// How an audited write ends when it succeeds.
#[derive(Debug)]
pub(crate) enum Done<T> {
    /// The write's open transaction: the success event with `details` is appended to it, then it
    /// commits, so the change and its event are written together or not at all.
    Commit {
        /// The write's transaction, not yet committed.
        tx: Tx,
        /// The answer.
        value: T,
        /// The success event's details.
        details: Value,
    },
    /// The write appended its success event in the very statement that made the change (one
    /// round trip, atomic without a transaction; see [`AuditTrail::success_event`]).
    Recorded(T),
}

impl Services {
    /// Runs one audited write, in the spirit of omicron's `audit_and_time` but with the success
    /// event inside the write's own transaction. `write` checks policy first (so a 403 costs no
    /// connection), opens its transaction when it needs one, names its target on the trail as soon
    /// as it is known, and hands back the open transaction ([`Done::Commit`]). When it fails, its
    /// transaction was dropped (rolled back) on the way out, and the failure event is written on
    /// its own afterwards ([`AuditTrail::finish`]): a refused call leaves no row but its event.
    pub(crate) async fn audited<T>(
        &self,
        ctx: &Ctx,
        action: &'static str,
        target_type: &'static str,
        write: impl AsyncFnOnce(&mut AuditTrail<'_>) -> Result<Done<T>>,
    ) -> Result<T> {
        let mut audit = AuditTrail::new(&self.store, ctx, action, target_type);
        let result = match write(&mut audit).await {
            Ok(Done::Commit { mut tx, value, details }) => {
                async {
                    audit.success(&mut tx, details).await?;
                    commit(tx).await?;
                    Ok(value)
                }
                .await
            }
            Ok(Done::Recorded(value)) => Ok(value),
            Err(e) => Err(e),
        };
        audit.finish(result).await
    }
}

/// Audits one call.
#[derive(Debug)]
pub struct AuditTrail<'a> {
    store: &'a Store,
    ctx: &'a Ctx,
    action: &'static str,
    target_type: &'static str,
    target_id: Option<Uuid>,
    tenant_id: Option<TenantId>,
}

impl<'a> AuditTrail<'a> {
    pub(crate) fn new(store: &'a Store, ctx: &'a Ctx, action: &'static str, target_type: &'static str) -> Self {
        Self { store, ctx, action, target_type, target_id: None, tenant_id: None }
    }

    /// Names the tenant before the target is known (a create), so a refusal is filed under it.
    pub fn target_tenant(&mut self, tenant: TenantId) {
        self.tenant_id = Some(tenant);
    }

    /// Names the target once it is known.
    pub fn target(&mut self, id: Uuid, tenant: Option<TenantId>) {
        self.target_id = Some(id);
        self.tenant_id = tenant;
    }

    fn event(&self, outcome: AuditOutcome, code: Option<&'a str>, details: serde_json::Value) -> NewAuditEvent<'_> {
        NewAuditEvent {
            actor_sub: &self.ctx.actor.subject,
            actor_roles: &self.ctx.actor.raw_roles,
            tenant_id: self.tenant_id,
            action: self.action,
            target_type: self.target_type,
            target_id: self.target_id,
            request_id: &self.ctx.request_id,
            outcome,
            code,
            details,
        }
    }

    /// The success event, for a store write that appends it in its own statement.
    pub fn success_event(&self, details: serde_json::Value) -> NewAuditEvent<'_> {
        self.event(AuditOutcome::Success, None, details)
    }

    /// Records success inside the call's transaction.
    pub async fn success(&self, conn: &mut Conn, details: serde_json::Value) -> Result<()> {
        Ok(audit::insert(conn, &self.event(AuditOutcome::Success, None, details)).await?)
    }

    /// Passes `result` through, recording a failure event when it is an error. A failure to write
    /// the event is logged, never allowed to replace the caller's answer.
    pub async fn finish<T>(mut self, result: Result<T>) -> Result<T> {
        let Err(err) = &result else { return result };
        if matches!(err, Error::Unavailable(_)) {
            // The database is down: nowhere to write, and nothing was changed.
            return result;
        }
        // A tenant user's refused call on another tenant is that user's tenant's business: the
        // target tenant's admins must not see (or be flooded with) foreign subjects, and the
        // caller's tenant must not learn more about the foreign object than its user sent.
        if let (Some(own), Some(target)) = (self.ctx.actor.tenant_id, self.tenant_id) {
            if own != target {
                self.tenant_id = Some(own);
                self.target_id = None;
            }
        }
        let details = serde_json::json!({ "detail": public_detail(err) });
        let written = match self.store.conn().await {
            Ok(mut conn) => {
                audit::insert(&mut conn, &self.event(AuditOutcome::Failure, Some(err.code()), details)).await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            tracing::warn!(
                error = &e as &dyn std::error::Error,
                action = self.action,
                "could not record a failed call in the audit trail"
            );
        }
        result
    }
}

fn public_detail(err: &Error) -> String {
    match err {
        Error::Internal(_) => "internal error".to_owned(),
        other => other.to_string(),
    }
}

impl Services {
    /// `GET /v1/audit-events`: every event, for providers.
    pub async fn audit_list(
        &self,
        ctx: &Ctx,
        filter: &AuditFilter,
        page: PageRequest,
    ) -> Result<Listed<AuditEventView>> {
        let scope = ctx.actor.authorize(Permission::AuditRead)?;
        self.audit_page(scope.tenant(), filter, page).await
    }

    /// `GET /v1/tenants/{tenant_id}/audit-events`: one tenant's events.
    pub async fn tenant_audit_list(
        &self,
        ctx: &Ctx,
        tenant: TenantId,
        filter: &AuditFilter,
        page: PageRequest,
    ) -> Result<Listed<AuditEventView>> {
        ctx.actor.authorize_tenant(Permission::AuditRead, tenant, "tenant")?;
        self.require_tenant(tenant).await?;
        self.audit_page(Some(tenant), filter, page).await
    }

    async fn audit_page(
        &self,
        tenant: Option<TenantId>,
        filter: &AuditFilter,
        page: PageRequest,
    ) -> Result<Listed<AuditEventView>> {
        if let (Some(from), Some(to)) = (filter.from, filter.to) {
            if from >= to {
                return Err(Error::invalid("from", "must be before `to`"));
            }
        }
        let mut conn = self.store.conn().await?;
        let items = audit::list(&mut conn, tenant, filter, page.after, page.limit).await?;
        let next_cursor = page.next_cursor(&items, |e| e.id.uuid());
        Ok(Listed { items, next_cursor })
    }
}
