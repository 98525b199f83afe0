//! The machine reconciler: the machine lifecycle of docs/architecture.md, one guarded step at a time.
//!
//! ```text
//! enrolling -> inspecting -> cleaning -> available -> allocated -> provisioning -> active
//!                              ^  |                       |              |            |
//!                              |  +-> clean_failed        +--------------+------------+-> releasing
//!                              |                                         v                  |
//!                              +----------------------------------- provision_failed <------+ (via cleaning)
//! ```
//!
//! Agent runs (a wipe in `cleaning`, a provisioning boot in `provisioning`) are recorded on the
//! machine before it boots: `run_id` first, then the boot (fresh tokens per boot, the seed token
//! in the seed URL the BMC fetches; the tokens of a replaced boot are ended), then `run_booted_at`; the agent's report arrives through
//! the API and wakes the job; then the media are ejected (`run_finished_at`); then the state moves
//! on. A crash between any side effect and its write repeats the side effect, which is idempotent
//! at the BMC (a repeated boot restarts the run's boot with a new token).
//!
//! Allocation is the cluster reconciler's (all or nothing, in one transaction); so is the start of
//! a release (`releasing`). From there this reconciler drains and removes the node, powers the
//! machine off and ends the tenancy in `cleaning`, which wipes it again before anyone else gets it.
//! A release that outlasts `PADDOCK_RELEASE_TIMEOUT`, or one an operator forces, is forced: the
//! forcing is recorded (billing stops there), the machine powered off, its Node and Lease deleted
//! best effort, and it goes on to cleaning (to maintenance, `release_power_off_failed`, when the
//! power-off fails).
//! Operator intents: `maintenance_reason` set = take it out of service (a machine that holds a
//! tenancy is released first), cleared while in maintenance = leave through cleaning;
//! `retire_requested` = retire once it is available, in maintenance or clean_failed.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use futures::FutureExt;
use paddock_domain::bmc::{
    check_against_class, inventory_json, AfterBoot, BmcAccess, BmcDriver, BmcError, BmcErrorKind, BootMedia, Inventory,
    PowerProgress, NO_SECOND_VIRTUAL_MEDIA, SYSTEM_UUID_MISMATCH,
};
use paddock_domain::driver::{node_name, DriverError, KubeDrivers, NodeRef, Removal, TenantAccess};
use paddock_domain::job_kind::MACHINE_RECONCILE;
use paddock_domain::ledger::LedgerKey;
use paddock_domain::machine::{DUPLICATE_SYSTEM, HELD, RETIRABLE};
use paddock_domain::model::Machine;
use paddock_domain::secret::SecretString;
use paddock_service::agent::AgentRun;
use paddock_service::Services;
use paddock_store::lifecycle;
use paddock_store::run::{self, Run, RunPurpose, RunReport};
use paddock_store::{cluster, machine, machine_class, node_pool, Conn, StoreError};
use paddock_types::agent::{AgentPurpose, WipeConfig, WipeDrive};
use paddock_types::cluster::ClusterKind;
use paddock_types::machine::{LastError, MachineState};
use paddock_types::MachineId;
use serde_json::json;

use super::{
    cluster_ref, password_binding, store_error, tenant_access, Drivers, Settings, DRIVER_NOT_CONFIGURED, DRIVER_WAIT,
};
use crate::metrics::{self, Driver};
use crate::{Job, JobHandler, Outcome};

/// How long a machine waits after an error only a spec change fixes (wrong credentials, an
/// ambiguous or unknown system): no retry storm against the BMC. The credentials PATCH enqueues a
/// new `machine_reconcile` job, so a fix is picked up at once, not after this wait.
pub const BMC_FIX_WAIT: Duration = Duration::from_secs(3600);

/// The wait reason of a run that ends while the BMC changes the power.
const POWERING: &str = "waiting_for_power";

/// Steps one run may take before it yields (each re-reads the machine).
const STEPS_PER_RUN: usize = 16;

/// The maintenance reason (and `last_error.code`) of a machine whose forced release could not
/// power it off (docs/architecture.md).
pub const RELEASE_POWER_OFF_FAILED: &str = "release_power_off_failed";

/// How long a forced release waits for the tenant API server to take the deletes of the Node
/// and its Lease (best effort: the release goes on either way).
const ABANDON_BOUND: Duration = Duration::from_secs(30);

/// What a step decided: stop with this outcome, or continue: with the machine read again, or
/// with the machine as a write just left it (read in the write's transaction).
enum Step {
    Stop(Outcome),
    Again,
    Next(Box<(Machine, Option<Run>)>),
}

impl From<StoreError> for Step {
    fn from(e: StoreError) -> Self {
        Step::Stop(store_error(e))
    }
}

/// Converges machines through a BMC driver (and, for provisioning and release, the tenant
/// cluster's nodes through the Kubernetes drivers).
#[derive(Clone)]
pub struct MachineReconciler {
    services: Services,
    drivers: Drivers,
    settings: Arc<Settings>,
}

impl std::fmt::Debug for MachineReconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MachineReconciler").field("drivers", &self.drivers).finish_non_exhaustive()
    }
}

impl MachineReconciler {
    /// A reconciler over `services` (store, cipher, agent URL) with `drivers`.
    pub fn new(services: Services, drivers: Drivers, settings: Settings) -> Self {
        Self { services, drivers, settings: Arc::new(settings) }
    }

    async fn reconcile(&self, id: MachineId) -> Outcome {
        match self.drivers.bmc.clone() {
            None => self.no_driver(id).await,
            Some(bmc) => self.converge(bmc.as_ref(), id).await,
        }
    }

    async fn no_driver(&self, id: MachineId) -> Outcome {
        let message = "no BMC driver is configured (PADDOCK_BMC_DRIVER=none); the machine waits";
        let result = async {
            let mut conn = self.services.store().conn().await?;
            if machine::get(&mut conn, id, false).await?.is_none() {
                return Ok(false);
            }
            let error =
                LastError { code: DRIVER_NOT_CONFIGURED.to_owned(), message: message.to_owned(), at: Utc::now() };
            machine::set_last_error(&mut conn, id, Some(&error)).await?;
            Ok(true)
        }
        .await;
        match result {
            // A machine that is gone has nothing left to converge.
            Ok(false) => Outcome::Done,
            Ok(true) => Outcome::wait(DRIVER_WAIT, DRIVER_NOT_CONFIGURED, message),
            Err(e) => store_error(e),
        }
    }

    /// Runs the steps from the top; each step starts from the machine as stored (read again, or
    /// read by the last step's write in its transaction).
    async fn converge(&self, bmc: &dyn BmcDriver, id: MachineId) -> Outcome {
        let mut next = None;
        for _ in 0..STEPS_PER_RUN {
            let current = if let Some(current) = next.take() {
                current
            } else {
                let mut conn = match self.services.store().conn().await {
                    Ok(c) => c,
                    Err(e) => return store_error(e),
                };
                match machine::get_with_run(&mut conn, id).await {
                    Ok(Some(found)) => found,
                    Ok(None) => return Outcome::Done,
                    Err(e) => return store_error(e),
                }
            };
            let (current, run) = current;
            match self.step(bmc, &current, run).await {
                Step::Stop(outcome) => return outcome,
                Step::Again => {}
                Step::Next(current) => next = Some(*current),
            }
        }
        Outcome::retry("machine_contended", "the machine kept changing under the reconciler; trying again")
    }

    /// One step of `m`, in the run `run` (read with it).
    async fn step(&self, bmc: &dyn BmcDriver, m: &Machine, run: Option<Run>) -> Step {
        use MachineState as S;
        // Retired is final: a maintenance reason left on the record must not bring it back.
        if m.state == S::Retired {
            return Step::Stop(Outcome::Done);
        }
        // A second record of a server enrolled already: nothing but retirement, never a BMC call
        // (a power action would hit the other record's server, perhaps serving a tenant).
        if m.duplicate_of.is_some() {
            if !m.retire_requested {
                return Step::Stop(Outcome::Done);
            }
            return self
                .guarded(m.id, |c, k| machine::transition(c, k, m.id, m.state, m.status_version, S::Retired).boxed())
                .await;
        }
        if m.retire_requested && RETIRABLE.contains(&m.state) {
            return self
                .guarded(m.id, |c, k| machine::transition(c, k, m.id, m.state, m.status_version, S::Retired).boxed())
                .await;
        }
        // An operator forces the release (docs/api.md): a machine still being given to its
        // tenant, or serving it, starts releasing; `release` then forces it at once.
        if m.force_release_reason.is_some() && HELD.contains(&m.state) {
            return self.begin_release(m).await;
        }
        if m.maintenance_reason.is_some() && m.state != S::Maintenance {
            return self.enter_maintenance(bmc, m, run).await;
        }
        match m.state {
            S::Enrolling | S::Inspecting => self.inspect(bmc, m).await,
            S::Cleaning => self.clean(bmc, m, run).await,
            S::Maintenance if m.maintenance_reason.is_none() => {
                // The operator's maintenance ended: leave through cleaning.
                self.guarded(m.id, |c, k| {
                    machine::advance(c, k, m.id, m.state, m.status_version, S::Cleaning, None).boxed()
                })
                .await
            }
            S::Allocated | S::Provisioning => self.provision(bmc, m, run).await,
            S::Releasing | S::ProvisionFailed => self.release(bmc, m).await,
            // Converged: the cluster reconciler (allocation, release) or an operator (intents)
            // moves the machine on, and enqueues this job again when it does.
            S::Available | S::Active | S::Maintenance | S::CleanFailed | S::Retired => Step::Stop(Outcome::Done),
        }
    }

    /// Runs one guarded write, given the ledger key for the custody entry a move appends (sealed
    /// as it is written, in the move's transaction); lost or won, the next step reads the machine
    /// again.
    async fn guarded<F>(&self, id: MachineId, write: F) -> Step
    where
        F: for<'c> FnOnce(&'c mut Conn, &'c LedgerKey) -> BoxFuture<'c, Result<bool, StoreError>>,
    {
        self.guarded_then(id, write, |_| ()).await
    }

    /// [`Self::guarded`], then `committed` with what the write returned once its transaction
    /// committed: what a metric may observe (never a write that was lost or rolled back).
    async fn guarded_then<T, F>(&self, id: MachineId, write: F, committed: impl FnOnce(T) + Send) -> Step
    where
        F: for<'c> FnOnce(&'c mut Conn, &'c LedgerKey) -> BoxFuture<'c, Result<T, StoreError>>,
    {
        let result = async {
            let mut tx = self.services.store().begin().await?;
            let written = write(&mut tx, self.services.ledger_key()).await?;
            // What the next step starts from, read before the commit: no read of its own.
            let next = machine::get_with_run(&mut tx, id).await?;
            tx.commit().await?;
            Ok::<_, StoreError>((written, next))
        }
        .await;
        match result {
            Ok((written, next)) => {
                committed(written);
                next.map_or(Step::Again, |next| Step::Next(Box::new(next)))
            }
            Err(e) => e.into(),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Operator intents.

    async fn enter_maintenance(&self, bmc: &dyn BmcDriver, m: &Machine, run: Option<Run>) -> Step {
        use MachineState as S;
        match m.state {
            // A tenancy ends through releasing and cleaning first; cleaning then sees the intent.
            S::Allocated | S::Provisioning | S::Active => self.begin_release(m).await,
            S::Releasing | S::ProvisionFailed => self.release(bmc, m).await,
            _ => {
                // Abandon whatever run it was in; a machine that was booted into a wipe is
                // powered off on its way out of service (best effort: it is leaving service).
                if let Some(run) = run {
                    if run.run_booted_at.is_some() {
                        if let Ok(access) = self.access(m) {
                            if let Err(e) = bmc.power_off(&access).await {
                                metrics::driver_failed(Driver::Bmc, &e.code);
                            }
                        }
                    }
                    if let Err(e) = self.expire_tokens(&run).await {
                        return e.into();
                    }
                }
                let to = S::Maintenance;
                self.guarded(m.id, |c, k| {
                    lifecycle::end_run(c, k, m.id, m.state, m.status_version, to, None, None).boxed()
                })
                .await
            }
        }
    }

    /// Starts the release of a machine that holds a tenancy (guarded), and wakes its cluster,
    /// which allocates a replacement if its pool still wants one.
    async fn begin_release(&self, m: &Machine) -> Step {
        let (id, state, version, holder) = (m.id, m.state, m.status_version, m.tenant_id.zip(m.cluster_id));
        self.guarded(m.id, move |c, k| {
            async move {
                let released = lifecycle::begin_release(c, k, id, state, version).await?;
                if let (true, Some((tenant, cluster))) = (released, holder) {
                    lifecycle::enqueue_cluster(c, tenant, cluster).await?;
                }
                Ok(released)
            }
            .boxed()
        })
        .await
    }

    // -----------------------------------------------------------------------------------------
    // Enrolling / inspecting.

    /// Reads the BMC (no connection held meanwhile), records the inventory, then moves on, every
    /// write guarded on the state and status version read before.
    async fn inspect(&self, bmc: &dyn BmcDriver, m: &Machine) -> Step {
        let access = match self.access(m) {
            Ok(a) => a,
            Err(step) => return step,
        };
        let inventory = match bmc.inspect(&access).await {
            Ok(inv) => inv,
            Err(e) => return self.bmc_failed(m, e).await,
        };
        let result = async {
            let mut conn = self.services.store().conn().await?;
            self.record_inspection(&mut conn, m, &inventory).await
        }
        .await;
        // Whether it moved or lost a race, the next step reads the machine again.
        result.map_or_else(Step::from, |()| Step::Again)
    }

    /// What inspection found, against the machine's class: the inventory recorded (if it
    /// changed), `enrolling` -> `inspecting`, then `cleaning`, or `maintenance` with the reason
    /// the machine does not match its class or answers with another system's UUID. A lost race
    /// (a guarded write that matched nothing) stops the walk.
    async fn record_inspection(&self, conn: &mut Conn, m: &Machine, inventory: &Inventory) -> Result<(), StoreError> {
        let key = self.services.ledger_key();
        let Some(class) = machine_class::get_by_name(conn, &m.machine_class, false).await? else {
            // The class is restricted from deletion while in use: a race at most.
            return Ok(());
        };
        // A machine that already went through enrolling knows its UUID: another system
        // answering now is a contradiction, never something to overwrite silently.
        if let Some(known) = m.system_uuid.as_deref().filter(|_| m.state == MachineState::Inspecting) {
            if !known.eq_ignore_ascii_case(&inventory.system_uuid) {
                let reason = format!(
                    "the BMC now reports system UUID {} but inspection recorded {known}",
                    inventory.system_uuid
                );
                let to = MachineState::Maintenance;
                machine::advance(conn, key, m.id, m.state, m.status_version, to, Some(&reason)).await?;
                return Ok(());
            }
        }
        // The same server enrolled twice (another URL for its BMC, its system named by `Id` once
        // and by `UUID` once): the record that holds the UUID keeps it, this one stops here,
        // before anything powers or wipes the server the UUID check would let it reach.
        let holds = m.system_uuid.as_deref().is_some_and(|known| known.eq_ignore_ascii_case(&inventory.system_uuid));
        if !holds {
            if let Some((holder, name)) = machine::system_uuid_holder(conn, m.id, &inventory.system_uuid).await? {
                let uuid = &inventory.system_uuid;
                machine::mark_duplicate(conn, key, m.id, m.state, m.status_version, (holder, &name), uuid).await?;
                return Ok(());
            }
        }
        let verdict = check_against_class(inventory, &class.spec);
        let json = inventory_json(inventory, &verdict);
        let (mut state, mut version) = (m.state, m.status_version);
        if m.system_uuid.as_deref() != Some(inventory.system_uuid.as_str()) || m.inventory != json {
            match machine::set_inventory(conn, m.id, state, version, &inventory.system_uuid, &json).await {
                Ok(true) => version += 1,
                // A lost race, or another record inspected the same server at the same moment and
                // took the UUID first (the unique index): the next step reads again and sees it.
                Ok(false) => return Ok(()),
                Err(StoreError::Unique { constraint, .. }) if constraint == machine::SYSTEM_UUID_KEY => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        if state == MachineState::Enrolling {
            if !machine::advance(conn, key, m.id, state, version, MachineState::Inspecting, None).await? {
                return Ok(());
            }
            (state, version) = (MachineState::Inspecting, version + 1);
        }
        let reason = verdict.maintenance_reason();
        let to = if reason.is_some() { MachineState::Maintenance } else { MachineState::Cleaning };
        machine::advance(conn, key, m.id, state, version, to, reason.as_deref()).await?;
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // Cleaning.

    /// The wipe (docs/architecture.md): a run, a boot from the wipe image with the run's seed, the
    /// agent's report, power off and eject, then `available` with the clean recorded, or
    /// `clean_failed`. Nothing becomes available without every listed drive wiped.
    async fn clean(&self, bmc: &dyn BmcDriver, m: &Machine, run: Option<Run>) -> Step {
        let run = match run {
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
        let config = match serde_json::to_value(WipeConfig { drives }) {
            Ok(c) => c,
            Err(e) => return Step::Stop(Outcome::retry("agent_config", format!("encoding the wipe's drives: {e}"))),
        };
        self.boot(bmc, m, access, run, AgentPurpose::Wipe, config, image).await
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
        if run.run_finished_at.is_none() {
            match bmc.start_finish_boot(access, AfterBoot::PowerOff).await {
                Ok(PowerProgress::Done) => {}
                Ok(PowerProgress::Pending(after)) => {
                    let message = "the wipe is verified; the machine is powering off";
                    return Step::Stop(Outcome::wait(after, POWERING, message));
                }
                Err(e) => return self.bmc_failed(m, e).await,
            }
            let (state, version) = (m.state, m.status_version);
            return self.guarded(m.id, |c, _| run::mark_finished(c, m.id, state, version).boxed()).await;
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

    // -----------------------------------------------------------------------------------------
    // Provisioning.

    /// From `allocated` (once the tenant control plane is up) through a provisioning boot with a
    /// join configuration to `active`, when a Ready Node with the machine's system UUID exists.
    async fn provision(&self, bmc: &dyn BmcDriver, m: &Machine, run: Option<Run>) -> Step {
        use MachineState as S;
        let Some(kube) = self.drivers.kube.clone() else {
            let message = "no Kubernetes driver is configured (PADDOCK_KUBE_DRIVER=none); the machine waits";
            return self.wait_with(m, DRIVER_WAIT, DRIVER_NOT_CONFIGURED, message).await;
        };
        // The tenant side is read only by the steps that talk to the tenant cluster (and before
        // the run starts: not before its control plane is up).
        let run = match run {
            Some(run) if m.state == S::Provisioning && run.run_purpose == RunPurpose::Provision.as_str() => run,
            _ => {
                if let Err(step) = self.provisioning_side(m).await {
                    return step;
                }
                let (state, version) = (m.state, m.status_version);
                let purpose = RunPurpose::Provision;
                return self
                    .guarded(m.id, |c, k| run::start_run(c, k, m.id, state, version, S::Provisioning, purpose).boxed())
                    .await;
            }
        };
        let access = match self.access(m) {
            Ok(a) => a,
            Err(step) => return step,
        };
        let Some(booted_at) = run.run_booted_at else {
            let Some(image) = self.settings.os_image_url.clone() else {
                let message = "no node OS image is configured (PADDOCK_OS_IMAGE_URL); the machine waits";
                return self.wait_for_fix(m, "os_image_not_configured", message).await;
            };
            // The bootstrap token lives for the join token TTL only (docs/security.md), not the
            // run's: it is deleted once the Node has registered.
            let (tenant_access, node) = match self.provisioning_side(m).await {
                Ok(found) => found,
                Err(step) => return step,
            };
            let ttl_secs = self.settings.join_token_ttl.as_secs().max(1);
            let join = match kube.nodes.join_config(&tenant_access, &node, ttl_secs).await {
                Ok(j) => j,
                Err(e) => return self.driver_failed(m, e).await,
            };
            let config = provision_config(&node.node_name, join.0);
            return self.boot(bmc, m, &access, &run, AgentPurpose::Provision, config, image).await;
        };
        let report = run.report.clone();
        let Some(report) = report else {
            let deadline = booted_at + ttl(self.settings.agent_token_ttl);
            if Utc::now() >= deadline {
                return self
                    .provision_failed(m, "provision_timed_out", "the machine did not report its first boot in time")
                    .await;
            }
            let left = (deadline - Utc::now()).to_std().unwrap_or_default();
            return Step::Stop(Outcome::wait(
                left.min(self.settings.report_wait),
                "waiting_for_agent",
                "the machine is installing; waiting for its first-boot report",
            ));
        };
        if !report.verified {
            let why = report.failure.as_deref().unwrap_or("the machine reported a failed first boot");
            return self.provision_failed(m, "provision_failed", why).await;
        }
        let Some(finished_at) = run.run_finished_at else {
            if let Err(e) = bmc.finish_boot(&access, AfterBoot::BootFromDisk).await {
                return self.bmc_failed(m, e).await;
            }
            let (state, version) = (m.state, m.status_version);
            return self.guarded(m.id, |c, _| run::mark_finished(c, m.id, state, version).boxed()).await;
        };
        let (tenant_access, node) = match self.provisioning_side(m).await {
            Ok(found) => found,
            Err(step) => return step,
        };
        self.await_node(m, &kube, &tenant_access, &node, finished_at).await
    }

    /// [`Self::tenant_side`] for provisioning: without it, the machine waits for the cluster's
    /// control plane.
    async fn provisioning_side(&self, m: &Machine) -> Result<(TenantAccess, NodeRef), Step> {
        match self.tenant_side(m).await {
            Ok(Some(found)) => Ok(found),
            // The cluster reconciler enqueues this job again once its control plane is up.
            Ok(None) => {
                let message = "waiting for the cluster's control plane";
                Err(Step::Stop(Outcome::wait(self.settings.poll, "waiting_for_control_plane", message)))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The last step of provisioning: the machine booted from disk at `finished_at`; it is
    /// `active` once a Node with its system UUID is Ready, and fails after the join timeout.
    async fn await_node(
        &self,
        m: &Machine,
        kube: &KubeDrivers,
        tenant_access: &TenantAccess,
        node: &NodeRef,
        finished_at: DateTime<Utc>,
    ) -> Step {
        let registered = match kube.nodes.node(tenant_access, node).await {
            Ok(found) => found,
            Err(e) => return self.driver_failed(m, e).await,
        };
        if registered.is_some() {
            // The Node has registered: its bootstrap tokens have done their work (docs/security.md).
            if let Err(e) = kube.nodes.delete_join_tokens(tenant_access, node).await {
                return self.driver_failed(m, e).await;
            }
        }
        match registered {
            Some(status) if status.ready => {
                let (id, version, holder) = (m.id, m.status_version, m.tenant_id.zip(m.cluster_id));
                self.guarded_then(
                    m.id,
                    move |c, k| {
                        async move {
                            let activated = lifecycle::activate(c, k, id, version, &status.name).await?;
                            if let (Some(_), Some((tenant, cluster))) = (activated, holder) {
                                lifecycle::enqueue_cluster(c, tenant, cluster).await?;
                            }
                            Ok(activated)
                        }
                        .boxed()
                    },
                    |since_allocation| {
                        if let Some(took) = since_allocation {
                            metrics::observe(|w| w.provisioned(&m.machine_class, took));
                        }
                    },
                )
                .await
            }
            _ => {
                if Utc::now() >= finished_at + ttl(self.settings.node_join_timeout) {
                    return self
                        .provision_failed(m, "node_never_ready", "the machine booted but never became a Ready node")
                        .await;
                }
                Step::Stop(Outcome::wait(
                    self.settings.poll,
                    "waiting_for_node",
                    "waiting for the node to become Ready",
                ))
            }
        }
    }

    async fn provision_failed(&self, m: &Machine, code: &str, message: &str) -> Step {
        let (id, state, version, holder) = (m.id, m.state, m.status_version, m.tenant_id.zip(m.cluster_id));
        let (code, message) = (code.to_owned(), message.to_owned());
        self.guarded(m.id, move |c, k| {
            async move {
                let to = MachineState::ProvisionFailed;
                let failed = lifecycle::end_run(c, k, id, state, version, to, Some((&code, &message)), None).await?;
                if let (true, Some((tenant, cluster))) = (failed, holder) {
                    // The cluster allocates a replacement.
                    lifecycle::enqueue_cluster(c, tenant, cluster).await?;
                }
                Ok(failed)
            }
            .boxed()
        })
        .await
    }

    // -----------------------------------------------------------------------------------------
    // Release.

    /// `releasing` / `provision_failed` -> `cleaning`: drain the Slurm node, remove the Node,
    /// power off, end the tenancy. Every step checks its postcondition, so a repeat is harmless.
    /// Bounded by `PADDOCK_RELEASE_TIMEOUT` (docs/architecture.md): after it, or at once when an
    /// operator asks, the release is forced ([`Self::force_release`]); nothing a tenant does
    /// inside its cluster can keep the machine out of cleaning.
    async fn release(&self, bmc: &dyn BmcDriver, m: &Machine) -> Step {
        let clock = {
            let mut conn = match self.services.store().conn().await {
                Ok(c) => c,
                Err(e) => return e.into(),
            };
            match lifecycle::release_clock(&mut conn, m.id).await {
                Ok(Some(clock)) => clock,
                // The tenancy ended under us (a race): read the machine again.
                Ok(None) => return Step::Again,
                Err(e) => return e.into(),
            }
        };
        let deadline = clock.started_at + ttl(self.settings.release_timeout);
        let forcing = if clock.forced_at.is_some() {
            Some(Forcing::Recorded)
        } else if let Some(reason) = &m.force_release_reason {
            Some(Forcing::Operator(reason.clone()))
        } else if Utc::now() >= deadline {
            Some(Forcing::Timeout(clock.started_at))
        } else {
            None
        };
        match forcing {
            Some(forcing) => self.force_release(bmc, m, forcing).await,
            // A wait (a drain, a terminating Node, a permanent driver error) never outlasts the
            // deadline: the job is back when the release is due to be forced.
            None => cap_wait(self.release_in_time(bmc, m).await, deadline),
        }
    }

    /// The release before its deadline: drain, remove the Node, power off, cleaning.
    async fn release_in_time(&self, bmc: &dyn BmcDriver, m: &Machine) -> Step {
        if let Some(kube) = self.drivers.kube.clone() {
            match self.tenant_side(m).await {
                Ok(Some((tenant, node))) => {
                    if let Some(step) = self.release_node(&kube, m, &tenant, &node).await {
                        return step;
                    }
                }
                // The control plane never came up (or is gone): no node to remove.
                Ok(None) => {}
                Err(e) => return e.into(),
            }
        }
        let access = match self.access(m) {
            Ok(a) => a,
            Err(step) => return step,
        };
        // A machine that never got a UUID recorded was never booted by us: nothing to power off.
        if access.system_uuid.is_some() {
            if let Err(e) = bmc.power_off(&access).await {
                return self.bmc_failed(m, e).await;
            }
        }
        self.end_tenancy(m, None).await
    }

    /// The forced release (docs/security.md): first recorded (ledger entry with the reason, the
    /// usage segment closed: the machine leaves the tenant's control at this moment), then the
    /// power-off through the BMC, then the Node and its Lease deleted best effort, then cleaning;
    /// a failed power-off ends the tenancy in maintenance with `release_power_off_failed`. Each
    /// step is idempotent, so a crash anywhere repeats it harmlessly.
    async fn force_release(&self, bmc: &dyn BmcDriver, m: &Machine, forcing: Forcing) -> Step {
        if let Some((reason, evidence)) = forcing.describe(m, self.settings.release_timeout) {
            tracing::warn!(machine.id = %m.id, "forcing the release of machine {}: {reason}", m.id);
            let (id, state, version) = (m.id, m.state, m.status_version);
            return self
                .guarded(m.id, move |c, k| {
                    async move { lifecycle::record_forced_release(c, k, id, state, version, &reason, &evidence).await }
                        .boxed()
                })
                .await;
        }
        let powered_off = match self.access(m) {
            Ok(access) if access.system_uuid.is_none() => Ok(()),
            Ok(access) => bmc.power_off(&access).await.map_err(|e| {
                metrics::driver_failed(Driver::Bmc, &e.code);
                tracing::error!(machine.id = %m.id, error = %e, "the forced release could not power machine {} off", m.id);
                format!("the BMC did not power the machine off ({}): {}", e.code, e.message)
            }),
            Err(_) => Err("the BMC password cannot be opened, so the machine could not be powered off".to_owned()),
        };
        self.abandon_node(m).await;
        match powered_off {
            Ok(()) => self.end_tenancy(m, None).await,
            Err(message) => self.end_tenancy(m, Some((RELEASE_POWER_OFF_FAILED, &message))).await,
        }
    }

    /// Deletes the machine's Node and its Lease, best effort and bounded in time: a tenant API
    /// server that refuses or does not answer no longer holds the machine.
    async fn abandon_node(&self, m: &Machine) {
        let Some(kube) = self.drivers.kube.clone() else { return };
        let (tenant, node) = match self.tenant_side(m).await {
            Ok(Some(found)) => found,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(machine.id = %m.id, error = %e, "the forced release skips the node of machine {}", m.id);
                return;
            }
        };
        match tokio::time::timeout(ABANDON_BOUND, kube.nodes.abandon_node(&tenant, &node)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                metrics::driver_failed(Driver::Kube, &e.code);
                tracing::warn!(
                    machine.id = %m.id,
                    error = %e,
                    "the forced release could not delete node {} of machine {}; it goes on",
                    node.node_name,
                    m.id
                );
            }
            Err(_) => tracing::warn!(
                machine.id = %m.id,
                "the tenant API server did not answer the forced release's deletes of node {} within {ABANDON_BOUND:?}",
                node.node_name
            ),
        }
    }

    /// Ends the tenancy (guarded): its run's unused tokens end, then cleaning, or maintenance
    /// with `failure` (code, message).
    async fn end_tenancy(&self, m: &Machine, failure: Option<(&str, &str)>) -> Step {
        let (id, state, version) = (m.id, m.state, m.status_version);
        let failure = failure.map(|(code, message)| (code.to_owned(), message.to_owned()));
        self.guarded(m.id, move |c, k| {
            async move {
                if let Some(current) = run::run_of(c, id).await? {
                    run::expire_unused_tokens(c, current.run_id).await?;
                }
                match &failure {
                    None => lifecycle::finish_release(c, k, id, state, version).await,
                    Some((code, message)) => {
                        let failure = (code.as_str(), message.as_str());
                        lifecycle::end_tenancy_in_maintenance(c, k, id, state, version, failure).await
                    }
                }
            }
            .boxed()
        })
        .await
    }

    /// Drains and removes the machine's node; `Some` to stop (waiting, or a failure).
    async fn release_node(
        &self,
        kube: &KubeDrivers,
        m: &Machine,
        tenant: &TenantAccess,
        node: &NodeRef,
    ) -> Option<Step> {
        let slurm = {
            let mut conn = match self.services.store().conn().await {
                Ok(c) => c,
                Err(e) => return Some(e.into()),
            };
            let (Some(t), Some(c)) = (m.tenant_id, m.cluster_id) else { return None };
            match cluster::get(&mut conn, t, c, false).await {
                Ok(found) => found.is_some_and(|c| c.spec.kind == ClusterKind::Slurm),
                Err(e) => return Some(e.into()),
            }
        };
        if slurm && m.node_name.is_some() {
            match kube.slurm.drain_node(tenant, &node.node_name).await {
                Ok(true) => {}
                Ok(false) => {
                    let message = "draining the Slurm node before the machine is released";
                    return Some(Step::Stop(Outcome::wait(self.settings.poll, "draining", message)));
                }
                Err(e) => return Some(self.driver_failed(m, e).await),
            }
        }
        match kube.nodes.remove_node(tenant, node).await {
            Ok(Removal::Gone) => None,
            Ok(Removal::Deleting) => {
                Some(Step::Stop(Outcome::wait(self.settings.poll, "removing_node", "waiting for the node to go")))
            }
            Err(e) => Some(self.driver_failed(m, e).await),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Shared pieces.

    /// Issues the run's token and boots the machine from `image` with the run's seed; then
    /// records the boot. The tokens of an earlier boot of the same run end first.
    #[expect(clippy::too_many_arguments, reason = "one boot: the machine, its BMC, its run and what it boots")]
    async fn boot(
        &self,
        bmc: &dyn BmcDriver,
        m: &Machine,
        access: &BmcAccess,
        run: &Run,
        purpose: AgentPurpose,
        config: serde_json::Value,
        image_url: String,
    ) -> Step {
        // Issuing the boot's token ends the unused ones of the run's earlier boots.
        let agent_run = AgentRun { machine_id: m.id, run_id: run.run_id, purpose, config };
        let seed_token = match self.services.agent_token_issue(&agent_run, self.settings.agent_token_ttl).await {
            Ok(t) => t,
            Err(e) => return Step::Stop(Outcome::retry("agent_token", format!("issuing the run's token failed: {e}"))),
        };
        let media = BootMedia { image_url, seed_url: self.services.agent_seed_url(&seed_token) };
        // A wipe's boot does not wait for the power: the power-off before the media
        // ends the run until it is through, the power-on is settled by the next runs.
        let booted = match purpose {
            AgentPurpose::Wipe => bmc.start_boot_from_media(access, &media).await,
            _ => bmc.boot_from_media(access, &media).await.map(|()| PowerProgress::Done),
        };
        match booted {
            Ok(PowerProgress::Done) => {}
            Ok(PowerProgress::Pending(after)) => {
                return Step::Stop(Outcome::wait(after, POWERING, "the machine is powering off before its boot"))
            }
            Err(e) => return self.bmc_failed(m, e).await,
        }
        let (state, version) = (m.state, m.status_version);
        self.guarded(m.id, |c, _| run::mark_booted(c, m.id, state, version).boxed()).await
    }

    async fn expire_tokens(&self, current: &Run) -> Result<(), StoreError> {
        let mut conn = self.services.store().conn().await?;
        run::expire_unused_tokens(&mut conn, current.run_id).await
    }

    /// Ends the machine's run (guarded), moving it to `to` with `error` (code, message); a wipe
    /// that ends in `clean_failed` is counted once the move committed.
    async fn end_run(
        &self,
        m: &Machine,
        to: MachineState,
        error: Option<(&str, &str)>,
        maintenance_reason: Option<&str>,
    ) -> Step {
        let (id, from, version) = (m.id, m.state, m.status_version);
        let code = error.map_or("clean_failed", |(code, _)| code);
        let error = error.map(|(code, message)| (code.to_owned(), message.to_owned()));
        let reason = maintenance_reason.map(str::to_owned);
        self.guarded_then(
            m.id,
            move |c, k| {
                async move {
                    let error = error.as_ref().map(|(code, message)| (code.as_str(), message.as_str()));
                    lifecycle::end_run(c, k, id, from, version, to, error, reason.as_deref()).await
                }
                .boxed()
            },
            |moved| {
                if moved && to == MachineState::CleanFailed {
                    metrics::observe(|w| w.wipe_failed(&m.machine_class, code));
                }
            },
        )
        .await
    }

    /// The tenant side of a machine that holds a tenancy: how to reach its cluster's API, and
    /// its node there. `None` until the control plane published its endpoint and kubeconfig.
    async fn tenant_side(&self, m: &Machine) -> Result<Option<(TenantAccess, NodeRef)>, StoreError> {
        let (Some(tenant), Some(cluster_id), Some(pool_id)) = (m.tenant_id, m.cluster_id, m.node_pool_id) else {
            return Ok(None);
        };
        // One transaction: one consistent view, one commit.
        let mut tx = self.services.store().begin().await?;
        let Some(c) = cluster::get(&mut tx, tenant, cluster_id, false).await? else {
            return Ok(None);
        };
        let Some(pool) = node_pool::get(&mut tx, tenant, cluster_id, pool_id, false).await? else {
            return Ok(None);
        };
        let Some(reference) = cluster_ref(&mut tx, tenant, cluster_id, &c.spec.name).await? else {
            return Ok(None);
        };
        let endpoint = c.status.endpoints.kubernetes_api.clone();
        let access = tenant_access(&mut tx, self.services.cipher(), reference, endpoint.as_deref()).await?;
        tx.commit().await?;
        let Some(access) = access else {
            return Ok(None);
        };
        let node = NodeRef {
            machine_id: m.id,
            node_pool_id: pool.id,
            pool_name: pool.spec.name.clone(),
            node_name: m.node_name.clone().unwrap_or_else(|| node_name(m.id)),
            system_uuid: m.system_uuid.clone().unwrap_or_default(),
            labels: pool.spec.labels.clone(),
            taints: pool.spec.taints.clone(),
        };
        Ok(Some((access, node)))
    }

    /// The machine's BMC access with its password opened; a password that cannot be opened
    /// waits for new credentials.
    #[expect(clippy::result_large_err, reason = "the error is the reconciler's next step, returned as is")]
    fn access(&self, m: &Machine) -> Result<BmcAccess, Step> {
        let password = self
            .services
            .cipher()
            .open(&m.bmc.password_enc, password_binding(m))
            .map_err(|e| format!("the BMC password cannot be opened ({e}); patch the credentials"))
            .and_then(|bytes| String::from_utf8(bytes).map_err(|_| "the BMC password is not UTF-8".to_owned()));
        match password {
            Ok(p) => Ok(BmcAccess {
                machine_id: m.id,
                url: m.bmc.url.clone(),
                system_id: m.bmc.system_id.clone(),
                username: m.bmc.username.clone(),
                password: SecretString::new(p),
                ca_cert: m.bmc.ca_cert.clone(),
                insecure_tls: m.bmc.insecure_tls,
                system_uuid: m.system_uuid.clone(),
            }),
            Err(message) => {
                // Recorded by the caller's next step; a long wait, no retry storm.
                Err(Step::Stop(Outcome::wait(BMC_FIX_WAIT, "bmc_password_unreadable", message)))
            }
        }
    }

    /// Records `code` on the machine (guarded) and waits long: only a spec change fixes it.
    async fn wait_for_fix(&self, m: &Machine, code: &str, message: &str) -> Step {
        self.wait_with(m, BMC_FIX_WAIT, code, message).await
    }

    /// Records `code` on the machine (guarded) and waits `after`.
    async fn wait_with(&self, m: &Machine, after: Duration, code: &str, message: &str) -> Step {
        if let Err(e) = self.record_error(m, code, message).await {
            return e.into();
        }
        Step::Stop(Outcome::wait(after, code, message))
    }

    async fn bmc_failed(&self, m: &Machine, e: BmcError) -> Step {
        use MachineState as S;
        metrics::driver_failed(Driver::Bmc, &e.code);
        // A BMC that cannot do what the lifecycle needs, or another system behind the BMC:
        // out of service with the reason, through the path the state allows.
        if e.code == NO_SECOND_VIRTUAL_MEDIA || e.code == SYSTEM_UUID_MISMATCH {
            let reason =
                if e.code == NO_SECOND_VIRTUAL_MEDIA { NO_SECOND_VIRTUAL_MEDIA.to_owned() } else { e.message.clone() };
            match m.state {
                S::Cleaning | S::Enrolling | S::Inspecting => {
                    return self.end_run(m, S::Maintenance, Some((&e.code, &e.message)), Some(&reason)).await;
                }
                S::Allocated | S::Provisioning => return self.provision_failed(m, &e.code, &e.message).await,
                _ => {}
            }
        }
        match e.kind {
            // A retry cannot help: wait for the credentials or system_id PATCH (which enqueues
            // a new job) and look again only after a long while.
            BmcErrorKind::AuthFailed
            | BmcErrorKind::AmbiguousSystem
            | BmcErrorKind::CapabilityGap
            | BmcErrorKind::Permanent => {
                // The open operations cannot get further without that fix: they end `failed`
                // with the BMC's problem (the PATCH that fixes it opens its own).
                if let Err(se) = self.fail_operations(m, &e).await {
                    return se.into();
                }
                self.wait_for_fix(m, &e.code, &e.message).await
            }
            BmcErrorKind::Transient => {
                if let Err(se) = self.record_error(m, &e.code, &e.message).await {
                    return se.into();
                }
                Step::Stop(Outcome::retry(e.code, e.message))
            }
        }
    }

    async fn driver_failed(&self, m: &Machine, e: DriverError) -> Step {
        metrics::driver_failed(Driver::Kube, &e.code);
        if let Err(se) = self.record_error(m, &e.code, &e.message).await {
            return se.into();
        }
        if e.is_transient() {
            Step::Stop(Outcome::retry(e.code, e.message))
        } else {
            Step::Stop(Outcome::wait(self.settings.poll.max(Duration::from_secs(60)), e.code, e.message))
        }
    }

    async fn fail_operations(&self, m: &Machine, e: &BmcError) -> Result<(), StoreError> {
        let mut conn = self.services.store().conn().await?;
        let problem = crate::failed_problem(409, e.code.clone(), format!("the machine's BMC: {}", e.message));
        paddock_store::operation::fail_open(&mut conn, &[m.id.uuid()], &problem).await
    }

    async fn record_error(&self, m: &Machine, code: &str, message: &str) -> Result<(), StoreError> {
        let mut conn = self.services.store().conn().await?;
        let error = LastError { code: code.to_owned(), message: message.to_owned(), at: Utc::now() };
        // Guarded: a machine someone else moved on keeps its own status.
        machine::set_last_error_guarded(&mut conn, m.id, m.state, m.status_version, Some(&error)).await?;
        Ok(())
    }
}

/// Why a release is forced.
enum Forcing {
    /// An operator asked (`force-release`), with this reason.
    Operator(String),
    /// The release started at this moment and outlasted `PADDOCK_RELEASE_TIMEOUT`.
    Timeout(DateTime<Utc>),
    /// Recorded already: carry it out.
    Recorded,
}

impl Forcing {
    /// The ledger reason and evidence of a forcing still to record; `None` once recorded.
    fn describe(&self, m: &Machine, timeout: Duration) -> Option<(String, serde_json::Value)> {
        let last_error = m.last_error.as_ref().map(|e| json!({ "code": e.code, "message": e.message }));
        match self {
            Forcing::Recorded => None,
            Forcing::Operator(reason) => Some((
                format!("release forced by an operator: {reason}"),
                json!({ "cause": "operator", "operator_reason": reason, "last_error": last_error }),
            )),
            Forcing::Timeout(started_at) => Some((
                format!(
                    "release forced: not finished within PADDOCK_RELEASE_TIMEOUT ({} s) of its start",
                    timeout.as_secs()
                ),
                json!({
                    "cause": "release_timeout", "release_started_at": started_at,
                    "timeout_seconds": timeout.as_secs(), "last_error": last_error,
                }),
            )),
        }
    }
}

/// A step that waits no longer than until `deadline` (and at least a second: no busy loop).
fn cap_wait(step: Step, deadline: DateTime<Utc>) -> Step {
    match step {
        Step::Stop(Outcome::Wait { after, reason, cause }) => {
            let left = (deadline - Utc::now()).to_std().unwrap_or_default().max(Duration::from_secs(1));
            Step::Stop(Outcome::Wait { after: after.min(left), reason, cause })
        }
        other => other,
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
async fn power_off_best_effort(bmc: &dyn BmcDriver, access: &BmcAccess) {
    if let Err(e) = bmc.finish_boot(access, AfterBoot::PowerOff).await {
        metrics::driver_failed(Driver::Bmc, &e.code);
    }
}

/// The drives a wipe lists: every drive of the inventory with what the BMC reported of it.
fn wipe_drives(inventory: &serde_json::Value) -> Vec<WipeDrive> {
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

/// A provisioning boot's `config` (docs/security.md): the join configuration's contract keys at the
/// top (`api_endpoint`, `ca_cert`, `ca_cert_hash`, `bootstrap_token`), the node's name, and the
/// driver's whole join configuration under `join`.
fn provision_config(node_name: &str, join: serde_json::Value) -> serde_json::Value {
    let mut config = json!({ "node_name": node_name });
    for key in ["api_endpoint", "ca_cert", "ca_cert_hash", "bootstrap_token"] {
        config[key] = join[key].clone();
    }
    config["join"] = join;
    config
}

fn ttl(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

impl JobHandler for MachineReconciler {
    fn kind(&self) -> &'static str {
        MACHINE_RECONCILE
    }

    fn run<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        async move {
            let outcome =
                super::patient(self.reconcile(MachineId(job.target_id)).await, job, self.settings.outage_wait);
            match (&outcome, job.operation_id) {
                (Outcome::Done, Some(operation)) => self.judge(MachineId(job.target_id), operation).await,
                _ => outcome,
            }
        }
        .boxed()
    }
}

impl MachineReconciler {
    /// A converged machine ends its operation. An enrollment or a return from maintenance is
    /// meant to make the machine available: ending quarantined (`clean_failed`) fails it, with
    /// the machine's own error as the problem.
    async fn judge(&self, id: MachineId, operation: paddock_types::OperationId) -> Outcome {
        let found = async {
            let mut conn = self.services.store().conn().await?;
            let op = paddock_store::operation::get(&mut conn, None, operation).await?;
            let m = machine::get(&mut conn, id, false).await?;
            Ok::<_, StoreError>((op, m))
        }
        .await;
        match found {
            Ok((Some(op), Some(m))) if m.duplicate_of.is_some() && op.kind == "machine_enroll" => {
                let message = m.last_error.map(|e| e.message).unwrap_or_default();
                Outcome::fail_with_status(409, DUPLICATE_SYSTEM, message)
            }
            Ok((Some(op), Some(m)))
                if m.state == MachineState::CleanFailed
                    && matches!(op.kind.as_str(), "machine_enroll" | "machine_maintenance_leave") =>
            {
                let (code, message) = m.last_error.map_or_else(
                    || ("clean_failed".to_owned(), "the machine's wipe failed".to_owned()),
                    |e| (e.code, e.message),
                );
                Outcome::fail_with_status(409, code, format!("the machine is quarantined (clean_failed): {message}"))
            }
            Ok(_) => Outcome::Done,
            Err(e) => store_error(e),
        }
    }
}
