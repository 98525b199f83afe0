//! The harness's workload controllers and real kube-scheduler ([`support::WORKLOADS`]), seen
//! through kube-rs: what the real Slinky operator's workloads will rely on. The tests play only
//! the kubelets ([`support::ready_node`]); pods are created by the real controllers and bound by
//! the real scheduler, so without them every wait here times out.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, ReplicaSet, StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{Container, Namespace, Pod, PodSpec, PodTemplateSpec, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::Client;

use crate::support::{self, ApiServer};

/// How long the controllers and the scheduler get (they act in well under a second when idle;
/// the tests run in parallel on 2 cores).
const WAIT: Duration = Duration::from_secs(90);

/// Pool label of the test Nodes, as paddock's node pools label theirs.
const POOL: &str = "paddock.dev/node-pool";

async fn workloads_server(test: &str) -> Option<(ApiServer, Client)> {
    let server = support::dedicated_with(test, &[], support::WORKLOADS).await?;
    for wanted in ["deployment", "replicaset", "statefulset", "scheduler"] {
        assert!(server.controllers.iter().any(|c| c == wanted), "{wanted} not in {:?}", server.controllers);
    }
    let client = server.client().await;
    Some((server, client))
}

/// Creates namespace `name` and waits for its `default` ServiceAccount (pods need it to be
/// admitted, so the controllers' first creates would only be retried without it).
async fn namespace(client: &Client, name: &str) {
    let ns = Namespace {
        metadata: ObjectMeta { name: Some(name.to_owned()), ..ObjectMeta::default() },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.expect("create the namespace");
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    support::eventually(WAIT, "the default ServiceAccount", || async {
        accounts.get_opt("default").await.ok().flatten()
    })
    .await;
}

fn labels(app: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("app".to_owned(), app.to_owned())])
}

/// A pod template labelled `app`, asking for a Node of `pool` (if any).
fn template(app: &str, pool: Option<&str>) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta { labels: Some(labels(app)), ..ObjectMeta::default() }),
        spec: Some(PodSpec {
            node_selector: pool.map(|p| BTreeMap::from([(POOL.to_owned(), p.to_owned())])),
            containers: vec![Container {
                name: "main".to_owned(),
                image: Some("registry.k8s.io/pause:3.10".to_owned()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
    }
}

fn selector(app: &str) -> LabelSelector {
    LabelSelector { match_labels: Some(labels(app)), ..LabelSelector::default() }
}

/// A StatefulSet `name` of `replicas` pods for `pool`, all created at once (Parallel: no kubelet
/// makes pod-0 Ready here before pod-1 would be created).
fn stateful_set(name: &str, replicas: i32, pool: &str) -> StatefulSet {
    StatefulSet {
        metadata: ObjectMeta { name: Some(name.to_owned()), ..ObjectMeta::default() },
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
            service_name: Some(name.to_owned()),
            pod_management_policy: Some("Parallel".to_owned()),
            selector: selector(name),
            template: template(name, Some(pool)),
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    }
}

/// The pods labelled `app`, sorted by name, with the Node each is bound to (None: unbound).
async fn placements(pods: &Api<Pod>, app: &str) -> Vec<(String, Option<String>)> {
    let list = pods.list(&ListParams::default().labels(&format!("app={app}"))).await.expect("list pods");
    let mut out: Vec<_> = list
        .items
        .into_iter()
        .map(|p| (p.metadata.name.unwrap_or_default(), p.spec.and_then(|s| s.node_name)))
        .collect();
    out.sort();
    out
}

/// Waits until the pods labelled `app` are exactly `want` (names and Nodes).
async fn wait_placements(pods: &Api<Pod>, app: &str, want: &[(&str, Option<&str>)]) {
    let want: Vec<(String, Option<String>)> =
        want.iter().map(|(p, n)| ((*p).to_owned(), n.map(str::to_owned))).collect();
    let what = format!("pods of {app} placed as {want:?}");
    support::eventually(WAIT, &what, || async {
        let got = placements(pods, app).await;
        (got == want).then_some(())
    })
    .await;
}

/// The scheduler's verdict on `pod` (PodScheduled status and reason), if it gave one.
async fn scheduled_condition(pods: &Api<Pod>, pod: &str) -> Option<(String, Option<String>)> {
    let pod = pods.get_opt(pod).await.expect("get the pod")?;
    let conditions = pod.status?.conditions?;
    conditions.into_iter().find(|c| c.type_ == "PodScheduled").map(|c| (c.status, c.reason))
}

/// Each StatefulSet's pods land only on the Node of the pool its nodeSelector names, never on the
/// other pool's, and a pool without Nodes leaves its pod unschedulable: the real scheduler, as
/// the Slinky NodeSets' slurmd pods will be placed.
#[tokio::test]
async fn a_statefulset_with_a_node_selector_lands_only_on_its_pools_node() {
    let Some((server, client)) = workloads_server("workloads-statefulset").await else { return };
    support::ready_node(&client, "node-cpu", &[(POOL, "cpu")]).await;
    let gpu = support::ready_node(&client, "node-gpu", &[(POOL, "gpu"), ("example.com/gpu", "true")]).await;
    let taints = gpu.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(taints.iter().all(|t| t.key != support::NOT_READY_TAINT), "node-gpu still tainted not-ready: {taints:?}");
    namespace(&client, "slurm").await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "slurm");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "slurm");
    for set in [stateful_set("gpu", 3, "gpu"), stateful_set("cpu", 2, "cpu"), stateful_set("fpga", 1, "fpga")] {
        sets.create(&PostParams::default(), &set).await.expect("create the StatefulSet");
    }

    let (on_gpu, on_cpu) = (Some("node-gpu"), Some("node-cpu"));
    wait_placements(&pods, "gpu", &[("gpu-0", on_gpu), ("gpu-1", on_gpu), ("gpu-2", on_gpu)]).await;
    wait_placements(&pods, "cpu", &[("cpu-0", on_cpu), ("cpu-1", on_cpu)]).await;
    // No Node of pool fpga: the scheduler says so and binds the pod nowhere.
    let unschedulable = Some(("False".to_owned(), Some("Unschedulable".to_owned())));
    support::eventually(WAIT, "fpga-0 reported Unschedulable", || async {
        (scheduled_condition(&pods, "fpga-0").await == unschedulable).then_some(())
    })
    .await;
    assert_eq!(placements(&pods, "fpga").await, [("fpga-0".to_owned(), None)]);
    // And nothing moved meanwhile.
    assert_eq!(placements(&pods, "gpu").await.iter().filter(|(_, n)| n.as_deref() != on_gpu).count(), 0);
    support::delete(&server).await;
}

/// A Deployment gets its ReplicaSet, which gets the pods, which the scheduler binds to the one
/// ready Node.
#[tokio::test]
async fn a_deployments_pods_appear() {
    let Some((server, client)) = workloads_server("workloads-deployment").await else { return };
    support::ready_node(&client, "node-0", &[(POOL, "cpu")]).await;
    namespace(&client, "web").await;
    let deployment = Deployment {
        metadata: ObjectMeta { name: Some("web".to_owned()), ..ObjectMeta::default() },
        spec: Some(DeploymentSpec {
            replicas: Some(2),
            selector: selector("web"),
            template: template("web", None),
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    };
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "web");
    let created = deployments.create(&PostParams::default(), &deployment).await.expect("create the Deployment");

    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), "web");
    let set = support::eventually(WAIT, "the Deployment's ReplicaSet", || async {
        let list = sets.list(&ListParams::default()).await.expect("list ReplicaSets");
        list.items.into_iter().next()
    })
    .await;
    let owner = set.metadata.owner_references.clone().unwrap_or_default();
    let deployment_uid = created.metadata.uid.as_deref().expect("Deployment uid");
    assert_eq!(
        owner.iter().map(|o| (o.kind.as_str(), o.uid.as_str())).collect::<Vec<_>>(),
        [("Deployment", deployment_uid)]
    );
    let set_uid = set.metadata.uid.clone().expect("ReplicaSet uid");

    let pods: Api<Pod> = Api::namespaced(client.clone(), "web");
    let bound = support::eventually(WAIT, "2 pods of web bound to node-0", || async {
        let list = pods.list(&ListParams::default().labels("app=web")).await.expect("list pods");
        let bound: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("node-0"))
            .collect();
        (bound.len() == 2).then_some(bound)
    })
    .await;
    for pod in bound {
        let owners = pod.metadata.owner_references.unwrap_or_default();
        assert!(
            owners.iter().any(|o| o.kind == "ReplicaSet" && o.uid == set_uid),
            "{:?} not owned by the ReplicaSet",
            pod.metadata.name
        );
    }
    support::delete(&server).await;
}
