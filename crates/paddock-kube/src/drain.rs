//! The release's drain of a Node (docs/architecture.md, "Release"), as `kubectl drain
//! --ignore-daemonsets` does it: cordon (`spec.unschedulable`), then evict every pod bound to the
//! Node through the Eviction subresource, so that PodDisruptionBudgets are honoured, except the
//! pods a DaemonSet owns (the DaemonSet controller would put them back; they go with the Node) and
//! mirror pods (static pods the kubelet runs from its own files; the API server cannot evict them).
//! A Slinky NodeSet's slurmd pods are not evicted either but waited for, before the cordon: the
//! Slurm side of the release ([`crate::slurm`]) drained their Slurm nodes and handed them to the
//! NodeSet's scale-down, and the operator deletes them (an eviction would have it make a
//! replacement). The Node is cordoned only once they are gone, because the operator answers a
//! cordoned Node by draining its pods' Slurm nodes itself, and one of its reconciles that read
//! Slurm before paddock's drain would write its own reason over paddock's.
//!
//! One call is one round: a budget's refusal (429) is counted and asked again on the next poll,
//! never an error; the pods that accepted their eviction are waited for until they are gone
//! (their grace period, then the kubelet's confirmation), unless the Node is not Ready: no kubelet
//! will confirm them there, and the power-off that follows ends them (`kubectl drain` would wait
//! for `--skip-wait-for-delete-timeout`). The caller bounds the whole drain by
//! `PADDOCK_RELEASE_TIMEOUT`, after which the release is forced.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{EvictParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use paddock_domain::driver::Drain;
use serde_json::json;
use tracing::info;

use crate::isolation::MANAGER;
use crate::KubeError;

/// The annotation the kubelet puts on the API object of a static pod (a mirror pod).
pub const ANNOTATION_MIRROR: &str = "kubernetes.io/config.mirror";

/// Pods per page of a Node's pod list.
const PAGE: u32 = 500;

/// Whether `drain` leaves `pod` alone: a mirror pod, or a pod its DaemonSet controls.
pub fn stays(pod: &Pod) -> bool {
    let mirror = pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(ANNOTATION_MIRROR));
    let daemon =
        pod.metadata.owner_references.iter().flatten().any(|o| o.controller == Some(true) && o.kind == "DaemonSet");
    mirror || daemon
}

/// Whether `pod` is a slurmd pod of a Slinky NodeSet (its controller): its operator removes it.
pub fn left_to_nodeset(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "NodeSet" && o.api_version.starts_with("slinky.slurm.net/"))
}

/// One round of the drain of Node `name` (see the module documentation); `Drained` when the Node
/// does not exist.
pub(crate) async fn drain(client: &Client, name: &str) -> Result<Drain, KubeError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(node) = nodes.get_opt(name).await.map_err(|source| KubeError::api("get", "Node", name, source))? else {
        return Ok(Drain::Drained);
    };
    // Pods that accepted their eviction are waited for only where a kubelet will confirm them.
    let waits = usize::from(crate::nodes::is_ready(&node));
    let pods: Vec<Pod> = pods_on(client, name).await?.into_iter().filter(|p| !stays(p)).collect();
    let slurmd = pods.iter().filter(|p| left_to_nodeset(p) && p.metadata.deletion_timestamp.is_none()).count();
    if slurmd * waits > 0 {
        return Ok(Drain::Draining { leaving: slurmd, blocked: 0 });
    }
    if node.spec.as_ref().and_then(|s| s.unschedulable) != Some(true) {
        // A merge patch (an Update, not an Apply): paddock's apply of the Node's labels does not
        // own `unschedulable`, so it never uncordons.
        let params = PatchParams { field_manager: Some(MANAGER.to_owned()), ..PatchParams::default() };
        let patch = json!({ "spec": { "unschedulable": true } });
        match nodes.patch(name, &params, &Patch::Merge(&patch)).await {
            // Deleted in between: nothing left to drain.
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(Drain::Drained),
            Err(source) => return Err(KubeError::api("cordon", "Node", name, source)),
            Ok(_) => info!(node.name = %name, "cordoned node {name} for its release"),
        }
    }
    let (mut leaving, mut blocked) = (0, 0);
    for pod in pods {
        let (Some(pod_name), Some(namespace)) = (pod.metadata.name.clone(), pod.metadata.namespace.clone()) else {
            continue;
        };
        if pod.metadata.deletion_timestamp.is_some() || left_to_nodeset(&pod) {
            leaving += waits;
            continue;
        }
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        match pods.evict(&pod_name, &EvictParams::default()).await {
            Ok(_) => {
                info!(node.name = %name, "evicted pod {namespace}/{pod_name} from node {name}");
                leaving += waits;
            }
            // A PodDisruptionBudget does not allow it now: asked again on the next round.
            Err(kube::Error::Api(status)) if status.code == 429 => blocked += 1,
            // Gone in between.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => return Err(KubeError::api("evict", "Pod", format!("{namespace}/{pod_name}"), source)),
        }
    }
    Ok(if leaving == 0 && blocked == 0 { Drain::Drained } else { Drain::Draining { leaving, blocked } })
}

/// Every pod bound to Node `name`, in every namespace, page by page.
async fn pods_on(client: &Client, name: &str) -> Result<Vec<Pod>, KubeError> {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut params = ListParams::default().fields(&format!("spec.nodeName={name}")).limit(PAGE);
    let mut all = Vec::new();
    loop {
        let page = pods.list(&params).await.map_err(|source| KubeError::api("list", "Pod", "*", source))?;
        all.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(all),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    use super::*;

    fn owned_by(kind: &str, controller: bool) -> Pod {
        let owner = OwnerReference {
            api_version: "apps/v1".to_owned(),
            kind: kind.to_owned(),
            name: "x".to_owned(),
            uid: "u".to_owned(),
            controller: Some(controller),
            ..OwnerReference::default()
        };
        Pod { metadata: ObjectMeta { owner_references: Some(vec![owner]), ..ObjectMeta::default() }, ..Pod::default() }
    }

    #[test]
    fn a_nodeset_pod_is_left_to_its_operator() {
        let mut slurmd = owned_by("NodeSet", true);
        assert!(!left_to_nodeset(&slurmd), "apps/v1 is no Slinky NodeSet");
        slurmd.metadata.owner_references.as_mut().expect("owners")[0].api_version =
            "slinky.slurm.net/v1beta1".to_owned();
        assert!(left_to_nodeset(&slurmd));
        slurmd.metadata.owner_references.as_mut().expect("owners")[0].controller = Some(false);
        assert!(!left_to_nodeset(&slurmd), "not its controller");
        assert!(!left_to_nodeset(&owned_by("ReplicaSet", true)));
    }

    #[test]
    fn daemonset_and_mirror_pods_stay_the_rest_is_evicted() {
        assert!(stays(&owned_by("DaemonSet", true)));
        assert!(!stays(&owned_by("DaemonSet", false)), "not its controller");
        assert!(!stays(&owned_by("ReplicaSet", true)));
        assert!(!stays(&Pod::default()), "a bare pod is evicted too");
        let annotations = BTreeMap::from([(ANNOTATION_MIRROR.to_owned(), "hash".to_owned())]);
        let mirror =
            Pod { metadata: ObjectMeta { annotations: Some(annotations), ..ObjectMeta::default() }, ..Pod::default() };
        assert!(stays(&mirror));
    }
}
