//! `KubeTenantNodes` against a real API server playing the tenant cluster (the shared one, reached
//! through its admin kubeconfig as Kamaji's would be). The tests play the kubelet: they create
//! Node objects and write their status through the `/status` subresource.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus as KubeNodeStatus, NodeSystemInfo, Secret};
use k8s_openapi::chrono::{DateTime, Utc};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use kube::{Api, Client};
use paddock_domain::driver::{NodeRef, NodeStatus, Removal, TenantAccess, TenantNodes};
use paddock_domain::secret::SecretString;
use paddock_kube::nodes::{NodeLimits, ANNOTATION_TAINTS, LABEL_MACHINE_ID, LABEL_NODE_POOL, NODE_LEASE_NAMESPACE};
use paddock_kube::timeouts::Timeouts;
use paddock_kube::KubeTenantNodes;
use paddock_types::cluster::{Taint, TaintEffect};
use paddock_types::{MachineId, NodePoolId};
use serde_json::{json, Value};

use crate::support::{self, ApiServer};

/// The tenant cluster as the worker reaches it: the API server's admin kubeconfig.
pub(crate) fn access(server: &ApiServer) -> TenantAccess {
    let kubeconfig = std::fs::read_to_string(&server.kubeconfig).expect("read the harness kubeconfig");
    TenantAccess {
        cluster: support::cluster("nodes", "tenant"),
        endpoint: server.url.trim_start_matches("https://").to_owned(),
        admin_kubeconfig: SecretString::new(kubeconfig),
    }
}

fn taint(key: &str, value: &str, effect: TaintEffect) -> Taint {
    Taint { key: key.to_owned(), value: value.to_owned(), effect }
}

/// A machine of pool `gpu` with a fresh id, UUID and node name.
pub(crate) fn machine() -> NodeRef {
    let machine_id = MachineId::new();
    NodeRef {
        machine_id,
        node_pool_id: NodePoolId::new(),
        pool_name: "gpu".to_owned(),
        node_name: paddock_domain::driver::node_name(machine_id),
        system_uuid: uuid::Uuid::new_v4().to_string(),
        labels: BTreeMap::from([("example.com/team".to_owned(), "ml".to_owned())]),
        taints: vec![taint("example.com/gpu", "true", TaintEffect::NoSchedule)],
    }
}

/// Plays the kubelet: registers a Node named `name` reporting `system_uuid`, then its readiness.
pub(crate) async fn register(client: &Client, name: &str, system_uuid: &str, ready: bool) -> Node {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([("kubernetes.io/hostname".to_owned(), name.to_owned())])),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![k8s_openapi::api::core::v1::Taint {
                key: "example.com/kubelet".to_owned(),
                effect: "PreferNoSchedule".to_owned(),
                ..Default::default()
            }]),
            ..NodeSpec::default()
        }),
        ..Node::default()
    };
    nodes.create(&PostParams::default(), &node).await.expect("register the Node");
    set_ready(client, name, system_uuid, ready).await
}

async fn set_ready(client: &Client, name: &str, system_uuid: &str, ready: bool) -> Node {
    let nodes: Api<Node> = Api::all(client.clone());
    let status = KubeNodeStatus {
        node_info: Some(NodeSystemInfo {
            system_uuid: system_uuid.to_owned(),
            machine_id: "m".to_owned(),
            boot_id: "b".to_owned(),
            kernel_version: "6.8.0".to_owned(),
            os_image: "Ubuntu 24.04".to_owned(),
            container_runtime_version: "containerd://2.0.0".to_owned(),
            kubelet_version: "v1.34.1".to_owned(),
            kube_proxy_version: String::new(),
            operating_system: "linux".to_owned(),
            architecture: "amd64".to_owned(),
            ..NodeSystemInfo::default()
        }),
        conditions: Some(vec![NodeCondition {
            type_: "Ready".to_owned(),
            status: if ready { "True" } else { "False" }.to_owned(),
            reason: Some(if ready { "KubeletReady" } else { "KubeletNotReady" }.to_owned()),
            ..NodeCondition::default()
        }]),
        ..KubeNodeStatus::default()
    };
    let patch = json!({ "status": status });
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("write the Node's status")
}

fn taints_of(node: &Node) -> Vec<(String, Option<String>, String)> {
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    taints.into_iter().map(|t| (t.key, t.value, t.effect)).collect()
}

fn has_taint(node: &Node, key: &str, value: Option<&str>, effect: &str) -> bool {
    taints_of(node).iter().any(|(k, v, e)| k == key && v.as_deref() == value && e == effect)
}

#[tokio::test]
async fn join_config_mints_a_bootstrap_token_and_pins_the_ca() {
    let Some(server) = support::shared().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let m = machine();
    let nodes = KubeTenantNodes::new();
    let driver: &dyn TenantNodes = &nodes;

    let before = Utc::now();
    let config = driver.join_config(&tenant, &m, 3600).await.expect("join config").0;
    assert_eq!(config["api_server_endpoint"], json!(tenant.endpoint));
    assert_eq!(config["node_name"], json!(m.node_name));
    assert_eq!(config["cluster_id"], json!(tenant.cluster.cluster_id.to_string()));
    assert_eq!(
        config["node_labels"],
        json!({ "example.com/team": "ml", LABEL_NODE_POOL: "gpu", LABEL_MACHINE_ID: m.machine_id.to_string() })
    );
    assert_eq!(config["node_taints"], json!([{ "key": "example.com/gpu", "value": "true", "effect": "NoSchedule" }]));

    // The token: `<6 chars>.<16 chars>` of [a-z0-9].
    let token = config["token"].as_str().expect("token").to_owned();
    let (id, secret) = token.split_once('.').expect("id.secret");
    assert_eq!((id.len(), secret.len()), (6, 16), "{id}");
    assert!(token.bytes().all(|b| b == b'.' || b.is_ascii_lowercase() || b.is_ascii_digit()));

    // The Secret kubeadm's bootstrap authenticator reads.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    let stored = secrets.get(&format!("bootstrap-token-{id}")).await.expect("the token secret exists");
    assert_eq!(stored.type_.as_deref(), Some("bootstrap.kubernetes.io/token"));
    let data: BTreeMap<String, String> = stored
        .data
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8(v.0).expect("utf-8")))
        .collect();
    assert_eq!(data["token-id"], id);
    assert_eq!(data["token-secret"], secret);
    assert_eq!(data["usage-bootstrap-authentication"], "true");
    assert_eq!(data["usage-bootstrap-signing"], "true");
    assert_eq!(data["auth-extra-groups"], "system:bootstrappers:kubeadm:default-node-token");
    assert!(data["description"].contains(&m.machine_id.to_string()), "{}", data["description"]);
    let expiration: DateTime<Utc> = data["expiration"].parse().expect("RFC 3339 expiration");
    assert!(data["expiration"].ends_with('Z'), "{}", data["expiration"]);
    let ttl = (expiration - before).num_seconds();
    assert!((3598..=3620).contains(&ttl), "expires in {ttl} s");
    let labels = stored.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(LABEL_MACHINE_ID), Some(&m.machine_id.to_string()));

    // The CA pin equals an independent computation on the kubeconfig's CA (openssl).
    let kubeconfig = Kubeconfig::read_from(&server.kubeconfig).expect("kubeconfig");
    let ca_b64 = kubeconfig.clusters[0].cluster.as_ref().and_then(|c| c.certificate_authority_data.clone());
    let ca_pem = base64::engine::general_purpose::STANDARD.decode(ca_b64.expect("CA data")).expect("base64");
    let dir = std::env::temp_dir().join(format!("paddock-ca-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let ca_file = dir.join("ca.crt");
    std::fs::write(&ca_file, &ca_pem).expect("write CA");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl x509 -in '{}' -pubkey -noout | openssl pkey -pubin -outform der | sha256sum",
            ca_file.display()
        ))
        .output()
        .expect("run openssl");
    std::fs::remove_dir_all(&dir).ok();
    assert!(out.status.success(), "openssl: {}", String::from_utf8_lossy(&out.stderr));
    let expected = String::from_utf8(out.stdout).expect("utf-8");
    let expected = format!("sha256:{}", expected.split_whitespace().next().expect("hash"));
    assert_eq!(expected.len(), "sha256:".len() + 64, "{expected}");
    assert_eq!(config["ca_cert_hashes"], json!([expected]));

    // Each call mints a fresh token; the earlier one stays until it expires.
    let again = driver.join_config(&tenant, &m, 600).await.expect("join config again").0;
    let id2 = again["token"].as_str().and_then(|t| t.split_once('.')).map(|(i, _)| i.to_owned()).expect("token");
    assert_ne!(id2, id);
    assert!(secrets.get_opt(&format!("bootstrap-token-{id}")).await.expect("get").is_some());
    assert!(secrets.get_opt(&format!("bootstrap-token-{id2}")).await.expect("get").is_some());
    assert_eq!(again["ca_cert_hashes"], config["ca_cert_hashes"]);
}

#[tokio::test]
async fn node_is_found_by_system_uuid_and_gets_the_pool_labels_and_taints() {
    let Some(server) = support::shared().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let nodes_api: Api<Node> = Api::all(client.clone());
    let driver = KubeTenantNodes::new();
    let mut m = machine();

    // Not registered yet; another Node with another UUID is not it.
    assert_eq!(driver.node(&tenant, &m).await.expect("node"), None);
    let other = machine();
    register(&client, &other.node_name, &other.system_uuid, true).await;
    assert_eq!(driver.node(&tenant, &m).await.expect("node"), None);

    // The kubelet registers (under another name, and the UUID in upper case), not ready yet.
    let registered_name = format!("{}-host", m.node_name);
    register(&client, &registered_name, &m.system_uuid.to_uppercase(), false).await;
    let status = driver.node(&tenant, &m).await.expect("node");
    assert_eq!(status, Some(NodeStatus { name: registered_name.clone(), ready: false }));

    let node = nodes_api.get(&registered_name).await.expect("the Node");
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("example.com/team").map(String::as_str), Some("ml"));
    assert_eq!(labels.get(LABEL_NODE_POOL).map(String::as_str), Some("gpu"));
    assert_eq!(labels.get(LABEL_MACHINE_ID), Some(&m.machine_id.to_string()));
    assert_eq!(labels.get("kubernetes.io/hostname"), Some(&registered_name), "the kubelet's label stays");
    assert!(has_taint(&node, "example.com/gpu", Some("true"), "NoSchedule"), "{:?}", taints_of(&node));
    assert!(
        has_taint(&node, "example.com/kubelet", None, "PreferNoSchedule"),
        "not ours, kept: {:?}",
        taints_of(&node)
    );
    let managers: Vec<_> = node.metadata.managed_fields.iter().flatten().filter_map(|f| f.manager.clone()).collect();
    assert!(managers.iter().any(|m| m == "paddock"), "{managers:?}");

    // Ready once the kubelet says so; nothing is written when everything already holds.
    set_ready(&client, &registered_name, &m.system_uuid, true).await;
    let version = nodes_api.get(&registered_name).await.expect("the Node").metadata.resource_version;
    let status = driver.node(&tenant, &m).await.expect("node");
    assert_eq!(status, Some(NodeStatus { name: registered_name.clone(), ready: true }));
    let node = nodes_api.get(&registered_name).await.expect("the Node");
    assert_eq!(node.metadata.resource_version, version, "a converged Node is not written");

    // The pool changes: a label and a taint go, another taint comes; others' taints stay.
    m.labels.clear();
    m.taints = vec![taint("example.com/ib", "", TaintEffect::NoExecute)];
    driver.node(&tenant, &m).await.expect("node").expect("found");
    let node = nodes_api.get(&registered_name).await.expect("the Node");
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert!(!labels.contains_key("example.com/team"), "{labels:?}");
    assert_eq!(labels.get(LABEL_NODE_POOL).map(String::as_str), Some("gpu"));
    assert!(!has_taint(&node, "example.com/gpu", Some("true"), "NoSchedule"), "{:?}", taints_of(&node));
    assert!(has_taint(&node, "example.com/ib", None, "NoExecute"), "{:?}", taints_of(&node));
    assert!(has_taint(&node, "example.com/kubelet", None, "PreferNoSchedule"), "{:?}", taints_of(&node));
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get(ANNOTATION_TAINTS).map(String::as_str), Some("[\"example.com/ib:NoExecute\"]"));

    // Someone else changes the labels paddock set: the next look converges them back.
    let patch = json!({ "metadata": { "labels": { LABEL_NODE_POOL: "other" } } });
    nodes_api.patch(&registered_name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("tamper");
    driver.node(&tenant, &m).await.expect("node").expect("found");
    let node = nodes_api.get(&registered_name).await.expect("the Node");
    assert_eq!(node.metadata.labels.unwrap_or_default().get(LABEL_NODE_POOL).map(String::as_str), Some("gpu"));
}

#[tokio::test]
async fn remove_node_deletes_it_and_is_idempotent() {
    let Some(server) = support::shared().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let driver: &dyn TenantNodes = &KubeTenantNodes::new();
    let m = machine();
    register(&client, &m.node_name, &m.system_uuid, true).await;
    assert_eq!(
        driver.node(&tenant, &m).await.expect("node"),
        Some(NodeStatus { name: m.node_name.clone(), ready: true })
    );

    assert_eq!(driver.remove_node(&tenant, &m).await.expect("remove"), Removal::Gone);
    let nodes_api: Api<Node> = Api::all(client.clone());
    assert!(nodes_api.get_opt(&m.node_name).await.expect("get").is_none());
    assert_eq!(driver.node(&tenant, &m).await.expect("node"), None);
    assert_eq!(driver.remove_node(&tenant, &m).await.expect("remove again"), Removal::Gone);

    // A kubelet that registered under another name: found and removed by its system UUID.
    let m = machine();
    let host = format!("{}-host", m.node_name);
    register(&client, &host, &m.system_uuid.to_uppercase(), false).await;
    assert_eq!(driver.remove_node(&tenant, &m).await.expect("remove"), Removal::Gone);
    assert!(nodes_api.get_opt(&host).await.expect("get").is_none());

    // A Node held by a finalizer is Deleting until the finalizer goes.
    let m = machine();
    register(&client, &m.node_name, &m.system_uuid, true).await;
    let patch = json!({ "metadata": { "finalizers": ["example.com/hold"] } });
    nodes_api.patch(&m.node_name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("finalizer");
    assert_eq!(driver.remove_node(&tenant, &m).await.expect("remove"), Removal::Deleting);
    assert_eq!(driver.remove_node(&tenant, &m).await.expect("remove again"), Removal::Deleting);
    let patch = json!({ "metadata": { "finalizers": null } });
    nodes_api.patch(&m.node_name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("release");
    support::eventually(Duration::from_secs(30), "the Node to go", || async {
        (driver.remove_node(&tenant, &m).await.expect("remove") == Removal::Gone).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_broken_kubeconfig_is_a_permanent_error_that_quotes_nothing() {
    let Some(server) = support::shared().await else { return };
    let mut tenant = access(&server);
    let driver: &dyn TenantNodes = &KubeTenantNodes::new();
    let m = machine();
    tenant.admin_kubeconfig =
        SecretString::new(format!("users: [ {{ name: a, user: {{ token: {} }} }} ]\nclusters: 1", server.token));
    let err = driver.node(&tenant, &m).await.expect_err("unusable kubeconfig");
    assert_eq!((err.code.as_str(), err.is_transient()), ("tenant_kubeconfig_invalid", false), "{err:?}");
    assert!(!format!("{err:?} {err}").contains(&server.token), "{err:?}");

    // A kubeconfig without a CA cannot pin one for joining machines.
    let text = std::fs::read_to_string(&server.kubeconfig).expect("kubeconfig");
    let mut yaml: Value = serde_json::to_value(Kubeconfig::from_yaml(&text).expect("parse")).expect("json");
    yaml["clusters"][0]["cluster"]["certificate-authority-data"] = Value::Null;
    yaml["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = json!(true);
    tenant.admin_kubeconfig = SecretString::new(yaml.to_string());
    let err = driver.join_config(&tenant, &m, 60).await.expect_err("no CA");
    assert_eq!((err.code.as_str(), err.is_transient()), ("tenant_ca_invalid", false), "{err:?}");
    assert!(!format!("{err:?}").contains(&server.token), "{err:?}");

    // One that would run a program is refused before anything runs.
    yaml["users"][0]["user"]["exec"] = json!({ "apiVersion": "client.authentication.k8s.io/v1", "command": "false" });
    tenant.admin_kubeconfig = SecretString::new(yaml.to_string());
    let err = driver.node(&tenant, &m).await.expect_err("exec refused");
    assert_eq!((err.code.as_str(), err.is_transient()), ("tenant_kubeconfig_refused", false), "{err:?}");
}

#[tokio::test]
async fn a_machines_join_tokens_are_deleted_and_only_its_own() {
    let Some(server) = support::shared().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let driver: &dyn TenantNodes = &KubeTenantNodes::new();
    let (m, other) = (machine(), machine());
    let token_id = |c: &Value| c["token"].as_str().and_then(|t| t.split_once('.')).map(|(i, _)| i.to_owned());
    let first = token_id(&driver.join_config(&tenant, &m, 900).await.expect("join").0).expect("token");
    let second = token_id(&driver.join_config(&tenant, &m, 900).await.expect("join").0).expect("token");
    let others = token_id(&driver.join_config(&tenant, &other, 900).await.expect("join").0).expect("token");
    // A Secret of another type with the machine's label is not a token: left alone.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    let unrelated: Secret = serde_json::from_value(json!({
        "metadata": { "name": format!("unrelated-{}", m.machine_id), "labels": { LABEL_MACHINE_ID: m.machine_id.to_string() } },
        "stringData": { "k": "v" },
    }))
    .expect("secret");
    secrets.create(&PostParams::default(), &unrelated).await.expect("unrelated secret");

    driver.delete_join_tokens(&tenant, &m).await.expect("delete");
    for gone in [&first, &second] {
        assert!(secrets.get_opt(&format!("bootstrap-token-{gone}")).await.expect("get").is_none(), "{gone} left");
    }
    assert!(secrets.get_opt(&format!("bootstrap-token-{others}")).await.expect("get").is_some(), "another machine's");
    assert!(secrets.get_opt(&format!("unrelated-{}", m.machine_id)).await.expect("get").is_some());
    // Idempotent.
    driver.delete_join_tokens(&tenant, &m).await.expect("delete again");
}

#[tokio::test]
async fn abandoning_a_node_deletes_it_and_its_lease_without_waiting_for_finalizers() {
    let Some(server) = support::shared().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let driver: &dyn TenantNodes = &KubeTenantNodes::new();
    let m = machine();
    register(&client, &m.node_name, &m.system_uuid, true).await;
    let nodes_api: Api<Node> = Api::all(client.clone());
    let hold = json!({ "metadata": { "finalizers": ["example.com/hold"] } });
    nodes_api.patch(&m.node_name, &PatchParams::default(), &Patch::Merge(&hold)).await.expect("finalizer");
    let leases: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    let lease: Lease = serde_json::from_value(
        json!({ "metadata": { "name": m.node_name }, "spec": { "holderIdentity": m.node_name } }),
    )
    .expect("lease");
    leases.create(&PostParams::default(), &lease).await.expect("lease");

    driver.abandon_node(&tenant, &m).await.expect("abandon");
    let node = nodes_api.get(&m.node_name).await.expect("held by its finalizer");
    assert!(node.metadata.deletion_timestamp.is_some(), "the node was not deleted");
    assert!(leases.get_opt(&m.node_name).await.expect("get").is_none(), "the lease is left");
    // Again: nothing left to delete is no failure.
    driver.abandon_node(&tenant, &m).await.expect("abandon again");
    let release = json!({ "metadata": { "finalizers": null } });
    nodes_api.patch(&m.node_name, &PatchParams::default(), &Patch::Merge(&release)).await.expect("release");
}

/// A listener on loopback that accepts connections and never says a word (it holds them open).
async fn black_hole() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    (addr, task)
}

/// What a tenant (cluster-admin of its cluster) can do to slow paddock down: a validating webhook
/// on every Node write, served by `addr` (which never answers), so the API server holds each such
/// write for `timeout_seconds` and then (failurePolicy Ignore) lets it through.
async fn slow_node_webhook(client: &Client, addr: std::net::SocketAddr, timeout_seconds: i32) {
    let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let config: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": { "name": "slow-nodes" },
        "webhooks": [{
            "name": "slow-nodes.tenant.example.com",
            "clientConfig": { "url": format!("https://{addr}/validate") },
            "rules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE", "DELETE"],
                "resources": ["nodes", "nodes/status"], "scope": "Cluster"
            }],
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": timeout_seconds
        }]
    }))
    .expect("webhook configuration");
    webhooks.create(&PostParams::default(), &config).await.expect("register the webhook");
}

/// Fills the tenant cluster with `count` Nodes of no machine (the tenant may create any).
async fn fill_with_nodes(client: &Client, count: usize) {
    use futures::StreamExt;
    let nodes: Api<Node> = Api::all(client.clone());
    futures::stream::iter(0..count)
        .map(|i| {
            let nodes = nodes.clone();
            async move {
                let node = Node {
                    metadata: ObjectMeta { name: Some(format!("filler-{i:05}")), ..ObjectMeta::default() },
                    ..Node::default()
                };
                nodes.create(&PostParams::default(), &node).await.expect("a filler Node");
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
}

/// Page size of the tests below: thousands of Nodes make many pages.
const PAGE: u32 = 100;

#[tokio::test]
async fn thousands_of_nodes_and_a_slow_webhook_slow_the_driver_within_its_bounds() {
    let Some(server) = support::dedicated("nodes-thousands", &[]).await else { return };
    let client = server.client().await;
    fill_with_nodes(&client, 3_000).await;
    // The machine's Node registered under another name, last: only a full list finds it.
    let m = machine();
    register(&client, "registered-elsewhere", &m.system_uuid, true).await;
    let (addr, _hole) = black_hole().await;
    slow_node_webhook(&client, addr, 5).await;

    // Every page read, the Node found and converged: the webhook held the apply for its 5 s, and
    // the client's read timeout (longer than any webhook's) waited for it.
    let paged = KubeTenantNodes::with_limits(NodeLimits { page: PAGE, ..NodeLimits::default() });
    let found = paged.node(&access(&server), &m).await.expect("found through the pages");
    assert_eq!(found, Some(NodeStatus { name: "registered-elsewhere".to_owned(), ready: true }));
    let nodes: Api<Node> = Api::all(client.clone());
    let labels = nodes.get("registered-elsewhere").await.expect("the Node").metadata.labels.unwrap_or_default();
    assert_eq!(labels.get(LABEL_MACHINE_ID), Some(&m.machine_id.to_string()));

    // More Nodes than the driver reads: a transient error naming the limit, not a list held whole.
    let capped = KubeTenantNodes::with_limits(NodeLimits { page: PAGE, max_nodes: 1_000, ..NodeLimits::default() });
    let err = capped.node(&access(&server), &m).await.expect_err("over the limit");
    assert!(matches!(err, paddock_kube::KubeError::TooManyNodes { max: 1_000, .. }), "{err:?}");
    let err = paddock_domain::driver::DriverError::from(err);
    assert!(err.is_transient() && err.code == "tenant_nodes_over_limit", "{err:?}");

    // A read timeout shorter than the webhook's hold: the call fails (transient) instead of
    // holding the worker's slot for as long as the tenant's API server likes.
    let impatient = KubeTenantNodes::with_limits(NodeLimits {
        page: PAGE,
        timeouts: Timeouts { read: Duration::from_secs(1), ..Timeouts::default() },
        ..NodeLimits::default()
    });
    let other = machine();
    register(&client, &other.node_name, &other.system_uuid, true).await;
    let err = impatient.node(&access(&server), &other).await.expect_err("the apply outlasts the read timeout");
    let err = paddock_domain::driver::DriverError::from(err);
    assert!(err.is_transient(), "{err:?}");

    // An answer larger than the driver reads (a page of 500 Nodes is well over 64 KiB): the call
    // fails, transient, instead of the worker buffering whatever the tenant's server sends.
    let small =
        KubeTenantNodes::with_limits(NodeLimits { page: 500, max_response_bytes: 64 << 10, ..NodeLimits::default() });
    let err = small.node(&access(&server), &m).await.expect_err("a page over the size cap");
    let mut chain = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(e) = source {
        chain.push_str(&format!(": {e}"));
        source = e.source();
    }
    assert!(chain.contains("length limit exceeded"), "{chain}");
    assert!(paddock_domain::driver::DriverError::from(err).is_transient(), "{chain}");

    // Removal reads every page too, and gets the Node deleted through the webhook's hold.
    assert_eq!(paged.remove_node(&access(&server), &m).await.expect("removed"), Removal::Gone);
    assert!(nodes.get_opt("registered-elsewhere").await.expect("get").is_none());
    support::delete(&server).await;
}
