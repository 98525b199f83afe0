//! Operator intents: maintenance, and the start of a release.

use futures::FutureExt;
use paddock_domain::bmc::BmcDriver;
use paddock_domain::model::Machine;
use paddock_store::lifecycle;
use paddock_store::run::Run;
use paddock_types::machine::MachineState;

use crate::metrics::{self, Driver};

use super::{MachineReconciler, Step};

impl MachineReconciler {
    pub(super) async fn enter_maintenance(&self, bmc: &dyn BmcDriver, m: &Machine, run: Option<Run>) -> Step {
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
    pub(super) async fn begin_release(&self, m: &Machine) -> Step {
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
}
