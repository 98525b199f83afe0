//! `KubeTenantNodes`: the [`TenantNodes`] driver on a tenant cluster's own API server (docs/security.md,
//! "Agent tokens", and docs/architecture.md), reached with the admin kubeconfig the control
//! plane backend wrote ([`TenantAccess::admin_kubeconfig`]).
//!
//! - Joining: a kubeadm bootstrap token (a `bootstrap.kubernetes.io/token` Secret
//!   `bootstrap-token-<id>` in `kube-system`, as `kubeadm token create` writes it) plus the CA pin
//!   (`sha256:` and the hex SHA-256 of the CA certificate's SubjectPublicKeyInfo, kubeadm's
//!   `--discovery-token-ca-cert-hash`). Every call mints a fresh token: tokens expire, and the
//!   tenant control plane's token cleaner deletes expired ones. Earlier tokens of the same machine
//!   are left alone, since the machine may still be booting with one of them; once its Node has
//!   registered, every token of the machine is deleted ([`KubeTenantNodes::delete_join_tokens`]).
//! - Matching: the Node whose `status.nodeInfo.systemUUID` is the machine's (case-insensitive:
//!   BMCs and kubelets disagree on case), whatever name it registered with.
//! - Converging: the Node's labels ([`node_labels`]) by server-side apply with the field manager
//!   [`MANAGER`]; labels paddock applied earlier and no longer wants are removed by the apply
//!   itself. `spec.taints` is an atomic list, owned as a whole by its last writer, so paddock
//!   rewrites it keeping every taint it does not manage (the node lifecycle controller's, ...)
//!   and records which taints it manages in the annotation [`ANNOTATION_TAINTS`]. Nothing is
//!   written when the Node already holds what it should.
//! - Draining (a release, before the power-off): every Node of the machine cordoned and its pods
//!   evicted, DaemonSet and mirror pods left ([`crate::drain`]).
//! - Removing (once the machine is off): every Node of the machine (its node name, or its system
//!   UUID), then the Lease of its node name and its kubelet's certificate signing requests (the
//!   cluster would keep approved ones for an hour); `Gone` once none is left. A forced release deletes
//!   them without waiting ([`KubeTenantNodes::abandon_node`]).
//! - A Node registered under the machine's node name with another machine's system UUID is
//!   reported ([`KubeTenantNodes::foreign_node`]): provisioning fails on it.
//!
//! The admin kubeconfig is data read from the platform cluster, not configuration: one that would
//! run a program (`exec`, `auth-provider`) or read local files is refused.
//!
//! Clients are cached per tenant cluster and rebuilt when the admin kubeconfig changes; the
//! kubeconfig itself is never logged, and errors never quote it. A cached client belongs to the
//! tokio runtime that built it: use one `KubeTenantNodes` per runtime.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::Mutex;

use base64::Engine;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::chrono::{Duration as ChronoDuration, SecondsFormat, Utc};
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use paddock_domain::driver::{Drain, JoinConfig, NodeRef, NodeStatus, RegisteredNode, Removal, TenantAccess};
use paddock_types::cluster::Taint;
use paddock_types::der;
use paddock_types::ClusterId;
use rand::Rng;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tracing::{debug, info, instrument};

use crate::csr;
use crate::isolation::MANAGER;
use crate::KubeError;

mod demand;
mod driver;

pub use demand::{demand_of, fits_pool, nodes_needed, pod_request, pool_labels, quantity, unschedulable, Request};

/// The label naming a Node's pool (its value is the pool's name; Slurm's NodeSet selects on it).
pub const LABEL_NODE_POOL: &str = "paddock.dev/node-pool";
/// The label naming the machine a Node runs on (its id).
pub const LABEL_MACHINE_ID: &str = "paddock.dev/machine-id";
/// The annotation listing the taints paddock manages on a Node (a JSON array of `key:effect`),
/// so that a taint dropped from the pool is removed and nobody else's taint is.
pub const ANNOTATION_TAINTS: &str = "paddock.dev/taints";
/// Where kubeadm's bootstrap tokens live.
pub const BOOTSTRAP_NAMESPACE: &str = "kube-system";
/// Where kubelets keep their heartbeat Leases (one per node, named after it).
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// The Secret type of a bootstrap token.
pub const BOOTSTRAP_TOKEN_TYPE: &str = "bootstrap.kubernetes.io/token";
/// The group kubeadm's node bootstrap RBAC is bound to.
pub const BOOTSTRAP_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";

/// The longest token lifetime paddock writes (a year): a longer TTL is a configuration mistake,
/// and capping keeps the expiration representable.
const MAX_TTL_SECONDS: u64 = 366 * 24 * 3600;

/// The alphabet of token ids and secrets (`[a-z0-9]`, as the bootstrap token format requires).
const TOKEN_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// The labels paddock puts on the Node of `node`: the pool's, its name and the machine id.
pub fn node_labels(node: &NodeRef) -> BTreeMap<String, String> {
    let mut labels = node.labels.clone();
    labels.insert(LABEL_NODE_POOL.to_owned(), node.pool_name.clone());
    labels.insert(LABEL_MACHINE_ID.to_owned(), node.machine_id.to_string());
    labels
}

/// A pool taint as the Kubernetes API spells it.
fn kube_taint(t: &Taint) -> k8s_openapi::api::core::v1::Taint {
    k8s_openapi::api::core::v1::Taint {
        key: t.key.clone(),
        value: (!t.value.is_empty()).then(|| t.value.clone()),
        effect: effect_str(t),
        time_added: None,
    }
}

fn effect_str(t: &Taint) -> String {
    // serde gives the variant name, which is the Kubernetes spelling.
    serde_json::to_value(t.effect).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// A taint's identity (Kubernetes allows one taint per key and effect).
fn taint_id(key: &str, effect: &str) -> String {
    format!("{key}:{effect}")
}

/// The taint list the Node should carry: its current taints in their order, paddock's replaced
/// by the pool's version or dropped when the pool no longer has them, then the pool's missing
/// ones. Taints paddock does not manage are kept as they are.
fn desired_taints(
    current: &[k8s_openapi::api::core::v1::Taint],
    managed_before: &BTreeSet<String>,
    pool: &[Taint],
) -> Vec<k8s_openapi::api::core::v1::Taint> {
    let wanted: Vec<_> = pool.iter().map(kube_taint).collect();
    let mut placed = BTreeSet::new();
    let mut out = Vec::new();
    for t in current {
        let id = taint_id(&t.key, &t.effect);
        if let Some(w) = wanted.iter().find(|w| taint_id(&w.key, &w.effect) == id) {
            if placed.insert(id) {
                // Keep a timeAdded the API server set; the rest is the pool's.
                out.push(k8s_openapi::api::core::v1::Taint { time_added: t.time_added.clone(), ..w.clone() });
            }
        } else if !managed_before.contains(&id) {
            out.push(t.clone());
        }
    }
    for w in wanted {
        if placed.insert(taint_id(&w.key, &w.effect)) {
            out.push(w);
        }
    }
    out
}

/// The label keys the field manager [`MANAGER`] owns on `node` (by server-side apply).
fn owned_label_keys(node: &Node) -> BTreeSet<String> {
    let entries = node.metadata.managed_fields.iter().flatten();
    entries
        .filter(|e| e.manager.as_deref() == Some(MANAGER) && e.operation.as_deref() == Some("Apply"))
        .filter_map(|e| e.fields_v1.as_ref())
        .filter_map(|f| f.0.get("f:metadata")?.get("f:labels")?.as_object().cloned())
        .flat_map(|labels| labels.into_iter().filter_map(|(k, _)| k.strip_prefix("f:").map(str::to_owned)))
        .collect()
}

fn managed_taints(node: &Node) -> BTreeSet<String> {
    let annotation = node.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_TAINTS));
    annotation.and_then(|a| serde_json::from_str::<BTreeSet<String>>(a).ok()).unwrap_or_default()
}

/// What paddock applies to a Node, or None when the Node already holds it.
pub(crate) fn node_patch(existing: &Node, node: &NodeRef) -> Option<Value> {
    let labels = node_labels(node);
    let current_labels = existing.metadata.labels.clone().unwrap_or_default();
    let labels_hold = labels.iter().all(|(k, v)| current_labels.get(k) == Some(v))
        && owned_label_keys(existing).iter().all(|k| labels.contains_key(k));

    let pool_ids: BTreeSet<String> = node.taints.iter().map(|t| taint_id(&t.key, &effect_str(t))).collect();
    let annotation = serde_json::to_string(&pool_ids).unwrap_or_default();
    let annotation_holds =
        existing.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_TAINTS)) == Some(&annotation);

    let current_taints = existing.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    let taints = desired_taints(&current_taints, &managed_taints(existing), &node.taints);
    let taints_hold = taints == current_taints;
    if labels_hold && annotation_holds && taints_hold {
        return None;
    }

    let mut body = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": existing.metadata.name,
            // Optimistic concurrency: the taint list was computed from this version; a concurrent
            // writer makes the apply a 409 (transient) instead of losing its taint.
            "resourceVersion": existing.metadata.resource_version,
            "labels": labels,
            "annotations": { ANNOTATION_TAINTS: annotation },
        },
    });
    // Always sent once there are taints: leaving the list out of an apply would drop it if
    // paddock is its only owner.
    if !taints.is_empty() || !current_taints.is_empty() {
        body["spec"] = json!({ "taints": taints });
    }
    Some(body)
}

pub(crate) fn is_ready(node: &Node) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.into_iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
}

/// When a Node that is not Ready left Ready (its `Ready` condition's last transition); `None` for
/// a Ready Node or one that never reported the condition.
fn not_ready_since(node: &Node) -> Option<k8s_openapi::chrono::DateTime<k8s_openapi::chrono::Utc>> {
    let conditions = node.status.as_ref()?.conditions.as_ref()?;
    let ready = conditions.iter().find(|c| c.type_ == "Ready")?;
    (ready.status != "True").then_some(())?;
    ready.last_transition_time.as_ref().map(|t| t.0)
}

fn system_uuid(node: &Node) -> Option<&str> {
    node.status.as_ref()?.node_info.as_ref().map(|i| i.system_uuid.as_str())
}

/// Whether `n` is one of the machine's Nodes: its node name, or its system UUID.
fn of_machine(n: &Node, node: &NodeRef) -> bool {
    let wanted = node.system_uuid.trim();
    n.metadata.name.as_deref() == Some(node.node_name.as_str())
        || system_uuid(n).is_some_and(|u| !wanted.is_empty() && u.trim().eq_ignore_ascii_case(wanted))
}

fn random_token_part(len: usize) -> String {
    let mut rng = rand::rng();
    (0..len).map(|_| char::from(TOKEN_ALPHABET[rng.random_range(0..TOKEN_ALPHABET.len())])).collect()
}

/// `der` as a PEM block with `label`, 64 characters a line.
fn pem(label: &str, der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = body.as_bytes().chunks(64).filter_map(|l| std::str::from_utf8(l).ok()).collect();
    format!("-----BEGIN {label}-----\n{}\n-----END {label}-----\n", lines.join("\n"))
}

/// `sha256:<hex>` of a CA certificate's SubjectPublicKeyInfo (kubeadm's CA pin).
pub fn ca_cert_hash(cert_der: &[u8]) -> Result<String, &'static str> {
    let spki = der::subject_public_key_info(cert_der)?;
    Ok(format!("sha256:{}", hex::encode(Sha256::digest(spki))))
}

/// Why a tenant's kubeconfig is refused, if it is: it is data from the platform cluster, so it
/// must not make paddock run programs or read paddock's own files.
fn refused(kubeconfig: &Kubeconfig) -> Option<&'static str> {
    for user in kubeconfig.auth_infos.iter().filter_map(|a| a.auth_info.as_ref()) {
        if user.exec.is_some() {
            return Some("users[].user.exec runs a program");
        }
        if user.auth_provider.is_some() {
            return Some("users[].user.auth-provider runs a plugin");
        }
        if user.token_file.is_some() || user.client_certificate.is_some() || user.client_key.is_some() {
            return Some("users[].user names a local file (tokenFile, client-certificate or client-key)");
        }
    }
    let clusters = kubeconfig.clusters.iter().filter_map(|c| c.cluster.as_ref());
    if clusters.into_iter().any(|c| c.certificate_authority.is_some()) {
        return Some("clusters[].cluster.certificate-authority names a local file");
    }
    None
}

/// The admin kubeconfig of a tenant cluster, parsed and checked ([`refused`]).
pub(crate) fn admin_kubeconfig(tenant: &TenantAccess) -> Result<Kubeconfig, KubeError> {
    let cluster_id = tenant.cluster.cluster_id;
    let parsed = Kubeconfig::from_yaml(tenant.admin_kubeconfig.expose())
        .map_err(|source| KubeError::TenantKubeconfig { cluster_id, source })?;
    if let Some(reason) = refused(&parsed) {
        return Err(KubeError::TenantKubeconfigRefused { cluster_id, reason });
    }
    Ok(parsed)
}

/// A client of the tenant cluster as its admin (the sealed kubeconfig paddock keeps).
pub(crate) async fn tenant_client(tenant: &TenantAccess) -> Result<Client, KubeError> {
    let (client, _) = admin_client(tenant.cluster.cluster_id, admin_kubeconfig(tenant)?).await?;
    Ok(client)
}

/// A client of a tenant cluster from its checked admin kubeconfig ([`admin_kubeconfig`]), and the
/// CA bundle it trusts (DER certificates, never empty: a tenant API server is always verified).
pub(crate) async fn admin_client(
    cluster_id: ClusterId,
    parsed: Kubeconfig,
) -> Result<(Client, Vec<Vec<u8>>), KubeError> {
    admin_client_within(cluster_id, parsed, NodeLimits::default()).await
}

/// [`admin_client`] with other limits (timeouts, answer size).
async fn admin_client_within(
    cluster_id: ClusterId,
    parsed: Kubeconfig,
    limits: NodeLimits,
) -> Result<(Client, Vec<Vec<u8>>), KubeError> {
    let bad = |source| KubeError::TenantKubeconfig { cluster_id, source };
    let mut config = Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default()).await.map_err(bad)?;
    limits.timeouts.apply(&mut config);
    let bundle = config.root_cert.clone().unwrap_or_default();
    if bundle.is_empty() {
        return Err(KubeError::TenantCa { cluster_id, reason: "no certificate-authority-data".to_owned() });
    }
    let client = crate::timeouts::bounded_client(config, limits.max_response_bytes)
        .map_err(|source| KubeError::Client { source: Box::new(source) })?;
    Ok((client, bundle))
}

/// A client for one tenant cluster, with what was derived from its kubeconfig.
#[derive(Clone)]
struct TenantClient {
    /// SHA-256 of the kubeconfig it was built from (to notice a rotated kubeconfig).
    fingerprint: [u8; 32],
    client: Client,
    /// The CA pins of the kubeconfig's CA bundle.
    ca_hashes: Vec<String>,
    /// The bundle itself, PEM (the joining machine verifies the API server with it).
    ca_pem: String,
}

/// How much of a tenant cluster the driver reads and waits for: the tenant is cluster-admin of
/// its cluster, so it decides how many Node objects there are and how slowly its API server
/// answers (an admission webhook may hold every write for up to 30 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeLimits {
    /// Nodes per page of a Node list (`limit` + `continue`): no answer holds the whole list.
    pub page: u32,
    /// The most Nodes read from one tenant cluster; past it the list fails (transient, the tenant
    /// may delete some) instead of growing the worker's memory with it.
    pub max_nodes: usize,
    /// The most running and pending pods read from one tenant cluster for the demand of its
    /// elastic pools; past it the read fails (transient).
    pub max_pods: usize,
    /// The client timeouts ([`crate::timeouts::Timeouts`]).
    pub timeouts: crate::timeouts::Timeouts,
    /// The largest answer read ([`crate::timeouts::MAX_TENANT_RESPONSE_BYTES`]).
    pub max_response_bytes: usize,
}

impl Default for NodeLimits {
    fn default() -> Self {
        Self {
            page: 500,
            max_nodes: 10_000,
            max_pods: 100_000,
            timeouts: crate::timeouts::Timeouts::default(),
            max_response_bytes: crate::timeouts::MAX_TENANT_RESPONSE_BYTES,
        }
    }
}

/// Tenant clusters' nodes, through their API servers.
#[derive(Default)]
pub struct KubeTenantNodes {
    clients: Mutex<HashMap<ClusterId, TenantClient>>,
    limits: NodeLimits,
}

impl Debug for KubeTenantNodes {
    // The clients hold credentials: show nothing of them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeTenantNodes").finish_non_exhaustive()
    }
}

impl KubeTenantNodes {
    /// A driver with an empty client cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// A driver with other [`NodeLimits`] (tests).
    pub fn with_limits(limits: NodeLimits) -> Self {
        Self { limits, ..Self::default() }
    }

    /// Every Node of the tenant cluster, page by page, at most [`NodeLimits::max_nodes`].
    async fn list_nodes(&self, cluster_id: ClusterId, nodes: &Api<Node>) -> Result<Vec<Node>, KubeError> {
        let limits = self.limits;
        let mut all = Vec::new();
        let mut params = ListParams::default().limit(limits.page);
        loop {
            let page = nodes.list(&params).await.map_err(|source| KubeError::api("list", "Node", "*", source))?;
            all.extend(page.items);
            if all.len() > limits.max_nodes {
                return Err(KubeError::TooManyNodes { cluster_id, max: limits.max_nodes });
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(all),
            }
        }
    }

    /// The (cached) client of the tenant cluster and its CA pins.
    async fn tenant(&self, tenant: &TenantAccess) -> Result<TenantClient, KubeError> {
        let cluster_id = tenant.cluster.cluster_id;
        let kubeconfig = tenant.admin_kubeconfig.expose();
        let fingerprint: [u8; 32] = Sha256::digest(kubeconfig.as_bytes()).into();
        if let Some(cached) = self.cache().get(&cluster_id).filter(|c| c.fingerprint == fingerprint) {
            return Ok(cached.clone());
        }
        let (client, bundle) = admin_client_within(cluster_id, admin_kubeconfig(tenant)?, self.limits).await?;
        let ca_err = |reason: &str| KubeError::TenantCa { cluster_id, reason: reason.to_owned() };
        let ca_hashes = bundle.iter().map(|c| ca_cert_hash(c)).collect::<Result<Vec<_>, _>>().map_err(ca_err)?;
        let ca_pem = bundle.iter().map(|c| pem("CERTIFICATE", c)).collect();
        let entry = TenantClient { fingerprint, client, ca_hashes, ca_pem };
        self.cache().insert(cluster_id, entry.clone());
        debug!(cluster.id = %cluster_id, "built a client for tenant cluster {cluster_id}");
        Ok(entry)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<ClusterId, TenantClient>> {
        // A panic while holding the lock cannot leave the map half-updated: recover it.
        self.clients.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Mints a bootstrap token for `node` valid for `ttl_seconds` and returns the join
    /// configuration (see the module documentation).
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id, machine.id = %node.machine_id))]
    pub async fn join_config(
        &self,
        tenant: &TenantAccess,
        node: &NodeRef,
        ttl_seconds: u64,
    ) -> Result<JoinConfig, KubeError> {
        let tc = self.tenant(tenant).await?;
        let secrets: Api<Secret> = Api::namespaced(tc.client.clone(), BOOTSTRAP_NAMESPACE);
        let ttl = ChronoDuration::seconds(i64::try_from(ttl_seconds.min(MAX_TTL_SECONDS)).unwrap_or_default());
        let expiration = (Utc::now() + ttl).to_rfc3339_opts(SecondsFormat::Secs, true);
        let (token_id, token_secret) = (random_token_part(6), random_token_part(16));
        let name = format!("bootstrap-token-{token_id}");
        let data: BTreeMap<String, String> = [
            ("token-id", token_id.as_str()),
            ("token-secret", token_secret.as_str()),
            ("usage-bootstrap-authentication", "true"),
            ("usage-bootstrap-signing", "true"),
            ("auth-extra-groups", BOOTSTRAP_GROUP),
            ("expiration", expiration.as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .chain([(
            "description".to_owned(),
            format!("paddock: joins machine {} as node {} (pool {})", node.machine_id, node.node_name, node.pool_name),
        )])
        .collect();
        let secret = Secret {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(BOOTSTRAP_NAMESPACE.to_owned()),
                labels: Some(BTreeMap::from([
                    (LABEL_MACHINE_ID.to_owned(), node.machine_id.to_string()),
                    (LABEL_NODE_POOL.to_owned(), node.pool_name.clone()),
                    ("app.kubernetes.io/managed-by".to_owned(), MANAGER.to_owned()),
                ])),
                ..Default::default()
            },
            type_: Some(BOOTSTRAP_TOKEN_TYPE.to_owned()),
            data: Some(data.into_iter().map(|(k, v)| (k, ByteString(v.into_bytes()))).collect()),
            ..Default::default()
        };
        // A create, not an apply: the name is fresh, and a clash with an existing token id (1 in
        // 36^6) is a 409, which is transient: the next call draws another id.
        let params = PostParams { field_manager: Some(MANAGER.to_owned()), ..PostParams::default() };
        secrets
            .create(&params, &secret)
            .await
            .map_err(|source| KubeError::api("create", "Secret", format!("{BOOTSTRAP_NAMESPACE}/{name}"), source))?;
        // The token id is the public half (it names the Secret); the secret half is never logged.
        info!(
            node.name = %node.node_name,
            "created bootstrap token {token_id} for machine {} in tenant cluster {}, expiring {expiration}",
            node.machine_id,
            tenant.cluster.cluster_id
        );

        let taints: Vec<Value> =
            node.taints.iter().map(|t| json!({ "key": t.key, "value": t.value, "effect": effect_str(t) })).collect();
        // The agent contract's keys (docs/security.md) first, then the kubeadm-style ones.
        Ok(JoinConfig(json!({
            "api_endpoint": tenant.endpoint,
            "ca_cert": tc.ca_pem,
            "ca_cert_hash": tc.ca_hashes.first(),
            "bootstrap_token": format!("{token_id}.{token_secret}"),
            "api_server_endpoint": tenant.endpoint,
            "token": format!("{token_id}.{token_secret}"),
            "ca_cert_hashes": tc.ca_hashes,
            "node_name": node.node_name,
            "node_labels": node_labels(node),
            "node_taints": taints,
            "cluster_id": tenant.cluster.cluster_id.to_string(),
        })))
    }

    /// The Node of the machine (by system UUID), its labels and taints converged first.
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id, machine.id = %node.machine_id))]
    pub async fn node(&self, tenant: &TenantAccess, node: &NodeRef) -> Result<Option<NodeStatus>, KubeError> {
        let tc = self.tenant(tenant).await?;
        let nodes: Api<Node> = Api::all(tc.client.clone());
        let list = self.list_nodes(tenant.cluster.cluster_id, &nodes).await?;
        let wanted = node.system_uuid.trim();
        let mut matching: Vec<Node> = list
            .into_iter()
            .filter(|n| system_uuid(n).is_some_and(|u| u.trim().eq_ignore_ascii_case(wanted)))
            .collect();
        // Two Nodes with one system UUID: a stale registration beside the current one. Prefer the
        // expected name, then the newest.
        matching.sort_by_key(|n| {
            (
                n.metadata.name.as_deref() != Some(node.node_name.as_str()),
                std::cmp::Reverse(n.metadata.creation_timestamp.clone()),
            )
        });
        let Some(found) = matching.into_iter().next() else {
            return Ok(None);
        };
        let name = found.metadata.name.clone().unwrap_or_default();
        let mut ready = is_ready(&found);
        if let Some(body) = node_patch(&found, node) {
            let params = PatchParams::apply(MANAGER).force();
            let applied = nodes
                .patch(&name, &params, &Patch::Apply(&body))
                .await
                .map_err(|source| KubeError::api("apply", "Node", name.as_str(), source))?;
            ready = is_ready(&applied);
            info!(node.name = %name, "converged labels and taints of node {name} (machine {})", node.machine_id);
        }
        Ok(Some(NodeStatus { name, ready }))
    }

    /// Every registered Node with its system UUID and readiness.
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id))]
    pub async fn registered_nodes(&self, tenant: &TenantAccess) -> Result<Vec<RegisteredNode>, KubeError> {
        let tc = self.tenant(tenant).await?;
        let nodes: Api<Node> = Api::all(tc.client.clone());
        let list = self.list_nodes(tenant.cluster.cluster_id, &nodes).await?;
        Ok(list
            .iter()
            .map(|n| RegisteredNode {
                name: n.metadata.name.clone().unwrap_or_default(),
                system_uuid: system_uuid(n).unwrap_or_default().trim().to_owned(),
                ready: is_ready(n),
                not_ready_since: not_ready_since(n),
            })
            .collect())
    }

    /// One round of the drain of the machine's Nodes ([`crate::drain`]): `Drained` once every
    /// one is cordoned and holds no evictable pod.
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id, machine.id = %node.machine_id))]
    pub async fn drain_node(&self, tenant: &TenantAccess, node: &NodeRef) -> Result<Drain, KubeError> {
        let tc = self.tenant(tenant).await?;
        let nodes: Api<Node> = Api::all(tc.client.clone());
        let list = self.list_nodes(tenant.cluster.cluster_id, &nodes).await?;
        let (mut leaving, mut blocked) = (0, 0);
        for name in list.iter().filter(|n| of_machine(n, node)).filter_map(|n| n.metadata.name.as_deref()) {
            if let Drain::Draining { leaving: l, blocked: b } = crate::drain::drain(&tc.client, name).await? {
                (leaving, blocked) = (leaving + l, blocked + b);
            }
        }
        Ok(if leaving == 0 && blocked == 0 { Drain::Drained } else { Drain::Draining { leaving, blocked } })
    }

    /// The system UUID of the Node registered under the machine's node name when it is not the
    /// machine's (an empty one, not reported yet, is none).
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id, machine.id = %node.machine_id))]
    pub async fn foreign_node(&self, tenant: &TenantAccess, node: &NodeRef) -> Result<Option<String>, KubeError> {
        let tc = self.tenant(tenant).await?;
        let nodes: Api<Node> = Api::all(tc.client.clone());
        let name = node.node_name.as_str();
        let found = nodes.get_opt(name).await.map_err(|source| KubeError::api("get", "Node", name, source))?;
        let uuid = found.as_ref().and_then(system_uuid).map(str::trim).unwrap_or_default();
        let foreign = !uuid.is_empty() && !uuid.eq_ignore_ascii_case(node.system_uuid.trim());
        Ok(foreign.then(|| uuid.to_owned()))
    }

    /// Deletes the machine's Nodes: the one with its node name and any with its system UUID (a
    /// kubelet that registered under another name), then, once none is left, the Lease of its
    /// node name. `Gone` once all are gone.
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id, machine.id = %node.machine_id))]
    pub async fn remove_node(&self, tenant: &TenantAccess, node: &NodeRef) -> Result<Removal, KubeError> {
        let removal = self.delete_nodes(tenant, node).await?;
        if removal == Removal::Gone {
            self.delete_lease(tenant, node).await?;
            let tc = self.tenant(tenant).await?;
            csr::delete_of_node(&tc.client, node).await?;
        }
        Ok(removal)
    }

    /// Deletes the machine's Nodes ([`Self::remove_node`] without the Lease).
    async fn delete_nodes(&self, tenant: &TenantAccess, node: &NodeRef) -> Result<Removal, KubeError> {
        let tc = self.tenant(tenant).await?;
        let nodes: Api<Node> = Api::all(tc.client.clone());
        let list = self.list_nodes(tenant.cluster.cluster_id, &nodes).await?;
        let targets = list.into_iter().filter(|n| of_machine(n, node));
        let mut removal = Removal::Gone;
        for existing in targets {
            let name = existing.metadata.name.clone().unwrap_or_default();
            if existing.metadata.deletion_timestamp.is_some() {
                removal = Removal::Deleting;
                continue;
            }
            match nodes.delete(&name, &DeleteParams::default()).await {
                // Someone else finished the job in between.
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(source) => return Err(KubeError::api("delete", "Node", name, source)),
                Ok(outcome) => {
                    info!(node.name = %name, "deleted node {name} of machine {}", node.machine_id);
                    // Left: still there, waiting for finalizers. Right: gone at once.
                    if outcome.is_left() {
                        removal = Removal::Deleting;
                    }
                }
            }
        }
        Ok(removal)
    }

    /// Deletes the bootstrap tokens paddock minted for the machine (by its label, bootstrap
    /// tokens only): its Node registered, so the token has done its work and must not outlive it.
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id, machine.id = %node.machine_id))]
    pub async fn delete_join_tokens(&self, tenant: &TenantAccess, node: &NodeRef) -> Result<(), KubeError> {
        let tc = self.tenant(tenant).await?;
        let secrets: Api<Secret> = Api::namespaced(tc.client.clone(), BOOTSTRAP_NAMESPACE);
        let selector = ListParams::default()
            .labels(&format!("{LABEL_MACHINE_ID}={}", node.machine_id))
            .fields(&format!("type={BOOTSTRAP_TOKEN_TYPE}"));
        // A collection delete of nothing is a success: a repeat (or a token the cleaner already
        // removed) deletes nothing.
        let deleted = secrets.delete_collection(&DeleteParams::default(), &selector).await.map_err(|source| {
            KubeError::api("delete", "Secret", format!("{BOOTSTRAP_NAMESPACE}/bootstrap-token-*"), source)
        })?;
        let count = deleted.left().map_or(0, |list| list.items.len());
        if count > 0 {
            info!(
                node.name = %node.node_name,
                "deleted {count} bootstrap token(s) of machine {}: its node registered",
                node.machine_id
            );
        }
        Ok(())
    }

    /// The forced release's cleanup: deletes the machine's Nodes (a finalizer may keep them
    /// terminating) and the Lease of its node name, each tried even when the other fails; the
    /// first failure is returned.
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id, machine.id = %node.machine_id))]
    pub async fn abandon_node(&self, tenant: &TenantAccess, node: &NodeRef) -> Result<(), KubeError> {
        let nodes = self.delete_nodes(tenant, node).await.map(|_| ());
        nodes.and(self.delete_lease(tenant, node).await)
    }

    /// Deletes the Lease of the machine's node name; none is a success.
    async fn delete_lease(&self, tenant: &TenantAccess, node: &NodeRef) -> Result<(), KubeError> {
        let tc = self.tenant(tenant).await?;
        let leases: Api<Lease> = Api::namespaced(tc.client.clone(), NODE_LEASE_NAMESPACE);
        match leases.delete(&node.node_name, &DeleteParams::default()).await {
            // No Lease (the kubelet never ran, or it is gone already): nothing to delete.
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(source) => {
                Err(KubeError::api("delete", "Lease", format!("{NODE_LEASE_NAMESPACE}/{}", node.node_name), source))
            }
            Ok(_) => {
                info!(node.name = %node.node_name, "deleted the lease of node {} (machine {})", node.node_name, node.machine_id);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeSpec, Taint as KTaint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use paddock_types::cluster::TaintEffect;
    use paddock_types::{MachineId, NodePoolId};

    use super::*;

    fn node_ref(taints: Vec<Taint>) -> NodeRef {
        NodeRef {
            machine_id: MachineId::new(),
            node_pool_id: NodePoolId::new(),
            pool_name: "gpu".to_owned(),
            node_name: "m-1".to_owned(),
            system_uuid: "ABC".to_owned(),
            labels: BTreeMap::from([("team".to_owned(), "ml".to_owned())]),
            taints,
        }
    }

    fn taint(key: &str, effect: TaintEffect) -> Taint {
        Taint { key: key.to_owned(), value: "v".to_owned(), effect }
    }

    fn kt(key: &str, effect: &str) -> KTaint {
        KTaint { key: key.to_owned(), effect: effect.to_owned(), value: None, time_added: None }
    }

    #[test]
    fn taints_keep_foreign_ones_and_their_order() {
        let pool = [taint("gpu", TaintEffect::NoSchedule)];
        let current = [kt("node.kubernetes.io/not-ready", "NoExecute"), kt("old", "NoSchedule")];
        let managed = BTreeSet::from(["old:NoSchedule".to_owned()]);
        let out = desired_taints(&current, &managed, &pool);
        let ids: Vec<_> = out.iter().map(|t| taint_id(&t.key, &t.effect)).collect();
        assert_eq!(ids, ["node.kubernetes.io/not-ready:NoExecute", "gpu:NoSchedule"]);
        assert_eq!(out[1].value.as_deref(), Some("v"));
        // Converged: the same list again, so nothing to write.
        assert_eq!(desired_taints(&out, &BTreeSet::from(["gpu:NoSchedule".to_owned()]), &pool), out);
        // A pool taint that is already there keeps its place.
        let current = [kt("gpu", "NoSchedule"), kt("x", "NoExecute")];
        let out = desired_taints(&current, &BTreeSet::new(), &pool);
        assert_eq!(out.iter().map(|t| t.key.as_str()).collect::<Vec<_>>(), ["gpu", "x"]);
    }

    #[test]
    fn a_converged_node_needs_no_patch() {
        let n = node_ref(vec![taint("gpu", TaintEffect::NoSchedule)]);
        let fresh =
            Node { metadata: ObjectMeta { name: Some("m-1".to_owned()), ..ObjectMeta::default() }, ..Node::default() };
        let body = node_patch(&fresh, &n).expect("labels missing");
        assert_eq!(body["metadata"]["labels"][LABEL_NODE_POOL], "gpu");
        assert_eq!(body["metadata"]["labels"]["team"], "ml");
        assert_eq!(body["metadata"]["annotations"][ANNOTATION_TAINTS], "[\"gpu:NoSchedule\"]");
        assert_eq!(body["spec"]["taints"], json!([{ "key": "gpu", "value": "v", "effect": "NoSchedule" }]));

        let mut converged = fresh.clone();
        converged.metadata.labels = Some(node_labels(&n));
        converged.metadata.annotations =
            Some(BTreeMap::from([(ANNOTATION_TAINTS.to_owned(), "[\"gpu:NoSchedule\"]".to_owned())]));
        converged.spec = Some(NodeSpec {
            taints: Some(vec![KTaint { value: Some("v".to_owned()), ..kt("gpu", "NoSchedule") }]),
            ..NodeSpec::default()
        });
        assert_eq!(node_patch(&converged, &n), None);
        // Without taints at all, no spec is sent.
        let n = node_ref(vec![]);
        let body = node_patch(&fresh, &n).expect("labels missing");
        assert!(body.get("spec").is_none(), "{body}");
    }

    #[test]
    fn kubeconfigs_that_run_programs_or_read_files_are_refused() {
        let base = "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://x:6443'}}]\n";
        let ok = Kubeconfig::from_yaml(&format!("{base}users: [{{name: u, user: {{token: t}}}}]")).expect("yaml");
        assert_eq!(refused(&ok), None);
        for user in [
            "{exec: {apiVersion: client.authentication.k8s.io/v1, command: sh}}",
            "{auth-provider: {name: oidc}}",
            "{tokenFile: /etc/passwd}",
            "{client-key: /root/key.pem}",
        ] {
            let text = format!("{base}users: [{{name: u, user: {user}}}]");
            let kc = Kubeconfig::from_yaml(&text).expect("yaml");
            assert!(refused(&kc).is_some(), "{user}");
        }
        let text = "clusters: [{name: c, cluster: {server: 'https://x', certificate-authority: /etc/ca.crt}}]";
        assert!(refused(&Kubeconfig::from_yaml(text).expect("yaml")).is_some());
    }

    #[test]
    fn tokens_have_the_bootstrap_format() {
        let id = random_token_part(6);
        assert_eq!(id.len(), 6);
        assert!(id.bytes().all(|b| TOKEN_ALPHABET.contains(&b)));
        assert_ne!(random_token_part(16), random_token_part(16));
    }
}
