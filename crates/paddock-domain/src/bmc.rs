//! The BMC seam of the machine lifecycle (docs/architecture.md): the [`BmcDriver`] trait the worker
//! calls, the values it exchanges, and the pure rule that checks an inspected machine against its
//! class. No HTTP here: the Redfish implementation lives in `paddock_redfish::driver`.
//!
//! What the BMC does not report is *unverified*, never a mismatch; only a reported value that
//! contradicts the class is a mismatch (and sends the machine to maintenance).

use std::future::Future;
use std::pin::Pin;

use paddock_types::machine_class::MachineClassCreate;
use paddock_types::MachineId;
use serde::{Deserialize, Serialize};

use crate::secret::SecretString;

/// A boxed, sendable future (the same type as `futures::future::BoxFuture`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Everything a driver needs to reach one machine's BMC; the password is already opened.
#[derive(Debug, Clone)]
pub struct BmcAccess {
    /// The machine: the key of the one-call-per-machine bound.
    pub machine_id: MachineId,
    /// BMC service URL.
    pub url: String,
    /// The system's `Id` or `UUID`; required when the BMC lists several systems.
    pub system_id: Option<String>,
    /// User name.
    pub username: String,
    /// Password (never printed).
    pub password: SecretString,
    /// PEM of the CA that signed the BMC's certificate.
    pub ca_cert: Option<String>,
    /// Accept any certificate.
    pub insecure_tls: bool,
    /// The system UUID inspection recorded. Every destructive call first checks that the BMC's
    /// system still reports it (and refuses without one).
    pub system_uuid: Option<String>,
}

/// What a boot from virtual media inserts: the image as a CD and the run's NoCloud seed as the
/// second device.
#[derive(Debug, Clone)]
pub struct BootMedia {
    /// The image to boot (the provider's wipe image, or the node OS installer).
    pub image_url: String,
    /// The run's seed image (`/v1/agent/{token}/seed.iso`): holds a token, so never printed.
    pub seed_url: SecretString,
}

/// What a machine does after its media are ejected and its boot device is set back to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterBoot {
    /// Stay (or be) powered off: the end of a wipe.
    PowerOff,
    /// Boot from disk now: the end of a provisioning boot (the installed OS comes up and joins).
    BootFromDisk,
}

/// Where an operation that ends in a power change stands when it returns without waiting for
/// the BMC (a power change takes the BMC seconds to minutes; a worker does not sit in a
/// job slot meanwhile).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerProgress {
    /// The call's part is done: see each call for what may still be under way.
    Done,
    /// The BMC is carrying out a power change the call needs: call again after this long.
    Pending(std::time::Duration),
}

/// A drive as the BMC reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryDrive {
    /// The drive's id at the BMC.
    pub id: String,
    /// Capacity, when reported.
    pub capacity_bytes: Option<u64>,
    /// Model, when reported.
    pub model: Option<String>,
    /// Serial number, when reported (the wipe agent matches drives by it).
    #[serde(default)]
    pub serial: Option<String>,
    /// Protocol as the BMC names it (`NVMe`, `SATA`, `SAS`, ...), when reported.
    #[serde(default)]
    pub protocol: Option<String>,
}

/// What inspection read from the BMC. `None` means "not reported", never zero.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    /// The system UUID (always reported: without it the machine cannot be guarded).
    pub system_uuid: String,
    /// Serial number.
    pub serial: Option<String>,
    /// Model.
    pub model: Option<String>,
    /// Manufacturer.
    pub manufacturer: Option<String>,
    /// Whether the system is powered on (`None` while transitioning or unreported).
    pub power_on: Option<bool>,
    /// CPU cores.
    pub cpu_cores: Option<u32>,
    /// Memory in GiB.
    pub memory_gib: Option<u32>,
    /// Drives; `None` when the BMC has no storage inventory.
    pub drives: Option<Vec<InventoryDrive>>,
}

/// How a BMC call failed, for the worker's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BmcErrorKind {
    /// Wrong credentials: wait until they are patched (no retry storm).
    AuthFailed,
    /// Several systems and no (matching) `system_id`: wait until it is patched.
    AmbiguousSystem,
    /// Worth another try later (unreachable, timeout, 5xx).
    Transient,
    /// The BMC lacks a feature the step needs.
    CapabilityGap,
    /// Anything else that will not heal by itself.
    Permanent,
}

/// A failed BMC call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct BmcError {
    /// Classification.
    pub kind: BmcErrorKind,
    /// Stable snake_case code for `last_error.code` (`bmc_auth_failed`).
    pub code: String,
    /// Readable message (never a secret).
    pub message: String,
}

impl BmcError {
    /// An error of `kind` with `code` and `message`.
    pub fn new(kind: BmcErrorKind, code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { kind, code: code.into(), message: message.into() }
    }
}

/// The operations the machine lifecycle needs from a BMC. Object-safe: the worker holds an
/// `Arc<dyn BmcDriver>`.
pub trait BmcDriver: Send + Sync {
    /// Reads the system's identity and inventory. Read-only.
    fn inspect<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<Inventory, BmcError>>;

    /// Boots the system once from `media`: checks the system UUID, powers off, ejects whatever is
    /// inserted, inserts the image (CD) and the seed (second device), sets a one-time boot from
    /// CD and powers on. Idempotent: repeating it restarts the boot. A BMC with a single virtual
    /// media device answers [`BmcErrorKind::CapabilityGap`] with code
    /// [`NO_SECOND_VIRTUAL_MEDIA`].
    fn boot_from_media<'a>(
        &'a self,
        access: &'a BmcAccess,
        media: &'a BootMedia,
    ) -> BoxFuture<'a, Result<(), BmcError>>;

    /// Ends a media boot: checks the system UUID, powers off (for [`AfterBoot::PowerOff`]),
    /// ejects every medium, sets the boot device back to disk, and for
    /// [`AfterBoot::BootFromDisk`] restarts the system from disk. Idempotent.
    fn finish_boot<'a>(&'a self, access: &'a BmcAccess, after: AfterBoot) -> BoxFuture<'a, Result<(), BmcError>>;

    /// [`Self::boot_from_media`] without waiting for the power: answers
    /// [`PowerProgress::Pending`] while the power-off before the media is under way (nothing else
    /// changed yet: call it again), and [`PowerProgress::Done`] once the media are in and the
    /// power-on is asked for: the boot is under way, and [`Self::power_progress`] (or
    /// [`Self::start_finish_boot`]) settles its power-on. Calling it again after `Done` restarts
    /// the boot. The default waits ([`Self::boot_from_media`]).
    fn start_boot_from_media<'a>(
        &'a self,
        access: &'a BmcAccess,
        media: &'a BootMedia,
    ) -> BoxFuture<'a, Result<PowerProgress, BmcError>> {
        Box::pin(async move { self.boot_from_media(access, media).await.map(|()| PowerProgress::Done) })
    }

    /// [`Self::finish_boot`] without waiting for the power: first settles a power change this
    /// driver still has pending for the machine (the boot's power-on), then powers off (for
    /// [`AfterBoot::PowerOff`]) answering [`PowerProgress::Pending`] until it reads off, then
    /// ejects and points the boot at the disk and answers [`PowerProgress::Done`]. Call it again
    /// until it does. The default waits ([`Self::finish_boot`]).
    fn start_finish_boot<'a>(
        &'a self,
        access: &'a BmcAccess,
        after: AfterBoot,
    ) -> BoxFuture<'a, Result<PowerProgress, BmcError>> {
        Box::pin(async move { self.finish_boot(access, after).await.map(|()| PowerProgress::Done) })
    }

    /// Settles a power change a `start_*` call of this driver left pending for the machine: reads
    /// the power (after checking the system UUID), sends the request again when it looks lost,
    /// and fails with a transient timeout past the driver's power timeout. Answers
    /// [`PowerProgress::Done`] once it reads the state asked for, and at once, without a request,
    /// when nothing is pending (also in another process than the one that asked: the pending
    /// change is remembered in memory only). The default: nothing is ever pending.
    fn power_progress<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<PowerProgress, BmcError>> {
        let _ = access;
        Box::pin(async { Ok(PowerProgress::Done) })
    }

    /// Powers the system off (checking the system UUID first); already off is success.
    fn power_off<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>>;

    /// Powers the system on from its current boot source (checking the system UUID first);
    /// already on is success, and a system that is on is never restarted. Used by the power sync
    /// for a machine that should be on (`active`). The default answers
    /// [`BmcErrorKind::CapabilityGap`]: a driver that cannot do it says so instead of guessing.
    fn power_on<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        let _ = access;
        Box::pin(async {
            Err(BmcError::new(
                BmcErrorKind::CapabilityGap,
                "bmc_power_on_unsupported",
                "this BMC driver cannot power on",
            ))
        })
    }

    /// Reads whether the system is powered on and how the BMC rates its health, after checking
    /// that it still reports the UUID on record: the power sync acts only on the machine it
    /// knows. Read-only. The default reads the whole inventory (which carries no health); drivers
    /// override it with a cheaper read, since the power sync calls it periodically for every
    /// machine at rest.
    fn system_status<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<SystemStatus, BmcError>> {
        Box::pin(async move {
            let inventory = self.inspect(access).await?;
            match access.system_uuid.as_deref() {
                Some(known) if known.eq_ignore_ascii_case(&inventory.system_uuid) => {
                    Ok(SystemStatus { power_on: inventory.power_on, health: None })
                }
                Some(known) => Err(BmcError::new(
                    BmcErrorKind::Permanent,
                    SYSTEM_UUID_MISMATCH,
                    format!("the BMC reports system UUID {} but inspection recorded {known}", inventory.system_uuid),
                )),
                None => Err(BmcError::new(
                    BmcErrorKind::Permanent,
                    SYSTEM_UUID_MISMATCH,
                    "no system UUID is on record for this machine; its power is not synchronized",
                )),
            }
        })
    }

    /// Out-of-band erase (docs/security.md, in addition to the in-band wipe, never instead of it):
    /// checks the system UUID, then asks the BMC for every erase it advertises, narrowest first
    /// (Redfish `Drive.SecureErase` per drive, `Storage.ResetToDefaults` per controller,
    /// `ComputerSystem.Decommission` of the user data), one result per action called; a refused or
    /// failed erase is a result, not an error. The default: the BMC advertises none.
    fn erase_out_of_band<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<Vec<OutOfBandErase>, BmcError>> {
        let _ = access;
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// One read of a system: its power and the BMC's rating of its health.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SystemStatus {
    /// Powered on (`None` while it is changing or unreported).
    pub power_on: Option<bool>,
    /// The BMC's rating of the system's health (`None`: not reported).
    pub health: Option<BmcHealth>,
}

/// The BMC's rating of a system's health (Redfish `Status.HealthRollup`, else `Status.Health`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BmcHealth {
    /// `OK` is healthy, `Warning` degraded, `Critical` failed.
    pub status: paddock_types::health::HealthStatus,
    /// What the BMC said, for people (e.g. `Status.HealthRollup: Critical`).
    pub detail: String,
}

/// What one of a BMC's out-of-band erases came to (a clean's evidence records it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutOfBandErase {
    /// What the action erases: one drive, a storage controller's volumes, or the whole system's
    /// user data.
    pub scope: EraseScope,
    /// The erased resource's id at the BMC: the inventory's `drives[].id`, the storage
    /// subsystem's or the system's `Id`.
    pub id: String,
    /// The BMC's action, e.g. `Drive.SecureErase`.
    pub action: String,
    /// `success` or `failure`.
    pub result: EraseResult,
    /// Why it failed.
    pub detail: Option<String>,
}

/// The reach of one out-of-band erase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EraseScope {
    /// `Drive.SecureErase`: one drive.
    Drive,
    /// `Storage.ResetToDefaults` (`ResetAll`): a controller's volumes and settings.
    Storage,
    /// `ComputerSystem.Decommission` (`UserData`, secure erase required): every block device.
    System,
}

/// The outcome of one out-of-band erase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EraseResult {
    /// The BMC accepted the erase and, where it gave a task, the task completed.
    Success,
    /// The BMC refused the erase or its task failed.
    Failure,
}

/// The `last_error.code` and maintenance reason of a BMC that can insert only one medium.
pub const NO_SECOND_VIRTUAL_MEDIA: &str = "no_second_virtual_media";

/// The code of a BMC whose system reports another UUID than the one on record.
pub const SYSTEM_UUID_MISMATCH: &str = "system_uuid_mismatch";

/// Field names of the verification section.
pub mod field {
    /// CPU cores against the class.
    pub const CPU_CORES: &str = "cpu_cores";
    /// Memory against the class.
    pub const MEMORY_GIB: &str = "memory_gib";
    /// GPUs against the class (no BMC we drive reports them yet).
    pub const GPU: &str = "gpu";
    /// Drives, verified by being reported.
    pub const DRIVES: &str = "drives";
    /// Serial number, verified by being reported.
    pub const SERIAL: &str = "serial";
    /// Model, verified by being reported.
    pub const MODEL: &str = "model";
    /// Manufacturer, verified by being reported.
    pub const MANUFACTURER: &str = "manufacturer";
    /// Power state, verified by being reported.
    pub const POWER_STATE: &str = "power_state";
}

/// The result of checking an inventory against a class.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InspectionVerdict {
    /// Fields the BMC reported (and, for class fields, that match the class).
    pub verified: Vec<String>,
    /// Fields the BMC did not report: neither confirmed nor contradicted.
    pub unverified: Vec<String>,
    /// Readable contradictions with the class; non-empty sends the machine to maintenance.
    pub mismatches: Vec<String>,
}

impl InspectionVerdict {
    /// Whether the machine matches its class as far as the BMC can tell.
    pub fn matches(&self) -> bool {
        self.mismatches.is_empty()
    }

    /// The maintenance reason for the mismatches (`None` when it matches).
    pub fn maintenance_reason(&self) -> Option<String> {
        if self.matches() {
            None
        } else {
            Some(format!("inventory does not match the machine class: {}", self.mismatches.join("; ")))
        }
    }
}

/// Checks `inv` against `class`: CPU cores and memory must equal the class exactly when reported;
/// what is not reported is unverified. GPUs cannot be read from the BMC yet: always unverified.
pub fn check_against_class(inv: &Inventory, class: &MachineClassCreate) -> InspectionVerdict {
    let mut v = InspectionVerdict::default();
    let mut exact = |name: &str, reported: Option<u32>, wanted: u32, unit: &str| match reported {
        None => v.unverified.push(name.to_owned()),
        Some(got) if got == wanted => v.verified.push(name.to_owned()),
        Some(got) => {
            v.mismatches.push(format!("{name}: the class requires {wanted}{unit}, the BMC reports {got}{unit}"))
        }
    };
    exact(field::CPU_CORES, inv.cpu_cores, class.cpu_cores, "");
    exact(field::MEMORY_GIB, inv.memory_gib, class.memory_gib, " GiB");
    v.unverified.push(field::GPU.to_owned());
    let reported = [
        (field::DRIVES, inv.drives.is_some()),
        (field::SERIAL, inv.serial.is_some()),
        (field::MODEL, inv.model.is_some()),
        (field::MANUFACTURER, inv.manufacturer.is_some()),
        (field::POWER_STATE, inv.power_on.is_some()),
    ];
    for (name, is_reported) in reported {
        if is_reported {
            v.verified.push(name.to_owned());
        } else {
            v.unverified.push(name.to_owned());
        }
    }
    v
}

/// The machine's `inventory` JSON: what was read plus the `verification` section.
pub fn inventory_json(inv: &Inventory, verdict: &InspectionVerdict) -> serde_json::Value {
    let mut value = serde_json::to_value(inv).unwrap_or_else(|_| serde_json::json!({}));
    if let Some(map) = value.as_object_mut() {
        map.insert(
            "verification".to_owned(),
            serde_json::json!({
                "verified": verdict.verified,
                "unverified": verdict.unverified,
                "mismatches": verdict.mismatches,
            }),
        );
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(cpu: u32, mem: u32) -> MachineClassCreate {
        MachineClassCreate {
            name: "c".into(),
            cpu_cores: cpu,
            memory_gib: mem,
            gpu_model: String::new(),
            gpu_count: 0,
            description: String::new(),
            price: None,
            acceptance: None,
        }
    }

    fn inv() -> Inventory {
        Inventory {
            system_uuid: "u".into(),
            serial: None,
            model: None,
            manufacturer: Some("Sushy Emulator".into()),
            power_on: Some(false),
            cpu_cores: None,
            memory_gib: None,
            drives: Some(vec![InventoryDrive {
                id: "nvme0".into(),
                capacity_bytes: Some(1),
                model: None,
                serial: None,
                protocol: None,
            }]),
        }
    }

    #[test]
    fn unreported_is_unverified_not_a_mismatch() {
        let v = check_against_class(&inv(), &class(32, 256));
        assert!(v.matches());
        for f in ["cpu_cores", "memory_gib", "gpu", "serial", "model"] {
            assert!(v.unverified.contains(&f.to_owned()), "{f}: {v:?}");
        }
        for f in ["drives", "manufacturer", "power_state"] {
            assert!(v.verified.contains(&f.to_owned()), "{f}: {v:?}");
        }
        assert_eq!(v.maintenance_reason(), None);
    }

    #[test]
    fn reported_values_are_compared_exactly() {
        let mut i = inv();
        i.cpu_cores = Some(32);
        i.memory_gib = Some(255);
        let v = check_against_class(&i, &class(32, 256));
        assert!(v.verified.contains(&"cpu_cores".to_owned()));
        assert_eq!(v.mismatches, ["memory_gib: the class requires 256 GiB, the BMC reports 255 GiB"]);
        assert!(v.maintenance_reason().expect("reason").contains("memory_gib"));
        i.cpu_cores = Some(16);
        i.memory_gib = Some(256);
        let v = check_against_class(&i, &class(32, 256));
        assert_eq!(v.mismatches.len(), 1);
        assert!(v.mismatches[0].starts_with("cpu_cores"));
    }

    #[test]
    fn gpu_is_always_unverified() {
        let mut c = class(1, 1);
        c.gpu_count = 4;
        c.gpu_model = "H100".into();
        let v = check_against_class(&inv(), &c);
        assert!(v.unverified.contains(&"gpu".to_owned()));
        assert!(v.matches());
    }

    #[test]
    fn inventory_json_carries_the_verification() {
        let i = inv();
        let v = check_against_class(&i, &class(2, 2));
        let json = inventory_json(&i, &v);
        assert_eq!(json["system_uuid"], "u");
        assert_eq!(json["drives"][0]["id"], "nvme0");
        assert_eq!(json["cpu_cores"], serde_json::Value::Null);
        assert!(json["verification"]["unverified"].as_array().expect("array").contains(&"cpu_cores".into()));
        assert!(json["verification"]["verified"].as_array().expect("array").contains(&"drives".into()));
    }

    #[test]
    fn the_driver_trait_is_object_safe() {
        fn takes(_: Option<std::sync::Arc<dyn BmcDriver>>) {}
        takes(None);
    }
}
