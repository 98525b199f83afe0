//! The release's drain and removal of a Node (`KubeTenantNodes::drain_node`, `remove_node`) against
//! the shared API server as a tenant cluster. The tests play what the harness does not run: the
//! kubelet (Node status, pod status, and the final removal of a pod whose eviction was accepted)
//! and the disruption controller (a PodDisruptionBudget's `status`, which the Eviction
//! subresource reads to allow or refuse).

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use paddock_domain::driver::{Drain, NodeRef, Removal, TenantNodes};
use paddock_kube::nodes::NODE_LEASE_NAMESPACE;
use paddock_kube::KubeTenantNodes;
use serde_json::json;

use crate::nodes::{access, machine, register};
use crate::support;

const WAIT: Duration = Duration::from_secs(30);

/// A fresh namespace, once its `default` ServiceAccount exists (pods are admitted only then).
async fn namespace(client: &Client) -> String {
    let name = format!("drain-{}", uuid::Uuid::new_v4().simple());
    let ns = Namespace {
        metadata: ObjectMeta { name: Some(name.clone()), ..ObjectMeta::default() },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.expect("create the namespace");
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
    support::eventually(WAIT, "the default ServiceAccount", || async {
        accounts.get_opt("default").await.ok().flatten()
    })
    .await;
    name
}

/// Creates pod `name` bound to Node `node` (as the scheduler would have), labelled `app`, owned by
/// `owner` (kind, name, uid) if given; then plays the kubelet: Running and Ready.
async fn pod_on(client: &Client, ns: &str, name: &str, node: &str, app: &str, owner: Option<(&str, &str, &str)>) {
    let owners = owner.map(|(kind, owner_name, uid)| {
        json!([{ "apiVersion": "apps/v1", "kind": kind, "name": owner_name, "uid": uid, "controller": true }])
    });
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { "app": app }, "ownerReferences": owners },
        "spec": { "nodeName": node, "containers": [{ "name": "main", "image": "registry.k8s.io/pause:3.10" }] },
    }))
    .expect("pod");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &pod).await.unwrap_or_else(|e| panic!("creating pod {name}: {e}"));
    let status = json!({ "status": {
        "phase": "Running",
        "conditions": [{ "type": "Ready", "status": "True" }],
    } });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("pod status");
}

/// Plays the kubelet of a drained Node: every pod of `ns` whose eviction was accepted (it is
/// terminating) is gone once its containers stopped.
async fn kubelet_confirms(client: &Client, ns: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for pod in pods.list(&Default::default()).await.expect("pods").items {
        if pod.metadata.deletion_timestamp.is_some() {
            let name = pod.metadata.name.expect("name");
            pods.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
                .await
                .expect("the kubelet's final delete");
        }
    }
}

/// The pods of `ns`: name and whether they are terminating.
async fn pods_of(client: &Client, ns: &str) -> BTreeMap<String, bool> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods.list(&Default::default()).await.expect("pods").items;
    list.into_iter().map(|p| (p.metadata.name.expect("name"), p.metadata.deletion_timestamp.is_some())).collect()
}

/// Plays the disruption controller: `pdb`'s status as it would compute it for one healthy pod
/// and the budget's current `minAvailable` (`allowed` disruptions).
async fn budget_status(client: &Client, ns: &str, pdb: &str, desired: i32, allowed: i32) {
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    let generation = pdbs.get(pdb).await.expect("pdb").metadata.generation;
    let status = json!({ "status": {
        "observedGeneration": generation, "currentHealthy": 1, "desiredHealthy": desired,
        "expectedPods": 1, "disruptionsAllowed": allowed,
    } });
    pdbs.patch_status(pdb, &PatchParams::default(), &Patch::Merge(&status)).await.expect("pdb status");
}

async fn drain(driver: &dyn TenantNodes, tenant: &paddock_domain::driver::TenantAccess, m: &NodeRef) -> Drain {
    driver.drain_node(tenant, m).await.expect("drain")
}

#[tokio::test]
async fn the_drain_evicts_pods_leaves_daemonset_pods_and_waits_for_a_disruption_budget() {
    let Some(server) = support::shared().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let driver: &dyn TenantNodes = &KubeTenantNodes::new();
    let m = machine();
    register(&client, &m.node_name, &m.system_uuid, true).await;
    let ns = namespace(&client).await;

    // A DaemonSet's pod (the harness runs no DaemonSet controller: the test makes its pod, owned
    // by the real DaemonSet so that the garbage collector keeps it), a plain pod, and a pod that a
    // budget of minAvailable 1 guards.
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": { "name": "agent" },
        "spec": { "selector": { "matchLabels": { "app": "agent" } }, "template": {
            "metadata": { "labels": { "app": "agent" } },
            "spec": { "containers": [{ "name": "main", "image": "registry.k8s.io/pause:3.10" }] } } },
    }))
    .expect("daemonset");
    let ds = Api::<DaemonSet>::namespaced(client.clone(), &ns).create(&PostParams::default(), &ds).await.expect("ds");
    let uid = ds.metadata.uid.expect("uid");
    pod_on(&client, &ns, "agent-x", &m.node_name, "agent", Some(("DaemonSet", "agent", &uid))).await;
    pod_on(&client, &ns, "plain", &m.node_name, "plain", None).await;
    pod_on(&client, &ns, "guarded", &m.node_name, "guarded", None).await;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": { "name": "guarded" },
        "spec": { "minAvailable": 1, "selector": { "matchLabels": { "app": "guarded" } } },
    }))
    .expect("pdb");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    pdbs.create(&PostParams::default(), &pdb).await.expect("pdb");
    budget_status(&client, &ns, "guarded", 1, 0).await;

    // First round: cordoned, the plain pod evicted (terminating until its kubelet confirms), the
    // guarded one refused (429: a wait, not an error), the DaemonSet's left alone.
    assert_eq!(drain(driver, &tenant, &m).await, Drain::Draining { leaving: 1, blocked: 1 });
    let node = Api::<Node>::all(client.clone()).get(&m.node_name).await.expect("node");
    assert_eq!(node.spec.and_then(|s| s.unschedulable), Some(true), "cordoned");
    let want =
        BTreeMap::from([("agent-x".to_owned(), false), ("guarded".to_owned(), false), ("plain".to_owned(), true)]);
    assert_eq!(pods_of(&client, &ns).await, want);
    kubelet_confirms(&client, &ns).await;

    // While the budget forbids it, the drain waits, round after round.
    assert_eq!(drain(driver, &tenant, &m).await, Drain::Draining { leaving: 0, blocked: 1 });
    assert_eq!(pods_of(&client, &ns).await.get("guarded"), Some(&false), "evicted against its budget");

    // The tenant lowers its budget; the disruption controller allows one disruption.
    let patch = json!({ "spec": { "minAvailable": 0 } });
    pdbs.patch("guarded", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("lower the budget");
    budget_status(&client, &ns, "guarded", 0, 1).await;
    assert_eq!(drain(driver, &tenant, &m).await, Drain::Draining { leaving: 1, blocked: 0 });
    assert_eq!(pods_of(&client, &ns).await.get("guarded"), Some(&true), "evicted once allowed");
    kubelet_confirms(&client, &ns).await;

    // Only the DaemonSet's pod is left: drained, and a repeat changes nothing.
    assert_eq!(drain(driver, &tenant, &m).await, Drain::Drained);
    assert_eq!(drain(driver, &tenant, &m).await, Drain::Drained);
    assert_eq!(pods_of(&client, &ns).await, BTreeMap::from([("agent-x".to_owned(), false)]));

    // No Node (removed already, or never registered): nothing to drain.
    let other = machine();
    assert_eq!(drain(driver, &tenant, &other).await, Drain::Drained);
    Api::<Namespace>::all(client.clone()).delete(&ns, &DeleteParams::default()).await.expect("delete the namespace");
}

#[tokio::test]
async fn removing_a_node_deletes_its_lease_and_certificate_requests_once_the_node_is_gone() {
    let Some(server) = support::shared().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let driver: &dyn TenantNodes = &KubeTenantNodes::new();
    let m = machine();
    register(&client, &m.node_name, &m.system_uuid, true).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    let lease: Lease = serde_json::from_value(
        json!({ "metadata": { "name": m.node_name }, "spec": { "holderIdentity": m.node_name } }),
    )
    .expect("lease");
    leases.create(&PostParams::default(), &lease).await.expect("lease");
    // The node's client certificate request (as its kubelet's bootstrap made it), and another
    // node's, which stays.
    let other = machine();
    let (mine, theirs) = (csr(&client, &m.node_name).await, csr(&client, &other.node_name).await);

    assert_eq!(driver.remove_node(&tenant, &m).await.expect("remove"), Removal::Gone);
    assert!(Api::<Node>::all(client.clone()).get_opt(&m.node_name).await.expect("get").is_none(), "node left");
    assert!(leases.get_opt(&m.node_name).await.expect("get").is_none(), "the lease is left");
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    assert!(csrs.get_opt(&mine).await.expect("get").is_none(), "the node's certificate request is left");
    assert!(csrs.get_opt(&theirs).await.expect("get").is_some(), "another node's certificate request went too");
    csrs.delete(&theirs, &DeleteParams::default()).await.expect("delete");
    // Again: nothing left is a success.
    assert_eq!(driver.remove_node(&tenant, &m).await.expect("remove again"), Removal::Gone);
}

/// A client certificate request for node `name` (subject `system:node:<name>`, made by the admin
/// here, as the bootstrap token's user makes it for a joining kubelet); its name.
async fn csr(client: &Client, name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("paddock-drain-csr-{name}"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (_, request) = crate::join::key_and_csr(&dir, &format!("system:node:{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    let body: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": { "generateName": "node-csr-" },
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(request),
            "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
            "usages": ["digital signature", "client auth"],
        },
    }))
    .expect("CSR");
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let created = csrs.create(&PostParams::default(), &body).await.expect("create the CSR");
    created.metadata.name.expect("a name")
}

#[tokio::test]
async fn a_node_that_is_not_ready_is_drained_without_waiting_for_its_kubelet() {
    let Some(server) = support::shared().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let driver: &dyn TenantNodes = &KubeTenantNodes::new();
    let m = machine();
    // The kubelet stopped answering (the machine hung): its pods' evictions are never confirmed.
    register(&client, &m.node_name, &m.system_uuid, false).await;
    let ns = namespace(&client).await;
    pod_on(&client, &ns, "stuck", &m.node_name, "stuck", None).await;

    assert_eq!(drain(driver, &tenant, &m).await, Drain::Drained, "waits for a kubelet that is not there");
    assert_eq!(pods_of(&client, &ns).await, BTreeMap::from([("stuck".to_owned(), true)]), "evicted all the same");
    Api::<Namespace>::all(client.clone()).delete(&ns, &DeleteParams::default()).await.expect("delete the namespace");
}
