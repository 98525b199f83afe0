//! The Slurm side of a release against a real API server: the NodeSet's `replicas` follows the
//! hand-over of the released machine's slurmd pod (`SlinkyDriver::drain_node`), not the pool's
//! count alone; the Node's drain leaves the slurmd pod to the operator and cordons after it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use paddock_domain::driver::{Drain, SlurmDrain, TenantNodes};
use paddock_kube::nodes::LABEL_NODE_POOL;
use paddock_kube::slurm::{self, LABEL_POD_HOSTNAME};
use paddock_kube::{KubeTenantNodes, SlinkyDriver};
use serde_json::json;

use crate::slurm::{
    access, cr, desired, nodeset_spec, pool, register_node, secrets, server, settings, unique, StandInProbe,
};
use crate::support;

/// A scale-down: the NodeSet keeps counting the released machine's slurmd pod (even in the run
/// that still sees the machine active) until its release drained the Slurm node and handed the
/// pod over; then `replicas` is the pool's count, and only that pod carries the lowest deletion
/// cost.
#[tokio::test]
async fn the_nodeset_shrinks_only_once_the_released_machines_pod_is_handed_over() {
    let Some(server) = server().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let ns = unique("slurm");
    let cpu = unique("cpu");
    let probe = Arc::new(StandInProbe::default());
    let driver = SlinkyDriver::new(settings(&ns), probe.clone());
    let kept = unique("n-kept");
    register_node(&client, &kept, &[(LABEL_NODE_POOL, "cpu")], json!([])).await;
    let machine = crate::nodes::machine();
    crate::nodes::register(&client, &machine.node_name, &machine.system_uuid, true).await;
    let released = machine.node_name.clone();
    let mut want = desired(vec![pool(&cpu, 2, 0, Vec::new())], &secrets());
    want.pools[0].node_names = vec![kept.clone(), released.clone()];
    driver.ensure_slurm(&tenant, &want).await.expect("ensure");

    // PLAYS THE OPERATOR: a slurmd pod of the NodeSet on each Node.
    let uid = cr(&client, &ns, "NodeSet", &cpu).await.expect("NodeSet").metadata.uid.expect("uid");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for (name, node) in [("cpu-0", &kept), ("cpu-1", &released)] {
        let owner = json!({ "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet", "name": cpu, "uid": uid,
                            "controller": true });
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": name, "labels": { LABEL_POD_HOSTNAME: name }, "ownerReferences": [owner] },
            "spec": { "nodeName": node, "containers": [{ "name": "c", "image": "example.invalid/c:1" }] },
        }))
        .expect("pod");
        support::eventually(Duration::from_secs(30), "a pod to be created", || async {
            pods.create(&PostParams::default(), &pod).await.ok().map(|_| ())
        })
        .await;
    }

    // The run that starts the release still sees the machine active; the next one releasing.
    want.pools[0].count = 1;
    driver.ensure_slurm(&tenant, &want).await.expect("scale down");
    assert_eq!(nodeset_spec(&client, &ns, &cpu).await["replicas"], 2, "shrunk before the drain");
    want.pools[0].node_names = vec![kept.clone()];
    want.pools[0].releasing = vec![released.clone()];
    let status = driver.ensure_slurm(&tenant, &want).await.expect("releasing");
    assert_eq!(nodeset_spec(&client, &ns, &cpu).await["replicas"], 2, "shrunk before the drain");
    assert!(status.reason.contains("(1 draining for release)"), "{}", status.reason);

    *probe.drain_answer.lock().expect("lock") = Some(false);
    assert_eq!(
        driver.drain_node(&tenant, &super::slurm::version(), &released).await.expect("drain"),
        SlurmDrain::Draining
    );
    driver.ensure_slurm(&tenant, &want).await.expect("draining");
    assert_eq!(nodeset_spec(&client, &ns, &cpu).await["replicas"], 2, "shrunk while jobs run");

    *probe.drain_answer.lock().expect("lock") = Some(true);
    assert_eq!(
        driver.drain_node(&tenant, &super::slurm::version(), &released).await.expect("drain"),
        SlurmDrain::HandedOver
    );
    driver.ensure_slurm(&tenant, &want).await.expect("handed over");
    assert_eq!(nodeset_spec(&client, &ns, &cpu).await["replicas"], 1);
    assert_eq!(*probe.drained.lock().expect("lock"), vec!["cpu-1".to_owned(), "cpu-1".to_owned()]);
    let cost = |pod: Pod| pod.metadata.annotations.unwrap_or_default().remove(slurm::ANNOTATION_POD_DELETION_COST);
    assert_eq!(cost(pods.get("cpu-1").await.expect("pod")), Some(i32::MIN.to_string()));
    assert_eq!(cost(pods.get("cpu-0").await.expect("pod")), None, "the kept machine's pod");

    // The Node's drain leaves the slurmd pod to the operator and cordons only once it is gone
    // (the operator drains the Slurm nodes of a cordoned Node with its own reason).
    let nodes: &dyn TenantNodes = &KubeTenantNodes::new();
    let drained = nodes.drain_node(&tenant, &machine).await.expect("drain the Node");
    assert_eq!(drained, Drain::Draining { leaving: 1, blocked: 0 });
    let cordoned = || async {
        let node = Api::<Node>::all(client.clone()).get(&released).await.expect("node");
        node.spec.and_then(|s| s.unschedulable) == Some(true)
    };
    assert!(!cordoned().await, "cordoned under its slurmd pod");
    assert!(pods.get("cpu-1").await.expect("pod").metadata.deletion_timestamp.is_none(), "evicted by paddock");
    // PLAYS THE OPERATOR and the kubelet: the condemned pod goes.
    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    pods.delete("cpu-1", &now).await.expect("delete the pod");
    support::eventually(Duration::from_secs(30), "the slurmd pod to go", || async {
        pods.get_opt("cpu-1").await.expect("get").is_none().then_some(())
    })
    .await;
    assert_eq!(nodes.drain_node(&tenant, &machine).await.expect("drain the Node"), Drain::Drained);
    assert!(cordoned().await);
}
