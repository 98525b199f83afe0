//! A tenant cluster's network, checked from inside it on two node VMs: Kamaji's add-ons (played
//! with local images, tests/vm/addons.rs) run on the nodes, and a pod on one node reaches a pod on
//! the other by its IP (over the tenant network, tests/vm/tenantnet.rs), finds a Service by its
//! name (CoreDNS, which itself reached the API server through the `kubernetes` Service), and
//! reaches the pod behind it through the Service's address (kube-proxy). The pods are busybox
//! (the node image's); what the client saw comes back as its termination message, read from the
//! pod's status (the API server cannot reach a kubelet here to exec or read logs).

use std::time::Instant;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::api::{LogParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::join::JOIN_BOUND;
use crate::testbed::{self, console_tail, Vm};

const BUSYBOX: &str = "paddock.local/library/busybox:1.35.0";
const NS: &str = "net";

/// Checks pod-to-pod, DNS and Service traffic between `nodes[0]` (the client's) and `nodes[1]`
/// (the server's) in the cluster `client` talks to; `vms` for the consoles when it fails.
pub async fn check(client: &Client, nodes: [&str; 2], vms: &[Vm]) {
    let t0 = Instant::now();
    addons_ready(client, vms).await;
    eprintln!("network: kube-proxy on both nodes and CoreDNS ready in {:.1} s", t0.elapsed().as_secs_f64());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({ "metadata": { "name": NS } })).expect("namespace");
    namespaces.create(&PostParams::default(), &ns).await.expect("namespace");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(&PostParams::default(), &server(nodes[1])).await.expect("the server pod");
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let svc = json!({ "metadata": { "name": "echo" }, "spec": {
        "selector": { "app": "server" }, "ports": [{ "port": 80, "targetPort": 8080 }] } });
    let svc = services.create(&PostParams::default(), &serde_json::from_value(svc).expect("svc")).await.expect("svc");
    let cluster_ip = svc.spec.and_then(|s| s.cluster_ip).expect("the Service's address");
    let server = wait_pod(client, "server", vms, |p| ready(p).then(|| p.clone())).await;
    let server_ip = server.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("the server's IP");

    pods.create(&PostParams::default(), &probe(nodes[0], &server_ip)).await.expect("the client pod");
    let done = wait_pod(client, "client", vms, |p| {
        let phase = p.status.as_ref()?.phase.clone()?;
        ["Succeeded", "Failed"].contains(&phase.as_str()).then(|| p.clone())
    })
    .await;
    let status = done.status.expect("status");
    let said =
        status.container_statuses.as_ref().and_then(|c| c[0].state.as_ref()?.terminated.as_ref()?.message.clone());
    let said = said.unwrap_or_default();
    assert_eq!(status.phase.as_deref(), Some("Succeeded"), "the client on {} says: {said}", nodes[0]);
    let expected = format!("pod=served-by-{} dns={cluster_ip} service=served-by-{}", nodes[1], nodes[1]);
    assert_eq!(said.trim(), expected, "what the client on {} saw", nodes[0]);
    let (client_ip, server_host) = (status.pod_ip.unwrap_or_default(), server.status.and_then(|s| s.host_ip));
    assert!(
        server_host.as_deref().is_some_and(|h| h.starts_with("10.70.0.")),
        "the server's node is on the tenant network: {server_host:?}"
    );
    assert_ne!(subnet(&client_ip), subnet(&server_ip), "the pods are on different nodes' subnets");
    control_plane_reach(client, &expected, nodes[1]).await;
    eprintln!(
        "network: pod {client_ip} -> pod {server_ip}, DNS and Service {cluster_ip} in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

/// The API server reaches into the cluster as paddock's probes and a tenant's `kubectl` need: a
/// pod's log (through its node's kubelet) and a Service through the API server's proxy (to the
/// pod behind it), both over the played konnectivity (tests/vm/egress.rs).
async fn control_plane_reach(client: &Client, logged: &str, server_node: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let log = pods.logs("client", &LogParams::default()).await.expect("the client's log, through its kubelet");
    assert_eq!(log.trim(), logged, "the client's log read through the API server");
    let path = format!("/api/v1/namespaces/{NS}/services/echo:80/proxy/");
    let request = http::Request::get(&path).body(Vec::new()).expect("request");
    let body = client.request_text(request).await.expect("the Service through the API server's proxy");
    assert_eq!(body.trim(), format!("served-by-{server_node}"), "GET {path}");
}

fn subnet(ip: &str) -> String {
    ip.rsplit_once('.').map(|(net, _)| net.to_owned()).unwrap_or_default()
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// kube-proxy running on every node and CoreDNS ready.
async fn addons_ready(client: &Client, vms: &[Vm]) {
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "kube-system");
    until(client, vms, "kube-proxy runs on both nodes and CoreDNS is ready", || async {
        let proxy = daemonsets.get_opt("kube-proxy").await.ok()??.status?;
        let dns = deployments.get_opt("coredns").await.ok()??.status?;
        (proxy.number_ready == 2 && dns.ready_replicas == Some(1)).then_some(())
    })
    .await;
}

/// busybox's httpd on `node`, serving `served-by-<node>`.
fn server(node: &str) -> Pod {
    let script = "mkdir -p /www && echo \"served-by-$NODE\" > /www/index.html && exec httpd -f -p 8080 -h /www";
    serde_json::from_value(json!({
        "metadata": { "name": "server", "labels": { "app": "server" } },
        "spec": {
            "nodeName": node,
            "tolerations": [{ "operator": "Exists" }],
            "containers": [{
                "name": "httpd", "image": BUSYBOX, "imagePullPolicy": "Never", "command": ["sh", "-c", script],
                "env": [{ "name": "NODE", "value": node }],
                "readinessProbe": { "tcpSocket": { "port": 8080 }, "periodSeconds": 2 },
            }],
        },
    }))
    .expect("pod")
}

/// The client on `node`: the server pod by IP, the Service's name through the cluster DNS, the
/// Service by the address DNS gave; each tried for up to a minute (kube-proxy's rules and
/// CoreDNS's cache follow the API server within seconds). It ends with what it saw as its
/// termination message, and fails when something never answered.
fn probe(node: &str, server_ip: &str) -> Pod {
    let script = r#"
try() { for _ in $(seq 30); do out=$("$@" 2>/dev/null) && [ -n "$out" ] && { echo "$out"; return 0; }; sleep 2; done; return 1; }
fetch() { timeout 10 wget -q -O - "http://$1/"; }
resolve() { nslookup echo.net.svc.cluster.local | awk '/^Address:/ && $2 !~ /:/ { a = $2 } END { if (a) print a; else exit 1 }'; }
pod=$(try fetch "$SERVER:8080") || { echo "the server pod $SERVER:8080 never answered" > /dev/termination-log; exit 1; }
dns=$(try resolve) || { echo "pod=$pod: echo.net.svc.cluster.local never resolved" > /dev/termination-log; exit 1; }
svc=$(try fetch "$dns") || { echo "pod=$pod dns=$dns: the Service never answered" > /dev/termination-log; exit 1; }
echo "pod=$pod dns=$dns service=$svc" | tee /dev/termination-log
"#;
    serde_json::from_value(json!({
        "metadata": { "name": "client" },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "tolerations": [{ "operator": "Exists" }],
            "containers": [{
                "name": "probe", "image": BUSYBOX, "imagePullPolicy": "Never", "command": ["sh", "-c", script],
                "env": [{ "name": "SERVER", "value": server_ip }],
            }],
        },
    }))
    .expect("pod")
}

/// Waits until the pod `name` satisfies `what`.
async fn wait_pod(client: &Client, name: &str, vms: &[Vm], what: impl Fn(&Pod) -> Option<Pod>) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let what = &what;
    until(client, vms, &format!("pod {name}"), || {
        let pods = pods.clone();
        async move { pods.get_opt(name).await.ok().flatten().and_then(|p| what(&p)) }
    })
    .await
}

/// Waits until `what` answers, within [`JOIN_BOUND`]; fails with every pod's state and the
/// consoles.
async fn until<T, F: std::future::Future<Output = Option<T>>>(
    client: &Client,
    vms: &[Vm],
    why: &str,
    what: impl Fn() -> F,
) -> T {
    let context = || async { format!("pods:{}\n{}", crate::slurm::pods_now(client).await, consoles(vms)) };
    testbed::until(why, JOIN_BOUND, what, context).await
}

fn consoles(vms: &[Vm]) -> String {
    vms.iter().map(|vm| format!("{}:\n{}", vm.name, console_tail(vm, 30))).collect::<Vec<_>>().join("\n")
}
