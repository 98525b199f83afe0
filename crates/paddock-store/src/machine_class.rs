//! Machine classes.

use chrono::{DateTime, Utc};
use paddock_domain::model::MachineClass;
use paddock_types::machine_class::{MachineClassAcceptance, MachineClassCreate, MachineClassPrice};
use paddock_types::{MachineClassId, MachineId};
use sqlx::types::Json;
use uuid::Uuid;

use crate::{Conn, StoreError};

#[derive(sqlx::FromRow)]
struct MachineClassRow {
    id: Uuid,
    name: String,
    cpu_cores: i32,
    memory_gib: i32,
    gpu_model: String,
    gpu_count: i32,
    description: String,
    price_currency: Option<String>,
    price_node_hour: Option<i64>,
    acceptance: Option<Json<MachineClassAcceptance>>,
    generation: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

const COLUMNS: &str = "id, name, cpu_cores, memory_gib, gpu_model, gpu_count, description, price_currency, \
    (price_node_hour * 1000000)::bigint as price_node_hour, acceptance, generation, created_at, updated_at";

fn unsigned(v: i32) -> u32 {
    // The table's check constraints keep these non-negative.
    u32::try_from(v).unwrap_or(0)
}

fn signed(v: u32) -> i32 {
    // Validation bounds these far below i32::MAX.
    i32::try_from(v).unwrap_or(i32::MAX)
}

impl From<MachineClassRow> for MachineClass {
    fn from(r: MachineClassRow) -> Self {
        MachineClass {
            id: MachineClassId(r.id),
            spec: MachineClassCreate {
                name: r.name,
                cpu_cores: unsigned(r.cpu_cores),
                memory_gib: unsigned(r.memory_gib),
                gpu_model: r.gpu_model,
                gpu_count: unsigned(r.gpu_count),
                description: r.description,
                price: r.price_currency.zip(r.price_node_hour).map(|(currency, micros)| MachineClassPrice {
                    currency,
                    node_hour: paddock_domain::usage::micros_text(micros),
                }),
                acceptance: r.acceptance.map(|a| a.0),
            },
            generation: r.generation,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

/// The class's price in millionths (validation has checked the text).
fn price_micros(spec: &MachineClassCreate) -> Option<i64> {
    spec.price.as_ref().and_then(|p| paddock_domain::usage::parse_micros(&p.node_hour))
}

/// Inserts a class.
pub async fn insert(
    conn: &mut Conn,
    id: MachineClassId,
    spec: &MachineClassCreate,
) -> Result<MachineClass, StoreError> {
    let row: MachineClassRow = sqlx::query_as(&format!(
        "insert into machine_classes (id, name, cpu_cores, memory_gib, gpu_model, gpu_count, description, \
           price_currency, price_node_hour, acceptance) \
         values ($1, $2, $3, $4, $5, $6, $7, $8, $9::bigint / 1000000.0, $10) returning {COLUMNS}"
    ))
    .bind(id.uuid())
    .bind(&spec.name)
    .bind(signed(spec.cpu_cores))
    .bind(signed(spec.memory_gib))
    .bind(&spec.gpu_model)
    .bind(signed(spec.gpu_count))
    .bind(&spec.description)
    .bind(spec.price.as_ref().map(|p| &p.currency))
    .bind(price_micros(spec))
    .bind(spec.acceptance.as_ref().map(Json))
    .fetch_one(conn)
    .await?;
    Ok(row.into())
}

/// A class by name.
pub async fn get_by_name(conn: &mut Conn, name: &str) -> Result<Option<MachineClass>, StoreError> {
    select_by_name(conn, name, "").await
}

/// A class by name, locked until the transaction ends.
pub async fn get_by_name_for_update(conn: &mut Conn, name: &str) -> Result<Option<MachineClass>, StoreError> {
    select_by_name(conn, name, " for update").await
}

async fn select_by_name(conn: &mut Conn, name: &str, lock: &str) -> Result<Option<MachineClass>, StoreError> {
    let row: Option<MachineClassRow> =
        sqlx::query_as(&format!("select {COLUMNS} from machine_classes where name = $1{lock}"))
            .bind(name)
            .fetch_optional(conn)
            .await?;
    Ok(row.map(Into::into))
}

/// The first `limit` class names, alphabetically.
pub async fn names(conn: &mut Conn, limit: u32) -> Result<Vec<String>, StoreError> {
    let names = sqlx::query_scalar("select name from machine_classes order by name limit $1")
        .bind(i64::from(limit))
        .fetch_all(conn)
        .await?;
    Ok(names)
}

/// Classes after `after`, by id.
pub async fn list(conn: &mut Conn, after: Option<Uuid>, limit: u32) -> Result<Vec<MachineClass>, StoreError> {
    let rows: Vec<MachineClassRow> = sqlx::query_as(&format!(
        "select {COLUMNS} from machine_classes where ($1::uuid is null or id > $1) order by id limit $2"
    ))
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(Into::into).collect())
}

/// Writes a new spec and bumps the generation. The caller holds the row lock.
pub async fn update_spec(
    conn: &mut Conn,
    id: MachineClassId,
    spec: &MachineClassCreate,
) -> Result<MachineClass, StoreError> {
    let row: MachineClassRow = sqlx::query_as(&format!(
        "update machine_classes set cpu_cores = $2, memory_gib = $3, gpu_model = $4, gpu_count = $5, \
         description = $6, price_currency = $7, price_node_hour = $8::bigint / 1000000.0, acceptance = $9, \
         generation = generation + 1, updated_at = now() where id = $1 returning {COLUMNS}"
    ))
    .bind(id.uuid())
    .bind(signed(spec.cpu_cores))
    .bind(signed(spec.memory_gib))
    .bind(&spec.gpu_model)
    .bind(signed(spec.gpu_count))
    .bind(&spec.description)
    .bind(spec.price.as_ref().map(|p| &p.currency))
    .bind(price_micros(spec))
    .bind(spec.acceptance.as_ref().map(Json))
    .fetch_one(conn)
    .await?;
    Ok(row.into())
}

/// The acceptance image of a machine's class, if the class names one.
pub async fn acceptance_of_machine(
    conn: &mut Conn,
    machine: MachineId,
) -> Result<Option<MachineClassAcceptance>, StoreError> {
    let found: Option<Option<Json<MachineClassAcceptance>>> = sqlx::query_scalar(
        "select c.acceptance from machines m join machine_classes c on c.id = m.machine_class_id where m.id = $1",
    )
    .bind(machine.uuid())
    .fetch_optional(conn)
    .await?;
    Ok(found.flatten().map(|a| a.0))
}

/// Whether any machine (retired ones included: their custody history names the class) or any
/// node pool (deleted ones included: their usage history does) refers to the class.
pub async fn in_use(conn: &mut Conn, id: MachineClassId) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(
        "select exists (select 1 from machines where machine_class_id = $1) \
         or exists (select 1 from node_pools where machine_class_id = $1)",
    )
    .bind(id.uuid())
    .fetch_one(conn)
    .await?)
}

/// Deletes a class.
pub async fn delete(conn: &mut Conn, id: MachineClassId) -> Result<(), StoreError> {
    sqlx::query("delete from machine_classes where id = $1").bind(id.uuid()).execute(conn).await?;
    Ok(())
}

/// How many machines the fleet holds of a class (every machine not retired): the most one
/// request may ask for (docs/architecture.md, cluster reconciler step 3).
pub async fn fleet_size(conn: &mut Conn, id: MachineClassId) -> Result<u64, StoreError> {
    let n: i64 = sqlx::query_scalar("select count(*) from machines where machine_class_id = $1 and state <> 'retired'")
        .bind(id.uuid())
        .fetch_one(conn)
        .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// A class's name and how many of its machines are `available` now (for the provider's
/// messages only).
pub async fn available_of(conn: &mut Conn, id: MachineClassId) -> Result<(String, u64), StoreError> {
    let (name, n): (String, i64) = sqlx::query_as(
        "select c.name, (select count(*) from machines m where m.machine_class_id = c.id \
           and m.state = 'available') from machine_classes c where c.id = $1",
    )
    .bind(id.uuid())
    .fetch_one(conn)
    .await?;
    Ok((name, u64::try_from(n).unwrap_or(0)))
}
