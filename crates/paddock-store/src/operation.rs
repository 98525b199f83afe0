//! Operations.

use chrono::{DateTime, Utc};
use paddock_types::operation::{OperationFilter, OperationState, OperationStep, OperationTarget, OperationView};
use paddock_types::problem::Problem;
use paddock_types::{OperationId, TenantId};
use sqlx::types::Json;
use uuid::Uuid;

use crate::{from_json, parse_state, Conn, StoreError};

#[derive(sqlx::FromRow)]
struct OperationRow {
    id: Uuid,
    kind: String,
    target_type: String,
    target_id: Uuid,
    tenant_id: Option<Uuid>,
    state: String,
    steps: serde_json::Value,
    current_step: Option<String>,
    error: Option<serde_json::Value>,
    created_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str =
    "id, kind, target_type, target_id, tenant_id, state, steps, current_step, error, created_at, finished_at";

impl TryFrom<OperationRow> for OperationView {
    type Error = StoreError;
    fn try_from(r: OperationRow) -> Result<Self, StoreError> {
        let steps: Vec<OperationStep> = from_json(r.steps)?;
        let error: Option<Problem> = r.error.map(from_json).transpose()?;
        Ok(OperationView {
            id: OperationId(r.id),
            kind: r.kind,
            target: OperationTarget { type_: r.target_type, id: r.target_id },
            tenant_id: r.tenant_id.map(TenantId),
            state: parse_state(&r.state, OperationState::parse)?,
            steps,
            current_step: r.current_step,
            error,
            created_at: r.created_at,
            finished_at: r.finished_at,
        })
    }
}

/// A new operation.
#[derive(Debug)]
pub struct NewOperation<'a> {
    /// Kind, e.g. `machine_enroll`.
    pub kind: &'a str,
    /// Target resource type.
    pub target_type: &'a str,
    /// Target id.
    pub target_id: Uuid,
    /// Owning tenant, if any.
    pub tenant_id: Option<TenantId>,
    /// The target generation it was created for.
    pub target_generation: i64,
    /// Open operations of these kinds on the same target are superseded by this one.
    pub supersedes: &'a [&'a str],
}

/// Inserts a pending operation. Earlier open operations on the same target of its own kind or of
/// the kinds it supersedes are marked superseded: the newer change is the one carried out.
pub async fn insert(conn: &mut Conn, op: &NewOperation<'_>) -> Result<OperationView, StoreError> {
    sqlx::query(
        "update operations set state = 'superseded', finished_at = now(), updated_at = now() \
         where target_id = $1 and (kind = $2 or kind = any($3)) and state in ('pending', 'running')",
    )
    .bind(op.target_id)
    .bind(op.kind)
    .bind(op.supersedes)
    .execute(&mut *conn)
    .await?;
    let row: OperationRow = sqlx::query_as(&format!(
        "insert into operations (id, kind, target_type, target_id, tenant_id, target_generation) \
         values ($1, $2, $3, $4, $5, $6) returning {COLUMNS}"
    ))
    .bind(OperationId::new().uuid())
    .bind(op.kind)
    .bind(op.target_type)
    .bind(op.target_id)
    .bind(op.tenant_id.map(TenantId::uuid))
    .bind(op.target_generation)
    .fetch_one(conn)
    .await?;
    row.try_into()
}

/// An operation; `tenant` limits the lookup to one tenant's operations.
pub async fn get(
    conn: &mut Conn,
    tenant: Option<TenantId>,
    id: OperationId,
) -> Result<Option<OperationView>, StoreError> {
    let row: Option<OperationRow> = sqlx::query_as(&format!(
        "select {COLUMNS} from operations where id = $1 and ($2::uuid is null or tenant_id = $2)"
    ))
    .bind(id.uuid())
    .bind(tenant.map(TenantId::uuid))
    .fetch_optional(conn)
    .await?;
    row.map(OperationView::try_from).transpose()
}

/// Operations after `after`, by id.
pub async fn list(
    conn: &mut Conn,
    filter: &OperationFilter,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<OperationView>, StoreError> {
    let rows: Vec<OperationRow> = sqlx::query_as(&format!(
        "select {COLUMNS} from operations where ($1::uuid is null or tenant_id = $1) \
         and ($2::uuid is null or target_id = $2) and ($3::text is null or state = $3) \
         and ($4::uuid is null or id > $4) order by id limit $5"
    ))
    .bind(filter.tenant_id.map(TenantId::uuid))
    .bind(filter.target_id)
    .bind(filter.state.map(OperationState::as_str))
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(conn)
    .await?;
    rows.into_iter().map(OperationView::try_from).collect()
}

/// Records progress on the open operations of `targets`: `running`, with their steps and current
/// step. Writes nothing for an operation that already shows exactly this.
pub async fn progress(
    conn: &mut Conn,
    targets: &[Uuid],
    steps: &[OperationStep],
    current_step: Option<&str>,
) -> Result<(), StoreError> {
    sqlx::query(
        "update operations set state = 'running', steps = $2, current_step = $3, updated_at = now() \
         where target_id = any($1) and state in ('pending', 'running') \
           and (state, steps, current_step) is distinct from ('running', $2, $3)",
    )
    .bind(targets)
    .bind(Json(steps))
    .bind(current_step)
    .execute(conn)
    .await?;
    Ok(())
}

/// Completes the open operations on `target` created for a generation up to `generation` (or all
/// of them with `None`: the target is gone). SPEC section 4: an operation succeeds when its
/// target observed the generation it was created for, or the target is gone.
pub async fn succeed(
    conn: &mut Conn,
    target: Uuid,
    generation: Option<i64>,
    steps: &[OperationStep],
) -> Result<(), StoreError> {
    sqlx::query(
        "update operations set state = 'succeeded', steps = $3, current_step = null, finished_at = now(), \
         updated_at = now() where target_id = $1 and state in ('pending', 'running') \
           and ($2::bigint is null or target_generation <= $2)",
    )
    .bind(target)
    .bind(generation)
    .bind(Json(steps))
    .execute(conn)
    .await?;
    Ok(())
}

/// Fails the open operations on `targets` with `problem` (its `instance` is set per operation).
pub async fn fail_open(
    conn: &mut Conn,
    targets: &[Uuid],
    problem: &paddock_types::problem::Problem,
) -> Result<(), StoreError> {
    let problem = serde_json::to_value(problem).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    sqlx::query(
        "update operations set state = 'failed', error = jsonb_set($2, '{instance}', \
           to_jsonb('/v1/operations/' || id::text)), finished_at = now(), updated_at = now() \
         where target_id = any($1) and state in ('pending', 'running')",
    )
    .bind(targets)
    .bind(problem)
    .execute(conn)
    .await?;
    Ok(())
}
