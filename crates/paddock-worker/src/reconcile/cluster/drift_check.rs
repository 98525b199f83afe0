//! The drift check: the reconciler's run on a cluster at rest, queued again for the next one.

use futures::future::BoxFuture;
use futures::FutureExt;
use paddock_domain::job_kind::{ClusterJob, Payload, CLUSTER_DRIFT_CHECK};
use paddock_store::lifecycle;
use paddock_types::{ClusterId, TenantId};

use crate::reconcile::store_error;
use crate::{Job, JobHandler, Outcome};

use super::status::spread;
use super::{bad_payload, ClusterReconciler, Mode};

/// The [`CLUSTER_DRIFT_CHECK`] handler: the cluster reconciler's run on a cluster at rest, queued
/// again for the next check; what it cannot settle in one run goes to the cluster's reconcile job.
#[derive(Clone, Debug)]
pub struct DriftCheck(pub ClusterReconciler);

impl DriftCheck {
    async fn check(&self, tenant: TenantId, id: ClusterId) -> Outcome {
        let interval = self.0.settings.drift_interval;
        if interval.is_zero() {
            // Drift checks were switched off: the queued ones end as they come due.
            return Outcome::Done;
        }
        match self.0.reconcile(tenant, id, Mode::DriftCheck).await {
            Outcome::Done => {
                Outcome::wait(spread(interval), "at_rest", "the cluster is ready; waiting for its next drift check")
            }
            // Not ready any more (its status says why) or a failure: the reconcile job takes over,
            // with its retries, and arms the next check once the cluster is ready again.
            _ => {
                let handed = async {
                    let mut tx = self.0.services.store().begin().await?;
                    lifecycle::enqueue_cluster(&mut tx, tenant, id).await?;
                    Ok::<_, paddock_store::StoreError>(tx.commit().await?)
                }
                .await;
                match handed {
                    Ok(()) => Outcome::Done,
                    Err(e) => store_error(e),
                }
            }
        }
    }
}

impl JobHandler for DriftCheck {
    fn kind(&self) -> &'static str {
        CLUSTER_DRIFT_CHECK
    }

    fn run<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        match ClusterJob::from_value(&job.payload) {
            Ok(c) => self.check(c.tenant_id, c.cluster_id).boxed(),
            Err(e) => bad_payload(e),
        }
    }
}
