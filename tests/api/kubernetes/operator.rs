//! The lab with the REAL Slinky slurm-operator 1.2.1 (built by
//! `scripts/slurm-operator`, `PADDOCK_TEST_SLURM_OPERATOR`) instead of the played one. Each tenant
//! API server then runs the harness's workload controllers and the real kube-scheduler
//! ([`WORKLOADS`]); paddock's stack applies the real operator chart into it, and once paddock has
//! written Slurm's JWT key there the operator process starts as the chart's Deployment would run
//! it: its args, a token of its chart's ServiceAccount in that tenant API server (and nothing
//! else), its slurmrestd Service name resolved to the stand-in by a private `/etc/hosts`.
//!
//! What is still PLAYED (shared with paddock-kube's operator test, `crates/paddock-kube/tests/played`):
//! - the kubelets: each machine paddock provisions registers a Node with capacity (the GPUs of
//!   its machine class as `nvidia.com/gpu`), and every pod the scheduler bound is marked Running
//!   and Ready;
//! - a volume provisioner for the stack's storage class;
//! - slurmrestd: a labelled STAND-IN for the operator (v0.0.44) and for paddock's own probe and
//!   drain (v0.0.42, through the tenant API server's service proxy to the slurmrestd pod, whose
//!   IP is this host's routable address, port 6820, which must be free). One stand-in per lab:
//!   the lab runs one Slurm cluster. It keeps DRAIN reasons as slurmctld does, and the test PLAYS
//!   a job on a node (ALLOCATED) to hold a drain open.
//!
//! Why a stand-in and not the real slurmctld and slurmrestd that `paddock_testkit::slurm_host`
//! runs on this host: here Slurm's nodes are the played kubelets' slurmd pods, several at once on
//! several machines, scaled up and drained down, and the stand-in registers each when its pod
//! runs. With real daemons each pod would need a real slurmd registering under the pod's name,
//! and this host runs one slurmd at a time (they share the `SlurmdPort` of the operator's
//! slurm.conf, and each needs a mount namespace); the operator's slurm.conf would also have to be
//! taken from its ConfigMap into the host's slurmctld, with the controller's address rewritten.
//! That is the work of a VM test, which this test is not to become. What the stand-in answers is
//! checked against the real daemons elsewhere, in `crates/paddock-kube/tests/kube`: paddock's
//! ping, drain (of an idle node and of one running a job) and read of nodes through the service
//! proxy against a real slurmrestd 26.05 with real slurmds (`slurm_probe.rs`), its reads of jobs
//! and nodes with real jobs pending (`slurm_host.rs`), its accounting writes against a real
//! slurmrestd, slurmdbd and MariaDB (`slurm_accounting.rs`), and paddock's slurm.conf lines
//! against a real slurmctld (`slurm_host.rs` again). What only this test covers (the operator's
//! v0.0.44 calls, the order of drain and release across the lab) stays proven against the
//! stand-in only.
//!
//! The Kamaji player, the machines and their BMCs are the lab's as for the played operator.
//!
//! The Ray lab ([`RealOperator::start_ray`]) runs the REAL KubeRay ray-operator v1.5.0 (built by
//! `scripts/ray-operator`, `PADDOCK_TEST_RAY_OPERATOR`) the same way, once paddock's stack has
//! applied its Deployment (component `kuberay-operator`): its args, a token of its ServiceAccount.
//! The Ray head's health endpoints are a labelled STAND-IN ([`StandInHead`]) on this host's
//! routable address, port 8265 (which must be free), the head pod's IP, for paddock's probe
//! through the pod proxy; no Ray runs.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};
use paddock_kube::nodes::LABEL_NODE_POOL;
use paddock_kube::slurm;
use paddock_kube::stack::LABEL_STACK_COMPONENT;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use super::{err, Lab, TenantServer};

use crate::played::operator::{
    deployment_args, hosts_file, local_args, random_loopback, routable_ip, service_account_kubeconfig, Operator,
};
use crate::played::rayhead::StandInHead;
use crate::played::restd::StandInRestd;
use crate::played::{kubelet, provisioner};
use paddock_testkit::{admin, skip};

/// The harness controller groups of a tenant API server with the real operator: the defaults plus
/// the workload controllers and the real kube-scheduler.
pub(super) const WORKLOADS: &[&str] = &["defaults", "workloads"];
/// The operator's release (the stack's chart runs it).
const OPERATOR_VERSION: &str = "1.2.1";
/// The stack component whose Deployment is the operator.
const OPERATOR_COMPONENT: &str = "slurm-operator";
/// The stack component whose Deployment is KubeRay's operator.
const RAY_OPERATOR_COMPONENT: &str = "kuberay-operator";

/// What runs for one tenant API server.
struct Running {
    /// The operator, once paddock applied its chart and Slurm's JWT key.
    operator: Option<Operator>,
    /// The KubeRay operator (a Ray lab), once paddock's stack applied its Deployment.
    ray_operator: Option<Operator>,
    /// The played kubelet and provisioner.
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for (_, task) in &self.tasks {
            task.abort();
        }
    }
}

/// The real operator of the lab and its played surroundings.
pub(super) struct RealOperator {
    /// The slurm-operator (None in a Ray lab).
    binary: Option<PathBuf>,
    /// The ray-operator (a Ray lab only).
    ray_binary: Option<PathBuf>,
    /// Logs, kubeconfigs and hosts files, per cluster.
    dir: PathBuf,
    restd: StandInRestd,
    /// Where the operator reaches the stand-in.
    loopback: Ipv4Addr,
    /// Where paddock's probe reaches it (slurmrestd's pod IP).
    probe_ip: IpAddr,
    /// The stand-in's listeners.
    serving: Vec<JoinHandle<()>>,
    /// Cluster id -> what runs for its tenant API server.
    running: Mutex<HashMap<String, Running>>,
    /// Nodes the played kubelets registered completely.
    registered: Mutex<HashSet<String>>,
    next_ip: AtomicU32,
}

impl RealOperator {
    /// The stand-in serving; None (the test is skipped: [`skip`]) without the operator binary or a
    /// routable address.
    pub(super) async fn start() -> Option<Self> {
        let binary = std::env::var("PADDOCK_TEST_SLURM_OPERATOR").ok().filter(|v| !v.is_empty()).map(PathBuf::from);
        let what = "the slurm-operator binary (PADDOCK_TEST_SLURM_OPERATOR; scripts/test builds it) is missing";
        let binary = skip::require(binary.filter(|b| b.is_file()), what)?;
        let why =
            "this host has no routable address for the slurmrestd stand-in (the API server proxies to no loopback)";
        let probe_ip = skip::require(routable_ip(), why)?;
        let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let dir = std::env::temp_dir().join(format!("paddock-api-operator-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the operator's directory");
        let restd = StandInRestd::new(Vec::new());
        let loopback = random_loopback();
        let serving = vec![
            restd.clone().serve((loopback, slurm::RESTAPI_PORT).into()).await,
            restd.clone().serve((probe_ip, slurm::RESTAPI_PORT).into()).await,
        ];
        let (running, registered) = (Mutex::new(HashMap::new()), Mutex::new(HashSet::new()));
        let next_ip = AtomicU32::new(10);
        let binary = Some(binary);
        Some(Self { binary, ray_binary: None, dir, restd, loopback, probe_ip, serving, running, registered, next_ip })
    }

    /// The Ray lab: the real KubeRay operator and the Ray head stand-in serving (no Slurm); None
    /// (the test is skipped: [`skip`]) without the operator binary or a routable address.
    pub(super) async fn start_ray() -> Option<Self> {
        let binary = std::env::var("PADDOCK_TEST_RAY_OPERATOR").ok().filter(|v| !v.is_empty()).map(PathBuf::from);
        let what = "the ray-operator binary (PADDOCK_TEST_RAY_OPERATOR; scripts/test builds it) is missing";
        let ray_binary = Some(skip::require(binary.filter(|b| b.is_file()), what)?);
        let why = "this host has no routable address for the Ray head stand-in (the API server proxies to no loopback)";
        let probe_ip = skip::require(routable_ip(), why)?;
        let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let dir = std::env::temp_dir().join(format!("paddock-api-ray-operator-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the operator's directory");
        let serving = vec![StandInHead::default().serve((probe_ip, paddock_kube::ray::DASHBOARD_PORT).into()).await];
        let (running, registered) = (Mutex::new(HashMap::new()), Mutex::new(HashSet::new()));
        let (restd, loopback, next_ip) = (StandInRestd::new(Vec::new()), random_loopback(), AtomicU32::new(10));
        Some(Self { binary: None, ray_binary, dir, restd, loopback, probe_ip, serving, running, registered, next_ip })
    }

    pub(super) fn registered(&self, node: &str) -> bool {
        self.registered.lock().expect("lock").contains(node)
    }

    /// PLAYS THE KUBELET of `machine` (as the API lists it): Node `name`, with the GPUs of its
    /// machine class.
    pub(super) async fn register(
        &self,
        api: &str,
        client: &Client,
        name: &str,
        uuid: &str,
        machine: &Value,
    ) -> Result<(), String> {
        let class = machine["machine_class"].as_str().ok_or("the machine's class")?;
        let url = format!("{api}/v1/machine-classes/{class}");
        let rsp = reqwest::Client::new().get(url).bearer_auth(admin()).send().await.map_err(err)?;
        let class: Value = rsp.json().await.map_err(err)?;
        let gpus = class["gpu_count"].as_u64().and_then(|g| u32::try_from(g).ok()).unwrap_or(0);
        let n = self.next_ip.fetch_add(1, Ordering::SeqCst);
        let ip = format!("192.0.2.{}", n % 240 + 10);
        kubelet::register(client, name, uuid, &ip, gpus).await?;
        eprintln!("played kubelet: registered Node {name} ({gpus} GPUs)");
        self.registered.lock().expect("lock").insert(name.to_owned());
        Ok(())
    }

    /// For the tenant API server of `cluster`: the played kubelet and provisioner from the
    /// start, the operator once paddock applied its chart and Slurm's JWT key.
    pub(super) async fn tend(&self, cluster: &str, t: &TenantServer) -> Result<(), String> {
        {
            let mut running = self.running.lock().expect("lock");
            match running.get(cluster) {
                Some(r) if r.operator.is_some() || r.ray_operator.is_some() => return Ok(()),
                Some(_) => {}
                None => {
                    let kubelet = kubelet::spawn(t.client.clone(), self.restd.clone(), Some(self.probe_ip));
                    let class = slurm::DEFAULT_STORAGE_CLASS.to_owned();
                    let provisioner = provisioner::spawn(t.client.clone(), class);
                    let tasks = vec![("played kubelet", kubelet), ("played provisioner", provisioner)];
                    running.insert(cluster.to_owned(), Running { operator: None, ray_operator: None, tasks });
                }
            }
        }
        if let Some(binary) = &self.ray_binary {
            let Some(operator) = self.ray_operator_if_due(binary, cluster, t).await? else { return Ok(()) };
            if let Some(r) = self.running.lock().expect("lock").get_mut(cluster) {
                r.ray_operator = Some(operator);
            }
            return Ok(());
        }
        let Some(operator) = self.operator_if_due(cluster, t).await? else { return Ok(()) };
        if let Some(r) = self.running.lock().expect("lock").get_mut(cluster) {
            r.operator = Some(operator);
        }
        Ok(())
    }

    /// Starts the operator when its chart's Deployment and Slurm's JWT key are in the tenant API
    /// server; None until then.
    async fn operator_if_due(&self, cluster: &str, t: &TenantServer) -> Result<Option<Operator>, String> {
        let Some(binary) = &self.binary else { return Ok(None) };
        let selector = format!("{LABEL_STACK_COMPONENT}={OPERATOR_COMPONENT}");
        let deployments = Api::<Deployment>::all(t.client.clone());
        let listed = deployments.list(&ListParams::default().labels(&selector)).await.map_err(err)?.items;
        let Some(deployment) = listed.into_iter().next() else { return Ok(None) };
        let secrets: Api<Secret> = Api::namespaced(t.client.clone(), slurm::NAMESPACE);
        let Some(secret) = secrets.get_opt(slurm::SECRET_JWT).await.map_err(err)? else { return Ok(None) };
        let key = secret.data.and_then(|mut d| d.remove(slurm::SECRET_JWT_KEY)).ok_or("the JWT key")?;
        self.restd.set_key(key.0);

        let namespace = deployment.namespace().unwrap_or_default();
        let (args, account) = deployment_args(&serde_json::to_value(&deployment).map_err(err)?, OPERATOR_VERSION);
        let admin_kubeconfig = std::fs::read_to_string(&t.server.kubeconfig).map_err(err)?;
        let kubeconfig =
            service_account_kubeconfig(&t.client, &t.server.url, &admin_kubeconfig, &namespace, &account).await;
        let dir = self.dir.join(cluster);
        std::fs::create_dir_all(&dir).map_err(err)?;
        std::fs::write(dir.join("operator.kubeconfig"), kubeconfig).map_err(err)?;
        let restapi = format!("{}.{}", slurm::RESTAPI_SERVICE, slurm::NAMESPACE);
        let hosts = hosts_file(&dir, &restapi, self.loopback);
        let log = dir.join("operator.log");
        eprintln!(
            "starting the real slurm-operator for cluster {cluster} as {namespace}/{account} (log {})",
            log.display()
        );
        let operator = Operator::start(binary, &local_args(&args), &dir.join("operator.kubeconfig"), &hosts, log);
        Ok(Some(operator))
    }

    /// Starts KubeRay's operator when paddock's stack applied its Deployment; None until then.
    /// Its args are the Deployment's, with what a pod would get from its environment (the
    /// leader-election namespace) and listen addresses free on this machine.
    async fn ray_operator_if_due(
        &self,
        binary: &std::path::Path,
        cluster: &str,
        t: &TenantServer,
    ) -> Result<Option<Operator>, String> {
        let selector = format!("{LABEL_STACK_COMPONENT}={RAY_OPERATOR_COMPONENT}");
        let deployments = Api::<Deployment>::all(t.client.clone());
        let listed = deployments.list(&ListParams::default().labels(&selector)).await.map_err(err)?.items;
        let Some(deployment) = listed.into_iter().next() else { return Ok(None) };
        let namespace = deployment.namespace().unwrap_or_default();
        let pod = deployment.spec.and_then(|s| s.template.spec).ok_or("the Deployment's pod")?;
        let account = pod.service_account_name.clone().ok_or("the operator's ServiceAccount")?;
        let container = pod.containers.first().ok_or("the operator's container")?;
        assert_eq!(container.image.as_deref(), Some("quay.io/kuberay/operator:v1.5.0"));
        let port = || std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port());
        let mut args = container.args.clone().unwrap_or_default();
        args.push(format!("--leader-election-namespace={namespace}"));
        args.push(format!("--metrics-addr=127.0.0.1:{}", port().map_err(err)?));
        args.push(format!("--health-probe-bind-address=127.0.0.1:{}", port().map_err(err)?));
        let admin_kubeconfig = std::fs::read_to_string(&t.server.kubeconfig).map_err(err)?;
        let kubeconfig =
            service_account_kubeconfig(&t.client, &t.server.url, &admin_kubeconfig, &namespace, &account).await;
        let dir = self.dir.join(cluster);
        std::fs::create_dir_all(&dir).map_err(err)?;
        std::fs::write(dir.join("operator.kubeconfig"), kubeconfig).map_err(err)?;
        let hosts = hosts_file(&dir, "unused.invalid", self.loopback);
        let log = dir.join("ray-operator.log");
        eprintln!(
            "starting the real ray-operator for cluster {cluster} as {namespace}/{account} (log {})",
            log.display()
        );
        Ok(Some(Operator::start(binary, &args, &dir.join("operator.kubeconfig"), &hosts, log)))
    }

    /// Fails the test when the operator, a played part or the stand-in stopped.
    pub(super) fn check(&self) {
        for (cluster, r) in self.running.lock().expect("lock").iter_mut() {
            for operator in [r.operator.as_mut(), r.ray_operator.as_mut()].into_iter().flatten() {
                operator.check();
            }
            if let Some((name, _)) = r.tasks.iter().find(|(_, t)| t.is_finished()) {
                panic!("the {name} of cluster {cluster} stopped");
            }
        }
        assert!(self.serving.iter().all(|s| !s.is_finished()), "the slurmrestd stand-in stopped serving");
    }

    /// The pods still not Running and Ready, and the end of the operator's log.
    pub(super) async fn diagnose(&self, cluster: &str, client: &Client) -> String {
        let pods = kubelet::unready_pods(client).await;
        let tail = self
            .running
            .lock()
            .expect("lock")
            .get(cluster)
            .and_then(|r| r.operator.as_ref().or(r.ray_operator.as_ref()).map(Operator::tail));
        format!("{pods}\nthe operator's log ends:\n{}", tail.unwrap_or_else(|| "(not started)".to_owned()))
    }

    /// Stops what runs for `cluster` (its control plane goes).
    pub(super) fn stop(&self, cluster: &str) {
        self.running.lock().expect("lock").remove(cluster);
    }

    /// Stops everything (the lab ends).
    pub(super) fn stop_all(&self) {
        self.running.lock().expect("lock").clear();
        for s in &self.serving {
            s.abort();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    pub(super) fn restd(&self) -> &StandInRestd {
        &self.restd
    }
}

// ---------------------------------------------------------------------------------------------
// The test.

/// Polls `probe` until it gives Ok, within the lab's patience; on timeout fails with its last
/// answer and what the cluster's pods and operator say.
async fn until<T, F, Fut>(lab: &Lab, cluster: &str, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let end = std::time::Instant::now() + lab.wait;
    loop {
        lab.play.check();
        match probe().await {
            Ok(v) => return v,
            Err(missing) if std::time::Instant::now() > end => {
                panic!("timed out waiting for {what}: {missing}\n{}", lab.play.diagnose(cluster).await)
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
        }
    }
}

/// When the stand-in took paddock's (v0.0.42) first DRAIN of Slurm node `node`.
fn paddock_drained_at(restd: &StandInRestd, node: &str) -> std::time::Instant {
    let updates = restd.updates();
    let first =
        updates.iter().find(|u| u.node == node && u.version == "v0.0.42" && u.after.state.iter().any(|s| s == "DRAIN"));
    first.map(|u| u.at).unwrap_or_else(|| panic!("no DRAIN of {node} by paddock: {updates:?}"))
}

/// The slurmd pods of NodeSet `pool` (not being deleted): pod name -> (uid, Slurm node name).
async fn slurmd_uids(client: &Client, pool: &str) -> BTreeMap<String, (String, String)> {
    let pods = Api::<Pod>::namespaced(client.clone(), slurm::NAMESPACE).list(&ListParams::default()).await;
    pods.expect("pods")
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.owner_references().iter().any(|o| o.kind == "NodeSet" && o.name == pool))
        .map(|p| {
            let host = p.spec.as_ref().and_then(|s| s.hostname.clone()).unwrap_or_else(|| p.name_any());
            (p.name_any(), (p.uid().unwrap_or_default(), host))
        })
        .collect()
}

/// Touches an annotation of pod `name` (an event the operator reconciles its NodeSet on).
async fn poke(client: &Client, name: &str) {
    let pods = Api::<Pod>::namespaced(client.clone(), slurm::NAMESPACE);
    let patch = json!({ "metadata": { "annotations": { "paddock.test/poke": uuid::Uuid::new_v4().to_string() } } });
    let _ = pods.patch(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await;
}

/// What [`watch_release`] saw: when NodeSet `pool`'s `spec.replicas` first dropped below `from`,
/// the Slurm nodes as the stand-in held them then, and when each slurmd pod was first seen
/// deleted (terminating or gone), until the shrink has removed one.
type Release =
    (std::time::Instant, BTreeMap<String, crate::played::restd::SlurmNode>, BTreeMap<String, std::time::Instant>);

/// Watches NodeSet `pool` (polled every 20 ms) until its `spec.replicas` dropped below `from` and a
/// slurmd pod went; see [`Release`]. It ends early (and the caller sees it finished) when a pod
/// goes before the shrink.
fn watch_release(client: &Client, pool: &str, from: i64, restd: &StandInRestd) -> JoinHandle<Release> {
    let nodesets: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), slurm::NAMESPACE, &slurm::api_resource("NodeSet"));
    let (client, pool, restd) = (client.clone(), pool.to_owned(), restd.clone());
    tokio::spawn(async move {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(600);
        let known = slurmd_uids(&client, &pool).await;
        let (mut shrunk, mut deleted) = (None, BTreeMap::new());
        loop {
            let replicas = nodesets.get(&pool).await.ok().and_then(|n| n.data["spec"]["replicas"].as_i64());
            if shrunk.is_none() && replicas.is_some_and(|r| r < from) {
                shrunk = Some((std::time::Instant::now(), restd.nodes()));
            }
            let now = slurmd_uids(&client, &pool).await;
            for gone in known.keys().filter(|p| !now.contains_key(*p)) {
                deleted.entry(gone.clone()).or_insert_with(std::time::Instant::now);
            }
            match shrunk.clone() {
                Some((at, nodes)) if !deleted.is_empty() => return (at, nodes, deleted),
                // A pod went with the NodeSet unchanged: finished, for the caller to see.
                None if !deleted.is_empty() => return (end, BTreeMap::new(), deleted),
                _ => {}
            }
            assert!(std::time::Instant::now() < end, "NodeSet {pool} did not shrink below {from} and lose a pod");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
}

/// The slurmd pods of NodeSet `pool` (not being deleted): their Slurm node name -> their Node.
async fn slurmd_pods(client: &Client, pool: &str) -> Result<BTreeMap<String, String>, String> {
    let pods = Api::<Pod>::namespaced(client.clone(), slurm::NAMESPACE);
    let pods = pods.list(&ListParams::default()).await.map_err(err)?.items;
    Ok(pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.owner_references().iter().any(|o| o.kind == "NodeSet" && o.name == pool))
        .map(|p| {
            let spec = p.spec.clone().unwrap_or_default();
            (spec.hostname.unwrap_or_else(|| p.name_any()), spec.node_name.unwrap_or_default())
        })
        .collect())
}

/// NodeSet `pool` runs `count` slurmd pods, each on a Node of its pool (the real scheduler), each
/// a Slurm node (the stand-in) with the pool's feature and GRES; returns their Slurm names.
async fn assert_pool(
    lab: &Lab,
    t: &super::Tenant,
    c: &str,
    pool: (&str, &str),
    count: usize,
    gpus: u32,
) -> BTreeSet<String> {
    let (name, pool_id) = pool;
    let client = lab.tenant_client(c);
    let restd = lab.play.real.as_ref().expect("the real operator").restd().clone();
    let (client, restd) = (&client, &restd);
    let placed =
        until(lab, c, &format!("NodeSet {name}'s {count} slurmd pods, registered with Slurm"), || async move {
            let pods = slurmd_pods(client, name).await?;
            let slurm = restd.nodes();
            if pods.len() != count || pods.keys().any(|p| !slurm.contains_key(p)) {
                return Err(format!("pods {pods:?}, Slurm nodes {:?}", slurm.keys()));
            }
            Ok(pods)
        })
        .await;
    let nodes = lab.pool_nodes(t, c, pool_id).await;
    let slurm = restd.nodes();
    let gres = if gpus > 0 { format!("gpu:{gpus}") } else { String::new() };
    for (pod, on) in &placed {
        assert!(nodes.contains(on), "the scheduler put {name}'s pod {pod} on {on}, not on its pool's Nodes {nodes:?}");
        assert_eq!(slurm[pod].features, vec![name.to_owned()], "Slurm node {pod}'s features");
        assert_eq!(slurm[pod].gres, gres, "Slurm node {pod}'s GRES");
    }
    placed.into_keys().collect()
}

/// The real operator made slurmctld, slurmdbd, slurmrestd and the login pods from paddock's
/// objects, in the tenant API server's Slurm namespace.
async fn assert_operator_workloads(client: &Client) {
    let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), slurm::NAMESPACE);
    for name in [slurm::CONTROLLER_WORKLOAD, slurm::ACCOUNTING_WORKLOAD] {
        let made = statefulsets.get(name).await.unwrap_or_else(|e| panic!("the operator's StatefulSet {name}: {e}"));
        let owners: Vec<String> = made.owner_references().iter().map(|o| o.kind.clone()).collect();
        assert!(owners.iter().any(|k| k == "Controller" || k == "Accounting"), "{name} owned by {owners:?}");
        assert_on_system_pool(name, made.spec.and_then(|s| s.template.spec));
    }
    let deployments = Api::<Deployment>::namespaced(client.clone(), slurm::NAMESPACE);
    for name in [slurm::RESTAPI_SERVICE, slurm::LOGINSET] {
        let made = deployments.get(name).await.unwrap_or_else(|e| panic!("the operator's Deployment {name}: {e}"));
        let owners: Vec<String> = made.owner_references().iter().map(|o| o.kind.clone()).collect();
        assert!(owners.iter().any(|k| k == "RestApi" || k == "LoginSet"), "{name} owned by {owners:?}");
        assert_on_system_pool(name, made.spec.and_then(|s| s.template.spec));
    }
    let nodesets: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), slurm::NAMESPACE, &slurm::api_resource("NodeSet"));
    assert!(nodesets.get_opt("sys").await.expect("get").is_none(), "the system pool got a NodeSet");
}

/// A control workload's pods select the Nodes of the system pool `sys` (where their volumes live).
fn assert_on_system_pool(name: &str, pod: Option<k8s_openapi::api::core::v1::PodSpec>) {
    let selector = pod.and_then(|p| p.node_selector).unwrap_or_default();
    let want = std::collections::BTreeMap::from([(LABEL_NODE_POOL.to_owned(), "sys".to_owned())]);
    assert_eq!(selector, want, "{name}'s pods select the system pool's Nodes");
}

/// The operator acts inside its tenant's API server only: its token (of its chart's
/// ServiceAccount there) reads its Slurm pods, and the platform API server refuses it and holds
/// no workload, pod or Slinky object of it.
async fn assert_operator_confined(lab: &Lab, c: &str) {
    let real = lab.play.real.as_ref().expect("the real operator");
    let text = std::fs::read_to_string(real.dir.join(c).join("operator.kubeconfig")).expect("its kubeconfig");
    let bearer = super::kubeconfig_token(&text);
    let insecure = reqwest::Client::builder().danger_accept_invalid_certs(true).build().expect("client");
    let get = |url: String| {
        let (insecure, bearer) = (&insecure, &bearer);
        async move { insecure.get(url).bearer_auth(bearer).send().await.expect("a request").status().as_u16() }
    };
    let own = lab.tenant_server(c).url;
    assert_eq!(get(format!("{own}/api/v1/namespaces/{}/pods", slurm::NAMESPACE)).await, 200, "its own pods");
    for path in ["/api/v1/pods", "/apis/apps/v1/statefulsets", "/api/v1/namespaces"] {
        let status = get(format!("{}{path}", lab.platform.url)).await;
        assert!(status == 401 || status == 403, "the operator's token got {status} on the platform's {path}");
    }
    let platform = &lab.platform_client;
    let pods = Api::<Pod>::all(platform.clone()).list(&ListParams::default()).await.expect("pods").items;
    let sets = Api::<StatefulSet>::all(platform.clone()).list(&ListParams::default()).await.expect("sets").items;
    let deployments = Api::<Deployment>::all(platform.clone()).list(&ListParams::default()).await.expect("d").items;
    let names = |v: Vec<String>| v.join(", ");
    assert!(pods.is_empty(), "pods on the platform: {}", names(pods.iter().map(ResourceExt::name_any).collect()));
    assert!(
        sets.is_empty(),
        "StatefulSets on the platform: {}",
        names(sets.iter().map(ResourceExt::name_any).collect())
    );
    assert!(deployments.is_empty(), "Deployments on the platform");
    let nodesets: Api<DynamicObject> = Api::all_with(platform.clone(), &slurm::api_resource("NodeSet"));
    assert!(nodesets.list(&ListParams::default()).await.is_err(), "the platform serves no Slinky kinds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slurm_cluster_goes_ready_scales_and_is_deleted_with_the_real_operator() {
    let Some(lab) = Lab::with_real_operator().await else { return };
    let started = std::time::Instant::now();
    let (t, c, pools) = lab.create_hpc(4).await;
    let (cpu, gpu) = (pools["cpu"].clone(), pools["gpu"].clone());

    // Ready: the real operator's workloads, slurmd on each pool's Nodes, Slurm answering.
    let ready = lab.ready(&t, &c).await;
    super::all_true(&ready);
    eprintln!("ready on the real operator after {:?}", started.elapsed());
    let client = lab.tenant_client(&c);
    assert_operator_workloads(&client).await;
    assert_pool(&lab, &t, &c, ("cpu", &cpu), 1, 0).await;
    assert_pool(&lab, &t, &c, ("gpu", &gpu), 1, 4).await;
    let restd = lab.play.real.as_ref().expect("the real operator").restd().clone();
    assert!(restd.seen().contains("GET /slurm/v0.0.44/nodes/"), "the operator's node cache: {:?}", restd.seen());
    assert!(restd.seen().contains("GET /slurm/v0.0.42/ping"), "paddock's probe: {:?}", restd.seen());
    assert_operator_confined(&lab, &c).await;

    // Scaling up: the operator's NodeSet scale puts a second slurmd on the new Node.
    lab.scale(&t, &c, &cpu, 2).await;
    lab.ready(&t, &c).await;
    let two = assert_pool(&lab, &t, &c, ("cpu", &cpu), 2, 0).await;
    eprintln!("scaled up after {:?}", started.elapsed());

    // Scaling down while a job runs on each cpu node (PLAYED in the stand-in). paddock drains
    // the released machine's Slurm node with its reason first; the NodeSet keeps asking for two
    // pods while that job runs, and paddock's DRAIN stays through the operator's reconciles.
    for node in &two {
        restd.set_job(node, true);
    }
    let before = slurmd_uids(&client, "cpu").await;
    let placed = slurmd_pods(&client, "cpu").await.expect("the slurmd pods");
    let watched = watch_release(&client, "cpu", 2, &restd);
    lab.scale(&t, &c, &cpu, 1).await;
    let released = until(&lab, &c, "paddock's drain of the released machine's Slurm node", || async {
        let drained =
            restd.updates().into_iter().find(|u| u.version == "v0.0.42" && u.after.state.iter().any(|s| s == "DRAIN"));
        drained.map(|u| u.node).ok_or_else(|| format!("updates {:?}", restd.updates()))
    })
    .await;
    assert!(two.contains(&released), "paddock drained {released}, not one of {two:?}");
    let drained_at = paddock_drained_at(&restd, &released);
    let refreshes = |after: std::time::Instant| {
        let log = restd.log();
        log.iter().filter(|(at, r)| *at > after && r.starts_with("GET /slurm/v0.0.44/nodes")).count()
    };
    // The operator reconciles on pod events: touching the other pod makes it run again.
    let kept_pod = before.keys().find(|p| before[*p].1 != released).cloned().expect("the other pod");
    until(&lab, &c, "three reconciles of the operator after paddock's drain", || async {
        poke(&client, &kept_pod).await;
        let n = refreshes(drained_at);
        if n >= 3 {
            Ok(())
        } else {
            Err(format!("{n} node reads by the operator"))
        }
    })
    .await;
    assert!(!watched.is_finished(), "the NodeSet shrank (or a slurmd pod went) while the released node's job ran");
    let held = restd.nodes()[&released].clone();
    assert!(held.state.iter().any(|s| s == "DRAIN") && held.reason == slurm::DRAIN_REASON, "{released}: {held:?}");
    // The job on the released machine ends; the other machine's job goes on.
    restd.set_job(&released, false);
    lab.ready(&t, &c).await;
    let one = assert_pool(&lab, &t, &c, ("cpu", &cpu), 1, 0).await;
    eprintln!("scaled down after {:?}; slurmrestd saw {:?}", started.elapsed(), restd.seen());
    assert_eq!(two.difference(&one).collect::<Vec<_>>(), vec![&released], "the released machine's slurmd went");
    let after = slurmd_uids(&client, "cpu").await;
    assert_eq!(after.get(&kept_pod), before.get(&kept_pod), "the other machine's slurmd pod stays, untouched");
    let (shrunk_at, states, deleted) = watched.await.expect("the NodeSet watcher");
    let released_pod = before.iter().find(|(_, (_, node))| *node == released).map(|(p, _)| p.clone()).expect("pod");
    assert_eq!(deleted.keys().collect::<Vec<_>>(), vec![&released_pod], "the slurmd pods that went");
    assert!(drained_at < shrunk_at && shrunk_at <= deleted[&released_pod], "paddock's drain, the shrink, the delete");
    let at_shrink = &states[&released];
    assert!(at_shrink.state == ["IDLE", "DRAIN"] && at_shrink.reason == slurm::DRAIN_REASON, "{at_shrink:?}");
    // paddock's DRAIN and reason held from its drain until the pod went: no update undid them.
    for u in restd.updates().iter().filter(|u| u.node == released && u.at > drained_at && u.at < deleted[&released_pod])
    {
        assert!(u.after.state.iter().any(|s| s == "DRAIN") && u.after.reason == slurm::DRAIN_REASON, "{u:?}");
    }
    assert!(refreshes(drained_at) >= 3);
    restd.set_job(one.iter().next().expect("the kept node"), false);
    let left = lab.pool_nodes(&t, &c, &cpu).await;
    assert_eq!(left.len(), 1, "the released machine's Node");
    assert!(!left.contains(&placed[&released]), "{released} was on {}, the machine that stayed", placed[&released]);
    let nodes: BTreeSet<String> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("nodes")
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(nodes.len(), 3, "one Node per machine left (the system pool's too): {nodes:?}");
    assert_eq!(restd.denied(), 0, "every request to slurmrestd carried a token of paddock's JWT key");

    // Deleting: Slurm (the operator's workloads with it) and the Nodes go before the control
    // plane; the operator stops with it; the machines are wiped and available again.
    lab.app.delete(Lab::path(&t, &c)).token(&t.token).send().await.expect(202);
    lab.gone(&t, &c).await;
    let held = lab.play.at_deletion.lock().expect("lock").get(&c).cloned().expect("Kamaji saw the deletion");
    assert_eq!(held, json!({ "nodes": [], "slurm": [] }), "left when the control plane went");
    let real = lab.play.real.as_ref().expect("the real operator");
    assert!(real.running.lock().expect("lock").get(&c).is_none(), "the operator outlived its control plane");
    paddock_testkit::eventually(lab.wait, || async {
        (lab.scalar("select count(*) from machines where state = 'available'").await == 4).then_some(())
    })
    .await;
    eprintln!("deleted after {:?}", started.elapsed());
    lab.finish().await;
}
