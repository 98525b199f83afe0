//! `KubeTenantStack` against real API servers playing the tenant cluster (reached through the admin
//! kubeconfig, as Kamaji's would be).
//!
//! The stacks are made of **real upstream files** wherever they can be had: the NVIDIA device plugin
//! and local-path-provisioner as `scripts/test` fetched them into `PADDOCK_TEST_UPSTREAM_STACKS`
//! (`scripts/stacks-fetch`; the Go module proxy has them where GitHub cannot be reached), checked
//! against the digests the embedded definition pins, and Slinky's CRDs from the shared directory
//! (`crds/slinky`). Calico and Slinky's operator (a Helm chart), which cannot be had here, are
//! **stand-ins**, clearly marked in their first line, with digests computed here.
//!
//! Isolation: the real manifests have fixed names, several of them cluster-scoped (Namespace
//! `local-path-storage`, ClusterRole `local-path-provisioner-role`,
//! StorageClass `local-path`) or in `kube-system`, so tests applying them to one shared API server
//! would meet: one test's played workload status would show up in another's "re-applying writes
//! nothing", and its applied objects in another's "nothing was applied". Each test therefore has an
//! API server of its own (`support::dedicated`, named after the test), deleted at its end.
//!
//! What the tests play: no kubelet or workload controller runs in the harness, so the tests write
//! the `status` of the real Deployments and DaemonSets (labelled "plays the controller" below). CRDs
//! are established by the API server itself (its apiextensions controllers run in the harness).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::core::GroupVersion;
use kube::discovery::Scope;
use kube::{Api, Client};
use paddock_domain::driver::{TenantAccess, TenantStack};
use paddock_domain::secret::SecretString;
use paddock_domain::stack::{latest_version, ReadinessRule, StackComponent, StackDefinition, StackManifest};
use paddock_kube::slurm::DEFAULT_STORAGE_CLASS;
use paddock_kube::stack::LABEL_STACK_COMPONENT;
use paddock_kube::KubeTenantStack;
use serde::Deserialize;
use serde_json::{json, Value};
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

/// The components of the embedded definition whose real upstream files `scripts/test` fetches
/// (pinned, and served by the Go module proxy), in apply order.
const UPSTREAM: [&str; 2] = ["nvidia-device-plugin", "local-path-provisioner"];

/// The workloads whose controllers the tests play, `(namespace, name)`: the Calico stand-in's
/// DaemonSet (named as upstream's), and the real files' DaemonSet and Deployment.
const CALICO_DS: (&str, &str) = ("kube-system", "calico-node");
const DEVICE_PLUGIN_DS: (&str, &str) = ("kube-system", "nvidia-device-plugin-daemonset");
const LOCAL_PATH_DEPLOYMENT: (&str, &str) = ("local-path-storage", "local-path-provisioner");

/// The operator stand-in's namespace (the component's `namespace`, as in the embedded definition:
/// paddock creates it) and the API group of the stand-in's own CRD.
const OPERATOR_NS: &str = "slinky";
const OPERATOR_DEPLOYMENT: (&str, &str) = (OPERATOR_NS, "slurm-operator");
const WIDGET_GROUP: &str = "stack.paddock.test";

/// The tenant cluster as the worker reaches it: the API server's admin kubeconfig.
fn access(server: &ApiServer) -> TenantAccess {
    let kubeconfig = std::fs::read_to_string(&server.kubeconfig).expect("read the harness kubeconfig");
    TenantAccess {
        cluster: support::cluster("stack", "tenant"),
        endpoint: server.url.trim_start_matches("https://").to_owned(),
        admin_kubeconfig: SecretString::new(kubeconfig),
    }
}

fn on_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
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
    assert!(!on_ci(), "the Slinky CRDs are missing in {} (CI=true)", dir.display());
    eprintln!("SKIPPED: the Slinky CRDs are not in {}", dir.display());
    None
}

/// The component `name` of the embedded definition `d`.
fn embedded_component(d: &StackDefinition, name: &str) -> StackComponent {
    let found = d.components.iter().find(|c| c.name == name).cloned();
    found.unwrap_or_else(|| panic!("the embedded stack {} has no component {name}", d.version))
}

/// The directory `scripts/test` filled with the real upstream files of [`UPSTREAM`]
/// (`PADDOCK_TEST_UPSTREAM_STACKS`, laid out as a stacks directory: `<version>/<file>`), or None
/// (test skipped, a failure on CI).
fn upstream_dir(embedded: &StackDefinition) -> Option<PathBuf> {
    let missing = match std::env::var("PADDOCK_TEST_UPSTREAM_STACKS").ok().filter(|v| !v.is_empty()) {
        None => "PADDOCK_TEST_UPSTREAM_STACKS is not set (scripts/test fetches them and sets it)".to_owned(),
        Some(dir) => {
            let dir = PathBuf::from(dir);
            let absent = UPSTREAM
                .iter()
                .flat_map(|name| embedded_component(embedded, name).manifests)
                .map(|m| dir.join(&embedded.version).join(m.file))
                .find(|f| !f.is_file());
            match absent {
                None => return Some(dir),
                Some(f) => format!("{} is not there (scripts/stacks-fetch fills it)", f.display()),
            }
        }
    };
    assert!(!on_ci(), "the upstream stack manifests are missing: {missing} (CI=true)");
    eprintln!("SKIPPED: the upstream stack manifests are missing: {missing}");
    None
}

/// Where one test takes its files from, and its own API server.
struct World {
    server: ApiServer,
    /// The newest embedded definition (its pinned digests are the ones checked).
    embedded: StackDefinition,
    /// `PADDOCK_TEST_UPSTREAM_STACKS`.
    upstream: PathBuf,
    /// The shared Slinky CRDs.
    crds: PathBuf,
    /// This test's stacks directory.
    dir: StacksDir,
}

impl World {
    /// The files, then an API server named after `test`; None when a file source is missing.
    async fn new(test: &str) -> Option<Self> {
        let embedded = StackDefinition::embedded(latest_version()).expect("the embedded definition");
        let (Some(crds), Some(upstream)) = (slinky_crds_dir(), upstream_dir(&embedded)) else { return None };
        let server = support::dedicated(test, &[]).await?;
        let dir = StacksDir::new(test);
        Some(Self { server, embedded, upstream, crds, dir })
    }

    /// The embedded component `name`, its files copied into `<dir>/<version>/` from the fetched
    /// upstream files, or for `slinky-crds` from the shared CRDs; its pinned digests unchanged.
    fn copy(&self, version: &str, name: &str) -> StackComponent {
        let component = embedded_component(&self.embedded, name);
        for m in &component.manifests {
            let from = if name == "slinky-crds" {
                self.crds.join(Path::new(&m.file).file_name().expect("a file name"))
            } else {
                self.upstream.join(&self.embedded.version).join(&m.file)
            };
            let to = self.dir.root.join(version).join(&m.file);
            std::fs::create_dir_all(to.parent().expect("a parent")).expect("create the component dir");
            std::fs::copy(&from, &to).unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
        }
        component
    }

    /// Writes stack `version`: the Calico stand-in, the real files of [`UPSTREAM`] and Slinky's
    /// CRDs with the embedded definition's digests, then the operator stand-in with `operator_tag`.
    fn write_stack(&self, version: &str, operator_tag: &str) -> StackDefinition {
        let calico = StackComponent {
            name: "calico".to_owned(),
            version: "test".to_owned(),
            namespace: None,
            notes: None,
            manifests: vec![self.dir.write(version, "calico/standin.yaml", CALICO_STANDIN.as_bytes())],
            ready: vec![ReadinessRule::WorkloadsAvailable],
        };
        let mut components = vec![calico];
        components.extend(UPSTREAM.iter().chain(&["slinky-crds"]).map(|name| self.copy(version, name)));
        let standin = operator_standin(operator_tag);
        components.push(StackComponent {
            name: "slurm-operator".to_owned(),
            version: "test".to_owned(),
            namespace: Some(OPERATOR_NS.to_owned()),
            notes: None,
            manifests: vec![self.dir.write(version, "slurm-operator/standin.yaml", standin.as_bytes())],
            ready: vec![ReadinessRule::CrdsEstablished, ReadinessRule::WorkloadsAvailable],
        });
        StackDefinition {
            slurm: None,
            version: version.to_owned(),
            notes: Some("test stack: real upstream files and Slinky CRDs, stand-in Calico and operator".to_owned()),
            components,
        }
    }
}

/// A throw-away stacks directory (removed on drop).
struct StacksDir {
    root: PathBuf,
}

impl StacksDir {
    fn new(test: &str) -> Self {
        let id = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let root = std::env::temp_dir().join(format!("paddock-stacks-{test}-{id}"));
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
            go_module: None,
            sha256: Some(hex::encode(Sha256::digest(bytes))),
        }
    }
}

impl Drop for StacksDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The Calico stand-in: a DaemonSet named and placed as upstream's calico-node.
const CALICO_STANDIN: &str = "# STAND-IN for Calico (manifests/calico.yaml), which cannot be had here: a DaemonSet\n\
     # shaped like calico-node. Not the upstream file.\n\
     apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: calico-node\n  namespace: kube-system\n\
     spec:\n  selector:\n    matchLabels: {k8s-app: calico-node}\n  template:\n    metadata:\n\
     \x20     labels: {k8s-app: calico-node}\n    spec:\n      hostNetwork: true\n      containers:\n\
     \x20     - name: calico-node\n        image: example.invalid/standin/calico-node:v3.30.3\n";

/// The operator stand-in. Its objects name no namespace (as `helm template` output may not): they
/// go to the component's. It also brings a CRD of its own, listed AFTER an object of its kind,
/// to check that CRDs go first and that paddock waits for a just-applied kind to be served.
fn operator_standin(image_tag: &str) -> String {
    format!(
        "# STAND-IN for Slinky's slurm-operator (the rendered Helm chart), which cannot be had\n\
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
        g = WIDGET_GROUP
    )
}

/// The resourceVersion of every object of stack `definition` as written in `dir` (every document
/// of every file, and the component namespaces paddock adds), by `Kind namespace/name`.
async fn versions(client: &Client, dir: &StacksDir, definition: &StackDefinition) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for c in &definition.components {
        // (apiVersion, kind, namespace, name)
        let mut objects: Vec<(String, String, Option<String>, String)> = Vec::new();
        if let Some(ns) = &c.namespace {
            objects.push(("v1".to_owned(), "Namespace".to_owned(), None, ns.clone()));
        }
        for m in &c.manifests {
            let text = std::fs::read_to_string(dir.root.join(&definition.version).join(&m.file)).expect("read");
            for document in serde_yaml::Deserializer::from_str(&text) {
                let v = Value::deserialize(document).expect("YAML");
                let field = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_owned);
                if let (Some(api_version), Some(kind), Some(name)) =
                    (field("/apiVersion"), field("/kind"), field("/metadata/name"))
                {
                    objects.push((api_version, kind, field("/metadata/namespace"), name));
                }
            }
        }
        for (api_version, kind, ns, name) in objects {
            let gv: GroupVersion = api_version.parse().expect("an apiVersion");
            let gvk = GroupVersionKind::gvk(&gv.group, &gv.version, &kind);
            let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await.expect("a served kind");
            let (api, key): (Api<DynamicObject>, _) = match caps.scope {
                Scope::Namespaced => {
                    let ns = ns.or_else(|| c.namespace.clone()).unwrap_or_else(|| "default".to_owned());
                    (Api::namespaced_with(client.clone(), &ns, &resource), format!("{kind} {ns}/{name}"))
                }
                Scope::Cluster => (Api::all_with(client.clone(), &resource), format!("{kind} {name}")),
            };
            let object = api.get(&name).await.unwrap_or_else(|e| panic!("{key}: {e}"));
            out.insert(key, object.metadata.resource_version.expect("a resourceVersion"));
        }
    }
    out
}

fn widget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(WIDGET_GROUP, "v1", "Widget"), "widgets")
}

/// Plays the workload controllers (no kubelet or controller-manager workload controllers run in
/// the harness): writes the status of the real files' DaemonSet and Deployment, and with
/// `standins` of the Calico and operator stand-ins' workloads, as fully available.
async fn play_controllers(client: &Client, standins: bool) {
    let params = PatchParams::default();
    for (ns, name) in standins.then_some(CALICO_DS).into_iter().chain([DEVICE_PLUGIN_DS]) {
        let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
        let generation = daemonsets.get(name).await.expect("daemonset").metadata.generation;
        let status = json!({ "status": {
            "observedGeneration": generation, "desiredNumberScheduled": 2, "currentNumberScheduled": 2,
            "updatedNumberScheduled": 2, "numberReady": 2, "numberAvailable": 2, "numberMisscheduled": 0,
        }});
        daemonsets.patch_status(name, &params, &Patch::Merge(&status)).await.expect("daemonset status");
    }
    let deployments = [LOCAL_PATH_DEPLOYMENT].into_iter().chain(standins.then_some(OPERATOR_DEPLOYMENT));
    for (ns, name) in deployments {
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

/// Whether the Namespace `name` exists.
async fn namespace_exists(client: &Client, name: &str) -> bool {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.get_opt(name).await.expect("get a namespace").is_some()
}

#[tokio::test]
async fn a_stack_applies_in_order_becomes_ready_and_reapplying_changes_nothing() {
    let Some(w) = World::new("stack-apply").await else { return };
    let definition = w.write_stack("2026.1.0", "v1.2.1");
    let stack = KubeTenantStack::with_definition(w.dir.root.clone(), definition.clone()).expect("valid definition");
    stack.verify().expect("the files verify");
    let tenant = access(&w.server);
    let client = w.server.client().await;

    // First run: everything applied, nothing reported ready (no controller has run).
    let status = stack.ensure_stack(&tenant).await.expect("ensure the stack");
    assert_eq!(status.version, "2026.1.0");
    assert!(!status.ready, "{status:?}");
    for waiting in [
        "component calico: DaemonSet kube-system/calico-node",
        "component nvidia-device-plugin: DaemonSet kube-system/nvidia-device-plugin-daemonset",
        "component local-path-provisioner: Deployment local-path-storage/local-path-provisioner",
        "component slurm-operator: Deployment slinky/slurm-operator",
    ] {
        assert!(status.reason.contains(waiting), "{waiting} missing from: {}", status.reason);
    }
    assert!(!status.reason.contains("Established"), "the API server establishes CRDs: {}", status.reason);

    // The real Slinky CRDs are there and Established (by the API server itself, not played).
    for f in SLINKY_CRDS {
        let name = f.trim_start_matches("slinky.slurm.net_").trim_end_matches(".yaml");
        assert!(crd_established(&client, &format!("{name}.slinky.slurm.net")).await, "{name}");
    }
    // Every object of every file is there (`versions` reads each one back), RBAC included.
    let before = versions(&client, &w.dir, &definition).await;
    for key in [
        "ClusterRoleBinding local-path-provisioner-bind",
        "ServiceAccount local-path-storage/local-path-provisioner-service-account",
        "ClusterRole local-path-provisioner-role",
    ] {
        assert!(before.contains_key(key), "{key} missing from {:?}", before.keys());
    }
    // The upstream objects as they are, plus paddock's label: the device plugin's pinned image,
    // and the storage class the Slurm driver asks for.
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), DEVICE_PLUGIN_DS.0);
    let ds = daemonsets.get(DEVICE_PLUGIN_DS.1).await.expect("the device plugin's DaemonSet");
    let labels = ds.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(LABEL_STACK_COMPONENT).map(String::as_str), Some("nvidia-device-plugin"));
    let image = ds.spec.and_then(|s| s.template.spec).map(|s| s.containers[0].image.clone());
    assert_eq!(image.flatten().as_deref(), Some("nvcr.io/nvidia/k8s-device-plugin:v0.17.4"));
    let config: Api<ConfigMap> = Api::namespaced(client.clone(), LOCAL_PATH_DEPLOYMENT.0);
    let config = config.get("local-path-config").await.expect("local-path's ConfigMap");
    assert!(config.data.unwrap_or_default().contains_key("config.json"), "upstream data is kept");
    let sc: Api<StorageClass> = Api::all(client.clone());
    let sc = sc.get(DEFAULT_STORAGE_CLASS).await.expect("the storage class the Slurm driver uses");
    assert_eq!(sc.provisioner, "rancher.io/local-path");
    let labels = sc.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(LABEL_STACK_COMPONENT).map(String::as_str), Some("local-path-provisioner"));
    let managers = sc.metadata.managed_fields.unwrap_or_default();
    assert!(managers
        .iter()
        .any(|m| m.manager.as_deref() == Some("paddock") && m.operation.as_deref() == Some("Apply")));
    // The component namespace was created and received the objects that named none; the custom
    // object listed before its CRD was applied after it.
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), OPERATOR_NS, &widget_resource());
    let widget = widgets.get("default").await.expect("the Widget");
    assert_eq!(widget.data["spec"]["size"], 3);

    // Re-applying before anything moved changes nothing.
    let status = stack.ensure_stack(&tenant).await.expect("ensure again");
    assert!(!status.ready);
    assert_eq!(versions(&client, &w.dir, &definition).await, before, "a re-apply wrote something");

    // Plays the workload controllers: now the stack is ready.
    play_controllers(&client, true).await;
    let converged = versions(&client, &w.dir, &definition).await;
    let status = stack.ensure_stack(&tenant).await.expect("ensure once ready");
    assert_eq!((status.ready, status.reason.as_str(), status.version.as_str()), (true, "", "2026.1.0"));
    assert_eq!(
        versions(&client, &w.dir, &definition).await,
        converged,
        "re-applying a converged stack wrote something"
    );

    // A fresh driver (no cached client, as after a restart) converges to the same.
    let again = KubeTenantStack::with_definition(w.dir.root.clone(), definition.clone()).expect("valid");
    assert!(again.ensure_stack(&tenant).await.expect("ensure from a fresh driver").ready);
    assert_eq!(versions(&client, &w.dir, &definition).await, converged);
    support::delete(&w.server).await;
}

#[tokio::test]
async fn a_tampered_or_unpinned_manifest_is_refused_and_nothing_is_applied() {
    let Some(w) = World::new("stack-tampered").await else { return };
    let definition = w.write_stack("2026.1.0", "v1.2.1");
    let tenant = access(&w.server);
    let client = w.server.client().await;

    // Tamper with the LAST component's file: the earlier ones verify, and must not be applied
    // either (every file is checked before the first write).
    let path = w.dir.root.join("2026.1.0/slurm-operator/standin.yaml");
    let mut text = std::fs::read_to_string(&path).expect("read");
    text = text.replace("replicas: 1", "replicas: 50");
    std::fs::write(&path, &text).expect("tamper");
    let tampered = hex::encode(Sha256::digest(text.as_bytes()));
    let pinned = definition.components[4].manifests[0].sha256.clone().expect("pinned");

    let stack = KubeTenantStack::with_definition(w.dir.root.clone(), definition.clone()).expect("valid definition");
    let e = stack.ensure_stack(&tenant).await.expect_err("a tampered file is refused");
    assert_eq!(e.code, "stack_digest_mismatch");
    assert!(!e.is_transient());
    for part in ["2026.1.0/slurm-operator/standin.yaml", &pinned, &tampered] {
        assert!(e.message.contains(part), "{part} missing from: {}", e.message);
    }
    assert!(stack.verify().is_err());
    assert!(!namespace_exists(&client, LOCAL_PATH_DEPLOYMENT.0).await, "the first component was applied");
    let classes: Api<StorageClass> = Api::all(client.clone());
    assert!(classes.get_opt(DEFAULT_STORAGE_CLASS).await.expect("get").is_none());

    // A digest not pinned yet is refused as well, with the file's digest to review.
    let mut unpinned = definition;
    unpinned.components[4].manifests[0].sha256 = None;
    let stack = KubeTenantStack::with_definition(w.dir.root.clone(), unpinned).expect("valid definition");
    let e = stack.ensure_stack(&tenant).await.expect_err("an unpinned file is refused");
    assert_eq!(e.code, "stack_digest_unpinned");
    assert!(e.message.contains(&tampered), "{}", e.message);

    // A missing file (the provider did not fill the directory) too.
    std::fs::remove_file(&path).expect("remove");
    let e = KubeTenantStack::with_definition(w.dir.root.clone(), stack.definition().clone())
        .expect("valid")
        .ensure_stack(&tenant)
        .await
        .expect_err("a missing file is refused");
    assert_eq!(e.code, "stack_manifest_unreadable");
    assert!(!e.message.contains(w.dir.root.to_str().expect("utf-8")), "no server path: {}", e.message);
    assert!(!namespace_exists(&client, LOCAL_PATH_DEPLOYMENT.0).await);
    support::delete(&w.server).await;
}

#[tokio::test]
async fn an_upgrade_rewrites_only_the_changed_component() {
    let Some(w) = World::new("stack-upgrade").await else { return };
    let tenant = access(&w.server);
    let client = w.server.client().await;
    let v1 = w.write_stack("2026.1.0", "v1.2.1");
    let stack = KubeTenantStack::with_definition(w.dir.root.clone(), v1.clone()).expect("valid definition");
    stack.ensure_stack(&tenant).await.expect("apply v1");
    play_controllers(&client, true).await;
    assert!(stack.ensure_stack(&tenant).await.expect("v1 ready").ready);
    let before = versions(&client, &w.dir, &v1).await;

    // Version 2 differs only in the operator's image: the other components' files are the same
    // upstream files (same digests).
    let v2 = w.write_stack("2026.2.0", "v1.3.0");
    assert_eq!(v2.components[..4], v1.components[..4]);
    assert_ne!(v2.components[4], v1.components[4]);
    let stack = KubeTenantStack::with_definition(w.dir.root.clone(), v2.clone()).expect("valid definition");
    let status = stack.ensure_stack(&tenant).await.expect("apply v2");
    assert_eq!(status.version, "2026.2.0");
    // The new operator generation has not been rolled out by its (played) controller yet.
    assert!(!status.ready);
    assert!(status.reason.contains("slurm-operator") && status.reason.contains("not observed"), "{}", status.reason);

    let after = versions(&client, &w.dir, &v2).await;
    assert_eq!(after.len(), before.len());
    let changed: Vec<_> = after.iter().filter(|(k, v)| before.get(*k) != Some(*v)).map(|(k, _)| k.clone()).collect();
    assert_eq!(changed, ["Deployment slinky/slurm-operator"], "only the changed object may be rewritten");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), OPERATOR_NS);
    let d = deployments.get("slurm-operator").await.expect("operator");
    let image = d.spec.and_then(|s| s.template.spec).map(|s| s.containers[0].image.clone());
    assert_eq!(image.flatten().as_deref(), Some("example.invalid/standin/slurm-operator:v1.3.0"));

    play_controllers(&client, true).await;
    assert!(stack.ensure_stack(&tenant).await.expect("v2 ready").ready);
    support::delete(&w.server).await;
}

#[tokio::test]
async fn the_embedded_pins_accept_the_real_upstream_files_and_the_unpinned_ones_are_refused() {
    let Some(w) = World::new("stack-embedded").await else { return };
    let tenant = access(&w.server);
    let client = w.server.client().await;
    let version = w.embedded.version.clone();

    // The whole embedded stack, laid out as a provider would: the real upstream files, the real
    // Slinky CRDs and, for Calico and the operator (which cannot be had here), stand-ins. Those two
    // are not pinned, so no file of them could pass: the stack is refused as a whole, naming the
    // first such file and its digest for review, and nothing is applied.
    for name in UPSTREAM.iter().chain(&["slinky-crds"]) {
        w.copy(&version, name);
    }
    for (name, standin) in [("calico", CALICO_STANDIN.to_owned()), ("slurm-operator", operator_standin("1.2.1"))] {
        let component = embedded_component(&w.embedded, name);
        let unpinned = &component.manifests[0];
        assert_eq!(unpinned.sha256, None, "{version} pins {name} now: apply the whole stack here");
        w.dir.write(&version, &unpinned.file, standin.as_bytes());
    }
    let file = &embedded_component(&w.embedded, "calico").manifests[0].file;
    let standin = CALICO_STANDIN;
    let stack = KubeTenantStack::new(w.dir.root.clone(), version.clone()).expect("the embedded definition");
    let e = stack.ensure_stack(&tenant).await.expect_err("the unpinned operator is refused");
    assert_eq!(e.code, "stack_digest_unpinned");
    assert!(!e.is_transient());
    let digest = hex::encode(Sha256::digest(standin.as_bytes()));
    let reason =
        format!("stack manifest {version}/{file} (SHA-256 {digest}) has no digest pinned in the stack definition");
    assert_eq!(e.message, reason);
    assert!(
        !namespace_exists(&client, LOCAL_PATH_DEPLOYMENT.0).await,
        "a component was applied from a stack that does not verify"
    );

    // The embedded device plugin and local-path-provisioner components, straight from the
    // fetched directory: their pinned digests accept the real files, and the real API server
    // takes every object in them.
    let mut pinned = w.embedded.clone();
    pinned.components.retain(|c| UPSTREAM.contains(&c.name.as_str()));
    assert_eq!(pinned.components.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), UPSTREAM);
    let stack = KubeTenantStack::with_definition(w.upstream.clone(), pinned).expect("valid definition");
    stack.verify().expect("the embedded digests accept the fetched upstream files");
    let status = stack.ensure_stack(&tenant).await.expect("the real manifests apply");
    assert_eq!(status.version, version);
    assert!(!status.ready);
    for (ns, name) in [DEVICE_PLUGIN_DS, LOCAL_PATH_DEPLOYMENT] {
        assert!(status.reason.contains(&format!("{ns}/{name} not")), "{ns}/{name} missing from: {}", status.reason);
    }
    play_controllers(&client, false).await;
    let status = stack.ensure_stack(&tenant).await.expect("ensure once ready");
    assert_eq!((status.ready, status.reason.as_str()), (true, ""));
    support::delete(&w.server).await;
}
