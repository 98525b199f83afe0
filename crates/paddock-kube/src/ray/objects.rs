//! The RayCluster paddock writes, and how its status reads (the module documentation of
//! [`super`] says what and why).

use std::collections::BTreeMap;

use paddock_domain::driver::{RayDesired, RayPool};
use paddock_domain::stack::{RayImages, RayRelease};
use paddock_types::ClusterId;
use serde_json::{json, Value};

use super::{GROUP, LABEL_RAY, RAYCLUSTER, VERSION};
use crate::isolation::{LABEL_CLUSTER_ID, LABEL_MANAGED_BY, MANAGER};
use crate::nodes::LABEL_NODE_POOL;
use crate::slurm::objects::tolerations;

/// The labels of every object of the driver.
pub fn labels(cluster: ClusterId) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_owned(), MANAGER.to_owned()),
        (LABEL_RAY.to_owned(), MANAGER.to_owned()),
        (LABEL_CLUSTER_ID.to_owned(), cluster.to_string()),
    ])
}

/// A pod spec pinned to `pool`'s nodes (its node label, its taints tolerated) with one container;
/// unpinned without a pool.
fn pod_spec(pool: Option<&RayPool>, container: Value) -> Value {
    match pool {
        Some(pool) => json!({
            "nodeSelector": { LABEL_NODE_POOL: pool.name },
            "tolerations": tolerations(&pool.taints),
            "containers": [container],
        }),
        None => json!({ "containers": [container] }),
    }
}

/// The head group: on the head pool, no Ray task scheduled on it, the dashboard as the spec says.
fn head_group(images: &RayImages, release: &RayRelease, desired: &RayDesired, head: Option<&RayPool>) -> Value {
    let dashboard = if desired.spec.dashboard { "true" } else { "false" };
    let container = json!({ "name": "ray-head", "image": images.image(release, false) });
    json!({
        "serviceType": "ClusterIP",
        "rayStartParams": { "num-cpus": "0", "include-dashboard": dashboard, "dashboard-host": "0.0.0.0" },
        "template": { "spec": pod_spec(head, container) },
    })
}

/// A pool's worker group: its count of workers (not autoscaled), each with the class's GPUs.
fn worker_group(images: &RayImages, release: &RayRelease, pool: &RayPool) -> Value {
    let gpus = pool.gpus_per_node > 0;
    let mut container = json!({ "name": "ray-worker", "image": images.image(release, gpus) });
    if gpus {
        container["resources"] = json!({ "limits": { "nvidia.com/gpu": pool.gpus_per_node.to_string() } });
    }
    json!({
        "groupName": pool.name,
        "replicas": pool.count,
        "minReplicas": pool.count,
        "maxReplicas": pool.count,
        "rayStartParams": {},
        "template": { "spec": pod_spec(Some(pool), container) },
    })
}

/// The cluster's RayCluster: the head on the head pool, one worker group per pool, in the
/// pools' order.
pub fn raycluster(
    ns: &str,
    cluster: ClusterId,
    images: &RayImages,
    release: &RayRelease,
    desired: &RayDesired,
) -> Value {
    // The head pool is one of the pools (the API checks it); without it, the head is unpinned.
    let head = desired.pools.iter().find(|p| p.name == desired.spec.head.node_pool);
    let head_group = head_group(images, release, desired, head);
    let workers: Vec<Value> = desired.pools.iter().map(|p| worker_group(images, release, p)).collect();
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "RayCluster",
        "metadata": { "name": RAYCLUSTER, "namespace": ns, "labels": labels(cluster) },
        "spec": {
            "rayVersion": release.version,
            "enableInTreeAutoscaling": false,
            "headGroupSpec": head_group,
            "workerGroupSpecs": workers,
        },
    })
}

/// What keeps the live RayCluster (as JSON) from being ready for `desired`, in order; empty when
/// the operator reports it ready.
pub fn readiness(live: &Value, desired: &RayDesired) -> Vec<String> {
    let status = &live["status"];
    let generation = live["metadata"]["generation"].as_i64();
    let observed = status["observedGeneration"].as_i64();
    if generation.is_none() || observed != generation {
        return vec!["RayClusterObserved".to_owned()];
    }
    let mut waiting = Vec::new();
    let state = status["state"].as_str().unwrap_or_default();
    if state != "ready" {
        waiting.push(format!("RayClusterReady (state {:?})", state));
    }
    let head_ready = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "HeadPodReady" && c["status"] == "True");
    if !head_ready {
        waiting.push("HeadPodReady".to_owned());
    }
    let want: u64 = desired.pools.iter().map(|p| u64::from(p.count)).sum();
    let ready = status["readyWorkerReplicas"].as_u64().unwrap_or(0);
    let desired_workers = status["desiredWorkerReplicas"].as_u64().unwrap_or(0);
    if ready != want || desired_workers != want {
        waiting.push(format!("WorkersReady {ready}/{want}"));
    }
    waiting
}

#[cfg(test)]
mod tests {
    use paddock_domain::driver::RayDesired;
    use paddock_types::cluster::{RayHead, RaySpec, Taint, TaintEffect};
    use paddock_types::NodePoolId;

    use super::*;
    use crate::ray::RayCatalog;

    fn pool(name: &str, count: u32, gpus: u32) -> RayPool {
        RayPool {
            node_pool_id: NodePoolId::new(),
            name: name.to_owned(),
            count,
            gpus_per_node: gpus,
            taints: Vec::new(),
        }
    }

    fn desired(dashboard: bool) -> RayDesired {
        let mut gpu = pool("gpu", 2, 8);
        gpu.taints = vec![Taint { key: "gpu".to_owned(), value: String::new(), effect: TaintEffect::NoSchedule }];
        RayDesired {
            spec: RaySpec {
                version: Some("2.46.0".to_owned()),
                head: RayHead { node_pool: "cpu".to_owned() },
                dashboard,
            },
            stack_version: "2026.12.2".to_owned(),
            pools: vec![pool("cpu", 1, 0), gpu],
        }
    }

    #[test]
    fn pools_become_pinned_worker_groups_and_the_head_sits_on_its_pool() {
        let catalog = RayCatalog::embedded();
        let (images, release) = catalog.release("2026.12.2", "2.46.0").expect("the stack runs Ray 2.46.0");
        let rc = raycluster("ray", ClusterId::new(), images, release, &desired(false));
        let spec = &rc["spec"];
        assert_eq!(spec["rayVersion"], "2.46.0");
        let head = &spec["headGroupSpec"];
        assert_eq!(head["serviceType"], "ClusterIP", "never a LoadBalancer or NodePort");
        assert_eq!(head["rayStartParams"]["include-dashboard"], "false");
        assert_eq!(head["template"]["spec"]["nodeSelector"][LABEL_NODE_POOL], "cpu");
        assert_eq!(head["template"]["spec"]["containers"][0]["image"], "docker.io/rayproject/ray:2.46.0");
        let groups = spec["workerGroupSpecs"].as_array().expect("worker groups");
        assert_eq!(groups.len(), 2);
        let gpu = &groups[1];
        assert_eq!((gpu["groupName"].as_str(), gpu["replicas"].as_u64()), (Some("gpu"), Some(2)));
        assert_eq!((gpu["minReplicas"].as_u64(), gpu["maxReplicas"].as_u64()), (Some(2), Some(2)));
        let pod = &gpu["template"]["spec"];
        assert_eq!(pod["nodeSelector"][LABEL_NODE_POOL], "gpu");
        assert_eq!(pod["tolerations"][0]["key"], "gpu");
        assert_eq!(pod["containers"][0]["image"], "docker.io/rayproject/ray:2.46.0-gpu");
        assert_eq!(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "8");
        assert!(groups[0]["template"]["spec"]["containers"][0].get("resources").is_none());
    }

    #[test]
    fn ready_only_when_the_operator_says_so_for_the_current_spec() {
        let want = desired(true);
        let live = |observed: i64, state: &str, ready: u64| {
            json!({ "metadata": { "generation": 2 }, "status": {
                "observedGeneration": observed, "state": state, "readyWorkerReplicas": ready,
                "desiredWorkerReplicas": 3, "conditions": [{ "type": "HeadPodReady", "status": "True" }] } })
        };
        assert!(readiness(&live(2, "ready", 3), &want).is_empty());
        assert_eq!(readiness(&live(1, "ready", 3), &want), ["RayClusterObserved"]);
        assert_eq!(readiness(&live(2, "ready", 2), &want), ["WorkersReady 2/3"]);
        assert_eq!(readiness(&live(2, "", 3), &want), ["RayClusterReady (state \"\")"]);
    }
}
