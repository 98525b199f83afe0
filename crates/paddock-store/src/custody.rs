//! The custody ledger's rows (`custody_entries`), the checkpoints issued of it
//! (`custody_checkpoints`) and the reads of the isolation report.
//!
//! Entries are appended by the store functions that move a machine (`machine`, `lifecycle`,
//! `power`), in the transaction of the move, so no transition goes unrecorded whoever calls them.
//! Those functions take the ledger key from their caller (the store never keeps it): [`append`]
//! computes each entry's MAC over the values the database will hold (its `now()`, the evidence as
//! `jsonb` normalises it) and the machine's current head, then inserts the entry with its MAC.
//! Nothing ever updates an entry (the table's trigger refuses it), so nothing seals a row someone
//! else inserted. The caller has moved the machine with a guarded update first, so it holds the
//! machine's row lock and appends of one machine never interleave; `unique (machine_id, seq)`
//! refuses one that would.

use chrono::{DateTime, Utc};
use paddock_domain::ledger::{Entry, LedgerKey};
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

/// One transition to record.
#[derive(Debug, Clone)]
pub struct NewEntry<'a> {
    /// The machine.
    pub machine: MachineId,
    /// The state left (`None` for enrollment).
    pub from: Option<MachineState>,
    /// The state entered.
    pub to: MachineState,
    /// Who: a token subject, or [`WORKER_ACTOR`].
    pub actor: &'a str,
    /// Why, readable.
    pub reason: String,
    /// What proves it.
    pub evidence: Value,
}

/// Appends an entry to a machine's chain (the next `seq`), sealed, in the caller's transaction.
/// The caller has just moved the machine with a guarded update, so it holds the row lock and no
/// other append of this machine can interleave.
#[expect(clippy::too_many_arguments, reason = "one entry's fields; `append_all` takes them as a struct")]
pub async fn append(
    conn: &mut Conn,
    key: &LedgerKey,
    machine: MachineId,
    from: Option<MachineState>,
    to: MachineState,
    actor: &str,
    reason: &str,
    evidence: &Value,
) -> Result<CustodyEntryId, StoreError> {
    let entry = NewEntry { machine, from, to, actor, reason: reason.to_owned(), evidence: evidence.clone() };
    let ids = append_all(conn, key, std::slice::from_ref(&entry)).await?;
    ids.into_iter().next().ok_or_else(|| StoreError::Corrupt("an append returned no entry".to_owned()))
}

/// What sealing one new entry needs: `now()`, the evidence as stored, the machine's head (seq, MAC).
type Sealing = (DateTime<Utc>, Value, Option<i64>, Option<Vec<u8>>);

/// Appends one entry to each of several machines' chains (one per machine), sealed: two round
/// trips whatever their number. Same locking contract as [`append`].
pub async fn append_all(
    conn: &mut Conn,
    key: &LedgerKey,
    new: &[NewEntry<'_>],
) -> Result<Vec<CustodyEntryId>, StoreError> {
    let machines: Vec<Uuid> = new.iter().map(|e| e.machine.uuid()).collect();
    let evidence: Vec<Value> = new.iter().map(|e| e.evidence.clone()).collect();
    // The values the MAC covers, as the database will store them: the transaction's `now()` (the
    // column's precision) and the evidence through `jsonb`; and each machine's current head.
    let rows: Vec<Sealing> = sqlx::query_as(
        "select now(), t.evidence, h.seq, h.mac \
         from unnest($1::uuid[], $2::jsonb[]) with ordinality as t(machine_id, evidence, i) \
         left join lateral (select seq, mac from custody_entries e where e.machine_id = t.machine_id \
                            order by seq desc limit 1) h on true \
         order by t.i",
    )
    .bind(&machines)
    .bind(&evidence)
    .fetch_all(&mut *conn)
    .await?;
    let mut entries = Vec::with_capacity(new.len());
    for (n, (at, evidence, seq, prev_mac)) in new.iter().zip(rows) {
        let mut entry = Entry {
            id: CustodyEntryId::new(),
            machine_id: n.machine,
            seq: seq.unwrap_or(0) + 1,
            at,
            actor: n.actor.to_owned(),
            from: n.from.map(|s| s.as_str().to_owned()),
            to: n.to.as_str().to_owned(),
            reason: n.reason.clone(),
            evidence,
            prev_mac,
            mac: None,
        };
        entry.mac = Some(key.seal(&entry, entry.prev_mac.as_deref()));
        entries.push(entry);
    }
    insert(conn, &entries).await?;
    // Usage segments open and close with the transition that causes them (docs/billing.md).
    for n in new {
        crate::usage::on_transition(conn, n.machine, n.from, n.to).await?;
    }
    Ok(entries.into_iter().map(|e| e.id).collect())
}

async fn insert(conn: &mut Conn, entries: &[Entry]) -> Result<(), StoreError> {
    let column = |f: fn(&Entry) -> Option<Vec<u8>>| entries.iter().map(f).collect::<Vec<_>>();
    sqlx::query(
        "insert into custody_entries (id, machine_id, seq, at, actor, from_state, to_state, reason, evidence, \
           prev_mac, mac) \
         select * from unnest($1::uuid[], $2::uuid[], $3::bigint[], $4::timestamptz[], $5::text[], $6::text[], \
           $7::text[], $8::text[], $9::jsonb[], $10::bytea[], $11::bytea[])",
    )
    .bind(entries.iter().map(|e| e.id.uuid()).collect::<Vec<_>>())
    .bind(entries.iter().map(|e| e.machine_id.uuid()).collect::<Vec<_>>())
    .bind(entries.iter().map(|e| e.seq).collect::<Vec<_>>())
    .bind(entries.iter().map(|e| e.at).collect::<Vec<_>>())
    .bind(entries.iter().map(|e| e.actor.clone()).collect::<Vec<_>>())
    .bind(entries.iter().map(|e| e.from.clone()).collect::<Vec<_>>())
    .bind(entries.iter().map(|e| e.to.clone()).collect::<Vec<_>>())
    .bind(entries.iter().map(|e| e.reason.clone()).collect::<Vec<_>>())
    .bind(entries.iter().map(|e| e.evidence.clone()).collect::<Vec<_>>())
    .bind(column(|e| e.prev_mac.clone()))
    .bind(column(|e| e.mac.clone()))
    .execute(conn)
    .await?;
    Ok(())
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

/// Every machine's chain head (its newest entry's `seq` and MAC), by machine id.
pub async fn heads(conn: &mut Conn) -> Result<Vec<(MachineId, i64, Option<Vec<u8>>)>, StoreError> {
    // One index probe per machine (`unique (machine_id, seq)`), not a scan of every entry.
    let rows: Vec<(Uuid, i64, Option<Vec<u8>>)> = sqlx::query_as(
        "select m.id, h.seq, h.mac from machines m cross join lateral \
           (select seq, mac from custody_entries e where e.machine_id = m.id order by seq desc limit 1) h \
         order by m.id",
    )
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|(m, seq, mac)| (MachineId(m), seq, mac)).collect())
}

/// A fingerprint of each machine's whole chain, computed by the database: a digest of every
/// entry's row as stored, in order. Any change to any entry (an edit, a cut tail, a row put back
/// with the head's MAC) changes it; reading it costs no MAC and moves no entry over the wire.
pub async fn chain_fingerprints(
    conn: &mut Conn,
    machines: &[MachineId],
) -> Result<std::collections::HashMap<MachineId, String>, StoreError> {
    let ids: Vec<Uuid> = machines.iter().map(|m| m.uuid()).collect();
    let rows: Vec<(Uuid, String)> = sqlx::query_as(
        "select e.machine_id, md5(string_agg(e::text, E'\\n' order by e.seq, e.id)) from custody_entries e \
         where e.machine_id = any($1) group by e.machine_id",
    )
    .bind(&ids)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|(m, fingerprint)| (MachineId(m), fingerprint)).collect())
}

/// A checkpoint as recorded when it was issued.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredCheckpoint {
    /// The signed document, `{issued_at, machines}`.
    pub document: Value,
    /// Its signature.
    pub signature: String,
    /// The key that made it.
    pub key_id: String,
}

/// Records an issued checkpoint (append-only, like the ledger).
pub async fn checkpoint_insert(
    conn: &mut Conn,
    issued_at: DateTime<Utc>,
    checkpoint: &StoredCheckpoint,
) -> Result<(), StoreError> {
    sqlx::query(
        "insert into custody_checkpoints (id, issued_at, key_id, signature, document) values ($1, $2, $3, $4, $5)",
    )
    .bind(Uuid::now_v7())
    .bind(issued_at)
    .bind(&checkpoint.key_id)
    .bind(&checkpoint.signature)
    .bind(&checkpoint.document)
    .execute(conn)
    .await?;
    Ok(())
}

/// The latest checkpoint issued with the key `key_id`, if any.
pub async fn checkpoint_latest(conn: &mut Conn, key_id: &str) -> Result<Option<StoredCheckpoint>, StoreError> {
    let row: Option<(Value, String, String)> = sqlx::query_as(
        "select document, signature, key_id from custody_checkpoints where key_id = $1 \
         order by issued_at desc, id desc limit 1",
    )
    .bind(key_id)
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|(document, signature, key_id)| StoredCheckpoint { document, signature, key_id }))
}

/// Makes the caller's fresh transaction read one snapshot (repeatable read, read only): the
/// isolation report's reads agree with each other. Must come before the transaction's first query.
pub async fn read_one_snapshot(conn: &mut Conn) -> Result<(), StoreError> {
    sqlx::query("set transaction isolation level repeatable read, read only").execute(conn).await?;
    Ok(())
}

/// Like [`read_one_snapshot`], for a transaction that also writes (a verification, audited).
pub async fn one_snapshot(conn: &mut Conn) -> Result<(), StoreError> {
    sqlx::query("set transaction isolation level repeatable read").execute(conn).await?;
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
