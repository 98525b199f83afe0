//! `SlinkyDriver` against a real API server playing the tenant cluster, with the real Slinky CRDs
//! (`slinky.slurm.net/v1beta1`, from the shared directory) installed: every custom resource goes
//! through the CRDs' schema validation by server-side apply.
//!
//! No Slinky operator runs here. Where readiness is tested, the test PLAYS THE OPERATOR: it
//! creates the StatefulSets/Deployments/Services the operator would (same names) and writes their
//! and the NodeSets' status through the `/status` subresources. slurmrestd is played by a
//! stand-in [`SlurmProbe`] (the production probe against a stand-in slurmrestd is in
//! `slurm_probe.rs`).
//!
//! The tests share one API server (CRDs installed once) and isolate themselves by namespace (the
//! driver's namespace setting) and by unique pool names (Nodes are cluster-scoped).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use futures::FutureExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret, Service};
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use paddock_domain::driver::{
    BoxFuture, DriverError, Removal, SlurmDesired, SlurmDrain, SlurmDriver, SlurmNodeState, SlurmPool, SlurmSecrets,
    SlurmStatus, SlurmVersion, TenantAccess,
};
use paddock_domain::secret::SecretString;
use paddock_kube::nodes::LABEL_NODE_POOL;
use paddock_kube::slurm::{
    self, SlinkySettings, SlurmNode, SlurmProbe, LABEL_POD_HOSTNAME, MARIADB, SECRET_DB, SECRET_JWT, SECRET_JWT_KEY,
    SECRET_SLURM_KEY, SECRET_SSSD,
};
use paddock_kube::SlinkyDriver;
use paddock_testkit::skip;
use paddock_types::cluster::{LoginSpec, Partition, SlurmSpec, Taint, TaintEffect};
use paddock_types::NodePoolId;
use serde_json::{json, Value};

use crate::support::{self, ApiServer};

/// The Slinky CRDs of the shared directory, or None (the test is skipped: [`skip`]).
fn slinky_crds() -> Option<Vec<PathBuf>> {
    let shared = match std::env::var("PADDOCK_SHARED").ok().filter(|v| !v.is_empty()) {
        Some(s) => PathBuf::from(s),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
    };
    let dir = shared.join("crds/slinky");
    let files: Vec<PathBuf> = ["accountings", "controllers", "loginsets", "nodesets", "restapis", "tokens"]
        .iter()
        .map(|k| dir.join(format!("slinky.slurm.net_{k}.yaml")))
        .collect();
    if files.iter().all(|f| f.is_file()) {
        Some(files.into_iter().map(|f| f.canonicalize().expect("canonical CRD path")).collect())
    } else {
        skip::skip(format_args!("the Slinky CRDs are not in {}", dir.display()));
        None
    }
}

/// The API server with the Slinky CRDs shared by these tests.
pub(crate) async fn server() -> Option<ApiServer> {
    static SLINKY: tokio::sync::OnceCell<Option<ApiServer>> = tokio::sync::OnceCell::const_new();
    let crds = slinky_crds()?;
    SLINKY.get_or_init(|| async { support::dedicated("slinky-shared", &crds).await }).await.clone()
}

pub(crate) fn access(server: &ApiServer) -> TenantAccess {
    let kubeconfig = std::fs::read_to_string(&server.kubeconfig).expect("read the harness kubeconfig");
    TenantAccess {
        cluster: support::cluster("acme", "hpc"),
        endpoint: server.url.trim_start_matches("https://").to_owned(),
        admin_kubeconfig: SecretString::new(kubeconfig),
    }
}

pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

pub(crate) fn settings(namespace: &str) -> SlinkySettings {
    SlinkySettings {
        namespace: namespace.to_owned(),
        storage_class: "fast-local".to_owned(),
        ..SlinkySettings::default()
    }
}

/// STAND-IN for slurmrestd as the driver sees it through [`SlurmProbe`].
#[derive(Default)]
pub(crate) struct StandInProbe {
    pub(crate) up: AtomicBool,
    /// What `drain` answers; the nodes asked about are recorded.
    pub(crate) drain_answer: Mutex<Option<bool>>,
    pub(crate) drained: Mutex<Vec<String>>,
    /// What `nodes` answers.
    pub(crate) nodes_answer: Mutex<Vec<SlurmNode>>,
    /// The slurmrestd versions the driver spoke, in order.
    versions: Mutex<Vec<String>>,
}

impl SlurmProbe for StandInProbe {
    fn ping<'a>(&'a self, _: &'a TenantAccess, version: &'a str) -> BoxFuture<'a, Result<bool, DriverError>> {
        self.versions.lock().expect("lock").push(version.to_owned());
        let up = self.up.load(Ordering::SeqCst);
        async move { Ok(up) }.boxed()
    }

    fn drain<'a>(
        &'a self,
        _: &'a TenantAccess,
        version: &'a str,
        node: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Option<bool>, DriverError>> {
        self.versions.lock().expect("lock").push(version.to_owned());
        self.drained.lock().expect("lock").push(node.to_owned());
        let answer = *self.drain_answer.lock().expect("lock");
        async move { Ok(answer) }.boxed()
    }

    fn nodes<'a>(
        &'a self,
        _: &'a TenantAccess,
        version: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SlurmNode>, DriverError>> {
        self.versions.lock().expect("lock").push(version.to_owned());
        let answer = self.nodes_answer.lock().expect("lock").clone();
        async move { Ok(answer) }.boxed()
    }
}

pub(crate) fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub(crate) fn random_bytes(n: usize) -> Vec<u8> {
    (0..n.div_ceil(16)).flat_map(|_| *uuid::Uuid::new_v4().as_bytes()).take(n).collect()
}

/// Fresh Slurm secrets, as the worker generates them (also the operator test's).
pub(crate) fn secrets() -> SlurmSecrets {
    SlurmSecrets {
        slurm_key: SecretString::new(b64(&random_bytes(1024))),
        jwt_hs256_key: SecretString::new(b64(&random_bytes(64))),
        database_password: SecretString::new(uuid::Uuid::new_v4().simple().to_string()),
    }
}

/// A pool of the desired Slurm (also the operator test's).
pub(crate) fn pool(name: &str, count: u32, gpus: u32, taints: Vec<Taint>) -> SlurmPool {
    SlurmPool {
        node_pool_id: NodePoolId::new(),
        name: name.to_owned(),
        count,
        node_names: Vec::new(),
        releasing: Vec::new(),
        gpus_per_node: gpus,
        class_size: (8, 32),
        autoscaling_max: None,
        taints,
        role: paddock_types::cluster::NodePoolRole::Compute,
    }
}

/// The Slurm [`desired`] runs.
pub(crate) fn version() -> SlurmVersion {
    SlurmVersion { stack_version: paddock_domain::stack::latest_version().to_owned(), version: "25.11".to_owned() }
}

pub(crate) fn desired(pools: Vec<SlurmPool>, secrets: &SlurmSecrets) -> SlurmDesired {
    SlurmDesired {
        spec: SlurmSpec {
            version: "25.11".to_owned(),
            partitions: Vec::new(),
            login: LoginSpec {
                replicas: 2,
                ssh_authorized_keys: vec!["ssh-ed25519 AAAAC3Nza alice@example".to_owned()],
            },
            accounts: Vec::new(),
            cancel_jobs_on_removal: false,
        },
        stack_version: paddock_domain::stack::latest_version().to_owned(),
        pools,
        secrets: secrets.clone(),
    }
}

fn gpu_taint() -> Taint {
    Taint { key: "example.com/gpu".to_owned(), value: "true".to_owned(), effect: TaintEffect::NoSchedule }
}

fn slinky(client: &Client, ns: &str, kind: &str) -> Api<DynamicObject> {
    let resource: ApiResource = slurm::api_resource(kind);
    Api::namespaced_with(client.clone(), ns, &resource)
}

pub(crate) async fn cr(client: &Client, ns: &str, kind: &str, name: &str) -> Option<DynamicObject> {
    slinky(client, ns, kind).get_opt(name).await.expect("get a Slinky object")
}

pub(crate) async fn nodeset_spec(client: &Client, ns: &str, name: &str) -> Value {
    cr(client, ns, "NodeSet", name).await.expect("the NodeSet").data["spec"].clone()
}

/// Registers a Node with `labels` and `taints` (cluster-scoped: names are unique per test).
pub(crate) async fn register_node(client: &Client, name: &str, labels: &[(&str, &str)], taints: Value) {
    let nodes: Api<Node> = Api::all(client.clone());
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    let node: Node = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": labels },
        "spec": { "taints": taints },
    }))
    .expect("a Node");
    nodes.create(&PostParams::default(), &node).await.expect("register the Node");
}

#[tokio::test]
async fn every_object_passes_the_crd_schemas_and_nodesets_pin_to_their_pools() {
    let Some(server) = server().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let ns = unique("slurm");
    let (cpu, gpu) = (unique("cpu"), unique("gpu"));
    let secrets = secrets();
    let driver = SlinkyDriver::new(settings(&ns), Arc::new(StandInProbe::default()));
    let want = desired(vec![pool(&cpu, 2, 0, Vec::new()), pool(&gpu, 1, 4, vec![gpu_taint()])], &secrets);

    let status = driver.ensure_slurm(&tenant, &want).await.expect("ensure Slurm (every object validated)");
    assert!(!status.ready);
    for waiting in
        ["MariaDbReady", "SlurmAccountingReady", "SlurmControllerReady", "SlurmRestApiReady", "SlurmLoginReady"]
    {
        assert!(status.reason.contains(waiting), "{waiting} in {}", status.reason);
    }
    assert!(status.reason.contains(&format!("NodeSetsReady: {cpu} 0/2, {gpu} 0/1")), "{}", status.reason);
    assert!(!status.reason.contains("SlurmRestApiPing"), "no ping before the workloads: {}", status.reason);

    // Secrets: exactly the sealed values (the files hold the random bytes).
    let secret_api: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let data = |s: Secret, key: &str| s.data.expect("data").remove(key).expect("key").0;
    let slurm_key = secret_api.get(SECRET_SLURM_KEY).await.expect("slurm-key");
    assert_eq!(b64(&data(slurm_key, "slurm.key")), secrets.slurm_key.expose());
    let jwt = secret_api.get(SECRET_JWT).await.expect("jwt");
    assert_eq!(b64(&data(jwt, SECRET_JWT_KEY)), secrets.jwt_hs256_key.expose());
    let db = secret_api.get(SECRET_DB).await.expect("db");
    assert_eq!(data(db, "password"), secrets.database_password.expose().as_bytes());
    let sssd = secret_api.get(SECRET_SSSD).await.expect("sssd");
    assert!(String::from_utf8(data(sssd, "sssd.conf")).expect("utf-8").contains("id_provider = files"));

    // MariaDB: pinned image, the storage class, the password from the Secret.
    let mariadb = Api::<StatefulSet>::namespaced(client.clone(), &ns).get(MARIADB).await.expect("MariaDB");
    let mariadb = serde_json::to_value(mariadb).expect("json");
    assert_eq!(mariadb["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"], "fast-local");
    let container = &mariadb["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"],
        slurm::SlurmCatalog::embedded()
            .images(paddock_domain::stack::latest_version(), "25.11")
            .expect("images")
            .mariadb()
    );
    assert!(container["env"].to_string().contains(SECRET_DB));
    Api::<Service>::namespaced(client.clone(), &ns).get(MARIADB).await.expect("MariaDB's Service");

    // The Slinky objects.
    let accounting = cr(&client, &ns, "Accounting", slurm::ACCOUNTING).await.expect("Accounting");
    assert_eq!(accounting.data["spec"]["storageConfig"]["host"], MARIADB);
    assert_eq!(accounting.data["spec"]["storageConfig"]["passwordKeyRef"]["name"], SECRET_DB);
    let controller = cr(&client, &ns, "Controller", slurm::CONTROLLER).await.expect("Controller");
    let spec = &controller.data["spec"];
    assert_eq!(spec["clusterName"], slurm::cluster_name(tenant.cluster.cluster_id));
    assert_eq!(spec["accountingRef"]["name"], slurm::ACCOUNTING);
    assert_eq!(spec["slurmKeyRef"], json!({"name": SECRET_SLURM_KEY, "key": "slurm.key"}));
    assert_eq!(spec["jwtHs256KeyRef"], json!({"name": SECRET_JWT, "key": SECRET_JWT_KEY}));
    assert_eq!(spec["persistence"]["storageClassName"], "fast-local");
    assert_eq!(spec["slurmctld"]["image"], "ghcr.io/slinkyproject/slurmctld:25.11-ubuntu24.04");
    assert_eq!(spec["extraConf"], "GresTypes=gpu");
    assert_eq!(spec["configFileRefs"][0]["name"], slurm::CONFIG_FILES);
    Api::<ConfigMap>::namespaced(client.clone(), &ns).get(slurm::CONFIG_FILES).await.expect("gres.conf");
    let restapi = cr(&client, &ns, "RestApi", slurm::RESTAPI).await.expect("RestApi");
    assert_eq!(restapi.data["spec"]["controllerRef"]["name"], slurm::CONTROLLER);
    let login = cr(&client, &ns, "LoginSet", slurm::LOGINSET).await.expect("LoginSet");
    assert_eq!(login.data["spec"]["replicas"], 2);
    assert_eq!(login.data["spec"]["rootSshAuthorizedKeys"], "ssh-ed25519 AAAAC3Nza alice@example\n");
    assert_eq!(login.data["spec"]["sssdConfRef"], json!({"name": SECRET_SSSD, "key": "sssd.conf"}));

    // NodeSets: one per pool, own partitions (the first the default), GRES on the GPU pool.
    let cpu_spec = nodeset_spec(&client, &ns, &cpu).await;
    let gpu_spec = nodeset_spec(&client, &ns, &gpu).await;
    assert_eq!((cpu_spec["replicas"].as_i64(), gpu_spec["replicas"].as_i64()), (Some(2), Some(1)));
    assert_eq!(cpu_spec["partition"], json!({"enabled": true, "config": "Default=YES State=UP"}));
    assert_eq!(gpu_spec["partition"], json!({"enabled": true, "config": "Default=NO State=UP"}));
    assert_eq!(gpu_spec["extraConf"], "Gres=gpu:4");
    assert_eq!(gpu_spec["slurmd"]["resources"]["limits"]["nvidia.com/gpu"], 4);
    assert!(cpu_spec.get("extraConf").is_none());

    // Pinning: the API server's own label matching of each NodeSet's nodeSelector picks exactly
    // the pool's Nodes, and the NodeSet tolerates every taint its Nodes carry.
    let taints = json!([{"key": "example.com/gpu", "value": "true", "effect": "NoSchedule"}]);
    let (cpu_nodes, gpu_nodes) = ([unique("n-cpu"), unique("n-cpu")], [unique("n-gpu")]);
    for n in &cpu_nodes {
        register_node(&client, n, &[(LABEL_NODE_POOL, &cpu)], json!([])).await;
    }
    register_node(&client, &gpu_nodes[0], &[(LABEL_NODE_POOL, &gpu)], taints.clone()).await;
    register_node(&client, &unique("n-other"), &[(LABEL_NODE_POOL, "other")], json!([])).await;
    let nodes: Api<Node> = Api::all(client.clone());
    for (spec, expected) in [(&cpu_spec, cpu_nodes.to_vec()), (&gpu_spec, gpu_nodes.to_vec())] {
        let selector = spec["template"]["spec"]["nodeSelector"].as_object().expect("a nodeSelector");
        let selector: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={}", v.as_str().expect("str"))).collect();
        let matched = nodes.list(&ListParams::default().labels(&selector.join(","))).await.expect("list Nodes");
        let matched: BTreeSet<String> = matched.items.into_iter().filter_map(|n| n.metadata.name).collect();
        assert_eq!(matched, expected.into_iter().collect::<BTreeSet<_>>());
    }
    let tolerations = gpu_spec["template"]["spec"]["tolerations"].as_array().expect("tolerations");
    for t in taints.as_array().expect("taints") {
        assert!(
            tolerations.iter().any(|tol| tol["key"] == t["key"]
                && tol["effect"] == t["effect"]
                && (tol["operator"] == "Exists" || tol["value"] == t["value"])),
            "{t} is not tolerated by {tolerations:?}"
        );
    }
    assert_eq!(cpu_spec["template"]["spec"]["tolerations"], json!([]));
}

#[tokio::test]
async fn secrets_are_never_rewritten_by_a_later_ensure() {
    let Some(server) = server().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let ns = unique("slurm");
    let secrets = secrets();
    let want = desired(vec![pool(&unique("cpu"), 1, 0, Vec::new())], &secrets);
    let versions = || async {
        let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
        let mut out = Vec::new();
        for name in [SECRET_SLURM_KEY, SECRET_JWT, SECRET_DB, SECRET_SSSD] {
            out.push(api.get(name).await.expect("secret").metadata.resource_version.expect("rv"));
        }
        out
    };

    let driver = SlinkyDriver::new(settings(&ns), Arc::new(StandInProbe::default()));
    driver.ensure_slurm(&tenant, &want).await.expect("first ensure");
    let first = versions().await;
    driver.ensure_slurm(&tenant, &want).await.expect("second ensure");
    assert_eq!(versions().await, first, "a second ensure rewrote a Secret");
    let fresh = SlinkyDriver::new(settings(&ns), Arc::new(StandInProbe::default()));
    fresh.ensure_slurm(&tenant, &want).await.expect("ensure by a new driver");
    assert_eq!(versions().await, first, "a new driver instance rewrote a Secret");
}

/// PLAYS THE OPERATOR: a StatefulSet named like the operator's, its status ready.
pub(crate) async fn play_statefulset(client: &Client, ns: &str, name: &str) {
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let body = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "replicas": 1, "serviceName": name,
            "selector": { "matchLabels": { "app": name } },
            "template": { "metadata": { "labels": { "app": name } },
                          "spec": { "containers": [{ "name": "c", "image": "example.invalid/c:1" }] } },
        },
    });
    let applied =
        api.patch(name, &PatchParams::apply("slinky-operator-stand-in"), &Patch::Apply(&body)).await.expect("sts");
    set_ready(&api, name, applied.metadata.generation.expect("generation"), 1).await;
}

/// PLAYS THE OPERATOR: a Deployment named like the operator's, its status ready.
pub(crate) async fn play_deployment(client: &Client, ns: &str, name: &str, replicas: i32) {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let body = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": { "metadata": { "labels": { "app": name } },
                          "spec": { "containers": [{ "name": "c", "image": "example.invalid/c:1" }] } },
        },
    });
    let applied =
        api.patch(name, &PatchParams::apply("slinky-operator-stand-in"), &Patch::Apply(&body)).await.expect("deploy");
    set_ready(&api, name, applied.metadata.generation.expect("generation"), replicas).await;
}

pub(crate) async fn set_ready<K>(api: &Api<K>, name: &str, generation: i64, replicas: i32)
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let status = json!({ "status": {
        "observedGeneration": generation, "replicas": replicas, "readyReplicas": replicas,
        "updatedReplicas": replicas, "availableReplicas": replicas,
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("status");
}

/// PLAYS THE OPERATOR: a NodeSet's status.
pub(crate) async fn play_nodeset(client: &Client, ns: &str, name: &str, ready: i64) {
    let api = slinky(client, ns, "NodeSet");
    let generation = api.get(name).await.expect("NodeSet").metadata.generation.expect("generation");
    let status = json!({ "status": {
        "observedGeneration": generation, "replicas": ready, "readyReplicas": ready,
        "nodeSetHash": "stand-in", "selector": format!("app={name}"),
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("NodeSet status");
}

/// PLAYS THE OPERATOR: a Service named like the operator's.
async fn play_service(client: &Client, ns: &str, name: &str, port: u16, lb_ip: Option<&str>) {
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    let kind = if lb_ip.is_some() { "LoadBalancer" } else { "ClusterIP" };
    let body = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": name, "namespace": ns },
        "spec": { "type": kind, "selector": { "app": name }, "ports": [{ "port": port }] },
    });
    api.patch(name, &PatchParams::apply("slinky-operator-stand-in"), &Patch::Apply(&body)).await.expect("service");
    if let Some(ip) = lb_ip {
        let status = json!({ "status": { "loadBalancer": { "ingress": [{ "ip": ip }] } } });
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("LB status");
    }
}

/// Plays the operator publishing the login pods' SSH host keys (`<loginset>-ssh-host-keys`, private
/// and public halves, as Slinky's loginset controller writes them), with keys made by `ssh-keygen`.
/// Returns `(algorithm, fingerprint)` of each as `ssh-keygen -l -E sha256` prints them.
async fn play_host_keys(client: &Client, ns: &str) -> Vec<(String, String)> {
    let dir = std::env::temp_dir().join(format!("paddock-hostkeys-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (mut data, mut expected) = (BTreeMap::new(), Vec::new());
    for (kind, algorithm) in [("ed25519", "ssh-ed25519"), ("ecdsa", "ecdsa-sha2-nistp256"), ("rsa", "ssh-rsa")] {
        let file = dir.join(format!("ssh_host_{kind}_key"));
        let run = |args: &[&str]| {
            let out = Command::new("ssh-keygen").args(args).output().expect("run ssh-keygen");
            assert!(out.status.success(), "ssh-keygen {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8(out.stdout).expect("utf-8")
        };
        let path = file.to_str().expect("utf-8 path");
        run(&["-q", "-t", kind, "-N", "", "-C", "root@slurm-login", "-f", path]);
        let printed = run(&["-l", "-E", "sha256", "-f", &format!("{path}.pub")]);
        let fingerprint = printed.split_whitespace().nth(1).expect("a fingerprint").to_owned();
        expected.push((algorithm.to_owned(), fingerprint));
        for name in [format!("ssh_host_{kind}_key"), format!("ssh_host_{kind}_key.pub")] {
            let bytes = std::fs::read(dir.join(&name)).expect("read key");
            data.insert(name, base64::engine::general_purpose::STANDARD.encode(bytes));
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": slurm::LOGIN_HOST_KEYS_SECRET, "namespace": ns },
        "immutable": true,
        "data": data,
    });
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(slurm::LOGIN_HOST_KEYS_SECRET, &PatchParams::apply("slinky-operator-stand-in"), &Patch::Apply(&secret))
        .await
        .expect("host keys secret");
    expected.sort();
    expected
}

#[tokio::test]
async fn readiness_follows_the_workloads_the_nodesets_and_the_ping() {
    let Some(server) = server().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let ns = unique("slurm");
    let (cpu, gpu) = (unique("cpu"), unique("gpu"));
    let probe = Arc::new(StandInProbe::default());
    // The catalogue pins the slurmrestd version the probe speaks, per release: here one the
    // embedded stacks pin for none, so that only the catalogue can have said it.
    let mut stack = paddock_domain::stack::definition(paddock_domain::stack::latest_version()).expect("latest").clone();
    let releases = &mut stack.slurm.as_mut().expect("a Slurm catalogue").releases;
    releases.iter_mut().filter(|r| r.version == "25.11").for_each(|r| r.rest_api.paddock = "v0.0.43".to_owned());
    stack.validate().expect("25.11 serves v0.0.43");
    let catalog = slurm::SlurmCatalog::of([&stack]);
    let driver = SlinkyDriver::new(SlinkySettings { catalog, ..settings(&ns) }, probe.clone());
    let want = desired(vec![pool(&cpu, 2, 0, Vec::new()), pool(&gpu, 1, 8, vec![gpu_taint()])], &secrets());
    let ensure = || async { driver.ensure_slurm(&tenant, &want).await.expect("ensure") };

    let status = ensure().await;
    assert!(!status.ready && status.reason.starts_with("MariaDbReady; "), "{}", status.reason);
    assert_eq!((status.rest_api.as_deref(), status.login_ssh.as_deref()), (None, None));

    // The StatefulSet controller's part for MariaDB.
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let generation = sts.get(MARIADB).await.expect("MariaDB").metadata.generation.expect("generation");
    set_ready(&sts, MARIADB, generation, 1).await;
    let status = ensure().await;
    assert!(status.reason.starts_with("SlurmAccountingReady; SlurmControllerReady"), "{}", status.reason);

    // The operator's workloads and Services.
    play_statefulset(&client, &ns, slurm::ACCOUNTING_WORKLOAD).await;
    play_statefulset(&client, &ns, slurm::CONTROLLER_WORKLOAD).await;
    play_deployment(&client, &ns, slurm::RESTAPI_SERVICE, 1).await;
    play_deployment(&client, &ns, slurm::LOGIN_SERVICE, 2).await;
    play_service(&client, &ns, slurm::RESTAPI_SERVICE, 6820, None).await;
    play_service(&client, &ns, slurm::LOGIN_SERVICE, 22, Some("203.0.113.10")).await;
    let status = ensure().await;
    assert_eq!(status.reason, format!("NodeSetsReady: {cpu} 0/2, {gpu} 0/1"));
    let restapi_ip = Api::<Service>::namespaced(client.clone(), &ns)
        .get(slurm::RESTAPI_SERVICE)
        .await
        .expect("svc")
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("a cluster IP");
    assert_eq!(status.rest_api, Some(format!("{restapi_ip}:6820")));
    assert_eq!(status.login_ssh.as_deref(), Some("203.0.113.10:22"));
    assert!(status.login_ssh_host_keys.is_empty(), "no host keys before the operator publishes them");

    // The operator publishes the host keys: their fingerprints are ssh-keygen's.
    let fingerprints = play_host_keys(&client, &ns).await;
    let host_keys = ensure().await.login_ssh_host_keys;
    let shown: Vec<(String, String)> = host_keys.iter().map(|k| (k.algorithm.clone(), k.fingerprint.clone())).collect();
    assert_eq!(shown, fingerprints);
    assert!(host_keys.iter().all(|k| k.public_key.starts_with(&format!("{} AAAA", k.algorithm))), "{host_keys:?}");
    assert!(
        !format!("{host_keys:?}").contains("PRIVATE") && !format!("{host_keys:?}").contains("root@slurm-login"),
        "only the public halves, without their comment"
    );

    play_nodeset(&client, &ns, &cpu, 2).await;
    play_nodeset(&client, &ns, &gpu, 0).await;
    assert_eq!(ensure().await.reason, format!("NodeSetsReady: {gpu} 0/1"));
    play_nodeset(&client, &ns, &gpu, 1).await;
    let status = ensure().await;
    assert_eq!((status.ready, status.reason.as_str()), (false, "SlurmRestApiPing"));
    let versions = probe.versions.lock().expect("lock").clone();
    assert!(
        !versions.is_empty() && versions.iter().all(|v| v == "v0.0.43"),
        "the release's pinned version: {versions:?}"
    );

    probe.up.store(true, Ordering::SeqCst);
    let status = ensure().await;
    assert_eq!(
        status,
        SlurmStatus {
            ready: true,
            reason: String::new(),
            rest_api: Some(format!("{restapi_ip}:6820")),
            login_ssh: Some("203.0.113.10:22".to_owned()),
            login_ssh_host_keys: host_keys,
            changed: Vec::new(),
            fault: None,
        }
    );
}

#[tokio::test]
async fn scaling_changes_replicas_and_a_removed_pool_loses_its_nodeset() {
    let Some(server) = server().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let ns = unique("slurm");
    let (cpu, gpu) = (unique("cpu"), unique("gpu"));
    let secrets = secrets();
    let driver = SlinkyDriver::new(settings(&ns), Arc::new(StandInProbe::default()));

    let mut want = desired(vec![pool(&cpu, 2, 0, Vec::new()), pool(&gpu, 1, 4, vec![gpu_taint()])], &secrets);
    driver.ensure_slurm(&tenant, &want).await.expect("ensure");
    play_nodeset(&client, &ns, &cpu, 2).await;

    want.pools[0].count = 3;
    let status = driver.ensure_slurm(&tenant, &want).await.expect("scale up");
    assert_eq!(nodeset_spec(&client, &ns, &cpu).await["replicas"], 3);
    assert!(status.reason.contains(&format!("{cpu} 2/3")), "{}", status.reason);

    // Partitions from the spec: NodeSet partitions off, the lines in the Controller.
    want.spec.partitions = vec![Partition {
        name: "batch".to_owned(),
        node_pools: vec![cpu.clone(), gpu.clone()],
        default: true,
        max_time: Some("1-00:00:00".to_owned()),
    }];
    driver.ensure_slurm(&tenant, &want).await.expect("partitions");
    assert_eq!(nodeset_spec(&client, &ns, &cpu).await["partition"], json!({"enabled": false}));
    let controller = cr(&client, &ns, "Controller", slurm::CONTROLLER).await.expect("Controller");
    assert_eq!(
        controller.data["spec"]["extraConf"],
        format!("GresTypes=gpu\nPartitionName=batch Nodes={cpu},{gpu} Default=YES MaxTime=1-00:00:00 State=UP")
    );

    // The GPU pool is gone.
    want.pools.truncate(1);
    want.spec.partitions.clear();
    driver.ensure_slurm(&tenant, &want).await.expect("pool removed");
    support::eventually(Duration::from_secs(30), "the NodeSet of the removed pool to go", || async {
        cr(&client, &ns, "NodeSet", &gpu).await.is_none().then_some(())
    })
    .await;
    assert!(cr(&client, &ns, "NodeSet", &cpu).await.is_some(), "the remaining pool's NodeSet stays");
    let controller = cr(&client, &ns, "Controller", slurm::CONTROLLER).await.expect("Controller");
    assert!(controller.data["spec"].get("extraConf").is_none(), "{}", controller.data["spec"]);
}

#[tokio::test]
async fn remove_slurm_deletes_everything_and_is_idempotent() {
    let Some(server) = server().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let ns = unique("slurm");
    let (cpu, gpu) = (unique("cpu"), unique("gpu"));
    let driver = SlinkyDriver::new(settings(&ns), Arc::new(StandInProbe::default()));
    let want = desired(vec![pool(&cpu, 1, 0, Vec::new()), pool(&gpu, 1, 2, Vec::new())], &secrets());
    driver.ensure_slurm(&tenant, &want).await.expect("ensure");

    support::eventually(Duration::from_secs(60), "Slurm to be gone", || async {
        (driver.remove_slurm(&tenant).await.expect("remove") == Removal::Gone).then_some(())
    })
    .await;
    for (kind, name) in [
        ("NodeSet", cpu.as_str()),
        ("NodeSet", gpu.as_str()),
        ("LoginSet", slurm::LOGINSET),
        ("RestApi", slurm::RESTAPI),
        ("Controller", slurm::CONTROLLER),
        ("Accounting", slurm::ACCOUNTING),
    ] {
        assert!(cr(&client, &ns, kind, name).await.is_none(), "{kind} {name} is left");
    }
    let secret_api: Api<Secret> = Api::namespaced(client.clone(), &ns);
    assert!(secret_api
        .list(&ListParams::default().labels("paddock.dev/slurm=paddock"))
        .await
        .expect("list")
        .items
        .is_empty());
    assert!(Api::<StatefulSet>::namespaced(client.clone(), &ns).get_opt(MARIADB).await.expect("get").is_none());
    assert!(Api::<Service>::namespaced(client.clone(), &ns).get_opt(MARIADB).await.expect("get").is_none());
    assert!(Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get_opt(slurm::CONFIG_FILES)
        .await
        .expect("get")
        .is_none());

    assert_eq!(SlurmDriver::remove_slurm(&driver, &tenant).await.expect("again"), Removal::Gone);
    let never = SlinkyDriver::new(settings(&unique("slurm")), Arc::new(StandInProbe::default()));
    assert_eq!(never.remove_slurm(&tenant).await.expect("never ensured"), Removal::Gone);
}

#[tokio::test]
async fn an_unknown_slurm_version_is_a_permanent_error() {
    // No API server needed: the version is checked before anything is written.
    let tenant = TenantAccess {
        cluster: support::cluster("acme", "hpc"),
        endpoint: "127.0.0.1:1".to_owned(),
        admin_kubeconfig: SecretString::new(String::new()),
    };
    let driver = SlinkyDriver::new(SlinkySettings::default(), Arc::new(StandInProbe::default()));
    let mut want = desired(Vec::new(), &secrets());
    want.spec.version = "20.02".to_owned();
    let e = driver.ensure_slurm(&tenant, &want).await.expect_err("unsupported");
    assert_eq!((e.code.as_str(), e.is_transient()), ("slurm_version_unsupported", false));
}

#[tokio::test]
async fn draining_drains_the_slurm_nodes_and_hands_their_pods_over() {
    let Some(server) = server().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let ns = unique("slurm");
    let probe = Arc::new(StandInProbe::default());
    let driver = SlinkyDriver::new(settings(&ns), probe.clone());
    let node = unique("n-drain");
    register_node(&client, &node, &[(LABEL_NODE_POOL, "cpu")], json!([])).await;
    driver
        .ensure_slurm(&tenant, &desired(vec![pool(&unique("cpu"), 1, 0, Vec::new())], &secrets()))
        .await
        .expect("ensure");

    // PLAYS THE OPERATOR: a NodeSet pod on the node (the Slurm node `cpu-0`), and another pod.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for (name, labels) in [("cpu-0", json!({ LABEL_POD_HOSTNAME: "cpu-0" })), ("other", json!({ "app": "other" }))] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": name, "labels": labels },
            "spec": { "nodeName": node, "containers": [{ "name": "c", "image": "example.invalid/c:1" }] },
        }))
        .expect("pod");
        // The namespace's default ServiceAccount appears shortly after the namespace.
        support::eventually(Duration::from_secs(30), "a pod to be created", || async {
            pods.create(&PostParams::default(), &pod).await.ok().map(|_| ())
        })
        .await;
    }

    *probe.drain_answer.lock().expect("lock") = Some(false);
    assert_eq!(driver.drain_node(&tenant, &version(), &node).await.expect("drain"), SlurmDrain::Draining);
    let still = pods.get("cpu-0").await.expect("pod").metadata.annotations.unwrap_or_default();
    assert!(!still.contains_key(slurm::ANNOTATION_HANDED_OVER), "handed over while draining: {still:?}");
    // Not cordoned: the operator answers a cordoned Node with a drain of its own reason.
    let left = Api::<Node>::all(client.clone()).get(&node).await.expect("node");
    assert_ne!(left.spec.and_then(|s| s.unschedulable), Some(true));
    *probe.drain_answer.lock().expect("lock") = Some(true);
    assert_eq!(driver.drain_node(&tenant, &version(), &node).await.expect("drain"), SlurmDrain::HandedOver);
    assert_eq!(*probe.drained.lock().expect("lock"), vec!["cpu-0".to_owned(), "cpu-0".to_owned()]);
    // The drain speaks the slurmrestd version the release pins in its stack.
    assert_eq!(*probe.versions.lock().expect("lock"), ["v0.0.42", "v0.0.42"]);
    // Drained: the slurmd pod carries paddock's mark and the lowest deletion cost, the other not.
    let marked = pods.get("cpu-0").await.expect("pod").metadata.annotations.unwrap_or_default();
    assert_eq!(marked.get(slurm::ANNOTATION_HANDED_OVER).map(String::as_str), Some(slurm::DRAIN_REASON));
    let cost = marked.get(slurm::ANNOTATION_POD_DELETION_COST).map(String::as_str);
    assert_eq!(cost, Some(i32::MIN.to_string().as_str()));
    let other = pods.get("other").await.expect("pod").metadata.annotations.unwrap_or_default();
    assert!(!other.contains_key(slurm::ANNOTATION_HANDED_OVER), "{other:?}");

    // Handed over before (Slurm is not asked again), and no Node at all: nothing to wait for.
    *probe.drain_answer.lock().expect("lock") = None;
    assert_eq!(driver.drain_node(&tenant, &version(), &node).await.expect("drain"), SlurmDrain::Done);
    assert_eq!(probe.drained.lock().expect("lock").len(), 2, "asked Slurm again after the hand-over");
    let missing = driver.drain_node(&tenant, &version(), &unique("n-missing")).await.expect("drain a missing node");
    assert_eq!(missing, SlurmDrain::Done);
}

#[tokio::test]
async fn the_slurm_nodes_of_nodeset_pods_are_read_with_the_node_they_run_on() {
    let Some(server) = server().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let ns = unique("slurm");
    let probe = Arc::new(StandInProbe::default());
    let driver = SlinkyDriver::new(settings(&ns), probe.clone());
    driver
        .ensure_slurm(&tenant, &desired(vec![pool(&unique("cpu"), 1, 0, Vec::new())], &secrets()))
        .await
        .expect("ensure");
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let slurm_node = |name: &str, state: &[&str], reason: &str| SlurmNode {
        name: name.into(),
        state: s(state),
        reason: reason.into(),
        ..SlurmNode::default()
    };
    *probe.nodes_answer.lock().expect("lock") =
        vec![slurm_node("cpu-0", &["IDLE", "DRAIN"], "paddock:hw: GPU 3 ECC"), slurm_node("cpu-9", &["IDLE"], "")];
    // No slurmd pod on any Node yet: Slurm is not asked.
    assert!(driver.node_states(&tenant, &version()).await.expect("states").is_empty());
    assert!(probe.versions.lock().expect("lock").is_empty(), "asked slurmrestd without a slurmd pod");

    // PLAYS THE OPERATOR: the NodeSet pod of `cpu-0` on a Node, and a pod that is not a NodeSet's.
    let node = unique("n-health");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for (name, labels) in [("cpu-0", json!({ LABEL_POD_HOSTNAME: "cpu-0" })), ("other", json!({ "app": "other" }))] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": name, "labels": labels },
            "spec": { "nodeName": node, "containers": [{ "name": "c", "image": "example.invalid/c:1" }] },
        }))
        .expect("pod");
        support::eventually(Duration::from_secs(30), "a pod to be created", || async {
            pods.create(&PostParams::default(), &pod).await.ok().map(|_| ())
        })
        .await;
    }
    // Only the nodes of slurmd pods, each with its pod's Node; the version the release pins.
    let states = driver.node_states(&tenant, &version()).await.expect("states");
    let expected = SlurmNodeState {
        slurm_node: "cpu-0".into(),
        node_name: node.clone(),
        states: s(&["IDLE", "DRAIN"]),
        reason: "paddock:hw: GPU 3 ECC".into(),
    };
    assert_eq!(states, [expected]);
    assert_eq!(*probe.versions.lock().expect("lock"), ["v0.0.42"]);
}

/// Drift: a NodeSet scaled by hand and a deleted Secret are restored and named, a label another
/// manager added stays, and the run after that changes nothing.
#[tokio::test]
async fn what_was_edited_or_deleted_behind_paddocks_back_is_restored_and_named() {
    let Some(server) = server().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let ns = unique("drift");
    let cpu = unique("cpu");
    let driver = SlinkyDriver::new(settings(&ns), Arc::new(StandInProbe::default()));
    let want = desired(vec![pool(&cpu, 2, 0, Vec::new())], &secrets());
    assert!(!driver.ensure_slurm(&tenant, &want).await.expect("ensure").changed.is_empty(), "created");
    let settled = driver.ensure_slurm(&tenant, &want).await.expect("again");
    assert!(settled.changed.is_empty(), "a converged Slurm is only read: {:?}", settled.changed);

    let edit = PatchParams { field_manager: Some("someone-else".into()), ..PatchParams::default() };
    let scaled = json!({ "metadata": { "labels": { "owner.example/team": "ops" } }, "spec": { "replicas": 7 } });
    slinky(&client, &ns, "NodeSet").patch(&cpu, &edit, &Patch::Merge(&scaled)).await.expect("scale by hand");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    secrets.delete(SECRET_JWT, &Default::default()).await.expect("delete the JWT key");

    let mut changed = driver.ensure_slurm(&tenant, &want).await.expect("after drift").changed;
    changed.sort();
    assert_eq!(changed, [format!("NodeSet {ns}/{cpu}"), format!("Secret {ns}/{SECRET_JWT}")]);
    let nodeset = cr(&client, &ns, "NodeSet", &cpu).await.expect("NodeSet");
    assert_eq!(nodeset.data["spec"]["replicas"], 2, "paddock's count is back");
    assert_eq!(nodeset.metadata.labels.unwrap_or_default().get("owner.example/team").map(String::as_str), Some("ops"));
    assert!(secrets.get_opt(SECRET_JWT).await.expect("get").is_some(), "the key is back");
    let again = driver.ensure_slurm(&tenant, &want).await.expect("once more");
    assert!(again.changed.is_empty(), "{:?}", again.changed);
}
