//! The reconcile handlers of machines and clusters. They are the jobs' entry points: each run
//! starts from the top, re-reads the record, and converges it step by step through the drivers.
//!
//! Without a driver (`PADDOCK_BMC_DRIVER` and `PADDOCK_KUBE_DRIVER` can only be `none` in this
//! build), every run ends the way SPEC section 9 prescribes for a missing driver: the job waits,
//! the machine shows `last_error.code = driver_not_configured` and the cluster a `Ready=False`
//! condition with reason `DriverNotConfigured`. The operation stays running.
//!
//! With a BMC driver ([`MachineReconciler::with_bmc`], a `paddock_domain::bmc::BmcDriver`), the
//! machine reconciler runs enrollment and inspection; cleaning and later steps are not built yet
//! and wait honestly (`wipe_not_implemented`).

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::future::BoxFuture;
use futures::FutureExt;
use paddock_domain::bmc::{check_against_class, inventory_json, BmcAccess, BmcDriver, BmcError, BmcErrorKind};
use paddock_domain::job_kind::{CLUSTER_RECONCILE, MACHINE_RECONCILE};
use paddock_domain::model::Machine;
use paddock_domain::secret::{Binding, Cipher, SecretString};
use paddock_store::{cluster, machine, machine_class, Store};
use paddock_types::machine::{LastError, MachineState};
use paddock_types::{ClusterId, MachineId, TenantId};

use crate::{Job, JobHandler, Outcome};

/// How long a job without a driver waits before it looks again. Configuring a driver means
/// restarting the workers; a waiting job then runs at the latest this much later.
pub const DRIVER_WAIT: Duration = Duration::from_secs(300);

const DRIVER_NOT_CONFIGURED: &str = "driver_not_configured";

fn store_error(e: paddock_store::StoreError) -> Outcome {
    Outcome::retry("database", format!("{e}"))
}

/// How long a machine waits after an error only a spec change fixes (wrong credentials, an
/// ambiguous or unknown system): no retry storm against the BMC. The credentials PATCH enqueues a
/// new `machine_reconcile` job, so a fix is picked up at once, not after this wait.
pub const BMC_FIX_WAIT: Duration = Duration::from_secs(3600);

/// How long a machine in `cleaning` waits: the wipe flow is not built yet.
pub const WIPE_WAIT: Duration = Duration::from_secs(3600);

const WIPE_NOT_IMPLEMENTED: &str = "wipe_not_implemented";
const STEP_NOT_IMPLEMENTED: &str = "step_not_implemented";

/// The BMC side of the machine reconciler: the cipher that opens BMC passwords and the driver.
#[derive(Clone)]
struct BmcSide {
    cipher: Arc<Cipher>,
    driver: Arc<dyn BmcDriver>,
}

/// Converges machines.
///
/// Without a BMC driver ([`MachineReconciler::new`]) every run waits with
/// `last_error.code = driver_not_configured`. With one ([`MachineReconciler::with_bmc`]) it runs
/// the first lifecycle steps of SPEC section 5: a machine in `enrolling` or `inspecting` is
/// inspected through the BMC and moved on to `cleaning` (or to `maintenance` when the inventory
/// contradicts its class); a machine in `cleaning` waits (`wipe_not_implemented`).
#[derive(Clone)]
pub struct MachineReconciler {
    store: Store,
    bmc: Option<BmcSide>,
}

impl std::fmt::Debug for MachineReconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MachineReconciler").field("bmc", &self.bmc.is_some()).finish_non_exhaustive()
    }
}

/// What a step decided: stop with this outcome, or read the machine again and continue.
enum Step {
    Stop(Outcome),
    Again,
}

impl MachineReconciler {
    /// A reconciler over `store` without a BMC driver.
    pub fn new(store: Store) -> Self {
        Self { store, bmc: None }
    }

    /// A reconciler over `store` that drives machines through `bmc`, opening BMC passwords with
    /// `cipher`.
    pub fn with_bmc(store: Store, cipher: Arc<Cipher>, bmc: Arc<dyn BmcDriver>) -> Self {
        Self { store, bmc: Some(BmcSide { cipher, driver: bmc }) }
    }

    async fn reconcile(&self, id: MachineId) -> Outcome {
        match &self.bmc {
            None => self.no_driver(id).await,
            Some(bmc) => self.converge(bmc, id).await,
        }
    }

    async fn no_driver(&self, id: MachineId) -> Outcome {
        let message = "no BMC driver is configured (PADDOCK_BMC_DRIVER=none); the machine waits";
        let result = async {
            let mut conn = self.store.conn().await?;
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

    /// Runs the steps from the top; each step re-reads the machine. A lost guard (someone else
    /// moved the machine) reads again, a few times per run; the next run re-reads anyway.
    async fn converge(&self, bmc: &BmcSide, id: MachineId) -> Outcome {
        for _ in 0..6 {
            let current = {
                let mut conn = match self.store.conn().await {
                    Ok(c) => c,
                    Err(e) => return store_error(e),
                };
                match machine::get(&mut conn, id, false).await {
                    Ok(Some(m)) => m,
                    Ok(None) => return Outcome::Done,
                    Err(e) => return store_error(e),
                }
            };
            let step = match current.state {
                MachineState::Enrolling | MachineState::Inspecting => self.inspect(bmc, &current).await,
                MachineState::Cleaning => Step::Stop(Outcome::wait(
                    WIPE_WAIT,
                    WIPE_NOT_IMPLEMENTED,
                    "the machine waits in cleaning: the wipe flow is not built yet",
                )),
                MachineState::Retired => Step::Stop(Outcome::Done),
                // Held in maintenance with a reason (the operator's, or a failed inspection's):
                // nothing to do until the reason is cleared.
                MachineState::Maintenance if current.maintenance_reason.is_some() => Step::Stop(Outcome::Done),
                other => Step::Stop(Outcome::wait(
                    WIPE_WAIT,
                    STEP_NOT_IMPLEMENTED,
                    format!("no step for machines in {} is built yet", other.as_str()),
                )),
            };
            match step {
                Step::Stop(outcome) => return outcome,
                Step::Again => {}
            }
        }
        Outcome::retry("machine_contended", "the machine kept changing under the reconciler; trying again")
    }

    /// Enrolling/inspecting: read the BMC (no connection held meanwhile), record the inventory,
    /// then move on, every write guarded on the state and status version read before.
    async fn inspect(&self, bmc: &BmcSide, m: &Machine) -> Step {
        let binding = Binding { table: "machines", column: "bmc_password_enc", row: m.id.uuid() };
        let password = match bmc.cipher.open(&m.bmc.password_enc, binding) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(p) => SecretString::new(p),
                Err(_) => {
                    return self.wait_for_fix(m, "bmc_password_unreadable", "the BMC password is not UTF-8").await
                }
            },
            Err(e) => {
                let message = format!("the BMC password cannot be opened ({e}); patch the credentials");
                return self.wait_for_fix(m, "bmc_password_unreadable", &message).await;
            }
        };
        let access = BmcAccess {
            machine_id: m.id,
            url: m.bmc.url.clone(),
            system_id: m.bmc.system_id.clone(),
            username: m.bmc.username.clone(),
            password,
            ca_cert: m.bmc.ca_cert.clone(),
            insecure_tls: m.bmc.insecure_tls,
        };
        let inventory = match bmc.driver.inspect(&access).await {
            Ok(inv) => inv,
            Err(e) => return self.bmc_failed(m, e).await,
        };

        let result = async {
            let mut conn = self.store.conn().await?;
            let Some(class) = machine_class::get_by_name(&mut conn, &m.machine_class, false).await? else {
                // The class is restricted from deletion while in use: a race at most.
                return Ok(Step::Again);
            };
            // A machine that already went through enrolling knows its UUID: another system
            // answering now is a contradiction, never something to overwrite silently.
            if m.state == MachineState::Inspecting {
                if let Some(known) = &m.system_uuid {
                    if !known.eq_ignore_ascii_case(&inventory.system_uuid) {
                        let reason = format!(
                            "the BMC now reports system UUID {} but inspection recorded {known}",
                            inventory.system_uuid
                        );
                        let to = MachineState::Maintenance;
                        machine::advance(&mut conn, m.id, m.state, m.status_version, to, Some(&reason)).await?;
                        return Ok(Step::Again);
                    }
                }
            }
            let verdict = check_against_class(&inventory, &class.spec);
            let json = inventory_json(&inventory, &verdict);
            let mut version = m.status_version;
            let mut state = m.state;
            if m.system_uuid.as_deref() != Some(inventory.system_uuid.as_str()) || m.inventory != json {
                if !machine::set_inventory(&mut conn, m.id, state, version, &inventory.system_uuid, &json).await? {
                    return Ok(Step::Again);
                }
                version += 1;
            }
            if state == MachineState::Enrolling {
                if !machine::advance(&mut conn, m.id, state, version, MachineState::Inspecting, None).await? {
                    return Ok(Step::Again);
                }
                version += 1;
                state = MachineState::Inspecting;
            }
            match verdict.maintenance_reason() {
                Some(reason) => {
                    machine::advance(&mut conn, m.id, state, version, MachineState::Maintenance, Some(&reason)).await?;
                }
                None => {
                    machine::advance(&mut conn, m.id, state, version, MachineState::Cleaning, None).await?;
                }
            }
            // Whether it moved or lost a race, the next step reads the machine again.
            Ok::<_, paddock_store::StoreError>(Step::Again)
        }
        .await;
        result.unwrap_or_else(|e| Step::Stop(store_error(e)))
    }

    /// Records `code` on the machine (guarded) and waits long: only a spec change fixes it.
    async fn wait_for_fix(&self, m: &Machine, code: &str, message: &str) -> Step {
        if let Err(e) = self.record_error(m, code, message).await {
            return Step::Stop(store_error(e));
        }
        Step::Stop(Outcome::wait(BMC_FIX_WAIT, code, message))
    }

    async fn bmc_failed(&self, m: &Machine, e: BmcError) -> Step {
        match e.kind {
            // A retry cannot help: wait for the credentials or system_id PATCH (which enqueues
            // a new job) and look again only after a long while.
            BmcErrorKind::AuthFailed
            | BmcErrorKind::AmbiguousSystem
            | BmcErrorKind::CapabilityGap
            | BmcErrorKind::Permanent => self.wait_for_fix(m, &e.code, &e.message).await,
            BmcErrorKind::Transient => {
                if let Err(se) = self.record_error(m, &e.code, &e.message).await {
                    return Step::Stop(store_error(se));
                }
                Step::Stop(Outcome::retry(e.code, e.message))
            }
        }
    }

    async fn record_error(&self, m: &Machine, code: &str, message: &str) -> Result<(), paddock_store::StoreError> {
        let mut conn = self.store.conn().await?;
        let error = LastError { code: code.to_owned(), message: message.to_owned(), at: Utc::now() };
        // Guarded: a machine someone else moved on keeps its own status.
        machine::set_last_error_guarded(&mut conn, m.id, m.state, m.status_version, Some(&error)).await?;
        Ok(())
    }
}

impl JobHandler for MachineReconciler {
    fn kind(&self) -> &'static str {
        MACHINE_RECONCILE
    }

    fn run<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        self.reconcile(MachineId(job.target_id)).boxed()
    }
}

/// Converges clusters and their node pools.
#[derive(Debug, Clone)]
pub struct ClusterReconciler {
    store: Store,
}

impl ClusterReconciler {
    /// A reconciler over `store`.
    pub fn new(store: Store) -> Self {
        Self { store }
    }

    async fn reconcile(&self, tenant: TenantId, id: ClusterId) -> Outcome {
        let message = "no Kubernetes driver is configured (PADDOCK_KUBE_DRIVER=none); the cluster waits";
        let result = async {
            let mut conn = self.store.conn().await?;
            // A lost race on the status guard means another writer moved on: read again, once
            // per attempt (the next run re-reads anyway).
            for _ in 0..3 {
                let Some(current) = cluster::get(&mut conn, tenant, id, false).await? else {
                    return Ok(false);
                };
                let mut conditions = current.status.conditions.clone();
                let now = Utc::now();
                if !paddock_domain::cluster::set_condition(
                    &mut conditions,
                    "Ready",
                    "False",
                    "DriverNotConfigured",
                    message,
                    now,
                ) {
                    return Ok(true);
                }
                if cluster::set_conditions(&mut conn, tenant, id, current.status_version, &conditions).await? {
                    return Ok(true);
                }
            }
            Ok(true)
        }
        .await;
        match result {
            Ok(false) => Outcome::Done,
            Ok(true) => Outcome::wait(DRIVER_WAIT, DRIVER_NOT_CONFIGURED, message),
            Err(e) => store_error(e),
        }
    }
}

impl JobHandler for ClusterReconciler {
    fn kind(&self) -> &'static str {
        CLUSTER_RECONCILE
    }

    fn run<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        let tenant = job.payload.get("tenant_id").and_then(|v| v.as_str()).and_then(|s| s.parse().ok());
        match tenant {
            Some(tenant) => self.reconcile(TenantId(tenant), ClusterId(job.target_id)).boxed(),
            None => async { Outcome::fail("bad_job", "the job's payload lacks the cluster's tenant_id") }.boxed(),
        }
    }
}
