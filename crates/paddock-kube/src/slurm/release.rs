//! The Slurm side of a machine's release: drain its Slurm node first, then let the NodeSet's
//! scale-down take exactly its slurmd pod.
//!
//! Why this order and these marks (slurm-operator 1.2.1, `internal/controller/nodeset`):
//! - When `replicas` drops below its pods, the operator condemns the first pods of
//!   `SplitActivePods`, whose order is: unassigned, then Pending < Unknown < Running, then not
//!   Ready, then the lowest `nodeset.slinky.slurm.net/pod-deletion-cost`, then the earliest
//!   `pod-deadline`, then `pod-cordon`, then the highest ordinal. Nothing in it knows which
//!   machine paddock releases: a count written at once lets it condemn another machine's pod (a
//!   busy node loses its slurmd while the released machine's idle one stays).
//! - `processCondemned` deletes a condemned pod only once its Slurm node is drained (DRAIN and not
//!   ALLOCATED, MIXED or COMPLETING); until then it drains it itself with `overrideReason`, which
//!   replaces any reason (paddock's too) by its own `slurm-operator: ... pending termination for
//!   scale-in`.
//! - Outside a scale-down it leaves a node alone whose reason is not its own (`IsNodeReasonOurs`:
//!   empty, or prefixed `slurm-operator: `): `syncCordon` and `syncPodUncordon` skip it, so a
//!   DRAIN with paddock's reason stays while the pod stays wanted.
//!
//! So paddock drains the released machine's Slurm node with its reason ([`DRAIN_REASON`]) while
//! the NodeSet still counts the node's pod (the cluster reconciler writes [`replicas`]: the
//! pool's count, or the pods not handed over if more), and only once Slurm reports the node drained marks its pod
//! [handed over](ANNOTATION_HANDED_OVER) with the lowest deletion cost ([`HANDED_OVER_COST`]). The
//! cluster's next run lowers `replicas`; the operator condemns that pod (the lowest cost among
//! Running, Ready pods), finds its node drained, and deletes it at once, without touching the
//! reason. The release waits for the pod to leave ([`crate::drain`] leaves NodeSet pods to their
//! operator), bounded by `PADDOCK_RELEASE_TIMEOUT`, after which it is forced.
//!
//! Known limit: the operator puts unassigned, Pending and not Ready pods before any deletion cost,
//! so while another pod of the pool is not Ready, a scale-down condemns that one first; the
//! released machine's pod then stays until the forced release removes its Node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use paddock_domain::driver::{DriverError, SlurmDrain, SlurmPool, TenantAccess};
use serde_json::json;
use tracing::info;

use super::{slurm_node_name, SlinkyDriver, DRAIN_REASON};
use crate::isolation::MANAGER;
use crate::KubeError;

/// The operator's annotation ranking a NodeSet pod for deletion: the lowest goes first.
pub const ANNOTATION_POD_DELETION_COST: &str = "nodeset.slinky.slurm.net/pod-deletion-cost";
/// The deletion cost of a handed-over pod: the lowest an int32 holds (the operator parses it so).
pub const HANDED_OVER_COST: i32 = i32::MIN;
/// paddock's mark on a slurmd pod whose Slurm node it drained for a release (value: the reason).
pub const ANNOTATION_HANDED_OVER: &str = "paddock.dev/slurm-released";

/// Whether paddock handed `pod` over to the NodeSet's scale-down.
pub fn handed_over(pod: &Pod) -> bool {
    pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(ANNOTATION_HANDED_OVER))
}

/// Whether `pod` is a pod of NodeSet `name` (its controller).
fn of_nodeset(pod: &Pod, name: &str) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "NodeSet" && o.name == name)
}

/// The `replicas` of `pool`'s NodeSet: the pool's count, or more while slurmd pods of it that
/// paddock has not handed over (and that are not leaving already) run on the pool's Nodes,
/// those of its active machines and of the machines it is releasing. So a scale-down leaves
/// every pod counted until its machine's release drained its Slurm node and handed it over,
/// whichever machines the cluster's run is about to release (its view of them may still show the
/// released machine active); a pod on a Node the pool no longer holds (a forced release removed
/// it) is not counted.
pub fn replicas(pods: &[Pod], pool: &SlurmPool) -> u32 {
    let on_held_node = |p: &&Pod| {
        let node = p.spec.as_ref().and_then(|s| s.node_name.as_ref());
        node.is_some_and(|n| pool.node_names.contains(n) || pool.releasing.contains(n))
    };
    let kept = pods
        .iter()
        .filter(|p| of_nodeset(p, &pool.name) && p.metadata.deletion_timestamp.is_none() && !handed_over(p))
        .filter(on_held_node)
        .count();
    pool.count.max(u32::try_from(kept).unwrap_or(u32::MAX))
}

/// The merge patch that hands a pod over.
fn hand_over_patch() -> serde_json::Value {
    let annotations = BTreeMap::from([
        (ANNOTATION_POD_DELETION_COST, HANDED_OVER_COST.to_string()),
        (ANNOTATION_HANDED_OVER, DRAIN_REASON.to_owned()),
    ]);
    json!({ "metadata": { "annotations": annotations } })
}

impl SlinkyDriver {
    /// The pods of the Slurm namespace (the NodeSets' pods among them, for [`replicas`]).
    pub(super) async fn slurm_pods(&self, client: &Client) -> Result<Vec<Pod>, KubeError> {
        let ns = self.settings.namespace.as_str();
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let listed =
            pods.list(&ListParams::default()).await.map_err(|source| KubeError::api("list", "Pod", ns, source))?;
        Ok(listed.items)
    }

    /// See [`paddock_domain::driver::SlurmDriver::drain_node`] and the module documentation:
    /// every slurmd pod on Node `node_name` gets its Slurm node drained with [`DRAIN_REASON`]
    /// (a reason someone else wrote meanwhile is replaced on the next round), and once every
    /// such Slurm node is drained (or unknown to Slurm) the pods are handed over. The Node is
    /// not cordoned here: the operator drains the Slurm nodes of a cordoned Node itself, with
    /// its own reason ([`crate::drain`] cordons once the slurmd pods are gone). Speaks the
    /// slurmrestd data-parser `version`.
    pub(super) async fn drain_and_hand_over(
        &self,
        tenant: &TenantAccess,
        version: &str,
        node_name: &str,
    ) -> Result<SlurmDrain, DriverError> {
        let client = crate::nodes::tenant_client(tenant).await?;
        let ns = self.settings.namespace.as_str();
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let on_node = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
            .await
            .map_err(|source| KubeError::api("list", "Pod", ns, source))?;
        let slurmd: Vec<(&Pod, String)> =
            on_node.items.iter().filter_map(|p| slurm_node_name(p).map(|n| (p, n))).collect();
        let mut drained = true;
        for (pod, slurm_node) in &slurmd {
            if handed_over(pod) {
                continue;
            }
            match self.probe.drain(tenant, version, slurm_node, DRAIN_REASON).await? {
                None | Some(true) => {}
                Some(false) => drained = false,
            }
        }
        if !drained {
            return Ok(SlurmDrain::Draining);
        }
        let mut handed = false;
        for (pod, slurm_node) in slurmd.iter().filter(|(p, _)| !handed_over(p)) {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            match pods.patch(name, &params(), &Patch::Merge(&hand_over_patch())).await {
                // Gone in between: nothing to hand over.
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(source) => return Err(KubeError::api("annotate", "Pod", format!("{ns}/{name}"), source).into()),
                Ok(_) => {
                    handed = true;
                    info!(
                        cluster.id = %tenant.cluster.cluster_id,
                        "Slurm node {slurm_node} drained: pod {ns}/{name} handed to the NodeSet's scale-down"
                    );
                }
            }
        }
        Ok(if handed { SlurmDrain::HandedOver } else { SlurmDrain::Done })
    }
}

fn params() -> PatchParams {
    PatchParams { field_manager: Some(MANAGER.to_owned()), ..PatchParams::default() }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
    use paddock_types::cluster::NodePoolRole;
    use paddock_types::NodePoolId;

    use super::*;

    fn pod(nodeset: &str, node: &str, annotations: &[(&str, &str)]) -> Pod {
        let owner = OwnerReference {
            api_version: "slinky.slurm.net/v1beta1".to_owned(),
            kind: "NodeSet".to_owned(),
            name: nodeset.to_owned(),
            uid: "u".to_owned(),
            controller: Some(true),
            ..OwnerReference::default()
        };
        let annotations = annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        Pod {
            metadata: ObjectMeta {
                owner_references: Some(vec![owner]),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec { node_name: Some(node.to_owned()), ..PodSpec::default() }),
            ..Pod::default()
        }
    }

    fn pool(active: &[&str], releasing: &[&str]) -> SlurmPool {
        let names = |v: &[&str]| v.iter().map(|n| (*n).to_owned()).collect();
        SlurmPool {
            node_pool_id: NodePoolId::new(),
            name: "cpu".to_owned(),
            count: 1,
            node_names: names(active),
            releasing: names(releasing),
            gpus_per_node: 0,
            class_size: (8, 32),
            autoscaling_max: None,
            taints: Vec::new(),
            role: NodePoolRole::Compute,
        }
    }

    #[test]
    fn a_released_machines_pod_stays_counted_until_handed_over() {
        let (a, b) = (pod("cpu", "n-a", &[]), pod("cpu", "n-b", &[]));
        assert_eq!(replicas(&[a.clone(), b.clone()], &pool(&["n-a"], &["n-b"])), 2);
        // The run that starts the release may still see the machine active.
        assert_eq!(replicas(&[a.clone(), b.clone()], &pool(&["n-a", "n-b"], &[])), 2);
        let handed = pod("cpu", "n-b", &[(ANNOTATION_HANDED_OVER, DRAIN_REASON)]);
        assert_eq!(replicas(&[a.clone(), handed], &pool(&["n-a"], &["n-b"])), 1);
        let other_nodeset = pod("gpu", "n-b", &[]);
        assert_eq!(replicas(&[a.clone(), other_nodeset], &pool(&["n-a"], &["n-b"])), 1, "another pool's pod");
        let mut leaving = b.clone();
        leaving.metadata.deletion_timestamp = Some(Time(k8s_openapi::chrono::Utc::now()));
        assert_eq!(replicas(&[a.clone(), leaving], &pool(&["n-a"], &["n-b"])), 1, "already leaving");
        assert_eq!(replicas(&[a.clone(), b], &pool(&["n-a"], &[])), 1, "a Node the pool no longer holds");
        // Scaling up: the count leads.
        let mut three = pool(&["n-a"], &[]);
        three.count = 3;
        assert_eq!(replicas(&[a], &three), 3);
    }

    #[test]
    fn a_handed_over_pod_has_the_lowest_deletion_cost_the_operator_reads() {
        let patch = hand_over_patch();
        let cost = patch["metadata"]["annotations"][ANNOTATION_POD_DELETION_COST].as_str().expect("cost");
        // The operator parses the cost as an int32 (structutils.GetNumberFromAnnotations).
        assert_eq!(cost.parse::<i32>(), Ok(i32::MIN));
        assert_eq!(patch["metadata"]["annotations"][ANNOTATION_HANDED_OVER], DRAIN_REASON);
        let annotations = serde_json::from_value(patch["metadata"]["annotations"].clone()).expect("annotations");
        let marked =
            Pod { metadata: ObjectMeta { annotations: Some(annotations), ..ObjectMeta::default() }, ..Pod::default() };
        assert!(handed_over(&marked));
        assert!(!handed_over(&Pod::default()));
        assert!(DRAIN_REASON.starts_with(super::super::REASON_PREFIX));
    }
}
