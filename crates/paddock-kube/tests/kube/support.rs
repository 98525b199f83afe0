//! Test support: real kube-apiservers from the kube-harness (tests/kube-harness).
//!
//! The harness is the one `scripts/test` started (`scripts/kube-start`, control endpoint in
//! `PADDOCK_TEST_KUBE_CONTROL`); without it, the harness binary (`PADDOCK_KUBE_HARNESS_BIN`, or
//! the default `~/.cache/paddock/kube-harness/kube-harness` that `tests/kube-harness/build.sh`
//! writes) is started for this test process, and stops when the process exits (stdin EOF). Without
//! either, a test is skipped ([`skip`]: a notice, or a failure under `CI=true`).
//!
//! Tests share one API server per test process ([`shared`], isolated by namespace: every test
//! makes fresh cluster ids), except those that stop theirs or need CRDs ([`dedicated`]) or other
//! controllers ([`dedicated_with`], e.g. [`WORKLOADS`]: the workload controllers and the real
//! kube-scheduler, with [`ready_node`] playing the kubelets' registration).

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use paddock_domain::driver::ClusterRef;
use paddock_kube::KubePlatform;
use paddock_testkit::skip;
use paddock_types::{ClusterId, TenantId};
use serde::Deserialize;

/// One API server of the harness, as `POST /apiservers` describes it.
#[derive(Debug, Clone, Deserialize)]
pub struct ApiServer {
    /// Its name in the harness.
    pub name: String,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// A self-contained kubeconfig (CA embedded, admin token).
    pub kubeconfig: PathBuf,
    /// The admin token (to check that errors do not leak it).
    pub token: String,
    /// The in-process controllers it runs (the harness's groups expanded).
    pub controllers: Vec<String>,
}

impl ApiServer {
    /// A driver connected through the kubeconfig, as `PADDOCK_KUBECONFIG` would.
    pub async fn platform(&self) -> KubePlatform {
        KubePlatform::connect(Some(&self.kubeconfig)).await.expect("connect with the harness kubeconfig")
    }

    /// A plain client, for reading objects back.
    pub async fn client(&self) -> kube::Client {
        self.platform().await.client().clone()
    }
}

/// The harness's control endpoint (`http://127.0.0.1:<port>`), or None (the test is skipped:
/// [`skip`]).
fn control() -> Option<String> {
    static CONTROL: OnceLock<Result<String, String>> = OnceLock::new();
    let found = CONTROL.get_or_init(|| {
        if let Some(url) = std::env::var("PADDOCK_TEST_KUBE_CONTROL").ok().filter(|v| !v.is_empty()) {
            return Ok(url.trim_end_matches('/').to_owned());
        }
        let msg = "the kube-harness is not running: run the tests with `scripts/test -p paddock-kube`, which \
                   starts it (scripts/kube-start) and exports PADDOCK_TEST_KUBE_CONTROL";
        if skip::on_ci() {
            return Err(msg.to_owned());
        }
        spawn_harness().map_err(|e| format!("{msg}; starting it here failed too: {e}"))
    });
    match found {
        Ok(url) => Some(url.clone()),
        Err(why) => {
            skip::skip(why);
            None
        }
    }
}

/// Keeps the harness we started alive (its stdin open) for the rest of the process.
static OWN_HARNESS: Mutex<Option<(Child, ChildStdin)>> = Mutex::new(None);

fn spawn_harness() -> Result<String, String> {
    let bin = match std::env::var("PADDOCK_KUBE_HARNESS_BIN").ok().filter(|v| !v.is_empty()) {
        Some(b) => PathBuf::from(b),
        None => PathBuf::from(std::env::var("HOME").map_err(|_| "HOME is not set")?)
            .join(".cache/paddock/kube-harness/kube-harness"),
    };
    if !bin.is_file() {
        return Err(format!("{} does not exist (build it with tests/kube-harness/build.sh)", bin.display()));
    }
    let log = std::env::temp_dir().join(format!("paddock-kube-harness-{}.log", std::process::id()));
    let stderr = std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
    let mut child = Command::new(&bin)
        .arg("--exit-on-stdin-eof")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", bin.display()))?;
    let stdin = child.stdin.take().ok_or("no stdin pipe")?;
    let stdout = child.stdout.take().ok_or("no stdout pipe")?;
    let mut addr = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.map_err(|e| format!("reading the harness's stdout: {e}"))?;
        if let Some(a) = line.strip_prefix("CONTROL_ADDR=") {
            addr = Some(a.to_owned());
        } else if line == "READY" {
            break;
        }
    }
    let addr = addr.ok_or_else(|| format!("the harness exited before READY (log: {})", log.display()))?;
    eprintln!("started {} for this test process (log: {})", bin.display(), log.display());
    *OWN_HARNESS.lock().map_err(|_| "poisoned")? = Some((child, stdin));
    Ok(format!("http://{addr}"))
}

fn http() -> reqwest::Client {
    // API server starts get slow when tests run in parallel on 2 cores (README: use >= 120 s).
    reqwest::Client::builder().timeout(Duration::from_secs(180)).build().expect("reqwest client")
}

/// A harness name for `test`, unique per test process (harnesses may be shared between runs).
fn server_name(test: &str) -> String {
    let mut name = format!("{}-{}", test.replace('_', "-"), std::process::id());
    name.truncate(63);
    name.trim_end_matches('-').to_owned()
}

/// Controller groups of the harness (tests/kube-harness/README.md, "Controllers"): its default set
/// (namespace, service accounts, garbage collector, root CA, resource quota; what an API server
/// runs when none are named) plus the workload controllers (deployment, replicaset, statefulset,
/// daemonset, job, endpointslice, endpoints, persistentvolume-binder) and the real kube-scheduler.
pub const WORKLOADS: &[&str] = &["defaults", "workloads"];

/// Starts API server `name`; `controllers` None leaves the harness's default.
async fn create(name: &str, crds: &[PathBuf], controllers: Option<&[&str]>) -> ApiServer {
    let control = control().expect("checked by the caller");
    let mut body = serde_json::json!({ "name": name, "crds": crds });
    if let Some(controllers) = controllers {
        body["controllers"] = serde_json::json!(controllers);
    }
    let rsp = http().post(format!("{control}/apiservers")).json(&body).send().await.expect("POST /apiservers");
    let status = rsp.status();
    let body = rsp.text().await.expect("POST /apiservers body");
    assert_eq!(status.as_u16(), 201, "creating API server {name}: {body}");
    serde_json::from_str(&body).expect("API server info")
}

/// The API server shared by the tests of this process, or None when there is no harness.
pub async fn shared() -> Option<ApiServer> {
    static SHARED: tokio::sync::OnceCell<ApiServer> = tokio::sync::OnceCell::const_new();
    control()?;
    // The OnceCell holds plain data only: each test (own tokio runtime) makes its own clients.
    Some(SHARED.get_or_init(|| async { create(&server_name("shared"), &[], None).await }).await.clone())
}

/// The API server with the Kamaji CRDs shared by the control-plane tests of this process (each
/// isolates itself by namespace), or None when there is no harness or there are no CRDs.
pub async fn kamaji() -> Option<ApiServer> {
    static KAMAJI: tokio::sync::OnceCell<ApiServer> = tokio::sync::OnceCell::const_new();
    let crds = kamaji_crds()?;
    control()?;
    Some(KAMAJI.get_or_init(|| async { create(&server_name("kamaji-shared"), &crds, None).await }).await.clone())
}

/// An API server for `test` alone (with `crds` installed); delete it with [`delete`].
pub async fn dedicated(test: &str, crds: &[PathBuf]) -> Option<ApiServer> {
    control()?;
    Some(create(&server_name(test), crds, None).await)
}

/// An API server for `test` alone running `controllers` (groups such as [`WORKLOADS`], or single
/// controller names); delete it with [`delete`]. Panics if the harness does not know them (an
/// outdated harness binary), so a test that needs them cannot pass without them.
pub async fn dedicated_with(test: &str, crds: &[PathBuf], controllers: &[&str]) -> Option<ApiServer> {
    control()?;
    Some(create(&server_name(test), crds, Some(controllers)).await)
}

/// Plays a kubelet registering: creates Node `name` with `labels`, reports it Ready with
/// allocatable cpu, memory and pods (without `pods` the scheduler fits nothing on it), and lifts
/// the `node.kubernetes.io/not-ready` taint that admission (TaintNodesByCondition) puts on every
/// new Node, since the harness does not run the node-lifecycle controller that would. Taints of
/// the Node's own are kept. Returns the Node as stored.
pub async fn ready_node(client: &kube::Client, name: &str, labels: &[(&str, &str)]) -> Node {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut labels: BTreeMap<String, String> = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    labels.entry("kubernetes.io/hostname".to_owned()).or_insert_with(|| name.to_owned());
    let node = Node {
        metadata: ObjectMeta { name: Some(name.to_owned()), labels: Some(labels), ..ObjectMeta::default() },
        ..Node::default()
    };
    nodes.create(&PostParams::default(), &node).await.unwrap_or_else(|e| panic!("creating Node {name}: {e}"));
    let resources: BTreeMap<String, Quantity> = [("cpu", "8"), ("memory", "32Gi"), ("pods", "110")]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
        .collect();
    let status = NodeStatus {
        conditions: Some(vec![NodeCondition {
            type_: "Ready".to_owned(),
            status: "True".to_owned(),
            reason: Some("KubeletReady".to_owned()),
            message: Some("kubelet is posting ready status (played by the test)".to_owned()),
            ..NodeCondition::default()
        }]),
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        ..NodeStatus::default()
    };
    let patch = serde_json::json!({ "status": status });
    let node = nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("reporting Node {name} Ready: {e}"));
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    if !taints.iter().any(|t| t.key == NOT_READY_TAINT) {
        return node;
    }
    let kept: Vec<_> = taints.into_iter().filter(|t| t.key != NOT_READY_TAINT).collect();
    let patch = serde_json::json!({ "spec": { "taints": kept } });
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("lifting the not-ready taint of Node {name}: {e}"))
}

/// The taint a Node carries until it is Ready (`node.kubernetes.io/not-ready`).
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

/// Stops and forgets an API server of the harness.
pub async fn delete(server: &ApiServer) {
    let control = control().expect("a server exists, so the harness does");
    let rsp = http().delete(format!("{control}/apiservers/{}", server.name)).send().await.expect("DELETE");
    assert!(rsp.status().is_success(), "deleting API server {}: {}", server.name, rsp.status());
}

/// A fresh cluster of a fresh tenant, names taken from the test.
pub fn cluster(tenant_name: &str, cluster_name: &str) -> ClusterRef {
    ClusterRef {
        tenant_id: TenantId::new(),
        cluster_id: ClusterId::new(),
        tenant_name: tenant_name.to_owned(),
        cluster_name: cluster_name.to_owned(),
    }
}

/// Polls `probe` until it returns Some, failing the test after `deadline`.
pub async fn eventually<T, F, Fut>(deadline: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out after {deadline:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The Kamaji CRDs of the shared directory (`PADDOCK_SHARED`, default `../shared` beside the
/// repository), or None when they are not there (the test is skipped: [`skip`]).
pub fn kamaji_crds() -> Option<Vec<PathBuf>> {
    let shared = match std::env::var("PADDOCK_SHARED").ok().filter(|v| !v.is_empty()) {
        Some(s) => PathBuf::from(s),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
    };
    let dir = shared.join("crds/kamaji");
    let files: Vec<PathBuf> = ["kamaji.clastix.io_tenantcontrolplanes.yaml", "kamaji.clastix.io_datastores.yaml"]
        .iter()
        .map(|f| dir.join(f))
        .collect();
    if files.iter().all(|f| f.is_file()) {
        // The harness wants absolute paths.
        Some(files.into_iter().map(|f| f.canonicalize().expect("canonical CRD path")).collect())
    } else {
        skip::skip(format_args!("the Kamaji CRDs are not in {}", dir.display()));
        None
    }
}

/// A kubeconfig (YAML) for `server` holding a fresh TokenRequest token (an hour) of the
/// ServiceAccount `namespace/account`, as a pod's projected token would be: its holder gets
/// exactly that account's RBAC, not admin. `admin` requests the token.
pub async fn service_account_kubeconfig(
    server: &ApiServer,
    admin: &kube::Client,
    namespace: &str,
    account: &str,
) -> String {
    let admin_config = std::fs::read_to_string(&server.kubeconfig).expect("the harness kubeconfig");
    crate::played::operator::service_account_kubeconfig(admin, &server.url, &admin_config, namespace, account).await
}
