use paddock_types::NodePoolId;
use serde_json::{json, Value};

use super::*;

fn pool(name: &str, labels: &[(&str, &str)], taints: Vec<Taint>, nodes: &[&str]) -> DemandPool {
    DemandPool {
        node_pool_id: NodePoolId::new(),
        name: name.to_owned(),
        partitions: Vec::new(),
        node_names: nodes.iter().map(|n| (*n).to_owned()).collect(),
        labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        taints,
        cpu_cores: 8,
        memory_gib: 32,
        gpus: 0,
    }
}

fn gpu_taint() -> Taint {
    Taint { key: "nvidia.com/gpu".to_owned(), value: "present".to_owned(), effect: TaintEffect::NoSchedule }
}

/// A pod as kube-scheduler leaves one it could not place.
fn pending(name: &str, spec: Value) -> Pod {
    let mut spec = spec;
    if spec.get("containers").is_none() {
        spec["containers"] = json!([{ "name": "c", "image": "example.invalid/c:1",
                                      "resources": { "requests": { "cpu": "1", "memory": "1Gi" } } }]);
    }
    serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": "default" },
        "spec": spec,
        "status": { "phase": "Pending", "conditions": [{ "type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "message": "0/3 nodes are available" }] },
    }))
    .expect("pod")
}

fn running(name: &str, node: &str, owner: Option<&str>) -> Pod {
    let owners = owner
        .map(|kind| json!([{ "apiVersion": "apps/v1", "kind": kind, "name": "x", "uid": "u", "controller": true }]));
    serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": "default", "ownerReferences": owners.unwrap_or(json!([])) },
        "spec": { "nodeName": node, "containers": [{ "name": "c", "image": "example.invalid/c:1" }] },
        "status": { "phase": "Running" },
    }))
    .expect("pod")
}

#[test]
fn only_pods_the_scheduler_marked_unschedulable_are_pending_demand() {
    assert!(unschedulable(&pending("a", json!({}))));
    let mut bound = pending("b", json!({ "nodeName": "n-1" }));
    assert!(!unschedulable(&bound), "bound to a node");
    bound.spec.as_mut().expect("spec").node_name = None;
    bound.status.as_mut().expect("status").nominated_node_name = Some("n-2".to_owned());
    assert!(!unschedulable(&bound), "nominated by a preemption: it goes there");
    let mut gated = pending("c", json!({}));
    gated.status.as_mut().expect("status").conditions.as_mut().expect("conditions")[0].reason =
        Some("SchedulingGated".to_owned());
    assert!(!unschedulable(&gated), "gated pods wait for their gate, not for a node");
    assert!(!unschedulable(&running("d", "n-1", None)));
}

#[test]
fn a_pod_fits_a_pool_by_selector_affinity_and_tolerations() {
    let gpu = pool("gpu", &[("accelerator", "h100")], vec![gpu_taint()], &[]);
    let labels = pool_labels(&gpu);
    let taints = &gpu.taints;
    let tolerating = json!([{ "key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule" }]);
    let fits = |spec: Value| fits_pool(&pending("p", spec), &labels, taints);
    assert!(!fits(json!({})), "the pool's taint is not tolerated");
    assert!(fits(json!({ "tolerations": tolerating })));
    assert!(fits(json!({ "tolerations": [{ "operator": "Exists" }] })), "an empty key with Exists tolerates all");
    assert!(fits(json!({ "tolerations": [{ "key": "nvidia.com/gpu", "value": "present" }] })), "Equal is the default");
    assert!(!fits(json!({ "tolerations": [{ "key": "nvidia.com/gpu", "value": "absent" }] })));
    assert!(!fits(
        json!({ "tolerations": [{ "key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute" }] })
    ));
    let with = |extra: Value| {
        let mut spec = json!({ "tolerations": tolerating });
        for (k, v) in extra.as_object().expect("object") {
            spec[k] = v.clone();
        }
        fits(spec)
    };
    assert!(with(json!({ "nodeSelector": { "paddock.dev/node-pool": "gpu", "kubernetes.io/os": "linux" } })));
    assert!(with(json!({ "nodeSelector": { "accelerator": "h100" } })));
    assert!(!with(json!({ "nodeSelector": { "accelerator": "a100" } })));
    assert!(!with(json!({ "nodeSelector": { "kubernetes.io/hostname": "n-7" } })), "a node to come has no name yet");
    let affinity = |terms: Value| {
        json!({ "affinity": { "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms } } } })
    };
    let expr = |key: &str, op: &str, values: &[&str]| json!({ "key": key, "operator": op, "values": values });
    assert!(with(affinity(json!([{ "matchExpressions": [expr("accelerator", "In", &["a100", "h100"])] }]))));
    assert!(!with(affinity(json!([{ "matchExpressions": [expr("accelerator", "NotIn", &["h100"])] }]))));
    assert!(
        with(affinity(json!([
            { "matchExpressions": [expr("zone", "Exists", &[])] },
            { "matchExpressions": [expr("zone", "DoesNotExist", &[]), expr("accelerator", "In", &["h100"])] },
        ]))),
        "terms are ORed, expressions ANDed"
    );
    let by_name = json!([{ "matchFields": [{ "key": "metadata.name", "operator": "In", "values": ["n-1"] }] }]);
    assert!(!with(affinity(by_name)), "a DaemonSet pod pinned to a node never counts");
    let cpu = pool("cpu", &[], Vec::new(), &[]);
    assert!(!fits_pool(&pending("p", json!({ "nodeSelector": { "accelerator": "h100" } })), &pool_labels(&cpu), &[]));
    let soft = Taint { effect: TaintEffect::PreferNoSchedule, ..gpu_taint() };
    assert!(fits_pool(&pending("p", json!({})), &pool_labels(&cpu), &[soft]), "PreferNoSchedule keeps no pod off");
}

#[test]
fn quantities_parse_as_kubernetes_writes_them() {
    for (q, v) in [
        ("500m", 0.5),
        ("2", 2.0),
        ("1.5", 1.5),
        ("1Gi", 1073741824.0),
        ("128974848", 128974848.0),
        ("129e6", 129e6),
        ("123Mi", 123.0 * 1048576.0),
        ("1k", 1000.0),
        ("1M", 1e6),
        ("2G", 2e9),
    ] {
        assert_eq!(quantity(q), Some(v), "{q}");
    }
    assert_eq!(quantity("lots"), None);
    assert_eq!(quantity("-1"), None);
}

#[test]
fn requests_are_what_the_scheduler_counts() {
    let pod = pending(
        "p",
        json!({
            "containers": [
                { "name": "a", "image": "i", "resources": { "requests": { "cpu": "500m", "memory": "1Gi" } } },
                { "name": "b", "image": "i", "resources": { "requests": { "cpu": "1500m", "nvidia.com/gpu": "1" } } },
            ],
            "initContainers": [{ "name": "init", "image": "i", "resources": { "requests": { "memory": "4Gi" } } }],
            "overhead": { "cpu": "100m" },
        }),
    );
    assert_eq!(pod_request(&pod), Request { cpu_milli: 2100, memory: 4 * GIB, gpus: 1 });
}

#[test]
fn pending_pods_pack_onto_nodes_of_the_class_and_oversized_ones_never_count() {
    let size = Request { cpu_milli: 8000, memory: 32 * GIB, gpus: 0 };
    let r = |cpu: u64, gib: u64| Request { cpu_milli: cpu * 1000, memory: gib * GIB, gpus: 0 };
    assert_eq!(nodes_needed(&[], size), (0, 0));
    assert_eq!(nodes_needed(&[r(1, 1); 8], size), (8, 1), "eight 1-core pods fill one 8-core node");
    assert_eq!(nodes_needed(&[r(1, 1); 9], size), (9, 2));
    assert_eq!(nodes_needed(&[r(5, 1), r(5, 1), r(3, 1), r(3, 1)], size), (4, 2), "largest first, first fit");
    assert_eq!(nodes_needed(&[r(1, 20), r(1, 20)], size), (2, 2), "memory counts too");
    assert_eq!(nodes_needed(&[r(9, 1), r(1, 1)], size), (1, 1), "a pod larger than a node never fits it");
    let none = Request::default();
    assert_eq!(nodes_needed(&vec![none; 111], size), (111, 2), "at most 110 pods a node");
    let gpus = Request { gpus: 8, ..size };
    let gpu_pod = Request { cpu_milli: 1000, memory: GIB, gpus: 4 };
    assert_eq!(nodes_needed(&[gpu_pod; 3], gpus), (3, 2));
    assert_eq!(nodes_needed(&[gpu_pod], size), (0, 0), "no GPU on the class");
}

#[test]
fn demand_counts_each_pod_once_and_nodes_running_only_daemons_are_idle() {
    let tolerating = json!([{ "key": "nvidia.com/gpu", "operator": "Exists" }]);
    let pools = [pool("cpu", &[], Vec::new(), &["c-1", "c-2", "c-3"]), pool("gpu", &[], vec![gpu_taint()], &["g-1"])];
    let mut mirror = running("static", "c-3", None);
    mirror.metadata.annotations = Some(BTreeMap::from([(ANNOTATION_MIRROR.to_owned(), "x".to_owned())]));
    let pods = vec![
        pending("p-1", json!({})),
        pending("p-2", json!({ "tolerations": tolerating })),
        pending("p-3", json!({ "nodeSelector": { "paddock.dev/node-pool": "gpu" }, "tolerations": tolerating })),
        pending("p-4", json!({ "nodeSelector": { "paddock.dev/node-pool": "other" } })),
        running("job", "c-1", Some("Job")),
        running("agent", "c-2", Some("DaemonSet")),
        mirror,
        running("elsewhere", "x-1", None),
    ];
    let demand = demand_of(&pools, &pods);
    // p-1 and p-2 fit the cpu pool (the first asked), p-3 only the gpu pool, p-4 none.
    assert_eq!(demand.pools[0], PoolDemand { pending: 2, pending_nodes: 1, nodes: 3, idle_nodes: 2 });
    assert_eq!(demand.pools[1], PoolDemand { pending: 1, pending_nodes: 1, nodes: 1, idle_nodes: 1 });
    assert_eq!(demand.idle_node_names, ["c-2", "c-3", "g-1"]);
}
