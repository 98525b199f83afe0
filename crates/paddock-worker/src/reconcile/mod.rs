//! The reconcile handlers of machines and clusters, and the power sync of machines at rest: the jobs' entry points. Each run starts from
//! the top, re-reads the records, and converges them step by step through the drivers; every
//! status write is guarded on the version read before it, so a run that lost a race re-reads, and
//! a run repeated after a crash (at any await point) converges to the same result.
//!
//! Without a driver (`PADDOCK_BMC_DRIVER` / `PADDOCK_KUBE_DRIVER` = `none`), every run ends the way
//! docs/configuration.md describes: the job waits, the machine shows
//! `last_error.code = driver_not_configured` and the cluster a `Ready=False` condition with
//! reason `DriverNotConfigured`; the API still serves.

mod cluster;
mod machine;
mod power;
mod reseal;

use std::sync::Arc;
use std::time::Duration;

pub use cluster::{Autoscaler, ClusterReconciler, DriftCheck, IdentitySync};
pub use machine::{MachineReconciler, BMC_FIX_WAIT, RELEASE_POWER_OFF_FAILED};
use paddock_domain::bmc::BmcDriver;
use paddock_domain::driver::{ClusterRef, KubeDrivers, ServiceType};
use paddock_domain::model::Machine;
use paddock_domain::secret::Binding;
pub use power::{PowerCycle, PowerSync, PowerSyncSettings, POWER_DRIFT};
pub use reseal::Resealer;
// How the worker reaches a tenant cluster: the one mechanism, shared with the API.
pub(crate) use paddock_service::credentials::{access, kubeconfig_binding, open_access, tenant_access};
use paddock_store::{tenant, Conn, StoreError};
use paddock_types::{ClusterId, TenantId};

use crate::Outcome;

/// How long a job without a driver waits before it looks again. Configuring a driver means
/// restarting the workers; a waiting job then runs at the latest this much later.
pub const DRIVER_WAIT: Duration = Duration::from_secs(300);

pub(crate) const DRIVER_NOT_CONFIGURED: &str = "driver_not_configured";

/// The drivers the reconcilers use; `None` = `none`.
#[derive(Clone, Default)]
pub struct Drivers {
    /// The BMC driver (`PADDOCK_BMC_DRIVER`).
    pub bmc: Option<Arc<dyn BmcDriver>>,
    /// The cluster-side drivers (`PADDOCK_KUBE_DRIVER`).
    pub kube: Option<KubeDrivers>,
}

impl std::fmt::Debug for Drivers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drivers").field("bmc", &self.bmc.is_some()).field("kube", &self.kube.is_some()).finish()
    }
}

/// Settings of the machine lifecycle and the cluster reconciler.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The provider's wipe image (`PADDOCK_WIPE_IMAGE_URL`).
    pub wipe_image_url: Option<String>,
    /// The node OS image (`PADDOCK_OS_IMAGE_URL`).
    pub os_image_url: Option<String>,
    /// Lifetime of agent tokens (`PADDOCK_AGENT_TOKEN_TTL`); also how long a booted machine may
    /// take to report before its run counts as timed out.
    pub agent_token_ttl: Duration,
    /// Lifetime of a node's bootstrap token (`PADDOCK_JOIN_TOKEN_TTL`); deleted earlier, as soon
    /// as the Node has registered.
    pub join_token_ttl: Duration,
    /// How long a release may wait for the Slurm drain and the Node's removal before it is forced
    /// (`PADDOCK_RELEASE_TIMEOUT`).
    pub release_timeout: Duration,
    /// How long a provisioned machine may take to show up as a Ready node.
    pub node_join_timeout: Duration,
    /// How often a run that waits for the outside world (a control plane coming up, a node
    /// joining, a namespace terminating) looks again.
    pub poll: Duration,
    /// How long a run waiting for an agent's report sleeps at most: the report wakes the job at
    /// once, this is the fallback.
    pub report_wait: Duration,
    /// API server replicas of a tenant control plane.
    pub control_plane_replicas: u32,
    /// How tenant API servers are exposed.
    pub service_type: ServiceType,
    /// How long a reconcile job waits between tries once its quick retries are spent
    /// ([`OUTAGE_WAIT`]; tests shorten it).
    pub outage_wait: Duration,
    /// How long a waiting allocation may hold back later ones of its class
    /// (`PADDOCK_ALLOCATION_HEAD_TIMEOUT`).
    pub allocation_head_timeout: Duration,
    /// How often a ready cluster is checked for drift (`PADDOCK_DRIFT_INTERVAL`; zero: never).
    pub drift_interval: Duration,
    /// How long an active machine's Node may be not Ready before that is a `failed` health
    /// report (`PADDOCK_NODE_NOT_READY_GRACE`).
    pub node_not_ready_grace: Duration,
    /// How often the demand of a cluster's autoscaled pools is read (`PADDOCK_AUTOSCALE_INTERVAL`).
    pub autoscale_interval: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            wipe_image_url: None,
            os_image_url: None,
            agent_token_ttl: Duration::from_secs(21_600),
            join_token_ttl: Duration::from_secs(900),
            release_timeout: Duration::from_secs(1800),
            node_join_timeout: Duration::from_secs(900),
            poll: Duration::from_secs(5),
            report_wait: Duration::from_secs(60),
            control_plane_replicas: 2,
            service_type: ServiceType::LoadBalancer,
            outage_wait: OUTAGE_WAIT,
            allocation_head_timeout: Duration::from_secs(600),
            drift_interval: Duration::from_secs(600),
            node_not_ready_grace: Duration::from_secs(300),
            autoscale_interval: Duration::from_secs(AUTOSCALE_INTERVAL_DEFAULT),
        }
    }
}

/// Default of `PADDOCK_AUTOSCALE_INTERVAL`, seconds.
pub const AUTOSCALE_INTERVAL_DEFAULT: u64 = 15;

/// Failed attempts after which a reconciler stops retrying with backoff and waits
/// [`OUTAGE_WAIT`] between tries instead.
pub const QUICK_RETRIES: u32 = 5;

/// How long a reconcile job waits between tries once its quick retries are spent.
pub const OUTAGE_WAIT: Duration = Duration::from_secs(300);

/// A reconciler never gives up on a transient failure: a BMC or an API server may be gone for an
/// hour, and a machine half way through a wipe or a cluster half way through its deletion must
/// carry on when it is back, without anyone re-queueing it. After [`QUICK_RETRIES`] failed
/// attempts a retry becomes a wait (which uses up no attempt, so the job never fails for it);
/// the last error stays on the job and on the machine or cluster.
fn patient(outcome: Outcome, job: &crate::Job, wait: Duration) -> Outcome {
    match outcome {
        Outcome::Retry { error, cause } if job.attempts + 1 >= QUICK_RETRIES => {
            Outcome::Wait { after: wait, reason: error, cause }
        }
        other => other,
    }
}

/// A failed database call: retried, its message the store error's own (no cause in it), the
/// error kept whole for the log.
fn store_error(e: StoreError) -> Outcome {
    Outcome::retry_because("database", e.to_string(), e)
}

/// The binding of a machine's sealed BMC password.
pub(crate) fn password_binding(m: &Machine) -> Binding<'static> {
    Binding { table: "machines", column: "bmc_password_enc", row: m.id.uuid() }
}

/// The cluster's reference for the drivers (names for people, ids for everything else); `None`
/// when the cluster or its tenant is gone.
pub(crate) async fn cluster_ref(
    conn: &mut Conn,
    tenant_id: TenantId,
    cluster_id: ClusterId,
    cluster_name: &str,
) -> Result<Option<ClusterRef>, StoreError> {
    let Some(tenant_name) = tenant::name(conn, tenant_id).await? else {
        return Ok(None);
    };
    Ok(Some(ClusterRef { tenant_id, cluster_id, tenant_name, cluster_name: cluster_name.to_owned() }))
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use paddock_store::job::{JobError, JobState};
    use paddock_types::JobId;

    use super::*;

    fn job(attempts: u32) -> crate::Job {
        let now = Utc::now();
        crate::Job {
            id: JobId::new(),
            kind: "machine_reconcile".into(),
            target_type: "machine".into(),
            target_id: uuid::Uuid::now_v7(),
            payload: serde_json::json!({}),
            tenant_id: None,
            operation_id: None,
            state: JobState::Running,
            attempts,
            run_at: now,
            locked_by: Some("w".into()),
            locked_until: Some(now),
            started_at: Some(now),
            last_error: None,
            created_at: now,
            updated_at: now,
            finished_at: None,
        }
    }

    #[test]
    fn transient_failures_retry_quickly_then_wait_without_ever_failing_the_job() {
        let retry = || Outcome::Retry { error: JobError::new("bmc_unreachable", "gone"), cause: None };
        for attempts in 0..QUICK_RETRIES - 1 {
            assert!(
                matches!(patient(retry(), &job(attempts), OUTAGE_WAIT), Outcome::Retry { .. }),
                "attempt {attempts}"
            );
        }
        for attempts in [QUICK_RETRIES - 1, QUICK_RETRIES, 50] {
            match patient(retry(), &job(attempts), OUTAGE_WAIT) {
                Outcome::Wait { after, reason, .. } => {
                    assert_eq!(after, OUTAGE_WAIT);
                    assert_eq!(reason.code, "bmc_unreachable");
                }
                other => panic!("attempt {attempts}: {other:?}"),
            }
        }
        // Anything but a retry passes through untouched.
        assert!(matches!(patient(Outcome::Done, &job(50), OUTAGE_WAIT), Outcome::Done));
        assert!(matches!(patient(Outcome::fail("x", "y"), &job(50), OUTAGE_WAIT), Outcome::Fail { .. }));
    }
}
