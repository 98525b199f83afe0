//! PLAYS THE KUBELETS (no container runs here): Nodes that register Ready with capacity, and a
//! loop that starts every pod the real scheduler bound (`spec.nodeName` set): status Running and
//! Ready, a pod IP, every container running. It re-marks a pod that is not (or no longer) Running
//! and Ready, finishes graceful deletions (as a kubelet does once containers stop), and starts
//! slurmd in the slurmrestd stand-in for NodeSet pods. Every request has a timeout; errors are
//! logged and retried on the next round, never swallowed.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::chrono::{SecondsFormat, Utc};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use super::restd::StandInRestd;

/// The timeout of each request of the played kubelet.
const REQUEST: Duration = Duration::from_secs(20);
/// The pause between two rounds.
const ROUND: Duration = Duration::from_millis(300);

fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

async fn timed<T, E: std::fmt::Display>(
    what: &str,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(REQUEST, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {REQUEST:?}")),
    }
}

/// Registers `count` Nodes of a node pool (`pool_id`, `pool_name`, its `taints`), each with
/// `gpus`, at addresses from `192.0.2.<first_ip>` on, then lets paddock's node driver converge
/// their labels and taints as the worker does; their names. Panics on an error.
pub async fn register_pool(
    client: &Client,
    tenant: &paddock_domain::driver::TenantAccess,
    (pool_id, pool_name, taints): (paddock_types::NodePoolId, &str, &[paddock_types::cluster::Taint]),
    gpus: u32,
    count: u32,
    first_ip: u8,
) -> Vec<String> {
    let driver = paddock_kube::nodes::KubeTenantNodes::new();
    let mut names = Vec::new();
    for i in 0..count {
        let machine_id = paddock_types::MachineId::new();
        let node = paddock_domain::driver::NodeRef {
            machine_id,
            node_pool_id: pool_id,
            pool_name: pool_name.to_owned(),
            node_name: paddock_domain::driver::node_name(machine_id),
            system_uuid: uuid::Uuid::new_v4().to_string(),
            labels: std::collections::BTreeMap::new(),
            taints: taints.to_vec(),
        };
        let ip = format!("192.0.2.{}", u32::from(first_ip) + i);
        register_node(client, &node.node_name, &node.system_uuid, &ip, gpus).await;
        let status = paddock_domain::driver::TenantNodes::node(&driver, tenant, &node).await;
        let status = status.expect("the node driver converges the Node");
        assert!(status.is_some_and(|s| s.ready), "Node {} is registered and Ready", node.node_name);
        names.push(node.node_name);
    }
    names
}

/// Registers Node `name` as its kubelet would: Ready, `system_uuid`, an address, capacity for
/// pods, CPU and memory, and `gpus` `nvidia.com/gpu` (the device plugin's resource) when > 0.
/// (`support::ready_node` has no system UUID, which paddock's node driver matches machines by,
/// and no GPUs.) Panics on an error (see [`register`]).
pub async fn register_node(client: &Client, name: &str, system_uuid: &str, address: &str, gpus: u32) {
    register(client, name, system_uuid, address, gpus).await.unwrap_or_else(|e| panic!("{e}"));
}

/// [`register_node`], its errors returned; an already registered Node is completed (status,
/// taint), so a caller may retry.
pub async fn register(client: &Client, name: &str, system_uuid: &str, address: &str, gpus: u32) -> Result<(), String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { "kubernetes.io/hostname": name, "kubernetes.io/os": "linux" } },
    }))
    .map_err(|e| format!("a Node: {e}"))?;
    match timed(&format!("registering Node {name}"), nodes.create(&PostParams::default(), &node)).await {
        Ok(_) => {}
        Err(e) if e.contains("already exists") => {}
        Err(e) => return Err(e),
    }
    let mut capacity = json!({ "cpu": "32", "memory": "128Gi", "pods": "110", "ephemeral-storage": "500Gi" });
    if gpus > 0 {
        capacity["nvidia.com/gpu"] = json!(gpus.to_string());
    }
    let status = json!({ "status": {
        "capacity": capacity, "allocatable": capacity,
        "addresses": [{ "type": "InternalIP", "address": address }, { "type": "Hostname", "address": name }],
        "conditions": [{ "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "played",
                         "lastHeartbeatTime": now(), "lastTransitionTime": now() }],
        "nodeInfo": { "systemUUID": system_uuid, "machineID": "m", "bootID": "b", "kernelVersion": "6.8.0",
                      "osImage": "Ubuntu 24.04", "containerRuntimeVersion": "containerd://2.0.0",
                      "kubeletVersion": "v1.35.0", "kubeProxyVersion": "", "operatingSystem": "linux",
                      "architecture": "amd64" },
    }});
    let what = format!("writing Node {name}'s status");
    timed(&what, nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))).await?;
    lift_not_ready(&nodes, name).await
}

/// Admission taints every new Node not-ready; the node lifecycle controller, which lifts it once
/// the kubelet reports Ready, does not run in the harness. Only that taint goes (paddock's node
/// driver may be tainting the Node at the same time): a patch conditional on the
/// `resourceVersion` read, retried on a conflict.
async fn lift_not_ready(nodes: &Api<Node>, name: &str) -> Result<(), String> {
    for _ in 0..50 {
        let node = timed(&format!("reading Node {name}"), nodes.get(name)).await?;
        let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        if !taints.iter().any(|t| t.key == NOT_READY_TAINT) {
            return Ok(());
        }
        let kept: Vec<_> = taints.into_iter().filter(|t| t.key != NOT_READY_TAINT).collect();
        let patch = json!({ "metadata": { "resourceVersion": node.metadata.resource_version },
                            "spec": { "taints": kept } });
        match timed("lifting the not-ready taint", nodes.patch(name, &PatchParams::default(), &Patch::Merge(&patch)))
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if e.contains("409") || e.contains("modified") => continue,
            Err(e) => return Err(format!("Node {name}: {e}")),
        }
    }
    Err(format!("Node {name}: the not-ready taint kept conflicting"))
}

/// The taint admission puts on a new Node.
const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

/// The pods that are not Running and Ready, with why (for failure messages): phase, Node, and the
/// scheduler's or the kubelet's conditions.
pub async fn unready_pods(client: &Client) -> String {
    let pods: Api<Pod> = Api::all(client.clone());
    let pods = match timed("listing pods", pods.list(&ListParams::default())).await {
        Ok(list) => list.items,
        Err(e) => return e,
    };
    let mut out = Vec::new();
    for pod in pods.iter().filter(|p| !running_and_ready(p)) {
        let status = pod.status.clone().unwrap_or_default();
        let conditions: Vec<String> = status
            .conditions
            .iter()
            .flatten()
            .map(|c| format!("{}={} {}", c.type_, c.status, c.message.as_deref().unwrap_or_default()))
            .collect();
        out.push(format!(
            "{}/{} phase {:?} on {:?} deleting {} [{}]",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default(),
            status.phase,
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            pod.metadata.deletion_timestamp.is_some(),
            conditions.join("; ")
        ));
    }
    if out.is_empty() {
        "every pod is Running and Ready".to_owned()
    } else {
        format!("pods not Running and Ready:\n  {}", out.join("\n  "))
    }
}

/// Pod addresses: `restd_pod_ip` for slurmrestd's pods and Ray head pods (where the stand-ins
/// listen, so that the API server's service and pod proxies reach them), `10.244.x.y` for the
/// others.
struct Addresses {
    next: AtomicU32,
    restd_pod_ip: Option<IpAddr>,
}

impl Addresses {
    fn for_pod(&self, pod: &Pod) -> String {
        if let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) {
            return ip; // a pod keeps its address
        }
        let label = |key: &str| pod.metadata.labels.as_ref().and_then(|l| l.get(key)).map(String::as_str);
        let restd = label("app.kubernetes.io/name") == Some("slurmrestd") || label("ray.io/node-type") == Some("head");
        match self.restd_pod_ip.filter(|_| restd) {
            Some(ip) => ip.to_string(),
            None => {
                let n = self.next.fetch_add(1, Ordering::SeqCst);
                format!("10.244.{}.{}", n / 250 % 250, n % 250 + 1)
            }
        }
    }
}

/// Starts the played kubelets; the task only ends by a panic (the test checks it is alive).
pub fn spawn(client: Client, restd: StandInRestd, restd_pod_ip: Option<IpAddr>) -> JoinHandle<()> {
    let addresses = Addresses { next: AtomicU32::new(1), restd_pod_ip };
    tokio::spawn(async move {
        let mut said = Instant::now();
        loop {
            let unbound = round(&client, &restd, &addresses).await;
            if !unbound.is_empty() && said.elapsed() > SAY_EVERY {
                eprintln!("played kubelet: waiting for the scheduler to bind {}", unbound.join(", "));
                said = Instant::now();
            }
            tokio::time::sleep(ROUND).await;
        }
    })
}

/// How often the kubelet says which pods it still waits for.
const SAY_EVERY: Duration = Duration::from_secs(15);

/// One pass over every pod; returns the pods not bound to a Node yet (with the scheduler's word).
async fn round(client: &Client, restd: &StandInRestd, addresses: &Addresses) -> Vec<String> {
    let pods: Api<Pod> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let (pods, nodes) = match (
        timed("listing pods", pods.list(&ListParams::default())).await,
        timed("listing Nodes", nodes.list(&ListParams::default())).await,
    ) {
        (Ok(p), Ok(n)) => (p.items, n.items),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("played kubelet: {e}");
            return vec![e];
        }
    };
    let host_ips: HashMap<String, String> = nodes
        .iter()
        .filter_map(|n| {
            let address = n.status.as_ref()?.addresses.as_ref()?.iter().find(|a| a.type_ == "InternalIP")?;
            Some((n.metadata.name.clone()?, address.address.clone()))
        })
        .collect();
    for pod in &pods {
        if let Err(e) = tend(client, restd, addresses, &host_ips, pod).await {
            let (ns, name) = (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref());
            eprintln!("played kubelet: pod {}/{}: {e}", ns.unwrap_or_default(), name.unwrap_or_default());
        }
    }
    pods.iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none() && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none()
        })
        .map(|p| {
            let conditions = p.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
            let why = conditions.iter().find(|c| c.type_ == "PodScheduled").and_then(|c| c.message.clone());
            let (ns, name) = (p.metadata.namespace.as_deref(), p.metadata.name.as_deref());
            format!("{}/{} ({})", ns.unwrap_or_default(), name.unwrap_or_default(), why.unwrap_or_default())
        })
        .collect()
}

fn running_and_ready(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else { return false };
    status.phase.as_deref() == Some("Running")
        && status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
}

fn owned_by_nodeset(pod: &Pod) -> bool {
    pod.metadata.owner_references.iter().flatten().any(|o| o.kind == "NodeSet")
}

/// slurmd's container arguments (the operator names the container `slurmd`).
fn slurmd_args(pod: &Pod) -> Vec<String> {
    let spec = pod.spec.as_ref();
    let slurmd = spec.and_then(|s| s.containers.iter().find(|c| c.name == "slurmd"));
    slurmd.and_then(|c| c.args.clone()).unwrap_or_default()
}

async fn tend(
    client: &Client,
    restd: &StandInRestd,
    addresses: &Addresses,
    host_ips: &HashMap<String, String>,
    pod: &Pod,
) -> Result<(), String> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    if pod.metadata.deletion_timestamp.is_some() {
        // The containers stopped: the kubelet removes the pod for good.
        let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        return match tokio::time::timeout(REQUEST, api.delete(&name, &now)).await {
            Ok(Ok(_)) | Ok(Err(kube::Error::Api(kube::core::ErrorResponse { code: 404, .. }))) => Ok(()),
            Ok(Err(e)) => Err(format!("deleting: {e}")),
            Err(_) => Err(format!("deleting: no answer within {REQUEST:?}")),
        };
    }
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else { return Ok(()) };
    if !running_and_ready(pod) {
        let host_ip = host_ips.get(&node).cloned().ok_or_else(|| format!("bound to unknown Node {node}"))?;
        let status = running_status(pod, &addresses.for_pod(pod), &host_ip);
        timed("marking it Running and Ready", api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)))
            .await?;
    }
    if owned_by_nodeset(pod) {
        // slurmd started: its dynamic node registers with Slurm (the stand-in).
        let slurm_name = pod.spec.as_ref().and_then(|s| s.hostname.clone()).unwrap_or(name);
        restd.register(&slurm_name, &slurmd_args(pod));
    }
    Ok(())
}

/// The status a kubelet reports for a started pod.
fn running_status(pod: &Pod, pod_ip: &str, host_ip: &str) -> Value {
    let spec = pod.spec.as_ref();
    let started = json!({ "running": { "startedAt": now() } });
    let containers: Vec<Value> = spec
        .map(|s| s.containers.iter())
        .into_iter()
        .flatten()
        .map(|c| {
            let image = c.image.clone().unwrap_or_default();
            json!({ "name": c.name, "image": image, "imageID": format!("{image}@played"), "ready": true,
                    "started": true, "restartCount": 0, "state": started })
        })
        .collect();
    let init: Vec<Value> = spec
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .map(|c| {
            let image = c.image.clone().unwrap_or_default();
            let sidecar = c.restart_policy.as_deref() == Some("Always");
            let state = if sidecar {
                started.clone()
            } else {
                json!({ "terminated": { "exitCode": 0, "reason": "Completed", "startedAt": now(), "finishedAt": now() } })
            };
            json!({ "name": c.name, "image": image, "imageID": format!("{image}@played"), "ready": sidecar,
                    "started": sidecar, "restartCount": 0, "state": state })
        })
        .collect();
    let condition = |t: &str| json!({ "type": t, "status": "True", "lastTransitionTime": now() });
    json!({ "status": {
        "phase": "Running", "podIP": pod_ip, "podIPs": [{ "ip": pod_ip }], "hostIP": host_ip,
        "hostIPs": [{ "ip": host_ip }], "startTime": now(),
        "conditions": [condition("PodScheduled"), condition("Initialized"), condition("ContainersReady"),
                       condition("Ready")],
        "containerStatuses": containers, "initContainerStatuses": init,
    }})
}
