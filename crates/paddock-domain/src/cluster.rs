//! Clusters and node pools: spec normalisation, validation, partitions and quotas. The desired
//! counts of node pools are what quotas are checked against (docs/api.md), at the API, in the
//! same transaction that writes them, with the tenant row locked so that concurrent requests of
//! one tenant cannot both pass.

use std::collections::HashSet;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use paddock_types::cluster::{
    ClusterCreate, ClusterKind, ClusterStatus, ClusterView, Condition, ConditionStatus, Isolation, NodePoolAutoscaling,
    NodePoolCreate, NodePoolRole, NodePoolStatus, NodePoolSummary, NodePoolView, Partition, RaySpec, SlurmSpec, Taint,
    DEFAULT_KUBERNETES_VERSION, MAX_SLURM_ACCOUNTS,
};
use paddock_types::remediation::NodePoolRemediation;
use paddock_types::tenant::Quotas;
use paddock_types::{ClusterId, Labels, MachineClassId, NodePoolId, TenantId};
use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::model::etag;
use crate::validate::Checks;
use crate::Error;

static KUBERNETES_VERSION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^v1\.[0-9]{2}(\.[0-9]{1,3})?$").expect("static regex"));
static SLURM_VERSION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[0-9]{2}\.[0-9]{2}(\.[0-9]{1,3})?$").expect("static regex"));
static SLURM_TIME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(UNLIMITED|INFINITE|[0-9]{1,6}|[0-9]{1,4}:[0-9]{2}(:[0-9]{2})?|[0-9]{1,4}-[0-9]{1,2}(:[0-9]{2}(:[0-9]{2})?)?)$")
        .expect("static regex")
});
static SLURM_ACCOUNT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-z0-9][a-z0-9_.-]{0,62}$").expect("static regex"));
static SSH_KEY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp(256|384|521)|sk-(ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com) [A-Za-z0-9+/]+={0,3}( [^\r\n]{0,256})?$")
        .expect("static regex")
});

/// Most machines one pool may ask for.
pub const MAX_POOL_COUNT: u32 = 10_000;
/// Most pools per cluster.
pub const MAX_POOLS: usize = 32;

/// The spec of a cluster a merge patch applies to: what `ClusterCreate` asks for, defaults filled,
/// pools apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// Name, unique within the tenant.
    pub name: String,
    /// Kind.
    pub kind: ClusterKind,
    /// Isolation.
    pub isolation: Isolation,
    /// Kubernetes version.
    pub kubernetes_version: String,
    /// Slurm settings, for `slurm` clusters.
    #[serde(default)]
    pub slurm: Option<SlurmSpec>,
    /// Ray settings, for `ray` clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray: Option<RaySpec>,
}

impl ClusterSpec {
    /// Splits a create request into the cluster spec (defaults filled) and its pools.
    pub fn from_create(create: ClusterCreate) -> (ClusterSpec, Vec<NodePoolCreate>) {
        let slurm = match create.kind {
            ClusterKind::Slurm => Some(create.slurm.unwrap_or_default()),
            // A `slurm` section on another kind of cluster is refused by `validate`, so keep it.
            ClusterKind::Kubernetes | ClusterKind::Ray => create.slurm,
        };
        let spec = ClusterSpec {
            name: create.name,
            kind: create.kind,
            isolation: create.isolation,
            kubernetes_version: create.kubernetes_version.unwrap_or_else(|| DEFAULT_KUBERNETES_VERSION.to_owned()),
            slurm,
            ray: create.ray,
        };
        (spec, create.node_pools)
    }

    /// Fills what defaults to the base stack `stack_version`'s choice: a `ray` cluster's Ray
    /// version (the catalogue's default release) when its spec names none.
    pub fn fill_stack_defaults(&mut self, stack_version: &str) {
        if let Some(ray) = self.ray.as_mut().filter(|r| r.version.is_none()) {
            ray.version = crate::stack::default_ray_version(stack_version).map(str::to_owned);
        }
    }
}

/// The spec of a node pool a merge patch applies to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodePoolSpec {
    /// Name.
    pub name: String,
    /// Machine class name.
    pub machine_class: String,
    /// Desired machines.
    pub count: u32,
    /// Node labels.
    #[serde(default)]
    pub labels: Labels,
    /// Node taints.
    #[serde(default)]
    pub taints: Vec<Taint>,
    /// What the pool is for (fixed at creation).
    #[serde(default)]
    pub role: NodePoolRole,
    /// Whether a `failed` health report starts a replacement on its own (fixed at creation).
    #[serde(default)]
    pub remediation: NodePoolRemediation,
    /// Elastic pools: the autoscaler's bounds and delays (its target is status).
    #[serde(default)]
    pub autoscaling: Option<NodePoolAutoscaling>,
}

impl NodePoolSpec {
    /// The machines quotas count for the pool: `max` when it is autoscaled (docs/tenants.md,
    /// "Elastic pools"), else `count`.
    pub fn quota_count(&self) -> u32 {
        self.autoscaling.map_or(self.count, |a| a.max)
    }

    /// The machines the pool can never do without, checked against the fleet: `count`, or an
    /// autoscaled pool's `min` (the autoscaler clamps its targets to the fleet).
    pub fn floor_count(&self) -> u32 {
        self.autoscaling.map_or(self.count, |a| a.min)
    }
}

impl From<NodePoolCreate> for NodePoolSpec {
    fn from(p: NodePoolCreate) -> Self {
        Self {
            name: p.name,
            machine_class: p.machine_class,
            count: p.count,
            labels: p.labels,
            taints: p.taints,
            role: p.role,
            remediation: p.remediation,
            autoscaling: p.autoscaling,
        }
    }
}

/// Checks a cluster spec against its pools (names and counts of the pools it will have) and the
/// base stack it runs (`stack_version`: the Slurm releases it supports).
pub fn validate_cluster(spec: &ClusterSpec, pools: &[NodePoolSpec], stack_version: &str) -> Result<(), Error> {
    let mut c = Checks::new();
    c.dns_label("name", &spec.name, 40);
    c.check(
        KUBERNETES_VERSION.is_match(&spec.kubernetes_version),
        "kubernetes_version",
        "must be a Kubernetes version such as v1.35 or v1.35.0",
    );
    c.check(pools.len() <= MAX_POOLS, "node_pools", format!("at most {MAX_POOLS} node pools"));
    let mut names = HashSet::new();
    for (i, pool) in pools.iter().enumerate() {
        validate_pool_into(&mut c, &format!("node_pools[{i}]."), pool);
        c.check(
            names.insert(pool.name.as_str()),
            &format!("node_pools[{i}].name"),
            "is used by another pool of this cluster",
        );
    }
    match (spec.kind, &spec.ray) {
        (ClusterKind::Ray, Some(ray)) => validate_ray(&mut c, ray, pools, stack_version),
        (ClusterKind::Ray, None) => c.fail("ray", "a `ray` cluster needs its Ray settings (`ray.head.node_pool`)"),
        (_, Some(_)) => c.fail("ray", "only `ray` clusters have Ray settings"),
        (_, None) => {}
    }
    match (spec.kind, &spec.slurm) {
        (ClusterKind::Kubernetes | ClusterKind::Ray, Some(_)) => {
            c.fail("slurm", "only `slurm` clusters have Slurm settings")
        }
        (ClusterKind::Slurm, Some(slurm)) => {
            let system: HashSet<&str> =
                pools.iter().filter(|p| p.role == NodePoolRole::System).map(|p| p.name.as_str()).collect();
            validate_slurm(&mut c, slurm, &names, &system, stack_version);
        }
        // A merge patch's `"slurm": null` would remove them.
        (ClusterKind::Slurm, None) => {
            c.fail("slurm", "a `slurm` cluster keeps its Slurm settings: change them with an object, never null")
        }
        (ClusterKind::Kubernetes | ClusterKind::Ray, None) => {}
    }
    c.finish()
}

/// A `ray` cluster's Ray: a version of its base stack's catalogue, a head pool that is one of
/// its pools and has a machine.
fn validate_ray(c: &mut Checks, ray: &RaySpec, pools: &[NodePoolSpec], stack_version: &str) {
    let supported = crate::stack::ray_versions(stack_version);
    match ray.version.as_deref() {
        Some(v) if supported.contains(&v) => {}
        Some(v) => c.fail(
            "ray.version",
            format!(
                "Ray {v} is not in the Ray catalogue of the cluster's base stack {stack_version} (supported: {})",
                supported.join(", ")
            ),
        ),
        None => c.fail("ray.version", format!("the base stack {stack_version} has no Ray catalogue")),
    }
    match pools.iter().find(|p| p.name == ray.head.node_pool) {
        None => c.fail("ray.head.node_pool", "must name a node pool of this cluster"),
        Some(p) if p.count == 0 => {
            c.fail("ray.head.node_pool", "the head pool carries the Ray head pod and needs at least one node")
        }
        Some(_) => {}
    }
}

fn validate_slurm(
    c: &mut Checks,
    slurm: &SlurmSpec,
    pools: &HashSet<&str>,
    system: &HashSet<&str>,
    stack_version: &str,
) {
    if !SLURM_VERSION.is_match(&slurm.version) {
        c.fail("slurm.version", "must be a Slurm release such as 25.11");
    } else {
        let supported = crate::stack::slurm_versions(stack_version);
        c.check(
            supported.contains(&slurm.version.as_str()),
            "slurm.version",
            format!(
                "Slurm {} is not supported by the cluster's base stack {stack_version} (supported: {})",
                slurm.version,
                supported.join(", ")
            ),
        );
    }
    c.check(slurm.partitions.len() <= 64, "slurm.partitions", "at most 64 partitions");
    let mut names = HashSet::new();
    for (i, p) in slurm.partitions.iter().enumerate() {
        let field = format!("slurm.partitions[{i}]");
        c.dns_label(&format!("{field}.name"), &p.name, 30);
        c.check(names.insert(p.name.as_str()), &format!("{field}.name"), "is used by another partition");
        c.check(!p.node_pools.is_empty(), &format!("{field}.node_pools"), "must name at least one node pool");
        for pool in &p.node_pools {
            c.check(
                pools.contains(pool.as_str()),
                &format!("{field}.node_pools"),
                format!("no node pool is named {pool:?}"),
            );
            c.check(
                !system.contains(pool.as_str()),
                &format!("{field}.node_pools"),
                format!("{pool:?} is the system pool: it carries Slurm's control pods, never compute jobs"),
            );
        }
        if let Some(t) = &p.max_time {
            c.check(
                SLURM_TIME.is_match(t),
                &format!("{field}.max_time"),
                "must be a Slurm time limit such as 2-00:00:00 or UNLIMITED",
            );
        }
    }
    c.check(
        slurm.partitions.iter().filter(|p| p.default).count() <= 1,
        "slurm.partitions",
        "at most one partition may be the default",
    );
    validate_accounts(c, &slurm.accounts);
    c.check(slurm.login.replicas <= 10, "slurm.login.replicas", "must be between 0 and 10");
    c.check(slurm.login.ssh_authorized_keys.len() <= 64, "slurm.login.ssh_authorized_keys", "at most 64 keys");
    for (i, key) in slurm.login.ssh_authorized_keys.iter().enumerate() {
        c.check(
            SSH_KEY.is_match(key.trim()),
            &format!("slurm.login.ssh_authorized_keys[{i}]"),
            "must be an OpenSSH public key line",
        );
    }
}

/// `slurm.accounts`: bounds and names (each group and account once: a duplicate is
/// [`slurm_account_duplicate`], checked after the values pass). Whether each group is one of the
/// tenant's is the service's check ([`slurm_account_group_unknown`]).
fn validate_accounts(c: &mut Checks, accounts: &[paddock_types::cluster::SlurmAccount]) {
    c.check(accounts.len() <= MAX_SLURM_ACCOUNTS, "slurm.accounts", format!("at most {MAX_SLURM_ACCOUNTS} accounts"));
    for (i, a) in accounts.iter().enumerate() {
        let field = format!("slurm.accounts[{i}]");
        c.check(
            !a.group.trim().is_empty() && a.group.len() <= 256,
            &format!("{field}.group"),
            "must be a group's displayName (1 to 256 characters)",
        );
        let name = a.account_name();
        let what = if a.account.is_some() { "account" } else { "group" };
        c.check(
            SLURM_ACCOUNT.is_match(&name),
            &format!("{field}.{what}"),
            match a.account {
                Some(_) => "must be a Slurm account name: lowercase letters, digits, `_`, `.` and `-`, at most 63"
                    .to_owned(),
                None => format!(
                    "the group's name in lower case ({name:?}) is not a Slurm account name: name the account with `account`"
                ),
            },
        );
        c.check((1..=1_000_000).contains(&a.fairshare), &format!("{field}.fairshare"), "must be between 1 and 1000000");
        if let Some(n) = a.limits.max_jobs {
            c.check((1..=1_000_000).contains(&n), &format!("{field}.limits.max_jobs"), "must be between 1 and 1000000");
        }
        if let Some(n) = a.limits.gpu_minutes {
            c.check(
                (1..=1_000_000_000_000).contains(&n),
                &format!("{field}.limits.gpu_minutes"),
                "must be between 1 and 1000000000000",
            );
        }
    }
}

/// 422 `slurm_account_duplicate` when two of `slurm.accounts` name one group (without regard to
/// case) or one Slurm account.
pub fn check_accounts_unique(slurm: Option<&SlurmSpec>) -> Result<(), Error> {
    let Some(slurm) = slurm else { return Ok(()) };
    let (mut groups, mut names) = (HashSet::new(), HashSet::new());
    for (i, a) in slurm.accounts.iter().enumerate() {
        if !groups.insert(a.group.to_lowercase()) {
            let message = format!("group {:?} is mapped by another account of this cluster", a.group);
            return Err(Error::rule("slurm_account_duplicate", format!("slurm.accounts[{i}].group"), message));
        }
        if !names.insert(a.account_name()) {
            let message = format!("Slurm account {:?} is named by another entry of this cluster", a.account_name());
            return Err(Error::rule("slurm_account_duplicate", format!("slurm.accounts[{i}].account"), message));
        }
    }
    Ok(())
}

/// 422 `slurm_account_group_unknown`: `slurm.accounts[i].group` names no group of the tenant
/// (another tenant's group is as unknown as a missing one).
pub fn slurm_account_group_unknown(index: usize, group: &str) -> Error {
    Error::rule(
        "slurm_account_group_unknown",
        format!("slurm.accounts[{index}].group"),
        format!("the tenant has no group named {group:?} (its identity provider creates groups over SCIM)"),
    )
}

/// The pool roles of a new cluster (docs/api.md, node pool roles): a `slurm` cluster has exactly
/// one `system` pool, of at least one node; a `kubernetes` cluster has none. 422 with a stable
/// code naming the rule otherwise.
pub fn check_system_pool(kind: ClusterKind, pools: &[NodePoolSpec]) -> Result<(), Error> {
    for (i, pool) in pools.iter().enumerate() {
        check_autoscalable(kind, pool.autoscaling.is_some(), &format!("node_pools[{i}].autoscaling"))?;
    }
    let system: Vec<(usize, &NodePoolSpec)> =
        pools.iter().enumerate().filter(|(_, p)| p.role == NodePoolRole::System).collect();
    match (kind, system.as_slice()) {
        (ClusterKind::Kubernetes | ClusterKind::Ray, []) => Ok(()),
        (ClusterKind::Kubernetes | ClusterKind::Ray, [(i, _), ..]) => {
            Err(system_pool_unsupported(&format!("node_pools[{i}].role")))
        }
        (ClusterKind::Slurm, []) => Err(Error::rule(
            "system_pool_required",
            "node_pools",
            "a slurm cluster needs exactly one node pool with role `system`: it carries Slurm's controller, \
             REST API, accounting, MariaDB and login pods and their volumes",
        )),
        (ClusterKind::Slurm, [(i, pool)]) if pool.count == 0 => {
            Err(system_pool_empty(&format!("node_pools[{i}].count")))
        }
        (ClusterKind::Slurm, [(i, pool)]) if pool.autoscaling.is_some() => {
            Err(system_pool_autoscaled(&format!("node_pools[{i}].autoscaling")))
        }
        (ClusterKind::Slurm, [_]) => Ok(()),
        (ClusterKind::Slurm, [_, (i, _), ..]) => Err(system_pool_duplicate(&format!("node_pools[{i}].role"))),
    }
}

/// 422 `system_pool_unsupported`: a `kubernetes` cluster has no system pool.
pub fn system_pool_unsupported(field: &str) -> Error {
    Error::rule(
        "system_pool_unsupported",
        field,
        "only a slurm cluster has a system pool: a kubernetes cluster's control plane is hosted, and every pool \
         is a compute pool",
    )
}

/// 422 `system_pool_duplicate`: a `slurm` cluster has exactly one system pool.
pub fn system_pool_duplicate(field: &str) -> Error {
    Error::rule("system_pool_duplicate", field, "a slurm cluster has exactly one system pool")
}

/// 422 `system_pool_empty`: the system pool carries Slurm's control pods, so it has a node.
pub fn system_pool_empty(field: &str) -> Error {
    Error::rule("system_pool_empty", field, "the system pool carries Slurm's control pods and needs at least one node")
}

/// 422 `autoscaling_unsupported` when a pool of a cluster of `kind` asks for autoscaling and the
/// kind reads no demand for it: a `ray` cluster's worker groups would be scaled on unschedulable
/// pods, which its fixed-size groups never have, so they would only ever shrink to `min`.
pub fn check_autoscalable(kind: ClusterKind, autoscaled: bool, field: &str) -> Result<(), Error> {
    if kind == ClusterKind::Ray && autoscaled {
        return Err(Error::rule(
            "autoscaling_unsupported",
            field,
            "a ray cluster's worker groups are not autoscaled yet (Ray's own autoscaler demand is not read): \
             set `count` instead",
        ));
    }
    Ok(())
}

/// 422 `system_pool_autoscaled`: the system pool carries Slurm's control pods, so its size is
/// never the autoscaler's.
pub fn system_pool_autoscaled(field: &str) -> Error {
    Error::rule(
        "system_pool_autoscaled",
        field,
        "the system pool carries Slurm's control pods and their volumes: it is never autoscaled; autoscale a \
         compute pool",
    )
}

/// Orders Kubernetes versions (`v1.35` < `v1.35.1` < `v1.36.0`) and base stack versions (`2026.9.0` <
/// `2026.12.0`), part by part; unparseable parts count as 0.
pub fn version_key(version: &str) -> (u32, u32, u32) {
    let mut parts = version.trim_start_matches('v').split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Checks a node pool spec.
pub fn validate_pool(pool: &NodePoolSpec) -> Result<(), Error> {
    let mut c = Checks::new();
    validate_pool_into(&mut c, "", pool);
    c.finish()
}

fn validate_pool_into(c: &mut Checks, prefix: &str, pool: &NodePoolSpec) {
    c.dns_label(&format!("{prefix}name"), &pool.name, 30);
    c.dns_label(&format!("{prefix}machine_class"), &pool.machine_class, 63);
    c.check(pool.count <= MAX_POOL_COUNT, &format!("{prefix}count"), format!("must be between 0 and {MAX_POOL_COUNT}"));
    if let Some(a) = &pool.autoscaling {
        validate_autoscaling(c, prefix, pool.count, a);
    }
    c.labels(&format!("{prefix}labels"), &pool.labels);
    c.check(pool.taints.len() <= 32, &format!("{prefix}taints"), "at most 32 taints");
    let mut seen = HashSet::new();
    for (i, t) in pool.taints.iter().enumerate() {
        let mut as_label = Labels::new();
        as_label.insert(t.key.clone(), t.value.clone());
        c.labels(&format!("{prefix}taints[{i}]"), &as_label);
        c.check(
            seen.insert((t.key.as_str(), t.effect)),
            &format!("{prefix}taints[{i}]"),
            "duplicates another taint's key and effect",
        );
    }
}

/// An autoscaled pool's bounds: `min <= max <= MAX_POOL_COUNT`, the delays within a day, and its
/// `count` (the initial size) within `[min, max]`.
fn validate_autoscaling(c: &mut Checks, prefix: &str, count: u32, a: &NodePoolAutoscaling) {
    use paddock_types::cluster::SCALE_DELAY_MAX;
    let field = |f: &str| format!("{prefix}autoscaling.{f}");
    c.check(a.max <= MAX_POOL_COUNT, &field("max"), format!("must be between 0 and {MAX_POOL_COUNT}"));
    c.check(a.min <= a.max, &field("min"), "must not be greater than `max`");
    for (name, value) in
        [("scale_down_delay_seconds", a.scale_down_delay_seconds), ("scale_up_delay_seconds", a.scale_up_delay_seconds)]
    {
        c.check(value <= SCALE_DELAY_MAX, &field(name), format!("must be between 0 and {SCALE_DELAY_MAX}"));
    }
    if a.min <= a.max {
        c.check(
            (a.min..=a.max).contains(&count),
            &format!("{prefix}count"),
            "an autoscaled pool's `count` is its initial size: between `autoscaling.min` and `autoscaling.max`",
        );
    }
}

/// The partitions a Slurm cluster gets: those of the spec, or one per pool (the first the default).
pub fn resolved_partitions(slurm: &SlurmSpec, pools: &[&str]) -> Vec<Partition> {
    if !slurm.partitions.is_empty() {
        return slurm.partitions.clone();
    }
    pools
        .iter()
        .enumerate()
        .map(|(i, pool)| Partition {
            name: (*pool).to_owned(),
            node_pools: vec![(*pool).to_owned()],
            default: i == 0,
            max_time: None,
        })
        .collect()
}

/// What a tenant asks for in total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Demand {
    /// Live clusters.
    pub clusters: u64,
    /// Desired nodes over all pools.
    pub nodes: u64,
    /// Desired GPUs over all pools.
    pub gpus: u64,
}

/// A tenant quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quota {
    /// `max_clusters`.
    Clusters,
    /// `max_nodes`.
    Nodes,
    /// `max_gpus`.
    Gpus,
}

impl Quota {
    /// Its field in [`Quotas`].
    pub fn field(self) -> &'static str {
        match self {
            Self::Clusters => "max_clusters",
            Self::Nodes => "max_nodes",
            Self::Gpus => "max_gpus",
        }
    }

    /// What it counts, for messages.
    pub fn noun(self) -> &'static str {
        match self {
            Self::Clusters => "clusters",
            Self::Nodes => "nodes",
            Self::Gpus => "GPUs",
        }
    }
}

/// A quota a demand exceeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaExcess {
    /// The quota.
    pub quota: Quota,
    /// Its limit.
    pub limit: u32,
    /// What the demand comes to.
    pub demand: u64,
}

/// The first quota (clusters, nodes, GPUs) that `demand` exceeds, if any.
pub fn quota_excess(quotas: &Quotas, demand: Demand) -> Option<QuotaExcess> {
    [
        (Quota::Clusters, quotas.max_clusters, demand.clusters),
        (Quota::Nodes, quotas.max_nodes, demand.nodes),
        (Quota::Gpus, quotas.max_gpus, demand.gpus),
    ]
    .into_iter()
    .find_map(|(quota, limit, demand)| {
        limit.filter(|limit| demand > u64::from(*limit)).map(|limit| QuotaExcess { quota, limit, demand })
    })
}

/// Checks a tenant's demand after a change against its quotas (409 `quota_exceeded`).
pub fn check_quotas(quotas: &Quotas, demand: Demand) -> Result<(), Error> {
    match quota_excess(quotas, demand) {
        None => Ok(()),
        Some(QuotaExcess { quota, limit, demand }) => Err(Error::QuotaExceeded(format!(
            "this change would bring the tenant to {demand} {}; its quota is {limit}",
            quota.noun()
        ))),
    }
}

/// Sets the condition of `type_` in `conditions` (added when missing). Its transition time moves
/// only when its status changes. Returns whether anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    now: DateTime<Utc>,
) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) if c.status == status && c.reason == reason && c.message == message => false,
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now;
            }
            c.status = status;
            c.reason = reason.to_owned();
            c.message = message.to_owned();
            true
        }
        None => {
            conditions.push(Condition {
                type_: type_.to_owned(),
                status,
                reason: reason.to_owned(),
                message: message.to_owned(),
                last_transition_time: now,
            });
            true
        }
    }
}

/// A cluster.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// Id.
    pub id: ClusterId,
    /// Owner.
    pub tenant_id: TenantId,
    /// Desired state.
    pub spec: ClusterSpec,
    /// Observed state.
    pub status: ClusterStatus,
    /// The base stack version it runs (chosen at creation, kept until it is upgraded).
    pub stack_version: String,
    /// Spec generation.
    pub generation: i64,
    /// Status guard of the worker's writes.
    pub status_version: i64,
    /// Whether deletion was requested.
    pub deleting: bool,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// A node pool.
#[derive(Debug, Clone)]
pub struct NodePool {
    /// Id.
    pub id: NodePoolId,
    /// Owner.
    pub tenant_id: TenantId,
    /// Its cluster.
    pub cluster_id: ClusterId,
    /// Its machine class.
    pub machine_class_id: MachineClassId,
    /// Desired state.
    pub spec: NodePoolSpec,
    /// GPUs per machine of its class.
    pub gpu_count: u32,
    /// CPU cores and memory (GiB) per machine of its class.
    pub class_size: (u32, u32),
    /// Observed state.
    pub status: NodePoolStatus,
    /// Spec generation.
    pub generation: i64,
    /// The generation the cluster was last ready at.
    pub observed_generation: i64,
    /// Whether deletion was requested.
    pub deleting: bool,
    /// The autoscaler's memory (autoscaled pools).
    pub scaling: crate::autoscale::ScaleMemory,
    /// The Node names a scale-down found idle: given back first.
    pub release_first: Vec<String>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

impl NodePool {
    /// The API view.
    pub fn view(&self) -> NodePoolView {
        NodePoolView {
            id: self.id,
            cluster_id: self.cluster_id,
            name: self.spec.name.clone(),
            machine_class: self.spec.machine_class.clone(),
            count: self.spec.count,
            labels: self.spec.labels.clone(),
            taints: self.spec.taints.clone(),
            role: self.spec.role,
            remediation: self.spec.remediation,
            autoscaling: self.spec.autoscaling,
            status: self.status.clone(),
            generation: self.generation,
            etag: etag(self.generation),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

impl Cluster {
    /// The API view, with its live pools and resolved partitions.
    pub fn view(&self, pools: &[NodePool]) -> ClusterView {
        let live: Vec<&NodePool> = pools.iter().filter(|p| !p.deleting).collect();
        // The system pool carries no NodeSet, so no partition.
        let names: Vec<&str> =
            live.iter().filter(|p| p.spec.role == NodePoolRole::Compute).map(|p| p.spec.name.as_str()).collect();
        let slurm =
            self.spec.slurm.as_ref().map(|s| SlurmSpec { partitions: resolved_partitions(s, &names), ..s.clone() });
        ClusterView {
            id: self.id,
            tenant_id: self.tenant_id,
            name: self.spec.name.clone(),
            kind: self.spec.kind,
            isolation: self.spec.isolation,
            kubernetes_version: self.spec.kubernetes_version.clone(),
            slurm,
            ray: self.spec.ray.clone(),
            stack_version: self.stack_version.clone(),
            node_pools: live
                .iter()
                .map(|p| NodePoolSummary {
                    id: p.id,
                    name: p.spec.name.clone(),
                    machine_class: p.spec.machine_class.clone(),
                    count: p.spec.count,
                    role: p.spec.role,
                    desired_count: p.status.desired_count,
                })
                .collect(),
            status: self.status.clone(),
            generation: self.generation,
            etag: etag(self.generation),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_types::cluster::{LoginSpec, TaintEffect};

    fn pool(name: &str, count: u32) -> NodePoolSpec {
        NodePoolSpec {
            name: name.into(),
            machine_class: "gpu".into(),
            count,
            labels: Labels::new(),
            taints: vec![],
            role: NodePoolRole::Compute,
            remediation: NodePoolRemediation::default(),
            autoscaling: None,
        }
    }

    fn system(name: &str, count: u32) -> NodePoolSpec {
        NodePoolSpec { role: NodePoolRole::System, ..pool(name, count) }
    }

    fn slurm_spec(slurm: SlurmSpec) -> ClusterSpec {
        ClusterSpec {
            name: "c".into(),
            kind: ClusterKind::Slurm,
            isolation: Isolation::PrivateNodes,
            kubernetes_version: "v1.35.0".into(),
            slurm: Some(slurm),
            ray: None,
        }
    }

    #[test]
    fn conditions_move_their_transition_time_only_on_a_status_change() {
        let t0 = DateTime::<Utc>::from_timestamp(1_000, 0).expect("time");
        let t1 = DateTime::<Utc>::from_timestamp(2_000, 0).expect("time");
        let mut conditions = Vec::new();
        assert!(set_condition(&mut conditions, "Ready", ConditionStatus::False, "Waiting", "m", t0));
        assert!(!set_condition(&mut conditions, "Ready", ConditionStatus::False, "Waiting", "m", t1));
        assert!(set_condition(&mut conditions, "Ready", ConditionStatus::False, "Other", "m2", t1));
        assert_eq!(conditions[0].last_transition_time, t0);
        assert!(set_condition(&mut conditions, "Ready", ConditionStatus::True, "Done", "", t1));
        assert_eq!(conditions[0].last_transition_time, t1);
        assert_eq!(conditions.len(), 1);
    }

    #[test]
    fn kubernetes_versions_order_numerically() {
        assert!(version_key("v1.35") < version_key("v1.35.1"));
        assert!(version_key("v1.35.9") < version_key("v1.36.0"));
        assert!(version_key("v1.9.0") < version_key("v1.10.0"));
    }

    const LATEST: &str = "2026.12.3";

    #[test]
    fn slurm_versions_follow_the_clusters_base_stack() {
        let on = |version: &str, stack: &str| {
            let slurm = SlurmSpec { version: version.into(), ..SlurmSpec::default() };
            validate_cluster(&slurm_spec(slurm), &[pool("a", 1)], stack)
        };
        assert_eq!(crate::stack::latest_version(), LATEST);
        assert!(on("25.11", LATEST).is_ok() && on("26.05", LATEST).is_ok());
        assert_eq!(SlurmSpec::default().version, "26.05", "the default runs on the newest stack");
        let e = on("25.05", LATEST).expect_err("the operator of 2026.12.3 needs 25.11 or newer");
        let text = format!("{e:?}");
        assert!(text.contains("slurm.version") && text.contains("supported: 25.11, 26.05"), "{text}");
        // A cluster created on an older stack keeps its releases.
        assert!(on("25.05", "2026.11.0").is_ok());
        assert!(on("25.11", "2026.12.0").is_ok());
        let e = on("26.05", "2026.12.0").expect_err("2026.12.0 has no 26.05 images");
        assert!(format!("{e:?}").contains("supported: 25.11"), "{e:?}");
        assert!(on("25.1", LATEST).is_err());
    }

    #[test]
    fn slurm_clusters_have_one_system_pool_with_a_node() {
        let code = |kind, pools: &[NodePoolSpec]| check_system_pool(kind, pools).err().map(|e| e.code());
        assert_eq!(code(ClusterKind::Slurm, &[system("s", 1), pool("a", 0)]), None);
        assert_eq!(code(ClusterKind::Slurm, &[pool("a", 1)]), Some("system_pool_required"));
        assert_eq!(code(ClusterKind::Slurm, &[system("s", 0), pool("a", 4)]), Some("system_pool_empty"));
        assert_eq!(code(ClusterKind::Slurm, &[system("s", 1), system("t", 1)]), Some("system_pool_duplicate"));
        assert_eq!(code(ClusterKind::Kubernetes, &[pool("a", 1)]), None);
        assert_eq!(code(ClusterKind::Kubernetes, &[system("s", 1)]), Some("system_pool_unsupported"));
        // The system pool gets no NodeSet, so no partition may name it.
        let partition = Partition { name: "p".into(), node_pools: vec!["s".into()], default: true, max_time: None };
        let named = SlurmSpec { partitions: vec![partition], ..SlurmSpec::default() };
        assert!(validate_cluster(&slurm_spec(named), &[system("s", 1), pool("a", 1)], LATEST).is_err());
        let without = ClusterSpec { slurm: None, ..slurm_spec(SlurmSpec::default()) };
        assert!(validate_cluster(&without, &[pool("a", 1)], LATEST).is_err(), "a slurm cluster without Slurm settings");
    }

    #[test]
    fn partitions_must_name_existing_pools_and_one_default() {
        let partition = |name: &str, pools: &[&str], default| Partition {
            name: name.into(),
            node_pools: pools.iter().map(|p| (*p).to_owned()).collect(),
            default,
            max_time: Some("1-00:00:00".into()),
        };
        let ok = SlurmSpec { partitions: vec![partition("p", &["a"], true)], ..SlurmSpec::default() };
        assert!(validate_cluster(&slurm_spec(ok), &[pool("a", 1)], LATEST).is_ok());
        let unknown = SlurmSpec { partitions: vec![partition("p", &["zz"], true)], ..SlurmSpec::default() };
        assert!(validate_cluster(&slurm_spec(unknown), &[pool("a", 1)], LATEST).is_err());
        let two = SlurmSpec {
            partitions: vec![partition("p", &["a"], true), partition("q", &["a"], true)],
            ..SlurmSpec::default()
        };
        assert!(validate_cluster(&slurm_spec(two), &[pool("a", 1)], LATEST).is_err());
    }

    #[test]
    fn default_partitions_are_one_per_pool() {
        let parts = resolved_partitions(&SlurmSpec::default(), &["cpu", "gpu"]);
        assert_eq!(parts.len(), 2);
        assert!(parts[0].default && !parts[1].default);
        assert_eq!(parts[1].node_pools, ["gpu"]);
    }

    #[test]
    fn ssh_keys_and_taints_are_checked() {
        let login = LoginSpec {
            replicas: 1,
            ssh_authorized_keys: vec!["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH alice@laptop".into()],
        };
        assert!(
            validate_cluster(&slurm_spec(SlurmSpec { login, ..SlurmSpec::default() }), &[pool("a", 1)], LATEST).is_ok()
        );
        let login = LoginSpec { replicas: 1, ssh_authorized_keys: vec!["rm -rf /".into()] };
        assert!(validate_cluster(&slurm_spec(SlurmSpec { login, ..SlurmSpec::default() }), &[pool("a", 1)], LATEST)
            .is_err());
        let mut tainted = pool("a", 1);
        tainted.taints = vec![
            Taint { key: "nvidia.com/gpu".into(), value: "present".into(), effect: TaintEffect::NoSchedule },
            Taint { key: "nvidia.com/gpu".into(), value: "other".into(), effect: TaintEffect::NoSchedule },
        ];
        assert!(validate_pool(&tainted).is_err());
    }

    #[test]
    fn quotas_compare_the_demand_after_the_change() {
        let quotas = Quotas { max_clusters: Some(1), max_nodes: Some(4), max_gpus: None };
        assert!(check_quotas(&quotas, Demand { clusters: 1, nodes: 4, gpus: 999 }).is_ok());
        assert!(matches!(
            check_quotas(&quotas, Demand { clusters: 2, nodes: 0, gpus: 0 }),
            Err(Error::QuotaExceeded(_))
        ));
        assert!(matches!(
            check_quotas(&quotas, Demand { clusters: 1, nodes: 5, gpus: 0 }),
            Err(Error::QuotaExceeded(_))
        ));
    }
}
