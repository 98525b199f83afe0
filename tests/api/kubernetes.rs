//! Issues #4 and #5 end to end through the HTTP API with the REAL Kubernetes drivers
//! (`KubePlatform`, `KamajiBackend`, `KubeTenantNodes`, `KubeTenantStack`, `SlinkyDriver`,
//! `KubeTenantCredentials`, assembled as `paddock serve` does with PADDOCK_KUBE_DRIVER=kubernetes)
//! against REAL kube-apiservers of the kube-harness (`scripts/test` starts it; tests read
//! `PADDOCK_TEST_KUBE_CONTROL`): one platform API server per test with the real Kamaji CRDs, and
//! one more API server per tenant control plane. Only the BMC side is simulated (paddock-sim's
//! BMC and its machines' agent, which reports to the API served on a port).
//!
//! Nothing runs in the harness but the API servers and a few kube-controller-manager controllers
//! (namespace, service account, garbage collector, ...). So a background task of each test PLAYS,
//! and only plays, what would run in a real installation:
//! - KAMAJI: for each TenantControlPlane on the platform API server it starts a tenant API server
//!   of the harness, adds a finalizer, writes the admin kubeconfig Secret (that server's admin
//!   kubeconfig) and the status Kamaji writes after a reconciliation; when the object is deleted it
//!   records what the tenant API server still holds, stops that server and drops the finalizer;
//! - THE KUBELETS: a machine paddock reports `provisioning` registers a Node (its system UUID, a
//!   Ready condition) in its cluster's tenant API server, once its bootstrap token exists;
//! - THE WORKLOAD CONTROLLERS (Deployment, DaemonSet, StatefulSet): their status becomes ready;
//! - THE SLINKY OPERATOR: once a Controller exists, the StatefulSets, Deployments and Services it
//!   would create, and the controller's pod (whose container the played kubelet runs, or puts in
//!   CrashLoopBackOff for a test: [`crash`]); NodeSets report as many ready replicas as Ready
//!   Nodes their selector matches;
//! - SLURMRESTD: a STAND-IN `SlurmProbe` answers the ping.
//!
//! The tenant base stack: the newest embedded definition with its REAL upstream files (Calico,
//! the NVIDIA device plugin, local-path-provisioner, Slinky's CRDs and its rendered operator chart,
//! as `scripts/test` fetched them into `PADDOCK_TEST_UPSTREAM_STACKS`, under the pinned digests).
//! Each tenant cluster has its own API server, so the real files' fixed names never meet.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, LimitRange, Namespace, Node, ResourceQuota, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, Resource, ResourceExt};
use paddock_api::{ApiConfig, AppState};
use paddock_auth::{Secret as AuthSecret, Verifier, VerifierConfig};
use paddock_domain::driver::{BoxFuture, DriverError, KubeDrivers, TenantAccess};
use paddock_domain::stack::latest_version;
use paddock_kube::isolation::{self, LABEL_CLUSTER_ID, LABEL_TENANT_ID};
use paddock_kube::kamaji::{self, ADMIN_KUBECONFIG_KEY};
use paddock_kube::nodes::{BOOTSTRAP_NAMESPACE, LABEL_MACHINE_ID, LABEL_NODE_POOL, NODE_LEASE_NAMESPACE};
use paddock_kube::slurm::{self, SlinkySettings, SlurmNode, SlurmProbe};
use paddock_kube::{
    KamajiBackend, KubePlatform, KubeTenantCredentials, KubeTenantNodes, KubeTenantStack, SlinkyDriver,
};
use paddock_sim::{MachineFault, SimConfig, SimWorld};
use paddock_store::Store;
use paddock_testkit::{admin, eventually, skip, token, TestApp, TEST_SECRET};
use paddock_types::{ClusterId, MachineId, TenantId};
use paddock_worker::reconcile::{Drivers, Settings};
use paddock_worker::WorkerConfig;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::common::{id, machine_class, tenant};

mod autoscale;
mod crash;
mod nodes;
mod operator;
mod ray;

/// Real API servers start slowly when tests share 2 cores.
const WAIT: Duration = Duration::from_secs(240);
/// With the real operator, the workload controllers and the scheduler also share them.
const WAIT_REAL: Duration = Duration::from_secs(600);

/// The finalizer Kamaji puts on a TenantControlPlane (played here).
const KAMAJI_FINALIZER: &str = "finalizer.kamaji.clastix.io";

// ---------------------------------------------------------------------------------------------
// The kube-harness.

/// One API server of the harness, as `POST /apiservers` describes it.
#[derive(Debug, Clone, serde::Deserialize)]
struct ApiServer {
    name: String,
    url: String,
    kubeconfig: PathBuf,
}

impl ApiServer {
    async fn client(&self) -> Client {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).expect("the harness kubeconfig");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.expect("config");
        Client::try_from(config).expect("client")
    }
}

/// The harness we started ourselves (stdin kept open) when `scripts/test` did not start one.
static OWN_HARNESS: Mutex<Option<(Child, ChildStdin)>> = Mutex::new(None);

/// The harness's control endpoint, or None (the test is skipped: [`skip`]).
fn control() -> Option<String> {
    static CONTROL: OnceLock<Result<String, String>> = OnceLock::new();
    match CONTROL.get_or_init(find_or_start_harness) {
        Ok(url) => Some(url.clone()),
        Err(why) => {
            skip::skip(why);
            None
        }
    }
}

/// `PADDOCK_TEST_KUBE_CONTROL`, or (outside CI) a harness started here, or why there is none.
fn find_or_start_harness() -> Result<String, String> {
    if let Some(url) = std::env::var("PADDOCK_TEST_KUBE_CONTROL").ok().filter(|v| !v.is_empty()) {
        return Ok(url.trim_end_matches('/').to_owned());
    }
    let unset = "PADDOCK_TEST_KUBE_CONTROL is not set (run the tests with scripts/test)";
    if skip::on_ci() {
        return Err(unset.to_owned());
    }
    let bin = std::env::var("PADDOCK_KUBE_HARNESS_BIN").ok().filter(|v| !v.is_empty()).map_or_else(
        || PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/paddock/kube-harness/kube-harness"),
        PathBuf::from,
    );
    if !bin.is_file() {
        return Err(format!("{unset}, and there is no kube-harness at {} (build tests/kube-harness)", bin.display()));
    }
    let failed = |e: &dyn std::fmt::Display| format!("{unset}, and starting {} failed: {e}", bin.display());
    let log = std::env::temp_dir().join(format!("paddock-api-kube-harness-{}.log", std::process::id()));
    let stderr = std::fs::File::create(&log).map_err(|e| failed(&e))?;
    let mut child = Command::new(&bin)
        .arg("--exit-on-stdin-eof")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|e| failed(&e))?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(failed(&"no pipes to it"));
    };
    let mut addr = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.map_err(|e| failed(&e))?;
        if let Some(a) = line.strip_prefix("CONTROL_ADDR=") {
            addr = Some(a.to_owned());
        } else if line == "READY" {
            break;
        }
    }
    let addr = addr.ok_or_else(|| failed(&format!("it printed no CONTROL_ADDR (its log: {})", log.display())))?;
    *OWN_HARNESS.lock().map_err(|e| failed(&e))? = Some((child, stdin));
    Ok(format!("http://{addr}"))
}

fn harness_http() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(240)).build().expect("client")
}

/// A fresh API server (with `crds`; `controllers` None: the harness's default ones), named after
/// `label`, unique in the harness.
async fn create_server(label: &str, crds: &[PathBuf], controllers: Option<&[&str]>) -> ApiServer {
    let control = control().expect("checked by Lab::new");
    let mut name = format!("api-{label}-{}-{}", std::process::id(), &uuid::Uuid::new_v4().simple().to_string()[..6]);
    name.truncate(63);
    let mut body = json!({ "name": name, "crds": crds });
    if let Some(controllers) = controllers {
        body["controllers"] = json!(controllers);
    }
    let rsp = harness_http().post(format!("{control}/apiservers")).json(&body).send().await.expect("POST /apiservers");
    let status = rsp.status().as_u16();
    let body = rsp.text().await.expect("body");
    assert_eq!(status, 201, "creating API server {name}: {body}");
    serde_json::from_str(&body).expect("API server info")
}

async fn delete_server(name: &str) {
    let control = control().expect("a server exists, so the harness does");
    let _ = harness_http().delete(format!("{control}/apiservers/{name}")).send().await;
}

fn shared_dir() -> PathBuf {
    match std::env::var("PADDOCK_SHARED").ok().filter(|v| !v.is_empty()) {
        Some(s) => PathBuf::from(s),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"),
    }
}

/// Absolute paths of `files` in `shared/crds/<dir>`, or None (the test is skipped: [`skip`]).
fn crds(dir: &str, files: &[&str]) -> Option<Vec<PathBuf>> {
    let dir = shared_dir().join("crds").join(dir);
    let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).collect();
    if paths.iter().all(|p| p.is_file()) {
        return Some(paths.into_iter().map(|p| p.canonicalize().expect("canonical path")).collect());
    }
    skip::skip(format_args!("CRDs missing in {}", dir.display()));
    None
}

const KAMAJI_CRDS: [&str; 2] = ["kamaji.clastix.io_tenantcontrolplanes.yaml", "kamaji.clastix.io_datastores.yaml"];
const SLINKY_KINDS: [&str; 6] = ["accountings", "controllers", "loginsets", "nodesets", "restapis", "tokens"];

// ---------------------------------------------------------------------------------------------
// The tenant base stack: the real upstream files.

/// The directory `scripts/test` filled with the real upstream files of the newest embedded stack
/// (`PADDOCK_TEST_UPSTREAM_STACKS`, laid out as a stacks directory), or None when a file is missing
/// (the test is skipped: [`skip`]).
fn upstream_stacks() -> Option<PathBuf> {
    let definition = paddock_domain::stack::definition(latest_version()).expect("the embedded definition");
    let dir = std::env::var("PADDOCK_TEST_UPSTREAM_STACKS").ok().filter(|v| !v.is_empty()).map(PathBuf::from);
    let files = definition.components.iter().flat_map(|c| &c.manifests);
    let missing = match &dir {
        None => Some("PADDOCK_TEST_UPSTREAM_STACKS is not set".to_owned()),
        Some(d) => files
            .map(|m| d.join(&definition.version).join(&m.file))
            .find(|f| !f.is_file())
            .map(|f| f.display().to_string()),
    };
    if let Some(missing) = missing {
        skip::skip(format_args!("the upstream stack manifests are missing: {missing} (scripts/test fetches them)"));
        return None;
    }
    dir
}

/// STAND-IN for slurmrestd as the Slinky driver sees it: the ping always answers, no node is
/// known to Slurm (draining has nothing to wait for, and no node rates a machine).
struct StandInProbe;

impl SlurmProbe for StandInProbe {
    fn ping<'a>(&'a self, _: &'a TenantAccess, _: &'a str) -> BoxFuture<'a, Result<bool, DriverError>> {
        async { Ok(true) }.boxed()
    }

    fn drain<'a>(
        &'a self,
        _: &'a TenantAccess,
        _: &'a str,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Option<bool>, DriverError>> {
        async { Ok(None) }.boxed()
    }

    fn nodes<'a>(&'a self, _: &'a TenantAccess, _: &'a str) -> BoxFuture<'a, Result<Vec<SlurmNode>, DriverError>> {
        async { Ok(Vec::new()) }.boxed()
    }
}

// ---------------------------------------------------------------------------------------------
// What the test plays.

/// A tenant control plane Kamaji (played) runs: a harness API server.
#[derive(Clone)]
struct TenantServer {
    server: ApiServer,
    client: Client,
}

/// The played world's state, shared with the test.
struct Play {
    platform: Client,
    /// The served API (for the machines' states).
    api: String,
    /// Cluster id -> its tenant API server, while its control plane exists.
    tenants: Mutex<HashMap<String, TenantServer>>,
    /// Cluster id -> what its tenant API server held when its TenantControlPlane was deleted.
    at_deletion: Mutex<HashMap<String, Value>>,
    /// Every tenant API server ever started (stopped at the end).
    started: Mutex<Vec<String>>,
    /// Machine id -> the bootstrap tokens its kubelet found to join with: (Secret name, lifetime
    /// in seconds from the Secret's creation to its `expiration`).
    tokens: Mutex<HashMap<String, Vec<(String, i64)>>>,
    /// The REAL operator and what it needs, instead of the played operator and workload
    /// controllers (see [`operator`]); None plays them.
    real: Option<operator::RealOperator>,
    /// The players' rounds completed so far.
    rounds: AtomicU64,
    /// Cluster ids whose slurmctld the played kubelet keeps in CrashLoopBackOff ([`crash`]).
    crash_looping: Mutex<BTreeSet<String>>,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Play {
    async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            for (what, result) in [
                ("kamaji", self.kamaji().await),
                ("kubelets", self.kubelets().await),
                ("controllers", self.controllers().await),
            ] {
                if let Err(e) = result {
                    eprintln!("player {what}: {e}");
                }
            }
            self.rounds.fetch_add(1, Ordering::SeqCst);
            tokio::select! {
                _ = stop.changed() => return,
                () = tokio::time::sleep(Duration::from_millis(300)) => {}
            }
        }
    }

    fn tenant(&self, cluster: &str) -> Option<TenantServer> {
        self.tenants.lock().expect("lock").get(cluster).cloned()
    }

    /// Fails the test when the real operator or a played part of it stopped (no-op when played).
    fn check(&self) {
        if let Some(real) = &self.real {
            real.check();
        }
    }

    /// What the real operator's cluster still waits for (pods, the operator's log); empty when
    /// the operator is played.
    async fn diagnose(&self, cluster: &str) -> String {
        match (&self.real, self.tenant(cluster)) {
            (Some(real), Some(t)) => real.diagnose(cluster, &t.client).await,
            _ => String::new(),
        }
    }

    /// PLAYS KAMAJI.
    async fn kamaji(&self) -> Result<(), String> {
        let all: Api<DynamicObject> = Api::all_with(self.platform.clone(), &kamaji::api_resource());
        for tcp in all.list(&ListParams::default()).await.map_err(err)?.items {
            let (ns, name) = (tcp.namespace().unwrap_or_default(), tcp.name_any());
            let cluster = tcp.labels().get(LABEL_CLUSTER_ID).cloned().unwrap_or_default();
            let api: Api<DynamicObject> = Api::namespaced_with(self.platform.clone(), &ns, &kamaji::api_resource());
            if tcp.metadata.deletion_timestamp.is_some() {
                // Kamaji's finalizer: its control plane goes. What the tenant API server holds at
                // that moment is recorded first.
                let gone = self.tenants.lock().expect("lock").remove(&cluster);
                if let Some(t) = gone {
                    let held = holdings(&t.client).await;
                    if let Some(real) = &self.real {
                        real.stop(&cluster);
                    }
                    eprintln!("kamaji (played): control plane of {cluster} deleted; its API server held {held}");
                    self.at_deletion.lock().expect("lock").insert(cluster.clone(), held);
                    delete_server(&t.server.name).await;
                }
                let clear = json!({ "metadata": { "finalizers": null } });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&clear)).await.map_err(err)?;
                continue;
            }
            let tenant = match self.tenant(&cluster) {
                Some(t) => t,
                None => {
                    let controllers = self.real.as_ref().map(|_| operator::WORKLOADS);
                    let server = create_server("tenant", &[], controllers).await;
                    self.started.lock().expect("lock").push(server.name.clone());
                    let t = TenantServer { client: server.client().await, server };
                    self.tenants.lock().expect("lock").insert(cluster.clone(), t.clone());
                    t
                }
            };
            if !tcp.finalizers().iter().any(|f| f == KAMAJI_FINALIZER) {
                let add = json!({ "metadata": { "finalizers": [KAMAJI_FINALIZER] } });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&add)).await.map_err(err)?;
            }
            let secret_name = format!("{name}-admin-kubeconfig");
            let secrets: Api<Secret> = Api::namespaced(self.platform.clone(), &ns);
            if secrets.get_opt(&secret_name).await.map_err(err)?.is_none() {
                let admin_conf = std::fs::read_to_string(&tenant.server.kubeconfig).map_err(err)?;
                let secret: Secret = serde_json::from_value(json!({
                    "metadata": { "name": secret_name },
                    "stringData": { ADMIN_KUBECONFIG_KEY: admin_conf, "admin.svc": admin_conf },
                }))
                .map_err(err)?;
                secrets.create(&PostParams::default(), &secret).await.map_err(err)?;
            }
            let status = &tcp.data["status"];
            let generation = tcp.metadata.generation;
            if status["observedGeneration"].as_i64() != generation
                || status["kubernetesResources"]["version"]["status"] != "Ready"
            {
                let version = tcp.data["spec"]["kubernetes"]["version"].clone();
                let endpoint = tenant.server.url.trim_start_matches("https://").to_owned();
                let status = json!({ "status": {
                    "observedGeneration": generation,
                    "controlPlaneEndpoint": endpoint,
                    "kubeconfig": { "admin": { "secretName": secret_name, "checksum": "played" } },
                    "kubernetesResources": { "version": { "status": "Ready", "version": version } },
                }});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.map_err(err)?;
            }
        }
        Ok(())
    }

    /// PLAYS THE KUBELETS: every machine paddock reports `provisioning` registers its Node, once
    /// a bootstrap token for it exists (what it joins with; its lifetime is recorded).
    async fn kubelets(&self) -> Result<(), String> {
        let url = format!("{}/v1/machines?state=provisioning&limit=100", self.api);
        let rsp = reqwest::Client::new().get(url).bearer_auth(admin()).send().await.map_err(err)?;
        let machines: Value = rsp.json().await.map_err(err)?;
        for m in machines["items"].as_array().cloned().unwrap_or_default() {
            let Some(tenant) = m["cluster_id"].as_str().and_then(|c| self.tenant(c)) else { continue };
            let machine_id = MachineId(m["id"].as_str().and_then(|i| i.parse().ok()).ok_or("machine id")?);
            let name = paddock_domain::driver::node_name(machine_id);
            if self.registered(&tenant.client, &name).await? {
                continue;
            }
            let secrets: Api<Secret> = Api::namespaced(tenant.client.clone(), BOOTSTRAP_NAMESPACE);
            let mine = ListParams::default().labels(&format!("{LABEL_MACHINE_ID}={machine_id}"));
            let tokens = secrets.list(&mine).await.map_err(err)?.items;
            if tokens.is_empty() {
                continue;
            }
            let seen: Vec<(String, i64)> = tokens
                .iter()
                .map(|t| {
                    let created = t.metadata.creation_timestamp.as_ref().map(|c| c.0.timestamp()).unwrap_or_default();
                    let expiration = t
                        .data
                        .as_ref()
                        .and_then(|d| d.get("expiration"))
                        .and_then(|e| std::str::from_utf8(&e.0).ok())
                        .and_then(|e| chrono::DateTime::parse_from_rfc3339(e).ok())
                        .map(|e| e.timestamp())
                        .unwrap_or_default();
                    (t.name_any(), expiration - created)
                })
                .collect();
            self.tokens.lock().expect("lock").insert(machine_id.to_string(), seen);
            let uuid = m["system_uuid"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| paddock_sim::system_uuid(m["name"].as_str().unwrap_or_default()));
            match &self.real {
                Some(real) => real.register(&self.api, &tenant.client, &name, &uuid, &m).await?,
                None => register_node(&tenant.client, &name, &uuid).await?,
            }
        }
        Ok(())
    }

    /// Whether machine's Node `name` is registered (by the real-operator kubelets: completely).
    async fn registered(&self, client: &Client, name: &str) -> Result<bool, String> {
        if let Some(real) = &self.real {
            return Ok(real.registered(name));
        }
        Ok(Api::<Node>::all(client.clone()).get_opt(name).await.map_err(err)?.is_some())
    }

    /// PLAYS THE WORKLOAD CONTROLLERS AND THE SLINKY OPERATOR in every tenant API server.
    async fn controllers(&self) -> Result<(), String> {
        let tenants: Vec<(String, TenantServer)> =
            self.tenants.lock().expect("lock").iter().map(|(c, t)| (c.clone(), t.clone())).collect();
        for (cluster, t) in tenants {
            if let Some(real) = &self.real {
                real.tend(&cluster, &t).await?;
                continue;
            }
            operator(&t.client).await?;
            let crashing = self.crash_looping.lock().expect("lock").contains(&cluster);
            let controller_ready = crash::controller_pod(&t.client, crashing).await?;
            workloads(&t.client, controller_ready).await?;
            nodesets(&t.client).await?;
        }
        Ok(())
    }
}

/// A Node as the kubelet registers it (PLAYED): its system UUID, Ready; no capacity (nothing is
/// scheduled without the real operator, [`operator`]).
async fn register_node(client: &Client, name: &str, uuid: &str) -> Result<(), String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { "kubernetes.io/hostname": name } },
    }))
    .map_err(err)?;
    nodes.create(&PostParams::default(), &node).await.map_err(err)?;
    let status = json!({ "status": {
        "nodeInfo": {
            "systemUUID": uuid, "machineID": "m", "bootID": "b", "kernelVersion": "6.8.0",
            "osImage": "Ubuntu 24.04", "containerRuntimeVersion": "containerd://2.0.0",
            "kubeletVersion": "v1.34.1", "kubeProxyVersion": "", "operatingSystem": "linux",
            "architecture": "amd64",
        },
        "conditions": [{ "type": "Ready", "status": "True", "reason": "KubeletReady" }],
    }});
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.map_err(err)?;
    Ok(())
}

/// What a tenant API server holds: its Nodes and its Slurm custom objects, and its RayClusters
/// (`ray`, only when there is one).
async fn holdings(client: &Client) -> Value {
    let nodes: Vec<String> = match Api::<Node>::all(client.clone()).list(&ListParams::default()).await {
        Ok(l) => l.items.iter().map(ResourceExt::name_any).collect(),
        Err(e) => vec![format!("error: {e}")],
    };
    let mut slurm = Vec::new();
    for kind in ["Accounting", "Controller", "LoginSet", "NodeSet", "RestApi"] {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &slurm::api_resource(kind));
        // A just-established CRD answers 429 ("storage is (re)initializing") for a moment.
        let mut listed = api.list(&ListParams::default()).await;
        for _ in 0..100 {
            if !matches!(&listed, Err(kube::Error::Api(s)) if s.code == 429) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            listed = api.list(&ListParams::default()).await;
        }
        match listed {
            Ok(l) => slurm.extend(l.items.iter().map(|o| format!("{kind} {}", o.name_any()))),
            // No CRDs: no Slurm objects either.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => slurm.push(format!("error: {e}")),
        }
    }
    let mut held = json!({ "nodes": nodes, "slurm": slurm });
    let rayclusters: Api<DynamicObject> = Api::all_with(client.clone(), &paddock_kube::ray::raycluster_resource());
    match rayclusters.list(&ListParams::default()).await {
        Ok(l) if l.items.is_empty() => {}
        Ok(l) => held["ray"] = json!(l.items.iter().map(ResourceExt::name_any).collect::<Vec<_>>()),
        // No CRD (not a Ray cluster's stack): no RayCluster either.
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => held["ray"] = json!([format!("error: {e}")]),
    }
    held
}

/// The status of a Deployment or StatefulSet with `replicas`, `ready` of them ready (PLAYS THE
/// CONTROLLER).
fn replica_status(generation: Option<i64>, replicas: i32, ready: i32) -> Value {
    json!({ "status": {
        "observedGeneration": generation, "replicas": replicas, "readyReplicas": ready,
        "updatedReplicas": replicas, "availableReplicas": ready, "currentReplicas": replicas,
    }})
}

/// Every workload ready, but the controller's StatefulSet while its pod is not
/// (`controller_ready`).
async fn workloads(client: &Client, controller_ready: bool) -> Result<(), String> {
    let params = PatchParams::default();
    let deployments: Api<Deployment> = Api::all(client.clone());
    for d in deployments.list(&ListParams::default()).await.map_err(err)?.items {
        let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let st = d.status.clone().unwrap_or_default();
        if st.observed_generation != d.metadata.generation || st.available_replicas != Some(replicas) {
            let api: Api<Deployment> = Api::namespaced(client.clone(), &d.namespace().unwrap_or_default());
            let status = replica_status(d.metadata.generation, replicas, replicas);
            api.patch_status(&d.name_any(), &params, &Patch::Merge(&status)).await.map_err(err)?;
        }
    }
    let statefulsets: Api<StatefulSet> = Api::all(client.clone());
    for s in statefulsets.list(&ListParams::default()).await.map_err(err)?.items {
        let replicas = s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let ready = if s.name_any() == slurm::CONTROLLER_WORKLOAD && !controller_ready { 0 } else { replicas };
        let st = s.status.clone().unwrap_or_default();
        if st.observed_generation != s.metadata.generation || st.ready_replicas != Some(ready) {
            let api: Api<StatefulSet> = Api::namespaced(client.clone(), &s.namespace().unwrap_or_default());
            let status = replica_status(s.metadata.generation, replicas, ready);
            api.patch_status(&s.name_any(), &params, &Patch::Merge(&status)).await.map_err(err)?;
        }
    }
    let daemonsets: Api<DaemonSet> = Api::all(client.clone());
    for d in daemonsets.list(&ListParams::default()).await.map_err(err)?.items {
        let st = d.status.clone().unwrap_or_default();
        if st.observed_generation != d.metadata.generation || st.number_available != Some(1) {
            let api: Api<DaemonSet> = Api::namespaced(client.clone(), &d.namespace().unwrap_or_default());
            let status = json!({ "status": {
                "observedGeneration": d.metadata.generation, "desiredNumberScheduled": 1,
                "currentNumberScheduled": 1, "updatedNumberScheduled": 1, "numberReady": 1,
                "numberAvailable": 1, "numberMisscheduled": 0,
            }});
            api.patch_status(&d.name_any(), &params, &Patch::Merge(&status)).await.map_err(err)?;
        }
    }
    Ok(())
}

/// The login host key the operator stand-in publishes (made by `ssh-keygen -t ed25519`), and its
/// fingerprint as `ssh-keygen -l -E sha256` printed it.
const LOGIN_HOST_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL2AmpA4kI/TYTmjC3Vf+h3HQc/vvGHZNgUIITHqcjcJ";
const LOGIN_HOST_KEY_FINGERPRINT: &str = "SHA256:gZv72HZq4UhmTQ3QmrF3VWb5PXSV+UVu9JVQwPE7sL0";

/// PLAYS THE SLINKY OPERATOR: once the Controller exists, the workloads, Services and SSH host keys
/// it makes.
async fn operator(client: &Client) -> Result<(), String> {
    let ns = slurm::NAMESPACE;
    let controllers: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &slurm::api_resource("Controller"));
    match controllers.get_opt(slurm::CONTROLLER).await {
        Ok(Some(_)) => {}
        Ok(None) | Err(kube::Error::Api(_)) => return Ok(()),
        Err(e) => return Err(err(e)),
    }
    let logins: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &slurm::api_resource("LoginSet"));
    let login_replicas = match logins.get_opt(slurm::LOGINSET).await.map_err(err)? {
        Some(l) => l.data["spec"]["replicas"].as_i64().unwrap_or(1),
        None => 1,
    };
    let apply = PatchParams::apply("slinky-operator-stand-in");
    let pod_template = |app: &str| {
        json!({ "metadata": { "labels": { "app": app } },
                "spec": { "containers": [{ "name": "c", "image": "example.invalid/standin/slurm:1" }] } })
    };
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    for name in [slurm::ACCOUNTING_WORKLOAD, slurm::CONTROLLER_WORKLOAD] {
        if statefulsets.get_opt(name).await.map_err(err)?.is_none() {
            let body = json!({ "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": { "name": name },
                "spec": { "replicas": 1, "serviceName": name, "selector": { "matchLabels": { "app": name } },
                          "template": pod_template(name) } });
            statefulsets.patch(name, &apply, &Patch::Apply(&body)).await.map_err(err)?;
        }
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    for (name, replicas) in [(slurm::RESTAPI_SERVICE, 1), (slurm::LOGIN_SERVICE, login_replicas)] {
        if deployments.get_opt(name).await.map_err(err)?.is_none() {
            let body = json!({ "apiVersion": "apps/v1", "kind": "Deployment", "metadata": { "name": name },
                "spec": { "replicas": replicas, "selector": { "matchLabels": { "app": name } },
                          "template": pod_template(name) } });
            deployments.patch(name, &apply, &Patch::Apply(&body)).await.map_err(err)?;
        }
    }
    // The login pods' SSH host keys (a private half too: paddock must show only the public one).
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    if secrets.get_opt(slurm::LOGIN_HOST_KEYS_SECRET).await.map_err(err)?.is_none() {
        let body = json!({ "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": slurm::LOGIN_HOST_KEYS_SECRET }, "immutable": true,
            "stringData": { "ssh_host_ed25519_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nstand-in\n",
                            "ssh_host_ed25519_key.pub": format!("{LOGIN_HOST_KEY} root@slurm-login") } });
        secrets.patch(slurm::LOGIN_HOST_KEYS_SECRET, &apply, &Patch::Apply(&body)).await.map_err(err)?;
    }
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    for (name, port, kind) in
        [(slurm::RESTAPI_SERVICE, slurm::RESTAPI_PORT, "ClusterIP"), (slurm::LOGIN_SERVICE, 22, "LoadBalancer")]
    {
        let svc = services.get_opt(name).await.map_err(err)?;
        if svc.is_none() {
            let body = json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": name },
                "spec": { "type": kind, "selector": { "app": name }, "ports": [{ "port": port }] } });
            services.patch(name, &apply, &Patch::Apply(&body)).await.map_err(err)?;
        }
        let has_ingress = svc.and_then(|s| s.status).and_then(|s| s.load_balancer).and_then(|l| l.ingress).is_some();
        if kind == "LoadBalancer" && !has_ingress {
            let status = json!({ "status": { "loadBalancer": { "ingress": [{ "ip": "203.0.113.10" }] } } });
            services.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.map_err(err)?;
        }
    }
    Ok(())
}

/// PLAYS THE SLINKY OPERATOR for NodeSets: as many ready replicas as Ready Nodes match.
async fn nodesets(client: &Client) -> Result<(), String> {
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &slurm::api_resource("NodeSet"));
    let list = match all.list(&ListParams::default()).await {
        Ok(l) => l,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(err(e)),
    };
    for ns in list.items {
        let replicas = ns.data["spec"]["replicas"].as_i64().unwrap_or(0);
        let matching = selected_nodes(client, &ns.data["spec"]).await?;
        let ready = i64::try_from(matching.len()).unwrap_or(0).min(replicas);
        let status = &ns.data["status"];
        if status["observedGeneration"].as_i64() == ns.metadata.generation
            && status["readyReplicas"].as_i64() == Some(ready)
            && status["replicas"].as_i64() == Some(replicas)
        {
            continue;
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &ns.namespace().unwrap_or_default(), &slurm::api_resource("NodeSet"));
        let patch = json!({ "status": {
            "observedGeneration": ns.metadata.generation, "replicas": replicas, "readyReplicas": ready,
            "nodeSetHash": "stand-in", "selector": format!("app={}", ns.name_any()),
        }});
        api.patch_status(&ns.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(err)?;
    }
    Ok(())
}

/// The Ready Nodes a NodeSet spec's nodeSelector matches (the API server's own label matching).
async fn selected_nodes(client: &Client, spec: &Value) -> Result<BTreeSet<String>, String> {
    let selector = spec["template"]["spec"]["nodeSelector"].as_object().cloned().unwrap_or_default();
    let selector: Vec<String> =
        selector.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect();
    let nodes: Api<Node> = Api::all(client.clone());
    let listed = nodes.list(&ListParams::default().labels(&selector.join(","))).await.map_err(err)?;
    Ok(listed
        .items
        .into_iter()
        .filter(|n| {
            let conditions = n.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
            conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
        })
        .filter_map(|n| n.metadata.name)
        .collect())
}

// ---------------------------------------------------------------------------------------------
// The lab.

/// A tenant of the lab: its id and a `tenant:admin` token.
struct Tenant {
    id: String,
    token: String,
}

/// The API (served, with the real credentials driver), a worker with the real Kubernetes drivers
/// and the simulated BMC, the simulated machines' agent, a platform API server with the Kamaji
/// CRDs, and the players.
struct Lab {
    app: TestApp,
    platform: ApiServer,
    platform_client: Client,
    play: Arc<Play>,
    /// The simulated BMCs' world (for faults).
    world: SimWorld,
    stop: watch::Sender<bool>,
    /// How long a wait for the cluster may take: [`WAIT`], longer with the real operator.
    wait: Duration,
}

impl Lab {
    /// None: no harness or no CRDs (skipped, as the module documentation says).
    async fn new() -> Option<Lab> {
        Self::with(|_| {}).await
    }

    /// Like [`Lab::new`], with the worker's settings changed by `tweak` first.
    async fn with(tweak: impl FnOnce(&mut Settings)) -> Option<Lab> {
        let kamaji_crds = crds("kamaji", &KAMAJI_CRDS)?;
        let stacks = upstream_stacks()?;
        control()?;
        Some(Self::build(tweak, kamaji_crds, stacks, None).await)
    }

    /// The lab with the REAL Slinky operator in every tenant cluster (see [`operator`]) and
    /// paddock's real slurmrestd probe; None: skipped ([`skip`]) without its inputs.
    async fn with_real_operator() -> Option<Lab> {
        let kamaji_crds = crds("kamaji", &KAMAJI_CRDS)?;
        let stacks = upstream_stacks()?;
        control()?;
        let real = operator::RealOperator::start().await?;
        Some(Self::build(|_| {}, kamaji_crds, stacks, Some(real)).await)
    }

    /// The lab with the REAL KubeRay operator in every tenant cluster whose stack applies it (see
    /// [`operator`]) and paddock's real Ray probe; None: skipped ([`skip`]) without its inputs.
    async fn with_real_ray_operator() -> Option<Lab> {
        let kamaji_crds = crds("kamaji", &KAMAJI_CRDS)?;
        let stacks = upstream_stacks()?;
        control()?;
        let real = operator::RealOperator::start_ray().await?;
        Some(Self::build(|_| {}, kamaji_crds, stacks, Some(real)).await)
    }

    async fn build(
        tweak: impl FnOnce(&mut Settings),
        kamaji_crds: Vec<PathBuf>,
        stacks: PathBuf,
        real: Option<operator::RealOperator>,
    ) -> Lab {
        let platform = create_server("platform", &kamaji_crds, None).await;

        let mut app = TestApp::served().await;
        let store = Store::from_pool(app.db.pool.clone());
        let world = SimWorld::new(store.clone(), SimConfig::zero());
        // The drivers as `paddock serve` assembles them with PADDOCK_KUBE_DRIVER=kubernetes,
        // except the slurmrestd probe (a stand-in) when the operator is played.
        let kube_platform = KubePlatform::connect(Some(&platform.kubeconfig)).await.expect("platform");
        let stack = KubeTenantStack::new(stacks);
        stack.verify(latest_version()).expect("the stack files verify");
        let credentials = Arc::new(KubeTenantCredentials::new());
        let kube = KubeDrivers {
            control_plane: Arc::new(KamajiBackend::new(kube_platform.client().clone())),
            platform: Arc::new(kube_platform),
            nodes: Arc::new(KubeTenantNodes::new()),
            stack: Arc::new(stack),
            slurm: Arc::new(match real {
                Some(_) => SlinkyDriver::with_service_proxy(SlinkySettings::default()),
                None => SlinkyDriver::new(SlinkySettings::default(), Arc::new(StandInProbe)),
            }),
            ray: Arc::new(paddock_kube::KubeRayDriver::with_pod_proxy(paddock_kube::ray::RaySettings::default())),
            credentials: credentials.clone(),
        };
        // The router as `paddock api` builds it with the real credentials driver (in-process
        // requests; the served port only takes the agents' reports).
        let services = app.services.clone().with_credentials(credentials);
        let verifier = Verifier::new(VerifierConfig {
            hs256_secret: Some(AuthSecret::new(TEST_SECRET.to_vec())),
            ..Default::default()
        })
        .await
        .expect("verifier");
        app.router = paddock_api::router(AppState::new(services, verifier, ApiConfig::default()));

        let drivers = Drivers { bmc: Some(world.bmc()), kube: Some(kube) };
        let mut settings = Settings {
            wipe_image_url: Some("http://images.invalid/wipe.iso".into()),
            os_image_url: Some("http://images.invalid/os.iso".into()),
            poll: Duration::from_millis(250),
            report_wait: Duration::from_secs(2),
            ..Settings::default()
        };
        tweak(&mut settings);
        let config = WorkerConfig {
            concurrency: 8,
            poll_interval: Duration::from_millis(50),
            backoff_base: Duration::from_millis(10),
            backoff_cap: Duration::from_millis(500),
            max_attempts: 1000,
            ..WorkerConfig::default()
        };
        let (stop, _metrics) = crate::common::run_worker(&app, &world, drivers, settings, config, "kube-lab-worker");
        let platform_client = platform.client().await;
        let play = Arc::new(Play {
            platform: platform_client.clone(),
            api: app.base_url.clone().expect("served"),
            tenants: Mutex::new(HashMap::new()),
            at_deletion: Mutex::new(HashMap::new()),
            started: Mutex::new(Vec::new()),
            tokens: Mutex::new(HashMap::new()),
            real,
            rounds: AtomicU64::new(0),
            crash_looping: Mutex::new(BTreeSet::new()),
        });
        let wait = if play.real.is_some() { WAIT_REAL } else { WAIT };
        tokio::spawn(play.clone().run(stop.subscribe()));
        Lab { app, platform, platform_client, play, world, stop, wait }
    }

    /// Stops the worker and players, and the API servers of this test.
    async fn finish(self) {
        let _ = self.stop.send(true);
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Some(real) = &self.play.real {
            real.stop_all();
        }
        let started: Vec<String> = self.play.started.lock().expect("lock").clone();
        for name in started {
            delete_server(&name).await;
        }
        delete_server(&self.platform.name).await;
    }

    async fn tenant(&self, name: &str) -> Tenant {
        let t = tenant(&self.app, name).await;
        let token = token(&["tenant:admin"], Some(id(&t).parse().expect("uuid")));
        Tenant { id: id(&t), token }
    }

    async fn enroll(&self, class: &str, names: &[&str]) -> Vec<String> {
        let mut ids = Vec::new();
        for name in names {
            let body = json!({
                "name": name, "machine_class": class,
                "bmc": { "url": format!("sim://{name}"), "username": "admin", "password": "simulated" }
            });
            let created = self.app.post("/v1/machines").token(&admin()).json(&body).send().await.expect(202).json();
            ids.push(id(&created["machine"]));
        }
        for m in &ids {
            eventually(WAIT, || async {
                let v = self.app.get(format!("/v1/machines/{m}")).token(&admin()).send().await.expect(200).json();
                (v["state"] == "available").then_some(())
            })
            .await;
        }
        ids
    }

    /// Tenant acme's Slurm cluster `hpc` with a CPU pool and a GPU pool (`gpus` per machine) of
    /// one machine each, three machines enrolled (two CPU, one GPU); its id and its pools' ids
    /// by name.
    async fn create_hpc(&self, gpus: u32) -> (Tenant, String, BTreeMap<String, String>) {
        machine_class(&self.app, "cpu", 0).await;
        machine_class(&self.app, "gpu", gpus).await;
        self.enroll("cpu", &["c1", "c2", "c3"]).await;
        self.enroll("gpu", &["g1"]).await;
        let t = self.tenant("acme").await;
        let body = json!({
            "name": "hpc", "kind": "slurm", "isolation": "private-nodes",
            "node_pools": [
                { "name": "cpu", "machine_class": "cpu", "count": 1 },
                { "name": "gpu", "machine_class": "gpu", "count": 1 },
                { "name": "sys", "machine_class": "cpu", "count": 1, "role": "system" },
            ],
        });
        let created = self.create(&t, body).await;
        let pools = created["cluster"]["node_pools"].as_array().expect("pools");
        let pools = pools.iter().map(|p| (p["name"].as_str().expect("name").to_owned(), id(p))).collect();
        (t, id(&created["cluster"]), pools)
    }

    async fn create(&self, t: &Tenant, body: Value) -> Value {
        let path = format!("/v1/tenants/{}/clusters", t.id);
        self.app.post(path).token(&t.token).json(&body).send().await.expect(202).json()
    }

    fn path(t: &Tenant, cluster: &str) -> String {
        format!("/v1/tenants/{}/clusters/{cluster}", t.id)
    }

    async fn cluster(&self, t: &Tenant, cluster: &str) -> Value {
        self.app.get(Self::path(t, cluster)).token(&t.token).send().await.expect(200).json()
    }

    /// Waits until the cluster is ready at its current generation (on timeout, shows the cluster).
    async fn ready(&self, t: &Tenant, cluster: &str) -> Value {
        let end = std::time::Instant::now() + self.wait;
        loop {
            let c = self.cluster(t, cluster).await;
            if c["status"]["phase"] == "ready" && c["status"]["observed_generation"] == c["generation"] {
                return c;
            }
            self.play.check();
            if std::time::Instant::now() > end {
                panic!("not ready after {:?}: {c:#}\n{}", self.wait, self.play.diagnose(cluster).await);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the cluster is gone (404); on timeout, shows it.
    async fn gone(&self, t: &Tenant, cluster: &str) {
        let end = std::time::Instant::now() + self.wait;
        loop {
            let rsp = self.app.get(Self::path(t, cluster)).token(&t.token).send().await;
            if rsp.status.as_u16() == 404 {
                return;
            }
            self.play.check();
            if std::time::Instant::now() > end {
                panic!("not gone after {:?}: {:#}\n{}", self.wait, rsp.json(), self.play.diagnose(cluster).await);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn scale(&self, t: &Tenant, cluster: &str, pool: &str, count: u32) {
        let path = format!("{}/node-pools/{pool}", Self::path(t, cluster));
        self.app.patch(path).token(&t.token).json(&json!({ "count": count })).send().await.expect(202);
    }

    fn tenant_client(&self, cluster: &str) -> Client {
        self.play.tenant(cluster).expect("the cluster's tenant API server").client
    }

    fn tenant_server(&self, cluster: &str) -> ApiServer {
        self.play.tenant(cluster).expect("the cluster's tenant API server").server
    }

    async fn scalar(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.app.db.pool).await.expect(sql)
    }

    /// The versions of the cluster's objects on the platform and in its tenant API server once the
    /// players are at rest: a whole round of theirs, begun after a read, changed none of them.
    async fn at_rest(&self, cluster: &str) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        let versions = || async {
            (
                platform_versions(&self.platform_client, cluster).await,
                tenant_versions(&self.tenant_client(cluster)).await,
            )
        };
        let until = tokio::time::Instant::now() + self.wait;
        let mut seen = versions().await;
        loop {
            // Two rounds ended: one of them began after the read above.
            let round = self.play.rounds.load(Ordering::SeqCst) + 2;
            eventually(self.wait, || async { (self.play.rounds.load(Ordering::SeqCst) >= round).then_some(()) }).await;
            let now = versions().await;
            if now == seen {
                return now;
            }
            assert!(tokio::time::Instant::now() < until, "the players never came to rest: {now:?}");
            seen = now;
        }
    }

    /// Makes the worker reconcile the cluster once more and waits until that run finished.
    /// Makes the cluster's queued drift check due now and waits until it has run (queued again).
    async fn drift_check_now(&self, cluster: &str) {
        let pool = &self.app.db.pool;
        let due: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
            "update jobs set run_at = now() where target_id = $1::uuid and kind = 'cluster_drift_check' \
             and state = 'queued' returning now()",
        )
        .bind(cluster)
        .fetch_optional(pool)
        .await
        .expect("make the drift check due");
        let due = due.expect("a ready cluster has a queued drift check");
        eventually(WAIT, || async {
            let again: i64 = sqlx::query_scalar(
                "select count(*) from jobs where target_id = $1::uuid and kind = 'cluster_drift_check' \
                 and state = 'queued' and run_at > $2 + interval '1 minute'",
            )
            .bind(cluster)
            .bind(due)
            .fetch_one(pool)
            .await
            .expect("jobs");
            (again > 0).then_some(())
        })
        .await;
    }

    async fn reconcile_again(&self, t: &Tenant, cluster: &str) {
        let pool = &self.app.db.pool;
        let t0: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("select now()").fetch_one(pool).await.expect("now");
        let mut tx = paddock_store::Store::from_pool(pool.clone()).begin().await.expect("begin");
        let (tenant_id, cluster_id) =
            (TenantId(t.id.parse().expect("uuid")), ClusterId(cluster.parse().expect("uuid")));
        paddock_store::lifecycle::enqueue_cluster(&mut tx, tenant_id, cluster_id).await.expect("enqueue");
        tx.commit().await.expect("commit");
        eventually(WAIT, || async {
            let done: i64 = sqlx::query_scalar(
                "select count(*) from jobs where target_id = $1::uuid and kind = 'cluster_reconcile' \
                 and state = 'succeeded' and finished_at > $2",
            )
            .bind(cluster)
            .bind(t0)
            .fetch_one(pool)
            .await
            .expect("jobs");
            (done > 0).then_some(())
        })
        .await;
    }

    /// The node names of a pool's machines, as the API lists them.
    async fn pool_nodes(&self, t: &Tenant, cluster: &str, pool: &str) -> BTreeSet<String> {
        let path = format!("{}/node-pools/{pool}/machines", Self::path(t, cluster));
        let v = self.app.get(path).token(&admin()).send().await.expect(200).json();
        v["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|m| match m["node_name"].as_str() {
                Some(n) => n.to_owned(),
                None => {
                    paddock_domain::driver::node_name(MachineId(m["id"].as_str().expect("id").parse().expect("uuid")))
                }
            })
            .collect()
    }

    /// The Ready Nodes of the cluster's tenant API server.
    async fn nodes(&self, cluster: &str) -> BTreeSet<String> {
        selected_nodes(&self.tenant_client(cluster), &Value::Null).await.expect("nodes")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

fn kubernetes(name: &str, pools: Value) -> Value {
    json!({ "name": name, "kind": "kubernetes", "isolation": "private-nodes", "node_pools": pools })
}

fn all_true(cluster: &Value) {
    for c in cluster["status"]["conditions"].as_array().expect("conditions") {
        assert_eq!(c["status"], "True", "{c}: {cluster}");
    }
}

/// Everything a tenant API server holds that could name another tenant, as one JSON text.
async fn everything(client: &Client) -> String {
    async fn list<K>(client: &Client) -> Value
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let items = Api::<K>::all(client.clone()).list(&ListParams::default()).await.expect("list").items;
        serde_json::to_value(items).expect("json")
    }
    let namespaces = Api::<Namespace>::all(client.clone()).list(&ListParams::default()).await.expect("ns").items;
    let nodes = Api::<Node>::all(client.clone()).list(&ListParams::default()).await.expect("nodes").items;
    json!({
        "namespaces": namespaces,
        "nodes": nodes,
        "secrets": list::<Secret>(client).await,
        "configmaps": list::<ConfigMap>(client).await,
        "serviceaccounts": list::<ServiceAccount>(client).await,
    })
    .to_string()
}

/// The resourceVersion of every object the platform API server holds for a cluster.
async fn platform_versions(client: &Client, cluster: &str) -> BTreeMap<String, String> {
    let ns = isolation::namespace_name(ClusterId(cluster.parse().expect("uuid")));
    let mut out = BTreeMap::new();
    let rv = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| m.resource_version.clone().expect("rv");
    let namespace = Api::<Namespace>::all(client.clone()).get(&ns).await.expect("namespace");
    out.insert(format!("Namespace {ns}"), rv(&namespace.metadata));
    for p in Api::<NetworkPolicy>::namespaced(client.clone(), &ns).list(&ListParams::default()).await.expect("np").items
    {
        out.insert(format!("NetworkPolicy {}", p.name_any()), rv(&p.metadata));
    }
    for q in Api::<ResourceQuota>::namespaced(client.clone(), &ns).list(&ListParams::default()).await.expect("rq").items
    {
        out.insert(format!("ResourceQuota {}", q.name_any()), rv(&q.metadata));
    }
    for l in Api::<LimitRange>::namespaced(client.clone(), &ns).list(&ListParams::default()).await.expect("lr").items {
        out.insert(format!("LimitRange {}", l.name_any()), rv(&l.metadata));
    }
    let tcps: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kamaji::api_resource());
    for t in tcps.list(&ListParams::default()).await.expect("tcps").items {
        out.insert(format!("TenantControlPlane {}", t.name_any()), rv(&t.metadata));
    }
    out
}

/// The resourceVersion of the stack's and paddock's objects in a tenant API server.
async fn tenant_versions(client: &Client) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let rv = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| m.resource_version.clone().expect("rv");
    for d in Api::<Deployment>::all(client.clone()).list(&ListParams::default()).await.expect("d").items {
        out.insert(format!("Deployment {}/{}", d.namespace().unwrap_or_default(), d.name_any()), rv(&d.metadata));
    }
    for d in Api::<DaemonSet>::all(client.clone()).list(&ListParams::default()).await.expect("ds").items {
        out.insert(format!("DaemonSet {}/{}", d.namespace().unwrap_or_default(), d.name_any()), rv(&d.metadata));
    }
    for c in Api::<CustomResourceDefinition>::all(client.clone()).list(&ListParams::default()).await.expect("crd").items
    {
        out.insert(format!("CRD {}", c.name_any()), rv(&c.metadata));
    }
    for n in Api::<Node>::all(client.clone()).list(&ListParams::default()).await.expect("nodes").items {
        out.insert(format!("Node {}", n.name_any()), rv(&n.metadata));
    }
    out
}

/// The bearer token of a kubeconfig (kube-rs keeps it secret; read it from the text).
fn kubeconfig_token(text: &str) -> String {
    let line = text.lines().find(|l| l.trim_start().starts_with("token: ")).expect("a token line");
    let raw = line.trim_start().trim_start_matches("token: ").trim();
    serde_json::from_str::<String>(raw).unwrap_or_else(|_| raw.trim_matches('\'').to_owned())
}

// ---------------------------------------------------------------------------------------------
// The tests.

#[tokio::test]
async fn two_kubernetes_clusters_of_two_tenants_go_ready_isolated_scale_and_delete() {
    let Some(lab) = Lab::new().await else { return };
    machine_class(&lab.app, "cpu", 0).await;
    let machines = lab.enroll("cpu", &["k1", "k2", "k3"]).await;
    let (a, b) = (lab.tenant("acme").await, lab.tenant("globex").await);
    let pool = json!([{ "name": "workers", "machine_class": "cpu", "count": 1 }]);
    let created_a = lab.create(&a, kubernetes("alpha", pool.clone())).await;
    let created_b = lab.create(&b, kubernetes("beta", pool)).await;
    let (ca, cb) = (id(&created_a["cluster"]), id(&created_b["cluster"]));
    let pool_a = id(&created_a["cluster"]["node_pools"][0]);
    let ready_a = lab.ready(&a, &ca).await;
    let ready_b = lab.ready(&b, &cb).await;
    all_true(&ready_a);
    all_true(&ready_b);

    // The platform: one namespace per cluster, labelled, with its TenantControlPlane (applied
    // through the real Kamaji CRD's schema).
    for (t, c, r) in [(&a, &ca, &ready_a), (&b, &cb, &ready_b)] {
        let ns = isolation::namespace_name(ClusterId(c.parse().expect("uuid")));
        let namespace = Api::<Namespace>::all(lab.platform_client.clone()).get(&ns).await.expect("namespace");
        let labels = namespace.labels();
        assert_eq!(labels.get(LABEL_TENANT_ID), Some(&t.id));
        assert_eq!(labels.get(LABEL_CLUSTER_ID), Some(c));
        let tcps: Api<DynamicObject> = Api::namespaced_with(lab.platform_client.clone(), &ns, &kamaji::api_resource());
        let tcp = tcps.get(&kamaji::tenant_control_plane_name(ClusterId(c.parse().expect("uuid")))).await.expect("tcp");
        assert_eq!(tcp.data["spec"]["kubernetes"]["version"].as_str(), r["kubernetes_version"].as_str());
        let server = lab.tenant_server(c);
        assert_eq!(r["status"]["endpoints"]["kubernetes_api"].as_str(), Some(server.url.as_str()), "{r}");
        // The stack: the real Slinky CRDs are Established in the tenant API server; no Slurm here.
        let client = lab.tenant_client(c);
        let crds = Api::<CustomResourceDefinition>::all(client.clone());
        for kind in SLINKY_KINDS {
            let crd = crds.get(&format!("{kind}.slinky.slurm.net")).await.expect("a Slinky CRD");
            let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
            assert!(conditions.iter().any(|c| c.type_ == "Established" && c.status == "True"), "{kind}");
        }
        assert_eq!(holdings(&client).await["slurm"], json!([]), "no Slurm in a kubernetes cluster");
        assert_eq!(lab.nodes(c).await.len(), 1);
    }

    // Isolation: neither tenant API server holds anything of the other tenant.
    let mut owned: HashMap<String, Vec<String>> = HashMap::new();
    for m in &machines {
        let v = lab.app.get(format!("/v1/machines/{m}")).token(&admin()).send().await.expect(200).json();
        if let Some(c) = v["cluster_id"].as_str() {
            owned
                .entry(c.to_owned())
                .or_default()
                .extend([m.clone(), v["system_uuid"].as_str().expect("system_uuid").to_owned()]);
        }
    }
    for (mine, (other_tenant, other_cluster)) in [(&ca, (&b, &cb)), (&cb, (&a, &ca))] {
        let text = everything(&lab.tenant_client(mine)).await;
        // Not vacuous: the server's own machine shows up (the Node's machine-id label).
        let own = owned.get(mine.as_str()).expect("machines of the cluster");
        assert!(text.contains(&own[0]), "{mine}'s own machine is not in its API server");
        let mut foreign = vec![other_tenant.id.clone(), other_cluster.clone()];
        foreign.extend(owned.get(other_cluster.as_str()).cloned().unwrap_or_default());
        for f in foreign {
            assert!(!text.contains(&f), "the tenant API server of {mine} holds {f} of the other tenant");
        }
    }

    // The tenant's kubeconfig works against its own API server, and nowhere on the platform.
    let resp = lab.app.get(format!("{}/kubeconfig", Lab::path(&a, &ca))).token(&a.token).send().await.expect(200);
    let text = String::from_utf8(resp.body.to_vec()).expect("utf-8");
    let parsed = Kubeconfig::from_yaml(&text).expect("a kubeconfig");
    let server = parsed.clusters[0].cluster.as_ref().and_then(|c| c.server.clone());
    assert_eq!(server.as_deref(), Some(lab.tenant_server(&ca).url.as_str()));
    let config = Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default()).await.expect("config");
    let tenant_client = Client::try_from(config).expect("client");
    let listed = Api::<Node>::all(tenant_client).list(&ListParams::default()).await.expect("list nodes as the tenant");
    let listed: BTreeSet<String> = listed.items.into_iter().filter_map(|n| n.metadata.name).collect();
    assert_eq!(listed, lab.nodes(&ca).await);
    let bearer = kubeconfig_token(&text);
    let insecure = reqwest::Client::builder().danger_accept_invalid_certs(true).build().expect("client");
    let ns_a = isolation::namespace_name(ClusterId(ca.parse().expect("uuid")));
    for path in ["/api/v1/namespaces", &format!("/api/v1/namespaces/{ns_a}/secrets"), "/api/v1/nodes"] {
        let status = insecure
            .get(format!("{}{path}", lab.platform.url))
            .bearer_auth(&bearer)
            .send()
            .await
            .expect("platform request")
            .status()
            .as_u16();
        assert!(status == 401 || status == 403, "the tenant token got {status} on the platform's {path}");
    }

    // Scaling up: a new Node joins A's API server (and only A's).
    lab.scale(&a, &ca, &pool_a, 2).await;
    lab.ready(&a, &ca).await;
    assert_eq!(lab.nodes(&ca).await.len(), 2);
    assert_eq!(lab.nodes(&cb).await.len(), 1);

    // Deleting A: 404, its machines wiped, every object gone from both API servers; B untouched.
    let b_before = platform_versions(&lab.platform_client, &cb).await;
    lab.app.delete(Lab::path(&a, &ca)).token(&a.token).send().await.expect(202);
    lab.gone(&a, &ca).await;
    let namespaces = Api::<Namespace>::all(lab.platform_client.clone());
    assert!(namespaces.get_opt(&ns_a).await.expect("get").is_none(), "A's platform namespace is left");
    let tcps: Api<DynamicObject> = Api::all_with(lab.platform_client.clone(), &kamaji::api_resource());
    let left: Vec<String> =
        tcps.list(&ListParams::default()).await.expect("tcps").items.iter().map(|t| t.name_any()).collect();
    assert_eq!(left, [kamaji::tenant_control_plane_name(ClusterId(cb.parse().expect("uuid")))]);
    let held = lab.play.at_deletion.lock().expect("lock").get(&ca).cloned().expect("Kamaji saw the deletion");
    assert_eq!(held, json!({ "nodes": [], "slurm": [] }), "left in A's API server when its control plane went");
    eventually(WAIT, || async {
        (lab.scalar("select count(*) from machines where state = 'available'").await == 2).then_some(())
    })
    .await;
    assert_eq!(platform_versions(&lab.platform_client, &cb).await, b_before, "deleting A touched B");
    assert_eq!(lab.cluster(&b, &cb).await["status"]["phase"], "ready");
    // Metering, written by the real reconcilers: A's control plane from its first ready to its
    // deletion, each of its two machines from active to its release's power-off, none still open;
    // B's control plane and machine still billed.
    let usage = |cluster: &str, which: &str| {
        format!("select count(*) from usage_segments where cluster_id = '{cluster}' and {which}")
    };
    assert_eq!(lab.scalar(&usage(&ca, "kind = 'control_plane' and end_at is not null")).await, 1);
    assert_eq!(lab.scalar(&usage(&ca, "kind = 'machine' and end_at is not null")).await, 2);
    assert_eq!(lab.scalar(&usage(&ca, "end_at is null")).await, 0);
    assert_eq!(lab.scalar(&usage(&cb, "end_at is null")).await, 2);
    lab.finish().await;
}

#[tokio::test]
async fn reconciling_a_converged_kubernetes_cluster_again_changes_nothing() {
    let Some(lab) = Lab::new().await else { return };
    machine_class(&lab.app, "cpu", 0).await;
    lab.enroll("cpu", &["i1"]).await;
    let t = lab.tenant("acme").await;
    let created =
        lab.create(&t, kubernetes("idem", json!([{ "name": "workers", "machine_class": "cpu", "count": 1 }]))).await;
    let c = id(&created["cluster"]);
    let ready = lab.ready(&t, &c).await;
    // The players' status writes happen once: the versions once a whole round of theirs wrote none.
    let (platform, tenant) = lab.at_rest(&c).await;
    assert!(platform.keys().any(|k| k.starts_with("TenantControlPlane")), "{platform:?}");
    assert!(platform.keys().any(|k| k.starts_with("NetworkPolicy")), "{platform:?}");

    for _ in 0..2 {
        lab.reconcile_again(&t, &c).await;
    }
    assert_eq!(platform_versions(&lab.platform_client, &c).await, platform, "a converged reconcile wrote");
    assert_eq!(tenant_versions(&lab.tenant_client(&c)).await, tenant, "a converged reconcile wrote");
    let again = lab.cluster(&t, &c).await;
    assert_eq!((&again["generation"], &again["status"]["phase"]), (&ready["generation"], &ready["status"]["phase"]));
    assert_eq!(again["status"]["conditions"], ready["status"]["conditions"], "conditions flapped");
    lab.finish().await;
}

/// BENCHMARK, not a test (ignored; `bench/drift/run` runs it): what one drift check of a converged
/// Slurm cluster costs on real API servers of the harness: requests by verb on the platform and
/// in the tenant cluster, and CPU of the harness (every API server) and of this process (paddock's
/// worker, and the played parts, idle by then). Each window with one check is measured against a
/// window of the same length without one (the played parts' own polling), in the same run.
#[tokio::test]
#[ignore = "a benchmark: bench/drift/run"]
async fn drift_check_cost_of_a_converged_slurm_cluster() {
    let Some(lab) = Lab::with(|s| s.drift_interval = Duration::from_secs(86_400)).await else { return };
    let (t, c, _) = lab.create_hpc(8).await;
    lab.ready(&t, &c).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let servers = [("platform", lab.platform_client.clone()), ("tenant", lab.tenant_client(&c))];
    let window = Duration::from_secs(4);
    for round in 1..=3 {
        let idle = cost_window(&servers, window, || async {}).await;
        let checked = cost_window(&servers, window, || lab.drift_check_now(&c)).await;
        println!("round {round}: one drift check: {}", checked.minus(&idle));
        println!("round {round}: idle window of {window:?}: {idle}");
    }
    lab.finish().await;
}

#[tokio::test]
async fn a_slurm_cluster_with_cpu_and_gpu_pools_goes_ready_scales_and_is_deleted_slurm_first() {
    let Some(lab) = Lab::new().await else { return };
    let (t, c, pools) = lab.create_hpc(8).await;
    let cpu_pool = pools["cpu"].clone();
    let ready = lab.ready(&t, &c).await;
    all_true(&ready);
    let rest = ready["status"]["endpoints"]["slurm_rest_api"].as_str().expect("slurm_rest_api");
    assert!(rest.ends_with(&format!(":{}", slurm::RESTAPI_PORT)), "{ready}");
    assert_eq!(ready["status"]["endpoints"]["login_ssh"], "203.0.113.10:22", "{ready}");
    assert_eq!(
        ready["status"]["endpoints"]["login_ssh_host_keys"],
        json!([{ "algorithm": "ssh-ed25519", "fingerprint": LOGIN_HOST_KEY_FINGERPRINT, "public_key": LOGIN_HOST_KEY }]),
        "{ready}"
    );

    // The base stack's real upstream objects are in the tenant API server: the storage class the
    // Slurm driver asks for, and the device plugin at its pinned image.
    let client = lab.tenant_client(&c);
    let class = Api::<StorageClass>::all(client.clone()).get(slurm::DEFAULT_STORAGE_CLASS).await.expect("class");
    assert_eq!(class.provisioner, "rancher.io/local-path");
    let plugin = Api::<DaemonSet>::namespaced(client.clone(), "kube-system");
    let plugin = plugin.get("nvidia-device-plugin-daemonset").await.expect("the device plugin");
    let image = plugin.spec.and_then(|s| s.template.spec).and_then(|s| s.containers[0].image.clone());
    assert_eq!(image.as_deref(), Some("nvcr.io/nvidia/k8s-device-plugin:v0.17.4"));

    // The Slinky objects exist in the tenant API server (applied through the real CRDs' schemas).
    let ns = slurm::NAMESPACE;
    let cr = |kind: &str, name: &str| {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &slurm::api_resource(kind));
        let name = name.to_owned();
        async move { api.get_opt(&name).await.expect("get") }
    };
    for (kind, name) in [
        ("Accounting", slurm::ACCOUNTING),
        ("Controller", slurm::CONTROLLER),
        ("RestApi", slurm::RESTAPI),
        ("LoginSet", slurm::LOGINSET),
    ] {
        assert!(cr(kind, name).await.is_some(), "{kind} {name} is missing");
    }
    // The system pool has no NodeSet: the control CRs' pods select its Nodes.
    assert!(cr("NodeSet", "sys").await.is_none(), "the system pool got a NodeSet");
    for (kind, name) in [("Controller", slurm::CONTROLLER), ("Accounting", slurm::ACCOUNTING)] {
        let object = cr(kind, name).await.expect("the control CR");
        assert_eq!(object.data["spec"]["template"]["spec"]["nodeSelector"], json!({ LABEL_NODE_POOL: "sys" }));
    }
    // One NodeSet per compute pool, selecting exactly its pool's Nodes; GRES on the GPU pool only.
    for (name, p) in pools.iter().filter(|(name, _)| *name != "sys") {
        let nodeset = cr("NodeSet", name).await.expect("the pool's NodeSet");
        let spec = &nodeset.data["spec"];
        assert_eq!(spec["replicas"], 1);
        assert_eq!(
            selected_nodes(&client, spec).await.expect("nodes"),
            lab.pool_nodes(&t, &c, p).await,
            "NodeSet {name}"
        );
        assert!(spec["template"]["spec"]["nodeSelector"].get(LABEL_NODE_POOL).is_some(), "{spec}");
        if name == "gpu" {
            assert_eq!(spec["extraConf"], "Gres=gpu:8", "{spec}");
        } else {
            assert!(spec.get("extraConf").is_none(), "{spec}");
        }
    }

    // The Slurm secrets are written once: another reconcile leaves them (and the rest) alone.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret_versions = || async {
        let mut out = Vec::new();
        for name in [slurm::SECRET_SLURM_KEY, slurm::SECRET_JWT, slurm::SECRET_DB] {
            out.push(secrets.get(name).await.expect("a Slurm secret").metadata.resource_version.expect("rv"));
        }
        out
    };
    let before = secret_versions().await;
    lab.reconcile_again(&t, &c).await;
    assert_eq!(secret_versions().await, before, "a second reconcile rewrote a Slurm secret");

    // Scaling the CPU pool: its NodeSet follows, a new Node joins, ready again.
    lab.scale(&t, &c, &cpu_pool, 2).await;
    lab.ready(&t, &c).await;
    let nodeset = cr("NodeSet", "cpu").await.expect("NodeSet");
    assert_eq!(nodeset.data["spec"]["replicas"], 2);
    assert_eq!(selected_nodes(&client, &nodeset.data["spec"]).await.expect("nodes").len(), 2);
    assert_eq!(secret_versions().await, before, "scaling rewrote a Slurm secret");

    // Deleting: Slurm and the Nodes are gone before the control plane goes; then 404.
    lab.app.delete(Lab::path(&t, &c)).token(&t.token).send().await.expect(202);
    lab.gone(&t, &c).await;
    let held = lab.play.at_deletion.lock().expect("lock").get(&c).cloned().expect("Kamaji saw the deletion");
    assert_eq!(held, json!({ "nodes": [], "slurm": [] }), "left when the control plane went");
    let ns_name = isolation::namespace_name(ClusterId(c.parse().expect("uuid")));
    let namespaces = Api::<Namespace>::all(lab.platform_client.clone());
    assert!(namespaces.get_opt(&ns_name).await.expect("get").is_none());
    eventually(WAIT, || async {
        (lab.scalar("select count(*) from machines where state = 'available'").await == 4).then_some(())
    })
    .await;
    lab.finish().await;
}

/// The machine's view (as provider:admin).
async fn machine_view(lab: &Lab, machine: &str) -> Value {
    lab.app.get(format!("/v1/machines/{machine}")).token(&admin()).send().await.expect(200).json()
}

/// The machine's custody entries as `(from, to, reason)`, checking the chain verifies.
async fn custody(lab: &Lab, machine: &str) -> Vec<(String, String, String)> {
    let v = lab.app.get(format!("/v1/machines/{machine}/custody")).token(&admin()).send().await.expect(200).json();
    assert_eq!(v["verified"], true, "{v:#}");
    let text = |e: &Value| e.as_str().unwrap_or("-").to_owned();
    v["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|e| (text(&e["from"]), text(&e["to"]), text(&e["reason"])))
        .collect()
}

/// With the real tenant-node driver: bootstrap tokens live for
/// PADDOCK_JOIN_TOKEN_TTL and are gone once the Nodes registered; then a tenant holds one machine
/// (a finalizer on its Node) and another's BMC stops answering: after PADDOCK_RELEASE_TIMEOUT both
/// releases are forced, billing stops at the forcing, the first machine is powered off, its
/// Node deleted (left terminating by the tenant's finalizer) and its Lease gone, and it is wiped
/// and available again; the second, which cannot be powered off, is in maintenance with
/// `release_power_off_failed`.
#[tokio::test]
async fn a_release_the_tenant_holds_up_is_forced_after_the_release_timeout() {
    let Some(lab) = Lab::with(|s| {
        s.release_timeout = Duration::from_secs(5);
        s.join_token_ttl = Duration::from_secs(600);
        s.outage_wait = Duration::from_millis(500);
    })
    .await
    else {
        return;
    };
    machine_class(&lab.app, "cpu", 0).await;
    let machines = lab.enroll("cpu", &["held-1", "held-2"]).await;
    let t = lab.tenant("acme").await;
    let created =
        lab.create(&t, kubernetes("held", json!([{ "name": "cpu", "machine_class": "cpu", "count": 2 }]))).await;
    let cluster = id(&created["cluster"]);
    let pool = id(&created["cluster"]["node_pools"][0]);
    lab.ready(&t, &cluster).await;

    // Each kubelet joined with its machine's token, made to live 600 s; none is left now.
    for m in &machines {
        let seen = lab.play.tokens.lock().expect("lock").get(m).cloned().unwrap_or_default();
        assert!(!seen.is_empty() && seen.iter().all(|(_, life)| (599..=600).contains(life)), "{m}: {seen:?}");
    }
    let client = lab.tenant_client(&cluster);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), BOOTSTRAP_NAMESPACE);
    let left = secrets.list(&ListParams::default().labels(LABEL_MACHINE_ID)).await.expect("secrets").items;
    assert!(
        left.is_empty(),
        "bootstrap tokens outlived their Nodes' registration: {:?}",
        left.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );

    // The tenant holds the first machine: a finalizer on its Node (and its kubelet's Lease);
    // the second machine's BMC stops answering.
    let (held, dead) = (&machines[0], &machines[1]);
    let node = machine_view(&lab, held).await["node_name"].as_str().expect("node name").to_owned();
    let nodes: Api<Node> = Api::all(client.clone());
    let hold = json!({ "metadata": { "finalizers": ["tenant.example/hold"] } });
    nodes.patch(&node, &PatchParams::default(), &Patch::Merge(&hold)).await.expect("finalizer");
    let leases: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    let lease: Lease =
        serde_json::from_value(json!({ "metadata": { "name": node }, "spec": { "holderIdentity": node } }))
            .expect("lease");
    leases.create(&PostParams::default(), &lease).await.expect("lease");
    lab.world.set_machine_fault("held-2", MachineFault::BmcTimeout, true).await.expect("fault");

    lab.scale(&t, &cluster, &pool, 0).await;
    let held_view = eventually(WAIT, || async {
        let v = machine_view(&lab, held).await;
        (v["state"] == "available").then_some(v)
    })
    .await;
    assert_eq!(held_view["tenant_id"], Value::Null);
    let dead_view = eventually(WAIT, || async {
        let v = machine_view(&lab, dead).await;
        (v["state"] == "maintenance").then_some(v)
    })
    .await;
    assert_eq!(dead_view["maintenance_reason"], "release_power_off_failed", "{dead_view:#}");
    assert_eq!(dead_view["last_error"]["code"], "release_power_off_failed", "{dead_view:#}");
    assert_eq!(dead_view["tenant_id"], Value::Null, "the tenancy is over");

    // The ledger: the forcing with its reason, then cleaning (or maintenance).
    for (m, then) in [(held, "cleaning"), (dead, "maintenance")] {
        let entries = custody(&lab, m).await;
        let at = entries
            .iter()
            .position(|(from, to, reason)| {
                from == "releasing" && to == "releasing" && reason.contains("PADDOCK_RELEASE_TIMEOUT")
            })
            .unwrap_or_else(|| panic!("no forced release in the ledger of {m}: {entries:#?}"));
        assert_eq!((entries[at + 1].0.as_str(), entries[at + 1].1.as_str()), ("releasing", then), "{entries:#?}");
    }

    // The Node was deleted (the tenant's finalizer keeps it terminating) and its Lease is gone.
    let terminating = nodes.get(&node).await.expect("the finalizer keeps the node");
    assert!(terminating.metadata.deletion_timestamp.is_some(), "the node was never deleted");
    assert!(leases.get_opt(&node).await.expect("lease").is_none(), "the node's lease is left");

    // Billing stopped at the forcing: each segment ends at the second the release was forced.
    for m in [held, dead] {
        let (at_forcing, reason, before_release): (bool, String, bool) = sqlx::query_as(
            "select s.end_at = a.release_forced_at, s.close_reason, s.end_at <= a.released_at \
             from usage_segments s join machine_allocations a on a.id = s.allocation_id where s.machine_id = $1::uuid",
        )
        .bind(m)
        .fetch_one(&lab.app.db.pool)
        .await
        .expect("segment");
        assert!(at_forcing && before_release, "{m}: the segment does not end at the forcing");
        assert!(reason.starts_with("release forced"), "{m}: {reason}");
    }

    let release = json!({ "metadata": { "finalizers": null } });
    nodes.patch(&node, &PatchParams::default(), &Patch::Merge(&release)).await.expect("finalizer removed");
    lab.finish().await;
}

/// What a window cost: API requests by (server, verb), and CPU seconds of the harness process and
/// of this one.
#[derive(Default)]
struct Cost {
    requests: BTreeMap<(String, String), f64>,
    harness_cpu: f64,
    own_cpu: f64,
}

impl Cost {
    fn minus(&self, base: &Cost) -> Cost {
        let mut requests = self.requests.clone();
        for (k, v) in &base.requests {
            *requests.entry(k.clone()).or_default() -= v;
        }
        Cost { requests, harness_cpu: self.harness_cpu - base.harness_cpu, own_cpu: self.own_cpu - base.own_cpu }
    }
}

impl std::fmt::Display for Cost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total: f64 = self.requests.values().sum();
        write!(f, "{total:.0} requests (")?;
        let parts: Vec<String> = self.requests.iter().map(|((s, v), n)| format!("{s} {v} {n:.0}")).collect();
        write!(
            f,
            "{}), harness CPU {:.1} ms, paddock+test process CPU {:.1} ms",
            parts.join(", "),
            self.harness_cpu * 1e3,
            self.own_cpu * 1e3
        )
    }
}

/// Runs `during` and measures the window of `length` around it.
async fn cost_window<F, Fut>(servers: &[(&str, Client)], length: Duration, during: F) -> Cost
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let before = cost_now(servers).await;
    let started = std::time::Instant::now();
    during().await;
    tokio::time::sleep(length.saturating_sub(started.elapsed())).await;
    cost_now(servers).await.minus(&before)
}

async fn cost_now(servers: &[(&str, Client)]) -> Cost {
    let mut requests = BTreeMap::new();
    for (name, client) in servers {
        let request = http::Request::get("/metrics").body(Vec::new()).expect("request");
        let text = client.request_text(request).await.expect("the API server's metrics");
        for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
            let verb = line.split("verb=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or("?");
            let value: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
            *requests.entry(((*name).to_owned(), verb.to_owned())).or_default() += value;
        }
    }
    let harness = std::env::var("PADDOCK_TEST_KUBE_DIR")
        .ok()
        .and_then(|dir| std::fs::read_to_string(format!("{dir}/pid")).ok())
        .and_then(|pid| process_cpu(pid.trim()))
        .unwrap_or(0.0);
    Cost { requests, harness_cpu: harness, own_cpu: process_cpu("self").unwrap_or(0.0) }
}

/// utime + stime of a process, seconds (Linux clock ticks of 1/100 s).
fn process_cpu(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}
