//! The REAL KubeRay ray-operator (v1.5.0, built from its Go module by `scripts/ray-operator`,
//! `PADDOCK_TEST_RAY_OPERATOR`) reconciling what paddock's real Ray driver ([`KubeRayDriver`])
//! writes, on an API server of the harness with the upstream workload controllers (the garbage
//! collector among them) and the real kube-scheduler: the operator runs as it would in the
//! tenant cluster, with the args of the stack's operator Deployment and a token of its
//! ServiceAccount (RBAC from the stack's manifest,
//! `$PADDOCK_TEST_UPSTREAM_STACKS/2026.12.2/kuberay-operator/kuberay-operator.yaml`), and the
//! stack's KubeRay CRDs.
//!
//! The test PLAYS ONLY what cannot run here:
//! - the kubelets ([`kubelet`]): Nodes of each pool, labelled and tainted by paddock's own node
//!   driver, Ready, GPUs as `nvidia.com/gpu`; pods the scheduler bound are marked Running and
//!   Ready (no Ray image runs), pods being deleted are removed;
//! - the Ray head's health endpoints: a labelled STAND-IN ([`rayhead`]) on this host's routable
//!   address (port 8265, which must be free), given to the head pod as its IP, so that paddock's
//!   probe reaches it through the API server's pod proxy. It proves the probe's path, NOT a Ray
//!   head: that needs a Ray image on a real node.
//!
//! Proven against the real operator: the RayCluster paddock writes is accepted by the CRD's
//! schema, the operator creates the head pod, its Service and the worker pods from it; the
//! scheduler puts the head on the head pool and each worker group on its pool (GPU limits,
//! tolerations); the operator's status (`ready`, `HeadPodReady`, ready workers) is what paddock
//! waits for; a scaled pool changes its group's pods; drift is restored; removal deletes it all.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::discovery::Scope;
use kube::{Api, Client};
use paddock_domain::driver::{RayDesired, RayPool, RayStatus, Removal, TenantAccess};
use paddock_domain::secret::SecretString;
use paddock_kube::nodes::LABEL_NODE_POOL;
use paddock_kube::ray::{self, RaySettings};
use paddock_kube::KubeRayDriver;
use paddock_testkit::skip;
use paddock_types::cluster::{RayHead, RaySpec, Taint, TaintEffect};
use paddock_types::NodePoolId;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::played::operator::{hosts_file, random_loopback, routable_ip, Operator};
use crate::played::{kubelet, rayhead, restd};
use crate::support;

/// The stack whose KubeRay components the test applies.
const STACK: &str = "2026.12.2";
/// The namespace of the operator (the stack component's).
const OPERATOR_NAMESPACE: &str = "ray-system";
/// The Ray release paddock asks for.
const RAY_VERSION: &str = "2.46.0";
/// How long anything may take on a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(300);

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var(var).ok().filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// Everything the test needs from outside, or None (skipped: [`skip`]).
struct Inputs {
    binary: PathBuf,
    crds: Vec<PathBuf>,
    manifest: PathBuf,
    probe_ip: std::net::IpAddr,
}

impl Inputs {
    fn find() -> Option<Self> {
        let binary = env_path("PADDOCK_TEST_RAY_OPERATOR").filter(|p| p.exists());
        let binary = skip::require(
            binary,
            "the ray-operator binary (PADDOCK_TEST_RAY_OPERATOR; scripts/test builds it with scripts/ray-operator) is missing",
        )?;
        let stacks = env_path("PADDOCK_TEST_UPSTREAM_STACKS").map(|d| d.join(STACK));
        let stacks = skip::require(
            stacks.filter(|d| d.join("kuberay-operator/kuberay-operator.yaml").exists()),
            format_args!("the KubeRay manifests of stack {STACK} (PADDOCK_TEST_UPSTREAM_STACKS) are missing"),
        )?;
        let crds = ["rayclusters", "rayjobs", "rayservices"]
            .map(|k| stacks.join(format!("kuberay-crds/ray.io_{k}.yaml")).canonicalize().expect("a KubeRay CRD"))
            .to_vec();
        let manifest = stacks.join("kuberay-operator/kuberay-operator.yaml");
        let probe_ip = skip::require(routable_ip(), crate::slurm_rest::NO_ROUTABLE_ADDRESS)?;
        Some(Self { binary, crds, manifest, probe_ip })
    }
}

/// The documents of a multi-document YAML stream (empty ones dropped).
fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).expect("valid YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// Server-side applies `doc` (strict field validation), namespaced ones into the operator's
/// namespace when they name none (as the stack driver does with the component's namespace).
async fn apply(client: &Client, doc: &Value) {
    let api_version = doc["apiVersion"].as_str().expect("apiVersion");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = doc["kind"].as_str().expect("kind");
    let (resource, caps) =
        kube::discovery::pinned_kind(client, &GroupVersionKind::gvk(group, version, kind)).await.expect("served");
    let name = doc["metadata"]["name"].as_str().expect("name");
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => {
            let ns = doc["metadata"]["namespace"].as_str().unwrap_or(OPERATOR_NAMESPACE);
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let params = PatchParams::apply("paddock-ray-operator-test").force().validation_strict();
    api.patch(name, &params, &Patch::Apply(doc)).await.unwrap_or_else(|e| panic!("applying {kind} {name}: {e}"));
}

/// Applies the stack's operator manifest but its Deployment (the test runs the binary) and
/// returns that Deployment's container args and ServiceAccount, checking the pinned image.
async fn apply_operator(client: &Client, manifest: &std::path::Path) -> (Vec<String>, String) {
    let namespace = json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": OPERATOR_NAMESPACE } });
    apply(client, &namespace).await;
    let mut deployment = None;
    for doc in documents(&std::fs::read_to_string(manifest).expect("the operator manifest")) {
        match doc["kind"].as_str() {
            Some("Deployment") => deployment = Some(doc),
            Some(_) => apply(client, &doc).await,
            None => panic!("a document without a kind in {}", manifest.display()),
        }
    }
    let deployment = deployment.expect("the manifest has the operator's Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["image"], "quay.io/kuberay/operator:v1.5.0");
    let args = pod["containers"][0]["args"].as_array().expect("args");
    let args = args.iter().map(|a| a.as_str().expect("a string").to_owned()).collect();
    (args, pod["serviceAccountName"].as_str().expect("a ServiceAccount").to_owned())
}

/// The Deployment's args, plus what a pod gets from its environment and this machine needs:
/// the leader-election namespace (in a pod, the ServiceAccount's), and listen addresses off
/// the ports others use here.
fn local_args(args: &[String]) -> Vec<String> {
    let port = || std::net::TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("addr").port();
    let mut out = args.to_vec();
    out.extend([
        format!("--leader-election-namespace={OPERATOR_NAMESPACE}"),
        format!("--metrics-addr=127.0.0.1:{}", port()),
        format!("--health-probe-bind-address=127.0.0.1:{}", port()),
    ]);
    out
}

fn pool(name: &str, count: u32, gpus: u32, taints: Vec<Taint>) -> RayPool {
    RayPool { node_pool_id: NodePoolId::new(), name: name.to_owned(), count, gpus_per_node: gpus, taints }
}

/// Registers `count` played Nodes for `pool`, converged by paddock's node driver; their names.
async fn pool_nodes(client: &Client, tenant: &TenantAccess, pool: &RayPool, count: u32, first_ip: u8) -> Vec<String> {
    let of = (pool.node_pool_id, pool.name.as_str(), pool.taints.as_slice());
    kubelet::register_pool(client, tenant, of, pool.gpus_per_node, count, first_ip).await
}

/// The operator and the played parts, checked alive at every poll.
struct Alive {
    operator: Operator,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
    client: Client,
}

impl Drop for Alive {
    fn drop(&mut self) {
        for (_, task) in &self.tasks {
            task.abort();
        }
    }
}

impl Alive {
    fn check(&mut self) {
        self.operator.check();
        for (name, task) in &self.tasks {
            assert!(!task.is_finished(), "the {name} task stopped");
        }
    }

    /// Polls `probe` until it gives Ok, failing with the last answer after [`PATIENCE`].
    async fn until<T, F, Fut>(&mut self, what: &str, mut probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let end = Instant::now() + PATIENCE;
        loop {
            self.check();
            match probe().await {
                Ok(v) => return v,
                Err(missing) if Instant::now() > end => {
                    let pods = kubelet::unready_pods(&self.client).await;
                    panic!(
                        "timed out after {PATIENCE:?} waiting for {what}: {missing}\n{pods}\nthe operator's log ends:\n{}",
                        self.operator.tail()
                    )
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
}

async fn ready(alive: &mut Alive, driver: &KubeRayDriver, tenant: &TenantAccess, want: &RayDesired) -> RayStatus {
    alive
        .until("paddock's Ray to be ready on the real operator's pods", || async move {
            let status = driver.ensure_ray(tenant, want).await.map_err(|e| format!("ensure_ray: {e}"))?;
            if status.ready {
                Ok(status)
            } else {
                Err(status.reason)
            }
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_real_kuberay_operator_reconciles_what_the_ray_driver_writes() {
    let Some(inputs) = Inputs::find() else { return };
    let dir = std::env::temp_dir().join(format!("paddock-ray-operator-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let Some(server) = support::dedicated_with("ray-operator", &inputs.crds, support::WORKLOADS).await else { return };
    let admin = server.client().await;
    let (args, account) = apply_operator(&admin, &inputs.manifest).await;
    let kubeconfig = std::fs::read_to_string(&server.kubeconfig).expect("read the harness kubeconfig");
    let tenant = TenantAccess {
        cluster: support::cluster("acme", "ray"),
        endpoint: server.url.trim_start_matches("https://").to_owned(),
        admin_kubeconfig: SecretString::new(kubeconfig),
    };
    let ns = format!("ray-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let gpu_taint =
        Taint { key: "example.com/gpu".to_owned(), value: "true".to_owned(), effect: TaintEffect::NoSchedule };
    let pools = vec![pool("cpu", 1, 0, Vec::new()), pool("gpu", 2, 4, vec![gpu_taint])];

    // The played kubelets (the head pod gets the routable address where the stand-in listens).
    let head = rayhead::StandInHead::default();
    let mut tasks =
        vec![("Ray head stand-in", head.clone().serve((inputs.probe_ip, ray::DASHBOARD_PORT).into()).await)];
    let unused = restd::StandInRestd::new(b"unused".to_vec());
    tasks.push(("played kubelet", kubelet::spawn(admin.clone(), unused, Some(inputs.probe_ip))));
    let mut nodes = BTreeMap::new();
    for (i, p) in pools.iter().enumerate() {
        let names = pool_nodes(&admin, &tenant, p, p.count, 10 + 10 * i as u8).await;
        nodes.insert(p.name.clone(), names.into_iter().collect::<BTreeSet<_>>());
    }
    pool_nodes(&admin, &tenant, &pool("other", 1, 0, Vec::new()), 1, 100).await;

    // The operator, as in the tenant cluster: the manifest's args and ServiceAccount.
    let operator_kubeconfig = dir.join("operator.kubeconfig");
    let config = support::service_account_kubeconfig(&server, &admin, OPERATOR_NAMESPACE, &account).await;
    std::fs::write(&operator_kubeconfig, config).expect("write the operator's kubeconfig");
    let hosts = hosts_file(&dir, "unused.invalid", random_loopback());
    let operator =
        Operator::start(&inputs.binary, &local_args(&args), &operator_kubeconfig, &hosts, dir.join("operator.log"));
    let mut alive = Alive { operator, tasks, client: admin.clone() };

    let driver = KubeRayDriver::with_pod_proxy(RaySettings { namespace: ns.clone(), ..RaySettings::default() });
    let spec = RaySpec {
        version: Some(RAY_VERSION.to_owned()),
        head: RayHead { node_pool: "cpu".to_owned() },
        dashboard: true,
    };
    let mut want = RayDesired { spec, stack_version: STACK.to_owned(), pools };
    let status = ready(&mut alive, &driver, &tenant, &want).await;
    assert!(head.asked() > 0, "paddock's probe reached the head (stand-in) through the pod proxy");
    assert_eq!(status.ray_client, Some(format!("ray://{}.{ns}.svc:{}", ray::HEAD_SERVICE, ray::CLIENT_PORT)));
    assert_eq!(status.dashboard, Some(format!("http://{}.{ns}.svc:{}", ray::HEAD_SERVICE, ray::DASHBOARD_PORT)));
    assert_placement(&admin, &ns, &want, &nodes).await;
    assert_head_service_stays_inside(&admin, &ns).await;

    // Drift: another hand changes a worker group; the next run restores it and says so.
    let clusters: Api<DynamicObject> = Api::namespaced_with(admin.clone(), &ns, &ray::raycluster_resource());
    let mut groups =
        clusters.get(ray::RAYCLUSTER).await.expect("the RayCluster").data["spec"]["workerGroupSpecs"].clone();
    groups[1]["replicas"] = json!(0);
    let patch = json!({ "spec": { "workerGroupSpecs": groups } });
    let intruder = PatchParams { field_manager: Some("intruder".to_owned()), ..PatchParams::default() };
    clusters.patch(ray::RAYCLUSTER, &intruder, &Patch::Merge(&patch)).await.expect("drift");
    let restored = driver.ensure_ray(&tenant, &want).await.expect("ensure after drift");
    assert!(restored.changed.iter().any(|c| c.contains("RayCluster")), "{:?}", restored.changed);
    let live = clusters.get(ray::RAYCLUSTER).await.expect("the RayCluster");
    assert_eq!(live.data["spec"]["workerGroupSpecs"][1]["replicas"], 2, "restored");

    // Scaling a pool changes its worker group: the operator removes a gpu worker.
    want.pools[1].count = 1;
    ready(&mut alive, &driver, &tenant, &want).await;
    let workers = alive
        .until("one gpu worker left", || {
            let admin = admin.clone();
            let ns = ns.clone();
            async move {
                let n = group_pods(&admin, &ns, "gpu").await.len();
                if n == 1 {
                    Ok(n)
                } else {
                    Err(format!("{n} gpu workers"))
                }
            }
        })
        .await;
    assert_eq!(workers, 1);

    // Removal: the RayCluster and every pod of it gone.
    alive
        .until("the RayCluster and its pods to be gone", || async {
            match driver.remove_ray(&tenant).await.map_err(|e| format!("remove_ray: {e}"))? {
                Removal::Gone => Ok(()),
                Removal::Deleting => Err("deleting".to_owned()),
            }
        })
        .await;
    assert!(clusters.get_opt(ray::RAYCLUSTER).await.expect("read").is_none());
    drop(alive);
    support::delete(&server).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The pods of worker group `group` (KubeRay's `ray.io/group` label).
async fn group_pods(client: &Client, ns: &str, group: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let selector = format!("ray.io/group={group},ray.io/node-type=worker");
    pods.list(&ListParams::default().labels(&selector)).await.expect("list pods").items
}

/// The head on a node of the head pool; each group's workers on its pool's nodes, as many as
/// the pool's count, with the class's GPUs.
async fn assert_placement(client: &Client, ns: &str, want: &RayDesired, nodes: &BTreeMap<String, BTreeSet<String>>) {
    let on = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let heads = pods.list(&ListParams::default().labels("ray.io/node-type=head")).await.expect("heads").items;
    assert_eq!(heads.len(), 1, "one head pod");
    assert!(nodes["cpu"].contains(&on(&heads[0])), "the head is on the head pool: {}", on(&heads[0]));
    for pool in &want.pools {
        let workers = group_pods(client, ns, &pool.name).await;
        assert_eq!(workers.len(), pool.count as usize, "worker group {}", pool.name);
        for w in &workers {
            assert!(nodes[&pool.name].contains(&on(w)), "{}'s worker on {}, not its pool", pool.name, on(w));
            let spec = w.spec.as_ref().expect("spec");
            assert_eq!(spec.node_selector.as_ref().and_then(|s| s.get(LABEL_NODE_POOL)), Some(&pool.name));
            let ray = spec.containers.iter().find(|c| c.name == "ray-worker").expect("the ray-worker container");
            let gpus = ray.resources.as_ref().and_then(|r| r.limits.as_ref()).and_then(|l| l.get("nvidia.com/gpu"));
            assert_eq!(gpus.map(|q| q.0.clone()), (pool.gpus_per_node > 0).then(|| pool.gpus_per_node.to_string()));
        }
    }
}

/// The operator's head Service is a ClusterIP one: nothing of Ray is exposed beyond the cluster.
async fn assert_head_service_stays_inside(client: &Client, ns: &str) {
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    for svc in services.list(&ListParams::default()).await.expect("services").items {
        let kind = svc.spec.as_ref().and_then(|s| s.type_.clone()).unwrap_or_default();
        assert_eq!(kind, "ClusterIP", "Service {:?} is {kind}", svc.metadata.name);
    }
    services.get(ray::HEAD_SERVICE).await.expect("the operator's head Service");
}
