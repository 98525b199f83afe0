//! `KubeTenantStack` against a real API server playing the tenant cluster (the shared one, reached
//! through its admin kubeconfig as Kamaji's would be).
//!
//! Each test assembles its own stacks directory: Slinky's **real** CRDs (the upstream files in the
//! shared directory, `crds/slinky`) plus small **stand-ins**, clearly marked in their first line,
//! for the components that cannot be downloaded here (Calico, the NVIDIA device plugin,
//! local-path-provisioner, Slinky's operator). The test definition pins digests computed here.
//! Object names carry a per-test id, so tests sharing the API server do not meet (the Slinky CRDs
//! are shared, identical in every test).
//!
//! What the tests play: no kubelet or workload controller runs in the harness, so the tests write
//! the Deployments' and DaemonSets' `status` (labelled "plays the controller" below). CRDs are
//! established by the API server itself (its apiextensions controllers run in the harness).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client, Resource};
use paddock_domain::driver::{TenantAccess, TenantStack};
use paddock_domain::secret::SecretString;
use paddock_kube::stack::{ReadinessRule, StackComponent, StackDefinition, StackManifest, LABEL_STACK_COMPONENT};
use paddock_kube::KubeTenantStack;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::support::{self, ApiServer};

/// The Slinky CRD files (the real upstream ones) in the shared directory.
const SLINKY_CRDS: [&str; 6] = [
    "slinky.slurm.net_accountings.yaml",
    "slinky.slurm.net_controllers.yaml",
    "slinky.slurm.net_loginsets.yaml",
    "slinky.slurm.net_nodesets.yaml",
    "slinky.slurm.net_restapis.yaml",
    "slinky.slurm.net_tokens.yaml",
];

/// The tenant cluster as the worker reaches it: the API server's admin kubeconfig.
fn access(server: &ApiServer) -> TenantAccess {
    let kubeconfig = std::fs::read_to_string(&server.kubeconfig).expect("read the harness kubeconfig");
    TenantAccess {
        cluster: support::cluster("stack", "tenant"),
        endpoint: server.url.trim_start_matches("https://").to_owned(),
        admin_kubeconfig: SecretString::new(kubeconfig),
    }
}

/// `shared/crds/slinky` (`PADDOCK_SHARED`, default `../shared` beside the repository), or None
/// (test skipped, a failure on CI).
fn slinky_crds_dir() -> Option<PathBuf> {
    let shared = match std::env::var("PADDOCK_SHARED").ok().filter(|v| !v.is_empty()) {
        Some(s) => PathBuf::from(s),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
    };
    let dir = shared.join("crds/slinky");
    if SLINKY_CRDS.iter().all(|f| dir.join(f).is_file()) {
        return Some(dir);
    }
    assert!(std::env::var("CI").as_deref() != Ok("true"), "the Slinky CRDs are missing in {} (CI=true)", dir.display());
    eprintln!("SKIPPED: the Slinky CRDs are not in {}", dir.display());
    None
}

/// A throw-away stacks directory (removed on drop).
struct StacksDir {
    root: PathBuf,
}

impl StacksDir {
    fn new(id: &str) -> Self {
        let root = std::env::temp_dir().join(format!("paddock-stacks-{id}-{}", std::process::id()));
        std::fs::create_dir_all(&root).expect("create the stacks dir");
        Self { root }
    }

    /// Writes `<version>/<file>` and returns its manifest entry with the digest of what was written.
    fn write(&self, version: &str, file: &str, bytes: &[u8]) -> StackManifest {
        let path = self.root.join(version).join(file);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("create the component dir");
        std::fs::write(&path, bytes).expect("write the manifest");
        StackManifest {
            file: file.to_owned(),
            source: "test: written by tests/kube/stack.rs".to_owned(),
            render: None,
            sha256: Some(hex::encode(Sha256::digest(bytes))),
        }
    }
}

impl Drop for StacksDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The names one test's stack uses.
struct Names {
    /// The stand-in components' namespace (created by the CNI stand-in's own Namespace object).
    ns: String,
    /// The operator's namespace (the component's `namespace`: paddock creates it).
    operator_ns: String,
    /// The stand-in StorageClass (cluster-scoped).
    storage_class: String,
    /// The API group of the operator stand-in's own CRD (unique per test, so that its kind is
    /// never served before this test applies it).
    widget_group: String,
}

impl Names {
    fn new(id: &str) -> Self {
        Self {
            ns: format!("stk-{id}"),
            operator_ns: format!("stk-{id}-slinky"),
            storage_class: format!("local-path-{id}"),
            widget_group: format!("stk-{id}.paddock.test"),
        }
    }
}

fn cni_standin(n: &Names) -> String {
    format!(
        "# STAND-IN for Calico (manifests/calico.yaml), which cannot be downloaded here: a Namespace\n\
         # and a DaemonSet shaped like calico-node. Not the upstream file.\n\
         apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\n\
         apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: calico-node\n  namespace: {ns}\n\
         spec:\n  selector:\n    matchLabels: {{k8s-app: calico-node}}\n  template:\n    metadata:\n\
         \x20     labels: {{k8s-app: calico-node}}\n    spec:\n      hostNetwork: true\n      containers:\n\
         \x20     - name: calico-node\n        image: example.invalid/standin/calico-node:v3.30.3\n",
        ns = n.ns
    )
}

fn device_plugin_standin(n: &Names) -> String {
    format!(
        "# STAND-IN for the NVIDIA device plugin (deployments/static/nvidia-device-plugin.yml), which\n\
         # cannot be downloaded here: a DaemonSet of the same name. Not the upstream file.\n\
         apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: nvidia-device-plugin-daemonset\n  namespace: {ns}\n\
         spec:\n  selector:\n    matchLabels: {{name: nvidia-device-plugin-ds}}\n  template:\n    metadata:\n\
         \x20     labels: {{name: nvidia-device-plugin-ds}}\n    spec:\n      containers:\n\
         \x20     - name: nvidia-device-plugin-ctr\n        image: example.invalid/standin/k8s-device-plugin:v0.17.1\n",
        ns = n.ns
    )
}

fn storage_standin(n: &Names) -> String {
    format!(
        "# STAND-IN for local-path-provisioner (deploy/local-path-storage.yaml), which cannot be\n\
         # downloaded here: its StorageClass and Deployment. Not the upstream file.\n\
         apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: {sc}\n\
         provisioner: rancher.io/local-path\nvolumeBindingMode: WaitForFirstConsumer\nreclaimPolicy: Delete\n---\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: local-path-provisioner\n  namespace: {ns}\n\
         spec:\n  replicas: 1\n  selector:\n    matchLabels: {{app: local-path-provisioner}}\n  template:\n\
         \x20   metadata:\n      labels: {{app: local-path-provisioner}}\n    spec:\n      containers:\n\
         \x20     - name: local-path-provisioner\n        image: example.invalid/standin/local-path-provisioner:v0.0.31\n",
        sc = n.storage_class,
        ns = n.ns
    )
}

/// The operator stand-in. Its objects name no namespace (as `helm template` output may not): they
/// go to the component's. It also brings a CRD of its own, listed AFTER an object of its kind,
/// to check that CRDs go first and that paddock waits for a just-applied kind to be served.
fn operator_standin(n: &Names, image_tag: &str) -> String {
    format!(
        "# STAND-IN for Slinky's slurm-operator (the rendered Helm chart), which cannot be downloaded\n\
         # here: a Deployment, plus a CRD and a custom object of the test's own. Not the upstream file.\n\
         apiVersion: {g}/v1\nkind: Widget\nmetadata:\n  name: default\nspec:\n  size: 3\n---\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: slurm-operator\n\
         spec:\n  replicas: 1\n  selector:\n    matchLabels: {{app.kubernetes.io/name: slurm-operator}}\n  template:\n\
         \x20   metadata:\n      labels: {{app.kubernetes.io/name: slurm-operator}}\n    spec:\n      containers:\n\
         \x20     - name: slurm-operator\n        image: example.invalid/standin/slurm-operator:{image_tag}\n---\n\
         apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: widgets.{g}\n\
         spec:\n  group: {g}\n  scope: Namespaced\n  names: {{plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}}\n\
         \x20 versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n\
         \x20       type: object\n        x-kubernetes-preserve-unknown-fields: true\n",
        g = n.widget_group
    )
}

/// Writes stack `version` (the operator stand-in with `operator_tag`) and returns its definition.
fn write_stack(dir: &StacksDir, crds: &Path, n: &Names, version: &str, operator_tag: &str) -> StackDefinition {
    let component = |name: &str, manifests: Vec<StackManifest>, ready: Vec<ReadinessRule>| StackComponent {
        name: name.to_owned(),
        version: "test".to_owned(),
        namespace: None,
        notes: None,
        manifests,
        ready,
    };
    let slinky = SLINKY_CRDS
        .iter()
        .map(|f| {
            let bytes = std::fs::read(crds.join(f)).expect("read a Slinky CRD");
            dir.write(version, &format!("slinky-crds/{f}"), &bytes)
        })
        .collect();
    let mut operator = component(
        "slurm-operator",
        vec![dir.write(version, "slurm-operator/standin.yaml", operator_standin(n, operator_tag).as_bytes())],
        vec![ReadinessRule::CrdsEstablished, ReadinessRule::WorkloadsAvailable],
    );
    operator.namespace = Some(n.operator_ns.clone());
    StackDefinition {
        slurm: None,
        version: version.to_owned(),
        notes: Some("test stack: real Slinky CRDs, stand-ins for the rest".to_owned()),
        components: vec![
            component(
                "calico",
                vec![dir.write(version, "calico/standin.yaml", cni_standin(n).as_bytes())],
                vec![ReadinessRule::WorkloadsAvailable],
            ),
            component(
                "nvidia-device-plugin",
                vec![dir.write(version, "nvidia-device-plugin/standin.yaml", device_plugin_standin(n).as_bytes())],
                vec![ReadinessRule::WorkloadsAvailable],
            ),
            component(
                "local-path-provisioner",
                vec![dir.write(version, "local-path-provisioner/standin.yaml", storage_standin(n).as_bytes())],
                vec![ReadinessRule::WorkloadsAvailable],
            ),
            component("slinky-crds", slinky, vec![ReadinessRule::CrdsEstablished]),
            operator,
        ],
    }
}

/// A short id for one test's names.
fn test_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}

/// The resourceVersion of every object of the test stack, by `Kind namespace/name`.
async fn versions(client: &Client, n: &Names) -> BTreeMap<String, String> {
    fn rv<K: Resource>(o: &K) -> String {
        o.meta().resource_version.clone().expect("a resourceVersion")
    }
    let mut out = BTreeMap::new();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [&n.ns, &n.operator_ns] {
        out.insert(format!("Namespace {ns}"), rv(&namespaces.get(ns).await.expect("namespace")));
    }
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &n.ns);
    for name in ["calico-node", "nvidia-device-plugin-daemonset"] {
        out.insert(format!("DaemonSet {}/{name}", n.ns), rv(&daemonsets.get(name).await.expect("daemonset")));
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &n.ns);
    let d = deployments.get("local-path-provisioner").await.expect("deployment");
    out.insert(format!("Deployment {}/local-path-provisioner", n.ns), rv(&d));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &n.operator_ns);
    let d = deployments.get("slurm-operator").await.expect("operator deployment");
    out.insert(format!("Deployment {}/slurm-operator", n.operator_ns), rv(&d));
    let classes: Api<StorageClass> = Api::all(client.clone());
    let sc = classes.get(&n.storage_class).await.expect("storage class");
    out.insert(format!("StorageClass {}", n.storage_class), rv(&sc));
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in ["accountings", "controllers", "loginsets", "nodesets", "restapis", "tokens"]
        .iter()
        .map(|p| format!("{p}.slinky.slurm.net"))
        .chain([format!("widgets.{}", n.widget_group)])
    {
        out.insert(format!("CustomResourceDefinition {name}"), rv(&crds.get(&name).await.expect("crd")));
    }
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &n.operator_ns, &widget_resource(n));
    out.insert(format!("Widget {}/default", n.operator_ns), rv(&widgets.get("default").await.expect("widget")));
    out
}

fn widget_resource(n: &Names) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(&n.widget_group, "v1", "Widget"), "widgets")
}

/// Plays the workload controllers (no kubelet or controller-manager workload controllers run in
/// the harness): writes every stand-in Deployment's and DaemonSet's status as fully available.
async fn play_controllers(client: &Client, n: &Names) {
    let params = PatchParams::default();
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &n.ns);
    for name in ["calico-node", "nvidia-device-plugin-daemonset"] {
        let generation = daemonsets.get(name).await.expect("daemonset").metadata.generation;
        let status = json!({ "status": {
            "observedGeneration": generation, "desiredNumberScheduled": 2, "currentNumberScheduled": 2,
            "updatedNumberScheduled": 2, "numberReady": 2, "numberAvailable": 2, "numberMisscheduled": 0,
        }});
        daemonsets.patch_status(name, &params, &Patch::Merge(&status)).await.expect("daemonset status");
    }
    for (ns, name) in [(&n.ns, "local-path-provisioner"), (&n.operator_ns, "slurm-operator")] {
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
        let generation = deployments.get(name).await.expect("deployment").metadata.generation;
        let status = json!({ "status": {
            "observedGeneration": generation, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1,
            "availableReplicas": 1,
        }});
        deployments.patch_status(name, &params, &Patch::Merge(&status)).await.expect("deployment status");
    }
}

async fn crd_established(client: &Client, name: &str) -> bool {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.get(name).await.expect("crd");
    let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
    conditions.iter().any(|c| c.type_ == "Established" && c.status == "True")
}

#[tokio::test]
async fn a_stack_applies_in_order_becomes_ready_and_reapplying_changes_nothing() {
    let (Some(server), Some(crds)) = (support::shared().await, slinky_crds_dir()) else { return };
    let id = test_id();
    let (dir, n) = (StacksDir::new(&id), Names::new(&id));
    let definition = write_stack(&dir, &crds, &n, "2026.1.0", "v1.2.1");
    let stack = KubeTenantStack::with_definition(dir.root.clone(), definition).expect("valid definition");
    stack.verify().expect("the files verify");
    let tenant = access(&server);
    let client = server.client().await;

    // First run: everything applied, nothing reported ready (no controller has run).
    let status = stack.ensure_stack(&tenant).await.expect("ensure the stack");
    assert_eq!(status.version, "2026.1.0");
    assert!(!status.ready, "{status:?}");
    assert!(status.reason.contains("component calico: DaemonSet"), "{}", status.reason);
    assert!(status.reason.contains("slurm-operator"), "{}", status.reason);
    assert!(!status.reason.contains("Established"), "the API server establishes CRDs: {}", status.reason);

    // The real Slinky CRDs are there and Established (by the API server itself, not played).
    for f in SLINKY_CRDS {
        let name = f.trim_start_matches("slinky.slurm.net_").trim_end_matches(".yaml");
        assert!(crd_established(&client, &format!("{name}.slinky.slurm.net")).await, "{name}");
    }
    // The component namespace was created and received the objects that named none; the custom
    // object listed before its CRD was applied after it.
    let before = versions(&client, &n).await;
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &n.operator_ns, &widget_resource(&n));
    let widget = widgets.get("default").await.expect("the Widget");
    assert_eq!(widget.data["spec"]["size"], 3);
    let sc: Api<StorageClass> = Api::all(client.clone());
    let sc = sc.get(&n.storage_class).await.expect("storage class");
    assert_eq!(sc.provisioner, "rancher.io/local-path");
    let labels = sc.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(LABEL_STACK_COMPONENT).map(String::as_str), Some("local-path-provisioner"));
    let managers = sc.metadata.managed_fields.unwrap_or_default();
    assert!(managers
        .iter()
        .any(|m| m.manager.as_deref() == Some("paddock") && m.operation.as_deref() == Some("Apply")));

    // Re-applying before anything moved changes nothing.
    let status = stack.ensure_stack(&tenant).await.expect("ensure again");
    assert!(!status.ready);
    assert_eq!(versions(&client, &n).await, before, "a re-apply wrote something");

    // Plays the workload controllers: now the stack is ready.
    play_controllers(&client, &n).await;
    let converged = versions(&client, &n).await;
    let status = stack.ensure_stack(&tenant).await.expect("ensure once ready");
    assert_eq!((status.ready, status.reason.as_str(), status.version.as_str()), (true, "", "2026.1.0"));
    assert_eq!(versions(&client, &n).await, converged, "re-applying a converged stack wrote something");

    // A fresh driver (no cached client, as after a restart) converges to the same.
    let again = KubeTenantStack::with_definition(dir.root.clone(), stack.definition().clone()).expect("valid");
    assert!(again.ensure_stack(&tenant).await.expect("ensure from a fresh driver").ready);
    assert_eq!(versions(&client, &n).await, converged);
}

#[tokio::test]
async fn a_tampered_or_unpinned_manifest_is_refused_and_nothing_is_applied() {
    let (Some(server), Some(crds)) = (support::shared().await, slinky_crds_dir()) else { return };
    let id = test_id();
    let (dir, n) = (StacksDir::new(&id), Names::new(&id));
    let definition = write_stack(&dir, &crds, &n, "2026.1.0", "v1.2.1");
    let tenant = access(&server);
    let client = server.client().await;

    // Tamper with the LAST component's file: the earlier ones verify, and must not be applied
    // either (every file is checked before the first write).
    let path = dir.root.join("2026.1.0/slurm-operator/standin.yaml");
    let mut text = std::fs::read_to_string(&path).expect("read");
    text = text.replace("replicas: 1", "replicas: 50");
    std::fs::write(&path, &text).expect("tamper");
    let tampered = hex::encode(Sha256::digest(text.as_bytes()));
    let pinned = definition.components[4].manifests[0].sha256.clone().expect("pinned");

    let stack = KubeTenantStack::with_definition(dir.root.clone(), definition.clone()).expect("valid definition");
    let e = stack.ensure_stack(&tenant).await.expect_err("a tampered file is refused");
    assert_eq!(e.code, "stack_digest_mismatch");
    assert!(!e.is_transient());
    for part in ["2026.1.0/slurm-operator/standin.yaml", &pinned, &tampered] {
        assert!(e.message.contains(part), "{part} missing from: {}", e.message);
    }
    assert!(stack.verify().is_err());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    assert!(namespaces.get_opt(&n.ns).await.expect("get").is_none(), "the first component was applied");
    let classes: Api<StorageClass> = Api::all(client.clone());
    assert!(classes.get_opt(&n.storage_class).await.expect("get").is_none());

    // A digest not pinned yet is refused as well, with the file's digest to review.
    let mut unpinned = definition;
    unpinned.components[4].manifests[0].sha256 = None;
    let stack = KubeTenantStack::with_definition(dir.root.clone(), unpinned).expect("valid definition");
    let e = stack.ensure_stack(&tenant).await.expect_err("an unpinned file is refused");
    assert_eq!(e.code, "stack_digest_unpinned");
    assert!(e.message.contains(&tampered), "{}", e.message);

    // A missing file (the provider did not fill the directory) too.
    std::fs::remove_file(&path).expect("remove");
    let e = KubeTenantStack::with_definition(dir.root.clone(), stack.definition().clone())
        .expect("valid")
        .ensure_stack(&tenant)
        .await
        .expect_err("a missing file is refused");
    assert_eq!(e.code, "stack_manifest_unreadable");
    assert!(!e.message.contains(dir.root.to_str().expect("utf-8")), "no server path: {}", e.message);
    assert!(namespaces.get_opt(&n.ns).await.expect("get").is_none());
}

#[tokio::test]
async fn an_upgrade_rewrites_only_the_changed_component() {
    let (Some(server), Some(crds)) = (support::shared().await, slinky_crds_dir()) else { return };
    let id = test_id();
    let (dir, n) = (StacksDir::new(&id), Names::new(&id));
    let tenant = access(&server);
    let client = server.client().await;
    let v1 = write_stack(&dir, &crds, &n, "2026.1.0", "v1.2.1");
    let stack = KubeTenantStack::with_definition(dir.root.clone(), v1.clone()).expect("valid definition");
    stack.ensure_stack(&tenant).await.expect("apply v1");
    play_controllers(&client, &n).await;
    assert!(stack.ensure_stack(&tenant).await.expect("v1 ready").ready);
    let before = versions(&client, &n).await;

    // Version 2 differs only in the operator's image: the other components' files are
    // byte-identical (same digests).
    let v2 = write_stack(&dir, &crds, &n, "2026.2.0", "v1.3.0");
    assert_eq!(v2.components[..4], v1.components[..4]);
    assert_ne!(v2.components[4], v1.components[4]);
    let stack = KubeTenantStack::with_definition(dir.root.clone(), v2.clone()).expect("valid definition");
    let status = stack.ensure_stack(&tenant).await.expect("apply v2");
    assert_eq!(status.version, "2026.2.0");
    // The new operator generation has not been rolled out by its (played) controller yet.
    assert!(!status.ready);
    assert!(status.reason.contains("slurm-operator") && status.reason.contains("not observed"), "{}", status.reason);

    let after = versions(&client, &n).await;
    let operator = format!("Deployment {}/slurm-operator", n.operator_ns);
    let changed: Vec<_> = after.iter().filter(|(k, v)| before.get(*k) != Some(*v)).map(|(k, _)| k.clone()).collect();
    assert_eq!(changed, [operator], "only the changed object may be rewritten");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &n.operator_ns);
    let d = deployments.get("slurm-operator").await.expect("operator");
    let image = d.spec.and_then(|s| s.template.spec).map(|s| s.containers[0].image.clone());
    assert_eq!(image.flatten().as_deref(), Some("example.invalid/standin/slurm-operator:v1.3.0"));

    play_controllers(&client, &n).await;
    assert!(stack.ensure_stack(&tenant).await.expect("v2 ready").ready);
}
