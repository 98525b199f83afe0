//! `KubeTenantStack` against real API servers playing the tenant cluster (reached through the admin
//! kubeconfig, as Kamaji's would be).
//!
//! The stacks are made of the **real upstream files** of the newest embedded definition (2026.12.0,
//! fully pinned): Calico's manifest, the NVIDIA device plugin, local-path-provisioner, Slinky's v1.2.1
//! CRDs and its operator chart rendered by the pinned Helm, as `scripts/test` fetched them into
//! `PADDOCK_TEST_UPSTREAM_STACKS` (`scripts/stacks-fetch`: from the shared upstream directory, or
//! GitHub, or the Go module proxy), checked against the digests the definition pins. The only
//! object of the tests' own is a "widgets" component (a CRD and an object of its kind, listed
//! before the CRD, in a file naming no namespace), which checks apply order and the wait for a
//! just-applied kind; the upgrade test's second version is the real operator file with only its
//! image tag changed, as a new operator release would be.
//!
//! Isolation: the real manifests have fixed names, many of them cluster-scoped (Calico's and
//! Slinky's CRDs, Namespace `local-path-storage`, ClusterRoles, StorageClass `local-path`) or in
//! `kube-system`, so tests applying them to one shared API server would meet. Each test therefore
//! has an API server of its own (`support::dedicated`, named after the test), deleted at its end.
//! The harness admits privileged pods (`--allow-privileged`, as a real cluster's API server does
//! for calico-node).
//!
//! What the tests play: no kubelet or workload controller runs on these API servers, so the tests
//! write the `status` of the real Deployments and DaemonSets (labelled "plays the controllers"
//! below). CRDs are established by the API server itself (its apiextensions controllers).

use std::collections::BTreeMap;
use std::path::PathBuf;

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
use paddock_testkit::skip;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::support::{self, ApiServer};

/// Slinky's CRDs (v1.2.1) and a few of Calico's, by name.
const SLINKY_CRDS: [&str; 6] = ["accountings", "controllers", "loginsets", "nodesets", "restapis", "tokens"];
const CALICO_CRDS: [&str; 3] = ["ippools", "felixconfigurations", "networkpolicies"];

/// The real files' workloads whose controllers the tests play, `(namespace, name)`.
const DAEMONSETS: [(&str, &str); 2] =
    [("kube-system", "calico-node"), ("kube-system", "nvidia-device-plugin-daemonset")];
const DEPLOYMENTS: [(&str, &str); 3] = [
    ("kube-system", "calico-kube-controllers"),
    ("local-path-storage", "local-path-provisioner"),
    ("slinky", "slurm-operator"),
];
const LOCAL_PATH_NS: &str = "local-path-storage";
const OPERATOR_FILE: &str = "slurm-operator/slurm-operator.yaml";

/// The tests' own component: its namespace (paddock creates it) and its CRD's API group.
const WIDGETS_NS: &str = "paddock-test-widgets";
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

/// The directory `scripts/test` filled with the real upstream files of the embedded definition
/// `embedded` (`PADDOCK_TEST_UPSTREAM_STACKS`, laid out as a stacks directory: `<version>/<file>`),
/// or None (the test is skipped: [`skip`]).
fn upstream_dir(embedded: &StackDefinition) -> Option<PathBuf> {
    let missing = match std::env::var("PADDOCK_TEST_UPSTREAM_STACKS").ok().filter(|v| !v.is_empty()) {
        None => "PADDOCK_TEST_UPSTREAM_STACKS is not set (scripts/test fetches them and sets it)".to_owned(),
        Some(dir) => {
            let dir = PathBuf::from(dir);
            let absent = embedded
                .components
                .iter()
                .flat_map(|c| &c.manifests)
                .map(|m| dir.join(&embedded.version).join(&m.file))
                .find(|f| !f.is_file());
            match absent {
                None => return Some(dir),
                Some(f) => format!("{} is not there (scripts/stacks-fetch fills it)", f.display()),
            }
        }
    };
    skip::skip(format_args!("the upstream stack manifests are missing: {missing}"));
    None
}

/// Where one test takes its files from, and its own API server.
struct World {
    server: ApiServer,
    /// The newest embedded definition (its pinned digests are the ones checked).
    embedded: StackDefinition,
    /// `PADDOCK_TEST_UPSTREAM_STACKS`.
    upstream: PathBuf,
    /// This test's stacks directory.
    dir: StacksDir,
}

impl World {
    /// The files, then an API server named after `test`; None when the files are missing.
    async fn new(test: &str) -> Option<Self> {
        let embedded = paddock_domain::stack::definition(latest_version()).expect("the embedded definition").clone();
        let upstream = upstream_dir(&embedded)?;
        let server = support::dedicated(test, &[]).await?;
        let dir = StacksDir::new(test);
        Some(Self { server, embedded, upstream, dir })
    }

    /// Writes stack `version` into this test's directory: every component of the embedded
    /// definition with its real files and pinned digests, the operator's image tag changed to
    /// `operator_tag` (with the digest of that file) unless it is the real one, then the tests'
    /// own widgets component.
    fn write_stack(&self, version: &str, operator_tag: &str) -> StackDefinition {
        let mut components = Vec::new();
        // The components of a Slurm cluster (the tests apply them as one's).
        for component in self.embedded.components.iter().filter(|c| c.applies_to("slurm")) {
            let mut component = component.clone();
            for m in &mut component.manifests {
                let from = self.upstream.join(&self.embedded.version).join(&m.file);
                let bytes = std::fs::read(&from).unwrap_or_else(|e| panic!("reading {}: {e}", from.display()));
                let real = "image: ghcr.io/slinkyproject/slurm-operator:1.2.1";
                if m.file == OPERATOR_FILE && operator_tag != "1.2.1" {
                    let text = String::from_utf8(bytes).expect("UTF-8");
                    assert!(text.contains(real), "the rendered chart runs {real}");
                    let retagged =
                        text.replace(real, &format!("image: ghcr.io/slinkyproject/slurm-operator:{operator_tag}"));
                    *m = self.dir.write(version, &m.file, retagged.as_bytes());
                } else {
                    self.dir.write(version, &m.file, &bytes);
                }
            }
            components.push(component);
        }
        components.push(StackComponent {
            name: "widgets".to_owned(),
            version: "test".to_owned(),
            namespace: Some(WIDGETS_NS.to_owned()),
            notes: None,
            kinds: Vec::new(),
            manifests: vec![self.dir.write(version, "widgets/widgets.yaml", widgets().as_bytes())],
            ready: vec![ReadinessRule::CrdsEstablished],
        });
        StackDefinition {
            slurm: self.embedded.slurm.clone(),
            ray: None,
            version: version.to_owned(),
            notes: Some("test stack: the real files of the newest embedded stack, and the tests' widgets".to_owned()),
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
            upstream: None,
            sha256: Some(hex::encode(Sha256::digest(bytes))),
        }
    }
}

impl Drop for StacksDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The tests' own component: a custom object listed BEFORE the CRD of its kind, in a file naming
/// no namespace (as `helm template` output may not): CRDs go first, paddock waits for the
/// just-applied kind to be served, and the object goes to the component's namespace.
fn widgets() -> String {
    format!(
        "# The paddock tests' own component (not an upstream file).\n\
         apiVersion: {g}/v1\nkind: Widget\nmetadata:\n  name: default\nspec:\n  size: 3\n---\n\
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

/// Plays the workload controllers (none runs on these API servers): writes the status of the real
/// files' DaemonSets and Deployments as fully available.
async fn play_controllers(client: &Client) {
    let params = PatchParams::default();
    for (ns, name) in DAEMONSETS {
        let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
        let generation = daemonsets.get(name).await.expect("daemonset").metadata.generation;
        let status = json!({ "status": {
            "observedGeneration": generation, "desiredNumberScheduled": 2, "currentNumberScheduled": 2,
            "updatedNumberScheduled": 2, "numberReady": 2, "numberAvailable": 2, "numberMisscheduled": 0,
        }});
        daemonsets.patch_status(name, &params, &Patch::Merge(&status)).await.expect("daemonset status");
    }
    for (ns, name) in DEPLOYMENTS {
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
    let definition = w.write_stack("2026.1.0", "1.2.1");
    let stack = KubeTenantStack::with_definitions(w.dir.root.clone(), [definition.clone()]).expect("valid definition");
    stack.verify("2026.1.0").expect("the files verify");
    let tenant = access(&w.server);
    let client = w.server.client().await;

    // First run: everything applied, nothing reported ready (no controller has run).
    let status = stack
        .ensure_stack(&tenant, "2026.1.0", paddock_types::cluster::ClusterKind::Slurm)
        .await
        .expect("ensure the stack");
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

    // The real Slinky and Calico CRDs are there and Established (by the API server itself).
    for name in SLINKY_CRDS
        .map(|n| format!("{n}.slinky.slurm.net"))
        .into_iter()
        .chain(CALICO_CRDS.map(|n| format!("{n}.crd.projectcalico.org")))
    {
        assert!(crd_established(&client, &name).await, "{name}");
    }
    // Every object of every file is there (`versions` reads each one back), RBAC included.
    let before = versions(&client, &w.dir, &definition).await;
    for key in [
        "ClusterRoleBinding local-path-provisioner-bind",
        "ServiceAccount local-path-storage/local-path-provisioner-service-account",
        "ClusterRole calico-node",
        "ServiceAccount slinky/slurm-operator",
        "ClusterRole slurm-operator",
    ] {
        assert!(before.contains_key(key), "{key} missing from {:?}", before.keys());
    }
    // The upstream objects as they are, plus paddock's label: the pinned images, calico-node as
    // privileged as upstream made it, and the storage class the Slurm driver asks for.
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let ds = daemonsets.get("nvidia-device-plugin-daemonset").await.expect("the device plugin's DaemonSet");
    let labels = ds.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(LABEL_STACK_COMPONENT).map(String::as_str), Some("nvidia-device-plugin"));
    let image = ds.spec.and_then(|s| s.template.spec).map(|s| s.containers[0].image.clone());
    assert_eq!(image.flatten().as_deref(), Some("nvcr.io/nvidia/k8s-device-plugin:v0.17.4"));
    let calico = daemonsets.get("calico-node").await.expect("calico-node");
    let pod = calico.spec.and_then(|s| s.template.spec).expect("a pod template");
    assert!(pod.containers[0].image.as_deref().is_some_and(|i| i.ends_with("calico/node:v3.30.3")), "{pod:?}");
    assert_eq!(pod.containers[0].security_context.as_ref().and_then(|c| c.privileged), Some(true));
    let operator: Api<Deployment> = Api::namespaced(client.clone(), "slinky");
    let operator = operator.get("slurm-operator").await.expect("the operator");
    let image = operator.spec.and_then(|s| s.template.spec).map(|s| s.containers[0].image.clone());
    assert_eq!(image.flatten().as_deref(), Some("ghcr.io/slinkyproject/slurm-operator:1.2.1"));
    let config: Api<ConfigMap> = Api::namespaced(client.clone(), LOCAL_PATH_NS);
    let config = config.get("local-path-config").await.expect("local-path's ConfigMap");
    assert!(config.data.unwrap_or_default().contains_key("config.json"), "upstream data is kept");
    let sc: Api<StorageClass> = Api::all(client.clone());
    let sc = sc.get(DEFAULT_STORAGE_CLASS).await.expect("the storage class the Slurm driver uses");
    assert_eq!(sc.provisioner, "rancher.io/local-path");
    let managers = sc.metadata.managed_fields.unwrap_or_default();
    assert!(managers
        .iter()
        .any(|m| m.manager.as_deref() == Some("paddock") && m.operation.as_deref() == Some("Apply")));
    // The component namespace was created and received the objects that named none; the custom
    // object listed before its CRD was applied after it.
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), WIDGETS_NS, &widget_resource());
    let widget = widgets.get("default").await.expect("the Widget");
    assert_eq!(widget.data["spec"]["size"], 3);

    // Re-applying before anything moved changes nothing.
    let status = stack
        .ensure_stack(&tenant, "2026.1.0", paddock_types::cluster::ClusterKind::Slurm)
        .await
        .expect("ensure again");
    assert!(!status.ready);
    assert_eq!(versions(&client, &w.dir, &definition).await, before, "a re-apply wrote something");

    // Plays the workload controllers: now the stack is ready.
    play_controllers(&client).await;
    let converged = versions(&client, &w.dir, &definition).await;
    let status = stack
        .ensure_stack(&tenant, "2026.1.0", paddock_types::cluster::ClusterKind::Slurm)
        .await
        .expect("ensure once ready");
    assert_eq!((status.ready, status.reason.as_str(), status.version.as_str()), (true, "", "2026.1.0"));
    assert_eq!(versions(&client, &w.dir, &definition).await, converged, "re-applying a converged stack wrote");

    // A fresh driver (no cached client, as after a restart) converges to the same.
    let again = KubeTenantStack::with_definitions(w.dir.root.clone(), [definition.clone()]).expect("valid");
    assert!(
        again
            .ensure_stack(&tenant, "2026.1.0", paddock_types::cluster::ClusterKind::Slurm)
            .await
            .expect("ensure from a fresh driver")
            .ready
    );
    assert_eq!(versions(&client, &w.dir, &definition).await, converged);
    support::delete(&w.server).await;
}

#[tokio::test]
async fn a_tampered_unpinned_or_unknown_stack_is_refused_and_nothing_is_applied() {
    let Some(w) = World::new("stack-tampered").await else { return };
    let definition = w.write_stack("2026.1.0", "1.2.1");
    let tenant = access(&w.server);
    let client = w.server.client().await;
    let operator = definition.components.iter().position(|c| c.name == "slurm-operator").expect("the operator");

    // Tamper with the operator's file (after Calico, the device plugin and the others): the
    // earlier ones verify, and must not be applied either (every file is checked first).
    let path = w.dir.root.join("2026.1.0").join(OPERATOR_FILE);
    let mut text = std::fs::read_to_string(&path).expect("read");
    text = text.replace("replicas: 1", "replicas: 50");
    std::fs::write(&path, &text).expect("tamper");
    let tampered = hex::encode(Sha256::digest(text.as_bytes()));
    let pinned = definition.components[operator].manifests[0].sha256.clone().expect("pinned");

    let stack = KubeTenantStack::with_definitions(w.dir.root.clone(), [definition.clone()]).expect("valid");
    let e = stack
        .ensure_stack(&tenant, "2026.1.0", paddock_types::cluster::ClusterKind::Slurm)
        .await
        .expect_err("a tampered file is refused");
    assert_eq!(e.code, "stack_digest_mismatch");
    assert!(!e.is_transient());
    for part in [&format!("2026.1.0/{OPERATOR_FILE}"), &pinned, &tampered] {
        assert!(e.message.contains(part.as_str()), "{part} missing from: {}", e.message);
    }
    assert!(stack.verify("2026.1.0").is_err());
    assert!(!namespace_exists(&client, LOCAL_PATH_NS).await, "an earlier component was applied");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    assert!(crds.get_opt("ippools.crd.projectcalico.org").await.expect("get").is_none(), "Calico was applied");

    // A digest not pinned yet is refused as well, with the file's digest to review.
    let mut unpinned = definition.clone();
    unpinned.components[operator].manifests[0].sha256 = None;
    let stack = KubeTenantStack::with_definitions(w.dir.root.clone(), [unpinned]).expect("valid");
    let e = stack
        .ensure_stack(&tenant, "2026.1.0", paddock_types::cluster::ClusterKind::Slurm)
        .await
        .expect_err("an unpinned file is refused");
    assert_eq!(e.code, "stack_digest_unpinned");
    assert!(e.message.contains(&tampered), "{}", e.message);

    // A missing file (the provider did not fill the directory) too.
    std::fs::remove_file(&path).expect("remove");
    let stack = KubeTenantStack::with_definitions(w.dir.root.clone(), [definition]).expect("valid");
    let e = stack
        .ensure_stack(&tenant, "2026.1.0", paddock_types::cluster::ClusterKind::Slurm)
        .await
        .expect_err("a missing file is refused");
    assert_eq!(e.code, "stack_manifest_unreadable");
    assert!(!e.message.contains(w.dir.root.to_str().expect("utf-8")), "no server path: {}", e.message);

    // And a stack version the driver does not have, naming the ones it has.
    let e = stack
        .ensure_stack(&tenant, "2026.9.0", paddock_types::cluster::ClusterKind::Slurm)
        .await
        .expect_err("an unknown stack is refused");
    assert_eq!((e.code.as_str(), e.is_transient()), ("stack_version_unknown", false));
    assert!(e.message.contains("2026.9.0") && e.message.contains("2026.1.0"), "{}", e.message);
    assert!(!namespace_exists(&client, LOCAL_PATH_NS).await);
    support::delete(&w.server).await;
}

#[tokio::test]
async fn an_upgrade_rewrites_only_the_changed_component() {
    let Some(w) = World::new("stack-upgrade").await else { return };
    let tenant = access(&w.server);
    let client = w.server.client().await;
    // Version 2 differs only in the operator's image (as a new operator release would): the other
    // components' files are the same upstream files (same digests). One driver has both.
    let v1 = w.write_stack("2026.1.0", "1.2.1");
    let v2 = w.write_stack("2026.2.0", "1.3.0");
    let operator = v1.components.iter().position(|c| c.name == "slurm-operator").expect("the operator");
    for (i, (a, b)) in v1.components.iter().zip(&v2.components).enumerate() {
        assert_eq!(a == b, i != operator, "component {}", a.name);
    }
    let stack = KubeTenantStack::with_definitions(w.dir.root.clone(), [v1.clone(), v2.clone()]).expect("valid");
    stack.ensure_stack(&tenant, "2026.1.0", paddock_types::cluster::ClusterKind::Slurm).await.expect("apply v1");
    play_controllers(&client).await;
    assert!(
        stack
            .ensure_stack(&tenant, "2026.1.0", paddock_types::cluster::ClusterKind::Slurm)
            .await
            .expect("v1 ready")
            .ready
    );
    let before = versions(&client, &w.dir, &v1).await;

    let status =
        stack.ensure_stack(&tenant, "2026.2.0", paddock_types::cluster::ClusterKind::Slurm).await.expect("apply v2");
    assert_eq!(status.version, "2026.2.0");
    // The new operator generation has not been rolled out by its (played) controller yet.
    assert!(!status.ready);
    assert!(status.reason.contains("slurm-operator") && status.reason.contains("not observed"), "{}", status.reason);

    let after = versions(&client, &w.dir, &v2).await;
    assert_eq!(after.len(), before.len());
    let changed: Vec<_> = after.iter().filter(|(k, v)| before.get(*k) != Some(*v)).map(|(k, _)| k.clone()).collect();
    assert_eq!(changed, ["Deployment slinky/slurm-operator"], "only the changed object may be rewritten");
    assert_eq!(status.changed, changed, "and the driver says which");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "slinky");
    let d = deployments.get("slurm-operator").await.expect("operator");
    let image = d.spec.and_then(|s| s.template.spec).map(|s| s.containers[0].image.clone());
    assert_eq!(image.flatten().as_deref(), Some("ghcr.io/slinkyproject/slurm-operator:1.3.0"));

    play_controllers(&client).await;
    assert!(
        stack
            .ensure_stack(&tenant, "2026.2.0", paddock_types::cluster::ClusterKind::Slurm)
            .await
            .expect("v2 ready")
            .ready
    );
    support::delete(&w.server).await;
}

#[tokio::test]
async fn the_embedded_stack_applies_from_the_fetched_upstream_files_and_becomes_ready() {
    let Some(w) = World::new("stack-embedded").await else { return };
    let tenant = access(&w.server);
    let client = w.server.client().await;
    let version = latest_version();

    // The driver paddock runs, straight on the fetched directory: the pinned digests accept the
    // real files, and the real API server takes every object in them.
    let stack = KubeTenantStack::new(w.upstream.clone());
    stack.verify(version).expect("the embedded digests accept the fetched upstream files");
    let status = stack
        .ensure_stack(&tenant, version, paddock_types::cluster::ClusterKind::Slurm)
        .await
        .expect("the real manifests apply");
    assert_eq!(status.version, version);
    assert!(!status.ready);
    for (ns, name) in DAEMONSETS.into_iter().chain(DEPLOYMENTS) {
        assert!(status.reason.contains(&format!("{ns}/{name} not")), "{ns}/{name} missing from: {}", status.reason);
    }
    play_controllers(&client).await;
    let status = stack
        .ensure_stack(&tenant, version, paddock_types::cluster::ClusterKind::Slurm)
        .await
        .expect("ensure once ready");
    assert_eq!((status.ready, status.reason.as_str()), (true, ""));
    assert!(status.changed.is_empty(), "a converged stack is only read: {:?}", status.changed);

    // Drift: the operator's image swapped by hand, Calico's node agent deleted. Both come back,
    // named; a label another manager put on the operator stays.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "slinky");
    let edit = PatchParams { field_manager: Some("someone-else".into()), ..PatchParams::default() };
    let swap = json!({ "metadata": { "labels": { "owner.example/team": "ops" } },
        "spec": { "template": { "spec": { "containers": [{ "name": "slurm-operator", "image": "example.invalid/evil:1" }] } } } });
    deployments.patch("slurm-operator", &edit, &Patch::Strategic(&swap)).await.expect("swap the image");
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    daemonsets.delete("calico-node", &Default::default()).await.expect("delete calico-node");
    let mut changed = stack
        .ensure_stack(&tenant, version, paddock_types::cluster::ClusterKind::Slurm)
        .await
        .expect("ensure after drift")
        .changed;
    changed.sort();
    assert_eq!(changed, ["DaemonSet kube-system/calico-node", "Deployment slinky/slurm-operator"]);
    let operator = deployments.get("slurm-operator").await.expect("operator");
    let image = operator.spec.as_ref().and_then(|s| s.template.spec.as_ref()).map(|s| s.containers[0].image.clone());
    assert_eq!(image.flatten().as_deref(), Some("ghcr.io/slinkyproject/slurm-operator:1.2.1"));
    let labels = operator.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("owner.example/team").map(String::as_str), Some("ops"));
    assert!(daemonsets.get_opt("calico-node").await.expect("get").is_some(), "calico-node is back");
    play_controllers(&client).await;
    let again =
        stack.ensure_stack(&tenant, version, paddock_types::cluster::ClusterKind::Slurm).await.expect("once more");
    assert!(again.changed.is_empty() && again.ready, "{again:?}");
    support::delete(&w.server).await;
}

/// The older stack (2026.11.0) pins the Slinky CRDs of the shared directory (`PADDOCK_SHARED`,
/// default `../shared` beside the repository), byte for byte; 2026.12.0's come from the v1.2.1
/// tarball, checked above with the other upstream files.
#[test]
fn the_pinned_slinky_crd_digests_match_the_shared_copies() {
    let shared = match std::env::var("PADDOCK_SHARED").ok().filter(|v| !v.is_empty()) {
        Some(s) => PathBuf::from(s),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
    };
    let dir = shared.join("crds/slinky");
    if !dir.is_dir() {
        skip::skip(format_args!("the Slinky CRDs are not in {}", dir.display()));
        return;
    }
    let d = StackDefinition::embedded("2026.11.0").expect("2026.11.0");
    let crds = d.components.iter().find(|c| c.name == "slinky-crds").expect("slinky-crds component");
    assert_eq!(crds.manifests.len(), 6);
    for m in &crds.manifests {
        let name = std::path::Path::new(&m.file).file_name().expect("file name");
        let bytes = std::fs::read(dir.join(name)).expect("read the shared copy");
        assert_eq!(m.sha256.as_deref(), Some(hex::encode(Sha256::digest(bytes)).as_str()), "{}", m.file);
    }
}
