//! Remediations (docs/architecture.md, "The state machines"): one open per machine, started by a
//! `failed` health report or a tenant's request, moved by guarded updates; what started one
//! never changes (the table's trigger), and none is deleted.

use chrono::{DateTime, Utc};
use paddock_domain::ledger::LedgerKey;
use paddock_types::remediation::{RemediationOutcome, RemediationSource, RemediationState, RemediationView};
use paddock_types::{ClusterId, MachineId, NodePoolId, TenantId};
use uuid::Uuid;

use crate::custody::{self, WORKER_ACTOR};
use crate::lifecycle::{begin_release, enqueue_cluster, enqueue_machine};
use crate::{machine, parse_state, Conn, StoreError, Txn};

/// What starts a remediation.
#[derive(Debug, Clone)]
pub struct Start<'a> {
    /// The machine to replace.
    pub machine: MachineId,
    /// Why.
    pub reason: &'a str,
    /// Who.
    pub source: RemediationSource,
    /// The health report that started it.
    pub report_id: Option<Uuid>,
    /// Who, for the custody ledger: the operator's or tenant's subject, or the worker.
    pub actor: &'a str,
}

/// How a start ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// A new remediation.
    New(RemediationView),
    /// The machine is being replaced already: nothing written.
    AlreadyOpen,
    /// The machine holds no tenancy, or its pool does not remediate on its own (for a report):
    /// nothing written.
    NotApplicable,
}

#[derive(sqlx::FromRow)]
struct Row {
    id: Uuid,
    machine_id: Uuid,
    tenant_id: Uuid,
    cluster_id: Uuid,
    node_pool_id: Uuid,
    reason: String,
    source: String,
    report_id: Option<Uuid>,
    state: String,
    spare_machine_id: Option<Uuid>,
    started_at: DateTime<Utc>,
    ended_at: Option<DateTime<Utc>>,
    outcome: Option<String>,
    credited_seconds: Option<i64>,
}

impl Row {
    fn view(self) -> Result<RemediationView, StoreError> {
        Ok(RemediationView {
            id: self.id,
            machine_id: MachineId(self.machine_id),
            tenant_id: TenantId(self.tenant_id),
            cluster_id: ClusterId(self.cluster_id),
            node_pool_id: NodePoolId(self.node_pool_id),
            reason: self.reason,
            source: parse_state(&self.source, RemediationSource::parse)?,
            report_id: self.report_id,
            state: parse_state(&self.state, RemediationState::parse)?,
            spare_machine_id: self.spare_machine_id.map(MachineId),
            started_at: self.started_at,
            ended_at: self.ended_at,
            outcome: self.outcome.as_deref().map(|o| parse_state(o, RemediationOutcome::parse)).transpose()?,
            credited_seconds: self.credited_seconds,
        })
    }
}

const COLUMNS: &str = "r.id, r.machine_id, r.tenant_id, r.cluster_id, r.node_pool_id, r.reason, r.source, \
     r.report_id, r.state, r.spare_machine_id, r.started_at, r.ended_at, r.outcome, \
     (select -a.node_seconds from usage_adjustments a where a.remediation_id = r.id) as credited_seconds";

/// Starts the remediation of a machine that holds a tenancy (`allocated`, `provisioning` or
/// `active`), in the caller's transaction, records it in the machine's custody ledger (with the
/// report that started it) and wakes its cluster, whose reconciler carries it out. A report
/// starts one only where the machine's pool remediates on its own; a machine of a Slurm
/// cluster's `system` pool is never released automatically: its remediation waits for an
/// operator (`needs_operator`).
pub async fn start(conn: &mut Txn<'_>, key: &LedgerKey, start: &Start<'_>) -> Result<Started, StoreError> {
    let row: Option<Row> = sqlx::query_as(&format!(
        "with r as ( \
           insert into machine_remediations (id, machine_id, tenant_id, cluster_id, node_pool_id, allocation_id, \
             reason, source, report_id, state, started_at, updated_at) \
           select $1, m.id, m.tenant_id, m.cluster_id, m.node_pool_id, m.allocation_id, $3, $4, $5, \
             case when p.role = 'system' and c.kind = 'slurm' then 'needs_operator' else 'awaiting_spare' end, \
             clock_timestamp(), now() \
           from machines m join node_pools p on p.id = m.node_pool_id \
           join clusters c on c.id = m.cluster_id and c.tenant_id = m.tenant_id \
           where m.id = $2 and m.state in ('allocated', 'provisioning', 'active') and m.allocation_id is not null \
             and (p.remediation_automatic or $4 = 'tenant') \
           on conflict (machine_id) where ended_at is null do nothing \
           returning *) \
         select {COLUMNS} from r"
    ))
    .bind(Uuid::now_v7())
    .bind(start.machine.uuid())
    .bind(start.reason)
    .bind(start.source.as_str())
    .bind(start.report_id)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(row) = row {
        let view = row.view()?;
        record_start(conn, key, &view, start.actor).await?;
        enqueue_cluster(conn, view.tenant_id, view.cluster_id).await?;
        return Ok(Started::New(view));
    }
    let open: bool = sqlx::query_scalar(
        "select exists (select 1 from machine_remediations where machine_id = $1 and ended_at is null)",
    )
    .bind(start.machine.uuid())
    .fetch_one(&mut *conn)
    .await?;
    Ok(if open { Started::AlreadyOpen } else { Started::NotApplicable })
}

/// The custody ledger's entry of a remediation's start: an event in the machine's state (the
/// entry's `from` and `to` are the state it is in), with what started it. The machine's row is
/// locked first, as every append requires.
async fn record_start(conn: &mut Conn, key: &LedgerKey, r: &RemediationView, actor: &str) -> Result<(), StoreError> {
    let Some(current) = machine::get_for_update(conn, r.machine_id).await? else {
        return Err(StoreError::Corrupt(format!("machine {} of remediation {} vanished", r.machine_id, r.id)));
    };
    let reason = match r.report_id {
        Some(report) => format!("remediation started by a failed health report ({report}): {}", r.reason),
        None => format!("remediation started at its tenant's request: {}", r.reason),
    };
    let evidence = serde_json::json!({
        "remediation_id": r.id, "report_id": r.report_id, "source": r.source.as_str(), "state": r.state.as_str(),
        "tenant_id": r.tenant_id, "cluster_id": r.cluster_id, "node_pool_id": r.node_pool_id,
    });
    let state = current.state;
    custody::append(conn, key, r.machine_id, Some(state), state, actor, &reason, &evidence).await?;
    Ok(())
}

/// A cluster's open remediations, oldest first, each with whether its machine has left the
/// tenancy it was started in (for [`end_departed`]).
pub async fn open_with_departure(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
) -> Result<Vec<(RemediationView, bool)>, StoreError> {
    #[derive(sqlx::FromRow)]
    struct Marked {
        #[sqlx(flatten)]
        row: Row,
        departed: bool,
    }
    let rows: Vec<Marked> = sqlx::query_as(&format!(
        "select {COLUMNS}, m.allocation_id is distinct from r.allocation_id as departed \
         from machine_remediations r join machines m on m.id = r.machine_id \
         where r.tenant_id = $1 and r.cluster_id = $2 and r.ended_at is null order by r.id"
    ))
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .fetch_all(conn)
    .await?;
    rows.into_iter().map(|m| Ok((m.row.view()?, m.departed))).collect()
}

/// A cluster's open remediations, oldest first.
pub async fn open_of_cluster(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
) -> Result<Vec<RemediationView>, StoreError> {
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "select {COLUMNS} from machine_remediations r \
         where r.tenant_id = $1 and r.cluster_id = $2 and r.ended_at is null order by r.id"
    ))
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .fetch_all(conn)
    .await?;
    rows.into_iter().map(Row::view).collect()
}

/// Every remediation of `tenant`'s `clusters`, by cluster, oldest first (the isolation report).
pub async fn of_clusters(
    conn: &mut Conn,
    tenant: TenantId,
    clusters: &[ClusterId],
) -> Result<Vec<RemediationView>, StoreError> {
    let ids: Vec<Uuid> = clusters.iter().map(|c| c.uuid()).collect();
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "select {COLUMNS} from machine_remediations r where r.tenant_id = $1 and r.cluster_id = any($2) \
         order by r.cluster_id, r.id"
    ))
    .bind(tenant.uuid())
    .bind(&ids)
    .fetch_all(conn)
    .await?;
    rows.into_iter().map(Row::view).collect()
}

/// A cluster's remediations, newest first, before the keyset position `before` (an id).
pub async fn of_cluster(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
    before: Option<Uuid>,
    limit: u32,
) -> Result<Vec<RemediationView>, StoreError> {
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "select {COLUMNS} from machine_remediations r where r.tenant_id = $1 and r.cluster_id = $2 \
           and ($3::uuid is null or r.id < $3) order by r.id desc limit $4"
    ))
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .bind(before)
    .bind(i64::from(limit))
    .fetch_all(conn)
    .await?;
    rows.into_iter().map(Row::view).collect()
}

/// Every remediation (the provider's list), newest first, before `before`.
pub async fn list(conn: &mut Conn, before: Option<Uuid>, limit: u32) -> Result<Vec<RemediationView>, StoreError> {
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "select {COLUMNS} from machine_remediations r where ($1::uuid is null or r.id < $1) \
         order by r.id desc limit $2"
    ))
    .bind(before)
    .bind(i64::from(limit))
    .fetch_all(conn)
    .await?;
    rows.into_iter().map(Row::view).collect()
}

/// Ends the cluster's open remediations whose machine has left the tenancy they were started in
/// (`replaced` when the spare had taken over, else `released`); their ids.
pub async fn end_departed(conn: &mut Conn, tenant: TenantId, cluster: ClusterId) -> Result<Vec<Uuid>, StoreError> {
    let ended: Vec<Uuid> = sqlx::query_scalar(
        "update machine_remediations r set state = 'ended', ended_at = clock_timestamp(), updated_at = now(), \
           outcome = case when r.state = 'releasing' then 'replaced' else 'released' end \
         from machines m where m.id = r.machine_id and r.tenant_id = $1 and r.cluster_id = $2 \
           and r.ended_at is null and m.allocation_id is distinct from r.allocation_id returning r.id",
    )
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .fetch_all(conn)
    .await?;
    Ok(ended)
}

/// Makes the machines just allocated to the cluster (`allocated`) the spares of its remediations
/// awaiting one whose machine it still holds, pool by pool, oldest remediation first (guarded on
/// `awaiting_spare`), in the allocation's transaction: a spare is linked exactly when it is
/// allocated, never to a machine already on its way out.
pub async fn link_spares(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
    allocated: &[MachineId],
) -> Result<u64, StoreError> {
    let ids: Vec<Uuid> = allocated.iter().map(|m| m.uuid()).collect();
    let linked = sqlx::query(
        "with spares as ( \
           select m.id, m.node_pool_id, row_number() over (partition by m.node_pool_id order by m.id) as n \
           from machines m where m.id = any($3) and m.tenant_id = $1 and m.cluster_id = $2), \
         waiting as ( \
           select r.id, r.node_pool_id, row_number() over (partition by r.node_pool_id order by r.started_at, r.id) as n \
           from machine_remediations r join machines m on m.id = r.machine_id \
             and m.state in ('allocated', 'provisioning', 'active') \
           where r.tenant_id = $1 and r.cluster_id = $2 and r.state = 'awaiting_spare') \
         update machine_remediations r set state = 'replacing', spare_machine_id = s.id, updated_at = now() \
         from waiting w join spares s on s.node_pool_id = w.node_pool_id and s.n = w.n \
         where r.id = w.id and r.state = 'awaiting_spare'",
    )
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .bind(&ids)
    .execute(conn)
    .await?;
    Ok(linked.rows_affected())
}

/// A spare that left the cluster before it became active (its provisioning failed): the
/// remediation awaits another (guarded on the spare). False when it had moved on.
pub async fn spare_lost(conn: &mut Conn, id: Uuid, spare: MachineId) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "update machine_remediations set state = 'awaiting_spare', spare_machine_id = null, updated_at = now() \
         where id = $1 and state = 'replacing' and spare_machine_id = $2",
    )
    .bind(id)
    .bind(spare.uuid())
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The spare is active: the swap is recorded in the machine's custody ledger, the machine gets
/// the maintenance intent ([`maintenance_reason`]) and its
/// release starts (drained within `PADDOCK_RELEASE_TIMEOUT`, then forced; it ends in
/// maintenance, and leaves it only when an operator returns it, through cleaning), in one
/// transaction guarded on the remediation's state and the machine's state and version. False
/// when either had moved on (nothing written).
pub async fn release_replaced(
    conn: &mut Txn<'_>,
    key: &LedgerKey,
    remediation: &RemediationView,
) -> Result<bool, StoreError> {
    let mut tx = conn.begin().await?;
    let moved = sqlx::query(
        "update machine_remediations set state = 'releasing', updated_at = now() \
         where id = $1 and state = 'replacing' and spare_machine_id = $2",
    )
    .bind(remediation.id)
    .bind(remediation.spare_machine_id.map(|m| m.uuid()))
    .execute(&mut *tx)
    .await?;
    if moved.rows_affected() != 1 {
        return Ok(false);
    }
    let Some(current) = machine::get_for_update(&mut tx, remediation.machine_id).await? else {
        return Ok(false);
    };
    let Some(spare) = remediation.spare_machine_id else {
        return Ok(false);
    };
    let reason = format!("replaced: spare machine {spare} is active in its place; the machine leaves for maintenance");
    let evidence = serde_json::json!({ "remediation_id": remediation.id, "spare_machine_id": spare });
    let state = current.state;
    custody::append(&mut tx, key, current.id, Some(state), state, WORKER_ACTOR, &reason, &evidence).await?;
    if current.maintenance_reason.is_none() {
        let reason = self::maintenance_reason(&remediation.reason);
        machine::set_maintenance_intent(&mut tx, remediation.machine_id, Some(&reason)).await?;
    }
    if !begin_release(&mut tx, key, current.id, current.state, current.status_version).await? {
        return Ok(false);
    }
    enqueue_machine(&mut tx, current.id, None).await?;
    tx.commit().await?;
    Ok(true)
}

/// The remediation a machine leaving maintenance returns from: its latest one, if it started
/// after the machine's previous return (a `maintenance` to `cleaning` entry of its ledger).
pub async fn returned(conn: &mut Conn, machine: MachineId) -> Result<Option<Uuid>, StoreError> {
    let found: Option<Uuid> = sqlx::query_scalar(
        "select r.id from machine_remediations r where r.machine_id = $1 and r.started_at > coalesce( \
           (select max(e.at) from custody_entries e where e.machine_id = $1 \
              and e.from_state = 'maintenance' and e.to_state = 'cleaning'), '-infinity') \
         order by r.started_at desc, r.id desc limit 1",
    )
    .bind(machine.uuid())
    .fetch_optional(conn)
    .await?;
    Ok(found)
}

/// The maintenance reason of a machine leaving a tenancy under remediation.
pub fn maintenance_reason(reason: &str) -> String {
    format!("replaced after a failure: {reason}")
}

/// A machine whose tenancy ends while a remediation of it is open gets the maintenance intent (if
/// it has none), in the caller's transaction, whatever ended the tenancy (the spare, a scale-down,
/// the cluster's deletion, a forced release): a failed machine goes to maintenance, never back
/// to the fleet, until an operator returns it (through cleaning).
pub async fn keep_out_of_service(conn: &mut Conn, machine: MachineId) -> Result<(), StoreError> {
    sqlx::query(
        "update machines m set maintenance_reason = 'replaced after a failure: ' || r.reason, \
           generation = m.generation + 1, updated_at = now() \
         from machine_remediations r where r.machine_id = m.id and r.ended_at is null \
           and m.id = $1 and m.maintenance_reason is null",
    )
    .bind(machine.uuid())
    .execute(conn)
    .await?;
    Ok(())
}

/// Enqueues the power cycle of a machine a tenant holds, reporting to `operation` (its target is
/// the machine: it never runs beside the machine's reconcile).
pub async fn enqueue_power_cycle(
    conn: &mut Txn<'_>,
    machine: MachineId,
    allocation: Uuid,
    tenant: TenantId,
    operation: paddock_types::OperationId,
) -> Result<(), StoreError> {
    use paddock_domain::job_kind::{Payload, PowerCycleJob, MACHINE_POWER_CYCLE};
    let new = crate::job::NewJob {
        kind: MACHINE_POWER_CYCLE,
        target_type: "machine",
        target_id: machine.uuid(),
        payload: PowerCycleJob { machine_id: machine, allocation_id: allocation }.to_value(),
        tenant_id: Some(tenant),
        operation_id: Some(operation),
        run_at: None,
    };
    crate::job::enqueue(conn, &new).await?;
    Ok(())
}

/// The allocation of a machine `tenant`'s `cluster` holds and its state, the row locked; `None`
/// when the cluster does not hold it.
pub async fn tenancy_of(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
    machine: MachineId,
) -> Result<Option<(Uuid, String)>, StoreError> {
    let row: Option<(Uuid, String)> = sqlx::query_as(
        "select allocation_id, state from machines where id = $1 and tenant_id = $2 and cluster_id = $3 \
           and allocation_id is not null for update",
    )
    .bind(machine.uuid())
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .fetch_optional(conn)
    .await?;
    Ok(row)
}

/// Whether the machine is still `active` in `allocation`.
pub async fn still_active_in(conn: &mut Conn, machine: MachineId, allocation: Uuid) -> Result<bool, StoreError> {
    let found: bool = sqlx::query_scalar(
        "select exists (select 1 from machines where id = $1 and allocation_id = $2 and state = 'active')",
    )
    .bind(machine.uuid())
    .bind(allocation)
    .fetch_one(conn)
    .await?;
    Ok(found)
}
