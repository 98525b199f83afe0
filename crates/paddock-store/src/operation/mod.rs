//! Operations, each with its step plan ([`plan`]) and the progress its reconciler reports.

mod plan;

pub use plan::{plan, step, PlanContext};

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
    reason: Option<String>,
    created_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str =
    "id, kind, target_type, target_id, tenant_id, state, steps, current_step, error, reason, created_at, finished_at";

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
            reason: r.reason,
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
    /// The target as the change found it, for the operation's [`plan`].
    pub context: PlanContext,
}

/// Inserts a pending operation with its [`plan`], every step `pending`. Earlier open operations
/// on the same target of its own kind or of the kinds it supersedes are marked superseded (a
/// step they were carrying out with them): the newer change is the one carried out.
pub async fn insert(conn: &mut Conn, op: &NewOperation<'_>) -> Result<OperationView, StoreError> {
    let steps: Vec<OperationStep> = plan(op.kind, op.context)
        .into_iter()
        .map(|name| OperationStep {
            name: name.to_owned(),
            state: OperationState::Pending,
            started_at: None,
            finished_at: None,
        })
        .collect();
    sqlx::query(&format!(
        "update operations o set state = 'superseded', steps = {}, finished_at = now(), updated_at = now() \
         where target_id = $1 and (kind = $2 or kind = any($3)) and state in ('pending', 'running')",
        end_running_steps("o", "superseded")
    ))
    .bind(op.target_id)
    .bind(op.kind)
    .bind(op.supersedes)
    .execute(&mut *conn)
    .await?;
    let row: OperationRow = sqlx::query_as(&format!(
        "insert into operations (id, kind, target_type, target_id, tenant_id, target_generation, steps) \
         values ($1, $2, $3, $4, $5, $6, $7) returning {COLUMNS}"
    ))
    .bind(OperationId::new().uuid())
    .bind(op.kind)
    .bind(op.target_type)
    .bind(op.target_id)
    .bind(op.tenant_id.map(TenantId::uuid))
    .bind(op.target_generation)
    .bind(Json(&steps))
    .fetch_one(conn)
    .await?;
    row.try_into()
}

/// Inserts an operation paddock starts on its own ([`insert`]) with the `reason` people are shown.
pub async fn insert_explained(
    conn: &mut Conn,
    op: &NewOperation<'_>,
    reason: &str,
) -> Result<OperationView, StoreError> {
    let mut view = insert(conn, op).await?;
    sqlx::query("update operations set reason = $2 where id = $1")
        .bind(view.id.uuid())
        .bind(reason)
        .execute(conn)
        .await?;
    view.reason = Some(reason.to_owned());
    Ok(view)
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

/// Records progress on the open operations of `targets`: `running`, with `observed` (the steps
/// the reconciler carries out, as far as it got) merged into each operation's plan by [`merge`].
/// Writes nothing for an operation that already shows exactly this.
pub async fn progress(conn: &mut Conn, targets: &[Uuid], observed: &[OperationStep]) -> Result<(), StoreError> {
    for open in open_of(conn, targets, None).await? {
        let steps = merge(&open.steps, observed, open.created_at, Utc::now(), false);
        let current = steps.iter().find(|s| s.state == OperationState::Running).map(|s| s.name.clone());
        sqlx::query(
            "update operations set state = 'running', steps = $2, current_step = $3, updated_at = now() \
             where id = $1 and state in ('pending', 'running') \
               and (state, steps, current_step) is distinct from ('running', $2, $3)",
        )
        .bind(open.id)
        .bind(Json(&steps))
        .bind(current)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Completes the open operations on `target` created for a generation up to `generation` (or all
/// of them with `None`: the target is gone), with `observed` merged into their steps (steps still
/// running end now). docs/api.md: an operation succeeds when its target observed the
/// generation it was created for, or the target is gone.
pub async fn succeed(
    conn: &mut Conn,
    target: Uuid,
    generation: Option<i64>,
    observed: &[OperationStep],
) -> Result<(), StoreError> {
    for open in open_of(conn, &[target], generation).await? {
        let steps = merge(&open.steps, observed, open.created_at, Utc::now(), true);
        sqlx::query(
            "update operations set state = 'succeeded', steps = $2, current_step = null, finished_at = now(), \
             updated_at = now() where id = $1 and state in ('pending', 'running')",
        )
        .bind(open.id)
        .bind(Json(&steps))
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

struct OpenOperation {
    id: Uuid,
    steps: Vec<OperationStep>,
    created_at: DateTime<Utc>,
}

/// The open operations on `targets` (up to `generation`, if given), locked, oldest first.
async fn open_of(conn: &mut Conn, targets: &[Uuid], generation: Option<i64>) -> Result<Vec<OpenOperation>, StoreError> {
    let rows: Vec<(Uuid, serde_json::Value, DateTime<Utc>)> = sqlx::query_as(
        "select id, steps, created_at from operations where target_id = any($1) \
           and state in ('pending', 'running') and ($2::bigint is null or target_generation <= $2) \
         order by created_at, id for update",
    )
    .bind(targets)
    .bind(generation)
    .fetch_all(conn)
    .await?;
    rows.into_iter()
        .map(|(id, steps, created_at)| Ok(OpenOperation { id, steps: from_json(steps)?, created_at }))
        .collect()
}

/// An operation's steps after a report: its `plan` (the steps as stored, their history kept)
/// with the reconciler's `observed` steps merged in order. A step not in the plan is not this
/// operation's and is left out. A plan step observed `running` starts now; observed `succeeded`
/// or `failed`, it ends (a succeeded step's `finished_at` is when the reconciler saw it done,
/// e.g. its condition's transition); a step already ended keeps its times. The steps run in
/// order, so a step reached ends every unfinished step before it (succeeded, then). Every time
/// lies within `[created_at, now]`, no step starting before the one before it finished. With
/// `finished`, steps still running end now, succeeded; steps never reached stay `pending`.
pub fn merge(
    plan: &[OperationStep],
    observed: &[OperationStep],
    created_at: DateTime<Utc>,
    now: DateTime<Utc>,
    finished: bool,
) -> Vec<OperationStep> {
    let now = now.max(created_at);
    let clamp = |t: DateTime<Utc>| t.clamp(created_at, now);
    let mut steps: Vec<OperationStep> = plan.to_vec();
    for obs in observed {
        let Some(at) = steps.iter().position(|s| s.name == obs.name) else { continue };
        if matches!(obs.state, OperationState::Pending | OperationState::Superseded) || ended(&steps[at]) {
            continue;
        }
        let end = clamp(obs.finished_at.unwrap_or(now));
        for i in 0..at {
            if !ended(&steps[i]) {
                let start = steps[i].started_at.unwrap_or_else(|| last_end(&steps[..i], created_at));
                steps[i].state = OperationState::Succeeded;
                steps[i].started_at = Some(start);
                steps[i].finished_at = Some(end.max(start));
            }
        }
        let before = last_end(&steps[..at], created_at);
        let step = &mut steps[at];
        let start = step.started_at.unwrap_or(match obs.state {
            OperationState::Running => now.max(before),
            _ => before,
        });
        step.started_at = Some(start);
        step.state = obs.state;
        if obs.state != OperationState::Running {
            step.finished_at = Some(end.max(start));
        }
    }
    if finished {
        for s in steps.iter_mut().filter(|s| s.state == OperationState::Running) {
            s.state = OperationState::Succeeded;
            s.finished_at = Some(now.max(s.started_at.unwrap_or(created_at)));
        }
    }
    steps
}

/// A step a reconciler saw done, for [`progress`] and [`succeed`].
pub fn done(name: &str) -> OperationStep {
    OperationStep { name: name.to_owned(), state: OperationState::Succeeded, started_at: None, finished_at: None }
}

fn ended(step: &OperationStep) -> bool {
    matches!(step.state, OperationState::Succeeded | OperationState::Failed)
}

/// When the last of `steps` that ended did (`created_at` if none did).
fn last_end(steps: &[OperationStep], created_at: DateTime<Utc>) -> DateTime<Utc> {
    steps.iter().filter_map(|s| s.finished_at).max().unwrap_or(created_at).max(created_at)
}

/// SQL: the steps of the operation row `alias` with its running steps ended `state` now (how a
/// statement that ends an operation ends its step; `state` is a literal of this crate's).
pub(crate) fn end_running_steps(alias: &str, state: &str) -> String {
    format!(
        "(select coalesce(jsonb_agg(case when s->>'state' = 'running' \
             then s || jsonb_build_object('state', '{state}', 'finished_at', now()) else s end order by n), \
             '[]'::jsonb) from jsonb_array_elements({alias}.steps) with ordinality as e(s, n))"
    )
}

/// Fails the open operations on `targets` with `problem` (its `instance` is set per operation);
/// the step being carried out ends `failed`.
pub async fn fail_open(
    conn: &mut Conn,
    targets: &[Uuid],
    problem: &paddock_types::problem::Problem,
) -> Result<(), StoreError> {
    let problem = serde_json::to_value(problem).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    sqlx::query(&format!(
        "update operations o set state = 'failed', error = jsonb_set($2, '{{instance}}', \
           to_jsonb('/v1/operations/' || id::text)), steps = {}, finished_at = now(), updated_at = now() \
         where target_id = any($1) and state in ('pending', 'running')",
        end_running_steps("o", "failed")
    ))
    .bind(targets)
    .bind(problem)
    .execute(conn)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use chrono::Duration;

    use super::*;

    fn at(name: &str, state: OperationState) -> OperationStep {
        OperationStep { name: name.to_owned(), state, started_at: None, finished_at: None }
    }

    fn plan_of(names: &[&str]) -> Vec<OperationStep> {
        names.iter().map(|n| at(n, OperationState::Pending)).collect()
    }

    #[test]
    fn a_step_reached_ends_the_ones_before_it_and_leaves_the_rest_pending() {
        let t0 = Utc::now();
        let plan = plan_of(&["a", "b", "c"]);
        let first = merge(&plan, &[at("a", OperationState::Running)], t0, t0 + Duration::seconds(1), false);
        let later = t0 + Duration::seconds(5);
        let steps =
            merge(&first, &[at("x", OperationState::Running), at("b", OperationState::Running)], t0, later, false);
        let states: Vec<_> = steps.iter().map(|s| s.state).collect();
        assert_eq!(states, [OperationState::Succeeded, OperationState::Running, OperationState::Pending]);
        assert_eq!(steps[0].started_at, Some(t0 + Duration::seconds(1)), "a keeps its start");
        assert_eq!(steps[0].finished_at, Some(later));
        assert_eq!(steps[1].started_at, Some(later));
        assert_eq!((steps[2].started_at, steps[2].finished_at), (None, None));
    }

    #[test]
    fn finishing_ends_running_steps_and_clamps_times_into_the_operations_life() {
        let t0 = Utc::now();
        let plan = plan_of(&["a", "b", "c"]);
        // A condition that turned true before the operation existed.
        let early = OperationStep { finished_at: Some(t0 - Duration::hours(1)), ..at("a", OperationState::Succeeded) };
        let now = t0 + Duration::seconds(3);
        let steps = merge(&plan, &[early, at("b", OperationState::Running)], t0, now, true);
        assert_eq!((steps[0].started_at, steps[0].finished_at), (Some(t0), Some(t0)));
        assert_eq!((steps[1].state, steps[1].finished_at), (OperationState::Succeeded, Some(now)));
        assert_eq!(steps[2].state, OperationState::Pending, "a step never reached stays pending");
        let failed = merge(&steps, &[at("a", OperationState::Failed)], t0, now, false);
        assert_eq!(failed[0].state, OperationState::Succeeded, "an ended step keeps its end");
    }
}
