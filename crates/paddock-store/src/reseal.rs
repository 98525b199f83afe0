//! The re-seal job's bookkeeping: every encrypted column, the batches of values not yet sealed
//! under the current key, and the guarded write of a re-sealed value.
//!
//! A value's key id is bytes 2 to 5 of the sealed value (`paddock_domain::secret`), so "not yet
//! under the current key" is a filter the database applies: a run that stops half-way (a crash,
//! a lost lease) resumes where it stopped, and a run with nothing left to do reads nothing.

use paddock_domain::job_kind::RESEAL;
use uuid::Uuid;

use crate::{job, Conn, StoreError, Txn};

/// Every sealed column, as (table, column); each table's key is `id`, which the seal is bound to.
pub const SEALED_COLUMNS: [(&str, &str); 4] = [
    ("machines", "bmc_password_enc"),
    ("clusters", "admin_kubeconfig_enc"),
    ("clusters", "slurm_secrets_enc"),
    ("agent_tokens", "config_enc"),
];

/// The target type and id of the one re-seal job.
pub const RESEAL_TARGET_TYPE: &str = "reseal";
const RESEAL_TARGET: Uuid = Uuid::from_u128(0x7061_6464_6f63_6b00_0000_0000_0000_0002);

/// Enqueues the re-seal job (merged into the queued one, if any).
pub async fn enqueue(conn: &mut Txn<'_>) -> Result<(), StoreError> {
    let new = job::NewJob {
        kind: RESEAL,
        target_type: RESEAL_TARGET_TYPE,
        target_id: RESEAL_TARGET,
        payload: serde_json::json!({}),
        tenant_id: None,
        operation_id: None,
        run_at: None,
    };
    job::enqueue(conn, &new).await?;
    Ok(())
}

/// Up to `limit` values of `table.column` after row `after` (in id order) that are not sealed
/// under `key_id`.
pub async fn stale(
    conn: &mut Conn,
    (table, column): (&str, &str),
    key_id: &[u8],
    after: Uuid,
    limit: u32,
) -> Result<Vec<(Uuid, Vec<u8>)>, StoreError> {
    // The names come from SEALED_COLUMNS, never from input.
    let sql = format!(
        "select id, {column} from {table} where {column} is not null and id > $1 \
         and substring({column} from 2 for {len}) <> $2 order by id limit $3",
        len = key_id.len(),
    );
    let rows = sqlx::query_as(&sql).bind(after).bind(key_id).bind(i64::from(limit)).fetch_all(conn).await?;
    Ok(rows)
}

/// Writes a re-sealed value, guarded on the old one: a value changed meanwhile (a new password,
/// sealed under the current key) is left alone. Whether it was written.
pub async fn replace(
    conn: &mut Conn,
    (table, column): (&str, &str),
    id: Uuid,
    old: &[u8],
    new: &[u8],
) -> Result<bool, StoreError> {
    let sql = format!("update {table} set {column} = $3 where id = $1 and {column} = $2");
    let done = sqlx::query(&sql).bind(id).bind(old).bind(new).execute(conn).await?;
    Ok(done.rows_affected() == 1)
}
