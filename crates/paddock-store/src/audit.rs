//! Audit events: append-only.

use chrono::{DateTime, Utc};
use paddock_types::audit::{AuditActor, AuditEventView, AuditFilter, AuditOutcome, AuditTarget};
use paddock_types::{AuditEventId, TenantId};
use uuid::Uuid;

use crate::{parse_state, Conn, StoreError};

/// An event to append.
#[derive(Debug)]
pub struct NewAuditEvent<'a> {
    /// Subject of the caller.
    pub actor_sub: &'a str,
    /// Roles of the caller.
    pub actor_roles: &'a [String],
    /// Tenant concerned.
    pub tenant_id: Option<TenantId>,
    /// Action, e.g. `tenant.create`.
    pub action: &'a str,
    /// Target type.
    pub target_type: &'a str,
    /// Target id.
    pub target_id: Option<Uuid>,
    /// Request id (the client's when it sent one).
    pub request_id: &'a str,
    /// The id the server gave the request.
    pub server_request_id: Uuid,
    /// Outcome.
    pub outcome: AuditOutcome,
    /// Problem code of a failure.
    pub code: Option<&'a str>,
    /// Extra facts; never secrets.
    pub details: serde_json::Value,
}

/// The insert of an event, as a statement of its own or as a data-modifying `with` clause of
/// another module's write (one statement, one round trip), with its parameters from `$first` on.
pub(crate) fn insert_sql(first: usize) -> String {
    let p: Vec<String> = (first..first + 12).map(|i| format!("${i}")).collect();
    format!(
        "insert into audit_events (id, actor_sub, actor_roles, tenant_id, action, target_type, \
         target_id, request_id, server_request_id, outcome, code, details) values ({})",
        p.join(", ")
    )
}

/// Binds an event's parameters, in `insert_sql` order, after the ones already bound.
pub(crate) fn bind<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    e: &'q NewAuditEvent<'q>,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    query
        .bind(AuditEventId::new().uuid())
        .bind(e.actor_sub)
        .bind(e.actor_roles)
        .bind(e.tenant_id.map(TenantId::uuid))
        .bind(e.action)
        .bind(e.target_type)
        .bind(e.target_id)
        .bind(e.request_id)
        .bind(e.server_request_id)
        .bind(outcome(e.outcome))
        .bind(e.code)
        .bind(&e.details)
}

fn outcome(outcome: AuditOutcome) -> &'static str {
    match outcome {
        AuditOutcome::Success => "success",
        AuditOutcome::Failure => "failure",
    }
}

/// Appends an event.
pub async fn insert(conn: &mut Conn, e: &NewAuditEvent<'_>) -> Result<(), StoreError> {
    bind(sqlx::query(&insert_sql(1)), e).execute(conn).await?;
    Ok(())
}

#[derive(sqlx::FromRow)]
struct AuditRow {
    id: Uuid,
    at: DateTime<Utc>,
    actor_sub: String,
    actor_roles: Vec<String>,
    tenant_id: Option<Uuid>,
    action: String,
    target_type: String,
    target_id: Option<Uuid>,
    request_id: String,
    server_request_id: Option<Uuid>,
    outcome: String,
    code: Option<String>,
    details: serde_json::Value,
}

/// Events after `after`, by id; `tenant` (from the caller's scope) overrides the filter's tenant.
pub async fn list(
    conn: &mut Conn,
    tenant: Option<TenantId>,
    filter: &AuditFilter,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<AuditEventView>, StoreError> {
    let outcome = filter.outcome.map(outcome);
    let rows: Vec<AuditRow> = sqlx::query_as(
        "select id, at, actor_sub, actor_roles, tenant_id, action, target_type, target_id, request_id, \
         server_request_id, outcome, code, details from audit_events \
         where ($1::uuid is null or tenant_id = $1) and ($2::text is null or action = $2) \
         and ($3::uuid is null or target_id = $3) and ($4::text is null or actor_sub = $4) \
         and ($5::text is null or outcome = $5) and ($6::timestamptz is null or at >= $6) \
         and ($7::timestamptz is null or at < $7) and ($8::uuid is null or id > $8) \
         order by id limit $9",
    )
    .bind(tenant.or(filter.tenant_id).map(TenantId::uuid))
    .bind(&filter.action)
    .bind(filter.target_id)
    .bind(&filter.actor)
    .bind(outcome)
    .bind(filter.from)
    .bind(filter.to)
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(conn)
    .await?;
    rows.into_iter()
        .map(|r| {
            let outcome = parse_state(&r.outcome, |s| match s {
                "success" => Some(AuditOutcome::Success),
                "failure" => Some(AuditOutcome::Failure),
                _ => None,
            })?;
            Ok(AuditEventView {
                id: AuditEventId(r.id),
                at: r.at,
                actor: AuditActor { sub: r.actor_sub, roles: r.actor_roles },
                tenant_id: r.tenant_id.map(TenantId),
                action: r.action,
                target: AuditTarget { type_: r.target_type, id: r.target_id },
                request_id: r.request_id,
                server_request_id: r.server_request_id,
                outcome,
                code: r.code,
                details: r.details,
            })
        })
        .collect()
}
