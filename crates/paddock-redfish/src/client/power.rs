//! Power: convergence to a power state, with and without waiting, and restarts.

use std::time::Instant;

use paddock_domain::bmc::{BmcHealth, PowerProgress};
use reqwest::Method;
use serde_json::json;
use tracing::{debug, info, instrument, warn};

use crate::error::RedfishError;
use crate::model::{ActionRes, PowerOutcome, PowerState, ReportedPowerState, RestartOutcome, SystemUuid};

use super::{gap, missing, PendingPower, RedfishClient, SystemRead};

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

/// What one round of a power wait read.
enum PowerReading {
    /// The target state, settled.
    Reached,
    /// Anything else (or nothing: a BMC that did not say).
    Not(Option<ReportedPowerState>),
}

impl RedfishClient {
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

    /// Reads the system's settled power state (`None` while it is changing or unreported) and
    /// its health rating with one read of the system resource, after checking that it reports
    /// `expected`. Read-only; the power sync's periodic check, so it skips the storage inventory
    /// [`Self::system`] reads.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected))]
    pub async fn status(&self, expected: &SystemUuid) -> Result<(Option<PowerState>, Option<BmcHealth>), RedfishError> {
        let _slot = self.operation().await;
        let system = self.guarded_system(expected).await?;
        Ok((system.res.power_state().and_then(|p| p.settled()), system.res.health()))
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

    /// The answer of a call that left a power change under way: look again after a poll interval.
    pub(super) fn pending_progress(&self) -> PowerProgress {
        PowerProgress::Pending(self.power.poll_interval)
    }

    /// The power convergence of [`power`](Self::power), on a system already read and checked.
    pub(super) async fn converge_power(
        &self,
        system: SystemRead,
        target: PowerState,
    ) -> Result<PowerOutcome, RedfishError> {
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

    /// One look at a power change, without waiting: `true` when `system` reads
    /// `target` (whatever was pending is then over). Otherwise asks for it unless `pending`
    /// already has it asked (or the system is on its way there), sends it once more when it
    /// looks lost ([`PowerPolicy::reissue_after`]), and past [`PowerPolicy::timeout`] fails with
    /// a transient `PowerTimeout` and starts a new window (the next calls ask again).
    pub(super) async fn power_step(
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
    pub(super) async fn restart_system(
        &self,
        system: SystemRead,
        expected: &SystemUuid,
    ) -> Result<RestartOutcome, RedfishError> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
