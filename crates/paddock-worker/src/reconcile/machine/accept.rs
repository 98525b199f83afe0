//! Acceptance (docs/acceptance.md): after the verified wipe of a machine's enrollment or of its
//! return from maintenance, a machine whose class names an acceptance image boots it, in a run of
//! its own (its own tokens and seed, exactly like the wipe's), and its report decides: passed,
//! `available`; failed or silent past the class's timeout, `maintenance` with the reason and a
//! `failed` health report (source `acceptance`). The machine stays in `cleaning` until then, so
//! nothing allocates it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::FutureExt;
use paddock_domain::bmc::{BmcAccess, BmcDriver, PowerProgress};
use paddock_domain::model::{Machine, MachineClass};
use paddock_store::acceptance::{self, Failure};
use paddock_store::run::{Run, RunReport};
use paddock_store::{machine_class, StoreError};
use paddock_types::agent::{AcceptanceConfig, AgentRunConfig};
use paddock_types::health::HealthCheck;
use paddock_types::machine_class::MachineClassAcceptance;
use serde_json::json;

use super::clean::{power_off_best_effort, wipe_drives};
use super::{ttl, MachineReconciler, Step, POWERING};
use crate::Outcome;

/// The `last_error.code` of a machine whose acceptance image reported a failure (or a report
/// that proves nothing: another image, no checks).
pub const ACCEPTANCE_FAILED: &str = "acceptance_failed";
/// The `last_error.code` of a machine whose acceptance image did not report within the class's
/// `timeout_seconds`.
pub const ACCEPTANCE_TIMED_OUT: &str = "acceptance_timed_out";

/// Whether `m` is in maintenance because its acceptance failed (or timed out).
pub(super) fn failed(m: &Machine) -> bool {
    m.state == paddock_types::machine::MachineState::Maintenance
        && m.last_error.as_ref().is_some_and(|e| matches!(e.code.as_str(), ACCEPTANCE_FAILED | ACCEPTANCE_TIMED_OUT))
}

impl MachineReconciler {
    /// The class of `m`, and the acceptance image it names (`None`: the class names none).
    pub(super) async fn class_acceptance(
        &self,
        m: &Machine,
    ) -> Result<(Option<MachineClass>, Option<MachineClassAcceptance>), StoreError> {
        let mut conn = self.services.store().conn().await?;
        let class = machine_class::get_by_name(&mut conn, &m.machine_class).await?;
        let acceptance = class.as_ref().and_then(|c| c.spec.acceptance.clone());
        Ok((class, acceptance))
    }

    /// The acceptance image a verified wipe of `m` goes on to: its class's, when the class names
    /// one and this stay in cleaning began at enrollment or at a return from maintenance.
    pub(super) async fn acceptance_after_wipe(
        &self,
        m: &Machine,
    ) -> Result<Option<MachineClassAcceptance>, StoreError> {
        let (_, acceptance) = self.class_acceptance(m).await?;
        let Some(acceptance) = acceptance else { return Ok(None) };
        let mut conn = self.services.store().conn().await?;
        Ok(acceptance::due(&mut conn, m.id).await?.then_some(acceptance))
    }

    /// The acceptance run of `m`: its boot, the image's report (or the timeout), power off and
    /// eject, then `available` or `maintenance`.
    pub(super) async fn accept(&self, bmc: &dyn BmcDriver, m: &Machine, run: Run) -> Step {
        let access = match self.access(m) {
            Ok(a) => a,
            Err(step) => return step,
        };
        let (class, acceptance) = match self.class_acceptance(m).await {
            Ok(found) => found,
            Err(e) => return e.into(),
        };
        let Some(booted_at) = run.run_booted_at else {
            return self.boot_acceptance(bmc, m, &access, &run, class, acceptance).await;
        };
        // The class's timeout as it is now; a class that stopped naming an image since the boot
        // leaves the run its token's lifetime.
        let timeout =
            acceptance.map_or(self.settings.agent_token_ttl, |a| Duration::from_secs(u64::from(a.timeout_seconds)));
        match &run.report {
            None => self.await_acceptance_report(bmc, m, &access, booted_at, timeout).await,
            Some(report) => self.finish_acceptance(bmc, m, &access, &run, report).await,
        }
    }

    /// The acceptance's boot: the class's image with a seed holding what the class promises. A
    /// class that stopped naming an image before the boot lets the machine go without one.
    async fn boot_acceptance(
        &self,
        bmc: &dyn BmcDriver,
        m: &Machine,
        access: &BmcAccess,
        run: &Run,
        class: Option<MachineClass>,
        acceptance: Option<MachineClassAcceptance>,
    ) -> Step {
        let (Some(class), Some(acceptance)) = (class, acceptance) else {
            let evidence = json!({ "run_id": run.run_id, "skipped": "the class no longer names an acceptance image" });
            let (id, version, run_id) = (m.id, m.status_version, run.run_id);
            return self
                .guarded(m.id, move |c, k| {
                    async move { acceptance::pass(c, k, id, version, run_id, &evidence).await }.boxed()
                })
                .await;
        };
        let spec = class.spec;
        let config = AcceptanceConfig {
            image_sha256: acceptance.image_sha256.clone(),
            machine_class: spec.name,
            cpu_cores: spec.cpu_cores,
            memory_gib: spec.memory_gib,
            gpu_model: spec.gpu_model,
            gpu_count: spec.gpu_count,
            drives: wipe_drives(&m.inventory),
        };
        let token_ttl = Duration::from_secs(u64::from(acceptance.timeout_seconds));
        self.boot(bmc, m, access, run, AgentRunConfig::Acceptance(config), acceptance.image_url, token_ttl).await
    }

    /// Booted, no report yet: waits for the boot's power-on, then for the image until the
    /// class's timeout (then `maintenance`, powered off and ejected).
    async fn await_acceptance_report(
        &self,
        bmc: &dyn BmcDriver,
        m: &Machine,
        access: &BmcAccess,
        booted_at: DateTime<Utc>,
        timeout: Duration,
    ) -> Step {
        match bmc.power_progress(access).await {
            Ok(PowerProgress::Done) => {}
            Ok(PowerProgress::Pending(after)) => {
                return Step::Stop(Outcome::wait(after, POWERING, "the machine is powering on for its acceptance"))
            }
            Err(e) => return self.bmc_failed(m, e).await,
        }
        let deadline = booted_at + ttl(timeout);
        if Utc::now() >= deadline {
            // Best effort: the run's token is expired with the timeout, and the machine serves
            // nobody in maintenance.
            power_off_best_effort(bmc, access).await;
            let message = format!("the acceptance image did not report within the class's {} s", timeout.as_secs());
            let failure = Failure { code: ACCEPTANCE_TIMED_OUT, message: &message, checks: &[] };
            return self.fail_acceptance(m, &failure).await;
        }
        let left = (deadline - Utc::now()).to_std().unwrap_or_default();
        Step::Stop(Outcome::wait(
            left.min(self.settings.report_wait),
            "waiting_for_agent",
            "the machine is running its acceptance image; waiting for its report",
        ))
    }

    /// A report: power off and eject (the run marked finished), then the verdict: `available`
    /// when it passed, else `maintenance` with its reason.
    async fn finish_acceptance(
        &self,
        bmc: &dyn BmcDriver,
        m: &Machine,
        access: &BmcAccess,
        run: &Run,
        report: &RunReport,
    ) -> Step {
        let reported = "the acceptance image reported; the machine is powering off";
        if let Some(step) = self.end_boot(bmc, m, access, run, reported).await {
            return step;
        }
        if !report.verified {
            // The report was checked when it arrived; its reason and checks are kept with it.
            let why = report.failure.as_deref().unwrap_or("the report does not pass");
            let message = format!("the acceptance failed: {why}");
            let checks: Vec<HealthCheck> = serde_json::from_value(report.report["checks"].clone()).unwrap_or_default();
            let failure = Failure { code: ACCEPTANCE_FAILED, message: &message, checks: &checks };
            return self.fail_acceptance(m, &failure).await;
        }
        let evidence = json!({
            "run_id": run.run_id,
            "image_sha256": report.report["image_sha256"],
            "checks": report.report["checks"],
            "report": report.report,
            "reported_at": report.used_at,
        });
        let (id, version, run_id) = (m.id, m.status_version, run.run_id);
        self.guarded(m.id, move |c, k| {
            async move { acceptance::pass(c, k, id, version, run_id, &evidence).await }.boxed()
        })
        .await
    }

    /// Ends the acceptance in `maintenance` with `failure` (guarded).
    async fn fail_acceptance(&self, m: &Machine, failure: &Failure<'_>) -> Step {
        let (id, version) = (m.id, m.status_version);
        let (code, message, checks) = (failure.code.to_owned(), failure.message.to_owned(), failure.checks.to_vec());
        self.guarded(m.id, move |c, k| {
            async move {
                let failure = Failure { code: &code, message: &message, checks: &checks };
                acceptance::fail(c, k, id, version, &failure).await
            }
            .boxed()
        })
        .await
    }
}
