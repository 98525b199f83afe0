//! The objects that isolate one tenant cluster on the platform cluster (docs/architecture.md,
//! cluster reconciler step 1),
//! built as pure values from our ids so every run produces the same desired state.
//!
//! Per cluster, in the namespace `pc-<cluster id, 32 hex digits>`:
//!
//! | object | name | why |
//! | --- | --- | --- |
//! | Namespace | `pc-<id>` | one per tenant cluster; labels `paddock.dev/tenant-id`, `paddock.dev/cluster-id`, `app.kubernetes.io/managed-by=paddock` |
//! | NetworkPolicy | `paddock-default-deny` | every pod, ingress and egress, no rule: nothing flows unless allowed below |
//! | NetworkPolicy | `paddock-allow-dns` | egress to kube-system's kube-dns pods on 53/UDP and 53/TCP |
//! | NetworkPolicy | `paddock-allow-control-plane` | ingress to 6443/TCP (API server) and 8132/TCP (konnectivity) from anywhere |
//! | NetworkPolicy | `paddock-allow-datastore` | egress to the Kamaji DataStore (etcd, 2379/TCP) in its namespace |
//! | ResourceQuota | `paddock-quota` | bounds what one tenant cluster's control plane may take (see [`QUOTA`]) |
//! | LimitRange | `paddock-limits` | default requests/limits, so containers without them fit the quota |
//! | RoleBinding | `paddock-worker` | with a namespace role only (`PADDOCK_KUBE_NAMESPACE_ROLE`, [`crate::access`]): the worker's own account bound to that ClusterRole in this namespace alone |
//!
//! Choices, kept simple on purpose:
//! - **API server and konnectivity ingress from anywhere.** The tenant's machines sit outside the
//!   platform cluster and reach the control plane through whatever the provider exposes
//!   (LoadBalancer or NodePort Service). With `externalTrafficPolicy: Cluster` the source address is
//!   SNATed to a node's, so an `ipBlock` of the machines' addresses would not match reliably; the
//!   ports are authenticated (TLS client certs / tokens). Narrowing to the provider's ranges is a
//!   later setting. Kamaji's own operator (in its namespace) reaches 6443 through the same rule.
//! - **Datastore egress** goes to every pod of one namespace (`kamaji-system` by default, where
//!   Kamaji's default etcd DataStore runs) on 2379. A per-tenant DataStore in another namespace
//!   would need that namespace here ([`IsolationSettings::datastore_namespace`]).
//! - Pods of the namespace do not talk to each other: a Kamaji control plane is one pod per
//!   replica (API server, controller-manager, scheduler and konnectivity server as containers), and
//!   the API server reaches the tenant's kubelets through the konnectivity tunnel that the agents
//!   open towards 8132, so no other egress is needed.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    LimitRange, LimitRangeItem, LimitRangeSpec, Namespace, ResourceQuota, ResourceQuotaSpec,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use paddock_types::ClusterId;

use paddock_domain::driver::ClusterRef;

/// Label with the owning tenant's id.
pub const LABEL_TENANT_ID: &str = "paddock.dev/tenant-id";
/// Label with the tenant cluster's id.
pub const LABEL_CLUSTER_ID: &str = "paddock.dev/cluster-id";
/// The standard managed-by label; its value is [`MANAGER`].
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Annotation with the tenant's name (informational).
pub const ANNOTATION_TENANT_NAME: &str = "paddock.dev/tenant-name";
/// Annotation with the cluster's name (informational).
pub const ANNOTATION_CLUSTER_NAME: &str = "paddock.dev/cluster-name";
/// The one server-side-apply field manager of paddock, and the managed-by value.
pub const MANAGER: &str = "paddock";

/// Name of the default-deny NetworkPolicy.
pub const POLICY_DEFAULT_DENY: &str = "paddock-default-deny";
/// Name of the DNS egress NetworkPolicy.
pub const POLICY_ALLOW_DNS: &str = "paddock-allow-dns";
/// Name of the API server / konnectivity ingress NetworkPolicy.
pub const POLICY_ALLOW_CONTROL_PLANE: &str = "paddock-allow-control-plane";
/// Name of the DataStore egress NetworkPolicy.
pub const POLICY_ALLOW_DATASTORE: &str = "paddock-allow-datastore";
/// Name of the ResourceQuota.
pub const QUOTA_NAME: &str = "paddock-quota";
/// Name of the LimitRange.
pub const LIMITS_NAME: &str = "paddock-limits";
/// Name of the RoleBinding of the worker's own account in the namespace.
pub const WORKER_BINDING_NAME: &str = "paddock-worker";

/// Port of a Kamaji tenant API server.
pub const API_SERVER_PORT: i32 = 6443;
/// Port of Kamaji's konnectivity server (the agents on the tenant's machines dial in).
pub const KONNECTIVITY_PORT: i32 = 8132;
/// etcd's client port (Kamaji's etcd DataStore).
pub const DATASTORE_PORT: i32 = 2379;

/// The default ResourceQuota of one tenant cluster's namespace. Sized for a Kamaji control plane
/// of up to 3 replicas (each ~1 CPU / 2 GiB at most) plus add-on jobs, with headroom; a provider
/// setting can replace it later.
pub const QUOTA: &[(&str, &str)] = &[
    ("pods", "20"),
    ("requests.cpu", "8"),
    ("requests.memory", "16Gi"),
    ("limits.cpu", "16"),
    ("limits.memory", "32Gi"),
    ("services", "10"),
    ("services.loadbalancers", "2"),
    ("services.nodeports", "4"),
    ("persistentvolumeclaims", "10"),
    ("requests.storage", "100Gi"),
    ("secrets", "100"),
    ("configmaps", "100"),
];

/// Default container request / limit of the LimitRange. A quota on `requests.*` / `limits.*`
/// rejects pods that omit them, so every container gets these unless it says otherwise.
pub const DEFAULT_REQUEST: &[(&str, &str)] = &[("cpu", "100m"), ("memory", "128Mi")];
/// See [`DEFAULT_REQUEST`].
pub const DEFAULT_LIMIT: &[(&str, &str)] = &[("cpu", "1"), ("memory", "1Gi")];
/// The most one container may ask for; keeps one container from taking the whole quota.
pub const MAX_PER_CONTAINER: &[(&str, &str)] = &[("cpu", "4"), ("memory", "8Gi")];

/// Settings of the isolation objects that depend on how the provider runs Kamaji.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsolationSettings {
    /// Namespace of the Kamaji DataStore's pods (egress on 2379 is allowed to it).
    pub datastore_namespace: String,
    /// Namespace and `k8s-app` label of the cluster DNS pods.
    pub dns_namespace: String,
    /// See `dns_namespace`.
    pub dns_app_label: String,
}

impl Default for IsolationSettings {
    fn default() -> Self {
        Self {
            datastore_namespace: "kamaji-system".to_owned(),
            dns_namespace: "kube-system".to_owned(),
            dns_app_label: "kube-dns".to_owned(),
        }
    }
}

/// The namespace of a tenant cluster: `pc-` and the id's 32 hex digits (35 characters, a valid
/// DNS-1123 label). Derived from the id alone so it never changes and a retry finds it again.
pub fn namespace_name(cluster: ClusterId) -> String {
    format!("pc-{}", cluster.uuid().simple())
}

/// The labels every isolation object carries.
pub fn labels(cluster: &ClusterRef) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_TENANT_ID.to_owned(), cluster.tenant_id.to_string()),
        (LABEL_CLUSTER_ID.to_owned(), cluster.cluster_id.to_string()),
        (LABEL_MANAGED_BY.to_owned(), MANAGER.to_owned()),
    ])
}

fn meta(cluster: &ClusterRef, name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(labels(cluster)),
        ..ObjectMeta::default()
    }
}

fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned()))).collect()
}

/// The namespace, with the names as annotations for people reading the platform cluster.
pub fn namespace(cluster: &ClusterRef) -> Namespace {
    let mut meta = meta(cluster, &namespace_name(cluster.cluster_id), None);
    meta.annotations = Some(BTreeMap::from([
        (ANNOTATION_TENANT_NAME.to_owned(), cluster.tenant_name.clone()),
        (ANNOTATION_CLUSTER_NAME.to_owned(), cluster.cluster_name.clone()),
    ]));
    Namespace { metadata: meta, ..Namespace::default() }
}

fn all_pods() -> Option<LabelSelector> {
    // An empty selector selects every pod of the policy's namespace.
    Some(LabelSelector::default())
}

fn in_namespace(name: &str) -> LabelSelector {
    // `kubernetes.io/metadata.name` is set by the API server on every namespace (immutable).
    LabelSelector {
        match_labels: Some(BTreeMap::from([("kubernetes.io/metadata.name".to_owned(), name.to_owned())])),
        ..LabelSelector::default()
    }
}

fn port(protocol: &str, number: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some(protocol.to_owned()),
        port: Some(IntOrString::Int(number)),
        ..NetworkPolicyPort::default()
    }
}

fn policy(cluster: &ClusterRef, name: &str, spec: NetworkPolicySpec) -> NetworkPolicy {
    let ns = namespace_name(cluster.cluster_id);
    NetworkPolicy { metadata: meta(cluster, name, Some(&ns)), spec: Some(spec) }
}

/// The NetworkPolicies, default-deny first. NetworkPolicies are additive: the allow policies
/// open exactly their flows on top of the deny-all.
pub fn network_policies(cluster: &ClusterRef, settings: &IsolationSettings) -> Vec<NetworkPolicy> {
    let both = Some(vec!["Ingress".to_owned(), "Egress".to_owned()]);
    let deny = NetworkPolicySpec { pod_selector: all_pods(), policy_types: both, ingress: None, egress: None };
    let dns = NetworkPolicySpec {
        pod_selector: all_pods(),
        policy_types: Some(vec!["Egress".to_owned()]),
        egress: Some(vec![NetworkPolicyEgressRule {
            to: Some(vec![NetworkPolicyPeer {
                namespace_selector: Some(in_namespace(&settings.dns_namespace)),
                pod_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([("k8s-app".to_owned(), settings.dns_app_label.clone())])),
                    ..LabelSelector::default()
                }),
                ip_block: None,
            }]),
            ports: Some(vec![port("UDP", 53), port("TCP", 53)]),
        }]),
        ingress: None,
    };
    let control_plane = NetworkPolicySpec {
        pod_selector: all_pods(),
        policy_types: Some(vec!["Ingress".to_owned()]),
        // No `from`: any source (see the module docs for why), but only these ports.
        ingress: Some(vec![NetworkPolicyIngressRule {
            from: None,
            ports: Some(vec![port("TCP", API_SERVER_PORT), port("TCP", KONNECTIVITY_PORT)]),
        }]),
        egress: None,
    };
    let datastore = NetworkPolicySpec {
        pod_selector: all_pods(),
        policy_types: Some(vec!["Egress".to_owned()]),
        egress: Some(vec![NetworkPolicyEgressRule {
            to: Some(vec![NetworkPolicyPeer {
                namespace_selector: Some(in_namespace(&settings.datastore_namespace)),
                pod_selector: None,
                ip_block: None,
            }]),
            ports: Some(vec![port("TCP", DATASTORE_PORT)]),
        }]),
        ingress: None,
    };
    vec![
        policy(cluster, POLICY_DEFAULT_DENY, deny),
        policy(cluster, POLICY_ALLOW_DNS, dns),
        policy(cluster, POLICY_ALLOW_CONTROL_PLANE, control_plane),
        policy(cluster, POLICY_ALLOW_DATASTORE, datastore),
    ]
}

/// The ResourceQuota ([`QUOTA`]).
pub fn resource_quota(cluster: &ClusterRef) -> ResourceQuota {
    let ns = namespace_name(cluster.cluster_id);
    ResourceQuota {
        metadata: meta(cluster, QUOTA_NAME, Some(&ns)),
        spec: Some(ResourceQuotaSpec { hard: Some(quantities(QUOTA)), ..ResourceQuotaSpec::default() }),
        status: None,
    }
}

/// The LimitRange ([`DEFAULT_REQUEST`], [`DEFAULT_LIMIT`], [`MAX_PER_CONTAINER`]).
pub fn limit_range(cluster: &ClusterRef) -> LimitRange {
    let ns = namespace_name(cluster.cluster_id);
    LimitRange {
        metadata: meta(cluster, LIMITS_NAME, Some(&ns)),
        spec: Some(LimitRangeSpec {
            limits: vec![LimitRangeItem {
                type_: "Container".to_owned(),
                default_request: Some(quantities(DEFAULT_REQUEST)),
                default: Some(quantities(DEFAULT_LIMIT)),
                max: Some(quantities(MAX_PER_CONTAINER)),
                ..LimitRangeItem::default()
            }],
        }),
    }
}

/// The RBAC subject of the account the API server calls `username`: a ServiceAccount for
/// `system:serviceaccount:<namespace>:<name>`, else a User.
pub fn subject(username: &str) -> Subject {
    match username.strip_prefix("system:serviceaccount:").and_then(|rest| rest.split_once(':')) {
        Some((namespace, name)) => Subject {
            kind: "ServiceAccount".to_owned(),
            name: name.to_owned(),
            namespace: Some(namespace.to_owned()),
            api_group: None,
        },
        None => Subject {
            kind: "User".to_owned(),
            name: username.to_owned(),
            namespace: None,
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
        },
    }
}

/// The RoleBinding of `account` (the worker's own) to the ClusterRole `role` in the cluster's
/// namespace: what the worker may do there, and nowhere else.
pub fn worker_binding(cluster: &ClusterRef, role: &str, account: Subject) -> RoleBinding {
    let ns = namespace_name(cluster.cluster_id);
    RoleBinding {
        metadata: meta(cluster, WORKER_BINDING_NAME, Some(&ns)),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "ClusterRole".to_owned(),
            name: role.to_owned(),
        },
        subjects: Some(vec![account]),
    }
}

#[cfg(test)]
mod tests {
    use paddock_types::TenantId;

    use super::*;

    fn cluster() -> ClusterRef {
        ClusterRef {
            tenant_id: TenantId::new(),
            cluster_id: ClusterId::new(),
            tenant_name: "acme".to_owned(),
            cluster_name: "train".to_owned(),
        }
    }

    #[test]
    fn namespace_name_is_a_short_dns_label_derived_from_the_id() {
        let c = cluster();
        let name = namespace_name(c.cluster_id);
        assert_eq!(name, namespace_name(c.cluster_id), "deterministic");
        assert!(name.len() <= 63, "{name}");
        assert!(name.starts_with("pc-"));
        assert!(name.chars().all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-'), "{name}");
        assert!(name.contains(&c.cluster_id.uuid().simple().to_string()));
    }

    #[test]
    fn every_object_lives_in_the_cluster_namespace_with_its_labels() {
        let c = cluster();
        let ns = namespace_name(c.cluster_id);
        let account = subject("system:serviceaccount:paddock-system:paddock-worker");
        let binding = worker_binding(&c, "paddock-worker-namespace", account).metadata;
        let mut metas = vec![resource_quota(&c).metadata, limit_range(&c).metadata, binding];
        metas.extend(network_policies(&c, &IsolationSettings::default()).into_iter().map(|p| p.metadata));
        for m in metas {
            assert_eq!(m.namespace.as_deref(), Some(ns.as_str()));
            assert_eq!(m.labels.as_ref(), Some(&labels(&c)));
        }
    }

    #[test]
    fn the_binding_names_the_workers_own_account() {
        let account = subject("system:serviceaccount:paddock-system:paddock-worker");
        assert_eq!((account.kind.as_str(), account.name.as_str()), ("ServiceAccount", "paddock-worker"));
        assert_eq!(account.namespace.as_deref(), Some("paddock-system"));
        let user = subject("kubernetes-admin");
        assert_eq!((user.kind.as_str(), user.name.as_str(), user.namespace), ("User", "kubernetes-admin", None));
    }
}
