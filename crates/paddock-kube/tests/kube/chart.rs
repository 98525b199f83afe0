//! The Helm chart (`deploy/helm/paddock`) against real API servers of the harness: its rendered
//! manifests are server-side applied with strict field validation (a schema error fails here),
//! the plain manifest `deploy/paddock.yaml` is the chart's rendering, `helm upgrade` and a
//! reinstall keep the generated keys (real `helm install`/`upgrade`/`uninstall` with `lookup`
//! against the API server), and the worker's roles are enough for the platform driver and the
//! Kamaji backend, run with a token of the chart's worker ServiceAccount, and no more: it creates
//! namespaces only as tenant clusters' and works only in those (through its RoleBinding in each),
//! so it reads no other Secret, deletes no other namespace, binds itself nowhere else and cannot
//! relabel a namespace to look like paddock's.
//!
//! Helm is `scripts/helm` (built once from the Go module proxy, cached; `.ci/run` builds it first).
//! The ServiceMonitor is rendered but not applied: the harness has no Prometheus Operator CRDs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::Scope;
use kube::{Api, Client};
use paddock_domain::driver::{ControlPlaneSpec, Removal, ServiceType};
use paddock_kube::{isolation, kamaji, KamajiBackend, KubePlatform};
use serde_json::{json, Value};

use crate::support::{self, ApiServer};

/// Where the full rendering goes (release `full`); the plain manifest has `paddock-system`.
const NAMESPACE: &str = "paddock-full";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn chart() -> String {
    repo().join("deploy/helm/paddock").display().to_string()
}

/// Runs `scripts/helm` with `args`; its standard output, or the test fails with its error.
fn helm(args: &[&str]) -> String {
    let out = Command::new(repo().join("scripts/helm")).args(args).output().expect("running scripts/helm");
    let stdout = String::from_utf8(out.stdout).expect("utf-8 output");
    assert!(out.status.success(), "helm {args:?} failed:\n{}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The documents of a multi-document YAML stream (empty ones dropped).
fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).expect("valid YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().expect("every document has a kind")
}

/// Server-side applies `doc` (forced, strict field validation), through discovery.
async fn apply(client: &Client, doc: &Value) {
    let (group, version) = match doc["apiVersion"].as_str().expect("apiVersion").split_once('/') {
        Some((g, v)) => (g.to_owned(), v.to_owned()),
        None => (String::new(), doc["apiVersion"].as_str().expect("apiVersion").to_owned()),
    };
    let gvk = GroupVersionKind::gvk(&group, &version, kind(doc));
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await.expect("the kind is served");
    let name = doc["metadata"]["name"].as_str().expect("name");
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => {
            let ns = doc["metadata"]["namespace"].as_str().expect("namespaced objects name their namespace");
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let params = PatchParams::apply("paddock-chart-test").force().validation_strict();
    api.patch(name, &params, &Patch::Apply(doc)).await.unwrap_or_else(|e| panic!("applying {} {name}: {e}", kind(doc)));
}

/// The chart rendered with every optional part on (what `helm template` gives a kubectl user).
fn render_everything() -> Vec<Value> {
    let yaml = helm(&[
        "template",
        "full",
        &chart(),
        "--namespace",
        NAMESPACE,
        "--set",
        "secrets.databaseUrl=postgres://paddock@db.example/paddock",
        "--set",
        "secrets.migrateDatabaseUrl=postgres://owner@db.example/paddock",
        "--set",
        "secrets.generateHs256Secret=true",
        "--set",
        "stacks.persistentVolumeClaim.claimName=paddock-stacks",
        "--set",
        "jwt.publicKeysSecret=paddock-jwt-keys",
        "--set",
        "agent.baseUrl=https://agent.paddock.example",
        "--set",
        "agent.ingress.enabled=true",
        "--set",
        "agent.service.type=LoadBalancer",
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "drivers.bmc=redfish",
        "--set",
        "images.wipeUrl=https://images.example/wipe.iso",
        "--set",
        "images.osUrl=https://images.example/os.img",
        "--set",
        "agent.seedBaseUrl=https://agent.paddock.example",
        "--set",
        "images.wipeSha256=0fe69a4d69d37826b61d5cf3668142a99abf86c090c214078aa9042b6d24937a",
        "--set",
        "images.osSha256=0fe69a4d69d37826b61d5cf3668142a99abf86c090c214078aa9042b6d24937a",
    ]);
    documents(&yaml)
}

#[test]
fn the_plain_manifest_is_the_chart_rendered() {
    let out = Command::new(repo().join("deploy/render")).arg("-").output().expect("running deploy/render");
    assert!(out.status.success(), "deploy/render failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let committed = std::fs::read_to_string(repo().join("deploy/paddock.yaml")).expect("deploy/paddock.yaml");
    assert!(
        String::from_utf8(out.stdout).expect("utf-8") == committed,
        "deploy/paddock.yaml is not what the chart renders: run deploy/render (never edit it by hand)"
    );
    // It takes an existing Secret only: rendering without a cluster cannot keep generated keys.
    let docs = documents(&committed);
    assert!(docs.iter().all(|d| kind(d) != "Secret"), "the plain manifest generates a Secret");
}

#[test]
fn helm_lint_passes() {
    let db = "secrets.databaseUrl=postgres://paddock@db.example/paddock";
    let (stacks, jwt) = ("stacks.persistentVolumeClaim.claimName=stacks", "jwt.jwksUrl=https://idp.example/jwks");
    helm(&["lint", "--strict", &chart(), "--set", db, "--set", stacks, "--set", jwt]);
    // A kubernetes driver without its stacks directory is refused, naming the setting.
    let out = Command::new(repo().join("scripts/helm"))
        .args(["template", "paddock", &chart(), "--set", db, "--set", jwt])
        .output()
        .expect("running scripts/helm");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("PADDOCK_STACKS_DIR"), "{out:?}");
}

/// The environment of every container of the Deployments and Jobs in `docs`, by object name.
fn container_envs(docs: &[Value]) -> Vec<(String, BTreeMap<String, Value>)> {
    let workloads = docs.iter().filter(|d| matches!(kind(d), "Deployment" | "Job"));
    workloads
        .map(|d| {
            let containers = d["spec"]["template"]["spec"]["containers"].as_array().expect("containers");
            let env = containers.iter().flat_map(|c| c["env"].as_array().cloned().unwrap_or_default());
            let env = env.map(|e| (e["name"].as_str().expect("name").to_owned(), e["value"].clone())).collect();
            (d["metadata"]["name"].as_str().expect("name").to_owned(), env)
        })
        .collect()
}

#[test]
fn every_process_verifies_the_database_tls_and_none_is_left_at_loopback_defaults() {
    let committed = std::fs::read_to_string(repo().join("deploy/paddock.yaml")).expect("deploy/paddock.yaml");
    let plain = container_envs(&documents(&committed));
    let everything = container_envs(&render_everything());
    assert_eq!(plain.len(), 3, "api, worker and the migration Job: {plain:?}");
    for (name, env) in plain.iter().chain(&everything) {
        assert_eq!(env.get("PGSSLMODE"), Some(&json!("verify-full")), "{name}: {env:?}");
        if name.ends_with("-api") || name.ends_with("-worker") {
            assert_eq!(env.get("PADDOCK_LISTEN"), Some(&json!("0.0.0.0:8080")), "{name}");
        }
    }
    for (name, env) in &everything {
        if name.ends_with("-worker") || name.ends_with("-api") {
            assert_eq!(env.get("PADDOCK_AGENT_BASE_URL"), Some(&json!("https://agent.paddock.example")), "{name}");
        }
    }
    // The CA of a private database is mounted where PGSSLROOTCERT says.
    let db = "secrets.databaseUrl=postgres://paddock@db.example/paddock";
    let stacks = "stacks.persistentVolumeClaim.claimName=stacks";
    let jwt = "jwt.jwksUrl=https://idp.example/jwks";
    let with_ca = helm(&[
        "template",
        "p",
        &chart(),
        "--set",
        db,
        "--set",
        stacks,
        "--set",
        jwt,
        "--set",
        "database.caSecret=pg-ca",
    ]);
    let docs = documents(&with_ca);
    for (name, env) in container_envs(&docs) {
        assert_eq!(env.get("PGSSLROOTCERT"), Some(&json!("/etc/paddock/database-ca/ca.crt")), "{name}");
    }
    assert_eq!(with_ca.matches("secretName: \"pg-ca\"").count(), 3, "the CA volume of api, worker and the Job");
    // Machines need a reachable agent URL, https unless insecureHttp: the chart refuses otherwise,
    // naming the setting.
    for (extra, named) in [
        ("drivers.bmc=simulated", "PADDOCK_AGENT_BASE_URL"),
        ("agent.baseUrl=http://agent.paddock.example", "PADDOCK_AGENT_BASE_URL"),
        ("database.sslMode=sometimes", "database.sslMode"),
    ] {
        let out = Command::new(repo().join("scripts/helm"))
            .args(["template", "p", &chart(), "--set", db, "--set", stacks, "--set", jwt, "--set", extra])
            .output()
            .expect("running scripts/helm");
        assert!(!out.status.success(), "{extra} renders");
        assert!(String::from_utf8_lossy(&out.stderr).contains(named), "{extra}: {out:?}");
    }
}

#[test]
fn the_agent_service_reaches_the_agent_listener_alone() {
    let committed = std::fs::read_to_string(repo().join("deploy/paddock.yaml")).expect("deploy/paddock.yaml");
    for docs in [documents(&committed), render_everything()] {
        let named = |k: &str, suffix: &str| {
            let found = docs
                .iter()
                .find(|d| kind(d) == k && d["metadata"]["name"].as_str().is_some_and(|n| n.ends_with(suffix)));
            found.unwrap_or_else(|| panic!("a {k} *{suffix}")).clone()
        };
        let service = named("Service", "-agent");
        assert_eq!(service["spec"]["ports"][0]["targetPort"], "agent", "{service}");
        let api = named("Deployment", "-api");
        let container = &api["spec"]["template"]["spec"]["containers"][0];
        let ports = container["ports"].as_array().expect("ports");
        assert!(ports.contains(&json!({ "name": "agent", "containerPort": 8081 })), "{ports:?}");
        let envs = container_envs(&docs);
        for (name, env) in envs.iter().filter(|(n, _)| !n.ends_with("-migrate")) {
            assert_eq!(env.get("PADDOCK_AGENT_LISTEN"), Some(&json!("0.0.0.0:8081")), "{name}");
        }
    }
    // Without the agent Service the machines reach the agents' routes on the API's listener.
    let db = "secrets.databaseUrl=postgres://paddock@db.example/paddock";
    let stacks = "stacks.persistentVolumeClaim.claimName=stacks";
    let jwt = "jwt.jwksUrl=https://idp.example/jwks";
    let off = helm(&[
        "template",
        "p",
        &chart(),
        "--set",
        db,
        "--set",
        stacks,
        "--set",
        jwt,
        "--set",
        "agent.service.enabled=false",
    ]);
    assert!(!off.contains("PADDOCK_AGENT_LISTEN"), "{off}");
    // A port another listener has is refused, naming the setting.
    let out = Command::new(repo().join("scripts/helm"))
        .args(["template", "p", &chart(), "--set", db, "--set", stacks, "--set", jwt, "--set", "agent.listenPort=9090"])
        .output()
        .expect("running scripts/helm");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("agent.listenPort"), "{out:?}");
}

#[tokio::test]
async fn the_rendered_chart_applies_and_its_worker_role_suffices_for_the_platform_drivers() {
    let docs = render_everything();
    let Some(crds) = support::kamaji_crds() else { return };
    let Some(server) = support::dedicated("chart-apply", &crds).await else { return };
    let admin = server.client().await;
    let kinds: BTreeMap<&str, usize> = docs.iter().fold(BTreeMap::new(), |mut m, d| {
        *m.entry(kind(d)).or_default() += 1;
        m
    });
    for (k, n) in [("Deployment", 2), ("PodDisruptionBudget", 2), ("Job", 1), ("Ingress", 1), ("ServiceMonitor", 1)] {
        assert_eq!(kinds.get(k), Some(&n), "{k} in the rendering: {kinds:?}");
    }

    // The plain manifest (with its Namespace), and the full rendering beside it.
    let plain = std::fs::read_to_string(repo().join("deploy/paddock.yaml")).expect("deploy/paddock.yaml");
    for doc in documents(&plain) {
        apply(&admin, &doc).await;
    }
    apply(&admin, &json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": NAMESPACE } })).await;
    for doc in docs.iter().filter(|d| kind(d) != "ServiceMonitor") {
        apply(&admin, doc).await;
    }

    // Beside the worker's: a namespace it did not make and kube-system, each with a Secret.
    apply(&admin, &json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": BYSTANDER } })).await;
    for ns in [BYSTANDER, "kube-system"] {
        let secret = json!({ "apiVersion": "v1", "kind": "Secret", "metadata": { "name": "s", "namespace": ns } });
        apply(&admin, &secret).await;
    }

    let worker = client_as(&server, &admin, "full-paddock-worker").await;
    let role = namespace_role(&docs);
    // Every claim is checked, and what fails is listed together at the end.
    let mut failures = Vec::new();
    if role.is_none() {
        failures.push("the worker is given no PADDOCK_KUBE_NAMESPACE_ROLE".to_owned());
    }
    let bind_as = role.clone().unwrap_or_else(|| "full-paddock-worker-namespace".to_owned());
    confined_outside_its_namespaces(&worker, &bind_as, &mut failures).await;
    run_platform_drivers(&admin, &worker, role.as_deref()).await;
    confined_inside_its_namespaces(&worker, &bind_as, role.as_deref(), &mut failures).await;

    // Nothing beyond: no pods, no ConfigMaps, no RBAC of its own.
    let forbidden = |r: Result<(), kube::Error>, what: &str| match r {
        Err(kube::Error::Api(status)) if status.code == 403 => {}
        other => panic!("{what} as the worker: expected 403, got {other:?}"),
    };
    let pods: Api<Pod> = Api::namespaced(worker.clone(), "kube-system");
    forbidden(pods.list(&ListParams::default()).await.map(drop), "listing pods");
    let maps: Api<ConfigMap> = Api::namespaced(worker.clone(), NAMESPACE);
    forbidden(maps.list(&ListParams::default()).await.map(drop), "listing ConfigMaps");
    let secrets: Api<Secret> = Api::namespaced(worker.clone(), NAMESPACE);
    forbidden(secrets.list(&ListParams::default()).await.map(drop), "listing Secrets");
    let roles: Api<ClusterRole> = Api::all(worker.clone());
    forbidden(
        roles.delete("full-paddock-worker", &DeleteParams::default()).await.map(drop),
        "deleting its ClusterRole",
    );
    // The API's account has no permission on the platform cluster at all.
    let api = client_as(&server, &admin, "full-paddock-api").await;
    let namespaces: Api<Namespace> = Api::all(api);
    forbidden(namespaces.get("default").await.map(drop), "reading a namespace as the API");
    support::delete(&server).await;
    assert!(failures.is_empty(), "the worker's token was not confined:\n{}", failures.join("\n"));
}

/// A namespace the worker did not make (no label).
const BYSTANDER: &str = "bystander";

/// The namespace role the chart gives the worker (its Deployment's PADDOCK_KUBE_NAMESPACE_ROLE).
fn namespace_role(docs: &[Value]) -> Option<String> {
    let envs = container_envs(docs);
    let (_, env) = envs.iter().find(|(name, _)| name == "full-paddock-worker").expect("the worker's Deployment");
    env.get("PADDOCK_KUBE_NAMESPACE_ROLE").map(|v| v.as_str().expect("a string").to_owned())
}

/// Adds `what` to `failures` unless `result` is the API server's 403.
fn refused<T: std::fmt::Debug>(failures: &mut Vec<String>, what: &str, result: Result<T, kube::Error>) {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 => {}
        other => failures.push(format!("{what}: expected 403, got {other:?}")),
    }
}

/// A RoleBinding in `namespace` of `role` to the ServiceAccount `account` of the release.
fn binding(namespace: &str, name: &str, kind: &str, role: &str, account: &str) -> RoleBinding {
    serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": namespace },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role },
        "subjects": [{ "kind": "ServiceAccount", "name": account, "namespace": NAMESPACE }],
    }))
    .expect("a RoleBinding")
}

/// A namespace labelled as tenant cluster `id`'s.
fn labelled_namespace(name: &str, id: &uuid::Uuid) -> Namespace {
    let labels = json!({ "app.kubernetes.io/managed-by": "paddock", "paddock.dev/cluster-id": id.to_string() });
    serde_json::from_value(json!({ "metadata": { "name": name, "labels": labels } })).expect("a Namespace")
}

/// Polls a dry run of `attempt` (nothing is stored) until the API server refuses it: admission
/// policies take effect a moment after they are created. False if it never did.
async fn enforced<T, F, Fut>(attempt: F) -> bool
where
    F: Fn(PostParams) -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let dry = PostParams { dry_run: true, ..PostParams::default() };
        if let Err(kube::Error::Api(status)) = attempt(dry).await {
            if status.code == 403 {
                return true;
            }
        }
        if std::time::Instant::now() > end {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Outside the tenant namespaces, the worker's token reads no Secret, deletes no namespace,
/// creates none but a tenant cluster's, binds itself nowhere and relabels nothing.
async fn confined_outside_its_namespaces(worker: &Client, role: &str, failures: &mut Vec<String>) {
    let namespaces: Api<Namespace> = Api::all(worker.clone());
    let post = PostParams::default();
    let into_kube_system = binding("kube-system", "paddock-worker", "ClusterRole", role, "full-paddock-worker");
    let system_bindings: Api<RoleBinding> = Api::namespaced(worker.clone(), "kube-system");
    let unlabelled = Namespace {
        metadata: ObjectMeta { name: Some(format!("pc-{}", uuid::Uuid::new_v4().simple())), ..ObjectMeta::default() },
        ..Namespace::default()
    };
    let (rb, ns_api) = (&system_bindings, &namespaces);
    let (into, fresh) = (&into_kube_system, &unlabelled);
    let policies = [
        ("binding", enforced(|dry| async move { rb.create(&dry, into).await }).await),
        ("namespace", enforced(|dry| async move { ns_api.create(&dry, fresh).await }).await),
    ];
    for (which, on) in policies {
        if !on {
            failures.push(format!("the {which} admission policy never refused the worker's dry run"));
        }
    }
    refused(failures, "binding itself in kube-system", system_bindings.create(&post, &into_kube_system).await);
    let bystander: Api<RoleBinding> = Api::namespaced(worker.clone(), BYSTANDER);
    let into_bystander = binding(BYSTANDER, "paddock-worker", "ClusterRole", role, "full-paddock-worker");
    refused(failures, "binding itself in a namespace it did not make", bystander.create(&post, &into_bystander).await);
    // Read after the attempts to bind: a binding let through would show here too.
    for ns in ["kube-system", BYSTANDER] {
        let secrets: Api<Secret> = Api::namespaced(worker.clone(), ns);
        refused(failures, &format!("reading a Secret in {ns}"), secrets.get("s").await);
    }
    refused(
        failures,
        "deleting a namespace it did not make",
        namespaces.delete(BYSTANDER, &DeleteParams::default()).await,
    );
    let id = uuid::Uuid::new_v4();
    let relabel = json!({ "metadata": { "labels": labelled_namespace("kube-system", &id).metadata.labels } });
    let patched = namespaces.patch("kube-system", &PatchParams::default(), &Patch::Merge(&relabel)).await;
    refused(failures, "relabelling kube-system as a tenant cluster's namespace", patched);
    refused(failures, "creating a namespace without paddock's labels", namespaces.create(&post, &unlabelled).await);
    let misnamed = labelled_namespace("kamaji-tenants", &id);
    refused(
        failures,
        "creating a namespace labelled as paddock's but not named pc-<id>",
        namespaces.create(&post, &misnamed).await,
    );
}

/// In a tenant namespace it made, the worker binds nothing but its own account to its namespace
/// role (`role`; `bound` is None when the chart gave it none).
async fn confined_inside_its_namespaces(worker: &Client, role: &str, bound: Option<&str>, failures: &mut Vec<String>) {
    let platform = KubePlatform::new(worker.clone(), isolation::IsolationSettings::default())
        .with_namespace_role(bound.map(str::to_owned));
    let cluster = support::cluster("chart", "confined");
    let ns = platform.ensure_isolation(&cluster).await.expect("isolation as the worker").namespace;
    let bindings: Api<RoleBinding> = Api::namespaced(worker.clone(), &ns);
    let post = PostParams::default();
    let admin = binding(&ns, "as-admin", "ClusterRole", "cluster-admin", "full-paddock-worker");
    refused(failures, "binding itself to cluster-admin in its namespace", bindings.create(&post, &admin).await);
    let other = binding(&ns, "other", "ClusterRole", role, "full-paddock-api");
    refused(failures, "binding another account in its namespace", bindings.create(&post, &other).await);
    assert_eq!(platform.remove_isolation(&cluster).await.expect("remove isolation"), Removal::Deleting);
}

/// A client holding a fresh token of the chart's ServiceAccount `account`, built from a kubeconfig
/// file as the worker would read PADDOCK_KUBECONFIG.
async fn client_as(server: &ApiServer, admin: &Client, account: &str) -> Client {
    let kubeconfig = support::service_account_kubeconfig(server, admin, NAMESPACE, account).await;
    let path = std::env::temp_dir().join(format!("paddock-chart-{account}-{}.kubeconfig", std::process::id()));
    std::fs::write(&path, kubeconfig).expect("write the kubeconfig");
    let platform = KubePlatform::connect(Some(&path)).await.expect("connect with the token kubeconfig");
    let client = platform.client().clone();
    std::fs::remove_file(&path).expect("remove the kubeconfig");
    client
}

/// What the worker does on the platform cluster, as the worker (bound in its namespaces to
/// `role`): isolation, the control plane (reading the admin kubeconfig Secret Kamaji writes,
/// played here by the admin), a lost binding made again, then removal until the namespace is gone.
async fn run_platform_drivers(admin: &Client, worker: &Client, role: Option<&str>) {
    let role = role.map(str::to_owned);
    let platform =
        KubePlatform::new(worker.clone(), isolation::IsolationSettings::default()).with_namespace_role(role.clone());
    let backend = KamajiBackend::new(worker.clone()).with_namespace_role(role.clone());
    let cluster = support::cluster("chart", "rbac");
    let isolated = platform.ensure_isolation(&cluster).await.expect("isolation as the worker");
    let ns = isolated.namespace;
    let binding = format!("RoleBinding {ns}/{}", isolation::WORKER_BINDING_NAME);
    assert_eq!(isolated.changed.contains(&binding), role.is_some(), "{:?}", isolated.changed);
    let again = platform.ensure_isolation(&cluster).await.expect("isolation again as the worker");
    assert!(again.changed.is_empty(), "a converged cluster changes nothing: {:?}", again.changed);
    let spec = ControlPlaneSpec {
        cluster: cluster.clone(),
        kubernetes_version: "v1.35.0".to_owned(),
        replicas: 2,
        service_type: ServiceType::LoadBalancer,
        datastore: None,
    };
    let status = backend.ensure_control_plane(&spec).await.expect("the control plane as the worker");
    assert!(!status.ready, "nothing plays Kamaji yet");

    // Kamaji names and writes the admin kubeconfig; the worker reads it.
    let name = kamaji::tenant_control_plane_name(cluster.cluster_id);
    let tcps: Api<DynamicObject> = Api::namespaced_with(admin.clone(), &ns, &kamaji::api_resource());
    let secret_name = format!("{name}-admin-kubeconfig");
    let status = json!({ "status": { "kubeconfig": { "admin": { "secretName": secret_name, "checksum": "c" } } } });
    tcps.patch_status(&name, &PatchParams::default(), &Patch::Merge(status)).await.expect("status");
    let secret = Secret {
        metadata: ObjectMeta { name: Some(secret_name), ..ObjectMeta::default() },
        data: Some([(kamaji::ADMIN_KUBECONFIG_KEY.to_owned(), ByteString(b"apiVersion: v1\n".to_vec()))].into()),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(admin.clone(), &ns).create(&PostParams::default(), &secret).await.expect("secret");
    backend.ensure_control_plane(&spec).await.expect("the control plane with its Secret, as the worker");

    if role.is_some() {
        // A binding lost (a run stopped between the namespace and its binding): made again.
        let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), &ns);
        bindings.delete(isolation::WORKER_BINDING_NAME, &DeleteParams::default()).await.expect("delete the binding");
        let restored = platform.ensure_isolation(&cluster).await.expect("isolation as the worker, unbound");
        assert!(restored.changed.contains(&binding), "{:?}", restored.changed);
    }

    // No Kamaji finalizer here: the object goes at once.
    assert_eq!(backend.delete_control_plane(&cluster).await.expect("delete the control plane"), Removal::Gone);
    assert_eq!(platform.remove_isolation(&cluster).await.expect("remove isolation"), Removal::Deleting);
    // The namespace goes (and the binding with it); both drivers then find nothing left.
    let deadline = std::time::Duration::from_secs(120);
    support::eventually(deadline, "the tenant namespace gone", || async {
        let removal = platform.remove_isolation(&cluster).await.expect("remove isolation until gone");
        (removal == Removal::Gone).then_some(())
    })
    .await;
    assert_eq!(backend.delete_control_plane(&cluster).await.expect("delete it again"), Removal::Gone);
}

/// `helm` against the API server, with its kubeconfig. No hooks: nothing runs the migration Job
/// here (no kubelet), and helm would wait for it.
fn helm_on(server: &ApiServer, args: &[&str]) -> String {
    let kubeconfig = server.kubeconfig.display().to_string();
    let mut all = args.to_vec();
    all.extend(["--kubeconfig", kubeconfig.as_str()]);
    helm(&all)
}

async fn keys(admin: &Client, namespace: &str, name: &str) -> BTreeMap<String, ByteString> {
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), namespace);
    secrets.get(name).await.expect("the keys Secret").data.expect("data")
}

#[tokio::test]
async fn helm_upgrade_and_a_reinstall_keep_the_generated_keys() {
    let Some(server) = support::shared().await else { return };
    let admin = server.client().await;
    let ns = format!("chart-keep-{}", std::process::id());
    let release = format!("keep{}", std::process::id());
    let chart = chart();
    let common = [
        "--namespace",
        ns.as_str(),
        "--no-hooks",
        "--set",
        "secrets.databaseUrl=postgres://paddock@db.example/paddock",
        "--set",
        "secrets.generateHs256Secret=true",
        "--set",
        "stacks.persistentVolumeClaim.claimName=stacks",
    ];
    let install = |extra: &[&str]| {
        let mut args = vec!["install", release.as_str(), chart.as_str(), "--create-namespace"];
        args.extend(common);
        args.extend(extra);
        helm_on(&server, &args)
    };
    install(&[]);
    let secret = format!("{release}-paddock-keys");
    let first = keys(&admin, &ns, &secret).await;
    assert_eq!(first["PADDOCK_ENCRYPTION_KEY"].0.len(), 44, "base64 of 32 bytes");
    assert!(first["PADDOCK_LEDGER_KEY"].0.len() >= 32);
    assert!(first["PADDOCK_USAGE_SIGNING_KEY"].0.starts_with(b"-----BEGIN PRIVATE KEY-----"), "a PKCS#8 PEM");
    assert!(first.contains_key("PADDOCK_JWT_HS256_SECRET"));

    // An upgrade that changes something else: the keys stay, the change lands.
    let mut upgrade = vec!["upgrade", release.as_str(), chart.as_str()];
    upgrade.extend(common);
    upgrade.extend(["--set", "api.replicas=3"]);
    helm_on(&server, &upgrade);
    assert_eq!(keys(&admin, &ns, &secret).await, first, "helm upgrade regenerated the keys");
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(admin.clone(), &ns);
    let api = deployments.get(&format!("{release}-paddock-api")).await.expect("the API Deployment");
    assert_eq!(api.spec.and_then(|s| s.replicas), Some(3));

    // Uninstalling keeps the Secret; installing again adopts it and keeps its keys.
    helm_on(&server, &["uninstall", release.as_str(), "--namespace", ns.as_str(), "--no-hooks"]);
    assert_eq!(keys(&admin, &ns, &secret).await, first, "helm uninstall removed the keys Secret");
    assert!(deployments.get_opt(&format!("{release}-paddock-api")).await.expect("get").is_none());
    install(&[]);
    assert_eq!(keys(&admin, &ns, &secret).await, first, "a reinstall regenerated the keys");

    helm_on(&server, &["uninstall", release.as_str(), "--namespace", ns.as_str(), "--no-hooks"]);
    let namespaces: Api<Namespace> = Api::all(admin);
    namespaces.delete(&ns, &DeleteParams::default()).await.expect("delete the namespace");
}
