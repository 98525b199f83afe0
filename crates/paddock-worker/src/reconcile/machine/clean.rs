//! Cleaning: the wipe, from its boot to the verified report and the out-of-band erase.

use chrono::{DateTime, Utc};
use futures::FutureExt;
use paddock_domain::bmc::{AfterBoot, BmcAccess, BmcDriver, PowerProgress};
use paddock_domain::model::Machine;
use paddock_store::lifecycle;
use paddock_store::run::{self, Run, RunPurpose, RunReport};
use paddock_types::agent::{AgentRunConfig, WipeConfig, WipeDrive};
use paddock_types::machine::MachineState;
use serde_json::json;

use crate::metrics::{self, Driver};
use crate::Outcome;

use super::{ttl, MachineReconciler, Step, POWERING};

impl MachineReconciler {
    /// A run's report is in: powers the machine off and ejects its media, then marks the run
    /// finished; `None` once it is (the caller goes on to its verdict). `reported` says why the
    /// machine is powering off while it waits.
    pub(super) async fn end_boot(
        &self,
        bmc: &dyn BmcDriver,
        m: &Machine,
        access: &BmcAccess,
        run: &Run,
        reported: &'static str,
    ) -> Option<Step> {
        if run.run_finished_at.is_some() {
            return None;
        }
        match bmc.start_finish_boot(access, AfterBoot::PowerOff).await {
            Ok(PowerProgress::Done) => {}
            Ok(PowerProgress::Pending(after)) => return Some(Step::Stop(Outcome::wait(after, POWERING, reported))),
            Err(e) => return Some(self.bmc_failed(m, e).await),
        }
        let (state, version) = (m.state, m.status_version);
        Some(self.guarded(m.id, |c, _| run::mark_finished(c, m.id, state, version).boxed()).await)
    }

    /// The wipe (docs/architecture.md): a run, a boot from the wipe image with the run's seed, the
    /// agent's report, power off and eject, then `available` with the clean recorded, or
    /// `clean_failed`. Nothing becomes available without every listed drive wiped.
    pub(super) async fn clean(&self, bmc: &dyn BmcDriver, m: &Machine, run: Option<Run>) -> Step {
        let run = match run {
            // The wipe is verified and recorded; the acceptance image's run follows it.
            Some(run) if run.run_purpose == RunPurpose::Acceptance.as_str() => return self.accept(bmc, m, run).await,
            Some(run) if run.run_purpose == RunPurpose::Wipe.as_str() => run,
            _ => {
                let (state, version) = (m.state, m.status_version);
                return self
                    .guarded(m.id, |c, k| {
                        run::start_run(c, k, m.id, state, version, MachineState::Cleaning, RunPurpose::Wipe).boxed()
                    })
                    .await;
            }
        };
        let access = match self.access(m) {
            Ok(a) => a,
            Err(step) => return step,
        };
        let Some(booted_at) = run.run_booted_at else {
            return self.boot_wipe(bmc, m, &access, &run).await;
        };
        match &run.report {
            None => self.await_wipe_report(bmc, m, &access, booted_at).await,
            Some(report) if !report.verified => {
                // Quarantined: it leaves only through maintenance or retirement. Power it off
                // on the way (best effort: it never serves anyone in this state).
                power_off_best_effort(bmc, &access).await;
                let why = report.failure.as_deref().unwrap_or("the report does not prove every drive wiped");
                let message = format!("the wipe is not verified: {why}");
                self.end_run(m, MachineState::CleanFailed, Some(("wipe_failed", &message)), None).await
            }
            Some(report) => self.finish_wipe(bmc, m, &access, &run, report).await,
        }
    }

    /// The wipe's boot: from the wipe image, with a seed listing the drives the inventory knows.
    /// No drives, nothing to verify: `clean_failed`.
    async fn boot_wipe(&self, bmc: &dyn BmcDriver, m: &Machine, access: &BmcAccess, run: &Run) -> Step {
        let drives = wipe_drives(&m.inventory);
        if drives.is_empty() {
            let message = "the BMC reports no drives, so no wipe can be verified; fix the inventory and take the \
                           machine through maintenance";
            return self.end_run(m, MachineState::CleanFailed, Some(("no_drive_inventory", message)), None).await;
        }
        let Some(image) = self.settings.wipe_image_url.clone() else {
            let message = "no wipe image is configured (PADDOCK_WIPE_IMAGE_URL); the machine waits in cleaning";
            return self.wait_for_fix(m, "wipe_image_not_configured", message).await;
        };
        let config = AgentRunConfig::Wipe(WipeConfig { drives });
        self.boot(bmc, m, access, run, config, image, self.settings.agent_token_ttl).await
    }

    /// Booted, no report yet: waits for the boot's power-on, then for the agent until its token
    /// expires (then `clean_failed`, powered off).
    async fn await_wipe_report(
        &self,
        bmc: &dyn BmcDriver,
        m: &Machine,
        access: &BmcAccess,
        booted_at: DateTime<Utc>,
    ) -> Step {
        // The boot's power-on first: the BMC carries it out while the job holds no slot;
        // a request that looks lost is sent again.
        match bmc.power_progress(access).await {
            Ok(PowerProgress::Done) => {}
            Ok(PowerProgress::Pending(after)) => {
                return Step::Stop(Outcome::wait(after, POWERING, "the machine is powering on for its wipe"))
            }
            Err(e) => return self.bmc_failed(m, e).await,
        }
        let deadline = booted_at + ttl(self.settings.agent_token_ttl);
        if Utc::now() >= deadline {
            // Quarantined, powered off and ejected (best effort: the seed's token is
            // expired anyway, and the machine never serves anyone in this state).
            power_off_best_effort(bmc, access).await;
            let message = "the wipe agent did not report before its token expired";
            return self.end_run(m, MachineState::CleanFailed, Some(("wipe_timed_out", message)), None).await;
        }
        let left = (deadline - Utc::now()).to_std().unwrap_or_default();
        Step::Stop(Outcome::wait(
            left.min(self.settings.report_wait),
            "waiting_for_agent",
            "the machine is wiping; waiting for its agent's report",
        ))
    }

    /// A verified wipe: power off and eject (the run marked finished), then `available` with the
    /// clean and its evidence recorded.
    async fn finish_wipe(
        &self,
        bmc: &dyn BmcDriver,
        m: &Machine,
        access: &BmcAccess,
        run: &Run,
        report: &RunReport,
    ) -> Step {
        let reported = "the wipe is verified; the machine is powering off";
        if let Some(step) = self.end_boot(bmc, m, access, run, reported).await {
            return step;
        }
        let (id, version, run_id) = (m.id, m.status_version, run.run_id);
        let out_of_band = erase_out_of_band(bmc, access).await;
        // The evidence per drive and the digest of the image that wiped them, as verified,
        // and what the BMC's own erase came to.
        let evidence = json!({
            "run_id": run_id,
            "image_sha256": report.report["image_sha256"],
            "drives": report.report["drives"],
            "out_of_band_erase": out_of_band,
            "report": report.report,
            "reported_at": report.used_at,
        });
        let acceptance = match self.acceptance_after_wipe(m).await {
            Ok(a) => a,
            Err(e) => return e.into(),
        };
        if let Some(acceptance) = acceptance {
            // Not yet available: the clean is recorded and the acceptance run takes the wipe's
            // place, in one guarded write.
            return self
                .guarded_then(
                    m.id,
                    move |c, k| {
                        async move {
                            paddock_store::acceptance::start_after_wipe(
                                c,
                                k,
                                id,
                                version,
                                run_id,
                                &evidence,
                                &acceptance,
                            )
                            .await
                        }
                        .boxed()
                    },
                    |in_cleaning| {
                        if let Some(took) = in_cleaning {
                            metrics::observe(|w| w.wipe_completed(&m.machine_class, took));
                        }
                    },
                )
                .await;
        }
        self.guarded_then(
            m.id,
            move |c, k| {
                async move { lifecycle::complete_clean(c, k, id, version, run_id, "agent", &evidence).await }.boxed()
            },
            |in_cleaning| {
                if let Some(took) = in_cleaning {
                    metrics::observe(|w| w.wipe_completed(&m.machine_class, took));
                }
            },
        )
        .await
    }
}

/// The BMC's out-of-band erase (docs/security.md), after the in-band wipe was verified and in
/// addition to it: `{erases: [...]}` (empty where the BMC advertises none), or `{error}` when the
/// BMC could not be asked; never a reason to hold the machine, whose wipe is already proven.
async fn erase_out_of_band(bmc: &dyn BmcDriver, access: &BmcAccess) -> serde_json::Value {
    match bmc.erase_out_of_band(access).await {
        Ok(erases) => json!({ "erases": erases }),
        Err(e) => {
            metrics::driver_failed(Driver::Bmc, &e.code);
            tracing::warn!(machine.id = %access.machine_id, error = %e, "the BMC's out-of-band erase failed");
            json!({ "error": { "code": e.code, "message": e.message } })
        }
    }
}

/// Powers a quarantined machine off and ejects its media, best effort: it never serves anyone
/// in `clean_failed`, so a failure is only counted.
pub(super) async fn power_off_best_effort(bmc: &dyn BmcDriver, access: &BmcAccess) {
    if let Err(e) = bmc.finish_boot(access, AfterBoot::PowerOff).await {
        metrics::driver_failed(Driver::Bmc, &e.code);
    }
}

/// The drives a wipe lists: every drive of the inventory with what the BMC reported of it.
pub(super) fn wipe_drives(inventory: &serde_json::Value) -> Vec<WipeDrive> {
    let Some(drives) = inventory["drives"].as_array() else { return Vec::new() };
    drives
        .iter()
        .filter_map(|d| {
            Some(WipeDrive {
                id: d["id"].as_str()?.to_owned(),
                serial: d["serial"].as_str().map(str::to_owned),
                capacity_bytes: d["capacity_bytes"].as_u64(),
                protocol: d["protocol"].as_str().map(str::to_ascii_lowercase),
            })
        })
        .collect()
}
