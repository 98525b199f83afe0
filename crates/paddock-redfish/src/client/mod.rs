//! `RedfishClient`: one BMC system, its inventory and the idempotent operations the machine
//! lifecycle needs (power, one-time boot, virtual media).
//!
//! Invariants:
//! - Every destructive operation first reads the system and compares its UUID with the one the
//!   caller recorded (`ensure_uuid`); on a mismatch nothing is sent.
//! - Every operation checks its postcondition before acting and reports `AlreadyThere` /
//!   `AlreadyDone` instead of sending a request (STYLE §5: read `PowerState` before a `Reset`).
//! - Only advertised actions are used; a missing action or value is a `CapabilityGap`.
//! - Only URLs the service links to are requested, never constructed ones: sushy-tools, for
//!   one, resets every virtual media device of a system when asked for an unknown device.

use std::time::Instant;

use paddock_domain::bmc::{AfterBoot, EraseResult, EraseScope, OutOfBandErase, PowerProgress};
use paddock_domain::secret::SecretString;
use reqwest::Method;
use serde_json::{json, Value};
use tracing::{debug, info, instrument, warn};
use url::Url;

use crate::config::{PowerPolicy, RedfishConfig};
use crate::error::RedfishError;
use crate::limiter::{BmcLimiter, BmcPermit};
use crate::model::{
    media_class, ActionInfoRes, ActionRes, BootOverride, BootTarget, ChangeOutcome, Collection, DriveInventory,
    DriveRes, Link, ManagerRes, MediaClass, PowerOutcome, PowerState, ReportedPowerState, RestartOutcome, ServiceRoot,
    ServiceRootRes, StorageRes, SystemInventory, SystemRes, SystemUuid, VirtualMediaDevice, VirtualMediaRes,
};
use crate::redact::Redactor;
use crate::transport::Transport;

/// The service root path, the one URL every Redfish service has.
const SERVICE_ROOT: &str = "/redfish/v1/";

/// A client for one system behind one BMC endpoint.
#[derive(Debug)]
pub struct RedfishClient {
    transport: Transport,
    system_id: Option<String>,
    power: PowerPolicy,
    limiter: Option<(BmcLimiter, String)>,
    /// The system's path, resolved once (the service's layout does not change under us), or
    /// given by the caller from an earlier client's [`Discovery`].
    system_path: tokio::sync::OnceCell<String>,
    /// The virtual media devices' paths (the collection's members), read once or given.
    media_members: std::sync::Mutex<Option<Vec<String>>>,
}

/// Where a client found the system and its virtual media devices on the BMC: what the driver
/// keeps per machine so that the next client skips the service root, the `Systems` collection and
/// the virtual media collection. Never the system itself: every destructive call still
/// reads it and checks its UUID first (docs/security.md).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovery {
    /// The system's path.
    pub system_path: Option<String>,
    /// The paths of the virtual media devices.
    pub media_members: Option<Vec<String>>,
}

impl Discovery {
    /// Whether anything is known.
    pub fn is_empty(&self) -> bool {
        self.system_path.is_none() && self.media_members.is_none()
    }
}

/// A power change a client asked the BMC for and has not yet seen settle: what the driver keeps
/// per machine between the calls of a job that does not wait for the power.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingPower {
    /// The state asked for.
    pub target: PowerState,
    /// When the wait began (the first request, or the start of a new window after a timeout).
    pub since: Instant,
    /// Whether the request was sent again after looking lost.
    pub reissued: bool,
}

/// A system resource as read, with where it lives and its `ETag`.
struct SystemRead {
    path: String,
    res: SystemRes,
    etag: Option<String>,
}

/// A storage subsystem as read: its `Id`, its erase action if advertised, its drives.
struct StorageRead {
    id: String,
    reset_to_defaults: Option<ActionRes>,
    drives: Vec<DriveInventory>,
}

/// A virtual media device as read, with where it lives and its `ETag`.
struct DeviceRead {
    path: String,
    res: VirtualMediaRes,
    etag: Option<String>,
}

impl DeviceRead {
    /// The device's `Id` (the last segment of its URI when it reports none).
    fn id(&self) -> String {
        self.res.id.clone().unwrap_or_else(|| last_segment(&self.path).to_owned())
    }

    /// Whether the device holds (or names) an image.
    fn is_loaded(&self) -> bool {
        self.res.inserted == Some(true) || self.res.image.is_some()
    }
}

/// `ResetType`s that restart a running system, in order of preference.
const RESTART_TYPES: &[&str] = &["ForceRestart", "GracefulRestart", "PowerCycle"];

/// The first of `preferred` that `allowed` lists; without a list, the first (the BMC answers).
fn pick_reset_type(allowed: Option<&[String]>, preferred: &'static [&'static str]) -> Option<&'static str> {
    match allowed {
        None => preferred.first().copied(),
        Some(values) => preferred.iter().copied().find(|t| values.iter().any(|v| v == t)),
    }
}

fn allowed_list(allowed: Option<&[String]>) -> String {
    allowed.map(|v| format!(" (allowed: {})", v.join(", "))).unwrap_or_default()
}

/// Fails with `UuidMismatch` unless `system` reports `expected`.
fn check_uuid(system: &SystemRead, expected: &SystemUuid) -> Result<(), RedfishError> {
    let actual = system.res.uuid.as_deref().map(SystemUuid::new);
    if actual.as_ref() != Some(expected) {
        warn!(system.uuid.actual = ?actual, "refusing a destructive call: system UUID mismatch");
        return Err(RedfishError::UuidMismatch {
            expected: expected.to_string(),
            actual: actual.map(|u| u.to_string()),
        });
    }
    Ok(())
}

/// What one round of a power wait read.
enum PowerReading {
    /// The target state, settled.
    Reached,
    /// Anything else (or nothing: a BMC that did not say).
    Not(Option<ReportedPowerState>),
}

/// A boot override to send, checked against what the system advertises.
#[derive(Debug, Clone, PartialEq, Eq)]
enum BootPlan {
    /// `BootSourceOverrideTarget` with `BootSourceOverrideEnabled`.
    Target { target: BootTarget, enabled: &'static str },
    /// `BootSourceOverrideEnabled: Disabled`: the system's own boot order.
    Disabled,
}

impl BootPlan {
    /// A one-time boot from `target`.
    fn once(system: &SystemRead, target: BootTarget) -> Result<Self, RedfishError> {
        let boot = system.res.boot.as_ref().ok_or_else(|| gap("boot source override"))?;
        if let Some(allowed) = &boot.target_allowable {
            if !allowed.iter().any(|v| v == target.as_str()) {
                return Err(gap(&format!("boot source override to {target} (allowed: {})", allowed.join(", "))));
            }
        }
        if let Some(allowed) = &boot.enabled_allowable {
            if !allowed.iter().any(|v| v == "Once") {
                return Err(gap(&format!("a one-time boot override (allowed: {})", allowed.join(", "))));
            }
        }
        Ok(Self::Target { target, enabled: "Once" })
    }

    /// Back to the disk: `Hdd` `Continuous`, else `Hdd` `Once`, else the override disabled.
    fn disk(system: &SystemRead) -> Result<Self, RedfishError> {
        let boot = system.res.boot.as_ref().ok_or_else(|| gap("boot source override"))?;
        let enabled_ok = |v: &str| boot.enabled_allowable.as_ref().is_none_or(|a| a.iter().any(|x| x == v));
        let hdd_ok = boot.target_allowable.as_ref().is_none_or(|a| a.iter().any(|x| x == BootTarget::Hdd.as_str()));
        if hdd_ok {
            for enabled in ["Continuous", "Once"] {
                if enabled_ok(enabled) {
                    return Ok(Self::Target { target: BootTarget::Hdd, enabled });
                }
            }
        }
        if enabled_ok("Disabled") {
            return Ok(Self::Disabled);
        }
        Err(gap("a boot override to the disk (neither Hdd nor Disabled is allowed)"))
    }

    fn body(&self) -> serde_json::Value {
        match self {
            Self::Target { target, enabled } => {
                json!({ "Boot": { "BootSourceOverrideTarget": target.as_str(), "BootSourceOverrideEnabled": enabled } })
            }
            Self::Disabled => json!({ "Boot": { "BootSourceOverrideEnabled": "Disabled" } }),
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Target { target, enabled } => format!("{target} ({enabled})"),
            Self::Disabled => "disabled".to_owned(),
        }
    }

    /// Whether the reported override already is this one.
    fn is_shown(&self, target: Option<&str>, enabled: Option<&str>) -> bool {
        match self {
            Self::Target { target: t, enabled: e } => target == Some(t.as_str()) && enabled == Some(*e),
            Self::Disabled => enabled == Some("Disabled"),
        }
    }

    /// Whether the read-back shows the change (the target only, see `apply_boot`).
    fn is_applied(&self, target: Option<&str>, enabled: Option<&str>) -> bool {
        match self {
            Self::Target { target: t, .. } => target == Some(t.as_str()),
            Self::Disabled => enabled == Some("Disabled"),
        }
    }
}

impl RedfishClient {
    /// Builds the client (HTTP client, TLS trust). Makes no request.
    pub fn new(config: RedfishConfig) -> Result<Self, RedfishError> {
        let transport = Transport::new(&config)?;
        Ok(Self {
            transport,
            system_id: config.system_id,
            power: config.power,
            limiter: None,
            system_path: tokio::sync::OnceCell::new(),
            media_members: std::sync::Mutex::new(None),
        })
    }

    /// Starts the client from what an earlier client of the same machine found out.
    pub fn with_discovery(mut self, discovery: Discovery) -> Self {
        self.system_path = tokio::sync::OnceCell::new_with(discovery.system_path);
        self.media_members = std::sync::Mutex::new(discovery.media_members);
        self
    }

    /// What this client knows of the BMC's layout (to give the next client of the machine).
    pub fn discovery(&self) -> Discovery {
        Discovery {
            system_path: self.system_path.get().cloned(),
            media_members: self.media_members.lock().map(|m| m.clone()).unwrap_or_default(),
        }
    }

    /// The power policy (timeouts, poll interval).
    pub fn power_policy(&self) -> PowerPolicy {
        self.power
    }

    /// Puts the client under shared bounds: one operation at a time for `machine_key` (the
    /// machine id or system UUID), and the limiter's per-host bound for each HTTP request.
    pub fn with_limiter(mut self, limiter: BmcLimiter, machine_key: impl Into<String>) -> Self {
        self.transport.set_limiter(limiter.clone());
        self.limiter = Some((limiter, machine_key.into()));
        self
    }

    /// `host:port` of the BMC.
    pub fn host_key(&self) -> &str {
        self.transport.host_key()
    }

    /// Waits for this machine's slot, if the client is bounded.
    async fn operation(&self) -> Option<BmcPermit> {
        match &self.limiter {
            Some((limiter, machine)) => Some(limiter.acquire_machine(machine).await),
            None => None,
        }
    }

    /// Reads the service root (`/redfish/v1/`).
    #[instrument(skip_all, fields(bmc.host = %self.host_key()))]
    pub async fn service_root(&self) -> Result<ServiceRoot, RedfishError> {
        let _slot = self.operation().await;
        let root: ServiceRootRes = self.transport.get(SERVICE_ROOT).await?;
        Ok(ServiceRoot {
            redfish_version: root.redfish_version,
            uuid: root.uuid,
            vendor: root.vendor,
            product: root.product,
        })
    }

    /// Reads the system's inventory: identity, power state, CPU and memory summaries, drives.
    /// What the BMC does not report is `None`.
    #[instrument(skip_all, fields(bmc.host = %self.host_key()))]
    pub async fn system(&self) -> Result<SystemInventory, RedfishError> {
        let _slot = self.operation().await;
        let system = self.read_system().await?;
        let drives = self.drives(&system.res).await?;
        let res = system.res;
        let power_state = res.power_state();
        let (processor_count, processor_model) = res.processor_summary.map(|p| (p.count, p.model)).unwrap_or_default();
        Ok(SystemInventory {
            id: res.id.unwrap_or_else(|| last_segment(&system.path).to_owned()),
            uuid: res.uuid.as_deref().map(SystemUuid::new),
            name: res.name,
            serial_number: res.serial_number,
            model: res.model,
            manufacturer: res.manufacturer,
            power_state,
            processor_count,
            processor_model,
            memory_gib: res.memory_summary.and_then(|m| m.total_gib),
            drives,
            boot: res.boot.map(|b| BootOverride { target: b.target, enabled: b.enabled }),
        })
    }

    /// Fails with `UuidMismatch` unless the system reports `expected` (compared case-insensitively).
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected))]
    pub async fn ensure_uuid(&self, expected: &SystemUuid) -> Result<(), RedfishError> {
        let _slot = self.operation().await;
        self.guarded_system(expected).await.map(drop)
    }

    /// Converges the power state: already there is success; otherwise sends `Reset` with the first
    /// advertised type that reaches it (`On`/`ForceOn`, `ForceOff`/`GracefulShutdown`, the power
    /// button last), polls until the state is read back, and re-sends once when the first request
    /// looks lost. Checks the UUID first.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected, power.target = %target))]
    pub async fn power(&self, expected: &SystemUuid, target: PowerState) -> Result<PowerOutcome, RedfishError> {
        let _slot = self.operation().await;
        let system = self.guarded_system(expected).await?;
        self.converge_power(system, target).await
    }

    /// Reads the system's settled power state (`None` while it is changing or unreported) with
    /// one read of the system resource, after checking that it reports `expected`. Read-only; the
    /// power sync's periodic check, so it skips the storage inventory [`Self::system`] reads.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected))]
    pub async fn power_state(&self, expected: &SystemUuid) -> Result<Option<PowerState>, RedfishError> {
        let _slot = self.operation().await;
        let system = self.guarded_system(expected).await?;
        Ok(system.res.power_state().and_then(|p| p.settled()))
    }

    /// Restarts the system from its current boot source: a system that is off is powered on;
    /// otherwise a restart `Reset` is sent (`ForceRestart`, else `GracefulRestart` or
    /// `PowerCycle`, as advertised) and the state polled until it reads `On`; a BMC without any
    /// restart gets off and on. Checks the UUID first.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected))]
    pub async fn restart(&self, expected: &SystemUuid) -> Result<RestartOutcome, RedfishError> {
        let _slot = self.operation().await;
        let system = self.guarded_system(expected).await?;
        self.restart_system(system, expected).await
    }

    /// Sets a one-time boot override (`BootSourceOverrideEnabled: Once`). Checks the UUID first;
    /// a target or mode not in the advertised allowable values is a `CapabilityGap`.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected, boot.target = %target))]
    pub async fn set_boot_once(
        &self,
        expected: &SystemUuid,
        target: BootTarget,
    ) -> Result<ChangeOutcome, RedfishError> {
        let _slot = self.operation().await;
        let system = self.guarded_system(expected).await?;
        let plan = BootPlan::once(&system, target)?;
        self.apply_boot(&system, &plan).await
    }

    /// Points the boot back at the local disk: `BootSourceOverrideTarget` `Hdd`, `Continuous`
    /// (`Once` where only that is advertised), so that the machine boots its disk until the next
    /// media boot whatever its boot order says; where `Hdd` is not an allowed target, the
    /// override is disabled instead. Checks the UUID first.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected))]
    pub async fn set_boot_disk(&self, expected: &SystemUuid) -> Result<ChangeOutcome, RedfishError> {
        let _slot = self.operation().await;
        let system = self.guarded_system(expected).await?;
        let plan = BootPlan::disk(&system)?;
        self.apply_boot(&system, &plan).await
    }

    /// Lists the virtual media devices, found under the system or else under its managers
    /// (`Links.ManagedBy`). Empty when the BMC has none.
    #[instrument(skip_all, fields(bmc.host = %self.host_key()))]
    pub async fn virtual_media_devices(&self) -> Result<Vec<VirtualMediaDevice>, RedfishError> {
        let _slot = self.operation().await;
        let system = self.read_system().await?;
        let devices = self.devices(&system.res).await?;
        Ok(devices
            .into_iter()
            .map(|d| VirtualMediaDevice {
                id: d.id(),
                name: d.res.name,
                media_types: d.res.media_types,
                inserted: d.res.inserted,
                image: d.res.image,
            })
            .collect())
    }

    /// Inserts `image_url` into virtual media `device` (by `Id`, e.g. `Cd`). Already inserted is
    /// success; another image is ejected first (many BMCs refuse an insert over media). Checks the
    /// UUID first.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected, media.device = device))]
    pub async fn insert_media(
        &self,
        expected: &SystemUuid,
        device: &str,
        image_url: &Url,
    ) -> Result<ChangeOutcome, RedfishError> {
        let _slot = self.operation().await;
        let system = self.guarded_system(expected).await?;
        let found = self.device(&system.res, device).await?;
        let image = image_url.as_str();
        if found.res.inserted == Some(true) && found.res.image.as_deref() == Some(image) {
            return Ok(ChangeOutcome::AlreadyDone);
        }
        let found = if found.is_loaded() {
            info!("ejecting the previous image from {device} first");
            self.eject(&found).await?;
            self.reread(&found).await?
        } else {
            found
        };
        self.insert_into(&found, image, None).await?;
        info!("inserted media into {device}");
        Ok(ChangeOutcome::Applied)
    }

    /// Ejects whatever is in virtual media `device`. Already empty is success. Checks the UUID first.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected, media.device = device))]
    pub async fn eject_media(&self, expected: &SystemUuid, device: &str) -> Result<ChangeOutcome, RedfishError> {
        let _slot = self.operation().await;
        let system = self.guarded_system(expected).await?;
        let found = self.device(&system.res, device).await?;
        if !found.is_loaded() {
            return Ok(ChangeOutcome::AlreadyDone);
        }
        self.eject(&found).await?;
        info!("ejected media from {device}");
        Ok(ChangeOutcome::Applied)
    }

    /// Boots the system once from virtual media, as one operation (one machine slot): checks the
    /// UUID, checks that the BMC can do it all (a CD for `image`, a second device for `seed`, a
    /// one-time boot from `Cd`) before changing anything, then powers off, ejects every medium,
    /// inserts the image and the seed, sets a one-time boot from `Cd` and powers on. Repeating it
    /// restarts the boot. The seed URL holds a token: it is sent to the BMC and nowhere else (the
    /// BMC's answers to its insert are scrubbed of it).
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected))]
    pub async fn boot_from_media(
        &self,
        expected: &SystemUuid,
        image: &Url,
        seed: &SecretString,
    ) -> Result<(), RedfishError> {
        let _slot = self.operation().await;
        let redactor = Redactor::for_url(seed.expose());
        let system = self.guarded_system(expected).await?;
        let path = system.path.clone();
        let (cd, second) = self.media_plan(&system.res).await?;
        let boot = BootPlan::once(&system, BootTarget::Cd)?;
        info!(media.image_device = %cd.id(), media.seed_device = %second.id(), "booting from virtual media");

        self.converge_power(system, PowerState::Off).await?;
        let system = self.reread_guarded(&path, expected).await?;
        self.eject_all(&system.res).await?;
        self.insert_into(&self.reread(&cd).await?, image.as_str(), None).await?;
        self.insert_into(&self.reread(&second).await?, seed.expose(), Some(&redactor)).await?;
        let system = self.reread_guarded(&path, expected).await?;
        self.apply_boot(&system, &boot).await?;
        let system = self.reread_guarded(&path, expected).await?;
        self.converge_power(system, PowerState::On).await?;
        info!("booting once from virtual media");
        Ok(())
    }

    /// [`boot_from_media`](Self::boot_from_media) without waiting for the power: takes
    /// the boot as far as the power allows. While the system is not off it asks for the power-off
    /// (once; again when it looks lost, see [`PowerPolicy`]) and answers `Pending` with nothing else
    /// changed; once off, it ejects, inserts, sets the one-time boot, asks for the power-on and
    /// answers `Done` (the boot is under way): from there [`power_progress`](Self::power_progress)
    /// settles the power-on. `pending` is the power change asked for by earlier calls for this
    /// machine, updated here.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected))]
    pub async fn start_boot_from_media(
        &self,
        expected: &SystemUuid,
        image: &Url,
        seed: &SecretString,
        pending: &mut Option<PendingPower>,
    ) -> Result<PowerProgress, RedfishError> {
        let _slot = self.operation().await;
        let redactor = Redactor::for_url(seed.expose());
        let system = self.guarded_system(expected).await?;
        let path = system.path.clone();
        let (cd, second) = self.media_plan(&system.res).await?;
        let boot = BootPlan::once(&system, BootTarget::Cd)?;
        if !self.power_step(&system, PowerState::Off, pending).await? {
            return Ok(self.pending_progress());
        }
        info!(media.image_device = %cd.id(), media.seed_device = %second.id(), "booting from virtual media");
        self.eject_all(&system.res).await?;
        self.insert_into(&self.reread(&cd).await?, image.as_str(), None).await?;
        self.insert_into(&self.reread(&second).await?, seed.expose(), Some(&redactor)).await?;
        let system = self.reread_guarded(&path, expected).await?;
        self.apply_boot(&system, &boot).await?;
        let system = self.reread_guarded(&path, expected).await?;
        if !self.power_step(&system, PowerState::On, pending).await? {
            info!("booting once from virtual media; the power-on is under way");
        }
        Ok(PowerProgress::Done)
    }

    /// [`finish_boot`](Self::finish_boot) with [`AfterBoot::PowerOff`] without waiting for the
    /// power: first settles a power-on still `pending` (the boot's), then asks for the
    /// power-off and answers `Pending` until it reads off; then ejects and points the boot at the
    /// disk and answers `Done`.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected))]
    pub async fn start_finish_boot_off(
        &self,
        expected: &SystemUuid,
        pending: &mut Option<PendingPower>,
    ) -> Result<PowerProgress, RedfishError> {
        let _slot = self.operation().await;
        let system = self.guarded_system(expected).await?;
        let path = system.path.clone();
        let boot = BootPlan::disk(&system)?;
        let booting = pending.is_some_and(|p| p.target == PowerState::On);
        if booting && !self.power_step(&system, PowerState::On, pending).await? {
            return Ok(self.pending_progress());
        }
        let system = if booting { self.reread_guarded(&path, expected).await? } else { system };
        if !self.power_step(&system, PowerState::Off, pending).await? {
            return Ok(self.pending_progress());
        }
        self.eject_all(&system.res).await?;
        let system = self.reread_guarded(&path, expected).await?;
        self.apply_boot(&system, &boot).await?;
        Ok(PowerProgress::Done)
    }

    /// Settles the power change `pending` names: `Done` at once (no request) when there is
    /// none; otherwise reads the system (UUID checked), re-sends a request that looks lost, and
    /// fails with a transient `PowerTimeout` past the power timeout.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected))]
    pub async fn power_progress(
        &self,
        expected: &SystemUuid,
        pending: &mut Option<PendingPower>,
    ) -> Result<PowerProgress, RedfishError> {
        let Some(target) = pending.map(|p| p.target) else {
            return Ok(PowerProgress::Done);
        };
        let _slot = self.operation().await;
        let system = self.guarded_system(expected).await?;
        if self.power_step(&system, target, pending).await? {
            return Ok(PowerProgress::Done);
        }
        Ok(self.pending_progress())
    }

    /// Ends a media boot, as one operation: checks the UUID, powers off (for
    /// [`AfterBoot::PowerOff`]), ejects every medium, points the boot at the disk
    /// ([`set_boot_disk`](Self::set_boot_disk)), and for [`AfterBoot::BootFromDisk`] restarts the
    /// system. Repeating `PowerOff` sends nothing; repeating `BootFromDisk` restarts again (a
    /// restart that happened cannot be told from one that did not).
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected, after = ?after))]
    pub async fn finish_boot(&self, expected: &SystemUuid, after: AfterBoot) -> Result<(), RedfishError> {
        let _slot = self.operation().await;
        let system = self.guarded_system(expected).await?;
        let path = system.path.clone();
        let boot = BootPlan::disk(&system)?;
        let system = match after {
            AfterBoot::PowerOff => {
                self.converge_power(system, PowerState::Off).await?;
                self.reread_guarded(&path, expected).await?
            }
            AfterBoot::BootFromDisk => system,
        };
        self.eject_all(&system.res).await?;
        let system = self.reread_guarded(&path, expected).await?;
        self.apply_boot(&system, &boot).await?;
        if after == AfterBoot::BootFromDisk {
            let system = self.reread_guarded(&path, expected).await?;
            self.restart_system(system, expected).await?;
        }
        Ok(())
    }

    /// Out-of-band erase (docs/security.md): calls every erase the BMC advertises, narrowest first
    /// and one after the other (a task monitor is followed to its end): `#Drive.SecureErase` on
    /// each drive, `#Storage.ResetToDefaults` (`ResetAll`) on each storage subsystem, then
    /// `#ComputerSystem.Decommission` of the `UserData` with `RequireSecureErase` (never the
    /// other decommission types: they would reset the BMC's and the firmware's settings, which
    /// are the provider's). An action whose advertised values lack the one paddock sends is left
    /// out. Returns each call's result; a refused or failed erase is that result, not an error.
    /// Checks the UUID first.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected))]
    pub async fn erase_out_of_band(&self, expected: &SystemUuid) -> Result<Vec<OutOfBandErase>, RedfishError> {
        let _slot = self.operation().await;
        let system = self.guarded_system(expected).await?;
        let storages = self.storages(&system.res).await?.unwrap_or_default();
        let mut erased = Vec::new();
        for drive in storages.iter().flat_map(|s| &s.drives) {
            let Some(target) = drive.secure_erase.as_deref() else { continue };
            erased.push(self.erase(EraseScope::Drive, &drive.id, target, "Drive.SecureErase", json!({})).await);
        }
        for storage in &storages {
            let Some(action) = &storage.reset_to_defaults else { continue };
            if let Some(target) = self.allowing(action, "ResetType", "ResetAll").await? {
                let body = json!({ "ResetType": "ResetAll" });
                erased
                    .push(self.erase(EraseScope::Storage, &storage.id, target, "Storage.ResetToDefaults", body).await);
            }
        }
        if let Some(action) = system.res.actions.as_ref().and_then(|a| a.decommission.as_ref()) {
            if let Some(target) = self.allowing(action, "DecommissionTypes", "UserData").await? {
                let id = system.res.id.clone().unwrap_or_else(|| last_segment(&system.path).to_owned());
                let body = json!({ "DecommissionTypes": ["UserData"], "RequireSecureErase": true });
                erased.push(self.erase(EraseScope::System, &id, target, "ComputerSystem.Decommission", body).await);
            }
        }
        Ok(erased)
    }

    /// The action's target when it has one and allows `value` for `param` (or advertises no
    /// values for it).
    async fn allowing<'a>(
        &self,
        action: &'a ActionRes,
        param: &str,
        value: &str,
    ) -> Result<Option<&'a str>, RedfishError> {
        let Some(target) = action.target.as_deref() else { return Ok(None) };
        let allowed = self.allowed_values(action, param).await?;
        if allowed.as_ref().is_some_and(|values| !values.iter().any(|v| v == value)) {
            debug!(action.target = target, "the BMC's action does not allow {param} {value}; not called");
            return Ok(None);
        }
        Ok(Some(target))
    }

    /// One out-of-band erase call and what it came to.
    async fn erase(&self, scope: EraseScope, id: &str, target: &str, action: &str, body: Value) -> OutOfBandErase {
        let (result, detail) = match self.transport.change(Method::POST, target, &body, None, action).await {
            Ok(()) => {
                info!(erase.id = id, erase.action = action, "the BMC's {action} of {id} succeeded");
                (EraseResult::Success, None)
            }
            Err(e) => {
                warn!(erase.id = id, erase.action = action, error = %e, "the BMC's {action} of {id} failed");
                (EraseResult::Failure, Some(e.to_string()))
            }
        };
        OutOfBandErase { scope, id: id.to_owned(), action: action.to_owned(), result, detail }
    }

    /// Polls a task monitor (e.g. one named by a `TaskTimeout` error) until the task ends.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), task.uri = task_uri))]
    pub async fn wait_task(&self, task_uri: &str) -> Result<(), RedfishError> {
        let _slot = self.operation().await;
        self.transport.wait_task(task_uri).await
    }

    // ------------------------------------------------------------------ internals (no permits)

    /// The power convergence of [`power`](Self::power), on a system already read and checked.
    async fn converge_power(&self, system: SystemRead, target: PowerState) -> Result<PowerOutcome, RedfishError> {
        let current = system.res.power_state().ok_or_else(|| missing(&system.path, "PowerState"))?;
        if current.settled() == Some(target) {
            debug!("power already {target}");
            return Ok(PowerOutcome::AlreadyThere);
        }
        let (action_target, reset_type) = self.reset_for(&system, target).await?;
        let body = json!({ "ResetType": reset_type });
        let what = format!("ComputerSystem.Reset with ResetType {reset_type}");
        // Already on its way there: wait rather than send (the emulator, for one, drops a request
        // made while a change is pending). The power button toggles, so it is only pressed from
        // the opposite settled state.
        let on_its_way = matches!(
            (&current, target),
            (ReportedPowerState::PoweringOn, PowerState::On) | (ReportedPowerState::PoweringOff, PowerState::Off)
        );
        let send_now = !on_its_way && (reset_type != "PushPowerButton" || current.settled().is_some());

        let started = Instant::now();
        let mut sent = false;
        if send_now {
            info!(power.reset_type = reset_type, "powering {target} with Reset {reset_type}");
            self.transport.change(Method::POST, &action_target, &body, None, &what).await?;
            sent = true;
        }
        let (mut reissued, mut polls) = (false, 0u32);
        let mut last = None;
        loop {
            polls += 1;
            let PowerReading::Not(now) = self.read_power_after_poll(&system.path, target, started, last).await? else {
                info!(polls, reissued, "power reached {target}");
                return Ok(PowerOutcome::Changed { reissued, polls });
            };
            // Still in the old settled state long after the request: the BMC dropped it (BMCs
            // busy with a previous change do). A state in transition is left alone.
            let unchanged = now.as_ref().and_then(|s| s.settled()).is_some_and(|s| s != target);
            if !reissued && unchanged && started.elapsed() >= self.power.reissue_after {
                if sent {
                    warn!(
                        "power still not {target} after {:?}; sending Reset {reset_type} once more",
                        started.elapsed()
                    );
                    reissued = true;
                } else {
                    info!(
                        power.reset_type = reset_type,
                        "power settled away from {target}; sending Reset {reset_type}"
                    );
                }
                self.transport.change(Method::POST, &action_target, &body, None, &what).await?;
                sent = true;
            }
            last = now;
        }
    }

    /// The answer of a call that left a power change under way: look again after a poll interval.
    fn pending_progress(&self) -> PowerProgress {
        PowerProgress::Pending(self.power.poll_interval)
    }

    /// One look at a power change, without waiting: `true` when `system` reads
    /// `target` (whatever was pending is then over). Otherwise asks for it unless `pending`
    /// already has it asked (or the system is on its way there), sends it once more when it
    /// looks lost ([`PowerPolicy::reissue_after`]), and past [`PowerPolicy::timeout`] fails with
    /// a transient `PowerTimeout` and starts a new window (the next calls ask again).
    async fn power_step(
        &self,
        system: &SystemRead,
        target: PowerState,
        pending: &mut Option<PendingPower>,
    ) -> Result<bool, RedfishError> {
        let current = system.res.power_state().ok_or_else(|| missing(&system.path, "PowerState"))?;
        if current.settled() == Some(target) {
            *pending = None;
            return Ok(true);
        }
        let Some(mut asked) = pending.filter(|p| p.target == target) else {
            // Already on its way there: wait rather than send (the emulator, for one, drops a
            // request made while a change is pending).
            let on_its_way = matches!(
                (&current, target),
                (ReportedPowerState::PoweringOn, PowerState::On) | (ReportedPowerState::PoweringOff, PowerState::Off)
            );
            if !on_its_way {
                self.send_reset(system, target, &current).await?;
            }
            *pending = Some(PendingPower { target, since: Instant::now(), reissued: false });
            return Ok(false);
        };
        let elapsed = asked.since.elapsed();
        if elapsed >= self.power.timeout {
            *pending = Some(PendingPower { target, since: Instant::now(), reissued: false });
            return Err(RedfishError::PowerTimeout {
                wanted: target.to_string(),
                last: Some(current.as_str().to_owned()),
                timeout: self.power.timeout,
            });
        }
        // Still in the old settled state long after the request: the BMC dropped it (BMCs busy
        // with a previous change do). A state in transition is left alone.
        let unchanged = current.settled().is_some_and(|s| s != target);
        if !asked.reissued && unchanged && elapsed >= self.power.reissue_after {
            warn!("power still not {target} after {elapsed:?}; asking once more");
            self.send_reset(system, target, &current).await?;
            asked.reissued = true;
            *pending = Some(asked);
        }
        Ok(false)
    }

    /// Sends the `Reset` that takes `system` (reading `current`) to `target`: the first advertised
    /// type that reaches it, the power button only from the opposite settled state (it toggles).
    async fn send_reset(
        &self,
        system: &SystemRead,
        target: PowerState,
        current: &ReportedPowerState,
    ) -> Result<(), RedfishError> {
        let (action_target, reset_type) = self.reset_for(system, target).await?;
        if reset_type == "PushPowerButton" && current.settled().is_none() {
            return Ok(());
        }
        info!(power.reset_type = reset_type, "powering {target} with Reset {reset_type}");
        let what = format!("ComputerSystem.Reset with ResetType {reset_type}");
        self.transport.change(Method::POST, &action_target, &json!({ "ResetType": reset_type }), None, &what).await
    }

    /// The restart of [`restart`](Self::restart), on a system already read and checked.
    async fn restart_system(&self, system: SystemRead, expected: &SystemUuid) -> Result<RestartOutcome, RedfishError> {
        let current = system.res.power_state().ok_or_else(|| missing(&system.path, "PowerState"))?;
        if matches!(current, ReportedPowerState::Off | ReportedPowerState::PoweringOff) {
            self.converge_power(system, PowerState::On).await?;
            return Ok(RestartOutcome::PoweredOn);
        }
        let action = system.res.actions.as_ref().and_then(|a| a.reset.clone()).unwrap_or_default();
        let Some(action_target) = action.target.clone() else {
            return Err(gap("ComputerSystem.Reset"));
        };
        let allowed = self.allowed_reset_types(&action).await?;
        if let Some(reset_type) = pick_reset_type(allowed.as_deref(), RESTART_TYPES) {
            let what = format!("ComputerSystem.Reset with ResetType {reset_type}");
            info!(power.reset_type = reset_type, "restarting with Reset {reset_type}");
            let body = json!({ "ResetType": reset_type });
            match self.transport.change(Method::POST, &action_target, &body, None, &what).await {
                Ok(()) => {
                    // A restart cannot be told from a lost request by the state alone (a quick
                    // one reads `On` throughout): wait for `On`, which some BMCs only show again
                    // once the restart is through.
                    self.wait_power(&system.path, PowerState::On).await?;
                    return Ok(RestartOutcome::Restarted);
                }
                // Advertised but refused as unsupported: off and on does the same.
                Err(RedfishError::CapabilityGap { status: Some(_), .. }) => {
                    warn!("the BMC refused Reset {reset_type}; restarting by powering off and on")
                }
                Err(e) => return Err(e),
            }
        }
        let path = system.path.clone();
        self.converge_power(system, PowerState::Off).await?;
        let system = self.reread_guarded(&path, expected).await?;
        self.converge_power(system, PowerState::On).await?;
        Ok(RestartOutcome::OffAndOn)
    }

    /// Polls until the power state reads `target` (bounded by the power timeout); sends nothing.
    async fn wait_power(&self, path: &str, target: PowerState) -> Result<u32, RedfishError> {
        let started = Instant::now();
        let (mut polls, mut last) = (0u32, None);
        loop {
            polls += 1;
            match self.read_power_after_poll(path, target, started, last).await? {
                PowerReading::Reached => return Ok(polls),
                PowerReading::Not(now) => last = now,
            }
        }
    }

    /// One round of a power wait that began at `started`: sleeps a poll interval (never past the
    /// power timeout) and reads the power state. Past the timeout, the error names `last`, the
    /// state seen the round before.
    async fn read_power_after_poll(
        &self,
        path: &str,
        target: PowerState,
        started: Instant,
        last: Option<ReportedPowerState>,
    ) -> Result<PowerReading, RedfishError> {
        let remaining = self.power.timeout.saturating_sub(started.elapsed());
        if remaining.is_zero() {
            return Err(RedfishError::PowerTimeout {
                wanted: target.to_string(),
                last: last.map(|s| s.as_str().to_owned()),
                timeout: self.power.timeout,
            });
        }
        tokio::time::sleep(self.power.poll_interval.min(remaining)).await;
        let now = self.read_system_at(path).await?.res.power_state();
        if now.as_ref().and_then(|s| s.settled()) == Some(target) {
            return Ok(PowerReading::Reached);
        }
        Ok(PowerReading::Not(now))
    }

    /// Sends a boot override unless the system already shows it, and reads it back.
    async fn apply_boot(&self, system: &SystemRead, plan: &BootPlan) -> Result<ChangeOutcome, RedfishError> {
        let boot = system.res.boot.as_ref();
        let (target, enabled) = (boot.and_then(|b| b.target.as_deref()), boot.and_then(|b| b.enabled.as_deref()));
        if plan.is_shown(target, enabled) {
            return Ok(ChangeOutcome::AlreadyDone);
        }
        // If-Match with the ETag we read: a BMC that uses ETags refuses a PATCH without one.
        let what = format!("PATCH of the boot override to {}", plan.describe());
        self.transport.change(Method::PATCH, &system.path, &plan.body(), system.etag.as_deref(), &what).await?;
        // Read back the target. `BootSourceOverrideEnabled` is not checked when a target is set:
        // some BMCs (and sushy-tools) keep reporting `Continuous` after accepting `Once`.
        let after = self.read_system_at(&system.path).await?;
        let after = after.res.boot.as_ref();
        if !plan.is_applied(after.and_then(|b| b.target.as_deref()), after.and_then(|b| b.enabled.as_deref())) {
            return Err(RedfishError::NotApplied { what: format!("boot override to {}", plan.describe()) });
        }
        info!("boot override set to {}", plan.describe());
        Ok(ChangeOutcome::Applied)
    }

    /// The devices for a media boot: a CD for the image and a second usable device for the seed
    /// (another CD first, then a USB stick or removable disk, then a floppy).
    async fn media_plan(&self, system: &SystemRes) -> Result<(DeviceRead, DeviceRead), RedfishError> {
        let devices = self.devices(system).await?;
        let mut usable: Vec<(MediaClass, DeviceRead)> = devices
            .into_iter()
            .map(|d| (media_class(&d.res.media_types), d))
            .filter(|(class, _)| *class != MediaClass::Unsuitable)
            .collect();
        if usable.len() < 2 {
            return Err(RedfishError::NoSecondVirtualMedia { usable: usable.iter().map(|(_, d)| d.id()).collect() });
        }
        let Some(cd) = usable.iter().position(|(class, _)| *class == MediaClass::Cd) else {
            let ids: Vec<String> = usable.iter().map(|(_, d)| d.id()).collect();
            return Err(gap(&format!("a CD/DVD virtual media device for the image (devices: {})", ids.join(", "))));
        };
        let (_, cd) = usable.remove(cd);
        // Stable: among equals, the BMC's order.
        usable.sort_by_key(|(class, _)| *class);
        let (_, second) = usable.remove(0);
        Ok((cd, second))
    }

    /// Ejects every loaded device.
    async fn eject_all(&self, system: &SystemRes) -> Result<ChangeOutcome, RedfishError> {
        let mut outcome = ChangeOutcome::AlreadyDone;
        for device in self.devices(system).await? {
            if device.is_loaded() {
                self.eject(&device).await?;
                info!(media.device = %device.id(), "ejected media");
                outcome = ChangeOutcome::Applied;
            }
        }
        Ok(outcome)
    }

    /// Inserts `image` (`InsertMedia`, or a PATCH of `Image` on a BMC without the action) and
    /// checks that the device shows media. With `redact`, the BMC's answers are scrubbed of it.
    async fn insert_into(
        &self,
        found: &DeviceRead,
        image: &str,
        redact: Option<&Redactor>,
    ) -> Result<(), RedfishError> {
        let device = found.id();
        let action = found.res.actions.as_ref().and_then(|a| a.insert.as_ref()).and_then(|a| a.target.clone());
        let body = json!({ "Image": image, "Inserted": true, "WriteProtected": true });
        let (method, link, if_match, what) = match &action {
            Some(action) => (Method::POST, action.as_str(), None, format!("VirtualMedia.InsertMedia on {device}")),
            None => (Method::PATCH, found.path.as_str(), found.etag.as_deref(), format!("PATCH of Image on {device}")),
        };
        match redact {
            Some(r) => self.transport.change_redacted(method, link, &body, if_match, &what, r).await?,
            None => self.transport.change(method, link, &body, if_match, &what).await?,
        }
        let after: VirtualMediaRes = self.transport.get(&found.path).await?;
        if after.inserted == Some(false) || (after.inserted.is_none() && after.image.is_none()) {
            return Err(RedfishError::NotApplied { what: format!("insert of media into {device}") });
        }
        debug!(media.device = %device, "inserted media");
        Ok(())
    }

    /// Ejects (`EjectMedia`, or a PATCH of `Image`/`Inserted` on a BMC without the action) and
    /// checks that the device shows no media.
    async fn eject(&self, found: &DeviceRead) -> Result<(), RedfishError> {
        let device = found.id();
        let action = found.res.actions.as_ref().and_then(|a| a.eject.as_ref()).and_then(|a| a.target.clone());
        match &action {
            Some(action) => {
                let what = format!("VirtualMedia.EjectMedia on {device}");
                self.transport.change(Method::POST, action, &json!({}), None, &what).await?;
            }
            None => {
                let what = format!("PATCH of Image on {device}");
                let body = json!({ "Image": null, "Inserted": false });
                self.transport.change(Method::PATCH, &found.path, &body, found.etag.as_deref(), &what).await?;
            }
        }
        let after: VirtualMediaRes = self.transport.get(&found.path).await?;
        if after.inserted == Some(true) {
            return Err(RedfishError::NotApplied { what: format!("eject of media from {device}") });
        }
        Ok(())
    }

    /// The device read again (fresh state and `ETag`).
    async fn reread(&self, found: &DeviceRead) -> Result<DeviceRead, RedfishError> {
        let (res, etag) = self.transport.get_tagged::<VirtualMediaRes>(&found.path).await?;
        Ok(DeviceRead { path: found.path.clone(), res, etag })
    }

    /// The system read again within an operation, its UUID checked again (it costs nothing: the
    /// read is needed anyway).
    async fn reread_guarded(&self, path: &str, expected: &SystemUuid) -> Result<SystemRead, RedfishError> {
        let system = self.read_system_at(path).await?;
        check_uuid(&system, expected)?;
        Ok(system)
    }

    /// The system, after checking its UUID.
    async fn guarded_system(&self, expected: &SystemUuid) -> Result<SystemRead, RedfishError> {
        let system = self.read_system().await?;
        check_uuid(&system, expected)?;
        Ok(system)
    }

    /// The UUID the system reports, read without any check (for messages).
    pub async fn reported_uuid(&self) -> Result<Option<SystemUuid>, RedfishError> {
        let _slot = self.operation().await;
        Ok(self.read_system().await?.res.uuid.as_deref().map(SystemUuid::new))
    }

    async fn read_system(&self) -> Result<SystemRead, RedfishError> {
        let path = self.system_path.get_or_try_init(|| self.discover_system()).await?;
        self.read_system_at(path).await
    }

    async fn read_system_at(&self, path: &str) -> Result<SystemRead, RedfishError> {
        let (res, etag) = self.transport.get_tagged::<SystemRes>(path).await?;
        Ok(SystemRead { path: path.to_owned(), res, etag })
    }

    /// Service root -> Systems -> the one system, chosen by `Id` or `UUID` when configured.
    async fn discover_system(&self) -> Result<String, RedfishError> {
        let root: ServiceRootRes = self.transport.get(SERVICE_ROOT).await?;
        let systems = root.systems.ok_or_else(|| missing(SERVICE_ROOT, "Systems"))?;
        let members = self.transport.get::<Collection>(&systems.id).await?.members;
        // Redfish makes a resource's `Id` the last segment of its URI: good enough for messages.
        let ids = || members.iter().map(|m| last_segment(&m.id).to_owned()).collect::<Vec<_>>();
        let Some(wanted) = &self.system_id else {
            return match members.as_slice() {
                [] => Err(RedfishError::NoSystems),
                [only] => Ok(only.id.clone()),
                _ => Err(RedfishError::AmbiguousSystem { ids: ids() }),
            };
        };
        // Likely candidates (URI ends with the wanted Id) first, then every member.
        let mut ordered: Vec<&Link> =
            members.iter().filter(|m| last_segment(&m.id).eq_ignore_ascii_case(wanted)).collect();
        ordered.extend(members.iter().filter(|m| !last_segment(&m.id).eq_ignore_ascii_case(wanted)));
        let wanted_uuid = SystemUuid::new(wanted);
        for member in ordered {
            let res: SystemRes = self.transport.get(&member.id).await?;
            let by_id = res.id.as_deref().is_some_and(|id| id.eq_ignore_ascii_case(wanted));
            let by_uuid = res.uuid.as_deref().is_some_and(|u| SystemUuid::new(u) == wanted_uuid);
            if by_id || by_uuid {
                debug!(system.path = %member.id, "system {wanted} is {}", member.id);
                return Ok(member.id.clone());
            }
        }
        if members.is_empty() {
            return Err(RedfishError::NoSystems);
        }
        Err(RedfishError::SystemNotFound { system_id: wanted.clone(), available: ids() })
    }

    /// Allowed `ResetType`s, inline or through `@Redfish.ActionInfo`; `None` = not advertised.
    /// Where `system`'s `Reset` action is sent, and the first advertised type that reaches
    /// `target`; a capability gap when there is none.
    async fn reset_for(&self, system: &SystemRead, target: PowerState) -> Result<(String, &'static str), RedfishError> {
        let action = system.res.actions.as_ref().and_then(|a| a.reset.clone()).unwrap_or_default();
        let Some(action_target) = action.target.clone() else {
            return Err(gap("ComputerSystem.Reset"));
        };
        let allowed = self.allowed_reset_types(&action).await?;
        let reset_type = pick_reset_type(allowed.as_deref(), target.reset_types())
            .ok_or_else(|| gap(&format!("ComputerSystem.Reset to {target}{}", allowed_list(allowed.as_deref()))))?;
        Ok((action_target, reset_type))
    }

    async fn allowed_reset_types(&self, action: &ActionRes) -> Result<Option<Vec<String>>, RedfishError> {
        self.allowed_values(action, "ResetType").await
    }

    /// The values the action allows for its parameter `name`, inline or through
    /// `@Redfish.ActionInfo`; `None` = not advertised (anything may be tried).
    async fn allowed_values(&self, action: &ActionRes, name: &str) -> Result<Option<Vec<String>>, RedfishError> {
        Ok(match (action.inline_allowable(name), &action.action_info) {
            (Some(values), _) => Some(values.clone()),
            (None, Some(info)) => {
                let info: ActionInfoRes = self.transport.get(info).await?;
                info.parameters.into_iter().find(|p| p.name.as_deref() == Some(name)).and_then(|p| p.allowable_values)
            }
            (None, None) => None,
        })
    }

    /// Drives under `Storage`; `None` when the BMC has no readable storage inventory.
    async fn drives(&self, system: &SystemRes) -> Result<Option<Vec<DriveInventory>>, RedfishError> {
        let storages = self.storages(system).await?;
        Ok(storages.map(|s| s.into_iter().flat_map(|s| s.drives).collect()))
    }

    /// The storage subsystems with their drives; `None` when the BMC has no readable storage
    /// inventory. An unreadable subsystem or drive is left out (with a warning).
    async fn storages(&self, system: &SystemRes) -> Result<Option<Vec<StorageRead>>, RedfishError> {
        let Some(storage) = &system.storage else {
            return Ok(None);
        };
        let collection: Collection = match self.transport.get(&storage.id).await {
            Ok(c) => c,
            Err(RedfishError::NotFound { .. } | RedfishError::CapabilityGap { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut storages = Vec::new();
        for member in collection.members {
            let storage: StorageRes = match self.transport.get(&member.id).await {
                Ok(s) => s,
                Err(e @ (RedfishError::NotFound { .. } | RedfishError::CapabilityGap { .. })) => {
                    warn!(error = %e, "storage {} unreadable; its drives stay unverified", member.id);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let id = storage.id.unwrap_or_else(|| last_segment(&member.id).to_owned());
            let drives = self.storage_drives(&id, &storage.drives).await?;
            let reset_to_defaults = storage.actions.and_then(|a| a.reset_to_defaults);
            storages.push(StorageRead { id, reset_to_defaults, drives });
        }
        Ok(Some(storages))
    }

    /// The drives `links` name, of the storage subsystem `storage_id`.
    async fn storage_drives(&self, storage_id: &str, links: &[Link]) -> Result<Vec<DriveInventory>, RedfishError> {
        let mut drives = Vec::new();
        for link in links {
            let drive: DriveRes = match self.transport.get(&link.id).await {
                Ok(d) => d,
                Err(e @ (RedfishError::NotFound { .. } | RedfishError::CapabilityGap { .. })) => {
                    warn!(error = %e, "drive {} unreadable", link.id);
                    continue;
                }
                Err(e) => return Err(e),
            };
            drives.push(DriveInventory {
                id: drive.id.unwrap_or_else(|| last_segment(&link.id).to_owned()),
                storage_id: storage_id.to_owned(),
                name: drive.name,
                capacity_bytes: drive.capacity_bytes,
                model: drive.model,
                media_type: drive.media_type,
                protocol: drive.protocol,
                serial_number: drive.serial_number,
                secure_erase: drive.actions.and_then(|a| a.secure_erase).and_then(|a| a.target),
            });
        }
        Ok(drives)
    }

    /// The virtual media collection: the system's own, else the first manager that has one.
    async fn media_collection(&self, system: &SystemRes) -> Result<Option<String>, RedfishError> {
        if let Some(link) = &system.virtual_media {
            return Ok(Some(link.id.clone()));
        }
        let managers = system.links.as_ref().map(|l| l.managed_by.as_slice()).unwrap_or_default();
        for manager in managers {
            let res: ManagerRes = self.transport.get(&manager.id).await?;
            if let Some(link) = res.virtual_media {
                return Ok(Some(link.id));
            }
        }
        Ok(None)
    }

    /// The paths of the virtual media devices (the collection's members), read once per machine
    /// (see [`Discovery`]); `None` when the BMC has no virtual media.
    async fn media_members(&self, system: &SystemRes) -> Result<Option<Vec<String>>, RedfishError> {
        if let Some(known) = self.media_members.lock().ok().and_then(|m| m.clone()) {
            return Ok(Some(known));
        }
        let Some(collection) = self.media_collection(system).await? else {
            return Ok(None);
        };
        let members: Vec<String> =
            self.transport.get::<Collection>(&collection).await?.members.into_iter().map(|m| m.id).collect();
        if let Ok(mut known) = self.media_members.lock() {
            *known = Some(members.clone());
        }
        Ok(Some(members))
    }

    async fn devices(&self, system: &SystemRes) -> Result<Vec<DeviceRead>, RedfishError> {
        let Some(members) = self.media_members(system).await? else {
            return Ok(Vec::new());
        };
        let mut devices = Vec::with_capacity(members.len());
        for path in members {
            let (res, etag) = self.transport.get_tagged::<VirtualMediaRes>(&path).await?;
            devices.push(DeviceRead { path, res, etag });
        }
        Ok(devices)
    }

    /// The device with `Id` `device` (case-insensitive), read through the links.
    async fn device(&self, system: &SystemRes, device: &str) -> Result<DeviceRead, RedfishError> {
        let Some(members) = self.media_members(system).await? else {
            return Err(gap("virtual media"));
        };
        // The member whose URI ends with the Id is almost always it; read the others only if not.
        let mut ordered: Vec<&String> =
            members.iter().filter(|m| last_segment(m).eq_ignore_ascii_case(device)).collect();
        ordered.extend(members.iter().filter(|m| !last_segment(m).eq_ignore_ascii_case(device)));
        for member in ordered {
            let (res, etag) = self.transport.get_tagged::<VirtualMediaRes>(member).await?;
            let id = res.id.clone().unwrap_or_else(|| last_segment(member).to_owned());
            if id.eq_ignore_ascii_case(device) {
                return Ok(DeviceRead { path: member.clone(), res, etag });
            }
        }
        Err(RedfishError::NoSuchVirtualMedia {
            device: device.to_owned(),
            available: members.iter().map(|m| last_segment(m).to_owned()).collect(),
        })
    }
}

/// The last non-empty path segment of a link.
fn last_segment(link: &str) -> &str {
    link.trim_end_matches('/').rsplit('/').next().unwrap_or(link)
}

fn gap(what: &str) -> RedfishError {
    RedfishError::CapabilityGap { what: what.to_owned(), status: None }
}

fn missing(path: &str, property: &str) -> RedfishError {
    RedfishError::Missing { path: path.to_owned(), property: property.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn system(boot: serde_json::Value) -> SystemRead {
        let res: SystemRes = serde_json::from_value(json!({ "Id": "1", "Boot": boot })).expect("system");
        SystemRead { path: "/redfish/v1/Systems/1".into(), res, etag: None }
    }

    #[test]
    fn boot_back_to_disk_prefers_hdd_continuous_and_honours_the_advertised_values() {
        let plan = |boot| BootPlan::disk(&system(boot)).map_err(|e| e.to_string());
        let hdd = |enabled| Ok(BootPlan::Target { target: BootTarget::Hdd, enabled });
        assert_eq!(plan(json!({})), hdd("Continuous"));
        assert_eq!(plan(json!({"BootSourceOverrideTarget@Redfish.AllowableValues": ["Cd", "Hdd"]})), hdd("Continuous"));
        assert_eq!(
            plan(json!({"BootSourceOverrideEnabled@Redfish.AllowableValues": ["Once", "Disabled"]})),
            hdd("Once")
        );
        assert_eq!(
            plan(json!({"BootSourceOverrideTarget@Redfish.AllowableValues": ["Pxe", "Cd"]})),
            Ok(BootPlan::Disabled)
        );
        assert!(plan(json!({
            "BootSourceOverrideTarget@Redfish.AllowableValues": ["Cd"],
            "BootSourceOverrideEnabled@Redfish.AllowableValues": ["Once"]
        }))
        .is_err());
        assert_eq!(BootPlan::Disabled.body(), json!({"Boot": {"BootSourceOverrideEnabled": "Disabled"}}));
    }

    #[test]
    fn a_one_time_boot_needs_the_target_and_once_advertised() {
        let plan = |boot| BootPlan::once(&system(boot), BootTarget::Cd).map_err(|e| e.to_string());
        assert_eq!(plan(json!({})), Ok(BootPlan::Target { target: BootTarget::Cd, enabled: "Once" }));
        assert!(plan(json!({"BootSourceOverrideTarget@Redfish.AllowableValues": ["Pxe", "Hdd"]})).is_err());
        assert!(plan(json!({"BootSourceOverrideEnabled@Redfish.AllowableValues": ["Continuous"]})).is_err());
        let gap = BootPlan::once(&system(json!(null)), BootTarget::Cd).expect_err("no Boot at all");
        assert!(matches!(gap, RedfishError::CapabilityGap { .. }));
    }

    #[test]
    fn reset_types_follow_the_preference_within_what_is_allowed() {
        let allowed = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(pick_reset_type(None, PowerState::Off.reset_types()), Some("ForceOff"));
        let graceful = allowed(&["On", "GracefulShutdown", "GracefulRestart"]);
        assert_eq!(pick_reset_type(Some(&graceful), PowerState::Off.reset_types()), Some("GracefulShutdown"));
        assert_eq!(pick_reset_type(Some(&graceful), RESTART_TYPES), Some("GracefulRestart"));
        let button = allowed(&["PushPowerButton", "PowerCycle"]);
        assert_eq!(pick_reset_type(Some(&button), PowerState::On.reset_types()), Some("PushPowerButton"));
        assert_eq!(pick_reset_type(Some(&button), RESTART_TYPES), Some("PowerCycle"));
        assert_eq!(pick_reset_type(Some(&allowed(&["Nmi"])), PowerState::On.reset_types()), None);
    }

    #[test]
    fn media_classes_rank_the_seed_carriers() {
        let class = |v: &[&str]| media_class(&v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(class(&["CD", "DVD"]), MediaClass::Cd);
        assert_eq!(class(&["Floppy", "USBStick"]), MediaClass::Removable);
        assert_eq!(class(&["Floppy"]), MediaClass::Floppy);
        assert_eq!(class(&[]), MediaClass::Unknown);
        assert_eq!(class(&["Tape"]), MediaClass::Unsuitable);
        assert!(MediaClass::Cd < MediaClass::Removable && MediaClass::Floppy < MediaClass::Unknown);
    }

    #[test]
    fn last_segment_ignores_a_trailing_slash() {
        assert_eq!(last_segment("/redfish/v1/Systems/1/"), "1");
        assert_eq!(last_segment("/redfish/v1/Systems/abc"), "abc");
    }
}
