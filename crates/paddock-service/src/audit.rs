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
    /// Like [`Done::Recorded`], in an open transaction: for a request whose answer is recorded
    /// with its effect ([`Ctx::deferred_commit`]), which needs one.
    RecordedIn {
        /// The write's transaction, not yet committed, its success event written.
        tx: Tx,
        /// The answer.
        value: T,
    },
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
                    commit_or_defer(ctx, tx).await?;
                    Ok(value)
                }
                .await
            }
            Ok(Done::RecordedIn { tx, value }) => commit_or_defer(ctx, tx).await.map(|()| value),
            Ok(Done::Recorded(value)) => Ok(value),
            Err(e) => Err(e),
        };
        audit.finish(result).await
    }
}

/// Commits a write's transaction, or, for a request whose answer is recorded with its effect,
/// leaves it to the caller, who records the answer in it and commits both at once
/// ([`DeferredCommit`](crate::idempotency::DeferredCommit)).
async fn commit_or_defer(ctx: &Ctx, tx: Tx) -> Result<()> {
    // A second write in one request (none does this today) commits on its own.
    let tx = match &ctx.deferred_commit {
        Some(deferred) => match deferred.defer(tx) {
            Ok(()) => return Ok(()),
            Err(tx) => tx,
        },
        None => tx,
    };
    commit(tx).await?;
    crate::fault::reached(crate::fault::AFTER_COMMIT, &ctx.request_id).await;
    Ok(())
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
            server_request_id: self.ctx.server_request_id,
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
        // Filed by role: a provider's refused call stays under the tenant it targeted.
        if let (Some(own), Some(target)) = (self.ctx.actor.home_tenant(), self.tenant_id) {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use paddock_domain::secret::Cipher;
    use paddock_domain::Actor;
    use paddock_store::machine_class;
    use paddock_testkit::TestDb;
    use paddock_types::machine_class::MachineClassCreate;
    use paddock_types::MachineClassId;
    use serde_json::json;

    use super::*;

    async fn services() -> (TestDb, Services, Ctx) {
        let db = TestDb::new().await;
        let cipher = Arc::new(Cipher::new(&Cipher::generate_key(), &[]).expect("generated key is valid"));
        let services = Services::new(Store::from_pool(db.pool.clone()), cipher, paddock_testkit::ledger_key());
        let actor = Actor::from_claims("envelope-test".to_owned(), vec!["provider:admin".to_owned()], None)
            .expect("provider actor");
        (db, services, Ctx::internal(actor, "req-envelope"))
    }

    fn class(name: &str) -> MachineClassCreate {
        serde_json::from_value(json!({ "name": name, "cpu_cores": 8, "memory_gib": 32, "gpu_count": 0 }))
            .expect("class")
    }

    /// `(outcome, code, details)` of every event about `target`.
    async fn events(db: &TestDb, target: MachineClassId) -> Vec<(String, Option<String>, Value)> {
        sqlx::query_as("select outcome, code, details from audit_events where target_id = $1 order by id")
            .bind(target.uuid())
            .fetch_all(&db.pool)
            .await
            .expect("events")
    }

    async fn class_rows(db: &TestDb, id: MachineClassId) -> i64 {
        sqlx::query_scalar("select count(*) from machine_classes where id = $1")
            .bind(id.uuid())
            .fetch_one(&db.pool)
            .await
            .expect("count")
    }

    #[tokio::test]
    async fn a_write_refused_after_writing_leaves_no_row_but_its_failure_event() {
        let (db, services, ctx) = services().await;
        let id = MachineClassId::new();
        let result: Result<()> = services
            .audited(&ctx, "machine_class.create", "machine_class", async |audit| {
                audit.target(id.uuid(), None);
                let mut tx = services.store.begin().await?;
                machine_class::insert(&mut tx, id, &class("refused")).await?;
                Err(Error::conflict("refused_late", "refused after the row was written"))
            })
            .await;
        assert!(matches!(result, Err(Error::Conflict { code: "refused_late", .. })), "{result:?}");
        assert_eq!(class_rows(&db, id).await, 0, "the refused write was rolled back");
        let events = events(&db, id).await;
        assert_eq!(events.len(), 1, "one event: {events:?}");
        assert_eq!(events[0].0, "failure");
        assert_eq!(events[0].1.as_deref(), Some("refused_late"));
        assert_eq!(events[0].2, json!({ "detail": "refused after the row was written" }));
    }

    #[tokio::test]
    async fn a_successful_write_commits_its_event_in_its_own_transaction() {
        let (db, services, ctx) = services().await;
        let id = MachineClassId::new();
        let created = services
            .audited(&ctx, "machine_class.create", "machine_class", async |audit| {
                audit.target(id.uuid(), None);
                let mut tx = services.store.begin().await?;
                let value = machine_class::insert(&mut tx, id, &class("accepted")).await?;
                Ok(Done::Commit { tx, value, details: json!({ "name": "accepted" }) })
            })
            .await
            .expect("the write succeeds");
        assert_eq!(created.id, id);
        assert_eq!(events(&db, id).await, vec![("success".to_owned(), None, json!({ "name": "accepted" }))]);
        // The same transaction wrote both rows: PostgreSQL stamps each with its writer's xid.
        let writers: Vec<String> = sqlx::query_scalar(
            "select xmin::text from machine_classes where id = $1 \
             union all select xmin::text from audit_events where target_id = $1",
        )
        .bind(id.uuid())
        .fetch_all(&db.pool)
        .await
        .expect("xmin");
        assert_eq!(writers.len(), 2);
        assert_eq!(writers[0], writers[1], "the class and its event were written by one transaction");
    }

    #[tokio::test]
    async fn a_refusal_before_any_write_is_audited_with_the_service_outcome() {
        let (db, services, ctx) = services().await;
        let body = crate::Body::json(&class("twice"));
        services.machine_class_create(&ctx, &body).await.expect("first create");
        let again = services.machine_class_create(&ctx, &body).await;
        assert!(matches!(again, Err(Error::Conflict { code: "machine_class_name_taken", .. })), "{again:?}");
        assert_eq!(db.count("machine_classes").await, 1, "the refused create wrote no class");
        let outcomes: Vec<(String, Option<String>)> =
            sqlx::query_as("select outcome, code from audit_events where action = 'machine_class.create' order by id")
                .fetch_all(&db.pool)
                .await
                .expect("events");
        assert_eq!(
            outcomes,
            vec![("success".to_owned(), None), ("failure".to_owned(), Some("machine_class_name_taken".to_owned()))]
        );
    }
}
