//! The identity sync of a `slurm` cluster ([`CLUSTER_IDENTITY_SYNC`]): the tenant's people, as
//! its identity provider pushed them over SCIM and as `slurm.accounts` maps its groups, written
//! into the cluster's Slurm accounting through the Slurm driver
//! ([`paddock_domain::slurm_identity`] decides what; the driver reads Slurm and writes the
//! difference, so a run at rest writes nothing to Slurm and one after a change behind paddock's
//! back restores it).
//!
//! Woken by every change of the tenant's people (in the change's transaction), by every run of
//! the cluster's reconciler that finds Slurm ready (a spec change, and every drift check of a
//! cluster at rest). A cluster whose Slurm is not ready yet waits for that wake-up; one that maps
//! no group and was never synced is left alone. Its result is the cluster's condition
//! `IdentitySynced` and, after a sync, `status.identity` (when, and counts: never names).

use chrono::Utc;
use futures::future::BoxFuture;
use futures::FutureExt;
use paddock_domain::cluster::{set_condition, Cluster};
use paddock_domain::driver::{DriverError, KubeDrivers, SlurmVersion, TenantAccess};
use paddock_domain::job_kind::{ClusterJob, Payload, CLUSTER_IDENTITY_SYNC};
use paddock_domain::slurm_identity::{self, GroupMembers, Slurmdb};
use paddock_store::{cluster as store, cluster_event, identity, lifecycle, StoreError};
use paddock_types::cluster::{ClusterKind, ConditionStatus};
use paddock_types::{ClusterId, TenantId};
use tracing::{info, warn};

use super::{bad_payload, ClusterReconciler, SLURM_READY};
use crate::reconcile::{cluster_ref, store_error, tenant_access};
use crate::{Job, JobHandler, Outcome};

/// The condition a sync sets.
const IDENTITY_SYNCED: &str = "IdentitySynced";

/// Most changes a cluster event names (the rest are counted).
const EVENT_NAMES: usize = 10;

/// The [`CLUSTER_IDENTITY_SYNC`] handler.
#[derive(Clone, Debug)]
pub struct IdentitySync(pub ClusterReconciler);

/// What a sync starts from.
struct Found {
    cluster: Cluster,
    access: TenantAccess,
    version: SlurmVersion,
    desired: Slurmdb,
}

impl IdentitySync {
    async fn sync(&self, tenant: TenantId, id: ClusterId) -> Outcome {
        // Without a driver the cluster's reconcile shows why nothing happens.
        let Some(kube) = self.0.drivers.kube.clone() else { return Outcome::Done };
        let found = match self.load(tenant, id).await {
            Ok(Some(found)) => found,
            Ok(None) => return Outcome::Done,
            Err(e) => return store_error(e),
        };
        match self.write(&kube, &found).await {
            Ok(outcome) => outcome,
            Err(e) => store_error(e),
        }
    }

    /// The cluster and what its Slurm should hold, in one transaction; `None` when there is
    /// nothing to sync (gone, deleting, not `slurm`, no group mapped and never synced, Slurm not
    /// ready yet, no tenant API yet).
    async fn load(&self, tenant: TenantId, id: ClusterId) -> Result<Option<Found>, StoreError> {
        let mut tx = self.0.services.store().begin().await?;
        let Some(cluster) = store::get(&mut tx, tenant, id).await? else { return Ok(None) };
        let (ClusterKind::Slurm, Some(slurm), false) = (cluster.spec.kind, &cluster.spec.slurm, cluster.deleting)
        else {
            return Ok(None);
        };
        let slurm_ready =
            cluster.status.conditions.iter().any(|c| c.type_ == SLURM_READY && c.status == ConditionStatus::True);
        if (slurm.accounts.is_empty() && cluster.status.identity.is_none()) || !slurm_ready {
            return Ok(None);
        }
        let Some(reference) = cluster_ref(&mut tx, tenant, id, &cluster.spec.name).await? else { return Ok(None) };
        let endpoint = cluster.status.endpoints.kubernetes_api.as_deref();
        let Some(access) = tenant_access(&mut tx, self.0.services.cipher(), reference, endpoint).await? else {
            return Ok(None);
        };
        let names: Vec<String> = slurm.accounts.iter().map(|a| a.group.clone()).collect();
        let groups: Vec<GroupMembers> = identity::mapped_groups(&mut tx, tenant, &names)
            .await?
            .into_iter()
            .map(|g| GroupMembers { display_name: g.display_name, members: g.members })
            .collect();
        tx.commit().await?;
        let mut desired = slurm_identity::desired(&slurm.accounts, &groups);
        desired.cancel_jobs = slurm.cancel_jobs_on_removal;
        let version = SlurmVersion { stack_version: cluster.stack_version.clone(), version: slurm.version.clone() };
        Ok(Some(Found { cluster, access, version, desired }))
    }

    /// Asks the driver to sync, and records the result.
    async fn write(&self, kube: &KubeDrivers, found: &Found) -> Result<Outcome, StoreError> {
        let Found { cluster, access, version, desired } = found;
        let (tenant, id) = (cluster.tenant_id, cluster.id);
        match kube.slurm.sync_identity(access, version, desired).await {
            Ok(changed) => {
                // The condition first: whoever sees the new counts sees it true.
                let message = "the tenant's people are in the cluster's Slurm accounting";
                self.condition(tenant, id, true, "Synced", message).await?;
                let counts = slurm_identity::counts(desired, Utc::now());
                let mut conn = self.0.services.store().conn().await?;
                store::set_identity_sync(&mut conn, tenant, id, &counts).await?;
                if !changed.is_empty() {
                    info!(cluster.id = %id, changes = changed.len(), "wrote {} change(s) to the Slurm accounting of cluster {id}", changed.len());
                    let message = event_message(&changed);
                    cluster_event::insert(&mut conn, tenant, id, "Normal", "IdentitySynced", &message).await?;
                }
                Ok(Outcome::Done)
            }
            Err(e) => {
                let chain = paddock_domain::error::chain(&e);
                warn!(cluster.id = %id, "the tenant's people could not be written to the Slurm of cluster {id}: {chain}");
                let reason = if e.code == "identity_unsupported" { "Unsupported" } else { "SyncFailed" };
                self.condition(tenant, id, false, reason, &e.message).await?;
                Ok(failed(e))
            }
        }
    }

    /// Sets `IdentitySynced` when it changes, guarded on the status version (a lost race reads
    /// again; the reconciler never runs beside this job, so it rarely loses).
    async fn condition(
        &self,
        tenant: TenantId,
        id: ClusterId,
        ok: bool,
        reason: &str,
        message: &str,
    ) -> Result<(), StoreError> {
        let mut conn = self.0.services.store().conn().await?;
        for _ in 0..3 {
            let Some(current) = store::get(&mut conn, tenant, id).await? else { return Ok(()) };
            let mut conditions = current.status.conditions.clone();
            let status = ConditionStatus::from(ok);
            if !set_condition(&mut conditions, IDENTITY_SYNCED, status, reason, message, Utc::now()) {
                return Ok(());
            }
            if store::set_conditions(&mut conn, tenant, id, current.status_version, &conditions).await? {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// A failed sync: retried while the failure may heal, else done (the condition says why; the
/// next wake-up tries again).
fn failed(e: DriverError) -> Outcome {
    if e.is_transient() {
        Outcome::retry_because("identity_sync_failed", e.message.clone(), e)
    } else {
        Outcome::Done
    }
}

/// The event of a sync that wrote: what it wrote, the first [`EVENT_NAMES`] named.
fn event_message(changed: &[String]) -> String {
    let named = changed.iter().take(EVENT_NAMES).cloned().collect::<Vec<_>>().join(", ");
    match changed.len().saturating_sub(EVENT_NAMES) {
        0 => format!("Slurm's accounting was brought in line with the tenant's people: {named}"),
        more => format!("Slurm's accounting was brought in line with the tenant's people: {named} and {more} more"),
    }
}

impl ClusterReconciler {
    /// Wakes the cluster's identity sync once its Slurm is ready (every run that finds it so: a
    /// spec change, a drift check), unless it maps no group and was never synced.
    pub(super) async fn wake_identity_sync(&self, cluster: &Cluster) -> Result<(), StoreError> {
        let maps = cluster.spec.slurm.as_ref().is_some_and(|s| !s.accounts.is_empty());
        if !maps && cluster.status.identity.is_none() {
            return Ok(());
        }
        let mut tx = self.services.store().begin().await?;
        lifecycle::enqueue_identity_sync(&mut tx, cluster.tenant_id, cluster.id).await?;
        Ok(tx.commit().await?)
    }
}

impl JobHandler for IdentitySync {
    fn kind(&self) -> &'static str {
        CLUSTER_IDENTITY_SYNC
    }

    fn run<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        match ClusterJob::from_value(&job.payload) {
            Ok(c) => self.sync(c.tenant_id, c.cluster_id).boxed(),
            Err(e) => bad_payload(e),
        }
    }
}
