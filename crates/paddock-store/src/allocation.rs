//! Allocation (docs/architecture.md, cluster reconciler step 3): a cluster's shortfall is allocated
//! all or nothing, first
//! come first served among the clusters waiting for a class, within the tenant's quotas, in the
//! caller's transaction; and what a cluster holds.
//!
//! The schema keeps the invariants these functions rely on (see the migration
//! `machine_lifecycle`): an available machine carries an unused verified clean; an allocation
//! consumes one; a machine holds at most one live allocation. Releases are machine lifecycle
//! transitions ([`crate::lifecycle::begin_release`], [`crate::lifecycle::finish_release`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use paddock_domain::cluster::{quota_excess, Demand};
use paddock_domain::ledger::LedgerKey;
use paddock_domain::machine::HELD;
use paddock_types::machine::MachineState;
use paddock_types::tenant::Quotas;
use paddock_types::{ClusterId, MachineClassId, MachineId, NodePoolId, TenantId};
use serde_json::json;
use sqlx::Row;
use uuid::Uuid;

use crate::custody::{self, WORKER_ACTOR};
use crate::lifecycle::{enqueue_machine, wake_waiting};
use crate::{Conn, StoreError, Txn};

/// [`HELD`] as stored, for queries.
fn held() -> [&'static str; 3] {
    HELD.map(MachineState::as_str)
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
        /// When its head timeout ends: from then on it holds this one back no more.
        until: DateTime<Utc>,
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
/// go first for at most `head_timeout` (after it, machines freed since are kept for that head),
/// checks the tenant's quotas against what it already holds, takes clean available
/// machines and consumes each one's verified clean in a new allocation. On success the cluster
/// stops waiting; otherwise it starts (keeping its place). The caller commits in either case (the
/// waiting mark is the only write on failure).
///
/// The class lock is held until the caller's commit, and every allocator of the class queues on
/// it: the caller takes it last in its transaction and commits right after (nothing but the
/// allocation's own writes in between), and hands the machines over with [`hand_over`] in a
/// transaction of its own once the allocation is committed.
pub async fn allocate(
    conn: &mut Conn,
    key: &LedgerKey,
    tenant: TenantId,
    cluster: ClusterId,
    needs: &[Need],
    head_timeout: Duration,
) -> Result<Allocation, StoreError> {
    let mut classes: Vec<Uuid> = needs.iter().map(|n| n.machine_class_id.uuid()).collect();
    classes.sort();
    classes.dedup();
    // The place in line: when it started waiting, or now (the transaction's start) for a first
    // try. Read before the lock: only this cluster's own run writes it, and no allocator of the
    // class needs to wait for this read.
    let since: DateTime<Utc> =
        sqlx::query_scalar("select coalesce(waiting_since, now()) from clusters where tenant_id = $1 and id = $2")
            .bind(tenant.uuid())
            .bind(cluster.uuid())
            .fetch_one(&mut *conn)
            .await?;
    let names: Vec<(Uuid, String)> =
        sqlx::query_as("select id, name from machine_classes where id = any($1) order by id for no key update")
            .bind(&classes)
            .fetch_all(&mut *conn)
            .await?;
    let line = Line { since, head_timeout };
    let outcome = try_allocate(conn, key, tenant, cluster, needs, line, &names).await?;
    match &outcome {
        // Over its quota, a cluster waits for its own tenant, not in the line: it must not hold
        // up other clusters of the class.
        Allocation::Allocated(_) | Allocation::OverQuota { .. } => {
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

/// What follows a committed allocation of `machines` for `needs`, in a transaction of its own
/// after the allocation's commit (so that no allocator of the class waits for it): the machines'
/// reconcile jobs, and a wake-up for the first cluster waiting for each class, for whom machines
/// may be left. Both are also done without it: the allocating cluster's run, which is still
/// leased when this is called and runs again if it ends before, queues the jobs of its
/// `allocated` machines once its control plane is up, and a waiting cluster tries again within
/// its wait. A wake-up sent after the commit cannot reach a run that would not see the machines.
pub async fn hand_over(conn: &mut Txn<'_>, machines: &[MachineId], needs: &[Need]) -> Result<(), StoreError> {
    for machine in machines {
        enqueue_machine(conn, *machine, None).await?;
    }
    let mut classes: Vec<MachineClassId> = needs.iter().map(|n| n.machine_class_id).collect();
    classes.sort_by_key(|c| c.uuid());
    classes.dedup();
    wake_waiting(conn, &classes).await
}

/// How long the cluster has waited in line for machines as of the transaction's start: since its
/// first try that found too few machines or an earlier cluster ahead; zero when it is not waiting
/// (before a first try, or while it waits over its tenant's quota). Read in the transaction of an
/// [`allocate`], before it: when that ends `Allocated`, this is how long the allocation waited.
pub async fn waited(conn: &mut Conn, tenant: TenantId, cluster: ClusterId) -> Result<Duration, StoreError> {
    let seconds: Option<f64> = sqlx::query_scalar(
        "select extract(epoch from now() - coalesce(waiting_since, now()))::float8 from clusters \
         where tenant_id = $1 and id = $2",
    )
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .fetch_optional(&mut *conn)
    .await?;
    Ok(Duration::try_from_secs_f64(seconds.unwrap_or(0.0)).unwrap_or_default())
}

/// A cluster's place in the line of its classes.
#[derive(Debug, Clone, Copy)]
struct Line {
    /// When it started waiting (now for a first try).
    since: DateTime<Utc>,
    /// How long a waiting cluster may hold back later ones (`PADDOCK_ALLOCATION_HEAD_TIMEOUT`).
    head_timeout: Duration,
}

impl Line {
    fn timeout_secs(self) -> f64 {
        self.head_timeout.as_secs_f64()
    }
}

/// One allocation attempt, in the order docs/architecture.md, cluster reconciler step 3 gives: an
/// earlier waiting cluster
/// of the class goes first (until its head timeout), then the tenant's quotas, then the machines
/// themselves (without those kept for a head past its timeout).
async fn try_allocate(
    conn: &mut Conn,
    key: &LedgerKey,
    tenant: TenantId,
    cluster: ClusterId,
    needs: &[Need],
    line: Line,
    names: &[(Uuid, String)],
) -> Result<Allocation, StoreError> {
    let classes: Vec<Uuid> = names.iter().map(|(id, _)| *id).collect();
    if let Some((ahead, until)) = waiting_ahead(conn, cluster, line, &classes).await? {
        return Ok(Allocation::Behind { cluster_id: ahead, until });
    }
    if let Some(over) = over_quota(conn, tenant, needs).await? {
        return Ok(over);
    }
    let picked = match pick(conn, cluster, line, needs, names).await? {
        Ok(picked) => picked,
        Err(short) => return Ok(short),
    };
    assign(conn, key, tenant, cluster, &picked).await?;
    Ok(Allocation::Allocated(picked.into_iter().map(|(m, _)| m).collect()))
}

/// The clusters that wait for machines of one of `classes` since before `line.since` (ties by
/// id) and still lack some, as SQL over `c` and `p` (binds `$1` cluster, `$2` since, `$3`
/// classes, `$4` held states).
const AHEAD: &str = "from clusters c join node_pools p on p.cluster_id = c.id \
     where c.waiting_since is not null and c.id <> $1 and c.deletion_requested_at is null \
       and c.deleted_at is null and (c.waiting_since, c.id) < ($2, $1) \
       and p.machine_class_id = any($3) and p.deleted_at is null and p.deletion_requested_at is null \
       and coalesce(p.desired_count, p.count) > (select count(*) from machines m where m.node_pool_id = p.id and m.state = any($4) \
         and not exists (select 1 from machine_remediations r where r.machine_id = m.id and r.ended_at is null \
           and r.state in ('awaiting_spare', 'replacing')))";

/// The first cluster ahead (see [`AHEAD`]) still within its head timeout, and when that ends:
/// it goes first until then.
async fn waiting_ahead(
    conn: &mut Conn,
    cluster: ClusterId,
    line: Line,
    classes: &[Uuid],
) -> Result<Option<(ClusterId, DateTime<Utc>)>, StoreError> {
    let sql = format!(
        "select c.id, c.waiting_since + make_interval(secs => $5) {AHEAD} \
           and c.waiting_since > now() - make_interval(secs => $5) \
         order by c.waiting_since, c.id limit 1"
    );
    let ahead: Option<(Uuid, DateTime<Utc>)> = sqlx::query_as(&sql)
        .bind(cluster.uuid())
        .bind(line.since)
        .bind(classes)
        .bind(&held()[..])
        .bind(line.timeout_secs())
        .fetch_optional(&mut *conn)
        .await?;
    Ok(ahead.map(|(id, until)| (ClusterId(id), until)))
}

/// The tenant's node and GPU quotas against what it holds plus `needs` (the rule of
/// [`quota_excess`], which the API applies to desired counts), with the tenant row locked: a
/// safety net behind the API's check. A machine being replaced (a remediation awaiting or
/// provisioning its spare) is not counted: its spare takes its place, not a second one.
async fn over_quota(conn: &mut Conn, tenant: TenantId, needs: &[Need]) -> Result<Option<Allocation>, StoreError> {
    let (max_nodes, max_gpus): (Option<i32>, Option<i32>) =
        sqlx::query_as("select max_nodes, max_gpus from tenants where id = $1 for no key update")
            .bind(tenant.uuid())
            .fetch_one(&mut *conn)
            .await?;
    if max_nodes.is_none() && max_gpus.is_none() {
        return Ok(None);
    }
    let (nodes, gpus): (i64, i64) = sqlx::query_as(
        "select count(*), coalesce(sum(c.gpu_count), 0)::bigint from machines m \
         join machine_classes c on c.id = m.machine_class_id where m.tenant_id = $1 \
         and m.state = any($2) and not exists (select 1 from machine_remediations r where r.machine_id = m.id \
           and r.ended_at is null and r.state in ('awaiting_spare', 'replacing'))",
    )
    .bind(tenant.uuid())
    .bind(&held()[..])
    .fetch_one(&mut *conn)
    .await?;
    let held = |v: i64| u64::try_from(v).unwrap_or(0);
    let limit = |v: Option<i32>| v.and_then(|l| u32::try_from(l).ok());
    let quotas = Quotas { max_clusters: None, max_nodes: limit(max_nodes), max_gpus: limit(max_gpus) };
    let demand = Demand {
        clusters: 0,
        nodes: held(nodes) + needs.iter().map(|n| u64::from(n.count)).sum::<u64>(),
        gpus: held(gpus) + needs.iter().map(|n| u64::from(n.count) * u64::from(n.gpu_count)).sum::<u64>(),
    };
    Ok(quota_excess(&quotas, demand).map(|excess| Allocation::OverQuota {
        quota: excess.quota.field(),
        limit: u64::from(excess.limit),
        would_hold: excess.demand,
    }))
}

/// Locks clean available machines for every need, or names the first need that cannot be met.
/// Skipped: machines another allocator holds, and those kept for the first cluster ahead of this
/// one in the need's class (see [`AHEAD`]; past its head timeout, or [`waiting_ahead`] would have
/// held this one back): machines that became available (their clean completed) after its
/// timeout ended are for it, not for later requests, so the head cannot starve.
async fn pick(
    conn: &mut Conn,
    cluster: ClusterId,
    line: Line,
    needs: &[Need],
    names: &[(Uuid, String)],
) -> Result<Result<Vec<(MachineId, NodePoolId)>, Allocation>, StoreError> {
    // The kept moment and the machines in one statement: one round trip fewer under the lock.
    let sql = format!(
        "with kept as (select c.waiting_since + make_interval(secs => $5) as at {AHEAD} \
                       order by c.waiting_since, c.id limit 1) \
         select m.id from machines m where m.machine_class_id = $6 and m.state = 'available' \
           and m.maintenance_reason is null and m.retire_requested_at is null and m.id <> all($7) \
           and (not exists (select 1 from kept) or exists (select 1 from machine_cleans k, kept \
                where k.id = m.clean_id and k.completed_at <= kept.at)) \
         order by m.id limit $8 for update of m skip locked"
    );
    let mut picked: Vec<(MachineId, NodePoolId)> = Vec::new();
    for need in needs.iter().filter(|n| n.count > 0) {
        let class = need.machine_class_id.uuid();
        let ids: Vec<Uuid> = sqlx::query_scalar(&sql)
            .bind(cluster.uuid())
            .bind(line.since)
            .bind([class].as_slice())
            .bind(&held()[..])
            .bind(line.timeout_secs())
            .bind(class)
            .bind(picked.iter().map(|(m, _)| m.uuid()).collect::<Vec<_>>())
            .bind(i64::from(need.count))
            .fetch_all(&mut *conn)
            .await?;
        if ids.len() < need.count as usize {
            let machine_class = names.iter().find(|(id, _)| *id == class).map(|(_, n)| n.clone()).unwrap_or_default();
            let available = u32::try_from(ids.len()).unwrap_or(u32::MAX);
            return Ok(Err(Allocation::Short { machine_class, needed: need.count, available }));
        }
        picked.extend(ids.into_iter().map(|id| (MachineId(id), need.node_pool_id)));
    }
    Ok(Ok(picked))
}

/// Gives the locked `picked` machines to the cluster: one allocation each, consuming its verified
/// clean, and one custody entry each with the allocation and the clean as evidence.
async fn assign(
    conn: &mut Conn,
    key: &LedgerKey,
    tenant: TenantId,
    cluster: ClusterId,
    picked: &[(MachineId, NodePoolId)],
) -> Result<(), StoreError> {
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
    // One custody entry per machine, sealed as it is written, with the allocation and the clean
    // it consumed as evidence.
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
    Ok(())
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
    /// Its system UUID (how its Node is found), once inspected.
    pub system_uuid: Option<String>,
}

/// Every machine a cluster holds (tenancy states, `releasing` included), by id.
pub async fn machines_of(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
) -> Result<Vec<HeldMachine>, StoreError> {
    let rows = sqlx::query(
        "select id, node_pool_id, state, status_version, node_name, system_uuid from machines \
         where tenant_id = $1 and cluster_id = $2 order by id",
    )
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .fetch_all(conn)
    .await?;
    rows.iter().map(held_machine).collect()
}

/// Every machine `clusters` hold ACROSS TENANTS (the demand sweep's one read of them), each with
/// its cluster, by id.
pub async fn machines_of_any(conn: &mut Conn, clusters: &[Uuid]) -> Result<Vec<(ClusterId, HeldMachine)>, StoreError> {
    let rows = sqlx::query(
        "select id, cluster_id, node_pool_id, state, status_version, node_name, system_uuid from machines \
         where cluster_id = any($1) order by id",
    )
    .bind(clusters)
    .fetch_all(conn)
    .await?;
    rows.iter().map(|row| Ok((ClusterId(row.try_get("cluster_id")?), held_machine(row)?))).collect()
}

fn held_machine(row: &sqlx::postgres::PgRow) -> Result<HeldMachine, StoreError> {
    Ok(HeldMachine {
        id: MachineId(row.try_get("id")?),
        node_pool_id: NodePoolId(row.try_get("node_pool_id")?),
        state: crate::parse_state(row.try_get("state")?, MachineState::parse)?,
        status_version: row.try_get("status_version")?,
        node_name: row.try_get("node_name")?,
        system_uuid: row.try_get("system_uuid")?,
    })
}
