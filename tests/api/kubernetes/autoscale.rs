//! An elastic pool of a `kubernetes` cluster with the REAL tenant-nodes driver: an unschedulable
//! pod in the tenant's API server (its status written as kube-scheduler writes it) grows the pool
//! from zero, the new machine's Node takes it (the test plays the scheduler's binding), and once
//! the pod is gone the idle Node is given back after the delay, the machine wiped.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use paddock_kube::nodes::LABEL_NODE_POOL;
use paddock_testkit::eventually;
use serde_json::{json, Value};

use super::{Lab, Tenant, WAIT};
use crate::common::{id, machine_class};

/// The pool's view.
async fn pool_view(lab: &Lab, t: &Tenant, cluster: &str, pool: &str) -> Value {
    let path = format!("{}/node-pools/{pool}", Lab::path(t, cluster));
    lab.app.get(path).token(&t.token).send().await.expect(200).json()
}

/// Waits until the pool's target is `target` with that many ready machines.
async fn pool_at(lab: &Lab, t: &Tenant, cluster: &str, pool: &str, target: u64) -> Value {
    eventually(WAIT, || async {
        let view = pool_view(lab, t, cluster, pool).await;
        let s = &view["status"];
        (s["desired_count"] == target && s["ready"] == target && s["allocated"] == target).then_some(view)
    })
    .await
}

/// The pool's scaling operations, oldest first: (state, reason).
async fn scalings(lab: &Lab, pool: &str) -> Vec<(String, String)> {
    sqlx::query_as(
        "select state, coalesce(reason, '') from operations where target_id = $1 and kind = 'node_pool_scale' \
         order by created_at, id",
    )
    .bind(uuid::Uuid::parse_str(pool).expect("uuid"))
    .fetch_all(&lab.app.db.pool)
    .await
    .expect("operations")
}

#[tokio::test]
async fn a_pending_pod_grows_an_elastic_pool_from_zero_and_it_shrinks_after_the_delay() {
    let Some(lab) = Lab::with(|s| s.autoscale_interval = Duration::from_millis(500)).await else { return };
    machine_class(&lab.app, "cpu", 0).await;
    let machines = lab.enroll("cpu", &["as1"]).await;
    let t = lab.tenant("acme").await;
    let autoscaling = json!({ "min": 0, "max": 2, "scale_down_delay_seconds": 2 });
    let pools = json!([{ "name": "work", "machine_class": "cpu", "count": 0, "autoscaling": autoscaling }]);
    let created = lab.create(&t, super::kubernetes("elastic", pools)).await;
    let (c, pool) = (id(&created["cluster"]), id(&created["cluster"]["node_pools"][0]));
    lab.ready(&t, &c).await;
    let before = pool_at(&lab, &t, &c, &pool, 0).await;

    // A tenant's pod for the pool that no node can take: PLAYS KUBE-SCHEDULER's verdict.
    let pods: Api<Pod> = Api::namespaced(lab.tenant_client(&c), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "trainer" },
        "spec": { "nodeSelector": { LABEL_NODE_POOL: "work" }, "automountServiceAccountToken": false,
                  "containers": [{ "name": "c", "image": "example.invalid/train:1",
                                   "resources": { "requests": { "cpu": "4", "memory": "8Gi" } } }] },
    }))
    .expect("pod");
    // The namespace's default ServiceAccount appears shortly after the API server starts.
    eventually(WAIT, || async { pods.create(&PostParams::default(), &pod).await.ok().map(|_| ()) }).await;
    let unschedulable = json!({ "status": { "phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/0 nodes are available: no nodes available to schedule pods." }] } });
    pods.patch_status("trainer", &PatchParams::default(), &Patch::Merge(&unschedulable)).await.expect("status");

    let grown = pool_at(&lab, &t, &c, &pool, 1).await;
    // A target in status: the spec, its generation and etag stay.
    let spec = |v: &Value| (v["count"].clone(), v["generation"].clone(), v["etag"].clone());
    assert_eq!(spec(&grown), spec(&before), "{grown}");
    let node = lab.pool_nodes(&t, &c, &pool).await.into_iter().next().expect("the grown pool's Node");
    // PLAYS KUBE-SCHEDULER: the pod is bound to the new Node and runs there.
    let binding = json!({ "apiVersion": "v1", "kind": "Binding", "metadata": { "name": "trainer" },
                          "target": { "apiVersion": "v1", "kind": "Node", "name": node } });
    let bound: Result<Value, _> = pods
        .create_subresource("binding", "trainer", &PostParams::default(), serde_json::to_vec(&binding).expect("json"))
        .await;
    bound.expect("the binding");
    let running =
        json!({ "status": { "phase": "Running", "conditions": [{ "type": "PodScheduled", "status": "True" }] } });
    pods.patch_status("trainer", &PatchParams::default(), &Patch::Merge(&running)).await.expect("status");
    let ops = eventually(WAIT, || async {
        let ops = scalings(&lab, &pool).await;
        ops.iter().all(|(state, _)| state == "succeeded").then_some(ops)
    })
    .await;
    assert_eq!(ops, [("succeeded".to_owned(), "scale_up: 1 unschedulable pods need 1 nodes".to_owned())]);

    // The work is done: the Node runs nothing, and after the delay the pool gives it back. PLAYS
    // THE KUBELET: a bound pod's deletion waits for its kubelet, which removes it (grace 0) once
    // its containers stopped; until then it is terminating and keeps its Node busy.
    pods.delete("trainer", &DeleteParams::default()).await.expect("delete the pod");
    pods.delete("trainer", &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
        .await
        .expect("the kubelet's final delete");
    pool_at(&lab, &t, &c, &pool, 0).await;
    eventually(WAIT, || async {
        let m = lab.app.get(format!("/v1/machines/{}", machines[0])).token(&paddock_testkit::admin()).send().await;
        let m = m.expect(200).json();
        (m["state"] == "available" && m["cluster_id"].is_null()).then_some(())
    })
    .await;
    let ops = scalings(&lab, &pool).await;
    assert_eq!(ops.len(), 2, "{ops:?}");
    assert!(ops[1].1.starts_with("scale_down: idle "), "{ops:?}");
    lab.finish().await;
}

/// A Slurm cluster created through the API with an elastic GPU pool at zero: the Controller the
/// real Slurm driver writes declares the pool's `max` nodes of its class (64 cores, 512 GiB, 8
/// GPUs) as `FUTURE` nodes (with room in slurmctld's node table for the pods), so that Slurm
/// accepts work for the machines to come; the fixed CPU pool declares nothing.
#[tokio::test]
async fn a_slurm_clusters_elastic_pool_is_declared_in_slurm_conf_up_to_its_max() {
    let Some(lab) = Lab::new().await else { return };
    machine_class(&lab.app, "cpu", 0).await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.enroll("cpu", &["d1", "d2"]).await;
    lab.enroll("gpu", &["d3"]).await;
    let t = lab.tenant("acme").await;
    let autoscaling = json!({ "min": 0, "max": 3 });
    let body = json!({
        "name": "elastic-hpc", "kind": "slurm", "isolation": "private-nodes",
        "node_pools": [
            { "name": "cpu", "machine_class": "cpu", "count": 1 },
            { "name": "gpu", "machine_class": "gpu", "count": 0, "autoscaling": autoscaling },
            { "name": "sys", "machine_class": "cpu", "count": 1, "role": "system" },
        ],
    });
    let created = lab.create(&t, body).await;
    let c = id(&created["cluster"]);
    lab.ready(&t, &c).await;
    let api: Api<DynamicObject> = Api::namespaced_with(
        lab.tenant_client(&c),
        paddock_kube::slurm::NAMESPACE,
        &paddock_kube::slurm::api_resource("Controller"),
    );
    let controller = api.get(paddock_kube::slurm::CONTROLLER).await.expect("the Controller");
    let conf = controller.data["spec"]["extraConf"].as_str().unwrap_or_default().to_owned();
    assert_eq!(
        conf.lines().collect::<Vec<_>>(),
        [
            "GresTypes=gpu",
            "MaxNodeCount=1027",
            "NodeName=gpu_future[0-2] State=FUTURE Feature=gpu CPUs=64 RealMemory=471859 Gres=gpu:8"
        ],
        "{conf}"
    );
    lab.finish().await;
}
