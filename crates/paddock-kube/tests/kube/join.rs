//! A kubelet's TLS bootstrap, played step by step without a kubelet, against a harness API server
//! standing in for a Kamaji tenant control plane (the harness's `node-join` controllers; the API
//! server side, kubeadm's bootstrap RBAC and `cluster-info`, is on every harness API server), with
//! the bootstrap token and CA pin that paddock's `KubeTenantNodes::join_config` mints:
//!
//! 1. discovery as `kubeadm join --discovery-token-ca-cert-hash` does it: `cluster-info` read
//!    anonymously without trusting the server, its JWS for the token id checked (the
//!    bootstrapsigner controller wrote it), its CA checked against the pin;
//! 2. with the bootstrap token (bootstrap-token authentication, kubeadm's RBAC): a CSR for
//!    `system:node:<name>` of the `kubernetes.io/kube-apiserver-client-kubelet` signer, auto-approved
//!    (csrapproving) and signed (csrsigning);
//! 3. with the issued client certificate: the Node and its Lease (Node authorizer), nothing of
//!    another node's (NodeRestriction); the node-lifecycle controller lifts the not-ready taint of the
//!    Ready Node, and paddock finds it Ready by its systemUUID;
//! 4. an expired token is deleted (tokencleaner).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus as KubeNodeStatus, NodeSystemInfo, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::chrono::Utc;
use k8s_openapi::ByteString;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use paddock_kube::nodes::NODE_LEASE_NAMESPACE;
use paddock_kube::KubeTenantNodes;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::nodes::{access, machine};
use crate::support::{self, eventually, NOT_READY_TAINT};

/// The harness's controllers for a tenant control plane a real kubelet joins.
const NODE_JOIN: &[&str] = &["defaults", "node-join"];

/// Long enough for a controller under load (2 shared cores); a missing one fails here.
const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_kubelets_tls_bootstrap_with_paddocks_token_registers_its_node_and_only_its_own() {
    let Some(server) = support::dedicated_with("tls_bootstrap", &[], NODE_JOIN).await else { return };
    let tenant = access(&server);
    let m = machine();
    let driver = KubeTenantNodes::new();
    let config = driver.join_config(&tenant, &m, 3600).await.expect("join config").0;
    let token = config["token"].as_str().expect("token").to_owned();
    let pin = config["ca_cert_hash"].as_str().expect("CA pin").to_owned();
    let endpoint = format!("https://{}", config["api_server_endpoint"].as_str().expect("endpoint"));

    let (server_url, ca_pem) = discover(&endpoint, &token, &pin).await;
    let bootstrap = client(&server_url, &ca_pem, &format!("token: {token}")).await;
    let (cert_pem, key_pem) = bootstrap_certificate(&bootstrap, &token, &m.node_name).await;
    let user = format!(
        "client-certificate-data: {}\n    client-key-data: {}",
        STANDARD.encode(&cert_pem),
        STANDARD.encode(&key_pem)
    );
    let kubelet = client(&server_url, &ca_pem, &user).await;

    register(&kubelet, &m.node_name, &m.system_uuid).await;
    let other = format!("{}-other", m.node_name);
    let node = Node { metadata: ObjectMeta { name: Some(other.clone()), ..ObjectMeta::default() }, ..Node::default() };
    let refused = Api::<Node>::all(kubelet.clone()).create(&PostParams::default(), &node).await;
    assert!(matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403), "another node's Node: {refused:?}");
    let refused = Api::<Lease>::namespaced(kubelet.clone(), NODE_LEASE_NAMESPACE)
        .create(&PostParams::default(), &lease(&other))
        .await;
    assert!(matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403), "another node's Lease: {refused:?}");
    // Not even its own Node's taints (NodeRestriction): lifting not-ready is node-lifecycle's job.
    let patch = json!({ "spec": { "taints": [{ "key": "example.com/by-the-node", "effect": "NoSchedule" }] } });
    let refused =
        Api::<Node>::all(kubelet.clone()).patch(&m.node_name, &PatchParams::default(), &Patch::Merge(&patch)).await;
    assert!(matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403), "a node changing its taints: {refused:?}");

    let admin = server.client().await;
    let nodes: Api<Node> = Api::all(admin);
    eventually(WAIT, "the node-lifecycle controller lifting the not-ready taint", || async {
        let node = nodes.get(&m.node_name).await.expect("get the Node");
        let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        (!taints.iter().any(|t| t.key == NOT_READY_TAINT)).then_some(())
    })
    .await;
    let found = driver.node(&tenant, &m).await.expect("paddock looks the Node up").expect("found by its systemUUID");
    assert_eq!((found.name.as_str(), found.ready), (m.node_name.as_str(), true));
    support::delete(&server).await;
}

#[tokio::test]
async fn an_expired_join_token_is_deleted_by_the_token_cleaner() {
    let Some(server) = support::dedicated_with("token_cleaner", &[], NODE_JOIN).await else { return };
    let tenant = access(&server);
    let driver = KubeTenantNodes::new();
    let expiring = driver.join_config(&tenant, &machine(), 1).await.expect("join config").0;
    let lasting = driver.join_config(&tenant, &machine(), 3600).await.expect("join config").0;
    let secrets: Api<Secret> = Api::namespaced(server.client().await, "kube-system");
    let name = |config: &Value| {
        let token = config["token"].as_str().expect("token");
        format!("bootstrap-token-{}", token.split_once('.').expect("id.secret").0)
    };
    eventually(WAIT, "the token cleaner deleting the expired token", || async {
        secrets.get_opt(&name(&expiring)).await.expect("get the token").is_none().then_some(())
    })
    .await;
    assert!(secrets.get_opt(&name(&lasting)).await.expect("get the token").is_some(), "an unexpired token is kept");
    support::delete(&server).await;
}

/// kubeadm's token discovery: `cluster-info` fetched anonymously without trusting the server, its
/// JWS (HS256, keyed with the token's secret, `kid` the token id) checked, then the CA it carries
/// checked against the pin. Returns the server URL and CA (PEM) of its kubeconfig.
async fn discover(endpoint: &str, token: &str, pin: &str) -> (String, String) {
    let (token_id, token_secret) = token.split_once('.').expect("id.secret");
    let insecure = reqwest::Client::builder().danger_accept_invalid_certs(true).build().expect("client");
    let url = format!("{endpoint}/api/v1/namespaces/kube-public/configmaps/cluster-info");
    let jws_key = format!("jws-kubeconfig-{token_id}");
    let data = eventually(WAIT, "cluster-info signed for the token (bootstrapsigner)", || async {
        let rsp = insecure.get(&url).send().await.expect("GET cluster-info");
        assert!(rsp.status().is_success(), "anonymous GET cluster-info: {}", rsp.status());
        let cm: Value = rsp.json().await.expect("cluster-info JSON");
        cm["data"].get(&jws_key).is_some().then(|| cm["data"].clone())
    })
    .await;
    let content = data["kubeconfig"].as_str().expect("cluster-info kubeconfig");
    let jws = data[&jws_key].as_str().expect("JWS");
    let (header, signature) = jws.split_once("..").expect("a detached JWS: header..signature");
    let header_json: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).expect("base64url header")).expect("JWS header JSON");
    assert_eq!((header_json["alg"].as_str(), header_json["kid"].as_str()), (Some("HS256"), Some(token_id)));
    let signing_input = format!("{header}.{}", URL_SAFE_NO_PAD.encode(content));
    let expected = hmac_sha256(token_secret.as_bytes(), signing_input.as_bytes());
    assert_eq!(URL_SAFE_NO_PAD.encode(expected), signature, "the JWS of cluster-info is the token's");

    let kubeconfig = Kubeconfig::from_yaml(content).expect("cluster-info kubeconfig YAML");
    let cluster = kubeconfig.clusters[0].cluster.clone().expect("a cluster");
    let ca_pem = String::from_utf8(STANDARD.decode(cluster.certificate_authority_data.expect("CA")).expect("base64"))
        .expect("PEM");
    assert_eq!(spki_pin(&ca_pem), pin, "the CA of cluster-info matches paddock's pin");
    (cluster.server.expect("server"), ca_pem)
}

/// HMAC-SHA256 (RFC 2104) of `message` under `key` (shorter than SHA-256's 64-byte block).
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    block[..key.len()].copy_from_slice(key);
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new().chain_update(pad(0x36)).chain_update(message).finalize();
    Sha256::new().chain_update(pad(0x5c)).chain_update(inner).finalize().into()
}

/// kubeadm's CA pin of `ca_pem` computed apart from paddock: `sha256:` and the hex SHA-256 of the
/// certificate's SubjectPublicKeyInfo, by openssl.
fn spki_pin(ca_pem: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg("openssl x509 -pubkey -noout | openssl pkey -pubin -outform der | sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().expect("stdin").write_all(ca_pem.as_bytes())?;
            child.wait_with_output()
        })
        .expect("run openssl");
    assert!(out.status.success(), "openssl: {}", String::from_utf8_lossy(&out.stderr));
    format!("sha256:{}", String::from_utf8(out.stdout).expect("utf-8").split_whitespace().next().expect("hash"))
}

/// A client of `server_url` trusting `ca_pem`, authenticated by `user` (kubeconfig `user:` keys).
async fn client(server_url: &str, ca_pem: &str, user: &str) -> Client {
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: tenant\n  cluster:\n    server: {server_url}\n    \
         certificate-authority-data: {}\nusers:\n- name: node\n  user:\n    {user}\ncontexts:\n- name: node\n  \
         context:\n    cluster: tenant\n    user: node\ncurrent-context: node\n",
        STANDARD.encode(ca_pem)
    );
    let kubeconfig = Kubeconfig::from_yaml(&yaml).expect("kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.expect("config");
    Client::try_from(config).expect("client")
}

/// The kubelet's TLS bootstrap with the bootstrap token: a fresh key, a CSR for
/// `system:node:<node>` in `system:nodes`, approved and signed by the control plane's
/// controllers. Returns the issued certificate and the key (PEM).
async fn bootstrap_certificate(bootstrap: &Client, token: &str, node: &str) -> (String, String) {
    let dir = std::env::temp_dir().join(format!("paddock-tls-bootstrap-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (key_pem, csr_pem) = key_and_csr(&dir, &format!("system:node:{node}"));
    std::fs::remove_dir_all(&dir).ok();
    let csrs: Api<CertificateSigningRequest> = Api::all(bootstrap.clone());
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta { generate_name: Some("node-csr-".to_owned()), ..ObjectMeta::default() },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.into_bytes()),
            signer_name: "kubernetes.io/kube-apiserver-client-kubelet".to_owned(),
            usages: Some(vec!["digital signature".to_owned(), "client auth".to_owned()]),
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    };
    let created = csrs.create(&PostParams::default(), &csr).await.expect("the bootstrap token posts a CSR");
    let token_id = token.split_once('.').expect("id.secret").0;
    assert_eq!(created.spec.username.as_deref(), Some(format!("system:bootstrap:{token_id}").as_str()));
    let groups = created.spec.groups.clone().unwrap_or_default();
    assert!(groups.iter().any(|g| g == "system:bootstrappers:kubeadm:default-node-token"), "{groups:?}");
    let name = created.metadata.name.expect("CSR name");
    let status =
        || async { csrs.get(&name).await.expect("the bootstrap token reads its CSR").status.unwrap_or_default() };
    let approval = eventually(WAIT, "the CSR approved (csrapproving)", || async {
        status().await.conditions.unwrap_or_default().into_iter().find(|c| c.type_ == "Approved")
    })
    .await;
    assert_eq!((approval.status.as_str(), approval.reason.as_deref()), ("True", Some("AutoApproved")), "{approval:?}");
    let certificate =
        eventually(WAIT, "the approved CSR signed (csrsigning)", || async { status().await.certificate }).await;
    (String::from_utf8(certificate.0).expect("PEM certificate"), key_pem)
}

/// An ECDSA P-256 key (SEC1 PEM, as the kubelet writes it) and a CSR for CN `cn`, O `system:nodes`.
pub fn key_and_csr(dir: &Path, cn: &str) -> (String, String) {
    let (key, csr) = (dir.join("key.pem"), dir.join("csr.pem"));
    let script = format!(
        "openssl ecparam -name prime256v1 -genkey -noout -out '{}' && \
         openssl req -new -key '{}' -subj '/O=system:nodes/CN={cn}' -out '{}'",
        key.display(),
        key.display(),
        csr.display()
    );
    let out = Command::new("sh").arg("-c").arg(script).output().expect("run openssl");
    assert!(out.status.success(), "openssl: {}", String::from_utf8_lossy(&out.stderr));
    (std::fs::read_to_string(key).expect("key"), std::fs::read_to_string(csr).expect("CSR"))
}

/// What a kubelet does once it holds its certificate: creates its Node, reports it Ready with its
/// systemUUID, and creates its Lease.
async fn register(kubelet: &Client, name: &str, system_uuid: &str) {
    let nodes: Api<Node> = Api::all(kubelet.clone());
    let node =
        Node { metadata: ObjectMeta { name: Some(name.to_owned()), ..ObjectMeta::default() }, ..Node::default() };
    nodes.create(&PostParams::default(), &node).await.expect("the node creates its own Node");
    let status = KubeNodeStatus {
        node_info: Some(NodeSystemInfo {
            system_uuid: system_uuid.to_owned(),
            kubelet_version: "v1.35.4".to_owned(),
            operating_system: "linux".to_owned(),
            architecture: "amd64".to_owned(),
            ..NodeSystemInfo::default()
        }),
        conditions: Some(vec![NodeCondition {
            type_: "Ready".to_owned(),
            status: "True".to_owned(),
            reason: Some("KubeletReady".to_owned()),
            last_heartbeat_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Utc::now())),
            ..NodeCondition::default()
        }]),
        ..KubeNodeStatus::default()
    };
    let patch = json!({ "status": status });
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("the node reports Ready");
    Api::<Lease>::namespaced(kubelet.clone(), NODE_LEASE_NAMESPACE)
        .create(&PostParams::default(), &lease(name))
        .await
        .expect("the node creates its own Lease");
}

/// The heartbeat Lease of node `name`, renewed now.
fn lease(name: &str) -> Lease {
    Lease {
        metadata: ObjectMeta { name: Some(name.to_owned()), ..ObjectMeta::default() },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.to_owned()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(Utc::now())),
            ..LeaseSpec::default()
        }),
    }
}
