//! Storage: the drives of the inventory, and the BMC's out-of-band erase.

use paddock_domain::bmc::{EraseResult, EraseScope, OutOfBandErase};
use reqwest::Method;
use serde_json::{json, Value};
use tracing::{debug, info, instrument, warn};

use crate::error::RedfishError;
use crate::model::{ActionRes, Collection, DriveInventory, DriveRes, Link, StorageRes, SystemRes, SystemUuid};

use super::{last_segment, RedfishClient};

/// A storage subsystem as read: its `Id`, its erase action if advertised, its drives (each with
/// its `#Drive.SecureErase` action if advertised).
pub(super) struct StorageRead {
    id: String,
    reset_to_defaults: Option<ActionRes>,
    drives: Vec<(DriveInventory, Option<ActionRes>)>,
}

/// The `SanitizationType`s paddock asks a drive's secure erase for, strongest first (the wipe
/// agent's order): the first one the action allows is sent.
const SANITIZATION_TYPES: [&str; 2] = ["CryptographicErase", "BlockErase"];

impl RedfishClient {
    /// Out-of-band erase (docs/security.md): calls every erase the BMC advertises, narrowest first
    /// and one after the other (a task monitor is followed to its end, and the Task read when the
    /// monitor's last answer does not say how it ended): `#Drive.SecureErase` on each drive (with
    /// the strongest `SanitizationType` its advertised values allow, none when it advertises none
    /// or neither of them), `#Storage.ResetToDefaults` (`ResetAll`) on each storage subsystem, then
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
        for (drive, action) in storages.iter().flat_map(|s| &s.drives) {
            let Some((action, target)) = action.as_ref().and_then(|a| Some((a, a.target.as_deref()?))) else {
                continue;
            };
            let allowed = self.allowed_values(action, "SanitizationType").await?.unwrap_or_default();
            let body = match SANITIZATION_TYPES.iter().find(|t| allowed.iter().any(|a| a == *t)) {
                Some(kind) => json!({ "SanitizationType": kind }),
                None => json!({}),
            };
            erased.push(self.erase(EraseScope::Drive, &drive.id, target, "Drive.SecureErase", body).await);
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

    /// Drives under `Storage`; `None` when the BMC has no readable storage inventory.
    pub(super) async fn drives(&self, system: &SystemRes) -> Result<Option<Vec<DriveInventory>>, RedfishError> {
        let storages = self.storages(system).await?;
        Ok(storages.map(|s| s.into_iter().flat_map(|s| s.drives).map(|(drive, _)| drive).collect()))
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

    /// The drives `links` name, of the storage subsystem `storage_id`, with their secure erase.
    async fn storage_drives(
        &self,
        storage_id: &str,
        links: &[Link],
    ) -> Result<Vec<(DriveInventory, Option<ActionRes>)>, RedfishError> {
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
            let secure_erase = drive.actions.and_then(|a| a.secure_erase);
            let inventory = DriveInventory {
                id: drive.id.unwrap_or_else(|| last_segment(&link.id).to_owned()),
                storage_id: storage_id.to_owned(),
                name: drive.name,
                capacity_bytes: drive.capacity_bytes,
                model: drive.model,
                media_type: drive.media_type,
                protocol: drive.protocol,
                serial_number: drive.serial_number,
                secure_erase: secure_erase.as_ref().and_then(|a| a.target.clone()),
            };
            drives.push((inventory, secure_erase));
        }
        Ok(drives)
    }
}
