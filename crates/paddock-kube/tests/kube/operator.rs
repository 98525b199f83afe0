//! The REAL Slinky slurm-operator (v1.2.1, built from the upstream tarball by
//! `scripts/slurm-operator`, `PADDOCK_TEST_SLURM_OPERATOR`) reconciling what paddock's real Slurm
//! driver ([`SlinkyDriver`]) writes, on an API server of the harness with the upstream workload
//! controllers and the real kube-scheduler: the operator runs as it would in the tenant cluster,
//! with a token of its chart's ServiceAccount (RBAC from the rendered chart,
//! `$PADDOCK_TEST_UPSTREAM_STACKS/2026.12.0/slurm-operator/slurm-operator.yaml`) and the Slinky
//! CRDs of the same tarball.
//!
//! The test PLAYS ONLY what cannot run here:
//! - the kubelets ([`kubelet`]): Nodes of each pool, labelled and tainted by paddock's own node
//!   driver ([`KubeTenantNodes`]), Ready, with capacity (GPUs as `nvidia.com/gpu`, as the device
//!   plugin would report them); pods that the scheduler bound are marked Running and Ready, pods
//!   being deleted are removed;
//! - a volume provisioner ([`provisioner`]) binding each claim to a new PersistentVolume;
//! - slurmrestd: a labelled STAND-IN ([`restd`]), since no Slurm 25.11 can run on these machines.
//!   It answers the `v0.0.44` API that slurm-client v1.2.1 speaks (nodes, reservations, jobs),
//!   only to tokens signed with the JWT key paddock wrote, and lists a Slurm node for each slurmd
//!   pod the played kubelet started (as `slurmd -Z` registers itself). The operator reaches it by
//!   the Service name it dials (`slurm-restapi.<namespace>:6820`): it runs under
//!   `unshare --mount` with a private `/etc/hosts` naming a random loopback address of the
//!   stand-in. The stand-in also listens on this host's routable address, port 6820 (which must
//!   be free), given to slurmrestd's pod as its IP, so that paddock's own probe reaches it
//!   through the API server's service proxy and the driver reports the cluster ready. A host
//!   without a routable address cannot prove that (the API server proxies to no loopback
//!   address): the test is skipped there ([`skip`]: a failure under `CI=true`).
//!
//! Waits are deadline-based ([`PATIENCE`]) and name what is still missing; a played task or the
//! operator stopping fails the test at once, with the end of the operator's log.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret};
use kube::api::{DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::discovery::Scope;
use kube::{Api, Client};
use paddock_domain::driver::{DemandPool, SlurmDesired, SlurmPool, SlurmSecrets, SlurmVersion, TenantAccess};
use paddock_domain::secret::SecretString;
use paddock_kube::nodes::LABEL_NODE_POOL;
use paddock_kube::slurm::{self, SlinkySettings, SECRET_JWT, SECRET_JWT_KEY, SECRET_SLURM_KEY};
use paddock_kube::SlinkyDriver;
use paddock_testkit::skip;
use paddock_types::cluster::{LoginSpec, NodePoolRole, SlurmSpec, Taint, TaintEffect};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::played::operator::{deployment_args, hosts_file, local_args, random_loopback, routable_ip, Operator};
use crate::played::{kubelet, provisioner, restd};
use crate::slurm::{pool, secrets};
use crate::support::{self, ApiServer};

/// The stack whose rendered operator chart the test applies.
const STACK: &str = "2026.12.0";
/// The operator's release, as in the tarball's name.
const OPERATOR_VERSION: &str = "1.2.1";
/// The namespace the chart was rendered for.
const OPERATOR_NAMESPACE: &str = "slinky";
/// The Slurm release paddock asks for (the operator supports 25.11 and newer).
const SLURM_VERSION: &str = "25.11";
/// How long anything may take on a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(300);

/// A required input of this test, or None (the test is skipped: [`skip`]).
fn required(what: &str, path: Option<PathBuf>) -> Option<PathBuf> {
    skip::require(path.filter(|p| p.exists()), format_args!("{what} is missing"))
}

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var(var).ok().filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// The upstream tarball (`PADDOCK_UPSTREAM_DIR`, default `../shared/upstream` beside the repo).
fn tarball() -> Option<PathBuf> {
    let dir = env_path("PADDOCK_UPSTREAM_DIR")
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/upstream"));
    let file = dir.join(format!("slurm-operator/slurm-operator-{OPERATOR_VERSION}.tar.gz"));
    required(&format!("the slurm-operator tarball {}", file.display()), Some(file))
}

/// The Slinky CRDs of the tarball (`helm/slurm-operator-crds/templates`), unpacked into `dir`.
fn crds(tarball: &Path, dir: &Path) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).expect("a directory for the CRDs");
    let templates = format!("slurm-operator-{OPERATOR_VERSION}/helm/slurm-operator-crds/templates");
    let out = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(tarball)
        .arg("-C")
        .arg(dir)
        .arg(&templates)
        .output()
        .expect("running tar");
    assert!(out.status.success(), "unpacking the CRDs: {}", String::from_utf8_lossy(&out.stderr));
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join(&templates))
        .expect("the CRD templates")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 6, "the six Slinky CRDs in {templates}: {files:?}");
    files.into_iter().map(|f| f.canonicalize().expect("canonical CRD path")).collect()
}

/// The documents of a multi-document YAML stream (empty ones dropped).
fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).expect("valid YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// Server-side applies `doc` (strict field validation), through discovery.
async fn apply(client: &Client, doc: &Value) {
    let api_version = doc["apiVersion"].as_str().expect("apiVersion");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = doc["kind"].as_str().expect("kind");
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await.expect("the kind is served");
    let name = doc["metadata"]["name"].as_str().expect("name");
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => {
            let ns = doc["metadata"]["namespace"].as_str().unwrap_or(OPERATOR_NAMESPACE);
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let params = PatchParams::apply("paddock-operator-test").force().validation_strict();
    api.patch(name, &params, &Patch::Apply(doc)).await.unwrap_or_else(|e| panic!("applying {kind} {name}: {e}"));
}

/// Applies the rendered chart but its Deployment (the test runs the binary itself) and returns
/// that Deployment's container arguments and ServiceAccount.
async fn apply_chart(client: &Client, chart: &Path) -> (Vec<String>, String) {
    let yaml = std::fs::read_to_string(chart).expect("the rendered chart");
    let namespace = json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": OPERATOR_NAMESPACE } });
    apply(client, &namespace).await;
    let mut deployment = None;
    for doc in documents(&yaml) {
        match doc["kind"].as_str() {
            Some("Deployment") => deployment = Some(doc),
            Some(_) => apply(client, &doc).await,
            None => panic!("a document without a kind in {}", chart.display()),
        }
    }
    let deployment = deployment.expect("the chart renders the operator's Deployment");
    deployment_args(&deployment, OPERATOR_VERSION)
}

/// A kubeconfig holding a fresh token of the operator's ServiceAccount, as the pod's projected
/// token would be: the operator gets exactly its chart's RBAC, not admin.
async fn operator_kubeconfig(server: &ApiServer, admin: &Client, account: &str, path: &Path) {
    let kubeconfig = support::service_account_kubeconfig(server, admin, OPERATOR_NAMESPACE, account).await;
    std::fs::write(path, kubeconfig).expect("write the operator's kubeconfig");
}

/// What must stay alive while the test waits: the operator and the played parts.
struct Alive {
    operator: Operator,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
    /// The API server's admin (for the pods' state in failure messages).
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
    /// Fails the test, naming it, when any of them stopped.
    fn check(&mut self) {
        self.operator.check();
        for (name, task) in &mut self.tasks {
            if task.is_finished() {
                let result = futures::FutureExt::now_or_never(task).expect("finished");
                panic!("the {name} task stopped: {result:?}");
            }
        }
    }

    /// Polls `probe` (the last answer kept for the failure message) until it gives Some.
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

/// Registers the Nodes of `pool` (played kubelets) converged by paddock's node driver; their names.
async fn pool_nodes(client: &Client, tenant: &TenantAccess, pool: &SlurmPool, first_ip: u8) -> Vec<String> {
    let of = (pool.node_pool_id, pool.name.as_str(), pool.taints.as_slice());
    kubelet::register_pool(client, tenant, of, pool.gpus_per_node, pool.count, first_ip).await
}

/// Everything the test needs from outside, or None (the test is skipped: [`skip`]).
struct Inputs {
    binary: PathBuf,
    tarball: PathBuf,
    chart: PathBuf,
    /// This host's routable address, where the slurmrestd stand-in also listens for paddock's probe.
    probe_ip: std::net::IpAddr,
}

impl Inputs {
    fn find() -> Option<Self> {
        let binary = required("the slurm-operator binary (PADDOCK_TEST_SLURM_OPERATOR; scripts/test builds it with scripts/slurm-operator)", env_path("PADDOCK_TEST_SLURM_OPERATOR"))?;
        let tarball = tarball()?;
        let chart =
            env_path("PADDOCK_TEST_UPSTREAM_STACKS").map(|d| d.join(STACK).join("slurm-operator/slurm-operator.yaml"));
        let chart =
            required(&format!("the rendered operator chart of stack {STACK} (PADDOCK_TEST_UPSTREAM_STACKS)"), chart)?;
        let probe_ip = skip::require(routable_ip(), crate::slurm_rest::NO_ROUTABLE_ADDRESS)?;
        Some(Self { binary, tarball, chart, probe_ip })
    }
}

/// The played parts: the slurmrestd STAND-IN (on a random loopback address for the operator, and
/// on this host's routable address `probe_ip` for paddock's probe through the API server's service
/// proxy), the kubelets and the provisioner.
struct Played {
    restd: restd::StandInRestd,
    loopback: Ipv4Addr,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

impl Played {
    async fn start(admin: &Client, secrets: &SlurmSecrets, probe_ip: std::net::IpAddr) -> Self {
        let key = base64::engine::general_purpose::STANDARD.decode(secrets.jwt_hs256_key.expose()).expect("b64");
        let restd = restd::StandInRestd::new(key);
        let loopback = random_loopback();
        let mut tasks =
            vec![("slurmrestd stand-in", restd.clone().serve((loopback, slurm::RESTAPI_PORT).into()).await)];
        tasks.push(("slurmrestd stand-in (probe)", restd.clone().serve((probe_ip, slurm::RESTAPI_PORT).into()).await));
        tasks.push(("played kubelet", kubelet::spawn(admin.clone(), restd.clone(), Some(probe_ip))));
        let class = slurm::DEFAULT_STORAGE_CLASS.to_owned();
        tasks.push(("played provisioner", provisioner::spawn(admin.clone(), class)));
        Self { restd, loopback, tasks }
    }
}

/// The cluster's Slurm as the worker hands it to the driver: the release, one login pod with
/// root's key, the pools, the sealed secrets.
fn desired(pools: &[SlurmPool], secrets: &SlurmSecrets) -> SlurmDesired {
    SlurmDesired {
        spec: SlurmSpec {
            version: SLURM_VERSION.to_owned(),
            partitions: Vec::new(),
            login: LoginSpec {
                replicas: 1,
                ssh_authorized_keys: vec!["ssh-ed25519 AAAAC3Nza alice@example".to_owned()],
            },
            accounts: Vec::new(),
            cancel_jobs_on_removal: false,
        },
        stack_version: STACK.to_owned(),
        pools: pools.to_vec(),
        secrets: secrets.clone(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_real_operator_reconciles_what_the_slurm_driver_writes() {
    let Some(inputs) = Inputs::find() else { return };
    let dir = std::env::temp_dir().join(format!("paddock-operator-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let crds = crds(&inputs.tarball, &dir.join("crds"));
    let Some(server) = support::dedicated_with("operator", &crds, support::WORKLOADS).await else { return };
    let admin = server.client().await;
    let (args, account) = apply_chart(&admin, &inputs.chart).await;
    provisioner::storage_class(&admin, slurm::DEFAULT_STORAGE_CLASS).await;
    let kubeconfig = std::fs::read_to_string(&server.kubeconfig).expect("read the harness kubeconfig");
    let tenant = TenantAccess {
        cluster: support::cluster("acme", "hpc"),
        endpoint: server.url.trim_start_matches("https://").to_owned(),
        admin_kubeconfig: SecretString::new(kubeconfig),
    };
    let ns = format!("slurm-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let secrets = secrets();
    let gpu_taint =
        Taint { key: "example.com/gpu".to_owned(), value: "true".to_owned(), effect: TaintEffect::NoSchedule };
    // The system pool (tainted, so its tolerations are proved too) carries the control pods.
    let control_taint =
        Taint { key: "example.com/control".to_owned(), value: String::new(), effect: TaintEffect::NoSchedule };
    let mut system = pool("sys", 1, 0, vec![control_taint]);
    system.role = NodePoolRole::System;
    // The GPU pool is elastic: slurm.conf declares its max nodes ahead of its machines.
    let mut gpu = pool("gpu", 1, 4, vec![gpu_taint]);
    gpu.autoscaling_max = Some(3);
    let mut pools = vec![pool("cpu", 2, 0, Vec::new()), gpu, system];

    let played = Played::start(&admin, &secrets, inputs.probe_ip).await;
    let (restd, loopback) = (played.restd.clone(), played.loopback);

    // The pools' Nodes (and one of another pool, which no NodeSet may use).
    let mut nodes = BTreeMap::new();
    for (i, p) in pools.iter_mut().enumerate() {
        p.node_names = pool_nodes(&admin, &tenant, p, 10 + 10 * i as u8).await;
        nodes.insert(p.name.clone(), p.node_names.iter().cloned().collect::<BTreeSet<_>>());
    }
    pool_nodes(&admin, &tenant, &pool("other", 1, 0, Vec::new()), 100).await;

    // The operator, as in the tenant cluster: its chart's args and ServiceAccount.
    let kubeconfig = dir.join("operator.kubeconfig");
    operator_kubeconfig(&server, &admin, &account, &kubeconfig).await;
    let hosts = hosts_file(&dir, &format!("{}.{ns}", slurm::RESTAPI_SERVICE), loopback);
    let args = local_args(&args);
    let operator = Operator::start(&inputs.binary, &args, &kubeconfig, &hosts, dir.join("operator.log"));
    let mut alive = Alive { operator, tasks: played.tasks, client: admin.clone() };

    // paddock's real driver, as the worker runs it, until Slurm is ready.
    let settings = SlinkySettings { namespace: ns.clone(), ..SlinkySettings::default() };
    let driver = SlinkyDriver::with_service_proxy(settings);
    let want = desired(&pools, &secrets);
    let (d, t, w) = (&driver, &tenant, &want);
    let status = alive
        .until("paddock's Slurm to be ready on the real operator's workloads", || async move {
            let status = d.ensure_slurm(t, w).await.map_err(|e| format!("ensure_slurm: {e}"))?;
            if status.ready {
                Ok(status)
            } else {
                Err(status.reason)
            }
        })
        .await;
    eprintln!("Slurm ready on the real operator: REST API {:?}, login {:?}", status.rest_api, status.login_ssh);

    let compute: Vec<SlurmPool> = pools.iter().filter(|p| p.role == NodePoolRole::Compute).cloned().collect();
    assert_placement(&admin, &ns, &compute, &nodes).await;
    assert_control_pods_on_the_system_pool(&admin, &ns, "sys", &nodes["sys"]).await;
    assert_workloads(&admin, &ns, &want, &tenant).await;
    assert_slurm_nodes(&mut alive, &restd, &admin, &ns, &compute).await;
    assert_fault_reports_read(&restd, &driver, &tenant, &admin, &ns).await;
    assert_demand(&driver, &tenant, &restd, &compute).await;

    drop(alive);
    support::delete(&server).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// paddock's demand read of elastic pools (its probe, through the API server's service proxy, on
/// the stand-in's v0.0.42 job and node lists) finds each pool's Slurm nodes by what the REAL
/// operator gave them (the NodeSet's feature, its pod's information in the node's comment), on
/// the pool's Nodes and idle; a job waiting in a pool's partition is that pool's demand.
async fn assert_demand(driver: &SlinkyDriver, tenant: &TenantAccess, restd: &restd::StandInRestd, pools: &[SlurmPool]) {
    let asked: Vec<DemandPool> = pools
        .iter()
        .map(|p| DemandPool {
            node_pool_id: p.node_pool_id,
            name: p.name.clone(),
            partitions: vec![p.name.clone()],
            node_names: p.node_names.clone(),
            labels: BTreeMap::new(),
            taints: p.taints.clone(),
            cpu_cores: 16,
            memory_gib: 64,
            gpus: p.gpus_per_node,
        })
        .collect();
    let version = SlurmVersion { stack_version: STACK.to_owned(), version: SLURM_VERSION.to_owned() };
    let at_rest = driver.job_demand(tenant, &version, &asked).await.expect("the demand at rest");
    for (pool, demand) in pools.iter().zip(&at_rest.pools) {
        let counts = (demand.nodes, demand.idle_nodes, demand.pending, demand.pending_nodes);
        assert_eq!(counts, (pool.count, pool.count, 0, 0), "pool {}: {demand:?}", pool.name);
    }
    let on_pool_nodes = pools.iter().flat_map(|p| &p.node_names).collect::<BTreeSet<_>>();
    assert!(at_rest.idle_node_names.iter().all(|n| on_pool_nodes.contains(n)), "{:?}", at_rest.idle_node_names);
    let idle: usize = pools.iter().map(|p| p.count as usize).sum();
    assert_eq!(at_rest.idle_node_names.len(), idle, "{:?}", at_rest.idle_node_names);

    restd.submit(&pools[0].name, 3, 4);
    let waiting = driver.job_demand(tenant, &version, &asked).await.expect("the demand with a job waiting");
    assert_eq!((waiting.pools[0].pending, waiting.pools[0].pending_nodes), (1, 3), "{waiting:?}");
}

async fn assert_placement(client: &Client, ns: &str, pools: &[SlurmPool], nodes: &BTreeMap<String, BTreeSet<String>>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pods = pods.list(&ListParams::default()).await.expect("list the pods").items;
    for pool in pools {
        let of_pool: Vec<&Pod> = pods
            .iter()
            .filter(|p| {
                p.metadata.owner_references.iter().flatten().any(|o| o.kind == "NodeSet" && o.name == pool.name)
            })
            .collect();
        assert_eq!(of_pool.len(), pool.count as usize, "NodeSet {}'s pods", pool.name);
        for pod in of_pool {
            let on = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
            assert!(
                nodes[&pool.name].contains(&on),
                "the scheduler put {}'s pod {} on {on}, not on a Node of its pool ({:?})",
                pool.name,
                pod.metadata.name.as_deref().unwrap_or_default(),
                nodes[&pool.name]
            );
        }
    }
}

/// The system pool has no NodeSet; the operator's control workloads and MariaDB select its nodes
/// (and tolerate its taint), and the scheduler put every control pod on one of them.
async fn assert_control_pods_on_the_system_pool(client: &Client, ns: &str, system: &str, on: &BTreeSet<String>) {
    let nodesets: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &slurm::api_resource("NodeSet"));
    assert!(nodesets.get_opt(system).await.expect("get the NodeSet").is_none(), "the system pool got a NodeSet");
    let selector = json!({ LABEL_NODE_POOL: system });
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let mut templates = Vec::new();
    for name in [slurm::MARIADB, slurm::CONTROLLER_WORKLOAD, slurm::ACCOUNTING_WORKLOAD] {
        let set = statefulsets.get(name).await.expect("get the StatefulSet");
        templates.push((name, serde_json::to_value(set.spec.expect("spec").template).expect("json")));
    }
    for name in [slurm::RESTAPI_SERVICE, slurm::LOGIN_SERVICE] {
        let deployment = deployments.get(name).await.expect("get the Deployment");
        templates.push((name, serde_json::to_value(deployment.spec.expect("spec").template).expect("json")));
    }
    for (name, template) in &templates {
        assert_eq!(template["spec"]["nodeSelector"], selector, "{name}'s pods select the system pool's nodes");
        let tolerations = template["spec"]["tolerations"].as_array().cloned().unwrap_or_default();
        assert!(
            tolerations.iter().any(|t| t["key"] == "example.com/control"),
            "{name}'s pods tolerate the system pool's taint: {tolerations:?}"
        );
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut control = 0;
    for pod in pods.list(&ListParams::default()).await.expect("list the pods").items {
        if pod.metadata.owner_references.iter().flatten().any(|o| o.kind == "NodeSet") {
            continue;
        }
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let name = pod.metadata.name.unwrap_or_default();
        assert!(on.contains(&node), "the control pod {name} runs on {node:?}, not on the system pool's {on:?}");
        control += 1;
    }
    assert!(control >= templates.len(), "{control} control pods for {} workloads", templates.len());
}

/// The (Secret or ConfigMap, key) pairs a pod template's projected volumes take.
fn projected(template: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for volume in template["spec"]["volumes"].as_array().into_iter().flatten() {
        for source in volume["projected"]["sources"].as_array().into_iter().flatten() {
            for kind in ["secret", "configMap"] {
                let Some(name) = source[kind]["name"].as_str() else { continue };
                let keys: Vec<&str> =
                    source[kind]["items"].as_array().into_iter().flatten().filter_map(|i| i["key"].as_str()).collect();
                for key in if keys.is_empty() { vec!["*"] } else { keys } {
                    out.insert((kind.to_owned(), name.to_owned(), key.to_owned()));
                }
            }
        }
    }
    out
}

fn has(refs: &BTreeSet<(String, String, String)>, kind: &str, name: &str, key: &str) -> bool {
    refs.contains(&(kind.to_owned(), name.to_owned(), key.to_owned()))
}

/// The images of a pod template's containers and init containers, by container name.
fn images(template: &Value) -> BTreeMap<String, String> {
    let spec = &template["spec"];
    let all = spec["containers"].as_array().into_iter().chain(spec["initContainers"].as_array()).flatten();
    all.map(|c| (c["name"].as_str().unwrap_or_default().to_owned(), c["image"].as_str().unwrap_or_default().to_owned()))
        .collect()
}

async fn template_of<K>(client: &Client, ns: &str, name: &str) -> Value
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let object = api.get(name).await.unwrap_or_else(|e| panic!("the operator's workload {name}: {e}"));
    serde_json::to_value(object).expect("json")["spec"]["template"].clone()
}

/// The operator's slurmctld, slurmdbd, slurmrestd and login workloads run the pinned images of
/// the Slurm release paddock asked for, with paddock's keys, database and partitions.
async fn assert_workloads(client: &Client, ns: &str, want: &SlurmDesired, tenant: &TenantAccess) {
    let catalog = slurm::SlurmCatalog::embedded();
    let pinned = catalog.images(STACK, SLURM_VERSION).expect("the stack runs the release");
    let image = |component: &str| pinned.of(component);
    let (slurm_key, jwt_key) = (slurm::SECRET_SLURM_KEY_KEY, SECRET_JWT_KEY);

    let controller = template_of::<StatefulSet>(client, ns, slurm::CONTROLLER_WORKLOAD).await;
    let want_images =
        BTreeMap::from([("slurmctld".to_owned(), image("slurmctld")), ("logfile".to_owned(), image("slurmctld"))]);
    assert_eq!(images(&controller), want_images, "slurmctld's containers");
    let refs = projected(&controller);
    assert!(has(&refs, "secret", SECRET_SLURM_KEY, slurm_key) && has(&refs, "secret", SECRET_JWT, jwt_key), "{refs:?}");
    assert!(
        has(&refs, "configMap", "slurm-config", "*") && has(&refs, "configMap", slurm::CONFIG_FILES, "*"),
        "{refs:?}"
    );

    let accounting = template_of::<StatefulSet>(client, ns, slurm::ACCOUNTING_WORKLOAD).await;
    assert_eq!(images(&accounting), BTreeMap::from([("slurmdbd".to_owned(), image("slurmdbd"))]));
    let refs = projected(&accounting);
    assert!(has(&refs, "secret", SECRET_SLURM_KEY, slurm_key) && has(&refs, "secret", SECRET_JWT, jwt_key), "{refs:?}");
    assert!(has(&refs, "secret", "slurm-accounting", "slurmdbd.conf"), "{refs:?}");
    assert_slurmdbd_conf(client, ns, want).await;

    let restapi = template_of::<Deployment>(client, ns, slurm::RESTAPI_SERVICE).await;
    assert_eq!(images(&restapi), BTreeMap::from([("slurmrestd".to_owned(), image("slurmrestd"))]));
    assert!(has(&projected(&restapi), "secret", SECRET_SLURM_KEY, slurm_key), "{:?}", projected(&restapi));

    let login = template_of::<Deployment>(client, ns, slurm::LOGINSET).await;
    let want_images = BTreeMap::from([("login".to_owned(), image("login")), ("initconf".to_owned(), image("login"))]);
    assert_eq!(images(&login), want_images, "the login pods' containers");
    let refs = projected(&login);
    assert!(has(&refs, "secret", slurm::SECRET_SSSD, slurm::SECRET_SSSD_KEY), "{refs:?}");
    let ssh = Api::<ConfigMap>::namespaced(client.clone(), ns).get("slurm-login-ssh-config").await.expect("ssh config");
    let authorized = ssh.data.unwrap_or_default().remove("authorized_keys").unwrap_or_default();
    assert!(authorized.contains(&want.spec.login.ssh_authorized_keys[0]), "root's keys: {authorized}");

    assert_slurm_conf(client, ns, tenant).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let statesave = claims.get("statesave-slurm-controller-0").await.expect("slurmctld's state claim");
    let class = statesave.spec.and_then(|s| s.storage_class_name);
    assert_eq!(class.as_deref(), Some(slurm::DEFAULT_STORAGE_CLASS), "slurmctld's state on the stack's class");
}

/// slurm.conf, as the operator generated it: the cluster's name, paddock's NodeSets and their
/// partitions, GRES, accounting through slurmdbd, JWT authentication.
async fn assert_slurm_conf(client: &Client, ns: &str, tenant: &TenantAccess) {
    let config = Api::<ConfigMap>::namespaced(client.clone(), ns).get("slurm-config").await.expect("slurm.conf");
    let conf = config.data.unwrap_or_default().remove("slurm.conf").unwrap_or_default();
    let lines: BTreeSet<&str> = conf.lines().collect();
    for line in [
        format!("ClusterName={}", slurm::cluster_name(tenant.cluster.cluster_id)),
        "NodeSet=cpu Feature=cpu".to_owned(),
        "PartitionName=cpu Nodes=cpu Default=YES State=UP".to_owned(),
        "NodeSet=gpu Feature=gpu".to_owned(),
        "PartitionName=gpu Nodes=gpu Default=NO State=UP".to_owned(),
        "GresTypes=gpu".to_owned(),
        "AccountingStorageType=accounting_storage/slurmdbd".to_owned(),
        format!("AccountingStorageHost={}", slurm::ACCOUNTING_WORKLOAD),
        "AuthAltTypes=auth/jwt".to_owned(),
        // The elastic GPU pool's max nodes of its class (8 cores, 32 GiB), never a pod's name.
        "NodeName=gpu_future[0-2] State=FUTURE Feature=gpu CPUs=8 RealMemory=29491 Gres=gpu:4".to_owned(),
    ] {
        assert!(lines.contains(line.as_str()), "slurm.conf has no line {line:?}:\n{conf}");
    }
    // The node table keeps the operator's room for the pods beside them: the last one counts.
    let counts: Vec<&str> = conf.lines().filter(|l| l.starts_with("MaxNodeCount=")).collect();
    assert_eq!(counts.last(), Some(&"MaxNodeCount=1027"), "{conf}");
}

/// slurmdbd.conf (a Secret of the operator): paddock's MariaDB, database, user and password.
async fn assert_slurmdbd_conf(client: &Client, ns: &str, want: &SlurmDesired) {
    let secret = Api::<Secret>::namespaced(client.clone(), ns).get("slurm-accounting").await.expect("slurmdbd.conf");
    let conf = secret.data.unwrap_or_default().remove("slurmdbd.conf").expect("slurmdbd.conf in its Secret").0;
    let conf = String::from_utf8(conf).expect("utf-8");
    let lines: BTreeSet<&str> = conf.lines().collect();
    // Shown without the password line.
    let shown: Vec<&str> = conf.lines().filter(|l| !l.starts_with("StoragePass")).collect();
    for line in [
        format!("StorageHost={}", slurm::MARIADB),
        "StoragePort=3306".to_owned(),
        format!("StorageUser={}", slurm::DATABASE_USER),
        format!("StorageLoc={}", slurm::DATABASE),
    ] {
        assert!(lines.contains(line.as_str()), "slurmdbd.conf has no line {line:?}:\n{}", shown.join("\n"));
    }
    let password = format!("StoragePass={}", want.secrets.database_password.expose());
    assert!(lines.contains(password.as_str()), "slurmdbd.conf lacks paddock's database password (not shown)");
}

/// The NodeSets' pods run slurmd (pinned image, GRES, GPUs) and registered with Slurm (the
/// stand-in), and the operator wrote each Slurm node its pod's info through slurmrestd, with
/// tokens of paddock's JWT key; the NodeSets' status counts them.
/// A tenant's admin drains a Slurm node with a `paddock:hw:` reason: paddock's read of the nodes
/// through the service proxy finds it on the Node its slurmd pod runs on, with its reason, and
/// finds the other nodes undrained. (Against the stand-in: the proof against real Slurm daemons
/// comes with the real-Slurm path.)
async fn assert_fault_reports_read(
    restd: &restd::StandInRestd,
    driver: &SlinkyDriver,
    tenant: &TenantAccess,
    client: &Client,
    ns: &str,
) {
    let pods = Api::<Pod>::namespaced(client.clone(), ns).list(&ListParams::default()).await.expect("pods").items;
    let on_node: BTreeMap<String, String> = pods
        .iter()
        .filter(|p| p.metadata.owner_references.iter().flatten().any(|o| o.kind == "NodeSet"))
        .filter_map(|p| {
            let spec = p.spec.as_ref()?;
            Some((spec.hostname.clone().or_else(|| p.metadata.name.clone())?, spec.node_name.clone()?))
        })
        .collect();
    let (broken, node) = on_node.iter().next().expect("a slurmd pod on a Node");
    restd.drain(broken, "paddock:hw: GPU 3 ECC errors");
    let version = SlurmVersion { stack_version: STACK.to_owned(), version: SLURM_VERSION.to_owned() };
    let states = driver.node_states(tenant, &version).await.expect("the Slurm nodes through the service proxy");
    let seen: BTreeMap<&str, &str> = states.iter().map(|s| (s.slurm_node.as_str(), s.node_name.as_str())).collect();
    let expected: BTreeMap<&str, &str> = on_node.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(seen, expected, "every slurmd pod's Slurm node, on its pod's Node");
    for s in &states {
        let drained = s.states.iter().any(|f| f == "DRAIN");
        if s.slurm_node == *broken {
            assert!(drained && s.reason == "paddock:hw: GPU 3 ECC errors" && s.node_name == *node, "{s:?}");
        } else {
            assert!(!drained, "only the reported node drains: {s:?}");
        }
    }
    assert!(restd.seen().contains("GET /slurm/v0.0.42/nodes"), "{:?}", restd.seen());
}

async fn assert_slurm_nodes(
    alive: &mut Alive,
    restd: &restd::StandInRestd,
    client: &Client,
    ns: &str,
    pools: &[SlurmPool],
) {
    let catalog = slurm::SlurmCatalog::embedded();
    let slurmd = catalog.images(STACK, SLURM_VERSION).expect("the release").of("slurmd");
    let pods = Api::<Pod>::namespaced(client.clone(), ns).list(&ListParams::default()).await.expect("pods").items;
    let mut expected = BTreeMap::new();
    for pool in pools {
        for pod in pods.iter().filter(|p| {
            p.metadata.owner_references.iter().flatten().any(|o| o.kind == "NodeSet" && o.name == pool.name)
        }) {
            let template = json!({ "spec": pod.spec });
            let want_images =
                BTreeMap::from([("slurmd".to_owned(), slurmd.clone()), ("logfile".to_owned(), slurmd.clone())]);
            assert_eq!(images(&template), want_images, "pod {:?}", pod.metadata.name);
            let container = &template["spec"]["containers"][0];
            let gpus = container["resources"]["limits"]["nvidia.com/gpu"].as_str().map(str::to_owned);
            assert_eq!(gpus, (pool.gpus_per_node > 0).then(|| pool.gpus_per_node.to_string()), "{}'s GPUs", pool.name);
            let name = pod
                .spec
                .as_ref()
                .and_then(|s| s.hostname.clone())
                .or_else(|| pod.metadata.name.clone())
                .expect("a name");
            expected
                .insert(name, (pool.clone(), pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default()));
        }
    }
    let (r, e) = (restd, &expected);
    alive
        .until("the operator to write every Slurm node its pod's info", || async move {
            let nodes = r.nodes();
            let names: BTreeSet<&String> = nodes.keys().collect();
            if names != e.keys().collect() {
                return Err(format!("Slurm nodes {names:?}, NodeSet pods {:?}", e.keys()));
            }
            for (name, (pool, on)) in e {
                let node = &nodes[name];
                assert_eq!(node.features, vec![pool.name.clone()], "Slurm node {name}'s features");
                let gres = if pool.gpus_per_node > 0 { format!("gpu:{}", pool.gpus_per_node) } else { String::new() };
                assert_eq!(node.gres, gres, "Slurm node {name}'s GRES");
                let info: Value =
                    serde_json::from_str(&node.comment).map_err(|_| format!("{name}: comment {:?}", node.comment))?;
                if info["nodeSetName"] != pool.name.as_str() || info["node"] != on.as_str() || info["namespace"] != ns {
                    return Err(format!("{name}: pod info {info}"));
                }
            }
            Ok(())
        })
        .await;
    assert_eq!(restd.denied(), 0, "every request to slurmrestd carried a token of paddock's JWT key");
    assert!(restd.seen().contains("GET /slurm/v0.0.44/nodes/"), "the node cache refresh: {:?}", restd.seen());
    let nodesets = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &slurm::api_resource("NodeSet"));
    for pool in pools {
        let (api, pool) = (&nodesets, pool);
        alive
            .until(
                &format!("NodeSet {}'s status to count its ready pods and idle Slurm nodes", pool.name),
                || async move {
                    let nodeset = api.get(&pool.name).await.map_err(|e| format!("the NodeSet: {e}"))?;
                    let status = &nodeset.data["status"];
                    let count = Some(i64::from(pool.count));
                    let counts =
                        [status["replicas"].as_i64(), status["readyReplicas"].as_i64(), status["slurmIdle"].as_i64()];
                    if counts == [count; 3] {
                        Ok(())
                    } else {
                        Err(format!("status {status}"))
                    }
                },
            )
            .await;
    }
}
