//! The machine lifecycle's writes beyond inspection (docs/architecture.md): verified cleans,
//! activation and release (agent runs are [`crate::run`], allocation is [`crate::allocation`]).
//!
//! Every write is guarded on the machine's state and status version read before it, so a lost
//! race writes nothing and the caller re-reads. The schema keeps the invariants these functions
//! rely on (see the migration `machine_lifecycle`): an available machine carries an unused verified
//! clean; an allocation consumes one; a machine holds at most one live allocation.
//!
//! Every state transition also appends the machine's custody ledger entry (see `custody`), with
//! its evidence, in the same transaction (a savepoint when the caller already holds one).

use chrono::{DateTime, Utc};
use paddock_domain::job_kind::{ClusterJob, MachineJob, Payload};
use paddock_domain::ledger::LedgerKey;
use paddock_types::machine::MachineState;
use paddock_types::{ClusterId, MachineClassId, MachineId, OperationId, TenantId};
use serde_json::{json, Value};
use sqlx::Connection;
use uuid::Uuid;

use crate::custody::{self, WORKER_ACTOR};
use crate::{job, Conn, StoreError, Txn};

/// An operator's intent as a transition returns it (a maintenance or force-release reason).
type Intent = Option<String>;

/// A machine's holder as its activation returns it: allocation, tenant, cluster, pool, system
/// UUID, and the seconds since its allocation.
type Holder = (Option<Uuid>, Option<Uuid>, Option<Uuid>, Option<Uuid>, Option<String>, Option<f64>);

fn error_json(code: &str, message: &str) -> Value {
    json!({ "code": code, "message": message, "at": Utc::now() })
}

/// Records a verified wipe and makes the machine `available` (from `cleaning`, guarded), in the
/// caller's transaction; wakes the first cluster waiting for the machine's class. Returns how
/// long the machine was in cleaning (from its custody entry into `cleaning` to the clean's
/// completion); `None` when someone else moved the machine first (nothing written).
pub async fn complete_clean(
    conn: &mut Txn<'_>,
    key: &LedgerKey,
    id: MachineId,
    status_version: i64,
    run_id: Uuid,
    method: &str,
    evidence: &Value,
) -> Result<Option<std::time::Duration>, StoreError> {
    sqlx::query(
        "insert into machine_cleans (id, machine_id, run_id, method, evidence, completed_at) \
         values ($1, $2, $3, $4, $5, clock_timestamp()) on conflict (run_id) do nothing",
    )
    .bind(Uuid::now_v7())
    .bind(id.uuid())
    .bind(run_id)
    .bind(method)
    .bind(evidence)
    .execute(&mut *conn)
    .await?;
    // Every move into cleaning appended a custody entry in its transaction: the latest one is
    // when this stay began.
    let class: Option<(Uuid, Uuid, DateTime<Utc>, Option<f64>)> = sqlx::query_as(
        "update machines m set state = 'available', clean_id = c.id, run_id = null, run_purpose = null, \
         run_booted_at = null, run_finished_at = null, last_error = null, status_version = m.status_version + 1, \
         updated_at = now() from machine_cleans c \
         where m.id = $1 and m.state = 'cleaning' and m.status_version = $2 and c.run_id = $3 and c.machine_id = m.id \
         returning m.machine_class_id, c.id, c.completed_at, extract(epoch from c.completed_at - \
           (select max(e.at) from custody_entries e where e.machine_id = m.id and e.to_state = 'cleaning'))::float8",
    )
    .bind(id.uuid())
    .bind(status_version)
    .bind(run_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((class, clean_id, completed_at, in_cleaning)) = class else {
        return Ok(None);
    };
    // The clean's record (with the agent's wipe report) is the evidence of the clean.
    let mut record = match evidence {
        Value::Object(fields) => fields.clone(),
        other => serde_json::Map::from_iter([("report".to_owned(), other.clone())]),
    };
    record.insert("clean_id".to_owned(), json!(clean_id));
    record.insert("run_id".to_owned(), json!(run_id));
    record.insert("method".to_owned(), json!(method));
    record.insert("completed_at".to_owned(), json!(completed_at));
    let evidence = Value::Object(record);
    let (from, to) = (MachineState::Cleaning, MachineState::Available);
    custody::append(conn, key, id, Some(from), to, WORKER_ACTOR, "verified wipe: every listed drive wiped", &evidence)
        .await?;
    wake_waiting(conn, &[MachineClassId(class)]).await?;
    Ok(Some(seconds(in_cleaning)))
}

/// A span the database measured, in seconds (none or negative: zero).
fn seconds(span: Option<f64>) -> std::time::Duration {
    std::time::Duration::try_from_secs_f64(span.unwrap_or(0.0)).unwrap_or_default()
}

/// Moves a machine from `from` to `to` ending its run, with `last_error` (code, message);
/// `maintenance_reason` is recorded when given. Guarded. For a failed wipe (`clean_failed`), a
/// failed or abandoned provisioning boot (`provision_failed`) and maintenance.
#[expect(clippy::too_many_arguments, reason = "the guarded move, its error and reason, and the ledger key")]
pub async fn end_run(
    conn: &mut Conn,
    key: &LedgerKey,
    id: MachineId,
    from: MachineState,
    status_version: i64,
    to: MachineState,
    error: Option<(&str, &str)>,
    maintenance_reason: Option<&str>,
) -> Result<bool, StoreError> {
    let mut tx = conn.begin().await?;
    // `old` is the row as the statement found it: the run this ends.
    let moved: Option<(Option<Uuid>, Option<String>, Option<Uuid>)> = sqlx::query_as(
        "update machines m set state = $4, run_id = null, run_purpose = null, run_booted_at = null, \
         run_finished_at = null, last_error = $5, maintenance_reason = coalesce($6, m.maintenance_reason), \
         status_version = m.status_version + 1, updated_at = now() \
         from machines old where old.id = m.id and m.id = $1 and m.state = $2 and m.status_version = $3 \
         returning old.run_id, m.maintenance_reason, m.allocation_id",
    )
    .bind(id.uuid())
    .bind(from.as_str())
    .bind(status_version)
    .bind(to.as_str())
    .bind(error.map(|(code, message)| error_json(code, message)))
    .bind(maintenance_reason)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((run_id, reason_now, allocation)) = moved else {
        return Ok(false);
    };
    if to == MachineState::ProvisionFailed {
        // A failed provisioning is a release that did not follow `active`: its deadline
        // (PADDOCK_RELEASE_TIMEOUT) runs from here.
        sqlx::query(
            "update machine_allocations set release_started_at = coalesce(release_started_at, clock_timestamp()) \
             where id = $1",
        )
        .bind(allocation)
        .execute(&mut *tx)
        .await?;
    }
    let reason = match (error, to) {
        (Some((_, message)), _) => message.to_owned(),
        (None, MachineState::Maintenance) => reason_now.clone().unwrap_or_else(|| "taken out of service".to_owned()),
        (None, _) => format!("moved from {} to {}", from.as_str(), to.as_str()),
    };
    let evidence = json!({
        "run_id": run_id,
        "error": error.map(|(code, message)| json!({ "code": code, "message": message })),
        "maintenance_reason": reason_now,
        "allocation_id": allocation,
    });
    custody::append(&mut tx, key, id, Some(from), to, WORKER_ACTOR, &reason, &evidence).await?;
    tx.commit().await?;
    Ok(true)
}

/// The error code (and custody evidence `code`) of a Node that registered under a machine's node
/// name with another machine's system UUID (docs/architecture.md, "Provisioning").
pub const NODE_UUID_MISMATCH: &str = "node_uuid_mismatch";

/// A Node found under a provisioning machine's node name with a system UUID not its own.
#[derive(Debug, Clone)]
pub struct UuidMismatch<'a> {
    /// The Node's name (the machine's expected node name).
    pub node_name: &'a str,
    /// The machine's system UUID.
    pub expected: &'a str,
    /// The UUID the Node reported.
    pub found: &'a str,
}

/// Ends a provisioning run on a [`UuidMismatch`] (guarded, like [`end_run`]): the machine moves to
/// `provision_failed` with [`NODE_UUID_MISMATCH`], and the finding goes on the custody ledger of
/// the machine and, when paddock holds a record with the UUID the Node reported, on that
/// machine's too (an entry that keeps its state), in the caller's transaction. False when someone
/// else moved the machine first (nothing written).
pub async fn fail_node_uuid_mismatch(
    conn: &mut Conn,
    key: &LedgerKey,
    id: MachineId,
    status_version: i64,
    mismatch: &UuidMismatch<'_>,
) -> Result<bool, StoreError> {
    let UuidMismatch { node_name, expected, found } = *mismatch;
    let message =
        format!("node {node_name} registered with system UUID {found}, not this machine's {expected}: it was deleted");
    let error = Some((NODE_UUID_MISMATCH, message.as_str()));
    let (from, to) = (MachineState::Provisioning, MachineState::ProvisionFailed);
    if !end_run(conn, key, id, from, status_version, to, error, None).await? {
        return Ok(false);
    }
    let Some((holder, holder_name)) = crate::machine::system_uuid_holder(conn, id, found).await? else {
        return Ok(true);
    };
    // The holder's row lock: appends of one machine never interleave (see `custody`).
    let state: String = sqlx::query_scalar("select state from machines where id = $1 for update")
        .bind(holder.uuid())
        .fetch_one(&mut *conn)
        .await?;
    let state = MachineState::parse(&state)
        .ok_or_else(|| StoreError::Corrupt(format!("machine {holder} is in an unknown state {state}")))?;
    let reason = format!(
        "a node registered as {node_name} (machine {id}) with this machine's system UUID {found}; it was deleted"
    );
    let evidence = json!({
        "code": NODE_UUID_MISMATCH, "node_name": node_name, "system_uuid": found,
        "registered_for": id, "registered_for_system_uuid": expected, "holder_name": holder_name,
    });
    custody::append(conn, key, holder, Some(state), state, WORKER_ACTOR, &reason, &evidence).await?;
    Ok(true)
}

/// Makes a provisioned machine `active` as node `node_name` (from `provisioning`, guarded).
/// Returns how long that took from the machine's allocation; `None` when someone else moved the
/// machine first (nothing written).
pub async fn activate(
    conn: &mut Conn,
    key: &LedgerKey,
    id: MachineId,
    status_version: i64,
    node_name: &str,
) -> Result<Option<std::time::Duration>, StoreError> {
    let mut tx = conn.begin().await?;
    let holder: Option<Holder> = sqlx::query_as(
        "update machines m set state = 'active', node_name = $3, run_id = null, run_purpose = null, \
         run_booted_at = null, run_finished_at = null, last_error = null, status_version = status_version + 1, \
         updated_at = now() where id = $1 and state = 'provisioning' and status_version = $2 \
         returning allocation_id, tenant_id, cluster_id, node_pool_id, system_uuid, extract(epoch from now() - \
           (select a.allocated_at from machine_allocations a where a.id = m.allocation_id))::float8",
    )
    .bind(id.uuid())
    .bind(status_version)
    .bind(node_name)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((allocation, tenant, cluster, pool, system_uuid, since_allocation)) = holder else {
        return Ok(None);
    };
    // The node that joined is the evidence: its name and the system UUID it was matched by.
    let evidence = json!({
        "node_name": node_name, "system_uuid": system_uuid, "allocation_id": allocation,
        "tenant_id": tenant, "cluster_id": cluster, "node_pool_id": pool,
    });
    let reason = format!("node {node_name} joined the cluster and is Ready");
    let (from, to) = (MachineState::Provisioning, MachineState::Active);
    custody::append(&mut tx, key, id, Some(from), to, WORKER_ACTOR, &reason, &evidence).await?;
    tx.commit().await?;
    Ok(Some(seconds(since_allocation)))
}

/// Starts the release of a machine that holds a tenancy (`allocated`, `provisioning`, `active`
/// or `provision_failed`): it moves to `releasing` and its allocation records when the release
/// started (billing stops there). Guarded on the state and version read.
pub async fn begin_release(
    conn: &mut Conn,
    key: &LedgerKey,
    id: MachineId,
    from: MachineState,
    status_version: i64,
) -> Result<bool, StoreError> {
    let mut tx = conn.begin().await?;
    let done: Option<(Uuid, Uuid, Uuid, Uuid, Intent, Intent)> = sqlx::query_as(
        "with m as (update machines set state = 'releasing', status_version = status_version + 1, updated_at = now() \
           where id = $1 and state = $2 and status_version = $3 \
             and state in ('allocated', 'provisioning', 'active', 'provision_failed') \
           returning allocation_id, maintenance_reason, force_release_reason) \
         update machine_allocations a set release_started_at = coalesce(a.release_started_at, clock_timestamp()) \
         from m where a.id = m.allocation_id \
         returning a.id, a.tenant_id, a.cluster_id, a.node_pool_id, m.maintenance_reason, m.force_release_reason",
    )
    .bind(id.uuid())
    .bind(from.as_str())
    .bind(status_version)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((allocation, tenant, cluster, pool, maintenance, forced)) = done else {
        return Ok(false);
    };
    let reason = match (&forced, &maintenance) {
        (Some(r), _) => format!("tenancy ends: an operator forces its release: {r}"),
        (None, Some(r)) => format!("tenancy ends for maintenance: {r}"),
        (None, None) => "tenancy ends: the cluster released the machine".to_owned(),
    };
    let evidence = json!({
        "allocation_id": allocation, "tenant_id": tenant, "cluster_id": cluster, "node_pool_id": pool,
        "maintenance_reason": maintenance, "force_release_reason": forced,
    });
    custody::append(&mut tx, key, id, Some(from), MachineState::Releasing, WORKER_ACTOR, &reason, &evidence).await?;
    tx.commit().await?;
    Ok(true)
}

/// Ends a machine's tenancy: from `releasing` (or `provision_failed`) to `cleaning`, closing its
/// allocation and clearing its holder, in one statement; wakes the cluster it left. Guarded.
pub async fn finish_release(
    conn: &mut Txn<'_>,
    key: &LedgerKey,
    id: MachineId,
    from: MachineState,
    status_version: i64,
) -> Result<bool, StoreError> {
    end_tenancy(conn, key, id, from, status_version, None).await
}

/// Ends a machine's tenancy like [`finish_release`], but into `maintenance` with `failure`
/// (code, message) as its maintenance reason (the code) and last error: a forced release whose
/// power-off failed (docs/architecture.md). The machine leaves maintenance only through cleaning.
pub async fn end_tenancy_in_maintenance(
    conn: &mut Txn<'_>,
    key: &LedgerKey,
    id: MachineId,
    from: MachineState,
    status_version: i64,
    failure: (&str, &str),
) -> Result<bool, StoreError> {
    end_tenancy(conn, key, id, from, status_version, Some(failure)).await
}

/// The one statement that ends a tenancy: to `cleaning`, or to `maintenance` with a failure.
async fn end_tenancy(
    conn: &mut Txn<'_>,
    key: &LedgerKey,
    id: MachineId,
    from: MachineState,
    status_version: i64,
    failure: Option<(&str, &str)>,
) -> Result<bool, StoreError> {
    let to = if failure.is_some() { MachineState::Maintenance } else { MachineState::Cleaning };
    let mut tx = conn.begin().await?;
    let left: Option<(Uuid, Uuid, Uuid, Option<DateTime<Utc>>)> = sqlx::query_as(
        "with old as (select allocation_id, tenant_id, cluster_id from machines where id = $1), \
         m as (update machines set state = $4, allocation_id = null, tenant_id = null, cluster_id = null, \
             node_pool_id = null, node_name = null, run_id = null, run_purpose = null, run_booted_at = null, \
             run_finished_at = null, last_error = $6, maintenance_reason = coalesce($5, maintenance_reason), \
             force_release_reason = null, force_release_requested_by = null, \
             status_version = status_version + 1, updated_at = now() \
           where id = $1 and state = $2 and status_version = $3 and state in ('releasing', 'provision_failed') \
           returning id), \
         a as (update machine_allocations set release_started_at = coalesce(release_started_at, clock_timestamp()), \
             released_at = clock_timestamp() where id = (select allocation_id from old) and exists (select 1 from m) \
             returning id, release_forced_at) \
         select old.tenant_id, old.cluster_id, old.allocation_id, a.release_forced_at from old, a",
    )
    .bind(id.uuid())
    .bind(from.as_str())
    .bind(status_version)
    .bind(to.as_str())
    .bind(failure.map(|(code, _)| code))
    .bind(failure.map(|(code, message)| error_json(code, message)))
    .fetch_optional(&mut *tx)
    .await?;
    let Some((tenant, cluster, allocation, forced_at)) = left else {
        return Ok(false);
    };
    let evidence = json!({
        "allocation_id": allocation, "tenant_id": tenant, "cluster_id": cluster, "release_forced_at": forced_at,
        "error": failure.map(|(code, message)| json!({ "code": code, "message": message })),
    });
    let reason = match failure {
        None => "tenancy over: the machine is wiped before anyone else gets it".to_owned(),
        Some((code, message)) => format!("tenancy over, out of service ({code}): {message}"),
    };
    custody::append(&mut tx, key, id, Some(from), to, WORKER_ACTOR, &reason, &evidence).await?;
    enqueue_cluster(&mut tx, TenantId(tenant), ClusterId(cluster)).await?;
    tx.commit().await?;
    Ok(true)
}

/// Where a machine's release stands, for its deadline: the allocation, when the release started
/// (for a machine that failed provisioning before that was recorded: its latest transition) and
/// when it was forced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseClock {
    /// The allocation being released.
    pub allocation_id: Uuid,
    /// When the release started; the deadline counts from here.
    pub started_at: DateTime<Utc>,
    /// When the release was forced (the machine left the tenant's control), if it was.
    pub forced_at: Option<DateTime<Utc>>,
}

/// The release clock of the machine's live allocation; `None` when it holds none.
pub async fn release_clock(conn: &mut Conn, id: MachineId) -> Result<Option<ReleaseClock>, StoreError> {
    let row: Option<(Uuid, DateTime<Utc>, Option<DateTime<Utc>>)> = sqlx::query_as(
        "select a.id, coalesce(a.release_started_at, \
             (select max(e.at) from custody_entries e where e.machine_id = m.id), a.allocated_at), \
           a.release_forced_at \
         from machines m join machine_allocations a on a.id = m.allocation_id where m.id = $1",
    )
    .bind(id.uuid())
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|(allocation_id, started_at, forced_at)| ReleaseClock { allocation_id, started_at, forced_at }))
}

/// Records that a release is forced (docs/security.md): the moment the machine leaves the tenant's
/// control. In one transaction, guarded on the state (`releasing` or `provision_failed`, which
/// it keeps) and status version: the allocation's `release_forced_at`, the ledger entry with
/// `reason` and `evidence` (plus the holder and who asked), and the close of the machine's usage
/// segment at this moment (docs/billing.md). False when someone else moved the machine first, or
/// the release was already forced (nothing written).
pub async fn record_forced_release(
    conn: &mut Conn,
    key: &LedgerKey,
    id: MachineId,
    from: MachineState,
    status_version: i64,
    reason: &str,
    evidence: &Value,
) -> Result<bool, StoreError> {
    let mut tx = conn.begin().await?;
    let holder: Option<(Uuid, Uuid, Uuid, Uuid, Option<String>)> = sqlx::query_as(
        "with m as (update machines set status_version = status_version + 1, updated_at = now() \
           where id = $1 and state = $2 and status_version = $3 and state in ('releasing', 'provision_failed') \
           returning allocation_id, force_release_requested_by) \
         select a.id, a.tenant_id, a.cluster_id, a.node_pool_id, m.force_release_requested_by \
         from m join machine_allocations a on a.id = m.allocation_id where a.release_forced_at is null",
    )
    .bind(id.uuid())
    .bind(from.as_str())
    .bind(status_version)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((allocation, tenant, cluster, pool, requested_by)) = holder else {
        // Dropping the transaction rolls back the version bump of a release forced already.
        return Ok(false);
    };
    // Billing stops here, whatever the power-off does next: the segment closes now, and the
    // forcing is recorded at the very second it closed at (or now, for a machine never active).
    crate::usage::close_machine_segment(&mut tx, id, reason).await?;
    let forced_at: DateTime<Utc> = sqlx::query_scalar(
        "update machine_allocations a set release_forced_at = coalesce((select s.end_at from usage_segments s \
             where s.allocation_id = a.id and s.kind = 'machine'), clock_timestamp()) \
         where a.id = $1 returning a.release_forced_at",
    )
    .bind(allocation)
    .fetch_one(&mut *tx)
    .await?;
    let mut record = match evidence {
        Value::Object(fields) => fields.clone(),
        other => serde_json::Map::from_iter([("detail".to_owned(), other.clone())]),
    };
    for (k, v) in [
        ("allocation_id", json!(allocation)),
        ("tenant_id", json!(tenant)),
        ("cluster_id", json!(cluster)),
        ("node_pool_id", json!(pool)),
        ("requested_by", json!(requested_by)),
        ("release_forced_at", json!(forced_at)),
    ] {
        record.insert(k.to_owned(), v);
    }
    custody::append(&mut tx, key, id, Some(from), from, WORKER_ACTOR, reason, &Value::Object(record)).await?;
    tx.commit().await?;
    Ok(true)
}

/// Enqueues a cluster's reconcile job (merged with one already queued).
pub async fn enqueue_cluster(conn: &mut Txn<'_>, tenant: TenantId, cluster: ClusterId) -> Result<(), StoreError> {
    enqueue_cluster_job(conn, paddock_domain::job_kind::CLUSTER_RECONCILE, tenant, cluster).await
}

/// Enqueues a cluster's identity sync (merged with one already queued): see
/// [`paddock_domain::job_kind::CLUSTER_IDENTITY_SYNC`].
pub async fn enqueue_identity_sync(conn: &mut Txn<'_>, tenant: TenantId, cluster: ClusterId) -> Result<(), StoreError> {
    enqueue_cluster_job(conn, paddock_domain::job_kind::CLUSTER_IDENTITY_SYNC, tenant, cluster).await
}

/// Enqueues a job of `kind` on a cluster, its payload the cluster's ids (merged with one of the
/// same kind already queued for it).
async fn enqueue_cluster_job(
    conn: &mut Txn<'_>,
    kind: &'static str,
    tenant: TenantId,
    cluster: ClusterId,
) -> Result<(), StoreError> {
    let new = job::NewJob {
        kind,
        target_type: "cluster",
        target_id: cluster.uuid(),
        payload: ClusterJob { tenant_id: tenant, cluster_id: cluster }.to_value(),
        tenant_id: Some(tenant),
        operation_id: None,
        run_at: None,
    };
    job::enqueue(conn, &new).await?;
    Ok(())
}

/// Enqueues a machine's reconcile job (merged with one already queued), reporting to `operation`
/// when an accepted request asked for it. The job works for the tenant holding the machine now
/// (none while it is the fleet's): provisioning and releasing talk to that tenant's cluster.
pub async fn enqueue_machine(
    conn: &mut Txn<'_>,
    machine: MachineId,
    operation: Option<OperationId>,
) -> Result<(), StoreError> {
    let tenant: Option<Uuid> = sqlx::query_scalar("select tenant_id from machines where id = $1")
        .bind(machine.uuid())
        .fetch_optional(&mut *conn)
        .await?
        .flatten();
    let new = job::NewJob {
        kind: paddock_domain::job_kind::MACHINE_RECONCILE,
        target_type: "machine",
        target_id: machine.uuid(),
        payload: MachineJob { machine_id: machine }.to_value(),
        tenant_id: tenant.map(TenantId),
        operation_id: operation,
        run_at: None,
    };
    job::enqueue(conn, &new).await?;
    Ok(())
}

/// Wakes the first cluster waiting for machines of each class (first come, first served): a
/// machine became available, or an allocation went through and the next in line may fit now.
pub async fn wake_waiting(conn: &mut Txn<'_>, classes: &[MachineClassId]) -> Result<(), StoreError> {
    let ids: Vec<Uuid> = classes.iter().map(|c| c.uuid()).collect();
    let heads: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "select distinct on (p.machine_class_id) c.tenant_id, c.id from clusters c \
         join node_pools p on p.cluster_id = c.id and p.deleted_at is null and p.deletion_requested_at is null \
         where c.waiting_since is not null and c.deletion_requested_at is null and c.deleted_at is null \
           and p.machine_class_id = any($1) \
         order by p.machine_class_id, c.waiting_since, c.id",
    )
    .bind(&ids)
    .fetch_all(&mut *conn)
    .await?;
    for (tenant, cluster) in heads {
        enqueue_cluster(conn, TenantId(tenant), ClusterId(cluster)).await?;
    }
    Ok(())
}
