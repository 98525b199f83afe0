//! The power sync: machines at rest keep the power their state implies, `available`,
//! `maintenance` and `clean_failed` off and `active` on, whatever happens behind paddock's back.
//!
//! One job kind, [`POWER_SYNC`], with two kinds of target:
//!
//! - **The fleet job** (one, a fixed target id; enqueued at every worker start, which merges into
//!   the queued one): reads the power of up to [`PowerSyncSettings::batch`] machines due for a
//!   check (in a stable state, not checked for [`PowerSyncSettings::interval`], no job of their
//!   own open), [`PowerSyncSettings::concurrency`] at a time, through the BMC driver, whose
//!   limiter keeps the BMC bounds of docs/security.md (one call in flight per machine, a bound per BMC host).
//!   It only reads: a machine whose power is right has its drift count reset; one that drifted
//!   gets a correction job. Then it waits until the next machine is due. At rest that is one
//!   indexed query per check and one cheap power read per machine per interval.
//! - **A correction job** per drifted machine, targeted at the machine. It shares the machine's
//!   target with `machine_reconcile`, and the queue runs at most one job per target: a correction
//!   never runs while the machine's reconcile does, so it cannot power off a machine the
//!   reconciler is booting. It also stands back while a reconcile is queued (the reconciler goes
//!   first). It reads the power again and, if it still drifted, counts the drift (guarded on state
//!   and status version) and re-asserts the power, at most [`PowerSyncSettings::max_corrections`]
//!   times in a row; the next drift after that takes the machine out of service with reason
//!   [`POWER_DRIFT`]: an `available` machine moves to `maintenance` (guarded, recorded in the
//!   custody ledger); an `active` one gets the maintenance intent, so the machine reconciler
//!   releases it through cleaning first; one already in `maintenance` or `clean_failed` is left as
//!   it is, with `last_error` saying why (someone is evidently working on it).
//!
//! A race the target slot does not cover: the cluster reconciler allocates an `available` machine
//! (or starts releasing an `active` one) while a correction runs. The correction may then power
//! off a machine just allocated, or power on one just released: both are harmless, because the
//! machine's reconcile job (enqueued by that move, run after the correction ends) starts
//! provisioning with a power-off and a boot of its own, and a release by powering off.
//!
//! The same read gives the BMC's rating of the system's health (Redfish `Status.HealthRollup`):
//! when it differs from the last rating recorded from the BMC (healthy is presumed), the check
//! records a health report (`source: bmc`) in the transaction that stamps the check.
//!
//! A check that finds the power right resets the drift count, so only drift that comes back
//! between consecutive checks counts as repeated. States mid-flow are never touched.

use std::time::Duration;

use chrono::Utc;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use paddock_domain::bmc::{BmcAccess, BmcDriver, BmcError};
use paddock_domain::job_kind::{Payload, PowerCycleJob, MACHINE_POWER_CYCLE, POWER_SYNC};
use paddock_domain::model::Machine;
use paddock_domain::secret::SecretString;
use paddock_service::Services;
use paddock_store::power::{self, expected_power_on, FLEET_TARGET_TYPE, MACHINE_TARGET_TYPE};
use paddock_store::{health, lifecycle, machine, remediation, StoreError};
use paddock_types::health::{HealthCheck, HealthSource};
use paddock_types::machine::{LastError, MachineState};
use paddock_types::MachineId;
use serde_json::json;
use tracing::{debug, info, warn};

use super::{password_binding, Drivers, DRIVER_NOT_CONFIGURED, DRIVER_WAIT};
use crate::metrics::{self, Driver};
use crate::{Job, JobHandler, Outcome};

/// The maintenance reason and `last_error.code` of a machine whose power keeps drifting.
pub const POWER_DRIFT: &str = "power_drift";

/// The shortest wait of the fleet job between two runs (no spin while machines are due but
/// cannot be checked yet).
const MIN_WAIT: Duration = Duration::from_secs(1);

/// How soon the fleet job runs again after a full batch: more machines are due.
const NEXT_BATCH: Duration = Duration::from_millis(100);

/// Settings of the power sync.
#[derive(Debug, Clone)]
pub struct PowerSyncSettings {
    /// How often each machine at rest has its power read (`PADDOCK_POWER_SYNC_INTERVAL`).
    pub interval: Duration,
    /// Machines checked per run of the fleet job.
    pub batch: u32,
    /// Power reads in flight at once (the driver's limiter bounds them per BMC host as well).
    pub concurrency: usize,
    /// Corrections in a row before the next drift takes the machine out of service.
    pub max_corrections: u32,
}

impl Default for PowerSyncSettings {
    fn default() -> Self {
        Self { interval: Duration::from_secs(300), batch: 64, concurrency: 4, max_corrections: 3 }
    }
}

/// The [`POWER_SYNC`] handler: the fleet job and the correction jobs.
#[derive(Clone)]
pub struct PowerSync {
    services: Services,
    drivers: Drivers,
    settings: PowerSyncSettings,
}

impl std::fmt::Debug for PowerSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PowerSync").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl PowerSync {
    /// A power sync over `services` with the BMC driver of `drivers`.
    pub fn new(services: Services, drivers: Drivers, settings: PowerSyncSettings) -> Self {
        Self { services, drivers, settings }
    }

    /// The fleet job's database trouble: try again soon, without using up attempts (the fleet job
    /// must never run out of them: only a worker start would enqueue it again).
    fn later(&self, e: StoreError) -> Outcome {
        Outcome::wait_because(self.settings.interval.min(Duration::from_secs(30)), "database", e.to_string(), e)
    }

    // -----------------------------------------------------------------------------------------
    // The fleet job: read only.

    async fn scan(&self) -> Outcome {
        let Some(bmc) = self.drivers.bmc.clone() else {
            let message = "no BMC driver is configured (PADDOCK_BMC_DRIVER=none); no power to synchronize";
            return Outcome::wait(DRIVER_WAIT, DRIVER_NOT_CONFIGURED, message);
        };
        let due = async {
            let mut conn = self.services.store().conn().await?;
            power::due(&mut conn, self.settings.interval, self.settings.batch).await
        }
        .await;
        let ids = match due {
            Ok(ids) => ids,
            Err(e) => return self.later(e),
        };
        let full = u32::try_from(ids.len()).unwrap_or(u32::MAX) >= self.settings.batch;
        futures::stream::iter(ids)
            .map(|id| self.check(bmc.as_ref(), id))
            .buffer_unordered(self.settings.concurrency.max(1))
            .collect::<Vec<()>>()
            .await;
        if full {
            return Outcome::wait(NEXT_BATCH, "power_sync_next_batch", "more machines are due for a power check");
        }
        let next = async {
            let mut conn = self.services.store().conn().await?;
            power::next_due_in(&mut conn, self.settings.interval).await
        }
        .await;
        match next {
            Ok(next) => {
                let after =
                    next.unwrap_or(self.settings.interval).clamp(MIN_WAIT, self.settings.interval.max(MIN_WAIT));
                Outcome::wait(after, "power_sync_idle", "waiting until the next machine is due for a power check")
            }
            Err(e) => self.later(e),
        }
    }

    /// Reads one machine's power; a drift gets a correction job. Failures are logged and the
    /// machine is looked at again after the interval: the check is periodic anyway.
    async fn check(&self, bmc: &dyn BmcDriver, id: MachineId) {
        let m = match self.load(id).await {
            Ok(Some(m)) => m,
            Ok(None) => return,
            Err(e) => {
                warn!(machine.id = %id, error = &e as &dyn std::error::Error, "power check of machine {id}: no record");
                return;
            }
        };
        let Some(expected) = at_rest(&m) else { return };
        // A power changing right now (`power_on: None`) is looked at again next time.
        let (verdict, health) = match self.access(&m) {
            Some(access) => match bmc.system_status(&access).await {
                Ok(status) => (status.power_on.map(|on| on == expected), status.health),
                Err(e) => {
                    read_failed(&m, &e);
                    (None, None)
                }
            },
            None => (None, None),
        };
        let result = async {
            let mut tx = self.services.store().begin().await?;
            if let Some(rated) = &health {
                let check = HealthCheck { name: "bmc.health".into(), status: rated.status, detail: rated.detail.clone() };
                let key = self.services.ledger_key();
                if health::record_changes(&mut tx, key, HealthSource::Bmc, &[(id, check)]).await? > 0 {
                    info!(machine.id = %id, health.status = rated.status.as_str(),
                        "machine {id}: its BMC now rates it {} ({})", rated.status.as_str(), rated.detail);
                }
            }
            match verdict {
                Some(true) => power::record_check(&mut tx, id, true).await?,
                None => power::record_check(&mut tx, id, false).await?,
                Some(false) => {
                    // Stamped without counting: the correction job reads again and counts.
                    power::record_check(&mut tx, id, false).await?;
                    power::enqueue_correction(&mut tx, id).await?;
                    info!(machine.id = %id, machine.state = m.state.as_str(), "machine {id} is powered {} but should be {}: correcting",
                        on_off(!expected), on_off(expected));
                }
            }
            tx.commit().await?;
            Ok::<_, StoreError>(())
        }
        .await;
        if let Err(e) = result {
            warn!(machine.id = %id, error = &e as &dyn std::error::Error, "recording the power check of machine {id} failed");
        }
    }

    // -----------------------------------------------------------------------------------------
    // A correction job: holds the machine's target slot.

    async fn correct(&self, id: MachineId) -> Outcome {
        let Some(bmc) = self.drivers.bmc.clone() else { return Outcome::Done };
        let loaded = async {
            let mut conn = self.services.store().conn().await?;
            let m = machine::get(&mut conn, id).await?;
            let pending = power::reconcile_pending(&mut conn, id).await?;
            Ok::<_, StoreError>((m, pending))
        }
        .await;
        let m = match loaded {
            // The reconciler has work on this machine: it goes first, the next check looks again.
            Ok((_, true)) | Ok((None, _)) => return Outcome::Done,
            Ok((Some(m), false)) => m,
            Err(e) => return super::store_error(e),
        };
        let Some(expected) = at_rest(&m) else { return Outcome::Done };
        let Some(access) = self.access(&m) else { return Outcome::Done };
        let on = match bmc.system_status(&access).await.map(|s| s.power_on) {
            Ok(Some(on)) => on,
            Ok(None) => return Outcome::Done,
            Err(e) => {
                read_failed(&m, &e);
                return Outcome::Done;
            }
        };
        if on == expected {
            // Settled by itself (or by someone) since the check: nothing to correct.
            return match self.record_check(id).await {
                Ok(()) => Outcome::Done,
                Err(e) => super::store_error(e),
            };
        }
        let count = async {
            let mut conn = self.services.store().conn().await?;
            power::record_drift(&mut conn, id, m.state, m.status_version).await
        }
        .await;
        let count = match count {
            Ok(Some(count)) => count,
            // The machine moved on since it was read: its new state decides.
            Ok(None) => return Outcome::Done,
            Err(e) => return super::store_error(e),
        };
        if count > self.settings.max_corrections {
            return self.out_of_service(&m, expected, count).await;
        }
        let result = if expected { bmc.power_on(&access).await } else { bmc.power_off(&access).await };
        match result {
            Ok(()) => {
                info!(machine.id = %id, machine.state = m.state.as_str(), power.drift_count = count,
                    "machine {id} ({}) was powered {} behind paddock's back: powered it {} again (drift {count} of {})",
                    m.state.as_str(), on_off(on), on_off(expected), self.settings.max_corrections);
            }
            // The next check finds the drift again and counts it: a BMC that cannot be
            // corrected ends out of service like one that keeps drifting.
            Err(e) => {
                metrics::driver_failed(Driver::Bmc, &e.code);
                warn!(machine.id = %id, error = &e as &dyn std::error::Error, "powering machine {id} {} failed",
                    on_off(expected));
            }
        }
        Outcome::Done
    }

    /// Takes a machine whose power kept drifting out of service, the way its state allows.
    async fn out_of_service(&self, m: &Machine, expected: bool, count: u32) -> Outcome {
        let id = m.id;
        let message = format!(
            "the machine was found powered {} instead of {} {count} checks in a row, after {} corrections",
            on_off(!expected),
            on_off(expected),
            self.settings.max_corrections
        );
        let evidence = json!({
            "code": POWER_DRIFT,
            "expected_power": on_off(expected),
            "observed_power": on_off(!expected),
            "drift_count": count,
            "max_corrections": self.settings.max_corrections,
        });
        let result = async {
            let mut tx = self.services.store().begin().await?;
            let moved = match m.state {
                MachineState::Available => {
                    let (from, version) = (m.state, m.status_version);
                    power::to_maintenance(
                        &mut tx,
                        self.services.ledger_key(),
                        id,
                        from,
                        version,
                        POWER_DRIFT,
                        POWER_DRIFT,
                        &message,
                        &evidence,
                    )
                    .await?
                }
                MachineState::Active => {
                    let (from, version) = (m.state, m.status_version);
                    let asked =
                        power::request_maintenance(&mut tx, id, from, version, POWER_DRIFT, POWER_DRIFT, &message)
                            .await?;
                    if asked {
                        // The reconciler releases it through cleaning into maintenance.
                        lifecycle::enqueue_machine(&mut tx, id, None).await?;
                    }
                    asked
                }
                // Already out of service: say why the power is left alone from now on.
                _ => {
                    let error = LastError { code: POWER_DRIFT.to_owned(), message: message.clone(), at: Utc::now() };
                    machine::set_last_error_guarded(&mut tx, id, m.state, m.status_version, Some(&error)).await?
                }
            };
            tx.commit().await?;
            Ok::<_, StoreError>(moved)
        }
        .await;
        match result {
            Ok(true) => {
                warn!(machine.id = %id, machine.state = m.state.as_str(), power.drift_count = count,
                    "machine {id} ({}) keeps being powered {}: taken out of service ({POWER_DRIFT})",
                    m.state.as_str(), on_off(!expected));
                Outcome::Done
            }
            Ok(false) => {
                debug!(machine.id = %id, "machine {id} moved on before its power drift was acted on");
                Outcome::Done
            }
            Err(e) => super::store_error(e),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Shared pieces.

    async fn load(&self, id: MachineId) -> Result<Option<Machine>, StoreError> {
        let mut conn = self.services.store().conn().await?;
        machine::get(&mut conn, id).await
    }

    async fn record_check(&self, id: MachineId) -> Result<(), StoreError> {
        let mut conn = self.services.store().conn().await?;
        power::record_check(&mut conn, id, true).await
    }

    /// The machine's BMC access with its password opened; `None` (logged) when it cannot be
    /// opened: the machine reconciler reports that on the machine, the power sync just skips it.
    fn access(&self, m: &Machine) -> Option<BmcAccess> {
        let password = self
            .services
            .cipher()
            .open(&m.bmc.password_enc, password_binding(m))
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok());
        let Some(password) = password else {
            debug!(machine.id = %m.id, "the BMC password of machine {} cannot be opened; power not checked", m.id);
            return None;
        };
        Some(BmcAccess {
            machine_id: m.id,
            url: m.bmc.url.clone(),
            system_id: m.bmc.system_id.clone(),
            username: m.bmc.username.clone(),
            password: SecretString::new(password),
            ca_cert: m.bmc.ca_cert.clone(),
            insecure_tls: m.bmc.insecure_tls,
            system_uuid: m.system_uuid.clone(),
        })
    }
}

/// The power a machine should have, when it is at rest and no operator intent is pending (those
/// are the machine reconciler's to carry out); `None` otherwise.
fn at_rest(m: &Machine) -> Option<bool> {
    if m.retire_requested || (m.maintenance_reason.is_some() && m.state != MachineState::Maintenance) {
        return None;
    }
    expected_power_on(m.state)
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

fn read_failed(m: &Machine, e: &BmcError) {
    metrics::driver_failed(Driver::Bmc, &e.code);
    warn!(machine.id = %m.id, error = %e, "reading the power of machine {} failed", m.id);
}

impl JobHandler for PowerSync {
    fn kind(&self) -> &'static str {
        POWER_SYNC
    }

    fn run<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        match job.target_type.as_str() {
            FLEET_TARGET_TYPE => self.scan().boxed(),
            MACHINE_TARGET_TYPE => self.correct(MachineId(job.target_id)).boxed(),
            // Nothing else is ever enqueued with this kind.
            _ => async { Outcome::Done }.boxed(),
        }
    }
}

/// The [`MACHINE_POWER_CYCLE`] handler: a tenant's power cycle of a machine it holds, off then on
/// through the BMC, only while the machine is still `active` in the tenancy it was asked in. Its
/// target is the machine, so it never runs beside the machine's reconcile; a repeat (a retry,
/// a crash) powers off a machine already off and on one already on, which the driver takes as
/// success.
#[derive(Debug, Clone)]
pub struct PowerCycle(PowerSync);

impl PowerCycle {
    /// A power cycle handler over the power sync's services and drivers.
    pub fn new(sync: PowerSync) -> Self {
        Self(sync)
    }

    async fn cycle(&self, job: PowerCycleJob) -> Outcome {
        let Some(bmc) = self.0.drivers.bmc.clone() else {
            return Outcome::fail(DRIVER_NOT_CONFIGURED, "no BMC driver is configured; nothing can be power-cycled");
        };
        let loaded = async {
            let mut conn = self.0.services.store().conn().await?;
            if !remediation::still_active_in(&mut conn, job.machine_id, job.allocation_id).await? {
                return Ok(None);
            }
            machine::get(&mut conn, job.machine_id).await
        }
        .await;
        let m = match loaded {
            Ok(Some(m)) => m,
            Ok(None) => return Outcome::fail("machine_not_active", "the machine is no longer active in the cluster"),
            Err(e) => return super::store_error(e),
        };
        let Some(access) = self.0.access(&m) else {
            return Outcome::fail("bmc_password_unreadable", "the machine's BMC cannot be reached for a power cycle");
        };
        let cycled = match bmc.power_off(&access).await {
            Ok(()) => bmc.power_on(&access).await,
            Err(e) => Err(e),
        };
        match cycled {
            Ok(()) => {
                info!(machine.id = %m.id, "machine {} was power-cycled at its tenant's request", m.id);
                Outcome::Done
            }
            Err(e) => {
                metrics::driver_failed(Driver::Bmc, &e.code);
                warn!(machine.id = %m.id, error = &e as &dyn std::error::Error, "power-cycling machine {} failed", m.id);
                // The tenant's message is generic; the provider has the cause in the log.
                let message = "the machine's BMC did not complete the power cycle";
                if e.kind == paddock_domain::bmc::BmcErrorKind::Transient {
                    Outcome::retry(e.code, message)
                } else {
                    Outcome::fail("power_cycle_failed", message)
                }
            }
        }
    }
}

impl JobHandler for PowerCycle {
    fn kind(&self) -> &'static str {
        MACHINE_POWER_CYCLE
    }

    fn run<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        match PowerCycleJob::from_value(&job.payload) {
            Ok(payload) => self.cycle(payload).boxed(),
            Err(e) => {
                let detail = format!("the job's payload is not a power cycle's: {e}");
                async move { Outcome::fail("bad_job", detail) }.boxed()
            }
        }
    }
}
