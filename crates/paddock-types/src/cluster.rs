//! Clusters and node pools: a tenant's cluster with its own control plane and dedicated machines.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{ClusterId, Labels, NodePoolId, TenantId};

/// Default Kubernetes version of new clusters.
pub const DEFAULT_KUBERNETES_VERSION: &str = "v1.35.0";
/// Default Slurm version of new Slurm clusters.
pub const DEFAULT_SLURM_VERSION: &str = "26.05";

/// What a cluster runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClusterKind {
    /// Kubernetes with Slurm on top (Slinky).
    Slurm,
    /// Plain Kubernetes.
    Kubernetes,
    /// Kubernetes with a Ray cluster on top (KubeRay).
    Ray,
}

impl ClusterKind {
    /// The stored and wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Slurm => "slurm",
            Self::Kubernetes => "kubernetes",
            Self::Ray => "ray",
        }
    }
}

/// How a cluster is isolated; only dedicated machines exist today.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum Isolation {
    /// Dedicated machines, wiped before and after the tenancy.
    #[serde(rename = "private-nodes")]
    PrivateNodes,
}

/// Where a cluster is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClusterPhase {
    /// Accepted, nothing built yet (or waiting for machines).
    Pending,
    /// Being built.
    Provisioning,
    /// Everything converged.
    Ready,
    /// A spec change is being applied.
    Updating,
    /// Running, but something is not ready.
    Degraded,
    /// Being deleted; gone (404) once deletion completes.
    Deleting,
    /// Stopped on a permanent error (see conditions).
    Failed,
}

impl ClusterPhase {
    /// Every phase.
    pub const ALL: [ClusterPhase; 7] =
        [Self::Pending, Self::Provisioning, Self::Ready, Self::Updating, Self::Degraded, Self::Deleting, Self::Failed];

    /// The stored and wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Provisioning => "provisioning",
            Self::Ready => "ready",
            Self::Updating => "updating",
            Self::Degraded => "degraded",
            Self::Deleting => "deleting",
            Self::Failed => "failed",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// The effect of a taint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum TaintEffect {
    /// Pods without a toleration are not scheduled.
    NoSchedule,
    /// The scheduler avoids the node.
    PreferNoSchedule,
    /// Pods without a toleration are evicted.
    NoExecute,
}

/// What a node pool is for. In a `slurm` cluster exactly one pool is the `system` pool: it
/// carries Slurm's control pods (slurmctld, slurmrestd, slurmdbd, MariaDB, the login pods) and
/// their volumes, gets no NodeSet (no compute jobs), is never scaled down or deleted while the
/// cluster lives, and has at least one node. Every other pool is a `compute` pool: one NodeSet
/// each. A `kubernetes` cluster has only `compute` pools (its control plane is hosted; paddock
/// puts no state of its own on the tenant's nodes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodePoolRole {
    /// Runs the tenant's work (a Slurm NodeSet in a `slurm` cluster).
    #[default]
    Compute,
    /// Carries Slurm's control pods and their volumes (`slurm` clusters only).
    System,
}

impl NodePoolRole {
    /// The stored and wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Compute => "compute",
            Self::System => "system",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Compute, Self::System].into_iter().find(|r| r.as_str() == s)
    }
}

/// A Kubernetes taint put on every node of a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Taint {
    /// Taint key (label key syntax).
    #[schema(min_length = 1, max_length = 316)]
    pub key: String,
    /// Taint value (label value syntax).
    #[serde(default)]
    #[schema(max_length = 63)]
    pub value: String,
    /// Effect.
    pub effect: TaintEffect,
}

/// Body of `POST .../node-pools`, and a pool within `ClusterCreate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "cpu", "machine_class": "cpu-epyc", "count": 4, "labels": {"team": "data"}, "taints": [{"key": "dedicated", "value": "data", "effect": "NoSchedule"}]}))]
pub struct NodePoolCreate {
    /// DNS-1123 label, unique in the cluster; also names the Slurm NodeSet and default partition.
    #[schema(min_length = 1, max_length = 30, pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
    pub name: String,
    /// Name of the machine class every node of the pool has.
    #[schema(min_length = 1, max_length = 63)]
    pub machine_class: String,
    /// Desired number of machines.
    #[schema(minimum = 0, maximum = 10000)]
    pub count: u32,
    /// Labels put on every node.
    #[serde(default)]
    #[schema(value_type = std::collections::HashMap<String, String>)]
    pub labels: Labels,
    /// Taints put on every node.
    #[serde(default)]
    #[schema(max_items = 32)]
    pub taints: Vec<Taint>,
    /// `system` for the one pool of a `slurm` cluster that carries Slurm's control pods (see
    /// `NodePoolRole`); fixed at creation.
    #[serde(default)]
    pub role: NodePoolRole,
    /// Whether a `failed` health report replaces a machine of the pool on its own (default
    /// `{"automatic": true}`); fixed at creation.
    #[serde(default)]
    pub remediation: crate::remediation::NodePoolRemediation,
    /// Makes the pool elastic (compute pools only): it grows with demand up to `max` and shrinks
    /// down to `min` (zero included); `count` is then its initial size, within `[min, max]`, and
    /// the autoscaler's target is `status.desired_count`. Quotas are checked against `max`.
    #[serde(default)]
    pub autoscaling: Option<NodePoolAutoscaling>,
}

/// Default of `autoscaling.scale_down_delay_seconds`.
pub const SCALE_DOWN_DELAY_DEFAULT: u32 = 600;
/// Longest accepted scaling delay, in seconds (one day).
pub const SCALE_DELAY_MAX: u32 = 86_400;

/// How an elastic node pool follows demand: Slurm's pending jobs in the pool's partitions, or
/// a `kubernetes` cluster's unschedulable pods that would fit the pool's nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"min": 0, "max": 8, "scale_down_delay_seconds": 600, "scale_up_delay_seconds": 0}))]
pub struct NodePoolAutoscaling {
    /// Fewest machines the pool keeps (0: it may shrink to none).
    #[schema(minimum = 0, maximum = 10000)]
    pub min: u32,
    /// Most machines the pool grows to (`min <= max`); what quotas are checked against.
    #[schema(minimum = 0, maximum = 10000)]
    pub max: u32,
    /// How long demand must have needed fewer nodes than the pool holds, without a break, before
    /// the pool shrinks (its idle nodes drained, then released and wiped).
    #[serde(default = "scale_down_delay")]
    #[schema(minimum = 0, maximum = 86400, default = 600)]
    pub scale_down_delay_seconds: u32,
    /// How long demand must have needed more nodes than the pool holds, without a break, before
    /// the pool grows.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 86400, default = 0)]
    pub scale_up_delay_seconds: u32,
}

fn scale_down_delay() -> u32 {
    SCALE_DOWN_DELAY_DEFAULT
}

/// Body of `PATCH .../node-pools/{pool_id}` (JSON merge patch): `count`, `labels`, `taints`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"count": 6}))]
pub struct NodePoolUpdate {
    /// Desired number of machines.
    #[schema(minimum = 0, maximum = 10000)]
    pub count: Option<u32>,
    /// Labels to set; a null value removes that label.
    #[schema(value_type = Option<std::collections::HashMap<String, Option<String>>>)]
    pub labels: Option<serde_json::Value>,
    /// The new taints (replaces the list).
    #[schema(max_items = 32)]
    pub taints: Option<Vec<Taint>>,
    /// The pool's autoscaling (merged into the current one); `null` turns it off, the pool keeping
    /// its current target as `count` unless the patch sets `count`. While a pool is autoscaled its
    /// `count` is not patched (409 `autoscaled_count`).
    pub autoscaling: Option<NodePoolAutoscaling>,
}

/// A Slurm partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Partition {
    /// Partition name (DNS-1123 label).
    #[schema(min_length = 1, max_length = 30, pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
    pub name: String,
    /// Names of the node pools in the partition.
    #[schema(min_items = 1, max_items = 64)]
    pub node_pools: Vec<String>,
    /// Whether this is the default partition (at most one).
    #[serde(default)]
    pub default: bool,
    /// Slurm time limit (`UNLIMITED`, `minutes`, `hours:minutes:seconds`, `days-hours[:minutes[:seconds]]`).
    #[serde(default)]
    #[schema(max_length = 32, example = "2-00:00:00")]
    pub max_time: Option<String>,
}

/// Login nodes of a Slurm cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginSpec {
    /// Login pods.
    #[serde(default = "one")]
    #[schema(minimum = 0, maximum = 10, default = 1)]
    pub replicas: u32,
    /// OpenSSH public keys allowed to log in as root.
    #[serde(default)]
    #[schema(max_items = 64)]
    pub ssh_authorized_keys: Vec<String>,
}

fn one() -> u32 {
    1
}

impl Default for LoginSpec {
    fn default() -> Self {
        Self { replicas: 1, ssh_authorized_keys: Vec::new() }
    }
}

/// Most Slurm accounts a cluster maps.
pub const MAX_SLURM_ACCOUNTS: usize = 64;

/// Limits of a Slurm account, written as the account's QOS (`paddock-<account>`), whose jobs
/// are the account's: a limit left out is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"max_jobs": 100, "gpu_minutes": 600000}))]
pub struct SlurmAccountLimits {
    /// Jobs of the account running at once (Slurm's `GrpJobs` on the QOS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, minimum = 1, maximum = 1000000)]
    pub max_jobs: Option<u32>,
    /// GPU minutes the account's jobs may use in all (Slurm's `GrpTRESMins=gres/gpu=<n>` on the
    /// QOS): running jobs are charged as they run, and once spent no job of the account starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, minimum = 1, maximum = 1000000000000_i64)]
    pub gpu_minutes: Option<u64>,
}

/// One of the tenant's SCIM groups as a Slurm account of the cluster: every active member of the
/// group is a Slurm user with an association in the account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"group": "ml-team", "account": "ml", "fairshare": 10, "limits": {"max_jobs": 100, "gpu_minutes": 600000}}))]
pub struct SlurmAccount {
    /// The SCIM group's `displayName` (matched without regard to case); a group of the tenant.
    #[schema(min_length = 1, max_length = 256)]
    pub group: String,
    /// The Slurm account's name; default: the group's name in lower case, which must then be a
    /// Slurm account name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, min_length = 1, max_length = 63, pattern = "^[a-z0-9][a-z0-9_.-]*$")]
    pub account: Option<String>,
    /// The account's fair-share weight (Slurm's `Fairshare`, its association's raw shares).
    #[serde(default = "one")]
    #[schema(minimum = 1, maximum = 1000000, default = 1)]
    pub fairshare: u32,
    /// Limits of the account's jobs.
    #[serde(default)]
    pub limits: SlurmAccountLimits,
}

impl SlurmAccount {
    /// The Slurm account's name: `account`, else the group's name in lower case.
    pub fn account_name(&self) -> String {
        self.account.clone().unwrap_or_else(|| self.group.to_lowercase())
    }
}

/// Slurm settings of a `slurm` cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SlurmSpec {
    /// Slurm version.
    #[serde(default = "default_slurm_version")]
    #[schema(max_length = 32, pattern = "^[0-9]{2}\\.[0-9]{2}(\\.[0-9]{1,3})?$", default = "26.05")]
    pub version: String,
    /// Partitions; default: one per node pool, the first pool's the default.
    #[serde(default)]
    #[schema(max_items = 64)]
    pub partitions: Vec<Partition>,
    /// Login nodes.
    #[serde(default)]
    pub login: LoginSpec,
    /// Which of the tenant's SCIM groups are Slurm accounts (in order: a user's default account
    /// is the first that maps them); their active members are the cluster's Slurm users.
    #[serde(default)]
    #[schema(max_items = 64)]
    pub accounts: Vec<SlurmAccount>,
    /// What happens to the pending and running jobs of a user who loses an association of
    /// `accounts` (deactivated, deleted, out of the group): `false` (default) leaves them to end,
    /// the user locked out of new jobs meanwhile; `true` cancels them (`scancel`).
    #[serde(default)]
    pub cancel_jobs_on_removal: bool,
}

fn default_slurm_version() -> String {
    DEFAULT_SLURM_VERSION.to_owned()
}

impl Default for SlurmSpec {
    fn default() -> Self {
        Self {
            version: default_slurm_version(),
            partitions: Vec::new(),
            login: LoginSpec::default(),
            accounts: Vec::new(),
            cancel_jobs_on_removal: false,
        }
    }
}

/// The node pool that carries a Ray cluster's head pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RayHead {
    /// The name of the cluster's node pool whose nodes run the head pod (a pool of the cluster;
    /// its other nodes, if any, run workers of that pool's worker group).
    #[schema(min_length = 1, max_length = 30, pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
    pub node_pool: String,
}

/// Ray settings of a `ray` cluster: one RayCluster (KubeRay) whose worker groups are the node
/// pools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"version": "2.46.0", "head": {"node_pool": "cpu"}, "dashboard": true}))]
pub struct RaySpec {
    /// Ray version: one of the Ray releases the cluster's base stack pins (its catalogue); the
    /// stack's default when omitted.
    #[serde(default)]
    #[schema(nullable = false, max_length = 32, pattern = "^[0-9]+\\.[0-9]+\\.[0-9]+$", example = "2.46.0")]
    pub version: Option<String>,
    /// Where the head pod runs.
    pub head: RayHead,
    /// Whether the head runs Ray's dashboard (and its job API); reachable only through the
    /// tenant's kubeconfig (port-forward), never exposed by paddock.
    #[serde(default = "yes")]
    #[schema(default = true)]
    pub dashboard: bool,
}

fn yes() -> bool {
    true
}

/// Body of `POST /v1/tenants/{tenant_id}/clusters`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "train", "kind": "slurm", "isolation": "private-nodes", "slurm": {"partitions": [{"name": "gpu", "node_pools": ["h100"], "default": true, "max_time": "2-00:00:00"}], "login": {"replicas": 1, "ssh_authorized_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEVvQmOqtB6kGyvIx1Kk3P1d/2oHwZ6Yp5UAs0o7nN8K alice@example.com"]}}, "node_pools": [{"name": "h100", "machine_class": "gpu-h100x8", "count": 2}]}))]
pub struct ClusterCreate {
    /// DNS-1123 label, unique within the tenant.
    #[schema(min_length = 1, max_length = 40, pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
    pub name: String,
    /// What the cluster runs.
    pub kind: ClusterKind,
    /// Isolation; only `private-nodes` today.
    pub isolation: Isolation,
    /// Kubernetes version of the tenant control plane.
    #[serde(default)]
    #[schema(max_length = 32, pattern = "^v1\\.[0-9]{2}(\\.[0-9]{1,3})?$", example = "v1.35.0")]
    pub kubernetes_version: Option<String>,
    /// Slurm settings (`slurm` clusters only).
    #[serde(default)]
    pub slurm: Option<SlurmSpec>,
    /// Ray settings (`ray` clusters only, required there).
    #[serde(default)]
    pub ray: Option<RaySpec>,
    /// Node pools created with the cluster.
    #[serde(default)]
    #[schema(max_items = 32)]
    pub node_pools: Vec<NodePoolCreate>,
}

/// Body of `PATCH /v1/tenants/{tenant_id}/clusters/{cluster_id}` (JSON merge patch). Node pools
/// change through their own endpoints; `name`, `kind` and `isolation` never change.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"kubernetes_version": "v1.35.1"}))]
pub struct ClusterUpdate {
    /// Kubernetes version (upgrades only).
    #[schema(max_length = 32, pattern = "^v1\\.[0-9]{2}(\\.[0-9]{1,3})?$")]
    pub kubernetes_version: Option<String>,
    /// Slurm settings.
    pub slurm: Option<SlurmSpec>,
    /// Ray settings (`ray` clusters; the whole object, never null).
    pub ray: Option<RaySpec>,
    /// The tenant base stack version to move to (upgrades only, to a stack this release carries;
    /// `slurm.version` must be one of its Slurm releases, which the same patch may change).
    #[schema(max_length = 32, pattern = "^[0-9]{4}\\.[0-9]{1,2}\\.[0-9]{1,4}$", example = "2026.12.0")]
    pub stack_version: Option<String>,
}

/// Whether a condition holds, as Kubernetes spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum ConditionStatus {
    /// It holds.
    True,
    /// It does not.
    False,
    /// Not known (yet).
    Unknown,
}

impl From<bool> for ConditionStatus {
    fn from(holds: bool) -> Self {
        if holds {
            Self::True
        } else {
            Self::False
        }
    }
}

/// A condition of a cluster or node pool (positive types: `MachinesAllocated`, `ControlPlaneReady`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Condition {
    /// Condition type.
    #[serde(rename = "type")]
    pub type_: String,
    /// Whether it holds.
    pub status: ConditionStatus,
    /// Machine-readable reason, e.g. `InsufficientCapacity`.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
    /// When the status last changed.
    pub last_transition_time: DateTime<Utc>,
}

/// Where the cluster answers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Endpoints {
    /// The tenant Kubernetes API server.
    pub kubernetes_api: Option<String>,
    /// slurmrestd.
    pub slurm_rest_api: Option<String>,
    /// SSH address of the login nodes.
    pub login_ssh: Option<String>,
    /// A `ray` cluster's Ray client address, `ray://<head service>.<namespace>.svc:10001`, inside
    /// the tenant cluster: reach it through the tenant's kubeconfig (`kubectl port-forward`).
    // `default` reads statuses stored before it.
    #[serde(default)]
    pub ray_client: Option<String>,
    /// A `ray` cluster's dashboard (and job API) address inside the tenant cluster, when
    /// `ray.dashboard` is on: reach it through the tenant's kubeconfig (`kubectl port-forward`).
    #[serde(default)]
    pub dashboard: Option<String>,
    /// The login nodes' SSH host keys, once the LoginSet publishes them (empty until then), for
    /// `known_hosts` and to compare with what `ssh` shows on first connect.
    // Always in responses (so required in the schema); `default` reads statuses stored before it.
    #[serde(default)]
    #[schema(required = true)]
    pub login_ssh_host_keys: Vec<SshHostKey>,
}

/// An SSH host key of a cluster's login nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SshHostKey {
    /// The key's algorithm, e.g. `ssh-ed25519`.
    pub algorithm: String,
    /// Its SHA-256 fingerprint as `ssh-keygen -l` and `ssh` print it.
    pub fingerprint: String,
    /// The public key (`<algorithm> <base64>`): prefix it with the login address for a
    /// `known_hosts` line.
    pub public_key: String,
}

/// The observed state of a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterStatus {
    /// Phase.
    pub phase: ClusterPhase,
    /// Conditions.
    pub conditions: Vec<Condition>,
    /// The generation the status describes.
    pub observed_generation: i64,
    /// Endpoints, once known.
    pub endpoints: Endpoints,
    /// The last sync of the tenant's people into the cluster's Slurm (`slurm` clusters, once
    /// synced; condition `IdentitySynced` says whether it succeeded).
    // `default` reads statuses stored before it.
    #[serde(default)]
    pub identity: Option<IdentitySync>,
}

/// The last sync of the tenant's people (SCIM) into a cluster's Slurm: users, accounts and
/// associations as paddock wrote them (counts only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct IdentitySync {
    /// When the sync last completed.
    pub synced_at: DateTime<Utc>,
    /// Slurm users (active members of mapped groups).
    pub users: u32,
    /// Slurm accounts (mapped groups).
    pub accounts: u32,
    /// Associations of users with accounts.
    pub associations: u32,
}

/// A node pool as listed in its cluster.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodePoolSummary {
    /// Id.
    pub id: NodePoolId,
    /// Name.
    pub name: String,
    /// Machine class.
    pub machine_class: String,
    /// Desired machines.
    pub count: u32,
    /// What the pool is for.
    pub role: NodePoolRole,
    /// The machines it converges to (`count`, or an autoscaled pool's current target).
    pub desired_count: u32,
}

/// A cluster as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClusterView {
    /// Id.
    pub id: ClusterId,
    /// Owning tenant.
    pub tenant_id: TenantId,
    /// Name.
    pub name: String,
    /// Kind.
    pub kind: ClusterKind,
    /// Isolation.
    pub isolation: Isolation,
    /// Kubernetes version.
    pub kubernetes_version: String,
    /// Slurm settings with defaults filled (partitions resolved); null for `kubernetes`.
    pub slurm: Option<SlurmSpec>,
    /// Ray settings with defaults filled (the version resolved); null but for `ray`.
    pub ray: Option<RaySpec>,
    /// The tenant base stack version it runs (CNI, device plugin, storage, Slinky): the newest one
    /// when it was created, kept until the cluster is upgraded; its Slurm releases are the ones
    /// `slurm.version` may name.
    #[schema(example = "2026.12.0")]
    pub stack_version: String,
    /// Its node pools.
    pub node_pools: Vec<NodePoolSummary>,
    /// Observed state.
    pub status: ClusterStatus,
    /// Bumped by every spec change.
    pub generation: i64,
    /// `"<generation>"`, also the `ETag` header.
    pub etag: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// The observed state of a node pool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodePoolStatus {
    /// Ready nodes.
    pub ready: u32,
    /// Machines allocated to the pool.
    pub allocated: u32,
    /// The machines the pool converges to: `count`, or for an autoscaled pool the autoscaler's
    /// latest target (status, so a scaling decision moves neither `generation` nor the etag).
    pub desired_count: u32,
    /// Conditions.
    pub conditions: Vec<Condition>,
}

/// A node pool as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodePoolView {
    /// Id.
    pub id: NodePoolId,
    /// Its cluster.
    pub cluster_id: ClusterId,
    /// Name.
    pub name: String,
    /// Machine class.
    pub machine_class: String,
    /// Desired machines.
    pub count: u32,
    /// Node labels.
    #[schema(value_type = std::collections::HashMap<String, String>)]
    pub labels: Labels,
    /// Node taints.
    pub taints: Vec<Taint>,
    /// What the pool is for.
    pub role: NodePoolRole,
    /// Whether a `failed` health report replaces a machine of the pool on its own.
    pub remediation: crate::remediation::NodePoolRemediation,
    /// Its autoscaling, if it is elastic (its target is then `status.desired_count`).
    pub autoscaling: Option<NodePoolAutoscaling>,
    /// Observed state.
    pub status: NodePoolStatus,
    /// Bumped by every spec change.
    pub generation: i64,
    /// `"<generation>"`, also the `ETag` header.
    pub etag: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// A machine as the tenant holding it sees it: never BMC details, nothing of other tenancies.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PoolMachineView {
    /// Machine id: how the tenant names the machine (e.g. in breakfix requests).
    pub id: crate::MachineId,
    /// The node pool it serves.
    pub node_pool_id: NodePoolId,
    /// Machine name.
    pub name: String,
    /// Machine class.
    pub machine_class: String,
    /// Lifecycle state.
    pub state: crate::machine::MachineState,
    /// Kubernetes node name, once joined.
    pub node_name: Option<String>,
    /// The status of the newest health report recorded while the cluster holds the machine
    /// (`GET .../machines/{machine_id}/health-reports`), if any.
    pub health: Option<crate::health::HealthStatus>,
}

/// A cluster event: what happened to it, for people.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClusterEventView {
    /// Id (time-ordered).
    pub id: uuid::Uuid,
    /// When.
    pub at: DateTime<Utc>,
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Machine-readable reason, e.g. `NodePoolScaled`.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

/// A 202 answer about a cluster.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClusterAccepted {
    /// The cluster as it is now.
    pub cluster: ClusterView,
    /// The operation to follow.
    pub operation: crate::operation::OperationView,
}

/// A 202 answer about a node pool.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodePoolAccepted {
    /// The node pool as it is now.
    pub node_pool: NodePoolView,
    /// The operation to follow.
    pub operation: crate::operation::OperationView,
}

/// Default lifetime of a tenant kubeconfig's token, in seconds (8 h).
pub const KUBECONFIG_TTL_DEFAULT: u64 = 8 * 3600;
/// Shortest accepted lifetime of a tenant kubeconfig's token (Kubernetes' TokenRequest minimum).
pub const KUBECONFIG_TTL_MIN: u64 = 600;
/// Longest accepted lifetime of a tenant kubeconfig's token (24 h); longer is a 422, not clamped.
pub const KUBECONFIG_TTL_MAX: u64 = 24 * 3600;

/// The parameters of `GET .../clusters/{cluster_id}/kubeconfig`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct KubeconfigParams {
    /// Lifetime of the kubeconfig's token, in seconds. Kept as text until validated, so that any
    /// integer out of range is a 422 and anything else a 400.
    #[param(value_type = Option<u64>, minimum = 600, maximum = 86400, default = 28800)]
    pub ttl: Option<String>,
}
