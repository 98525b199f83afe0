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
//! a release (`releasing`). From there this reconciler drains the node (Slurm, then the Node by
//! eviction), powers the machine off, deletes the Node, its Lease and the machine's bootstrap
//! tokens, and ends the tenancy in `cleaning`, which wipes it again before anyone else gets it.
//! A release that outlasts `PADDOCK_RELEASE_TIMEOUT`, or one an operator forces, is forced: the
//! forcing is recorded (billing stops there), the machine powered off, its Node, Lease and tokens
//! deleted best effort, and it goes on to cleaning (to maintenance, `release_power_off_failed`,
//! when the power-off fails).
//! Operator intents: `maintenance_reason` set = take it out of service (a machine that holds a
//! tenancy is released first), cleared while in maintenance = leave through cleaning;
//! `retire_requested` = retire once it is available, in maintenance or clean_failed.
//!
//! The steps live beside their part of the lifecycle: `intent` (operator intents), `inspect`,
//! `clean` (the wipe), `accept` (the acceptance image after a wipe that admits a machine to the
//! fleet), `provision`, `release`, and the pieces they share: `agent_run` (agent runs and
//! their boots), `failure` (driver and store failures recorded on the machine) and `progress`
//! (where the machine is in its operation's step plan, reported before every step).

mod accept;
mod agent_run;
mod clean;
mod failure;
mod inspect;
mod intent;
mod progress;
mod provision;
mod release;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::future::BoxFuture;
use futures::FutureExt;
use paddock_domain::bmc::{BmcAccess, BmcDriver};
use paddock_domain::driver::{node_name, NodeRef, TenantAccess};
use paddock_domain::job_kind::MACHINE_RECONCILE;
use paddock_domain::ledger::LedgerKey;
use paddock_domain::machine::{DUPLICATE_SYSTEM, HELD, RETIRABLE};
use paddock_domain::model::Machine;
use paddock_domain::secret::SecretString;
use paddock_service::Services;
use paddock_store::run::Run;
use paddock_store::{cluster, machine, node_pool, StoreError, Tx};
use paddock_types::machine::{LastError, MachineState};
use paddock_types::MachineId;

use super::{
    cluster_ref, password_binding, store_error, tenant_access, Drivers, Settings, DRIVER_NOT_CONFIGURED, DRIVER_WAIT,
};
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
            if machine::get(&mut conn, id).await?.is_none() {
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
            if let Err(e) = self.report(&current, &progress::position(&current, run.as_ref())).await {
                return store_error(e);
            }
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
        F: for<'c> FnOnce(&'c mut Tx, &'c LedgerKey) -> BoxFuture<'c, Result<bool, StoreError>>,
    {
        self.guarded_then(id, write, |_| ()).await
    }

    /// [`Self::guarded`], then `committed` with what the write returned once its transaction
    /// committed: what a metric may observe (never a write that was lost or rolled back).
    async fn guarded_then<T, F>(&self, id: MachineId, write: F, committed: impl FnOnce(T) + Send) -> Step
    where
        F: for<'c> FnOnce(&'c mut Tx, &'c LedgerKey) -> BoxFuture<'c, Result<T, StoreError>>,
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

    /// The tenant side of a machine that holds a tenancy: how to reach its cluster's API, and
    /// its node there. `None` until the control plane published its endpoint and kubeconfig.
    async fn tenant_side(&self, m: &Machine) -> Result<Option<(TenantAccess, NodeRef)>, StoreError> {
        let (Some(tenant), Some(cluster_id), Some(pool_id)) = (m.tenant_id, m.cluster_id, m.node_pool_id) else {
            return Ok(None);
        };
        // One transaction: one consistent view, one commit.
        let mut tx = self.services.store().begin().await?;
        let Some(c) = cluster::get(&mut tx, tenant, cluster_id).await? else {
            return Ok(None);
        };
        let Some(pool) = node_pool::get(&mut tx, tenant, cluster_id, pool_id).await? else {
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
}

/// Whether an operation of `kind` is meant to make its machine available (an enrollment, a
/// return from maintenance).
fn admitting(kind: &str) -> bool {
    matches!(kind, "machine_enroll" | "machine_maintenance_leave")
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
            let m = machine::get(&mut conn, id).await?;
            Ok::<_, StoreError>((op, m))
        }
        .await;
        match found {
            Ok((Some(op), Some(m))) if m.duplicate_of.is_some() && op.kind == "machine_enroll" => {
                let message = m.last_error.map(|e| e.message).unwrap_or_default();
                Outcome::fail_with_status(409, DUPLICATE_SYSTEM, message)
            }
            Ok((Some(op), Some(m))) if admitting(&op.kind) && accept::failed(&m) => {
                let (code, message) = m.last_error.map(|e| (e.code, e.message)).unwrap_or_default();
                let message = format!("the machine did not pass its acceptance and is in maintenance: {message}");
                Outcome::fail_with_status(409, code, message)
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
