//! What Kamaji's add-ons put into a tenant cluster, PLAYED with the node image's local images:
//! Kamaji applies kube-proxy and CoreDNS (paddock asks for both in every TenantControlPlane) as
//! kubeadm does, with images from registry.k8s.io, which no node here can pull. The played Kamaji
//! (tests/vm/node.rs) applies the same objects naming the images the node image carries
//! (`paddock.local/kube-proxy`, `paddock.local/coredns/coredns`: images/node/build), and the
//! `kubernetes` Service's endpoint a tenant API server's endpoint reconciler would write, pointing
//! at the node network's door to it. Differences from Kamaji's, each for this testbed:
//! - one CoreDNS replica (Kamaji runs two): two TCG VMs have little CPU to spare;
//! - CoreDNS forwards nothing outside the cluster: a node's restricted network has no resolver;
//! - the images are never pulled (`imagePullPolicy: Never`): the node imports them at its first
//!   boot, and a pod waiting for the import is retried every few seconds, not backed off;
//! - kube-proxy's kubeconfig names the door (10.0.2.100:6443), Kamaji's the control plane's
//!   endpoint, which is the same address here.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde_json::{json, Value};

/// The node image's kube-proxy (built with the kubelet: the same version).
const KUBE_PROXY_IMAGE: &str = "paddock.local/kube-proxy:v1.35.4";
const COREDNS_IMAGE: &str = "paddock.local/coredns/coredns:1.14.7";
/// The cluster DNS address (the kubelet's clusterDNS, Kamaji's default dnsServiceIPs).
pub const DNS_IP: &str = "10.96.0.10";
/// Where a node reaches its tenant's API server (tests/vm/node.rs's door).
const DOOR: &str = "10.0.2.100";

/// Applies every add-on object to the tenant API server `client` talks to.
pub async fn apply(client: &Client) -> Result<(), kube::Error> {
    for obj in kube_proxy() {
        apply_one(client, obj).await?;
    }
    for obj in coredns() {
        apply_one(client, obj).await?;
    }
    apply_one(client, kubernetes_endpoints()).await
}

/// Server-side apply of one object, by its `apiVersion` and `kind`.
async fn apply_one(client: &Client, obj: Value) -> Result<(), kube::Error> {
    let resource = match obj["kind"].as_str().expect("kind") {
        "ServiceAccount" => ApiResource::erase::<ServiceAccount>(&()),
        "ClusterRole" => ApiResource::erase::<ClusterRole>(&()),
        "ClusterRoleBinding" => ApiResource::erase::<ClusterRoleBinding>(&()),
        "ConfigMap" => ApiResource::erase::<ConfigMap>(&()),
        "DaemonSet" => ApiResource::erase::<DaemonSet>(&()),
        "Deployment" => ApiResource::erase::<Deployment>(&()),
        "Service" => ApiResource::erase::<Service>(&()),
        "EndpointSlice" => ApiResource::erase::<EndpointSlice>(&()),
        other => panic!("no add-on object of kind {other}"),
    };
    let name = obj["metadata"]["name"].as_str().expect("name").to_owned();
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    api.patch(&name, &PatchParams::apply("kamaji-played").force(), &Patch::Apply(&obj)).await?;
    Ok(())
}

fn object<K: Resource<DynamicType = ()>>(name: &str, namespace: Option<&str>, rest: Value) -> Value {
    let mut obj = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": { "name": name },
    });
    if let Some(ns) = namespace {
        obj["metadata"]["namespace"] = json!(ns);
    }
    if let (Some(obj), Value::Object(rest)) = (obj.as_object_mut(), rest) {
        obj.extend(rest);
    }
    obj
}

/// kube-proxy as kubeadm's add-on: iptables mode, on every node, host network, its API server
/// through a kubeconfig with its service account's token.
fn kube_proxy() -> Vec<Value> {
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority: \
         /var/run/secrets/kubernetes.io/serviceaccount/ca.crt\n    server: https://{DOOR}:6443\n  name: default\n\
         contexts:\n- context:\n    cluster: default\n    namespace: default\n    user: default\n  name: default\n\
         current-context: default\nusers:\n- name: default\n  user:\n    tokenFile: \
         /var/run/secrets/kubernetes.io/serviceaccount/token\n"
    );
    let config = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
                  clientConnection:\n  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf\n\
                  clusterCIDR: 10.244.0.0/16\nmode: iptables\nconntrack:\n  maxPerCore: 0\n";
    let pod = json!({
        "serviceAccountName": "kube-proxy",
        "hostNetwork": true,
        "priorityClassName": "system-node-critical",
        "tolerations": [{ "operator": "Exists" }],
        "containers": [{
            "name": "kube-proxy",
            "image": KUBE_PROXY_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["/usr/local/bin/kube-proxy", "--config=/var/lib/kube-proxy/config.conf",
                        "--hostname-override=$(NODE_NAME)"],
            "env": [{ "name": "NODE_NAME", "valueFrom": { "fieldRef": { "fieldPath": "spec.nodeName" } } }],
            "securityContext": { "privileged": true },
            "volumeMounts": [
                { "name": "kube-proxy", "mountPath": "/var/lib/kube-proxy" },
                { "name": "xtables-lock", "mountPath": "/run/xtables.lock" },
                { "name": "lib-modules", "mountPath": "/lib/modules", "readOnly": true },
            ],
        }],
        "volumes": [
            { "name": "kube-proxy", "configMap": { "name": "kube-proxy" } },
            { "name": "xtables-lock", "hostPath": { "path": "/run/xtables.lock", "type": "FileOrCreate" } },
            { "name": "lib-modules", "hostPath": { "path": "/lib/modules" } },
        ],
    });
    vec![
        object::<ServiceAccount>("kube-proxy", Some("kube-system"), json!({})),
        object::<ClusterRoleBinding>(
            "kube-proxy",
            None,
            json!({
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node-proxier" },
                "subjects": [{ "kind": "ServiceAccount", "name": "kube-proxy", "namespace": "kube-system" }],
            }),
        ),
        object::<ConfigMap>(
            "kube-proxy",
            Some("kube-system"),
            json!({ "data": { "config.conf": config, "kubeconfig.conf": kubeconfig } }),
        ),
        object::<DaemonSet>(
            "kube-proxy",
            Some("kube-system"),
            json!({ "spec": {
                "selector": { "matchLabels": { "k8s-app": "kube-proxy" } },
                "template": { "metadata": { "labels": { "k8s-app": "kube-proxy" } }, "spec": pod },
            }}),
        ),
    ]
}

/// CoreDNS as kubeadm's add-on (see the module documentation for what differs): the
/// `kubernetes` plugin answering for `cluster.local`, behind the `kube-dns` Service.
fn coredns() -> Vec<Value> {
    let corefile = ".:53 {\n    errors\n    health {\n        lameduck 5s\n    }\n    ready\n    \
                    kubernetes cluster.local in-addr.arpa ip6.arpa {\n        pods insecure\n        \
                    fallthrough in-addr.arpa ip6.arpa\n        ttl 30\n    }\n    cache 30\n    loop\n    \
                    reload\n    loadbalance\n}\n";
    let pod = json!({
        "serviceAccountName": "coredns",
        "dnsPolicy": "Default",
        "priorityClassName": "system-cluster-critical",
        // kubeadm's: never every taint, or its ReplicaSet's new pods would land on cordoned
        // nodes as fast as a drain evicts them.
        "tolerations": [
            { "key": "CriticalAddonsOnly", "operator": "Exists" },
            { "key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule" },
        ],
        "containers": [{
            "name": "coredns",
            "image": COREDNS_IMAGE,
            "imagePullPolicy": "Never",
            "args": ["-conf", "/etc/coredns/Corefile"],
            "ports": [
                { "name": "dns", "containerPort": 53, "protocol": "UDP" },
                { "name": "dns-tcp", "containerPort": 53, "protocol": "TCP" },
            ],
            "readinessProbe": { "httpGet": { "path": "/ready", "port": 8181 }, "periodSeconds": 5 },
            "securityContext": { "capabilities": { "add": ["NET_BIND_SERVICE"], "drop": ["ALL"] } },
            "volumeMounts": [{ "name": "config", "mountPath": "/etc/coredns", "readOnly": true }],
        }],
        "volumes": [{ "name": "config", "configMap": { "name": "coredns" } }],
    });
    let rules = json!([
        { "apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"] },
        { "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"] },
    ]);
    vec![
        object::<ServiceAccount>("coredns", Some("kube-system"), json!({})),
        object::<ClusterRole>("system:coredns", None, json!({ "rules": rules })),
        object::<ClusterRoleBinding>(
            "system:coredns",
            None,
            json!({
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns" },
                "subjects": [{ "kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system" }],
            }),
        ),
        object::<ConfigMap>("coredns", Some("kube-system"), json!({ "data": { "Corefile": corefile } })),
        object::<Deployment>(
            "coredns",
            Some("kube-system"),
            json!({ "spec": {
                "replicas": 1,
                "selector": { "matchLabels": { "k8s-app": "kube-dns" } },
                "template": { "metadata": { "labels": { "k8s-app": "kube-dns" } }, "spec": pod },
            }}),
        ),
        object::<Service>(
            "kube-dns",
            Some("kube-system"),
            json!({ "spec": {
                "clusterIP": DNS_IP,
                "selector": { "k8s-app": "kube-dns" },
                "ports": [
                    { "name": "dns", "port": 53, "protocol": "UDP" },
                    { "name": "dns-tcp", "port": 53, "protocol": "TCP" },
                ],
            }}),
        ),
    ]
}

/// The `kubernetes` Service's endpoint: the harness's API servers run without an endpoint
/// reconciler (their address is a loopback one), so this names the door nodes reach them by.
fn kubernetes_endpoints() -> Value {
    let mut slice = object::<EndpointSlice>(
        "kubernetes",
        Some("default"),
        json!({
            "addressType": "IPv4",
            "endpoints": [{ "addresses": [DOOR], "conditions": { "ready": true } }],
            "ports": [{ "name": "https", "port": 6443, "protocol": "TCP" }],
        }),
    );
    slice["metadata"]["labels"] = json!({ "kubernetes.io/service-name": "kubernetes" });
    slice
}
