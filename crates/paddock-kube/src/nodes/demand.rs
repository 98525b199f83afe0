//! The demand of a `kubernetes` cluster's elastic pools ([`TenantNodes::pod_demand`],
//! docs/tenants.md "Elastic pools"), read from the tenant's API server: its unschedulable pods
//! that a new node of a pool would take, and the pool's nodes that run nothing.
//!
//! The rules, all pure functions of what one paged list of the cluster's running and pending
//! pods gives:
//! - **Unschedulable**: a pod not bound to a node (`spec.nodeName` empty), not being deleted, not
//!   nominated to a node by a preemption, whose `PodScheduled` condition is `False` with reason
//!   `Unschedulable` (as kube-scheduler writes it).
//! - **Would fit the pool**: its `nodeSelector` and required node affinity hold for the labels a
//!   new node of the pool gets ([`pool_labels`]: the pool's labels, [`LABEL_NODE_POOL`], and the
//!   kubelet's `kubernetes.io/os` and `kubernetes.io/arch`; a term on `matchFields` or on
//!   another label never holds, since no name of a node to come is known), and its tolerations
//!   cover every `NoSchedule` and `NoExecute` taint of the pool. A pod that fits several pools
//!   counts for the first of them, in the order asked.
//! - **Nodes needed**: the pods of a pool, packed first fit, largest CPU request first, onto nodes
//!   of its machine class's size (CPU cores, memory, GPUs as `nvidia.com/gpu`, at most 110 pods
//!   a node, the kubelet's default). A pod's request is what the scheduler counts: the sum of its
//!   containers' requests or its largest init container's, whichever is more, plus its overhead.
//!   A pod larger than a whole node of the class never fits it and is not counted. The class's
//!   size is the machine's, not the node's allocatable (the kubelet's reservations and the
//!   DaemonSets take some): a pod that needs nearly a whole node may stay pending on the node
//!   that was grown for it.
//! - **Idle**: a node of the pool (a Node name of its active machines) on which only DaemonSet
//!   pods and mirror (static) pods run. Any other pod keeps it busy, a kube-system one included.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ListParams;
use kube::Api;
use paddock_domain::driver::{Demand, DemandPool, PoolDemand, TenantAccess};
use paddock_types::cluster::{Taint, TaintEffect};
use tracing::{debug, instrument};

use super::{KubeTenantNodes, LABEL_NODE_POOL};
use crate::KubeError;

/// The most pods the kubelet runs on a node by default (`maxPods`).
pub const MAX_PODS_PER_NODE: u64 = 110;
/// The annotation of a mirror pod (the API server's copy of a kubelet's static pod).
const ANNOTATION_MIRROR: &str = "kubernetes.io/config.mirror";
/// GPUs as the NVIDIA device plugin reports them.
const RESOURCE_GPU: &str = "nvidia.com/gpu";
const GIB: u64 = 1 << 30;

/// The labels a new node of `pool` carries for the scheduler: the pool's own, the pool label
/// paddock's node driver adds, and those every kubelet sets on paddock's node OS (amd64 Linux).
/// The machine-id and hostname labels are left out: no pod can ask for a node yet to come by them.
pub fn pool_labels(pool: &DemandPool) -> BTreeMap<String, String> {
    let mut labels = pool.labels.clone();
    labels.insert(LABEL_NODE_POOL.to_owned(), pool.name.clone());
    labels.insert("kubernetes.io/os".to_owned(), "linux".to_owned());
    labels.insert("kubernetes.io/arch".to_owned(), "amd64".to_owned());
    labels
}

/// Whether `pod` waits because no node can take it (see the module documentation).
pub fn unschedulable(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let status = pod.status.as_ref();
    let nominated = status.and_then(|s| s.nominated_node_name.as_deref()).is_some_and(|n| !n.is_empty());
    let waiting = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable"));
    spec.node_name.as_deref().unwrap_or_default().is_empty()
        && pod.metadata.deletion_timestamp.is_none()
        && !nominated
        && waiting
}

/// Whether one requirement of a node selector term holds for `labels`.
fn requirement_holds(r: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&r.key);
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(bound)) =
                (value.and_then(|v| v.parse::<i64>().ok()), values.first().and_then(|v| v.parse::<i64>().ok()))
            else {
                return false;
            };
            if r.operator == "Gt" {
                have > bound
            } else {
                have < bound
            }
        }
        _ => false,
    }
}

/// Whether a node selector term holds: every expression does, and it names no field (a node to
/// come has no name yet). An empty term holds for no node, as for the scheduler.
fn term_holds(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    !expressions.is_empty() && fields.is_empty() && expressions.iter().all(|r| requirement_holds(r, labels))
}

/// Whether `toleration` tolerates `taint`.
fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = serde_json::to_value(taint.effect).ok();
    let effect_ok = toleration
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || effect.as_ref().and_then(|v| v.as_str()) == Some(e));
    let key = toleration.key.as_deref().unwrap_or_default();
    match toleration.operator.as_deref().unwrap_or("Equal") {
        // An empty key with Exists tolerates every taint.
        "Exists" => effect_ok && (key.is_empty() || key == taint.key),
        "Equal" => effect_ok && key == taint.key && toleration.value.as_deref().unwrap_or_default() == taint.value,
        _ => false,
    }
}

/// Whether `pod` could be scheduled on a new node with `labels` and `taints` (its node
/// selector, its required node affinity, its tolerations of the taints that keep pods off).
pub fn fits_pool(pod: &Pod, labels: &BTreeMap<String, String>, taints: &[Taint]) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let selector = spec.node_selector.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    let affinity = required.is_none_or(|r| r.node_selector_terms.iter().any(|t| term_holds(t, labels)));
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    let tolerated = taints
        .iter()
        .filter(|t| t.effect != TaintEffect::PreferNoSchedule)
        .all(|t| tolerations.iter().any(|tol| tolerates(tol, t)));
    selector && affinity && tolerated
}

/// The value of a Kubernetes quantity (`500m`, `2`, `1.5Gi`, `1e9`, `128M`), or None.
pub fn quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let suffixes: [(&str, f64); 16] = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("K", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    for (suffix, factor) in suffixes {
        if let Some(number) = q.strip_suffix(suffix) {
            // `1E` is an exa-quantity, but `1e3` is a decimal exponent: parsed below.
            if let Ok(v) = number.parse::<f64>() {
                return Some(v * factor).filter(|v| v.is_finite() && *v >= 0.0);
            }
        }
    }
    q.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)
}

/// What a pod asks of a node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Request {
    /// CPU, millicores.
    pub cpu_milli: u64,
    /// Memory, bytes.
    pub memory: u64,
    /// GPUs.
    pub gpus: u64,
}

impl Request {
    fn of(requests: Option<&BTreeMap<String, Quantity>>) -> Self {
        let get = |name: &str, scale: f64| {
            let value = requests.and_then(|r| r.get(name)).and_then(|q| quantity(&q.0)).unwrap_or_default();
            // Rounded up, as the scheduler does for a fraction of a millicore.
            (value * scale).ceil() as u64
        };
        Self { cpu_milli: get("cpu", 1000.0), memory: get("memory", 1.0), gpus: get(RESOURCE_GPU, 1.0) }
    }

    fn plus(self, o: Self) -> Self {
        Self {
            cpu_milli: self.cpu_milli.saturating_add(o.cpu_milli),
            memory: self.memory.saturating_add(o.memory),
            gpus: self.gpus.saturating_add(o.gpus),
        }
    }

    fn max(self, o: Self) -> Self {
        Self {
            cpu_milli: self.cpu_milli.max(o.cpu_milli),
            memory: self.memory.max(o.memory),
            gpus: self.gpus.max(o.gpus),
        }
    }

    /// Whether this fits in `room`.
    pub fn fits(self, room: Self) -> bool {
        self.cpu_milli <= room.cpu_milli && self.memory <= room.memory && self.gpus <= room.gpus
    }

    fn minus(self, o: Self) -> Self {
        Self {
            cpu_milli: self.cpu_milli.saturating_sub(o.cpu_milli),
            memory: self.memory.saturating_sub(o.memory),
            gpus: self.gpus.saturating_sub(o.gpus),
        }
    }
}

/// What `pod` asks of a node, as the scheduler counts it (see the module documentation).
pub fn pod_request(pod: &Pod) -> Request {
    let Some(spec) = &pod.spec else { return Request::default() };
    let of =
        |c: &k8s_openapi::api::core::v1::Container| Request::of(c.resources.as_ref().and_then(|r| r.requests.as_ref()));
    let containers = spec.containers.iter().map(of).fold(Request::default(), Request::plus);
    let init = spec.init_containers.iter().flatten().map(of).fold(Request::default(), Request::max);
    containers.max(init).plus(Request::of(spec.overhead.as_ref()))
}

/// The size of a node of `pool`'s machine class.
fn node_size(pool: &DemandPool) -> Request {
    Request {
        cpu_milli: u64::from(pool.cpu_cores) * 1000,
        memory: u64::from(pool.memory_gib) * GIB,
        gpus: u64::from(pool.gpus),
    }
}

/// The nodes of size `size` that `requests` need, packed first fit, largest CPU first; requests
/// larger than a node are left out. Returns (the requests that fit a node, the nodes).
pub fn nodes_needed(requests: &[Request], size: Request) -> (u32, u32) {
    let mut sorted: Vec<Request> = requests.iter().copied().filter(|r| r.fits(size)).collect();
    sorted.sort_by_key(|r| std::cmp::Reverse((r.cpu_milli, r.memory, r.gpus)));
    // Room left on each node opened so far, and its pods.
    let mut nodes: Vec<(Request, u64)> = Vec::new();
    for r in &sorted {
        match nodes.iter_mut().find(|(room, pods)| r.fits(*room) && *pods < MAX_PODS_PER_NODE) {
            Some((room, pods)) => {
                *room = room.minus(*r);
                *pods += 1;
            }
            None => nodes.push((size.minus(*r), 1)),
        }
    }
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    (count(sorted.len()), count(nodes.len()))
}

/// Whether `pod` keeps its node busy: anything but a DaemonSet's pod or a mirror pod.
fn keeps_busy(pod: &Pod) -> bool {
    let daemon = pod.metadata.owner_references.iter().flatten().any(|o| o.kind == "DaemonSet");
    let mirror = pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(ANNOTATION_MIRROR));
    !daemon && !mirror
}

/// The demand of `pools` given the cluster's running and pending `pods` (see the module
/// documentation).
pub fn demand_of(pools: &[DemandPool], pods: &[Pod]) -> Demand {
    let shapes: Vec<_> = pools.iter().map(|p| (pool_labels(p), node_size(p))).collect();
    let mut waiting: Vec<Vec<Request>> = vec![Vec::new(); pools.len()];
    for pod in pods.iter().filter(|p| unschedulable(p)) {
        let request = pod_request(pod);
        let first = pools
            .iter()
            .zip(&shapes)
            .position(|(pool, (labels, size))| request.fits(*size) && fits_pool(pod, labels, &pool.taints));
        if let Some(i) = first {
            waiting[i].push(request);
        }
    }
    let busy: std::collections::BTreeSet<&str> = pods
        .iter()
        .filter(|p| keeps_busy(p))
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()))
        .collect();
    let mut demand = Demand::default();
    for ((pool, (_, size)), requests) in pools.iter().zip(&shapes).zip(&waiting) {
        let (pending, pending_nodes) = nodes_needed(requests, *size);
        let idle: Vec<&String> = pool.node_names.iter().filter(|n| !busy.contains(n.as_str())).collect();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        demand.pools.push(PoolDemand {
            pending,
            pending_nodes,
            nodes: count(pool.node_names.len()),
            idle_nodes: count(idle.len()),
        });
        demand.idle_node_names.extend(idle.into_iter().cloned());
    }
    demand
}

impl KubeTenantNodes {
    /// The demand of `pools` (see the module documentation): one paged list of the cluster's
    /// pods that are pending or running, in every namespace, at most
    /// [`super::NodeLimits::max_pods`].
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id))]
    pub async fn pod_demand(&self, tenant: &TenantAccess, pools: &[DemandPool]) -> Result<Demand, KubeError> {
        let cluster_id = tenant.cluster.cluster_id;
        let tc = self.tenant(tenant).await?;
        let api: Api<Pod> = Api::all(tc.client.clone());
        // Ended pods hold no node and wait for nothing: the API server leaves them out.
        let selector = "status.phase!=Succeeded,status.phase!=Failed";
        let mut params = ListParams::default().fields(selector).limit(self.limits.page);
        let mut pods = Vec::new();
        loop {
            let page = api.list(&params).await.map_err(|source| KubeError::api("list", "Pod", "*", source))?;
            pods.extend(page.items);
            if pods.len() > self.limits.max_pods {
                return Err(KubeError::TooManyPods { cluster_id, max: self.limits.max_pods });
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        let demand = demand_of(pools, &pods);
        debug!(pods = pods.len(), "read the demand of {} elastic pools of cluster {cluster_id}", pools.len());
        Ok(demand)
    }
}

#[cfg(test)]
mod tests;
