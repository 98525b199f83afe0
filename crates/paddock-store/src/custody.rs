//! The custody ledger's rows (`custody_entries`) and the reads of the isolation report.
//!
//! Entries are appended by the store functions that move a machine (`machine`, `lifecycle`), in
//! the transaction of the move, so no transition goes unrecorded whoever calls them. They are
//! appended unsealed: the store never holds the ledger key. A holder of the key (the service
//! layer, the worker through it) seals a machine's unsealed entries in order with
//! [`pending_for_seal`] and [`set_mac`], under the machine's row lock, which also serializes
//! appends (every transition locks the row first).

use chrono::{DateTime, Utc};
use paddock_domain::ledger::Entry;
use paddock_types::machine::MachineState;
use paddock_types::{AllocationId, CleanId, ClusterId, CustodyEntryId, MachineId, NodePoolId, TenantId};
use serde_json::Value;
use uuid::Uuid;

use crate::{Conn, StoreError};

/// The actor of transitions the worker's reconcilers make.
pub const WORKER_ACTOR: &str = "paddock-worker";

#[derive(sqlx::FromRow)]
struct EntryRow {
    id: Uuid,
    machine_id: Uuid,
    seq: i64,
    at: DateTime<Utc>,
    actor: String,
    from_state: Option<String>,
    to_state: String,
    reason: String,
    evidence: Value,
    prev_mac: Option<Vec<u8>>,
    mac: Option<Vec<u8>>,
}

impl From<EntryRow> for Entry {
    fn from(r: EntryRow) -> Self {
        Entry {
            id: CustodyEntryId(r.id),
            machine_id: MachineId(r.machine_id),
            seq: r.seq,
            at: r.at,
            actor: r.actor,
            from: r.from_state,
            to: r.to_state,
            reason: r.reason,
            evidence: r.evidence,
            prev_mac: r.prev_mac,
            mac: r.mac,
        }
    }
}

const COLUMNS: &str = "id, machine_id, seq, at, actor, from_state, to_state, reason, evidence, prev_mac, mac";

/// Appends an unsealed entry to a machine's chain (the next `seq`), in the caller's transaction.
/// The caller has just moved the machine with a guarded update, so it holds the row lock and no
/// other append of this machine can interleave.
pub async fn append(
    conn: &mut Conn,
    machine: MachineId,
    from: Option<MachineState>,
    to: MachineState,
    actor: &str,
    reason: &str,
    evidence: &Value,
) -> Result<CustodyEntryId, StoreError> {
    let id = CustodyEntryId::new();
    sqlx::query(
        "insert into custody_entries (id, machine_id, seq, actor, from_state, to_state, reason, evidence) \
         select $1, $2, coalesce(max(seq), 0) + 1, $3, $4, $5, $6, $7 from custody_entries where machine_id = $2",
    )
    .bind(id.uuid())
    .bind(machine.uuid())
    .bind(actor)
    .bind(from.map(MachineState::as_str))
    .bind(to.as_str())
    .bind(reason)
    .bind(evidence)
    .execute(&mut *conn)
    .await?;
    // Usage segments open and close with the transition that causes them (SPEC section 7).
    crate::usage::on_transition(conn, machine, from, to).await?;
    Ok(id)
}

/// A machine's entries in chain order (`seq`, then id, so a duplicated or swapped `seq` still
/// reads deterministically).
pub async fn entries(conn: &mut Conn, machine: MachineId) -> Result<Vec<Entry>, StoreError> {
    let rows: Vec<EntryRow> =
        sqlx::query_as(&format!("select {COLUMNS} from custody_entries where machine_id = $1 order by seq, id"))
            .bind(machine.uuid())
            .fetch_all(conn)
            .await?;
    Ok(rows.into_iter().map(Entry::from).collect())
}

/// Whether a machine has unsealed entries (a cheap check without locks).
pub async fn has_unsealed(conn: &mut Conn, machine: MachineId) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar("select exists (select 1 from custody_entries where machine_id = $1 and mac is null)")
        .bind(machine.uuid())
        .fetch_one(conn)
        .await?)
}

/// Locks the machine's row and returns the MAC of its newest sealed entry with its unsealed
/// entries in order: what sealing needs. In the caller's transaction; `None` for an unknown
/// machine.
pub async fn pending_for_seal(
    conn: &mut Conn,
    machine: MachineId,
) -> Result<Option<(Option<Vec<u8>>, Vec<Entry>)>, StoreError> {
    let found: Option<Uuid> = sqlx::query_scalar("select id from machines where id = $1 for update")
        .bind(machine.uuid())
        .fetch_optional(&mut *conn)
        .await?;
    if found.is_none() {
        return Ok(None);
    }
    let rows: Vec<EntryRow> = sqlx::query_as(&format!(
        "select {COLUMNS} from custody_entries where machine_id = $1 and mac is null order by seq, id"
    ))
    .bind(machine.uuid())
    .fetch_all(&mut *conn)
    .await?;
    if rows.is_empty() {
        return Ok(Some((None, Vec::new())));
    }
    let last: Option<Option<Vec<u8>>> = sqlx::query_scalar(
        "select mac from custody_entries where machine_id = $1 and mac is not null order by seq desc, id desc limit 1",
    )
    .bind(machine.uuid())
    .fetch_optional(&mut *conn)
    .await?;
    Ok(Some((last.flatten(), rows.into_iter().map(Entry::from).collect())))
}

/// Seals one entry: stores its MAC and the previous entry's. Only an unsealed entry can be
/// sealed, once (the table's trigger refuses every other update).
pub async fn set_mac(
    conn: &mut Conn,
    entry: CustodyEntryId,
    prev_mac: Option<&[u8]>,
    mac: &[u8],
) -> Result<bool, StoreError> {
    let done = sqlx::query("update custody_entries set prev_mac = $2, mac = $3 where id = $1 and mac is null")
        .bind(entry.uuid())
        .bind(prev_mac)
        .bind(mac)
        .execute(conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Makes the caller's fresh transaction read one snapshot (repeatable read, read only): the
/// isolation report's reads agree with each other. Must come before the transaction's first query.
pub async fn read_one_snapshot(conn: &mut Conn) -> Result<(), StoreError> {
    sqlx::query("set transaction isolation level repeatable read, read only").execute(conn).await?;
    Ok(())
}

/// A live cluster of a tenant, for the isolation report.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportCluster {
    /// Id.
    pub id: ClusterId,
    /// Name.
    pub name: String,
    /// Phase.
    pub phase: String,
    /// Its control plane's API endpoint, once published.
    pub kubernetes_api: Option<String>,
}

/// A machine a live allocation gives a tenant's cluster, with the wipe it consumed.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportMachine {
    /// The machine.
    pub machine_id: MachineId,
    /// Its name.
    pub name: String,
    /// Its state.
    pub state: String,
    /// The machine row's holder (tenant), which must be the allocation's.
    pub holder_tenant_id: Option<TenantId>,
    /// The cluster.
    pub cluster_id: ClusterId,
    /// The pool.
    pub node_pool_id: NodePoolId,
    /// Its node name once active.
    pub node_name: Option<String>,
    /// The allocation.
    pub allocation_id: AllocationId,
    /// When it was allocated.
    pub allocated_at: DateTime<Utc>,
    /// The clean the allocation consumed, as the allocation names it.
    pub clean_id: CleanId,
    /// The clean's record, if it exists and is this machine's: (method, run, completed at).
    pub clean: Option<(String, Uuid, DateTime<Utc>)>,
    /// Whether another allocation of this machine overlaps the time between the clean and this
    /// allocation (then the clean did not precede this tenancy).
    pub tenancy_between: bool,
    /// Live allocations of this machine, this one included (more than one = shared).
    pub live_allocations: i64,
}

/// A tenant's live clusters, by id.
pub async fn report_clusters(conn: &mut Conn, tenant: TenantId) -> Result<Vec<ReportCluster>, StoreError> {
    let rows: Vec<(Uuid, String, String, Option<String>)> = sqlx::query_as(
        "select id, name, phase, endpoints->>'kubernetes_api' from clusters \
         where tenant_id = $1 and deleted_at is null order by id",
    )
    .bind(tenant.uuid())
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, name, phase, kubernetes_api)| ReportCluster { id: ClusterId(id), name, phase, kubernetes_api })
        .collect())
}

type MachineTuple = (
    Uuid,
    String,
    String,
    Option<Uuid>,
    Uuid,
    Uuid,
    Option<String>,
    Uuid,
    DateTime<Utc>,
    Uuid,
    Option<String>,
    Option<Uuid>,
    Option<DateTime<Utc>>,
    bool,
    i64,
);

/// The machines of a tenant's live allocations (in its live clusters), by cluster then machine.
pub async fn report_machines(conn: &mut Conn, tenant: TenantId) -> Result<Vec<ReportMachine>, StoreError> {
    let rows: Vec<MachineTuple> = sqlx::query_as(
        "select m.id, m.name, m.state, m.tenant_id, a.cluster_id, a.node_pool_id, m.node_name, a.id, a.allocated_at, \
           a.clean_id, c.method, c.run_id, c.completed_at, \
           exists (select 1 from machine_allocations p where p.machine_id = a.machine_id and p.id <> a.id \
                   and p.allocated_at <= a.allocated_at \
                   and (p.released_at is null or c.completed_at is null or p.released_at > c.completed_at)), \
           (select count(*) from machine_allocations l where l.machine_id = a.machine_id and l.released_at is null) \
         from machine_allocations a \
         join clusters k on k.id = a.cluster_id and k.tenant_id = a.tenant_id and k.deleted_at is null \
         join machines m on m.id = a.machine_id \
         left join machine_cleans c on c.id = a.clean_id and c.machine_id = a.machine_id \
         where a.tenant_id = $1 and a.released_at is null \
         order by a.cluster_id, m.id",
    )
    .bind(tenant.uuid())
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| ReportMachine {
            machine_id: MachineId(r.0),
            name: r.1,
            state: r.2,
            holder_tenant_id: r.3.map(TenantId),
            cluster_id: ClusterId(r.4),
            node_pool_id: NodePoolId(r.5),
            node_name: r.6,
            allocation_id: AllocationId(r.7),
            allocated_at: r.8,
            clean_id: CleanId(r.9),
            clean: match (r.10, r.11, r.12) {
                (Some(method), Some(run), Some(at)) => Some((method, run, at)),
                _ => None,
            },
            tenancy_between: r.13,
            live_allocations: r.14,
        })
        .collect())
}
