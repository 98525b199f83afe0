//! The reconcile handlers of machines and clusters. They are the jobs' entry points: each run
//! starts from the top, re-reads the record, and converges it step by step through the drivers.
//!
//! No driver exists in this build yet (`PADDOCK_BMC_DRIVER` and `PADDOCK_KUBE_DRIVER` can only be
//! `none`), so today every run ends the way SPEC section 9 prescribes for a missing driver: the
//! job waits, the machine shows `last_error.code = driver_not_configured` and the cluster a
//! `Ready=False` condition with reason `DriverNotConfigured`. The operation stays running. The
//! steps come with the drivers, behind traits, in these handlers.

use std::time::Duration;

use chrono::Utc;
use futures::future::BoxFuture;
use futures::FutureExt;
use paddock_domain::job_kind::{CLUSTER_RECONCILE, MACHINE_RECONCILE};
use paddock_store::{cluster, machine, Store};
use paddock_types::machine::LastError;
use paddock_types::{ClusterId, MachineId, TenantId};

use crate::{Job, JobHandler, Outcome};

/// How long a job without a driver waits before it looks again. Configuring a driver means
/// restarting the workers; a waiting job then runs at the latest this much later.
pub const DRIVER_WAIT: Duration = Duration::from_secs(300);

const DRIVER_NOT_CONFIGURED: &str = "driver_not_configured";

fn store_error(e: paddock_store::StoreError) -> Outcome {
    Outcome::retry("database", format!("{e}"))
}

/// Converges machines.
#[derive(Debug, Clone)]
pub struct MachineReconciler {
    store: Store,
}

impl MachineReconciler {
    /// A reconciler over `store`.
    pub fn new(store: Store) -> Self {
        Self { store }
    }

    async fn reconcile(&self, id: MachineId) -> Outcome {
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
