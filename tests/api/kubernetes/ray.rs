//! A `ray` cluster end to end through the HTTP API with the real Kubernetes drivers and the REAL
//! KubeRay operator (the Ray lab of [`super::operator`]): paddock's stack applies KubeRay's CRDs
//! and operator into the tenant API server, the operator process runs as that Deployment would,
//! and paddock's Ray driver writes the RayCluster the operator reconciles; the kubelets and the
//! Ray head's health endpoints are PLAYED (no Ray image runs here).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, ResourceExt};
use paddock_kube::nodes::LABEL_NODE_POOL;
use paddock_kube::ray;
use paddock_testkit::admin;
use serde_json::{json, Value};

use super::{Lab, Tenant};

/// The worker pods of group `pool` (not being deleted) and their Nodes.
async fn workers(lab: &Lab, c: &str, pool: &str) -> Vec<(String, String)> {
    let pods = Api::<Pod>::namespaced(lab.tenant_client(c), ray::NAMESPACE);
    let selector = format!("ray.io/group={pool},ray.io/node-type=worker");
    let listed = pods.list(&ListParams::default().labels(&selector)).await.expect("pods").items;
    listed
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| (p.name_any(), p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default()))
        .collect()
}

/// Group `pool` runs `count` workers, each on a Node of its pool (the real scheduler).
async fn assert_group(lab: &Lab, t: &Tenant, c: &str, (name, id): (&str, &str), count: usize) {
    let nodes: BTreeSet<String> = lab.pool_nodes(t, c, id).await;
    let placed = workers(lab, c, name).await;
    assert_eq!(placed.len(), count, "worker group {name}: {placed:?}");
    for (pod, on) in placed {
        assert!(nodes.contains(&on), "{name}'s worker {pod} is on {on}, not on its pool's Nodes {nodes:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ray_cluster_goes_ready_scales_and_is_deleted_with_the_real_kuberay_operator() {
    let Some(lab) = Lab::with_real_ray_operator().await else { return };
    let started = std::time::Instant::now();
    crate::common::machine_class(&lab.app, "cpu", 0).await;
    crate::common::machine_class(&lab.app, "gpu", 4).await;
    lab.enroll("cpu", &["c1"]).await;
    lab.enroll("gpu", &["g1", "g2"]).await;
    let t = lab.tenant("acme").await;
    let body = json!({
        "name": "lab", "kind": "ray", "isolation": "private-nodes",
        "ray": { "head": { "node_pool": "cpu" } },
        "node_pools": [
            { "name": "cpu", "machine_class": "cpu", "count": 1 },
            { "name": "gpu", "machine_class": "gpu", "count": 1 },
        ],
    });
    let created = lab.create(&t, body).await;
    let c = super::id(&created["cluster"]);
    let pool = |name: &str| -> String {
        let pools = created["cluster"]["node_pools"].as_array().expect("pools");
        super::id(pools.iter().find(|p| p["name"] == name).expect("the pool"))
    };
    let (cpu, gpu) = (pool("cpu"), pool("gpu"));

    // Ready: the operator's head and workers on their pools, the head answering (stand-in).
    let ready = lab.ready(&t, &c).await;
    super::all_true(&ready);
    eprintln!("ready on the real KubeRay operator after {:?}", started.elapsed());
    let endpoints = &ready["status"]["endpoints"];
    let host = format!("{}.{}.svc", ray::HEAD_SERVICE, ray::NAMESPACE);
    assert_eq!(endpoints["ray_client"], format!("ray://{host}:{}", ray::CLIENT_PORT), "{endpoints}");
    assert_eq!(endpoints["dashboard"], format!("http://{host}:{}", ray::DASHBOARD_PORT), "{endpoints}");
    let client = lab.tenant_client(&c);
    let heads = Api::<Pod>::namespaced(client.clone(), ray::NAMESPACE);
    let heads = heads.list(&ListParams::default().labels("ray.io/node-type=head")).await.expect("heads").items;
    assert_eq!(heads.len(), 1, "one head pod");
    let head_spec = heads[0].spec.clone().unwrap_or_default();
    assert_eq!(head_spec.node_selector.unwrap_or_default().get(LABEL_NODE_POOL).map(String::as_str), Some("cpu"));
    assert!(lab.pool_nodes(&t, &c, &cpu).await.contains(&head_spec.node_name.unwrap_or_default()));
    assert_group(&lab, &t, &c, ("cpu", &cpu), 1).await;
    assert_group(&lab, &t, &c, ("gpu", &gpu), 1).await;

    // Scaling the gpu pool: a new machine joins and the operator adds a worker on it.
    lab.scale(&t, &c, &gpu, 2).await;
    lab.ready(&t, &c).await;
    assert_group(&lab, &t, &c, ("gpu", &gpu), 2).await;
    let rayclusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ray::NAMESPACE, &ray::raycluster_resource());
    let live = rayclusters.get(ray::RAYCLUSTER).await.expect("the RayCluster");
    assert_eq!(live.data["spec"]["workerGroupSpecs"][1]["replicas"], 2);
    eprintln!("scaled up after {:?}", started.elapsed());

    // Deleting: the RayCluster goes first, then the machines, the control plane, the namespace.
    let deleted = lab.app.delete(Lab::path(&t, &c)).token(&t.token).send().await.expect(202).json();
    lab.gone(&t, &c).await;
    let held = lab.play.at_deletion.lock().expect("lock").get(&c).cloned().expect("Kamaji saw the deletion");
    assert_eq!(held, json!({ "nodes": [], "slurm": [] }), "left when the control plane went (no RayCluster)");
    let op = lab.app.get(format!("/v1/operations/{}", super::id(&deleted["operation"]))).token(&admin()).send().await;
    let op: Value = op.expect(200).json();
    let steps: Vec<&str> = op["steps"].as_array().expect("steps").iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(steps, ["remove_ray", "release_machines", "delete_control_plane", "delete_namespace"], "{op}");
    paddock_testkit::eventually(lab.wait, || async {
        (lab.scalar("select count(*) from machines where state = 'available'").await == 3).then_some(())
    })
    .await;
    eprintln!("deleted after {:?}", started.elapsed());
    lab.finish().await;
}
