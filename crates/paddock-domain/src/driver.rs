//! The cluster side's driver seams (docs/architecture.md): what the cluster and machine reconcilers ask
//! of the platform cluster, of whatever runs tenant control planes, of a tenant cluster's own API
//! (nodes, the base stack) and of Slurm. The BMC seam is [`crate::bmc`].
//!
//! Every method is idempotent and starts from the observed state, so a crashed or repeated run
//! just converges again; names of external objects derive from our ids only. Not being ready is
//! never an error (it is a status: [`ControlPlaneStatus`], [`StackStatus`], [`SlurmStatus`]); failing to
//! talk to the system is a [`DriverError`].
//!
//! Implementations: `paddock_kube` (the real platform and tenant clusters, Kamaji, Slinky) and
//! `paddock_sim` (simulated, its world in PostgreSQL). Boxed futures, so the worker holds
//! `Arc<dyn ...>`.

use std::fmt;
use std::sync::Arc;

use paddock_types::cluster::{ClusterKind, NodePoolRole, RaySpec, SlurmSpec, SshHostKey, Taint};
use paddock_types::{ClusterId, Labels, MachineId, NodePoolId, TenantId};

pub use crate::bmc::BoxFuture;
use crate::secret::SecretString;

/// How a driver call failed, for the reconciler's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverErrorKind {
    /// Worth another try later (unreachable, timeout, 5xx, a conflict with a concurrent writer).
    Transient,
    /// Will not heal by itself (rejected object, missing permission, a foreign object in the way):
    /// the run fails visibly until someone fixes the cause.
    Permanent,
}

/// A failed driver call. The message names the object and the verb, never a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct DriverError {
    /// Classification.
    pub kind: DriverErrorKind,
    /// Stable snake_case code (`platform_unreachable`, `foreign_namespace`).
    pub code: String,
    /// Readable message, safe to show to the tenant's operators.
    pub message: String,
}

impl DriverError {
    /// A transient error.
    pub fn transient(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { kind: DriverErrorKind::Transient, code: code.into(), message: message.into() }
    }

    /// A permanent error.
    pub fn permanent(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { kind: DriverErrorKind::Permanent, code: code.into(), message: message.into() }
    }

    /// Whether retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        self.kind == DriverErrorKind::Transient
    }
}

/// The tenant cluster an external object belongs to. Object names derive from the ids only; the
/// names are informational (labels, annotations) and may change without renaming anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterRef {
    /// The owning tenant.
    pub tenant_id: TenantId,
    /// The tenant cluster.
    pub cluster_id: ClusterId,
    /// The tenant's name, for people reading the platform cluster.
    pub tenant_name: String,
    /// The cluster's name, for people reading the platform cluster.
    pub cluster_name: String,
}

/// Where the removal of an external object stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The object (and everything it owned) no longer exists.
    Gone,
    /// The object is being deleted (terminating, finalizers); ask again later.
    Deleting,
}

// ---------------------------------------------------------------------------------------------
// Step 1: the platform cluster.

/// What `ensure_isolation` found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Isolation {
    /// The cluster's namespace on the platform cluster.
    pub namespace: String,
    /// What this call had to create or correct (`Kind namespace/name`, or the simulated
    /// world's names); empty when everything already held. At rest that is drift: something
    /// changed or removed behind paddock's back.
    pub changed: Vec<String>,
}

/// The platform cluster: one namespace per tenant cluster with its isolation objects.
pub trait PlatformDriver: Send + Sync {
    /// Converges the cluster's namespace, NetworkPolicies, ResourceQuota and LimitRange.
    fn ensure_isolation<'a>(&'a self, cluster: &'a ClusterRef) -> BoxFuture<'a, Result<Isolation, DriverError>>;

    /// Deletes the cluster's namespace and everything in it. `Gone` only once it no longer exists.
    fn remove_isolation<'a>(&'a self, cluster: &'a ClusterRef) -> BoxFuture<'a, Result<Removal, DriverError>>;
}

// ---------------------------------------------------------------------------------------------
// Step 2: the tenant control plane.

/// How the tenant API server (and konnectivity) is exposed on the platform cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServiceType {
    /// A load balancer address (the default for machines outside the platform cluster).
    LoadBalancer,
    /// A port on every platform node.
    NodePort,
    /// Reachable from inside the platform cluster only.
    ClusterIP,
}

impl ServiceType {
    /// The Kubernetes Service type, as Kamaji's `serviceType` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LoadBalancer => "LoadBalancer",
            Self::NodePort => "NodePort",
            Self::ClusterIP => "ClusterIP",
        }
    }
}

impl fmt::Display for ServiceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The desired tenant control plane of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlaneSpec {
    /// The tenant cluster (names derive from its id; it lives in the cluster's namespace).
    pub cluster: ClusterRef,
    /// The tenant's Kubernetes version, e.g. `v1.34.1`.
    pub kubernetes_version: String,
    /// API server replicas.
    pub replicas: u32,
    /// How the API server is exposed.
    pub service_type: ServiceType,
    /// A dedicated DataStore by name; None lets the backend choose its default. Once set it
    /// cannot be unset.
    pub datastore: Option<String>,
}

/// What the backend reports about a control plane after ensuring it.
#[derive(Clone, PartialEq, Eq)]
pub struct ControlPlaneStatus {
    /// Every readiness condition holds.
    pub ready: bool,
    /// Why it is not ready (every missing condition, `; `-separated); empty when ready.
    pub reason: String,
    /// The API server endpoint as the backend publishes it (`host:port`), when known.
    pub endpoint: Option<String>,
    /// The admin kubeconfig, when the backend has written it. A secret: paddock stores it
    /// encrypted and never logs it ([`fmt::Debug`] prints its length only).
    pub admin_kubeconfig: Option<Vec<u8>>,
    /// What this call had to create or correct (`Kind namespace/name`, or the simulated
    /// world's names); empty when everything already held. At rest that is drift: something
    /// changed or removed behind paddock's back.
    pub changed: Vec<String>,
}

impl fmt::Debug for ControlPlaneStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kubeconfig = self.admin_kubeconfig.as_ref().map(|k| format!("[redacted, {} bytes]", k.len()));
        f.debug_struct("ControlPlaneStatus")
            .field("ready", &self.ready)
            .field("reason", &self.reason)
            .field("endpoint", &self.endpoint)
            .field("admin_kubeconfig", &kubeconfig)
            .field("changed", &self.changed)
            .finish()
    }
}

/// Runs tenant control planes (Kamaji).
pub trait ControlPlaneBackend: Send + Sync {
    /// Applies the desired control plane (a no-op when it already matches) and reports whether it
    /// is ready.
    fn ensure_control_plane<'a>(
        &'a self,
        spec: &'a ControlPlaneSpec,
    ) -> BoxFuture<'a, Result<ControlPlaneStatus, DriverError>>;

    /// Deletes the cluster's control plane. `Gone` only once it no longer exists.
    fn delete_control_plane<'a>(&'a self, cluster: &'a ClusterRef) -> BoxFuture<'a, Result<Removal, DriverError>>;
}

// ---------------------------------------------------------------------------------------------
// Inside a tenant cluster: nodes, the base stack, Slurm.

/// How paddock reaches a tenant cluster's own API server: with the admin kubeconfig the control
/// plane backend wrote (stored encrypted, opened only for the call).
#[derive(Debug, Clone)]
pub struct TenantAccess {
    /// The tenant cluster.
    pub cluster: ClusterRef,
    /// The API server endpoint (`host:port`).
    pub endpoint: String,
    /// The admin kubeconfig (YAML).
    pub admin_kubeconfig: SecretString,
}

/// The machine a node is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRef {
    /// The machine.
    pub machine_id: MachineId,
    /// Its node pool.
    pub node_pool_id: NodePoolId,
    /// The pool's name (nodes are labelled with it; it names the Slurm NodeSet).
    pub pool_name: String,
    /// The node name the machine registers with (derived from the machine, stable).
    pub node_name: String,
    /// The machine's system UUID: how a registered Node is matched to the machine.
    pub system_uuid: String,
    /// Labels the node must carry (the pool's).
    pub labels: Labels,
    /// Taints the node must carry (the pool's).
    pub taints: Vec<Taint>,
}

/// A node of a tenant cluster as its API server reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// The Node's name.
    pub name: String,
    /// Whether its `Ready` condition is `True`.
    pub ready: bool,
}

/// A Node registered in a tenant cluster, with the system UUID its kubelet reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredNode {
    /// The Node's name.
    pub name: String,
    /// Its `status.nodeInfo.systemUUID`: how it is matched to a machine.
    pub system_uuid: String,
    /// Whether its `Ready` condition is `True`.
    pub ready: bool,
    /// While it is not Ready: since when (its `Ready` condition's last transition), if known.
    pub not_ready_since: Option<chrono::DateTime<chrono::Utc>>,
}

/// Where the drain of a machine's Node stands (docs/architecture.md, "Release").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drain {
    /// The Node is cordoned and none of its evictable pods is left (or there is no Node).
    Drained,
    /// Pods are still on the Node: `leaving` were evicted (or are terminating) and have not gone
    /// yet; `blocked` were refused by a PodDisruptionBudget and are asked again on the next poll.
    Draining {
        /// Evicted or terminating pods not gone yet.
        leaving: usize,
        /// Pods whose eviction a PodDisruptionBudget refused (429) this time.
        blocked: usize,
    },
}

/// Where the Slurm drain of a released machine's node stands (docs/architecture.md, "Release").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlurmDrain {
    /// DRAIN is set with paddock's reason and jobs still run there: the NodeSet keeps the node's
    /// slurmd pod (its replicas are not lowered for it yet).
    Draining,
    /// No job is left (or Slurm does not know the node) and this call handed the node's slurmd
    /// pod to the NodeSet's scale-down: the cluster's next run lowers the NodeSet, whose operator
    /// then deletes exactly that pod. Wake the cluster.
    HandedOver,
    /// Handed over before, or no slurmd pod there: only the pod's leaving is left to wait for.
    Done,
}

/// The configuration a machine needs to join a tenant cluster. A driver gives at least the agent
/// contract's keys (docs/security.md): `api_endpoint`, `ca_cert` (PEM), `ca_cert_hash` (the
/// `sha256:<hex>` pin) and `bootstrap_token`; anything else it needs besides. A secret as a whole
/// (it goes into the machine's sealed agent configuration).
#[derive(Clone, PartialEq, Eq)]
pub struct JoinConfig(pub serde_json::Value);

impl fmt::Debug for JoinConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JoinConfig([redacted])")
    }
}

/// An autoscaled pool whose demand is asked for (docs/tenants.md, "Elastic pools").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemandPool {
    /// The pool.
    pub node_pool_id: NodePoolId,
    /// Its name (its NodeSet's and, by default, its partition's).
    pub name: String,
    /// The Slurm partitions its nodes are in (`slurm` clusters).
    pub partitions: Vec<String>,
    /// The Node names its machines have.
    pub node_names: Vec<String>,
    /// Its nodes' labels (what a pod's node selector must match).
    pub labels: Labels,
    /// Its nodes' taints (what a pod must tolerate).
    pub taints: Vec<Taint>,
    /// CPU cores per machine of its class (a pod's share of a node).
    pub cpu_cores: u32,
    /// Memory per machine of its class, GiB.
    pub memory_gib: u32,
    /// GPUs per machine of its class.
    pub gpus: u32,
}

/// What a pool's workload asks of it, as its scheduler reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolDemand {
    /// Jobs pending in the pool's partitions (`slurm`), or unschedulable pods that would fit the
    /// pool (`kubernetes`).
    pub pending: u32,
    /// The nodes those need besides the busy ones (what is pending runs on no node yet): the
    /// pool wants its busy nodes plus these.
    pub pending_nodes: u32,
    /// The pool's nodes the scheduler knows.
    pub nodes: u32,
    /// Of those, the ones running nothing.
    pub idle_nodes: u32,
}

impl PoolDemand {
    /// The pool's nodes running something.
    pub fn busy_nodes(&self) -> u32 {
        self.nodes.saturating_sub(self.idle_nodes)
    }
}

/// The answer of a demand read: per pool (in the order asked), the idle Node names, the first
/// to give back when the pool shrinks, and the pending jobs of several nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Demand {
    /// Per pool asked for, in order.
    pub pools: Vec<PoolDemand>,
    /// Idle Node names of those pools.
    pub idle_node_names: Vec<String>,
    /// The pending jobs of more than one node counted in `pools` (`slurm`): the autoscaler sets
    /// apart those wider than a pool can ever be (docs/tenants.md, "Elastic pools").
    pub wide_jobs: Vec<WideJob>,
}

/// A pending job of more than one node, as counted in its pool's [`PoolDemand`] (one of its
/// `pending`, its `nodes` in `pending_nodes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WideJob {
    /// The pool it counts for.
    pub node_pool_id: NodePoolId,
    /// The scheduler's id of the job.
    pub job: String,
    /// The whole nodes it asks for.
    pub nodes: u32,
}

/// A driver that cannot read demand (the real drivers before their demand read lands).
pub fn demand_unsupported() -> DriverError {
    DriverError::permanent("demand_unsupported", "this driver cannot read the demand of autoscaled pools")
}

/// A tenant cluster's nodes: joining machines and matching them to Nodes.
pub trait TenantNodes: Send + Sync {
    /// The demand of `pools` of a `kubernetes` cluster: its unschedulable pods whose node
    /// selector the pool's labels satisfy and whose tolerations cover the pool's taints, and the
    /// nodes they need by their requests against the class's size.
    fn pod_demand<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        pools: &'a [DemandPool],
    ) -> BoxFuture<'a, Result<Demand, DriverError>> {
        let _ = (tenant, pools);
        Box::pin(async { Err(demand_unsupported()) })
    }

    /// A join configuration for `node` (a fresh bootstrap token, valid for `ttl_seconds`).
    fn join_config<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
        ttl_seconds: u64,
    ) -> BoxFuture<'a, Result<JoinConfig, DriverError>>;

    /// The registered Node whose `systemUUID` is `node.system_uuid`, if any; also converges its
    /// labels and taints to the pool's.
    fn node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Option<NodeStatus>, DriverError>>;

    /// Every Node registered in the tenant cluster, in one read: how the cluster reconciler sees
    /// the Node of an active machine go NotReady.
    fn registered_nodes<'a>(
        &'a self,
        tenant: &'a TenantAccess,
    ) -> BoxFuture<'a, Result<Vec<RegisteredNode>, DriverError>>;

    /// Cordons the machine's Node (`spec.unschedulable`) and evicts its pods through the Eviction
    /// subresource, honouring PodDisruptionBudgets, leaving DaemonSet and mirror pods (as
    /// `kubectl drain --ignore-daemonsets` does). `Drained` once no evictable pod is left on it;
    /// a refusal by a budget is a wait, not an error. Repeated until drained.
    fn drain_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Drain, DriverError>>;

    /// The `systemUUID` of a Node registered under `node.node_name` that is not the machine's
    /// (another machine's kubelet took its name), if there is one. A Node that has not reported
    /// a UUID yet is none.
    fn foreign_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Option<String>, DriverError>>;

    /// Removes the machine's Nodes (its node name, or its system UUID) and then the Lease of its
    /// node name from the tenant cluster. `Gone` once neither exists.
    fn remove_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Removal, DriverError>>;

    /// Deletes every bootstrap token minted for `node`'s machine (its Node has registered, so
    /// none is needed any more). Tokens already gone count as deleted.
    fn delete_join_tokens<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<(), DriverError>>;

    /// A forced release's cleanup (docs/security.md), once the machine is powered off: deletes the
    /// machine's Nodes and their Leases without waiting for them to go (a finalizer may keep a
    /// Node terminating; that no longer holds the machine). The caller treats a failure as
    /// best effort.
    fn abandon_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<(), DriverError>>;
}

/// Where a tenant's base stack stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackStatus {
    /// Every component applied and ready.
    pub ready: bool,
    /// Why not (readable; empty when ready).
    pub reason: String,
    /// The stack version applied (the cluster records it).
    pub version: String,
    /// What this call had to create or correct (`Kind namespace/name`, or the simulated
    /// world's names); empty when everything already held. At rest that is drift: something
    /// changed or removed behind paddock's back.
    pub changed: Vec<String>,
}

/// The tenant base stack (docs/architecture.md, cluster reconciler step 4): a CNI, the NVIDIA device plugin, a storage
/// class, Slinky's CRDs and operator, applied in order from digest-pinned manifests.
pub trait TenantStack: Send + Sync {
    /// Applies the base stack `version` (the cluster's, one of the embedded definitions; a no-op
    /// when it already matches), the components applied into clusters of `kind`, and reports
    /// whether it is ready. An unknown version is permanent.
    fn ensure_stack<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        version: &'a str,
        kind: ClusterKind,
    ) -> BoxFuture<'a, Result<StackStatus, DriverError>>;
}

/// The tenant's own credentials for its cluster (docs/architecture.md, cluster reconciler step 2): a kubeconfig for a
/// per-cluster ServiceAccount bound to cluster-admin in the tenant cluster, with a TokenRequest
/// token of a bounded lifetime. Never the admin (or super-admin) credentials paddock itself uses.
pub trait TenantCredentials: Send + Sync {
    /// Ensures the ServiceAccount and its binding, requests a token valid for `ttl_seconds`, and
    /// returns a kubeconfig (YAML) for the tenant API server at `tenant.endpoint`.
    fn tenant_kubeconfig<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        ttl_seconds: u64,
    ) -> BoxFuture<'a, Result<SecretString, DriverError>>;
}

/// A node pool as Slurm sees it: one NodeSet pinned to the pool's nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmPool {
    /// The pool.
    pub node_pool_id: NodePoolId,
    /// The pool's name (the NodeSet's and the default partition's).
    pub name: String,
    /// Desired node count.
    pub count: u32,
    /// The Node names currently held by the pool.
    pub node_names: Vec<String>,
    /// The Node names of the pool's machines being released: their slurmd pods (like those on
    /// `node_names`) stay counted in the NodeSet's replicas until their release hands them over
    /// ([`SlurmDrain::HandedOver`]).
    pub releasing: Vec<String>,
    /// GPUs per node (the machine class's): the NodeSet's GRES.
    pub gpus_per_node: u32,
    /// CPU cores and memory (GiB) per machine of the pool's class: the size Slurm's
    /// configuration gives an elastic pool's nodes to come.
    pub class_size: (u32, u32),
    /// The pool's `autoscaling.max`, when it is elastic: Slurm's configuration declares that
    /// many nodes of the pool ahead of its machines, so that work for them is accepted.
    pub autoscaling_max: Option<u32>,
    /// The pool's taints: the NodeSet's pods (the control pods, for the system pool) tolerate them.
    pub taints: Vec<Taint>,
    /// `compute`: one NodeSet; `system`: no NodeSet, the control pods and their volumes.
    pub role: NodePoolRole,
}

/// The secrets of one cluster's Slurm, generated once by paddock, stored sealed in its database
/// and re-applied unchanged: a rotation is a deliberate act, never an accident of a reconcile.
#[derive(Debug, Clone)]
pub struct SlurmSecrets {
    /// `slurm.key` (auth/slurm), base64 of 1024 random bytes.
    pub slurm_key: SecretString,
    /// The HS256 key slurmctld and slurmrestd sign JWTs with, base64 of 64 random bytes.
    pub jwt_hs256_key: SecretString,
    /// The accounting database password (alphanumeric).
    pub database_password: SecretString,
}

/// The desired Slurm of one cluster.
#[derive(Debug, Clone)]
pub struct SlurmDesired {
    /// The cluster's Slurm section.
    pub spec: SlurmSpec,
    /// The cluster's base stack version (whose images Slurm runs).
    pub stack_version: String,
    /// Its pools.
    pub pools: Vec<SlurmPool>,
    /// Its secrets.
    pub secrets: SlurmSecrets,
}

/// The Slurm a cluster runs: a release of its base stack's catalogue (whose images, and whose
/// pinned slurmrestd version, the driver uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmVersion {
    /// The cluster's base stack version.
    pub stack_version: String,
    /// Its `slurm.version`.
    pub version: String,
}

/// A Slurm node as slurmrestd reports it, and the Kubernetes Node its slurmd pod runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmNodeState {
    /// The Slurm node's name (its slurmd pod's hostname).
    pub slurm_node: String,
    /// The Kubernetes Node it runs on: its machine's [`node_name`].
    pub node_name: String,
    /// Its state flags (`IDLE`, `ALLOCATED`, `DRAIN`, `DOWN`, ...).
    pub states: Vec<String>,
    /// Its reason (why it drains or is down), empty when none.
    pub reason: String,
}

/// Something in a cluster's Slurm that waiting does not heal (a crash-looping slurmctld): the
/// cluster is `degraded` while it lasts, with this as `SlurmReady`'s reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmFault {
    /// A CamelCase reason, e.g. `ControllerCrashLoopBackOff`.
    pub reason: String,
    /// What is wrong, readable (no log lines, no secrets).
    pub message: String,
}

/// Where a cluster's Slurm stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmStatus {
    /// Every Slurm workload ready and slurmrestd answering its ping.
    pub ready: bool,
    /// Why not (what it waits for, readable; empty when ready).
    pub reason: String,
    /// slurmrestd's address, once published.
    pub rest_api: Option<String>,
    /// The login nodes' SSH address, once published.
    pub login_ssh: Option<String>,
    /// The login nodes' SSH host keys, once published (sorted by algorithm).
    pub login_ssh_host_keys: Vec<SshHostKey>,
    /// What this call had to create or correct (`Kind namespace/name`, or the simulated
    /// world's names); empty when everything already held. At rest that is drift: something
    /// changed or removed behind paddock's back.
    pub changed: Vec<String>,
    /// A fault that waiting does not heal (then `ready` is false).
    pub fault: Option<SlurmFault>,
}

/// Slurm in a tenant cluster through Slinky (docs/architecture.md, cluster reconciler step 5).
pub trait SlurmDriver: Send + Sync {
    /// Applies the cluster's Slurm (secrets generated once, accounting, controller, REST API,
    /// login, one NodeSet per pool, partitions) and reports whether it is ready, including a
    /// slurmrestd ping.
    fn ensure_slurm<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        desired: &'a SlurmDesired,
    ) -> BoxFuture<'a, Result<SlurmStatus, DriverError>>;

    /// Drains the Slurm node on `node_name` before its machine is released, speaking to the
    /// cluster's Slurm `slurm` runs (its release's pinned REST version), and once it is drained
    /// hands its slurmd pod to the NodeSet's scale-down ([`SlurmDrain`]). Repeated until not
    /// `Draining`.
    fn drain_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        slurm: &'a SlurmVersion,
        node_name: &'a str,
    ) -> BoxFuture<'a, Result<SlurmDrain, DriverError>>;

    /// Deletes the cluster's Slurm. `Gone` once every Slurm object no longer exists.
    fn remove_slurm<'a>(&'a self, tenant: &'a TenantAccess) -> BoxFuture<'a, Result<Removal, DriverError>>;

    /// The cluster's Slurm nodes that run on a Kubernetes Node (the slurmd pods of its NodeSets),
    /// each with that Node, its state flags and its reason, read through slurmrestd
    /// (`GET /slurm/<version>/nodes`, the version `slurm`'s release pins): what
    /// [`crate::health::slurm_node_rating`] reads a machine's health from. A driver that cannot
    /// read them reads none.
    fn node_states<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        slurm: &'a SlurmVersion,
    ) -> BoxFuture<'a, Result<Vec<SlurmNodeState>, DriverError>> {
        let _ = (tenant, slurm);
        Box::pin(async { Ok(Vec::new()) })
    }

    /// The demand of `pools` read through slurmrestd: the jobs pending in each pool's partitions
    /// and the nodes they ask for, and the pool's nodes Slurm knows and which of them are idle.
    fn job_demand<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        slurm: &'a SlurmVersion,
        pools: &'a [DemandPool],
    ) -> BoxFuture<'a, Result<Demand, DriverError>> {
        let _ = (tenant, slurm, pools);
        Box::pin(async { Err(demand_unsupported()) })
    }

    /// Makes the cluster's Slurm accounting hold `desired` (users, accounts, QOS, associations)
    /// and nothing more of paddock's ([`crate::slurm_identity::plan`]), through slurmrestd's
    /// `slurmdb` endpoints in the version `slurm`'s release pins. Returns what it had to write
    /// (each change, readable); empty when Slurm already held it.
    fn sync_identity<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        slurm: &'a SlurmVersion,
        desired: &'a crate::slurm_identity::Slurmdb,
    ) -> BoxFuture<'a, Result<Vec<String>, DriverError>> {
        let _ = (tenant, slurm, desired);
        Box::pin(async { Err(identity_unsupported()) })
    }
}

/// The error of a Slurm driver that cannot write a cluster's accounting.
pub fn identity_unsupported() -> DriverError {
    DriverError::permanent("identity_unsupported", "this Slurm driver cannot write Slurm's users and accounts")
}

/// A node pool as Ray sees it: one worker group pinned to the pool's nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RayPool {
    /// The pool.
    pub node_pool_id: NodePoolId,
    /// Its name (the worker group's name).
    pub name: String,
    /// Its desired machines (the worker group's replicas).
    pub count: u32,
    /// GPUs per machine, from the pool's class (requested by each worker).
    pub gpus_per_node: u32,
    /// The pool's taints (tolerated by its workers, and by the head on the head pool).
    pub taints: Vec<Taint>,
}

/// The desired Ray of one `ray` cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RayDesired {
    /// The cluster's Ray section, its version resolved.
    pub spec: RaySpec,
    /// The cluster's base stack version (whose Ray catalogue names the images).
    pub stack_version: String,
    /// Every pool of the cluster (each a worker group).
    pub pools: Vec<RayPool>,
}

/// Where a cluster's Ray stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RayStatus {
    /// The operator reports the RayCluster ready (every pod running and ready, the current
    /// generation observed) and the head answers its health check.
    pub ready: bool,
    /// What is missing, when not ready.
    pub reason: String,
    /// `ray://<head service>.<namespace>.svc:10001`, once the head's Service exists.
    pub ray_client: Option<String>,
    /// The dashboard's in-cluster address, once the head's Service exists and the dashboard is on.
    pub dashboard: Option<String>,
    /// Objects this call created or changed (for drift reports).
    pub changed: Vec<String>,
}

/// Ray in a tenant cluster through KubeRay (docs/architecture.md, cluster reconciler step 5 for
/// `kind: ray`).
pub trait RayDriver: Send + Sync {
    /// Applies the cluster's RayCluster (head on the head pool, one worker group per pool) and
    /// reports whether it is ready.
    fn ensure_ray<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        desired: &'a RayDesired,
    ) -> BoxFuture<'a, Result<RayStatus, DriverError>>;

    /// Deletes the cluster's RayCluster. `Gone` once it and its pods no longer exist.
    fn remove_ray<'a>(&'a self, tenant: &'a TenantAccess) -> BoxFuture<'a, Result<Removal, DriverError>>;
}

/// The cluster-side drivers the reconcilers use, chosen together by `PADDOCK_KUBE_DRIVER`.
#[derive(Clone)]
pub struct KubeDrivers {
    /// Step 1.
    pub platform: Arc<dyn PlatformDriver>,
    /// Step 2.
    pub control_plane: Arc<dyn ControlPlaneBackend>,
    /// Step 3: joining machines.
    pub nodes: Arc<dyn TenantNodes>,
    /// Step 4.
    pub stack: Arc<dyn TenantStack>,
    /// Step 5.
    pub slurm: Arc<dyn SlurmDriver>,
    /// Step 5 of a `ray` cluster.
    pub ray: Arc<dyn RayDriver>,
    /// The tenant's kubeconfig.
    pub credentials: Arc<dyn TenantCredentials>,
}

impl fmt::Debug for KubeDrivers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeDrivers").finish_non_exhaustive()
    }
}

/// The Node name of a machine: derived from the machine's id, so it is stable across
/// re-provisioning and never collides between clusters.
pub fn node_name(machine: MachineId) -> String {
    format!("m-{}", machine.uuid().simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_secrets() {
        let status = ControlPlaneStatus {
            ready: true,
            reason: String::new(),
            endpoint: Some("10.0.0.1:6443".to_owned()),
            admin_kubeconfig: Some(b"client-key-data: SECRET".to_vec()),
            changed: Vec::new(),
        };
        let shown = format!("{status:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("redacted, 23 bytes"), "{shown}");
        let join = JoinConfig(serde_json::json!({"token": "abcdef.0123456789abcdef"}));
        assert!(!format!("{join:?}").contains("abcdef"));
    }

    #[test]
    fn the_traits_are_object_safe() {
        fn takes(_: Option<KubeDrivers>) {}
        takes(None);
    }

    #[test]
    fn node_names_are_dns_labels() {
        let name = node_name(MachineId(uuid::Uuid::now_v7()));
        assert_eq!(name.len(), 34);
        assert!(name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
    }
}
