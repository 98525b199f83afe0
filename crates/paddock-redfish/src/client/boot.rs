//! Boot overrides, and the composite boots from virtual media and back to the disk.

use paddock_domain::bmc::{AfterBoot, PowerProgress};
use paddock_domain::secret::SecretString;
use reqwest::Method;
use serde_json::json;
use tracing::{info, instrument};
use url::Url;

use crate::error::RedfishError;
use crate::model::{BootTarget, ChangeOutcome, PowerState, SystemUuid};
use crate::redact::Redactor;

use super::{gap, PendingPower, RedfishClient, SystemRead};

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
        self.eject_all_but_landed(&system.res, Some((&cd, image.as_str()))).await?;
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
        self.eject_all_but_landed(&system.res, Some((&cd, image.as_str()))).await?;
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SystemRes;

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
}
