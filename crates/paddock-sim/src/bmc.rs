//! The simulated BMC: one system per `sim://<name>` URL, its record in `paddock_sim.machines`,
//! created on first contact. Like the real driver, every destructive call first checks the system
//! UUID on record, and repeating a call converges instead of stacking effects.

use paddock_domain::bmc::{
    AfterBoot, BmcAccess, BmcDriver, BmcError, BmcErrorKind, BmcHealth, BootMedia, BoxFuture, Inventory,
    InventoryDrive, SystemStatus, NO_SECOND_VIRTUAL_MEDIA, SYSTEM_UUID_MISMATCH,
};
use paddock_types::health::HealthStatus;
use sqlx::{PgConnection, Row};
use std::sync::Arc;

use crate::{machine_name, micros, system_uuid, Inner, MachineFault, SimError, SimMachine};

/// The `Id` of the only system of a simulated BMC (a `system_id` may name it or its UUID).
pub const SYSTEM_ID: &str = "1";

/// Capacity of each default drive (960 GB).
const DRIVE_BYTES: i64 = 960_197_124_096;

/// The simulated BMC driver; see [`crate::SimWorld::bmc`].
#[derive(Clone)]
pub struct SimBmc {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for SimBmc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimBmc").finish_non_exhaustive()
    }
}

/// Creates the record of the machine at `url` (a valid `sim://<name>`) unless it exists: two
/// drives, powered off, no media. Concurrent first contacts converge on one row.
pub(crate) async fn ensure_machine(conn: &mut PgConnection, url: &str) -> Result<(), SimError> {
    let name = machine_name(url).ok_or_else(|| SimError::NotSimulated(url.to_owned()))?;
    let uuid = system_uuid(name);
    let serial = format!("SIM-{}", &uuid[..8].to_uppercase());
    let drives = serde_json::json!([
        {"id": "disk0", "capacity_bytes": DRIVE_BYTES, "model": "paddock-sim NVMe 960G",
         "serial": format!("{serial}-D0"), "protocol": "NVMe"},
        {"id": "disk1", "capacity_bytes": DRIVE_BYTES, "model": "paddock-sim NVMe 960G",
         "serial": format!("{serial}-D1"), "protocol": "NVMe"},
    ]);
    // No conflict target: a concurrent first contact conflicts on `system_uuid` too (unique, and
    // derived from the URL), which `on conflict (bmc_url)` would raise as a unique violation.
    sqlx::query(
        "insert into paddock_sim.machines (bmc_url, name, system_uuid, serial, model, drives)
         values ($1, $2, $3, $4, 'paddock-sim machine', $5)
         on conflict do nothing",
    )
    .bind(url)
    .bind(name)
    .bind(&uuid)
    .bind(&serial)
    .bind(&drives)
    .execute(conn)
    .await?;
    Ok(())
}

/// What the BMC knows of its system.
struct MachineRow {
    system_uuid: String,
    serial: String,
    model: String,
    cpu_cores: Option<i32>,
    memory_gib: Option<i32>,
    drives: serde_json::Value,
    power_on: bool,
    /// The one-time boot target, when set (`cd`).
    boot_override: Option<String>,
    /// The image in the CD, when inserted.
    image_url: Option<String>,
    faults: Vec<String>,
}

impl MachineRow {
    fn has(&self, fault: MachineFault) -> bool {
        self.faults.iter().any(|f| f == fault.as_str())
    }
}

async fn machine_row(conn: &mut PgConnection, url: &str) -> Result<Option<MachineRow>, SimError> {
    let row = sqlx::query(
        "select system_uuid, serial, model, cpu_cores, memory_gib, drives, power_on, boot_override, image_url, faults
         from paddock_sim.machines where bmc_url = $1",
    )
    .bind(url)
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(MachineRow {
        system_uuid: row.try_get("system_uuid")?,
        serial: row.try_get("serial")?,
        model: row.try_get("model")?,
        cpu_cores: row.try_get("cpu_cores")?,
        memory_gib: row.try_get("memory_gib")?,
        drives: row.try_get("drives")?,
        power_on: row.try_get("power_on")?,
        boot_override: row.try_get("boot_override")?,
        image_url: row.try_get("image_url")?,
        faults: row.try_get("faults")?,
    }))
}

/// The machine at `url` as tests see it.
pub(crate) async fn machine_get(conn: &mut PgConnection, url: &str) -> Result<Option<SimMachine>, SimError> {
    let row = sqlx::query(
        "select bmc_url, name, system_uuid, power_on, boot_override, image_url, seed_url is not null as seed_inserted,
                boot_seq, reported_seq,
                (disk_booted_at is not null and (booted_at is null or disk_booted_at >= booted_at)) as from_disk,
                faults
         from paddock_sim.machines where bmc_url = $1",
    )
    .bind(url)
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let faults: Vec<String> = row.try_get("faults")?;
    Ok(Some(SimMachine {
        bmc_url: row.try_get("bmc_url")?,
        name: row.try_get("name")?,
        system_uuid: row.try_get("system_uuid")?,
        power_on: row.try_get("power_on")?,
        boot_override: row.try_get("boot_override")?,
        image_url: row.try_get("image_url")?,
        seed_inserted: row.try_get("seed_inserted")?,
        boot_seq: row.try_get("boot_seq")?,
        reported_seq: row.try_get("reported_seq")?,
        booted_from_disk: row.try_get("from_disk")?,
        faults: faults.iter().filter_map(|f| MachineFault::parse(f)).collect(),
    }))
}

/// The simulation's own database failed: worth another try, like an unreachable BMC.
fn unavailable(e: SimError) -> BmcError {
    tracing::warn!(error = %e, "the simulated BMC cannot reach its world");
    BmcError::new(BmcErrorKind::Transient, "bmc_unreachable", "the simulated BMC's world is unavailable")
}

/// Marks the Nodes of a machine that is going down (powered off, or rebooting into media) as not
/// Ready: their kubelet is gone.
async fn nodes_down(conn: &mut PgConnection, uuid: &str) -> Result<(), SimError> {
    sqlx::query("update paddock_sim.nodes set ready_at = null where system_uuid = $1 and ready_at is not null")
        .bind(uuid)
        .execute(conn)
        .await?;
    Ok(())
}

impl SimBmc {
    /// Reaches the BMC at `access.url`: waits the BMC latency, creates the machine on first
    /// contact, applies the BMC-wide faults and the `system_id` selection.
    async fn contact(
        &self,
        access: &BmcAccess,
    ) -> Result<(sqlx::pool::PoolConnection<sqlx::Postgres>, MachineRow), BmcError> {
        if machine_name(&access.url).is_none() {
            return Err(BmcError::new(
                BmcErrorKind::Permanent,
                "bmc_config_invalid",
                "the simulated BMC driver only reaches sim://<name> URLs",
            ));
        }
        tokio::time::sleep(self.inner.config.bmc_latency).await;
        let mut conn = self.inner.store.conn().await.map_err(|e| unavailable(e.into()))?;
        ensure_machine(&mut conn, &access.url).await.map_err(unavailable)?;
        let row = machine_row(&mut conn, &access.url)
            .await
            .map_err(unavailable)?
            .ok_or_else(|| unavailable(SimError::NotSimulated(access.url.clone())))?;
        if row.has(MachineFault::BmcTimeout) {
            return Err(BmcError::new(
                BmcErrorKind::Transient,
                "bmc_timeout",
                "the simulated BMC did not answer in time",
            ));
        }
        if row.has(MachineFault::AuthFails) {
            return Err(BmcError::new(
                BmcErrorKind::AuthFailed,
                "bmc_auth_failed",
                "the simulated BMC refused the credentials",
            ));
        }
        if let Some(id) = &access.system_id {
            if id != SYSTEM_ID && !id.eq_ignore_ascii_case(&row.system_uuid) {
                return Err(BmcError::new(
                    BmcErrorKind::Permanent,
                    "bmc_system_not_found",
                    format!("the simulated BMC has no system {id:?} (its only system is {SYSTEM_ID:?})"),
                ));
            }
        }
        Ok((conn, row))
    }

    /// [`Self::contact`], then the guard of every destructive call: the system must still report
    /// the UUID inspection recorded, and there must be one on record.
    async fn contact_guarded(
        &self,
        access: &BmcAccess,
    ) -> Result<(sqlx::pool::PoolConnection<sqlx::Postgres>, MachineRow), BmcError> {
        let (conn, row) = self.contact(access).await?;
        match &access.system_uuid {
            None => Err(BmcError::new(
                BmcErrorKind::Permanent,
                "bmc_system_uuid_missing",
                "no system UUID is on record for this machine: destructive calls are refused until it is inspected",
            )),
            Some(expected) if !expected.eq_ignore_ascii_case(&row.system_uuid) => Err(BmcError::new(
                BmcErrorKind::Permanent,
                SYSTEM_UUID_MISMATCH,
                format!("the BMC's system reports UUID {} instead of {expected}", row.system_uuid),
            )),
            Some(_) => Ok((conn, row)),
        }
    }
}

impl BmcDriver for SimBmc {
    fn inspect<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<Inventory, BmcError>> {
        Box::pin(async move {
            let (_conn, row) = self.contact(access).await?;
            let drives: Vec<InventoryDrive> = serde_json::from_value(row.drives.clone()).map_err(|e| {
                BmcError::new(BmcErrorKind::Permanent, "bmc_inventory_invalid", format!("stored drives: {e}"))
            })?;
            Ok(Inventory {
                system_uuid: row.system_uuid,
                serial: Some(row.serial),
                model: Some(row.model),
                manufacturer: Some("paddock-sim".to_owned()),
                power_on: Some(row.power_on),
                cpu_cores: row.cpu_cores.and_then(|c| u32::try_from(c).ok()),
                memory_gib: row.memory_gib.and_then(|m| u32::try_from(m).ok()),
                drives: Some(drives),
            })
        })
    }

    fn boot_from_media<'a>(
        &'a self,
        access: &'a BmcAccess,
        media: &'a BootMedia,
    ) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            let (mut conn, row) = self.contact_guarded(access).await?;
            if row.has(MachineFault::SingleVirtualMedia) {
                return Err(BmcError::new(
                    BmcErrorKind::CapabilityGap,
                    NO_SECOND_VIRTUAL_MEDIA,
                    "the simulated BMC has a single virtual media device: it cannot insert the seed next to the image",
                ));
            }
            // Power off, eject, insert both, one-time boot from CD, power on: a new boot, which
            // the agent reports once `boot_latency` has passed. Repeating it restarts the boot.
            sqlx::query(
                "update paddock_sim.machines set power_on = true, boot_override = 'cd', image_url = $2, seed_url = $3,
                        booted_at = now(), boot_seq = boot_seq + 1, agent_claimed_until = null, updated_at = now()
                 where bmc_url = $1",
            )
            .bind(&access.url)
            .bind(&media.image_url)
            .bind(media.seed_url.expose())
            .execute(&mut *conn)
            .await
            .map_err(|e| unavailable(e.into()))?;
            nodes_down(&mut conn, &row.system_uuid).await.map_err(unavailable)?;
            self.inner.boots.made(self.inner.config.boot_latency);
            Ok(())
        })
    }

    fn finish_boot<'a>(&'a self, access: &'a BmcAccess, after: AfterBoot) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            let (mut conn, row) = self.contact_guarded(access).await?;
            let result = match after {
                AfterBoot::PowerOff => sqlx::query(
                    "update paddock_sim.machines set power_on = false, boot_override = null, image_url = null,
                                seed_url = null, updated_at = now()
                         where bmc_url = $1",
                )
                .bind(&access.url)
                .execute(&mut *conn)
                .await
                .map(drop)
                .map_err(SimError::from),
                AfterBoot::BootFromDisk => {
                    boot_from_disk(&mut conn, &access.url, &row, micros(self.inner.config.node_ready_latency)).await
                }
            };
            result.map_err(unavailable)?;
            if after == AfterBoot::PowerOff {
                nodes_down(&mut conn, &row.system_uuid).await.map_err(unavailable)?;
            }
            Ok(())
        })
    }

    fn power_off<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            let (mut conn, row) = self.contact_guarded(access).await?;
            // Already off is success: the update just confirms it.
            sqlx::query("update paddock_sim.machines set power_on = false, updated_at = now() where bmc_url = $1")
                .bind(&access.url)
                .execute(&mut *conn)
                .await
                .map_err(|e| unavailable(e.into()))?;
            nodes_down(&mut conn, &row.system_uuid).await.map_err(unavailable)?;
            Ok(())
        })
    }

    fn power_on<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            let (mut conn, row) = self.contact_guarded(access).await?;
            // Already on is success, and a machine that is on is never restarted.
            if row.power_on {
                return Ok(());
            }
            if row.boot_override.is_none() && row.image_url.is_none() {
                // Off and set to boot from disk: powering on boots the installed OS, whose Nodes
                // come back like after any boot from disk.
                boot_from_disk(&mut conn, &access.url, &row, micros(self.inner.config.node_ready_latency))
                    .await
                    .map_err(unavailable)?;
            } else {
                sqlx::query("update paddock_sim.machines set power_on = true, updated_at = now() where bmc_url = $1")
                    .bind(&access.url)
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| unavailable(e.into()))?;
            }
            Ok(())
        })
    }

    fn system_status<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<SystemStatus, BmcError>> {
        Box::pin(async move {
            let (_conn, row) = self.contact_guarded(access).await?;
            let (status, rated) = match row.has(MachineFault::HealthCritical) {
                true => (HealthStatus::Failed, "Critical"),
                false => (HealthStatus::Healthy, "OK"),
            };
            let health = BmcHealth { status, detail: format!("Status.HealthRollup: {rated}") };
            Ok(SystemStatus { power_on: Some(row.power_on), health: Some(health) })
        })
    }
}

/// Ejects the media, sets the boot device back to disk and restarts from disk, unless the
/// machine already runs from disk since its last media boot (so a repeated call does not restart
/// it again). The restart registers the machine's Nodes; they turn Ready `ready_after_us` later,
/// unless the machine never joins.
async fn boot_from_disk(
    conn: &mut PgConnection,
    url: &str,
    row: &MachineRow,
    ready_after_us: i64,
) -> Result<(), SimError> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let restarted = sqlx::query(
        "update paddock_sim.machines set power_on = true, boot_override = null, image_url = null, seed_url = null,
                disk_booted_at = now(), updated_at = now()
         where bmc_url = $1
           and not (power_on and boot_override is null and image_url is null and seed_url is null
                    and disk_booted_at is not null and (booted_at is null or disk_booted_at >= booted_at))",
    )
    .bind(url)
    .execute(&mut *tx)
    .await?
    .rows_affected()
        > 0;
    if restarted {
        let never = row.has(MachineFault::NeverJoins);
        sqlx::query(
            "update paddock_sim.nodes set joined_at = now(),
                    ready_at = case when $2 then null else now() + $3 * interval '1 microsecond' end
             where system_uuid = $1",
        )
        .bind(&row.system_uuid)
        .bind(never)
        .bind(ready_after_us)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
