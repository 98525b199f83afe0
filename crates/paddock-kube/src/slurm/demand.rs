//! The demand of a `slurm` cluster's elastic pools ([`SlurmDriver::job_demand`], docs/tenants.md
//! "Elastic pools"), read through slurmrestd by [`super::SlurmProbe::queue`]: `GET
//! /slurm/<v>/jobs/` and `GET /slurm/<v>/nodes/` in the data-parser version the cluster's
//! release pins (`v0.0.42` for every release of the catalogue today). The answers are read as
//! Slurm's OpenAPI for v0.0.42 describes them (`v0.0.42_openapi_job_info_resp`,
//! `v0.0.42_openapi_nodes_resp`); only the fields below are used and every one may be absent.
//!
//! The rules, pure functions of the two answers:
//! - **Pending work**: a job whose `job_state` holds `PENDING`, not held, waiting for a reason
//!   more nodes can cure ([`CURABLE_REASONS`]: its priority, resources, nodes not available or
//!   down, the partition's node limit or configuration); a job waiting for a dependency, a
//!   begin time, a hold, a license or an accounting limit would wait on any number of nodes. It
//!   counts for the first pool, in the order asked, whose partitions hold one of the job's
//!   (`partition`, comma-separated when submitted to several).
//! - **Nodes needed**: a job of more than one node (`node_count`) takes that many whole nodes
//!   (and is listed in [`Demand::wide_jobs`], for the autoscaler to set apart one wider than the
//!   pool's partition can ever be);
//!   jobs of one node are packed first fit, largest first, onto nodes of the pool's class by their
//!   CPUs (`cpus`), memory (`memory_per_node`, else `memory_per_cpu` times the CPUs, MB) and GPUs
//!   (`gpu` in `tres_per_node`), at most one job a node when it asks for the node alone
//!   (`shared: ["none"]`, `--exclusive`). Slurm's own limits (`MaxNodes`, partition sizes) are not
//!   second-guessed: the pool's `max` bounds what is asked.
//! - **The pool's nodes**: the Slurm nodes of its NodeSet, known by the feature Slinky gives every
//!   node of a NodeSet (its name), or by the pod information Slinky's operator writes into the
//!   node's `comment` (`nodeSetName`, and `node`: the Kubernetes Node it runs on). Nodes that exist
//!   only in Slurm's configuration (`FUTURE`, `POWERED_DOWN`: a machine to come) are not counted.
//! - **Idle**: a node of the pool neither `ALLOCATED`, `MIXED`, `COMPLETING` nor `PLANNED` (the
//!   backfill scheduler holds it for a pending job); a `DOWN` or drained node runs nothing and is
//!   idle. Its Kubernetes Node name (from the comment) is what paddock gives back first.
//!
//! This read is proven against a slurmrestd stand-in that answers v0.0.42's documented shapes
//! (through the API server's service proxy, with the real operator), and its parsing and rules
//! against the answers of a real slurmrestd 26.05 on this host (`tests/kube/slurm_host.rs`: the
//! nodes slurm.conf declares for an elastic pool are not listed; the jobs they let Slurm accept
//! are the pool's demand). The whole loop on a real cluster comes with the real-Slurm test path
//! (an `sbatch -N 1` on a pool at zero).

use serde::Deserialize;
use serde_json::Value;

use paddock_domain::driver::{Demand, DemandPool, PoolDemand, WideJob};

use crate::nodes::{nodes_needed, Request};

/// The `state_reason`s of a pending job that more nodes can cure (Slurm's
/// `src/common/job_state_reason.c`).
pub const CURABLE_REASONS: &[&str] =
    &["None", "Priority", "Resources", "ReqNodeNotAvail", "NodeDown", "PartitionNodeLimit", "PartitionConfig"];

/// A number Slurm may leave unset (`v0.0.42_uint32_no_val_struct`, `..._uint64_...`).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq)]
pub struct NoVal {
    /// Whether `number` holds a value.
    #[serde(default)]
    pub set: bool,
    /// Unlimited (then `number` is ignored).
    #[serde(default)]
    pub infinite: bool,
    /// The value.
    #[serde(default)]
    pub number: f64,
}

impl NoVal {
    /// The value, when set and finite.
    pub fn value(&self) -> Option<u64> {
        (self.set && !self.infinite && self.number >= 0.0).then_some(self.number as u64)
    }
}

/// A job as `GET /slurm/v0.0.42/jobs/` lists it (`v0.0.42_job_info`), the fields demand uses.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlurmJob {
    /// Its id.
    #[serde(default)]
    pub job_id: u64,
    /// Its partition(s), comma-separated.
    #[serde(default)]
    pub partition: String,
    /// State and flags (`PENDING`, `RUNNING`, ...).
    #[serde(default)]
    pub job_state: Vec<String>,
    /// Why it waits (`Resources`, `Priority`, `Dependency`, ...).
    #[serde(default)]
    pub state_reason: String,
    /// Held.
    #[serde(default)]
    pub hold: bool,
    /// Nodes asked for (the minimum, while pending).
    #[serde(default)]
    pub node_count: NoVal,
    /// CPUs asked for (the minimum, while pending).
    #[serde(default)]
    pub cpus: NoVal,
    /// Memory per node, MB.
    #[serde(default)]
    pub memory_per_node: NoVal,
    /// Memory per CPU, MB.
    #[serde(default)]
    pub memory_per_cpu: NoVal,
    /// Trackable resources per node (`gres/gpu:4`).
    #[serde(default)]
    pub tres_per_node: String,
    /// Sharing (`none` for a job that wants its nodes alone).
    #[serde(default)]
    pub shared: Vec<String>,
}

/// A node as `GET /slurm/v0.0.42/nodes/` lists it (`v0.0.42_node`), the fields paddock uses (its
/// demand, and the drain reasons the health read rates).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct SlurmNode {
    /// Its Slurm name.
    #[serde(default)]
    pub name: String,
    /// State and flags (`IDLE`, `ALLOCATED`, `MIXED`, `DRAIN`, ...).
    #[serde(default)]
    pub state: Vec<String>,
    /// Configured features (a NodeSet's node carries the NodeSet's name).
    #[serde(default)]
    pub features: Vec<String>,
    /// Active features.
    #[serde(default)]
    pub active_features: Vec<String>,
    /// The comment (Slinky's operator writes its pod's information there, as JSON).
    #[serde(default)]
    pub comment: String,
    /// Why it drains or is down; empty when nothing is said.
    #[serde(default)]
    pub reason: String,
}

/// What slurmrestd answered to the two reads.
#[derive(Debug, Clone, Default)]
pub struct SlurmQueue {
    /// Every job slurmctld knows.
    pub jobs: Vec<SlurmJob>,
    /// Every node slurmctld knows.
    pub nodes: Vec<SlurmNode>,
}

#[derive(Deserialize)]
struct JobsAnswer {
    #[serde(default)]
    jobs: Vec<SlurmJob>,
    #[serde(default)]
    errors: Vec<Value>,
}

#[derive(Deserialize)]
struct NodesAnswer {
    #[serde(default)]
    nodes: Vec<SlurmNode>,
    #[serde(default)]
    errors: Vec<Value>,
}

/// The jobs of a `GET /slurm/<v>/jobs/` answer, or why not (not JSON, or errors reported).
pub fn parse_jobs(body: &str) -> Result<Vec<SlurmJob>, String> {
    let answer: JobsAnswer = serde_json::from_str(body).map_err(|e| format!("not a job list: {e}"))?;
    match answer.errors.first() {
        Some(e) => Err(format!("slurmrestd reported an error: {}", error_text(e))),
        None => Ok(answer.jobs),
    }
}

/// The nodes of a `GET /slurm/<v>/nodes/` answer, or why not.
pub fn parse_nodes(body: &str) -> Result<Vec<SlurmNode>, String> {
    let answer: NodesAnswer = serde_json::from_str(body).map_err(|e| format!("not a node list: {e}"))?;
    match answer.errors.first() {
        Some(e) => Err(format!("slurmrestd reported an error: {}", error_text(e))),
        None => Ok(answer.nodes),
    }
}

/// An `v0.0.42_openapi_error`'s text (its `description`, else its `error`).
fn error_text(e: &Value) -> String {
    let field = |k: &str| e.get(k).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
    field("description").or_else(|| field("error")).unwrap_or_else(|| "(no description)".to_owned())
}

fn has(flags: &[String], flag: &str) -> bool {
    flags.iter().any(|f| f.eq_ignore_ascii_case(flag))
}

/// Whether `job` is pending work more nodes would start (see the module documentation).
pub fn curable(job: &SlurmJob) -> bool {
    has(&job.job_state, "PENDING") && !job.hold && CURABLE_REASONS.contains(&job.state_reason.as_str())
}

/// The GPUs per node a job asks for in its `tres_per_node` (`gres/gpu:4`, `gres/gpu:h100:2`).
fn gpus_per_node(tres: &str) -> u64 {
    tres.split(',')
        .filter(|t| t.split(['/', ':', '=']).any(|p| p == "gpu"))
        .filter_map(|t| t.rsplit([':', '=']).next().and_then(|n| n.parse::<u64>().ok()))
        .sum()
}

/// What one node of `job` asks of it, or the whole `size` when it wants its nodes alone.
fn job_request(job: &SlurmJob, size: Request) -> Request {
    if has(&job.shared, "none") {
        return size;
    }
    let cpus = job.cpus.value().unwrap_or(1).max(1);
    let memory_mb = job.memory_per_node.value().or_else(|| job.memory_per_cpu.value().map(|m| m * cpus));
    Request {
        cpu_milli: cpus.saturating_mul(1000),
        memory: memory_mb.unwrap_or_default().saturating_mul(1 << 20),
        gpus: gpus_per_node(&job.tres_per_node),
    }
}

/// The pod information Slinky's operator writes into a node's comment.
#[derive(Deserialize)]
struct PodInfo {
    #[serde(default, rename = "nodeSetName")]
    node_set_name: String,
    #[serde(default)]
    node: String,
}

fn pod_info(node: &SlurmNode) -> Option<PodInfo> {
    serde_json::from_str(&node.comment).ok()
}

/// Whether `node` is one of `pool`'s (see the module documentation).
fn of_pool(node: &SlurmNode, pool: &DemandPool) -> bool {
    has(&node.features, &pool.name)
        || has(&node.active_features, &pool.name)
        || pod_info(node).is_some_and(|i| i.node_set_name == pool.name)
}

/// Whether `node` runs nothing (see the module documentation).
fn idle(node: &SlurmNode) -> bool {
    !["ALLOCATED", "MIXED", "COMPLETING", "PLANNED"].iter().any(|s| has(&node.state, s))
}

/// Whether `node` is only a place in Slurm's configuration, not a machine.
fn placeholder(node: &SlurmNode) -> bool {
    has(&node.state, "FUTURE") || has(&node.state, "POWERED_DOWN")
}

/// The pools' partitions: the resolved ones, or the pool's own name (a NodeSet's partition).
fn partitions(pool: &DemandPool) -> Vec<&str> {
    if pool.partitions.is_empty() {
        vec![pool.name.as_str()]
    } else {
        pool.partitions.iter().map(String::as_str).collect()
    }
}

/// The demand of `pools` given what slurmrestd answered (see the module documentation).
pub fn demand_of(pools: &[DemandPool], queue: &SlurmQueue) -> Demand {
    let sizes: Vec<Request> = pools
        .iter()
        .map(|p| Request {
            cpu_milli: u64::from(p.cpu_cores) * 1000,
            memory: u64::from(p.memory_gib) << 30,
            gpus: u64::from(p.gpus),
        })
        .collect();
    // Per pool: the pending jobs, the whole nodes of multi-node jobs, the one-node requests.
    let mut wanted: Vec<(u32, u64, Vec<Request>)> = vec![(0, 0, Vec::new()); pools.len()];
    let count = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let mut demand = Demand::default();
    for job in queue.jobs.iter().filter(|j| curable(j)) {
        let asked: Vec<&str> = job.partition.split(',').map(str::trim).collect();
        let Some(i) = pools.iter().position(|p| partitions(p).iter().any(|q| asked.contains(q))) else { continue };
        let entry = &mut wanted[i];
        entry.0 += 1;
        match job.node_count.value().unwrap_or(1).max(1) {
            1 => entry.2.push(job_request(job, sizes[i])),
            n => {
                entry.1 = entry.1.saturating_add(n);
                let (node_pool_id, job) = (pools[i].node_pool_id, job.job_id.to_string());
                demand.wide_jobs.push(WideJob { node_pool_id, job, nodes: count(n) });
            }
        }
    }
    for ((pool, size), (pending, whole, one_node)) in pools.iter().zip(&sizes).zip(wanted) {
        // A one-node job larger than a node of the class still asks for one node.
        let fitting: Vec<Request> = one_node.iter().map(|r| if r.fits(*size) { *r } else { *size }).collect();
        let (_, packed) = nodes_needed(&fitting, *size);
        let mine: Vec<&SlurmNode> = queue.nodes.iter().filter(|n| !placeholder(n) && of_pool(n, pool)).collect();
        let idle_nodes: Vec<&SlurmNode> = mine.iter().copied().filter(|n| idle(n)).collect();
        demand.pools.push(PoolDemand {
            pending,
            pending_nodes: count(whole.saturating_add(u64::from(packed))),
            nodes: count(mine.len() as u64),
            idle_nodes: count(idle_nodes.len() as u64),
        });
        let names = idle_nodes.iter().filter_map(|n| pod_info(n)).map(|i| i.node).filter(|n| !n.is_empty());
        demand.idle_node_names.extend(names);
    }
    demand
}

#[cfg(test)]
mod tests;
