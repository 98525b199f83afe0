//! Machines. The BMC password arrives sealed (see `paddock_domain::secret`) and is stored as is.
//! Every state transition here also appends the machine's custody ledger entry (see `custody`)
//! in the same transaction.

use chrono::{DateTime, Utc};
use paddock_domain::ledger::LedgerKey;
use paddock_domain::model::{Bmc, Machine};
use paddock_types::health::{HealthSource, HealthStatus, MachineHealth};
use paddock_types::machine::MachineFilter;
use paddock_types::machine::{LastError, MachineState};
use paddock_types::{ClusterId, Labels, MachineClassId, MachineId, NodePoolId, TenantId};
use sqlx::types::Json;
use sqlx::Connection;
use uuid::Uuid;

use crate::run::{Run, RunRow, REPORT_JOIN, RUN_COLUMNS};
use crate::{custody, from_json, parse_state, Conn, StoreError};

#[derive(sqlx::FromRow)]
struct MachineRow {
    id: Uuid,
    name: String,
    machine_class_id: Uuid,
    machine_class: String,
    labels: Json<Labels>,
    state: String,
    last_error: Option<serde_json::Value>,
    tenant_id: Option<Uuid>,
    cluster_id: Option<Uuid>,
    node_pool_id: Option<Uuid>,
    node_name: Option<String>,
    system_uuid: Option<String>,
    inventory: serde_json::Value,
    maintenance_reason: Option<String>,
    retire_requested: bool,
    force_release_reason: Option<String>,
    duplicate_of: Option<Uuid>,
    bmc_url: String,
    bmc_system_id: Option<String>,
    bmc_username: String,
    bmc_password_enc: Vec<u8>,
    bmc_ca_cert: Option<String>,
    bmc_insecure_tls: bool,
    bmc_allow_insecure_http: bool,
    generation: i64,
    status_version: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    health_report_id: Option<Uuid>,
    health_status: Option<String>,
    health_source: Option<String>,
    health_observed_at: Option<DateTime<Utc>>,
    health_checks: Option<serde_json::Value>,
}

impl MachineRow {
    /// The newest health report's part of the row, if the machine has one.
    fn health(&mut self) -> Result<Option<MachineHealth>, StoreError> {
        let (Some(report_id), Some(status), Some(source), Some(observed_at), Some(checks)) = (
            self.health_report_id,
            self.health_status.take(),
            self.health_source.take(),
            self.health_observed_at,
            self.health_checks.take(),
        ) else {
            return Ok(None);
        };
        Ok(Some(MachineHealth {
            status: parse_state(&status, HealthStatus::parse)?,
            source: parse_state(&source, HealthSource::parse)?,
            observed_at,
            report_id,
            checks: from_json(checks)?,
        }))
    }
}

/// Every read of a machine carries its newest health report (the provider's view shows it): one
/// lateral probe of `machine_health_reports (machine_id, id)` per machine, in the same statement,
/// also for a page of a list.
const SELECT: &str = "select m.id, m.name, m.machine_class_id, c.name as machine_class, m.labels, \
     m.state, m.last_error, m.tenant_id, m.cluster_id, m.node_pool_id, m.node_name, m.system_uuid, \
     m.inventory, m.maintenance_reason, m.retire_requested_at is not null as retire_requested, m.force_release_reason, m.duplicate_of, m.bmc_url, m.bmc_system_id, m.bmc_username, \
     m.bmc_password_enc, m.bmc_ca_cert, m.bmc_insecure_tls, m.bmc_allow_insecure_http, m.generation, m.status_version, \
     m.created_at, m.updated_at, h.id as health_report_id, h.status as health_status, \
     h.source as health_source, h.observed_at as health_observed_at, h.checks as health_checks \
     from machines m join machine_classes c on c.id = m.machine_class_id \
     left join lateral (select r.id, r.status, r.source, r.observed_at, r.checks from machine_health_reports r \
       where r.machine_id = m.id order by r.id desc limit 1) h on true";

impl TryFrom<MachineRow> for Machine {
    type Error = StoreError;
    fn try_from(mut r: MachineRow) -> Result<Self, StoreError> {
        let health = r.health()?;
        let last_error: Option<LastError> = r.last_error.map(from_json).transpose()?;
        Ok(Machine {
            id: MachineId(r.id),
            name: r.name,
            machine_class_id: MachineClassId(r.machine_class_id),
            machine_class: r.machine_class,
            labels: r.labels.0,
            state: parse_state(&r.state, MachineState::parse)?,
            last_error,
            tenant_id: r.tenant_id.map(TenantId),
            cluster_id: r.cluster_id.map(ClusterId),
            node_pool_id: r.node_pool_id.map(NodePoolId),
            node_name: r.node_name,
            system_uuid: r.system_uuid,
            inventory: r.inventory,
            maintenance_reason: r.maintenance_reason,
            health,
            retire_requested: r.retire_requested,
            force_release_reason: r.force_release_reason,
            duplicate_of: r.duplicate_of.map(MachineId),
            bmc: Bmc {
                url: r.bmc_url,
                system_id: r.bmc_system_id,
                username: r.bmc_username,
                password_enc: r.bmc_password_enc,
                ca_cert: r.bmc_ca_cert,
                insecure_tls: r.bmc_insecure_tls,
                allow_insecure_http: r.bmc_allow_insecure_http,
            },
            generation: r.generation,
            status_version: r.status_version,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

/// What enrollment writes.
#[derive(Debug)]
pub struct NewMachine<'a> {
    /// Id, decided before sealing the password (the row id is part of the seal).
    pub id: MachineId,
    /// Unique name.
    pub name: &'a str,
    /// Its class.
    pub machine_class_id: MachineClassId,
    /// Labels.
    pub labels: &'a Labels,
    /// BMC access, password sealed.
    pub bmc: &'a Bmc,
}

/// Inserts a machine in `enrolling`.
pub async fn insert(conn: &mut Conn, m: &NewMachine<'_>) -> Result<(), StoreError> {
    sqlx::query(
        "insert into machines (id, name, machine_class_id, labels, state, bmc_url, bmc_system_id, \
         bmc_username, bmc_password_enc, bmc_ca_cert, bmc_insecure_tls, bmc_allow_insecure_http) \
         values ($1, $2, $3, $4, 'enrolling', $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(m.id.uuid())
    .bind(m.name)
    .bind(m.machine_class_id.uuid())
    .bind(Json(m.labels))
    .bind(&m.bmc.url)
    .bind(&m.bmc.system_id)
    .bind(&m.bmc.username)
    .bind(&m.bmc.password_enc)
    .bind(&m.bmc.ca_cert)
    .bind(m.bmc.insecure_tls)
    .bind(m.bmc.allow_insecure_http)
    .execute(conn)
    .await?;
    Ok(())
}

/// A machine (retired ones included: their record stays readable).
pub async fn get(conn: &mut Conn, id: MachineId) -> Result<Option<Machine>, StoreError> {
    select(conn, id, "").await
}

/// A machine (retired ones included), its row locked until the transaction ends.
pub async fn get_for_update(conn: &mut Conn, id: MachineId) -> Result<Option<Machine>, StoreError> {
    select(conn, id, " for update of m").await
}

async fn select(conn: &mut Conn, id: MachineId, lock: &str) -> Result<Option<Machine>, StoreError> {
    let row: Option<MachineRow> =
        sqlx::query_as(&format!("{SELECT} where m.id = $1{lock}")).bind(id.uuid()).fetch_optional(conn).await?;
    row.map(Machine::try_from).transpose()
}

/// A machine and the run it is in (with the run's report), in one read: the reconciler's, once
/// per step.
pub async fn get_with_run(conn: &mut Conn, id: MachineId) -> Result<Option<(Machine, Option<Run>)>, StoreError> {
    #[derive(sqlx::FromRow)]
    struct Row {
        #[sqlx(flatten)]
        machine: MachineRow,
        #[sqlx(flatten)]
        run: RunRow,
    }
    let select = SELECT.replacen(" from machines m", &format!(", {RUN_COLUMNS} from machines m"), 1);
    let row: Option<Row> =
        sqlx::query_as(&format!("{select}{REPORT_JOIN} where m.id = $1")).bind(id.uuid()).fetch_optional(conn).await?;
    row.map(|row| Ok((Machine::try_from(row.machine)?, row.run.into_run()))).transpose()
}

/// Machines after `after`, by id.
pub async fn list(
    conn: &mut Conn,
    filter: &MachineFilter,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<Machine>, StoreError> {
    let rows: Vec<MachineRow> = sqlx::query_as(&format!(
        "{SELECT} where (($1::text is null and m.state <> 'retired') or m.state = $1) and ($2::text is null or c.name = $2) \
         and ($3::uuid is null or m.tenant_id = $3) and ($4::uuid is null or m.id > $4) \
         order by m.id limit $5"
    ))
    .bind(filter.state.map(MachineState::as_str))
    .bind(&filter.machine_class)
    .bind(filter.tenant_id.map(TenantId::uuid))
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(conn)
    .await?;
    rows.into_iter().map(Machine::try_from).collect()
}

/// Writes the spec fields (labels and BMC access) and bumps the generation. The caller holds the
/// row lock.
pub async fn update_spec(conn: &mut Conn, id: MachineId, labels: &Labels, bmc: &Bmc) -> Result<(), StoreError> {
    sqlx::query(
        "update machines set labels = $2, bmc_url = $3, bmc_system_id = $4, bmc_username = $5, \
         bmc_password_enc = $6, bmc_ca_cert = $7, bmc_insecure_tls = $8, bmc_allow_insecure_http = $9, \
         generation = generation + 1, updated_at = now() where id = $1",
    )
    .bind(id.uuid())
    .bind(Json(labels))
    .bind(&bmc.url)
    .bind(&bmc.system_id)
    .bind(&bmc.username)
    .bind(&bmc.password_enc)
    .bind(&bmc.ca_cert)
    .bind(bmc.insecure_tls)
    .bind(bmc.allow_insecure_http)
    .execute(conn)
    .await?;
    Ok(())
}

/// Records the operator's maintenance intent (a reason to enter, `None` to leave) and bumps the
/// generation. The caller holds the row lock.
pub async fn set_maintenance_intent(conn: &mut Conn, id: MachineId, reason: Option<&str>) -> Result<(), StoreError> {
    sqlx::query(
        "update machines set maintenance_reason = $2, generation = generation + 1, updated_at = now() \
         where id = $1",
    )
    .bind(id.uuid())
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(())
}

/// Records the operator's intent to force the release of the machine's tenancy (`reason`, and
/// the subject who asked) and bumps the generation. The caller holds the row lock and has checked
/// that the machine holds a tenancy.
pub async fn set_force_release_intent(
    conn: &mut Conn,
    id: MachineId,
    reason: &str,
    requested_by: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "update machines set force_release_reason = $2, force_release_requested_by = $3, \
         generation = generation + 1, updated_at = now() where id = $1",
    )
    .bind(id.uuid())
    .bind(reason)
    .bind(requested_by)
    .execute(conn)
    .await?;
    Ok(())
}

/// Records the operator's intent to retire and bumps the generation. The caller holds the lock.
pub async fn set_retire_intent(conn: &mut Conn, id: MachineId) -> Result<(), StoreError> {
    sqlx::query(
        "update machines set retire_requested_at = now(), generation = generation + 1, \
         updated_at = now() where id = $1",
    )
    .bind(id.uuid())
    .execute(conn)
    .await?;
    Ok(())
}

/// Whether a retirement was already requested.
pub async fn retire_requested(conn: &mut Conn, id: MachineId) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar("select retire_requested_at is not null from machines where id = $1")
        .bind(id.uuid())
        .fetch_optional(conn)
        .await?
        .unwrap_or(false))
}

/// Moves a machine from one state to another, guarded on the current state and status version;
/// false when someone else moved it first. Used by the worker (retirement) and by tests that set
/// up fixtures. Records the transition in the custody ledger in the same transaction.
pub async fn transition(
    conn: &mut Conn,
    key: &LedgerKey,
    id: MachineId,
    from: MachineState,
    status_version: i64,
    to: MachineState,
) -> Result<bool, StoreError> {
    // A savepoint inside the caller's transaction, a transaction on a bare connection: the move
    // and its ledger entry commit together either way.
    let mut tx = conn.begin().await?;
    let done = sqlx::query(
        "update machines set state = $4, status_version = status_version + 1, updated_at = now(), \
         retired_at = case when $4 = 'retired' then now() else retired_at end \
         where id = $1 and state = $2 and status_version = $3",
    )
    .bind(id.uuid())
    .bind(from.as_str())
    .bind(status_version)
    .bind(to.as_str())
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() != 1 {
        return Ok(false);
    }
    let reason = match to {
        MachineState::Retired => "retired at the operator's request".to_owned(),
        _ => format!("moved from {} to {}", from.as_str(), to.as_str()),
    };
    custody::append(&mut tx, key, id, Some(from), to, custody::WORKER_ACTOR, &reason, &serde_json::json!({})).await?;
    tx.commit().await?;
    Ok(true)
}

/// Records a machine's most recent error (`None` clears it); a status write that never bumps the
/// generation. Writes nothing when the error is already the same code and message, so a job that
/// waits again and again does not churn the row. Returns whether it wrote.
pub async fn set_last_error(conn: &mut Conn, id: MachineId, error: Option<&LastError>) -> Result<bool, StoreError> {
    let error = error.map(|e| serde_json::json!({ "code": e.code, "message": e.message, "at": e.at }));
    let done = sqlx::query(
        "update machines set last_error = $2, status_version = status_version + 1, updated_at = now() \
         where id = $1 and (last_error->>'code', last_error->>'message') is distinct from ($2::jsonb->>'code', $2::jsonb->>'message')",
    )
    .bind(id.uuid())
    .bind(error)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records what inspection read from the BMC (system UUID and inventory JSON), guarded on the
/// state and the status version; a status write that never bumps the generation. False when
/// someone else moved the machine first.
pub async fn set_inventory(
    conn: &mut Conn,
    id: MachineId,
    state: MachineState,
    status_version: i64,
    system_uuid: &str,
    inventory: &serde_json::Value,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "update machines set system_uuid = $4, inventory = $5, status_version = status_version + 1, \
         updated_at = now() where id = $1 and state = $2 and status_version = $3",
    )
    .bind(id.uuid())
    .bind(state.as_str())
    .bind(status_version)
    .bind(system_uuid)
    .bind(inventory)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records a machine's most recent error like [`set_last_error`], but only while the machine is
/// still in `state` at `status_version`. Writes nothing when the same code and message are
/// already recorded. Returns whether it wrote.
pub async fn set_last_error_guarded(
    conn: &mut Conn,
    id: MachineId,
    state: MachineState,
    status_version: i64,
    error: Option<&LastError>,
) -> Result<bool, StoreError> {
    let error = error.map(|e| serde_json::json!({ "code": e.code, "message": e.message, "at": e.at }));
    let done = sqlx::query(
        "update machines set last_error = $4, status_version = status_version + 1, updated_at = now() \
         where id = $1 and state = $2 and status_version = $3 \
         and (last_error->>'code', last_error->>'message') is distinct from ($4::jsonb->>'code', $4::jsonb->>'message')",
    )
    .bind(id.uuid())
    .bind(state.as_str())
    .bind(status_version)
    .bind(error)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Moves a machine from `from` to `to` like [`transition`], clearing `last_error`; with
/// `maintenance_reason`, records it too (the worker's reason for sending the machine to
/// maintenance). A status write: the generation does not change. False when someone else moved
/// the machine first. Records the transition in the custody ledger in the same transaction, with
/// the error it clears and the maintenance reason as evidence.
pub async fn advance(
    conn: &mut Conn,
    key: &LedgerKey,
    id: MachineId,
    from: MachineState,
    status_version: i64,
    to: MachineState,
    maintenance_reason: Option<&str>,
) -> Result<bool, StoreError> {
    let mut tx = conn.begin().await?;
    // `old` is the row as the statement found it: the error this move clears.
    let moved: Option<(Option<String>, Option<serde_json::Value>, Option<String>)> = sqlx::query_as(
        "update machines m set state = $4, last_error = null, \
         maintenance_reason = coalesce($5, m.maintenance_reason), \
         status_version = m.status_version + 1, updated_at = now() \
         from machines old where old.id = m.id \
         and m.id = $1 and m.state = $2 and m.status_version = $3 \
         returning m.maintenance_reason, old.last_error, m.system_uuid",
    )
    .bind(id.uuid())
    .bind(from.as_str())
    .bind(status_version)
    .bind(to.as_str())
    .bind(maintenance_reason)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((reason_now, cleared_error, system_uuid)) = moved else {
        return Ok(false);
    };
    use MachineState as S;
    let reason = match (from, to) {
        (_, S::Maintenance) => reason_now.clone().unwrap_or_else(|| "taken out of service".to_owned()),
        (S::Enrolling, S::Inspecting) => "the BMC answered; inspecting the machine".to_owned(),
        (S::Inspecting, S::Cleaning) => "inspection matched the machine class; wiping before first use".to_owned(),
        (S::Maintenance, S::Cleaning) => "maintenance ended; wiping before the machine serves again".to_owned(),
        _ => format!("moved from {} to {}", from.as_str(), to.as_str()),
    };
    let mut evidence = serde_json::Map::new();
    if let Some(error) = cleared_error {
        evidence.insert("last_error".to_owned(), error);
    }
    if to == S::Maintenance {
        evidence.insert("maintenance_reason".to_owned(), serde_json::json!(reason_now));
    }
    if to == S::Cleaning || to == S::Maintenance {
        evidence.insert("system_uuid".to_owned(), serde_json::json!(system_uuid));
    }
    let mut reason = reason;
    if (from, to) == (S::Maintenance, S::Cleaning) {
        if let Some(remediation) = crate::remediation::returned(&mut tx, id).await? {
            reason = format!("returned after remediation {remediation}: {reason}");
            evidence.insert("remediation_id".to_owned(), serde_json::json!(remediation));
        }
    }
    custody::append(&mut tx, key, id, Some(from), to, custody::WORKER_ACTOR, &reason, &evidence.into()).await?;
    tx.commit().await?;
    Ok(true)
}

/// The unique index that keeps a system UUID on one record among machines not retired.
pub const SYSTEM_UUID_KEY: &str = "machines_system_uuid_key";

/// The record (not retired, other than `id`) that holds `system_uuid`, with its name.
pub async fn system_uuid_holder(
    conn: &mut Conn,
    id: MachineId,
    system_uuid: &str,
) -> Result<Option<(MachineId, String)>, StoreError> {
    let found: Option<(Uuid, String)> = sqlx::query_as(
        "select id, name from machines where lower(system_uuid) = lower($2) and retired_at is null and id <> $1",
    )
    .bind(id.uuid())
    .bind(system_uuid)
    .fetch_optional(conn)
    .await?;
    Ok(found.map(|(holder, name)| (MachineId(holder), name)))
}

/// Stops a record whose inspection found its system UUID held by `holder`: it moves (from
/// `enrolling` or `inspecting`, guarded on the state and status version) to
/// [`DUPLICATE_STATE`](paddock_domain::machine::DUPLICATE_STATE) with `duplicate_of` and a
/// `duplicate_system` error, and the finding goes on its custody ledger in the same transaction.
/// The UUID itself is not recorded on the row: the holder's index entry keeps it. False when
/// someone else moved the machine first.
pub async fn mark_duplicate(
    conn: &mut Conn,
    key: &LedgerKey,
    id: MachineId,
    from: MachineState,
    status_version: i64,
    holder: (MachineId, &str),
    system_uuid: &str,
) -> Result<bool, StoreError> {
    use paddock_domain::machine::{DUPLICATE_STATE, DUPLICATE_SYSTEM};
    let message = format!(
        "the BMC answers with system UUID {system_uuid}, which machine {} ({}) holds: the same server is enrolled \
         twice; this record is never powered or wiped and can only be retired",
        holder.1, holder.0
    );
    let error = serde_json::json!({ "code": DUPLICATE_SYSTEM, "message": message, "at": chrono::Utc::now() });
    let mut tx = conn.begin().await?;
    let done = sqlx::query(
        "update machines set state = $4, duplicate_of = $5, last_error = $6, status_version = status_version + 1, \
         updated_at = now() where id = $1 and state = $2 and status_version = $3",
    )
    .bind(id.uuid())
    .bind(from.as_str())
    .bind(status_version)
    .bind(DUPLICATE_STATE.as_str())
    .bind(holder.0.uuid())
    .bind(error)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() != 1 {
        return Ok(false);
    }
    let evidence = serde_json::json!({
        "code": DUPLICATE_SYSTEM, "system_uuid": system_uuid, "duplicate_of": holder.0, "duplicate_of_name": holder.1,
    });
    custody::append(&mut tx, key, id, Some(from), DUPLICATE_STATE, custody::WORKER_ACTOR, &message, &evidence).await?;
    tx.commit().await?;
    Ok(true)
}
