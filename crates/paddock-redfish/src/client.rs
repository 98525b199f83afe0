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

use reqwest::Method;
use serde_json::json;
use tracing::{debug, info, instrument, warn};
use url::Url;

use crate::config::{PowerPolicy, RedfishConfig};
use crate::error::RedfishError;
use crate::limiter::{BmcLimiter, BmcPermit};
use crate::model::{
    ActionInfoRes, ActionRes, BootOverride, BootTarget, ChangeOutcome, Collection, DriveInventory, DriveRes, Link,
    ManagerRes, PowerOutcome, PowerState, ReportedPowerState, ServiceRoot, ServiceRootRes, StorageRes, SystemInventory,
    SystemRes, SystemUuid, VirtualMediaDevice, VirtualMediaRes,
};
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
    /// The system's path, resolved once (the service's layout does not change under us).
    system_path: tokio::sync::OnceCell<String>,
}

/// A system resource as read, with where it lives and its `ETag`.
struct SystemRead {
    path: String,
    res: SystemRes,
    etag: Option<String>,
}

/// A virtual media device as read, with where it lives.
struct DeviceRead {
    path: String,
    res: VirtualMediaRes,
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
        })
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

    /// Converges the power state: already there is success; otherwise sends `Reset` (`On` or
    /// `ForceOff`, as advertised), polls until the state is read back, and re-sends once when the
    /// first request looks lost. Checks the UUID first.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected, power.target = %target))]
    pub async fn power(&self, expected: &SystemUuid, target: PowerState) -> Result<PowerOutcome, RedfishError> {
        let _slot = self.operation().await;
        let system = self.guarded_system(expected).await?;
        let current = system.res.power_state().ok_or_else(|| missing(&system.path, "PowerState"))?;
        if current.settled() == Some(target) {
            debug!("power already {target}");
            return Ok(PowerOutcome::AlreadyThere);
        }
        let action = system.res.actions.as_ref().and_then(|a| a.reset.clone()).unwrap_or_default();
        let Some(action_target) = action.target.clone() else {
            return Err(gap("ComputerSystem.Reset"));
        };
        let reset_type = self.reset_type(&action, target).await?;
        let body = json!({ "ResetType": reset_type });
        let what = format!("ComputerSystem.Reset with ResetType {reset_type}");

        let started = Instant::now();
        info!(power.reset_type = reset_type, "powering {target} with Reset {reset_type}");
        self.transport.change(Method::POST, &action_target, &body, None, &what).await?;
        let (mut reissued, mut polls) = (false, 0u32);
        let mut last = None;
        loop {
            let remaining = self.power.timeout.saturating_sub(started.elapsed());
            if remaining.is_zero() {
                return Err(RedfishError::PowerTimeout {
                    wanted: target.to_string(),
                    last: last.map(|s: ReportedPowerState| s.as_str().to_owned()),
                    timeout: self.power.timeout,
                });
            }
            tokio::time::sleep(self.power.poll_interval.min(remaining)).await;
            polls += 1;
            let now = self.read_system_at(&system.path).await?.res.power_state();
            if now.as_ref().and_then(|s| s.settled()) == Some(target) {
                info!(polls, reissued, "power reached {target}");
                return Ok(PowerOutcome::Changed { reissued, polls });
            }
            // Still in the old settled state long after the request: the BMC dropped it (BMCs
            // busy with a previous change do). A state in transition is left alone.
            let unchanged = now.as_ref().and_then(|s| s.settled()).is_some_and(|s| s != target);
            if !reissued && unchanged && started.elapsed() >= self.power.reissue_after {
                warn!("power still not {target} after {:?}; sending Reset {reset_type} once more", started.elapsed());
                self.transport.change(Method::POST, &action_target, &body, None, &what).await?;
                reissued = true;
            }
            last = now;
        }
    }

    /// Sets a one-time boot override (`BootSourceOverrideEnabled: Once`). Checks the UUID first;
    /// a target not in the advertised allowable values is a `CapabilityGap`.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected, boot.target = %target))]
    pub async fn set_boot_once(
        &self,
        expected: &SystemUuid,
        target: BootTarget,
    ) -> Result<ChangeOutcome, RedfishError> {
        let _slot = self.operation().await;
        let system = self.guarded_system(expected).await?;
        let Some(boot) = &system.res.boot else {
            return Err(gap("boot source override"));
        };
        if let Some(allowed) = &boot.target_allowable {
            if !allowed.iter().any(|v| v == target.as_str()) {
                return Err(gap(&format!("boot source override to {target} (allowed: {})", allowed.join(", "))));
            }
        }
        if boot.target.as_deref() == Some(target.as_str()) && boot.enabled.as_deref() == Some("Once") {
            return Ok(ChangeOutcome::AlreadyDone);
        }
        let body =
            json!({ "Boot": { "BootSourceOverrideTarget": target.as_str(), "BootSourceOverrideEnabled": "Once" } });
        // If-Match with the ETag we read: a BMC that uses ETags refuses a PATCH without one.
        let what = format!("PATCH of Boot.BootSourceOverrideTarget to {target}");
        self.transport.change(Method::PATCH, &system.path, &body, system.etag.as_deref(), &what).await?;
        // Read back the target. `BootSourceOverrideEnabled` is not checked: some BMCs (and
        // sushy-tools) keep reporting `Continuous` after accepting `Once`.
        let after = self.read_system_at(&system.path).await?;
        if after.res.boot.and_then(|b| b.target).as_deref() != Some(target.as_str()) {
            return Err(RedfishError::NotApplied { what: format!("boot override to {target}") });
        }
        info!("boot override set to {target} once");
        Ok(ChangeOutcome::Applied)
    }

    /// Lists the virtual media devices, found under the system or else under its managers
    /// (`Links.ManagedBy`). Empty when the BMC has none. A single device means no second device
    /// for the seed: the caller decides (`no_second_virtual_media`).
    #[instrument(skip_all, fields(bmc.host = %self.host_key()))]
    pub async fn virtual_media_devices(&self) -> Result<Vec<VirtualMediaDevice>, RedfishError> {
        let _slot = self.operation().await;
        let system = self.read_system().await?;
        let devices = self.devices(&system.res).await?;
        Ok(devices
            .into_iter()
            .map(|d| VirtualMediaDevice {
                id: d.res.id.unwrap_or_else(|| last_segment(&d.path).to_owned()),
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
        if found.res.inserted == Some(true) || found.res.image.is_some() {
            info!("ejecting the previous image from {device} first");
            self.eject(&found, device).await?;
        }
        let action = found.res.actions.as_ref().and_then(|a| a.insert.as_ref()).and_then(|a| a.target.clone());
        let Some(action) = action else {
            return Err(gap(&format!("VirtualMedia.InsertMedia on {device}")));
        };
        let body = json!({ "Image": image, "Inserted": true, "WriteProtected": true });
        self.transport
            .change(Method::POST, &action, &body, None, &format!("VirtualMedia.InsertMedia on {device}"))
            .await?;
        let after: VirtualMediaRes = self.transport.get(&found.path).await?;
        if after.inserted == Some(false) || (after.inserted.is_none() && after.image.is_none()) {
            return Err(RedfishError::NotApplied { what: format!("insert of media into {device}") });
        }
        info!("inserted media into {device}");
        Ok(ChangeOutcome::Applied)
    }

    /// Ejects whatever is in virtual media `device`. Already empty is success. Checks the UUID first.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected, media.device = device))]
    pub async fn eject_media(&self, expected: &SystemUuid, device: &str) -> Result<ChangeOutcome, RedfishError> {
        let _slot = self.operation().await;
        let system = self.guarded_system(expected).await?;
        let found = self.device(&system.res, device).await?;
        if found.res.inserted != Some(true) && found.res.image.is_none() {
            return Ok(ChangeOutcome::AlreadyDone);
        }
        self.eject(&found, device).await?;
        info!("ejected media from {device}");
        Ok(ChangeOutcome::Applied)
    }

    /// Polls a task monitor (e.g. one named by a `TaskTimeout` error) until the task ends.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), task.uri = task_uri))]
    pub async fn wait_task(&self, task_uri: &str) -> Result<(), RedfishError> {
        let _slot = self.operation().await;
        self.transport.wait_task(task_uri).await
    }

    // ------------------------------------------------------------------ internals (no permits)

    async fn eject(&self, found: &DeviceRead, device: &str) -> Result<(), RedfishError> {
        let what = format!("VirtualMedia.EjectMedia on {device}");
        let action = found.res.actions.as_ref().and_then(|a| a.eject.as_ref()).and_then(|a| a.target.clone());
        let Some(action) = action else {
            return Err(gap(&what));
        };
        self.transport.change(Method::POST, &action, &json!({}), None, &what).await?;
        let after: VirtualMediaRes = self.transport.get(&found.path).await?;
        if after.inserted == Some(true) {
            return Err(RedfishError::NotApplied { what: format!("eject of media from {device}") });
        }
        Ok(())
    }

    /// The system, after checking its UUID.
    async fn guarded_system(&self, expected: &SystemUuid) -> Result<SystemRead, RedfishError> {
        let system = self.read_system().await?;
        let actual = system.res.uuid.as_deref().map(SystemUuid::new);
        if actual.as_ref() != Some(expected) {
            warn!(system.uuid.actual = ?actual, "refusing a destructive call: system UUID mismatch");
            return Err(RedfishError::UuidMismatch {
                expected: expected.to_string(),
                actual: actual.map(|u| u.to_string()),
            });
        }
        Ok(system)
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
    async fn reset_type(&self, action: &ActionRes, target: PowerState) -> Result<&'static str, RedfishError> {
        let allowed = match (&action.reset_type_allowable, &action.action_info) {
            (Some(values), _) => Some(values.clone()),
            (None, Some(info)) => {
                let info: ActionInfoRes = self.transport.get(info).await?;
                info.parameters
                    .into_iter()
                    .find(|p| p.name.as_deref() == Some("ResetType"))
                    .and_then(|p| p.allowable_values)
            }
            (None, None) => None,
        };
        let preferred = target.reset_types();
        match allowed {
            // Not advertised: send the standard value and let the BMC answer.
            None => Ok(preferred[0]),
            Some(values) => preferred
                .iter()
                .copied()
                .find(|t| values.iter().any(|v| v == t))
                .ok_or_else(|| gap(&format!("ComputerSystem.Reset to {target} (allowed: {})", values.join(", ")))),
        }
    }

    /// Drives under `Storage`; `None` when the BMC has no readable storage inventory.
    async fn drives(&self, system: &SystemRes) -> Result<Option<Vec<DriveInventory>>, RedfishError> {
        let Some(storage) = &system.storage else {
            return Ok(None);
        };
        let collection: Collection = match self.transport.get(&storage.id).await {
            Ok(c) => c,
            Err(RedfishError::NotFound { .. } | RedfishError::CapabilityGap { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut drives = Vec::new();
        for member in collection.members {
            let storage: StorageRes = match self.transport.get(&member.id).await {
                Ok(s) => s,
                Err(e @ (RedfishError::NotFound { .. } | RedfishError::CapabilityGap { .. })) => {
                    warn!(error = %e, "storage {} unreadable; its drives stay unverified", member.id);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let storage_id = storage.id.unwrap_or_else(|| last_segment(&member.id).to_owned());
            for link in storage.drives {
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
                    storage_id: storage_id.clone(),
                    name: drive.name,
                    capacity_bytes: drive.capacity_bytes,
                    model: drive.model,
                    media_type: drive.media_type,
                    protocol: drive.protocol,
                    serial_number: drive.serial_number,
                });
            }
        }
        Ok(Some(drives))
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

    async fn devices(&self, system: &SystemRes) -> Result<Vec<DeviceRead>, RedfishError> {
        let Some(collection) = self.media_collection(system).await? else {
            return Ok(Vec::new());
        };
        let members = self.transport.get::<Collection>(&collection).await?.members;
        let mut devices = Vec::with_capacity(members.len());
        for member in members {
            let res: VirtualMediaRes = self.transport.get(&member.id).await?;
            devices.push(DeviceRead { path: member.id, res });
        }
        Ok(devices)
    }

    /// The device with `Id` `device` (case-insensitive), read through the links.
    async fn device(&self, system: &SystemRes, device: &str) -> Result<DeviceRead, RedfishError> {
        let Some(collection) = self.media_collection(system).await? else {
            return Err(gap("virtual media"));
        };
        let members = self.transport.get::<Collection>(&collection).await?.members;
        // The member whose URI ends with the Id is almost always it; read the others only if not.
        let mut ordered: Vec<&Link> =
            members.iter().filter(|m| last_segment(&m.id).eq_ignore_ascii_case(device)).collect();
        ordered.extend(members.iter().filter(|m| !last_segment(&m.id).eq_ignore_ascii_case(device)));
        for member in ordered {
            let res: VirtualMediaRes = self.transport.get(&member.id).await?;
            let id = res.id.clone().unwrap_or_else(|| last_segment(&member.id).to_owned());
            if id.eq_ignore_ascii_case(device) {
                return Ok(DeviceRead { path: member.id.clone(), res });
            }
        }
        Err(RedfishError::NoSuchVirtualMedia {
            device: device.to_owned(),
            available: members.iter().map(|m| last_segment(&m.id).to_owned()).collect(),
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

    #[test]
    fn last_segment_ignores_a_trailing_slash() {
        assert_eq!(last_segment("/redfish/v1/Systems/1/"), "1");
        assert_eq!(last_segment("/redfish/v1/Systems/abc"), "abc");
    }
}
