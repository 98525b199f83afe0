//! What the client hands out (inventory, power states, boot targets, virtual media devices) and
//! the private serde shapes of the Redfish resources it reads.
//!
//! Inventory is read leniently: a property that is absent, `null`, empty or of an unexpected type
//! becomes `None`, which the caller treats as "unverified", never as a mismatch.

use std::fmt;

use paddock_domain::bmc::BmcHealth;
use paddock_types::health::HealthStatus;
use serde::{Deserialize, Deserializer};

/// A system UUID as reported by a BMC, normalised (trimmed, lowercase) so that comparisons are
/// case-insensitive: BMCs differ in how they print the same UUID.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SystemUuid(String);

impl SystemUuid {
    /// Normalises a UUID string.
    pub fn new(value: &str) -> Self {
        Self(value.trim().to_ascii_lowercase())
    }

    /// The normalised form.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SystemUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A power state to converge to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PowerState {
    /// Powered on.
    On,
    /// Powered off (reached with `ForceOff`: a wipe or provisioning run never waits for an OS).
    Off,
}

impl PowerState {
    /// The Redfish `PowerState` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::On => "On",
            Self::Off => "Off",
        }
    }

    /// `Reset` types that reach this state, in order of preference: the immediate ones first,
    /// then what a BMC without them offers (`GracefulShutdown`, the power button, which toggles
    /// and so is only sent from the opposite settled state).
    pub(crate) fn reset_types(self) -> &'static [&'static str] {
        match self {
            Self::On => &["On", "ForceOn", "PushPowerButton"],
            Self::Off => &["ForceOff", "GracefulShutdown", "PushPowerButton"],
        }
    }
}

impl fmt::Display for PowerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `PowerState` as a BMC reports it, transitions included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportedPowerState {
    /// `On`.
    On,
    /// `Off`.
    Off,
    /// `PoweringOn`.
    PoweringOn,
    /// `PoweringOff`.
    PoweringOff,
    /// `Paused`.
    Paused,
    /// Anything else, verbatim.
    Other(String),
}

impl ReportedPowerState {
    /// Parses a Redfish `PowerState` value.
    pub fn parse(value: &str) -> Self {
        match value {
            "On" => Self::On,
            "Off" => Self::Off,
            "PoweringOn" => Self::PoweringOn,
            "PoweringOff" => Self::PoweringOff,
            "Paused" => Self::Paused,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The settled state, if the system is in one.
    pub fn settled(&self) -> Option<PowerState> {
        match self {
            Self::On => Some(PowerState::On),
            Self::Off => Some(PowerState::Off),
            _ => None,
        }
    }

    /// The Redfish value.
    pub fn as_str(&self) -> &str {
        match self {
            Self::On => "On",
            Self::Off => "Off",
            Self::PoweringOn => "PoweringOn",
            Self::PoweringOff => "PoweringOff",
            Self::Paused => "Paused",
            Self::Other(s) => s,
        }
    }
}

/// A one-time boot source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BootTarget {
    /// Virtual or physical CD/DVD (the wipe image and the OS installer).
    Cd,
    /// The local disk.
    Hdd,
    /// Network boot.
    Pxe,
}

impl BootTarget {
    /// The Redfish `BootSourceOverrideTarget` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cd => "Cd",
            Self::Hdd => "Hdd",
            Self::Pxe => "Pxe",
        }
    }
}

impl fmt::Display for BootTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The boot override as reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootOverride {
    /// `BootSourceOverrideTarget`.
    pub target: Option<String>,
    /// `BootSourceOverrideEnabled` (`Disabled`, `Once`, `Continuous`).
    pub enabled: Option<String>,
}

/// What a BMC reports about its system. Every field it does not report is `None` (unverified).
#[derive(Debug, Clone, PartialEq)]
pub struct SystemInventory {
    /// The system's `Id`.
    pub id: String,
    /// `UUID`.
    pub uuid: Option<SystemUuid>,
    /// `Name`.
    pub name: Option<String>,
    /// `SerialNumber`.
    pub serial_number: Option<String>,
    /// `Model`.
    pub model: Option<String>,
    /// `Manufacturer`.
    pub manufacturer: Option<String>,
    /// `PowerState`.
    pub power_state: Option<ReportedPowerState>,
    /// `ProcessorSummary.Count`.
    pub processor_count: Option<u32>,
    /// `ProcessorSummary.Model`.
    pub processor_model: Option<String>,
    /// `MemorySummary.TotalSystemMemoryGiB`.
    pub memory_gib: Option<f64>,
    /// Drives under `Storage`; `None` when the BMC has no readable storage inventory,
    /// `Some(vec![])` when it reports storage without drives.
    pub drives: Option<Vec<DriveInventory>>,
    /// The boot override, when reported.
    pub boot: Option<BootOverride>,
}

/// One drive as reported under `Storage/{id}/Drives`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriveInventory {
    /// The drive's `Id`.
    pub id: String,
    /// The storage subsystem's `Id` it sits under.
    pub storage_id: String,
    /// `Name`.
    pub name: Option<String>,
    /// `CapacityBytes`.
    pub capacity_bytes: Option<u64>,
    /// `Model`.
    pub model: Option<String>,
    /// `MediaType` (`HDD`, `SSD`, `SMR`).
    pub media_type: Option<String>,
    /// `Protocol` (`NVMe`, `SATA`, `SAS`, ...).
    pub protocol: Option<String>,
    /// `SerialNumber`.
    pub serial_number: Option<String>,
    /// The target of `#Drive.SecureErase`, when the drive advertises it (out-of-band erase).
    pub secure_erase: Option<String>,
}

/// A virtual media device (`Cd`, `Floppy`, `USB1`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualMediaDevice {
    /// The device's `Id`, as `insert_media`/`eject_media` take it.
    pub id: String,
    /// `Name`.
    pub name: Option<String>,
    /// `MediaTypes` (`CD`, `DVD`, `USBStick`, `Floppy`, ...).
    pub media_types: Vec<String>,
    /// `Inserted`.
    pub inserted: Option<bool>,
    /// `Image` (empty is `None`).
    pub image: Option<String>,
}

impl VirtualMediaDevice {
    /// Whether the device takes CD/DVD images.
    pub fn supports_cd(&self) -> bool {
        media_class(&self.media_types) == MediaClass::Cd
    }
}

/// What a virtual media device takes, from its `MediaTypes`, best seed carrier first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum MediaClass {
    /// `CD` or `DVD`: takes the ISO images paddock boots.
    Cd,
    /// `USBStick` or `RemovableDisk`: a block device, fine for the seed (an ISO 9660 `cidata`
    /// volume is found by its label on any block device).
    Removable,
    /// `Floppy` only: the last resort for the seed.
    Floppy,
    /// No `MediaTypes` reported: assumed to take an image, ranked last.
    Unknown,
    /// Reported types that take no image paddock has.
    Unsuitable,
}

/// The class of a device's `MediaTypes`.
pub(crate) fn media_class(types: &[String]) -> MediaClass {
    let has = |names: &[&str]| types.iter().any(|t| names.iter().any(|n| t.eq_ignore_ascii_case(n)));
    if types.is_empty() {
        MediaClass::Unknown
    } else if has(&["CD", "DVD"]) {
        MediaClass::Cd
    } else if has(&["USBStick", "RemovableDisk"]) {
        MediaClass::Removable
    } else if has(&["Floppy"]) {
        MediaClass::Floppy
    } else {
        MediaClass::Unsuitable
    }
}

/// What the system does after `restart`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartOutcome {
    /// The system was off: it was powered on.
    PoweredOn,
    /// A `Reset` restart (`ForceRestart`, `GracefulRestart` or `PowerCycle`) was sent and the
    /// system reads `On` again.
    Restarted,
    /// The BMC offers no restart: the system was powered off and on.
    OffAndOn,
}

/// How `power` converged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerOutcome {
    /// The system was already in the wanted state: no `Reset` was sent.
    AlreadyThere,
    /// A `Reset` was sent and the wanted state was read back.
    Changed {
        /// The first request was taken as lost and sent a second time.
        reissued: bool,
        /// Reads of `PowerState` after the first `Reset`.
        polls: u32,
    },
}

/// How an idempotent change (boot override, media) went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeOutcome {
    /// The BMC already showed the wanted state: nothing was sent.
    AlreadyDone,
    /// The change was sent and read back.
    Applied,
}

/// The service root, as far as paddock cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRoot {
    /// `RedfishVersion`.
    pub redfish_version: Option<String>,
    /// `UUID` of the service (not of a system).
    pub uuid: Option<String>,
    /// `Vendor`.
    pub vendor: Option<String>,
    /// `Product`.
    pub product: Option<String>,
}

// ------------------------------------------------------------------ wire shapes (private)

/// `None` for absent, `null`, empty-string or ill-typed values.
fn lenient<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let value = serde_json::Value::deserialize(deserializer)?;
    if value.as_str().is_some_and(|s| s.trim().is_empty()) {
        return Ok(None);
    }
    Ok(serde_json::from_value(value).ok())
}

/// Like `lenient`, for lists: anything but a list of `T` is empty.
fn lenient_vec<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    Ok(lenient::<D, Vec<T>>(deserializer)?.unwrap_or_default())
}

/// `{"@odata.id": "..."}`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Link {
    #[serde(rename = "@odata.id")]
    pub id: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ServiceRootRes {
    #[serde(default, deserialize_with = "lenient")]
    pub redfish_version: Option<String>,
    #[serde(default, rename = "UUID", deserialize_with = "lenient")]
    pub uuid: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub vendor: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub product: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub systems: Option<Link>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct Collection {
    #[serde(default, deserialize_with = "lenient_vec")]
    pub members: Vec<Link>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ProcessorSummaryRes {
    #[serde(default, deserialize_with = "lenient")]
    pub count: Option<u32>,
    #[serde(default, deserialize_with = "lenient")]
    pub model: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct MemorySummaryRes {
    #[serde(default, rename = "TotalSystemMemoryGiB", deserialize_with = "lenient")]
    pub total_gib: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct SystemLinksRes {
    #[serde(default, deserialize_with = "lenient_vec")]
    pub managed_by: Vec<Link>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct BootRes {
    #[serde(default, rename = "BootSourceOverrideTarget", deserialize_with = "lenient")]
    pub target: Option<String>,
    #[serde(default, rename = "BootSourceOverrideEnabled", deserialize_with = "lenient")]
    pub enabled: Option<String>,
    #[serde(default, rename = "BootSourceOverrideTarget@Redfish.AllowableValues", deserialize_with = "lenient")]
    pub target_allowable: Option<Vec<String>>,
    #[serde(default, rename = "BootSourceOverrideEnabled@Redfish.AllowableValues", deserialize_with = "lenient")]
    pub enabled_allowable: Option<Vec<String>>,
}

/// An action: its target, and the allowed values when advertised inline or through ActionInfo.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ActionRes {
    #[serde(default, deserialize_with = "lenient")]
    pub target: Option<String>,
    #[serde(default, rename = "ResetType@Redfish.AllowableValues", deserialize_with = "lenient")]
    pub reset_type_allowable: Option<Vec<String>>,
    #[serde(default, rename = "DecommissionTypes@Redfish.AllowableValues", deserialize_with = "lenient")]
    pub decommission_types_allowable: Option<Vec<String>>,
    #[serde(default, rename = "SanitizationType@Redfish.AllowableValues", deserialize_with = "lenient")]
    pub sanitization_type_allowable: Option<Vec<String>>,
    #[serde(default, rename = "@Redfish.ActionInfo", deserialize_with = "lenient")]
    pub action_info: Option<String>,
}

impl ActionRes {
    /// The values advertised inline for the parameter `name`, if this model knows it.
    pub(crate) fn inline_allowable(&self, name: &str) -> Option<&Vec<String>> {
        match name {
            "ResetType" => self.reset_type_allowable.as_ref(),
            "DecommissionTypes" => self.decommission_types_allowable.as_ref(),
            "SanitizationType" => self.sanitization_type_allowable.as_ref(),
            _ => None,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct SystemActionsRes {
    #[serde(default, rename = "#ComputerSystem.Reset", deserialize_with = "lenient")]
    pub reset: Option<ActionRes>,
    #[serde(default, rename = "#ComputerSystem.Decommission", deserialize_with = "lenient")]
    pub decommission: Option<ActionRes>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct SystemRes {
    #[serde(default, deserialize_with = "lenient")]
    pub id: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub name: Option<String>,
    #[serde(default, rename = "UUID", deserialize_with = "lenient")]
    pub uuid: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub serial_number: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub model: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub manufacturer: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub power_state: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub processor_summary: Option<ProcessorSummaryRes>,
    #[serde(default, deserialize_with = "lenient")]
    pub memory_summary: Option<MemorySummaryRes>,
    #[serde(default, deserialize_with = "lenient")]
    pub storage: Option<Link>,
    #[serde(default, deserialize_with = "lenient")]
    pub virtual_media: Option<Link>,
    #[serde(default, deserialize_with = "lenient")]
    pub links: Option<SystemLinksRes>,
    #[serde(default, deserialize_with = "lenient")]
    pub boot: Option<BootRes>,
    #[serde(default, deserialize_with = "lenient")]
    pub actions: Option<SystemActionsRes>,
    #[serde(default, deserialize_with = "lenient")]
    pub status: Option<StatusRes>,
}

impl SystemRes {
    pub(crate) fn power_state(&self) -> Option<ReportedPowerState> {
        self.power_state.as_deref().map(ReportedPowerState::parse)
    }

    /// The BMC's rating of the system: `Status.HealthRollup` (which covers its subsystems: GPUs,
    /// drives, fans) when given, else `Status.Health`; `None` when neither is one of Redfish's
    /// `OK`, `Warning`, `Critical`.
    pub(crate) fn health(&self) -> Option<BmcHealth> {
        let status = self.status.as_ref()?;
        let (field, value) = match (&status.health_rollup, &status.health) {
            (Some(rollup), _) => ("Status.HealthRollup", rollup),
            (None, Some(health)) => ("Status.Health", health),
            (None, None) => return None,
        };
        let rated = match value.as_str() {
            "OK" => HealthStatus::Healthy,
            "Warning" => HealthStatus::Degraded,
            "Critical" => HealthStatus::Failed,
            _ => return None,
        };
        Some(BmcHealth { status: rated, detail: format!("{field}: {value}") })
    }
}

/// A resource's `Status`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct StatusRes {
    #[serde(default, deserialize_with = "lenient")]
    pub health: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub health_rollup: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ManagerRes {
    #[serde(default, deserialize_with = "lenient")]
    pub virtual_media: Option<Link>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct StorageRes {
    #[serde(default, deserialize_with = "lenient")]
    pub id: Option<String>,
    #[serde(default, deserialize_with = "lenient_vec")]
    pub drives: Vec<Link>,
    #[serde(default, deserialize_with = "lenient")]
    pub actions: Option<StorageActionsRes>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct StorageActionsRes {
    #[serde(default, rename = "#Storage.ResetToDefaults", deserialize_with = "lenient")]
    pub reset_to_defaults: Option<ActionRes>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct DriveRes {
    #[serde(default, deserialize_with = "lenient")]
    pub id: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub capacity_bytes: Option<u64>,
    #[serde(default, deserialize_with = "lenient")]
    pub model: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub media_type: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub protocol: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub serial_number: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub actions: Option<DriveActionsRes>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct DriveActionsRes {
    #[serde(default, rename = "#Drive.SecureErase", deserialize_with = "lenient")]
    pub secure_erase: Option<ActionRes>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct VirtualMediaActionsRes {
    #[serde(default, rename = "#VirtualMedia.InsertMedia", deserialize_with = "lenient")]
    pub insert: Option<ActionRes>,
    #[serde(default, rename = "#VirtualMedia.EjectMedia", deserialize_with = "lenient")]
    pub eject: Option<ActionRes>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct VirtualMediaRes {
    #[serde(default, deserialize_with = "lenient")]
    pub id: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "lenient_vec")]
    pub media_types: Vec<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub image: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub inserted: Option<bool>,
    #[serde(default, deserialize_with = "lenient")]
    pub actions: Option<VirtualMediaActionsRes>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ActionInfoParameter {
    #[serde(default, deserialize_with = "lenient")]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub allowable_values: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ActionInfoRes {
    #[serde(default, deserialize_with = "lenient_vec")]
    pub parameters: Vec<ActionInfoParameter>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct MessageRes {
    #[serde(default, deserialize_with = "lenient")]
    pub message: Option<String>,
}

/// A Task resource, as a task monitor may answer (and as a `202 Accepted` may carry).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct TaskRes {
    #[serde(default, rename = "@odata.id", deserialize_with = "lenient")]
    pub odata_id: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub task_state: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub task_status: Option<String>,
    #[serde(default, deserialize_with = "lenient_vec")]
    pub messages: Vec<MessageRes>,
}

/// `{"error": {"message": ..., "@Message.ExtendedInfo": [{"Message": ...}]}}`.
#[derive(Debug, Deserialize)]
pub(crate) struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ErrorDetail {
    #[serde(default, deserialize_with = "lenient")]
    pub message: Option<String>,
    #[serde(default, rename = "@Message.ExtendedInfo", deserialize_with = "lenient_vec")]
    pub extended: Vec<MessageRes>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_compare_case_insensitively() {
        assert_eq!(
            SystemUuid::new(" 9871F117-ECB9-5856-8D64-7C41ECB62561"),
            SystemUuid::new("9871f117-ecb9-5856-8d64-7c41ecb62561")
        );
    }

    #[test]
    fn odd_inventory_values_become_unverified() {
        let sys: SystemRes = serde_json::from_value(serde_json::json!({
            "Id": "1",
            "SerialNumber": "",
            "Model": null,
            "ProcessorSummary": {"Count": "two", "Model": "EPYC"},
            "MemorySummary": {"TotalSystemMemoryGiB": 1536.0},
            "Links": {"ManagedBy": "not a list"}
        }))
        .expect("lenient decode");
        assert_eq!(sys.serial_number, None);
        assert_eq!(sys.model, None);
        let cpu = sys.processor_summary.expect("summary");
        assert_eq!((cpu.count, cpu.model.as_deref()), (None, Some("EPYC")));
        assert_eq!(sys.memory_summary.and_then(|m| m.total_gib), Some(1536.0));
        assert!(sys.links.expect("links").managed_by.is_empty());
    }

    /// The `Status` of ComputerSystem payloads as BMCs send them (DMTF's mockups: a rollup that
    /// covers a failed GPU, a BMC that gives only `Health`, one that gives neither, an odd value).
    #[test]
    fn the_health_rating_prefers_the_rollup_and_ignores_what_redfish_does_not_define() {
        let rate = |status: serde_json::Value| {
            let sys: SystemRes =
                serde_json::from_value(serde_json::json!({ "Id": "1", "Status": status })).expect("lenient decode");
            sys.health().map(|h| (h.status, h.detail))
        };
        let rated = |status: HealthStatus, detail: &str| Some((status, detail.to_owned()));
        let critical = serde_json::json!({"State": "Enabled", "Health": "OK", "HealthRollup": "Critical"});
        assert_eq!(rate(critical), rated(HealthStatus::Failed, "Status.HealthRollup: Critical"));
        let warning = serde_json::json!({"State": "Enabled", "Health": "Warning"});
        assert_eq!(rate(warning), rated(HealthStatus::Degraded, "Status.Health: Warning"));
        let ok = serde_json::json!({"State": "Enabled", "Health": "OK", "HealthRollup": "OK"});
        assert_eq!(rate(ok), rated(HealthStatus::Healthy, "Status.HealthRollup: OK"));
        assert_eq!(rate(serde_json::json!({"State": "Enabled"})), None);
        assert_eq!(rate(serde_json::json!({"Health": "Meh"})), None);
        assert_eq!(rate(serde_json::json!("not an object")), None);
    }
}
