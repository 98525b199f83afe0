//! The machine lifecycle's writes beyond inspection (SPEC sections 5 and 6): agent runs, verified
//! cleans, allocation (all-or-nothing, first come first served, within quota) and release.
//!
//! Every write is guarded on the machine's state and status version read before it, so a lost
//! race writes nothing and the caller re-reads. The schema keeps the invariants these functions
//! rely on (see the migration `machine_lifecycle`): an available machine carries an unused verified
//! clean; an allocation consumes one; a machine holds at most one live allocation.
//!
//! Every state transition also appends the machine's custody ledger entry (see `custody`), with
//! its evidence, in the same transaction (a savepoint when the caller already holds one).

use chrono::{DateTime, Utc};
use paddock_domain::ledger::LedgerKey;
use paddock_types::machine::MachineState;
use paddock_types::{ClusterId, MachineClassId, MachineId, NodePoolId, TenantId};
use serde_json::{json, Value};
use sqlx::Connection;
use uuid::Uuid;

use crate::custody::{self, WORKER_ACTOR};
use crate::{job, Conn, StoreError};

/// The states in which a machine serves (or is being given to) its pool: what a pool *holds*.
pub const HELD: [&str; 3] = ["allocated", "provisioning", "active"];

/// Purpose of an agent run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunPurpose {
    /// A wipe in `cleaning`.
    Wipe,
    /// A provisioning boot in `provisioning`.
    Provision,
}

impl RunPurpose {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Wipe => "wipe",
            Self::Provision => "provision",
        }
    }
}

/// The agent run a machine is in.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Run {
    /// The run.
    pub run_id: Uuid,
    /// `wipe` or `provision`.
    pub run_purpose: String,
    /// When the machine was last booted into the run's media.
    pub run_booted_at: Option<DateTime<Utc>>,
    /// When the media were ejected and the boot device set back to disk after the report.
    pub run_finished_at: Option<DateTime<Utc>>,
}

/// The run of a machine, if it is in one.
pub async fn run_of(conn: &mut Conn, id: MachineId) -> Result<Option<Run>, StoreError> {
    Ok(sqlx::query_as(
        "select run_id, run_purpose, run_booted_at, run_finished_at from machines where id = $1 and run_id is not null",
    )
    .bind(id.uuid())
    .fetch_optional(conn)
    .await?)
}

/// A machine's holder as a transition returns it: allocation, tenant, cluster, pool, system UUID.
type Holder = (Option<Uuid>, Option<Uuid>, Option<Uuid>, Option<Uuid>, Option<String>);

fn error_json(code: &str, message: &str) -> Value {
    json!({ "code": code, "message": message, "at": Utc::now() })
}

/// Starts a run for a machine in `state` (decided before the machine boots, so a crash re-enters
/// the same run), optionally moving it to `to` in the same write. Guarded. A move is recorded in
/// the custody ledger in the same transaction.
pub async fn start_run(
    conn: &mut Conn,
    key: &LedgerKey,
    id: MachineId,
    state: MachineState,
    status_version: i64,
    to: MachineState,
    purpose: RunPurpose,
) -> Result<bool, StoreError> {
    let run_id = Uuid::now_v7();
    let mut tx = conn.begin().await?;
    let holder: Option<Holder> = sqlx::query_as(
        "update machines set state = $4, run_id = $5, run_purpose = $6, run_booted_at = null, run_finished_at = null, \
         last_error = null, status_version = status_version + 1, updated_at = now() \
         where id = $1 and state = $2 and status_version = $3 \
         returning allocation_id, tenant_id, cluster_id, node_pool_id, system_uuid",
    )
    .bind(id.uuid())
    .bind(state.as_str())
    .bind(status_version)
    .bind(to.as_str())
    .bind(run_id)
    .bind(purpose.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    let Some((allocation, tenant, cluster, pool, _)) = holder else {
        return Ok(false);
    };
    if state != to {
        let reason = match purpose {
            RunPurpose::Wipe => "wipe started",
            RunPurpose::Provision => "provisioning started: booting the node OS with the cluster's join configuration",
        };
        let evidence = json!({
            "run_id": run_id, "purpose": purpose.as_str(), "allocation_id": allocation,
            "tenant_id": tenant, "cluster_id": cluster, "node_pool_id": pool,
        });
        custody::append(&mut tx, key, id, Some(state), to, WORKER_ACTOR, reason, &evidence).await?;
    }
    tx.commit().await?;
    Ok(true)
}

/// Records that the machine booted into its run's media (now). Guarded.
pub async fn mark_booted(
    conn: &mut Conn,
    id: MachineId,
    state: MachineState,
    status_version: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "update machines set run_booted_at = now(), last_error = null, status_version = status_version + 1, \
         updated_at = now() where id = $1 and state = $2 and status_version = $3 and run_id is not null",
    )
    .bind(id.uuid())
    .bind(state.as_str())
    .bind(status_version)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records that the run's media were ejected and the boot device set back to disk. Guarded.
pub async fn mark_finished(
    conn: &mut Conn,
    id: MachineId,
    state: MachineState,
    status_version: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "update machines set run_finished_at = now(), status_version = status_version + 1, updated_at = now() \
         where id = $1 and state = $2 and status_version = $3 and run_id is not null",
    )
    .bind(id.uuid())
    .bind(state.as_str())
    .bind(status_version)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Ends every unused token of a run now: a re-issued boot of the same run gets a fresh token, and
/// the lost one (its plain text existed only in the seed of a boot that is being replaced) can no
/// longer report.
pub async fn expire_unused_tokens(conn: &mut Conn, run_id: Uuid) -> Result<(), StoreError> {
    sqlx::query("update agent_tokens set expires_at = least(expires_at, now()) where run_id = $1 and used_at is null")
        .bind(run_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// The agent's report of a run, if it arrived.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RunReport {
    /// Whether the report proves the run (a wipe: every listed drive wiped).
    pub verified: bool,
    /// The report as the agent sent it.
    pub report: Value,
    /// When it arrived.
    pub used_at: DateTime<Utc>,
}

/// The report of `run_id` on `machine`, if one arrived.
pub async fn run_report(conn: &mut Conn, machine: MachineId, run_id: Uuid) -> Result<Option<RunReport>, StoreError> {
    Ok(sqlx::query_as(
        "select coalesce(verified, false) as verified, report, used_at from agent_tokens \
         where machine_id = $1 and run_id = $2 and used_at is not null order by used_at limit 1",
    )
    .bind(machine.uuid())
    .bind(run_id)
    .fetch_optional(conn)
    .await?)
}

/// Records a verified wipe and makes the machine `available` (from `cleaning`, guarded), in the
/// caller's transaction; wakes the first cluster waiting for the machine's class. False when
/// someone else moved the machine first (nothing written).
pub async fn complete_clean(
    conn: &mut Conn,
    key: &LedgerKey,
    id: MachineId,
    status_version: i64,
    run_id: Uuid,
    method: &str,
    evidence: &Value,
) -> Result<bool, StoreError> {
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
    let class: Option<(Uuid, Uuid, DateTime<Utc>)> = sqlx::query_as(
        "update machines m set state = 'available', clean_id = c.id, run_id = null, run_purpose = null, \
         run_booted_at = null, run_finished_at = null, last_error = null, status_version = m.status_version + 1, \
         updated_at = now() from machine_cleans c \
         where m.id = $1 and m.state = 'cleaning' and m.status_version = $2 and c.run_id = $3 and c.machine_id = m.id \
         returning m.machine_class_id, c.id, c.completed_at",
    )
    .bind(id.uuid())
    .bind(status_version)
    .bind(run_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((class, clean_id, completed_at)) = class else {
        return Ok(false);
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
    Ok(true)
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

/// Makes a provisioned machine `active` as node `node_name` (from `provisioning`, guarded).
pub async fn activate(
    conn: &mut Conn,
    key: &LedgerKey,
    id: MachineId,
    status_version: i64,
    node_name: &str,
) -> Result<bool, StoreError> {
    let mut tx = conn.begin().await?;
    let holder: Option<Holder> = sqlx::query_as(
        "update machines set state = 'active', node_name = $3, run_id = null, run_purpose = null, \
         run_booted_at = null, run_finished_at = null, last_error = null, status_version = status_version + 1, \
         updated_at = now() where id = $1 and state = 'provisioning' and status_version = $2 \
         returning allocation_id, tenant_id, cluster_id, node_pool_id, system_uuid",
    )
    .bind(id.uuid())
    .bind(status_version)
    .bind(node_name)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((allocation, tenant, cluster, pool, system_uuid)) = holder else {
        return Ok(false);
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
    Ok(true)
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
    let done: Option<(Uuid, Uuid, Uuid, Uuid, Option<String>)> = sqlx::query_as(
        "with m as (update machines set state = 'releasing', status_version = status_version + 1, updated_at = now() \
           where id = $1 and state = $2 and status_version = $3 \
             and state in ('allocated', 'provisioning', 'active', 'provision_failed') \
           returning allocation_id, maintenance_reason) \
         update machine_allocations a set release_started_at = coalesce(a.release_started_at, clock_timestamp()) \
         from m where a.id = m.allocation_id \
         returning a.id, a.tenant_id, a.cluster_id, a.node_pool_id, m.maintenance_reason",
    )
    .bind(id.uuid())
    .bind(from.as_str())
    .bind(status_version)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((allocation, tenant, cluster, pool, maintenance)) = done else {
        return Ok(false);
    };
    let reason = match &maintenance {
        Some(r) => format!("tenancy ends for maintenance: {r}"),
        None => "tenancy ends: the cluster released the machine".to_owned(),
    };
    let evidence = json!({
        "allocation_id": allocation, "tenant_id": tenant, "cluster_id": cluster, "node_pool_id": pool,
        "maintenance_reason": maintenance,
    });
    custody::append(&mut tx, key, id, Some(from), MachineState::Releasing, WORKER_ACTOR, &reason, &evidence).await?;
    tx.commit().await?;
    Ok(true)
}

/// Ends a machine's tenancy: from `releasing` (or `provision_failed`) to `cleaning`, closing its
/// allocation and clearing its holder, in one statement; wakes the cluster it left. Guarded.
pub async fn finish_release(
    conn: &mut Conn,
    key: &LedgerKey,
    id: MachineId,
    from: MachineState,
    status_version: i64,
) -> Result<bool, StoreError> {
    let mut tx = conn.begin().await?;
    let left: Option<(Uuid, Uuid, Uuid)> = sqlx::query_as(
        "with old as (select allocation_id, tenant_id, cluster_id from machines where id = $1), \
         m as (update machines set state = 'cleaning', allocation_id = null, tenant_id = null, cluster_id = null, \
             node_pool_id = null, node_name = null, run_id = null, run_purpose = null, run_booted_at = null, \
             run_finished_at = null, last_error = null, status_version = status_version + 1, updated_at = now() \
           where id = $1 and state = $2 and status_version = $3 and state in ('releasing', 'provision_failed') \
           returning id), \
         a as (update machine_allocations set release_started_at = coalesce(release_started_at, clock_timestamp()), \
             released_at = clock_timestamp() where id = (select allocation_id from old) and exists (select 1 from m) returning id) \
         select old.tenant_id, old.cluster_id, old.allocation_id from old where exists (select 1 from a)",
    )
    .bind(id.uuid())
    .bind(from.as_str())
    .bind(status_version)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((tenant, cluster, allocation)) = left else {
        return Ok(false);
    };
    let evidence = json!({ "allocation_id": allocation, "tenant_id": tenant, "cluster_id": cluster });
    let reason = "tenancy over: the machine is wiped before anyone else gets it";
    custody::append(&mut tx, key, id, Some(from), MachineState::Cleaning, WORKER_ACTOR, reason, &evidence).await?;
    enqueue_cluster(&mut tx, TenantId(tenant), ClusterId(cluster)).await?;
    tx.commit().await?;
    Ok(true)
}

/// Enqueues a cluster's reconcile job (merged with one already queued).
pub async fn enqueue_cluster(conn: &mut Conn, tenant: TenantId, cluster: ClusterId) -> Result<(), StoreError> {
    let new = job::NewJob {
        kind: paddock_domain::job_kind::CLUSTER_RECONCILE,
        target_type: "cluster",
        target_id: cluster.uuid(),
        payload: json!({ "tenant_id": tenant, "cluster_id": cluster }),
        operation_id: None,
        run_at: None,
    };
    job::enqueue(conn, &new).await?;
    Ok(())
}

/// Enqueues a machine's reconcile job (merged with one already queued; no operation).
pub async fn enqueue_machine(conn: &mut Conn, machine: MachineId) -> Result<(), StoreError> {
    let new = job::NewJob {
        kind: paddock_domain::job_kind::MACHINE_RECONCILE,
        target_type: "machine",
        target_id: machine.uuid(),
        payload: json!({ "machine_id": machine }),
        operation_id: None,
        run_at: None,
    };
    job::enqueue(conn, &new).await?;
    Ok(())
}

/// Wakes the first cluster waiting for machines of each class (first come, first served): a
/// machine became available, or an allocation went through and the next in line may fit now.
pub async fn wake_waiting(conn: &mut Conn, classes: &[MachineClassId]) -> Result<(), StoreError> {
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

/// What one pool of a cluster still needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// The pool.
    pub node_pool_id: NodePoolId,
    /// Its class.
    pub machine_class_id: MachineClassId,
    /// GPUs per machine of the class.
    pub gpu_count: u32,
    /// Machines to add.
    pub count: u32,
}

/// How an allocation request ended. Nothing is written unless it is `Allocated`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allocation {
    /// Every need was met: these machines are now `allocated` to the cluster.
    Allocated(Vec<MachineId>),
    /// An earlier waiting cluster needs machines of the same class: it goes first.
    Behind {
        /// The cluster in front.
        cluster_id: ClusterId,
    },
    /// Not enough machines of a class are available.
    Short {
        /// The class's name.
        machine_class: String,
        /// Machines needed.
        needed: u32,
        /// Machines available.
        available: u32,
    },
    /// The tenant's node or GPU quota would be exceeded by what it already holds plus this.
    OverQuota {
        /// Which quota.
        quota: &'static str,
        /// Its limit.
        limit: u64,
        /// What holding the new machines would make.
        would_hold: u64,
    },
}

/// Allocates every need of a cluster in the caller's transaction, all or nothing: locks the
/// classes (one allocator per class at a time), lets an earlier waiting cluster of the same class
/// go first, checks the tenant's quotas against what it already holds, takes clean available
/// machines, consumes each one's verified clean in a new allocation, and enqueues the machines'
/// reconcile jobs. On success the cluster stops waiting; otherwise it starts (keeping its place).
/// The caller commits in either case (the waiting mark is the only write on failure).
pub async fn allocate(
    conn: &mut Conn,
    key: &LedgerKey,
    tenant: TenantId,
    cluster: ClusterId,
    needs: &[Need],
) -> Result<Allocation, StoreError> {
    let mut classes: Vec<Uuid> = needs.iter().map(|n| n.machine_class_id.uuid()).collect();
    classes.sort();
    classes.dedup();
    let names: Vec<(Uuid, String)> =
        sqlx::query_as("select id, name from machine_classes where id = any($1) order by id for no key update")
            .bind(&classes)
            .fetch_all(&mut *conn)
            .await?;
    // The place in line: when it started waiting, or now for a first try.
    let since: DateTime<Utc> =
        sqlx::query_scalar("select coalesce(waiting_since, now()) from clusters where tenant_id = $1 and id = $2")
            .bind(tenant.uuid())
            .bind(cluster.uuid())
            .fetch_one(&mut *conn)
            .await?;
    let outcome = try_allocate(conn, key, tenant, cluster, needs, since, &names).await?;
    match &outcome {
        Allocation::Allocated(_) => {
            sqlx::query("update clusters set waiting_since = null where tenant_id = $1 and id = $2")
                .bind(tenant.uuid())
                .bind(cluster.uuid())
                .execute(&mut *conn)
                .await?;
            // Machines may be left for the next in line.
            let classes: Vec<MachineClassId> = classes.into_iter().map(MachineClassId).collect();
            wake_waiting(conn, &classes).await?;
        }
        // Over its quota, a cluster waits for its own tenant, not in the line: it must not hold
        // up other clusters of the class.
        Allocation::OverQuota { .. } => {
            sqlx::query("update clusters set waiting_since = null where tenant_id = $1 and id = $2")
                .bind(tenant.uuid())
                .bind(cluster.uuid())
                .execute(&mut *conn)
                .await?;
        }
        Allocation::Behind { .. } | Allocation::Short { .. } => {
            sqlx::query(
                "update clusters set waiting_since = coalesce(waiting_since, $3) where tenant_id = $1 and id = $2",
            )
            .bind(tenant.uuid())
            .bind(cluster.uuid())
            .bind(since)
            .execute(&mut *conn)
            .await?;
        }
    }
    Ok(outcome)
}

async fn try_allocate(
    conn: &mut Conn,
    key: &LedgerKey,
    tenant: TenantId,
    cluster: ClusterId,
    needs: &[Need],
    since: DateTime<Utc>,
    names: &[(Uuid, String)],
) -> Result<Allocation, StoreError> {
    let classes: Vec<Uuid> = names.iter().map(|(id, _)| *id).collect();
    let ahead: Option<Uuid> = sqlx::query_scalar(
        "select c.id from clusters c join node_pools p on p.cluster_id = c.id \
         where c.waiting_since is not null and c.id <> $1 and c.deletion_requested_at is null \
           and c.deleted_at is null and (c.waiting_since, c.id) < ($2, $1) \
           and p.machine_class_id = any($3) and p.deleted_at is null and p.deletion_requested_at is null \
           and p.count > (select count(*) from machines m where m.node_pool_id = p.id \
                          and m.state in ('allocated', 'provisioning', 'active')) \
         order by c.waiting_since, c.id limit 1",
    )
    .bind(cluster.uuid())
    .bind(since)
    .bind(&classes)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(ahead) = ahead {
        return Ok(Allocation::Behind { cluster_id: ClusterId(ahead) });
    }

    // Quotas against what the tenant holds (a safety net: the API checks desired counts).
    let (max_nodes, max_gpus): (Option<i32>, Option<i32>) =
        sqlx::query_as("select max_nodes, max_gpus from tenants where id = $1 for update")
            .bind(tenant.uuid())
            .fetch_one(&mut *conn)
            .await?;
    if max_nodes.is_some() || max_gpus.is_some() {
        let (nodes, gpus): (i64, i64) = sqlx::query_as(
            "select count(*), coalesce(sum(c.gpu_count), 0)::bigint from machines m \
             join machine_classes c on c.id = m.machine_class_id where m.tenant_id = $1 \
             and m.state in ('allocated', 'provisioning', 'active')",
        )
        .bind(tenant.uuid())
        .fetch_one(&mut *conn)
        .await?;
        let add_nodes: u64 = needs.iter().map(|n| u64::from(n.count)).sum();
        let add_gpus: u64 = needs.iter().map(|n| u64::from(n.count) * u64::from(n.gpu_count)).sum();
        let held = |v: i64| u64::try_from(v).unwrap_or(0);
        for (quota, limit, would_hold) in
            [("max_nodes", max_nodes, held(nodes) + add_nodes), ("max_gpus", max_gpus, held(gpus) + add_gpus)]
        {
            if let Some(limit) = limit.and_then(|l| u64::try_from(l).ok()) {
                if would_hold > limit {
                    return Ok(Allocation::OverQuota { quota, limit, would_hold });
                }
            }
        }
    }

    let mut picked: Vec<(MachineId, NodePoolId)> = Vec::new();
    for need in needs.iter().filter(|n| n.count > 0) {
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "select id from machines where machine_class_id = $1 and state = 'available' \
             and maintenance_reason is null and retire_requested_at is null and id <> all($2) \
             order by id limit $3 for update skip locked",
        )
        .bind(need.machine_class_id.uuid())
        .bind(picked.iter().map(|(m, _)| m.uuid()).collect::<Vec<_>>())
        .bind(i64::from(need.count))
        .fetch_all(&mut *conn)
        .await?;
        if ids.len() < need.count as usize {
            let machine_class = names
                .iter()
                .find(|(id, _)| *id == need.machine_class_id.uuid())
                .map(|(_, n)| n.clone())
                .unwrap_or_default();
            let available = u32::try_from(ids.len()).unwrap_or(u32::MAX);
            return Ok(Allocation::Short { machine_class, needed: need.count, available });
        }
        picked.extend(ids.into_iter().map(|id| (MachineId(id), need.node_pool_id)));
    }

    let machines: Vec<Uuid> = picked.iter().map(|(m, _)| m.uuid()).collect();
    let pools: Vec<Uuid> = picked.iter().map(|(_, p)| p.uuid()).collect();
    let allocations: Vec<Uuid> = picked.iter().map(|_| Uuid::now_v7()).collect();
    let moved: Vec<(Uuid, Uuid, Uuid, Uuid)> = sqlx::query_as(
        "with pick as (select * from unnest($1::uuid[], $2::uuid[], $3::uuid[]) as t(machine_id, pool_id, alloc_id)), \
         a as (insert into machine_allocations (id, machine_id, clean_id, tenant_id, cluster_id, node_pool_id, \
               allocated_at) select pick.alloc_id, m.id, m.clean_id, $4, $5, pick.pool_id, clock_timestamp() from pick \
               join machines m on m.id = pick.machine_id returning id, machine_id, node_pool_id, clean_id) \
         update machines m set state = 'allocated', clean_id = null, allocation_id = a.id, tenant_id = $4, \
             cluster_id = $5, node_pool_id = a.node_pool_id, last_error = null, \
             status_version = m.status_version + 1, updated_at = now() \
         from a where m.id = a.machine_id and m.state = 'available' \
         returning m.id, a.id, a.node_pool_id, a.clean_id",
    )
    .bind(&machines)
    .bind(&pools)
    .bind(&allocations)
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .fetch_all(&mut *conn)
    .await?;
    if moved.len() != picked.len() {
        // The rows are locked by this transaction: unreachable short of a bug. Refuse loudly.
        return Err(StoreError::Corrupt(format!(
            "allocation updated {} of {} locked machines",
            moved.len(),
            picked.len()
        )));
    }
    // One custody entry per machine, with the allocation and the clean it consumed as evidence.
    let entries: Vec<custody::NewEntry<'_>> = moved
        .iter()
        .map(|(machine, allocation, pool, clean)| custody::NewEntry {
            machine: MachineId(*machine),
            from: Some(MachineState::Available),
            to: MachineState::Allocated,
            actor: WORKER_ACTOR,
            reason: format!("allocated to cluster {cluster} of tenant {tenant}"),
            evidence: json!({ "allocation_id": allocation, "tenant_id": tenant, "cluster_id": cluster,
                "node_pool_id": pool, "clean_id": clean }),
        })
        .collect();
    custody::append_all(conn, key, &entries).await?;
    for (machine, _) in &picked {
        enqueue_machine(conn, *machine).await?;
    }
    Ok(Allocation::Allocated(picked.into_iter().map(|(m, _)| m).collect()))
}

/// A machine of a cluster, as the cluster reconciler needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldMachine {
    /// The machine.
    pub id: MachineId,
    /// Its pool.
    pub node_pool_id: NodePoolId,
    /// Its state (a tenancy state).
    pub state: MachineState,
    /// Its status version (the guard of a release).
    pub status_version: i64,
    /// Its node name once active.
    pub node_name: Option<String>,
}

/// Every machine a cluster holds (tenancy states, `releasing` included), by id.
pub async fn machines_of(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
) -> Result<Vec<HeldMachine>, StoreError> {
    let rows: Vec<(Uuid, Uuid, String, i64, Option<String>)> = sqlx::query_as(
        "select id, node_pool_id, state, status_version, node_name from machines \
         where tenant_id = $1 and cluster_id = $2 order by id",
    )
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .fetch_all(conn)
    .await?;
    rows.into_iter()
        .map(|(id, pool, state, status_version, node_name)| {
            Ok(HeldMachine {
                id: MachineId(id),
                node_pool_id: NodePoolId(pool),
                state: crate::parse_state(&state, MachineState::parse)?,
                status_version,
                node_name,
            })
        })
        .collect()
}
