//! What the cluster's Slurm says of its machines: every Slurm node that a NodeSet's slurmd pod
//! runs, read through slurmrestd with its state flags and reason, and the Kubernetes Node the
//! pod runs on (its machine's Node). The worker rates each machine from that
//! ([`paddock_domain::health::slurm_node_rating`]: only a drain whose reason starts with
//! `paddock:hw:` is a fault).
//!
//! Proven against a slurmrestd stand-in through the API server's service proxy and played
//! NodeSet pods (tests/kube/slurm.rs); the proof against real Slurm daemons comes with the
//! real-Slurm path.

use std::collections::BTreeMap;

use paddock_domain::driver::{DriverError, SlurmNodeState, SlurmVersion, TenantAccess};
use tracing::{debug, instrument};

use super::{slurm_node_name, SlinkyDriver};

impl SlinkyDriver {
    /// See [`paddock_domain::driver::SlurmDriver::node_states`]: the NodeSet pods that are on a
    /// Node name their Slurm nodes; slurmrestd (the version `slurm`'s release pins) is asked only
    /// when there is one, and only the nodes of those pods are answered.
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id))]
    pub async fn node_states(
        &self,
        tenant: &TenantAccess,
        slurm: &SlurmVersion,
    ) -> Result<Vec<SlurmNodeState>, DriverError> {
        let images = self.settings.catalog.images(&slurm.stack_version, &slurm.version)?;
        let client = crate::nodes::tenant_client(tenant).await?;
        let on_node: BTreeMap<String, String> = self
            .slurm_pods(&client)
            .await?
            .iter()
            .filter_map(|pod| Some((slurm_node_name(pod)?, pod.spec.as_ref()?.node_name.clone()?)))
            .collect();
        if on_node.is_empty() {
            return Ok(Vec::new());
        }
        let nodes = self.probe.nodes(tenant, images.rest_api_version()).await?;
        debug!(nodes = nodes.len(), "read the Slurm nodes through slurmrestd");
        Ok(nodes
            .into_iter()
            .filter_map(|n| {
                let node_name = on_node.get(&n.name)?.clone();
                Some(SlurmNodeState { slurm_node: n.name, node_name, states: n.state, reason: n.reason })
            })
            .collect())
    }
}
