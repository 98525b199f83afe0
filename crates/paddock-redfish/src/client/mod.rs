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
//! - Public operations take the machine's slot once (`operation`); the private
//!   steps they are made of take none.
//!
//! The operations live beside their kind: `power` (power state, restart), `boot` (boot overrides
//! and the composite media boots), `media` (virtual media) and `storage` (drives and their
//! out-of-band erase); this module holds the client, its discovery of the system and the reads
//! every operation starts from.

mod boot;
mod media;
mod power;
mod storage;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{debug, instrument, warn};

use crate::config::{PowerPolicy, RedfishConfig};
use crate::error::RedfishError;
use crate::limiter::{BmcLimiter, BmcPermit};
use crate::model::{
    ActionInfoRes, ActionRes, BootOverride, Collection, Link, PowerState, ServiceRoot, ServiceRootRes, SystemInventory,
    SystemRes, SystemUuid,
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
    /// The system's path, resolved once (the service's layout does not change under us), or
    /// given by the caller from an earlier client's [`Discovery`].
    system_path: tokio::sync::OnceCell<String>,
    /// The virtual media devices' paths (the collection's members), read once or given.
    media_members: std::sync::Mutex<Option<Vec<String>>>,
    /// Timeout of an insert of virtual media (`RedfishConfig::insert_timeout`).
    insert_timeout: Duration,
    /// The inserts this machine's clients sent that got no answer, shared with the next client
    /// of the machine (see [`UnansweredInserts`]).
    unanswered: UnansweredInserts,
}

/// The inserts of virtual media into one machine's devices that got no answer (a timeout, a
/// connection lost after sending), by device path: the BMC may still be fetching the image, so
/// an insert of the same image is not sent again before the insert timeout has passed once more
/// since the answer failed to come; the device's state tells when it landed. Shared by every
/// client of one machine.
#[derive(Clone, Default)]
pub struct UnansweredInserts(Arc<Mutex<Vec<UnansweredInsert>>>);

impl std::fmt::Debug for UnansweredInserts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The images are URLs, and a seed's carries a token: only the count is shown.
        let count = self.0.lock().map(|u| u.len()).unwrap_or_default();
        f.debug_struct("UnansweredInserts").field("count", &count).finish()
    }
}

/// One unanswered insert.
struct UnansweredInsert {
    device_path: String,
    image: String,
    /// When its answer failed to come.
    since: Instant,
}

impl UnansweredInserts {
    /// When the answer to an insert of `image` into the device at `device_path` failed to come.
    fn since(&self, device_path: &str, image: &str) -> Option<Instant> {
        let known = self.0.lock().ok()?;
        known.iter().find(|u| u.device_path == device_path && u.image == image).map(|u| u.since)
    }

    /// Records an unanswered insert (replacing any earlier one into the same device).
    fn record(&self, device_path: &str, image: &str, since: Instant) {
        if let Ok(mut known) = self.0.lock() {
            known.retain(|u| u.device_path != device_path);
            known.push(UnansweredInsert { device_path: device_path.to_owned(), image: image.to_owned(), since });
        }
    }

    /// Forgets what is known of the device at `device_path`: its insert landed, or is taken as lost.
    fn forget(&self, device_path: &str) {
        if let Ok(mut known) = self.0.lock() {
            known.retain(|u| u.device_path != device_path);
        }
    }
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
            insert_timeout: config.insert_timeout,
            unanswered: UnansweredInserts::default(),
        })
    }

    /// Shares the record of unanswered inserts with the other clients of the same machine.
    pub fn with_unanswered_inserts(mut self, unanswered: UnansweredInserts) -> Self {
        self.unanswered = unanswered;
        self
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

    /// Polls a task monitor (e.g. one named by a `TaskTimeout` error) until the task ends.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), task.uri = task_uri))]
    pub async fn wait_task(&self, task_uri: &str) -> Result<(), RedfishError> {
        let _slot = self.operation().await;
        self.transport.wait_task(task_uri).await
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
