//! The demand checks of elastic pools (docs/tenants.md, "Elastic pools"). Two kinds of run of
//! the job kind [`CLUSTER_AUTOSCALE`] (docs/architecture.md):
//! - **The sweep** (one job for the whole fleet; [`paddock_store::autoscale::watched`]): every
//!   `PADDOCK_AUTOSCALE_INTERVAL` it reads every cluster with an autoscaled pool, with its pools and
//!   machines, in three statements, reads each cluster's demand through its driver (Slurm's
//!   pending jobs and idle nodes through slurmrestd; a `kubernetes` cluster's unschedulable pods),
//!   [`SWEEP_CONCURRENCY`] clusters at a time, and decides in memory
//!   ([`paddock_domain::autoscale::decide`]). It writes nothing: a cluster whose decision would
//!   write (a target, the autoscaler's memory or a pool's `DemandFits` condition moves), or whose
//!   demand its driver can never read and which was not told so since its pools last changed,
//!   gets its own job armed. At rest that is three statements per interval and one demand read
//!   per cluster.
//! - **A cluster's job**: reads the cluster again, decides again and, when a target moves, writes
//!   it with its operation, event and the cluster's reconcile job, which reaches the target
//!   through the pool-resize machinery (allocation in line, drain, release, wipe). It shares the
//!   cluster's target with its reconcile job, so the two never run at once; it runs once per
//!   arming (the sweep, a pool made autoscaled or changed) and makes sure the sweep is queued.

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use paddock_domain::autoscale::{decide, demand_fits, set_apart, Direction, PoolNow, DEMAND_FITS};
use paddock_domain::cluster::{resolved_partitions, set_condition, Cluster, NodePool};
use paddock_domain::driver::{
    ClusterRef, Demand, DemandPool, DriverError, DriverErrorKind, KubeDrivers, SlurmVersion, TenantAccess, WideJob,
};
use paddock_domain::job_kind::{ClusterJob, Payload, CLUSTER_AUTOSCALE};
use paddock_domain::machine::HELD;
use paddock_service::autoscale::PoolDecision;
use paddock_store::allocation::{self, HeldMachine};
use paddock_store::autoscale::{self as store, Room, Watched, FLEET_TARGET_TYPE};
use paddock_store::{cluster as cluster_store, cluster_event, node_pool, StoreError};
use paddock_types::cluster::{ClusterKind, Condition, NodePoolRole};
use paddock_types::machine::MachineState;
use paddock_types::{ClusterId, TenantId};

use crate::reconcile::{cluster_ref, open_access, store_error, tenant_access, DRIVER_NOT_CONFIGURED, DRIVER_WAIT};
use crate::{Job, JobHandler, Outcome};

use super::{bad_payload, ClusterReconciler};

/// The [`CLUSTER_AUTOSCALE`] handler: one demand check of a cluster's autoscaled pools, queued
/// again for the next one while the cluster has any.
#[derive(Clone, Debug)]
pub struct Autoscaler(pub ClusterReconciler);

/// Whether an autoscaled pool is on its way to its target: it holds another number of machines,
/// or some are still leaving it.
pub(super) fn scaling(pools: &[NodePool], held: &[HeldMachine]) -> bool {
    pools.iter().filter(|p| p.spec.autoscaling.is_some() && !p.deleting).any(|p| {
        let mine = held.iter().filter(|m| m.node_pool_id == p.id);
        let holding = mine.clone().filter(|m| HELD.contains(&m.state)).count();
        holding != p.status.desired_count as usize || mine.into_iter().any(|m| m.state == MachineState::Releasing)
    })
}

/// How many clusters' demand the sweep reads at once.
pub const SWEEP_CONCURRENCY: usize = 16;

/// What a check reads of the cluster first.
struct Found {
    cluster: Cluster,
    pools: Vec<NodePool>,
    held: Vec<HeldMachine>,
    access: Option<TenantAccess>,
}

impl Autoscaler {
    /// A cluster's job: one check, then done (the sweep watches on).
    async fn check(&self, tenant: TenantId, id: ClusterId) -> Outcome {
        let Some(kube) = self.0.drivers.kube.clone() else {
            let message = "no Kubernetes driver is configured (PADDOCK_KUBE_DRIVER=none); demand is not read";
            return Outcome::wait(DRIVER_WAIT, DRIVER_NOT_CONFIGURED, message);
        };
        let checked = async {
            self.look(&kube, tenant, id).await?;
            // The sweep watches from here on (merged into the queued one).
            let mut tx = self.0.services.store().begin().await?;
            store::enqueue_sweep(&mut tx, self.0.settings.autoscale_interval).await?;
            Ok(tx.commit().await?)
        };
        match checked.await {
            Ok(()) => Outcome::Done,
            Err(e) => store_error(e),
        }
    }

    async fn look(&self, kube: &KubeDrivers, tenant: TenantId, id: ClusterId) -> Result<(), StoreError> {
        let Some(found) = self.load(tenant, id).await? else {
            return Ok(());
        };
        let Some(access) = &found.access else {
            // No tenant cluster to ask yet: the sweep looks again once it is ready.
            return Ok(());
        };
        let autoscaled: Vec<&NodePool> =
            found.pools.iter().filter(|p| p.spec.autoscaling.is_some() && !p.deleting).collect();
        let asked = demand_pools(&found, &autoscaled);
        let demand = match read(kube, &found.cluster, access, &asked).await {
            Ok(demand) if demand.pools.len() == asked.len() => demand,
            Ok(_) => {
                tracing::warn!(tenant = %tenant, cluster = %id, "the demand read answered for other pools than asked");
                return Ok(());
            }
            Err(e) if e.kind == DriverErrorKind::Permanent => return self.unavailable(tenant, id, &e).await,
            Err(e) => {
                tracing::warn!(tenant = %tenant, cluster = %id, code = %e.code, error = %e.message,
                    "the demand of the cluster's autoscaled pools could not be read");
                return Ok(());
            }
        };
        // At rest nothing moves and the bounds are never read: a decision to grow reads them (the
        // fleet, the quota) and is taken again within them.
        let mut decisions = decisions(&found, &autoscaled, &demand, None);
        if decisions.iter().any(|d| d.scale.as_ref().is_some_and(|s| s.direction == Direction::Up)) {
            let mut conn = self.0.services.store().conn().await?;
            let room = store::room(&mut conn, tenant, id).await?;
            drop(conn);
            decisions = self::decisions(&found, &autoscaled, &demand, Some(&room));
        }
        if !decisions.is_empty() {
            let written = self.0.services.autoscale_write(tenant, id, &decisions).await;
            if let Err(e) = written {
                let chain = paddock_domain::error::chain(&e);
                tracing::warn!(tenant = %tenant, cluster = %id, "a scaling decision was not written: {chain}");
            }
        }
        Ok(())
    }

    /// The sweep (see the module documentation): again after the interval while any cluster has
    /// an autoscaled pool; done when none has (a cluster's job queues it again).
    async fn sweep(&self) -> Outcome {
        let Some(kube) = self.0.drivers.kube.clone() else {
            let message = "no Kubernetes driver is configured (PADDOCK_KUBE_DRIVER=none); demand is not read";
            return Outcome::wait(DRIVER_WAIT, DRIVER_NOT_CONFIGURED, message);
        };
        let interval = self.0.settings.autoscale_interval;
        let read = async {
            let mut tx = self.0.services.store().begin().await?;
            let watched = store::watched(&mut tx).await?;
            tx.commit().await?;
            Ok::<_, StoreError>(watched)
        };
        let watched = match read.await {
            Ok(watched) => watched,
            // Never a failure: the sweep must not run out of attempts.
            Err(e) => return Outcome::wait_because(interval, "database", e.to_string(), e),
        };
        if watched.is_empty() {
            return Outcome::Done;
        }
        let due: Vec<(TenantId, ClusterId)> = futures::stream::iter(watched)
            .map(|w| self.sweep_one(&kube, w))
            .buffer_unordered(SWEEP_CONCURRENCY)
            .filter_map(|due| async move { due })
            .collect()
            .await;
        if !due.is_empty() {
            let armed = async {
                let mut tx = self.0.services.store().begin().await?;
                for (tenant, cluster) in &due {
                    store::arm(&mut tx, *tenant, *cluster, std::time::Duration::ZERO).await?;
                }
                Ok::<_, StoreError>(tx.commit().await?)
            };
            if let Err(e) = armed.await {
                let chain = paddock_domain::error::chain(&e);
                tracing::warn!(clusters = due.len(), "the demand checks the sweep found due were not armed: {chain}");
            }
        }
        Outcome::wait(interval, "watching_demand", "waiting for the next demand sweep")
    }

    /// One cluster of the sweep: its ids when its own job should run (a decision would write, or
    /// its driver can never read its demand and it was not told so since its pools last changed).
    async fn sweep_one(&self, kube: &KubeDrivers, watched: Watched) -> Option<(TenantId, ClusterId)> {
        let Watched { elastic, pools, held } = watched;
        let (tenant, id) = (elastic.cluster.tenant_id, elastic.cluster.id);
        let live = |p: &&NodePool| p.spec.autoscaling.is_some() && !p.deleting;
        let changed = pools.iter().filter(live).map(|p| p.updated_at).max();
        if elastic.unreadable_at.zip(changed).is_some_and(|(said, changed)| said >= changed) {
            return None;
        }
        let reference = ClusterRef {
            tenant_id: tenant,
            cluster_id: id,
            tenant_name: elastic.tenant_name,
            cluster_name: elastic.cluster.spec.name.clone(),
        };
        let sealed = elastic.admin_kubeconfig.as_deref();
        let access = match open_access(self.0.services.cipher(), reference, endpoint(&elastic.cluster), sealed) {
            Ok(Some(access)) => access,
            Ok(None) => return None,
            Err(e) => {
                let chain = paddock_domain::error::chain(&e);
                tracing::warn!(tenant = %tenant, cluster = %id, "the cluster's demand cannot be read: {chain}");
                return None;
            }
        };
        let found = Found { cluster: elastic.cluster, pools, held, access: None };
        let autoscaled: Vec<&NodePool> = found.pools.iter().filter(live).collect();
        let asked = demand_pools(&found, &autoscaled);
        match read(kube, &found.cluster, &access, &asked).await {
            Ok(demand) if demand.pools.len() == asked.len() => {
                (!decisions(&found, &autoscaled, &demand, None).is_empty()).then_some((tenant, id))
            }
            Ok(_) => {
                tracing::warn!(tenant = %tenant, cluster = %id, "the demand read answered for other pools than asked");
                None
            }
            // Its own job tells the tenant, once.
            Err(e) if e.kind == DriverErrorKind::Permanent => Some((tenant, id)),
            Err(e) => {
                tracing::warn!(tenant = %tenant, cluster = %id, code = %e.code, error = %e.message,
                    "the demand of the cluster's autoscaled pools could not be read");
                None
            }
        }
    }

    /// The driver can never read this cluster's demand (`demand_unsupported`): asking every
    /// interval would only repeat the error. The tenant is told once, by a Warning event, and the
    /// sweep leaves the cluster alone until one of its autoscaled pools changes.
    async fn unavailable(&self, tenant: TenantId, id: ClusterId, e: &DriverError) -> Result<(), StoreError> {
        tracing::warn!(tenant = %tenant, cluster = %id, code = %e.code, error = %e.message,
            "the demand of the cluster's autoscaled pools cannot be read: its demand checks end");
        let message = format!(
            "the demand of the autoscaled pools cannot be read ({}: {}); their targets stay where they are",
            e.code, e.message
        );
        let mut conn = self.0.services.store().conn().await?;
        cluster_event::insert(&mut conn, tenant, id, "Warning", "AutoscalingUnavailable", &message).await
    }

    /// The cluster, its pools, held machines, tenant access and room, in one transaction; `None`
    /// when there is nothing to watch (gone, deleting, no autoscaled pool).
    async fn load(&self, tenant: TenantId, id: ClusterId) -> Result<Option<Found>, StoreError> {
        let mut tx = self.0.services.store().begin().await?;
        let Some(cluster) = cluster_store::get(&mut tx, tenant, id).await? else {
            return Ok(None);
        };
        let pools = node_pool::of_cluster(&mut tx, tenant, id).await?;
        if cluster.deleting || !pools.iter().any(|p| p.spec.autoscaling.is_some() && !p.deleting) {
            return Ok(None);
        }
        let Some(reference) = cluster_ref(&mut tx, tenant, id, &cluster.spec.name).await? else {
            return Ok(None);
        };
        let access = tenant_access(&mut tx, self.0.services.cipher(), reference, endpoint(&cluster)).await?;
        let held = allocation::machines_of(&mut tx, tenant, id).await?;
        tx.commit().await?;
        Ok(Some(Found { cluster, pools, held, access }))
    }
}

/// Where the cluster's demand is read: its API server, once the cluster was ready once (its
/// Slurm answers then).
fn endpoint(cluster: &Cluster) -> Option<&str> {
    cluster.status.endpoints.kubernetes_api.as_deref().filter(|_| cluster.status.observed_generation > 0)
}

/// What the drivers are asked about each autoscaled pool.
fn demand_pools(found: &Found, autoscaled: &[&NodePool]) -> Vec<DemandPool> {
    let compute: Vec<&str> = found
        .pools
        .iter()
        .filter(|p| !p.deleting && p.spec.role == NodePoolRole::Compute)
        .map(|p| p.spec.name.as_str())
        .collect();
    let partitions = found.cluster.spec.slurm.as_ref().map(|s| resolved_partitions(s, &compute)).unwrap_or_default();
    autoscaled
        .iter()
        .map(|pool| DemandPool {
            node_pool_id: pool.id,
            name: pool.spec.name.clone(),
            partitions: partitions
                .iter()
                .filter(|p| p.node_pools.contains(&pool.spec.name))
                .map(|p| p.name.clone())
                .collect(),
            node_names: found
                .held
                .iter()
                .filter(|m| m.node_pool_id == pool.id && m.state == MachineState::Active)
                .filter_map(|m| m.node_name.clone())
                .collect(),
            labels: pool.spec.labels.clone(),
            taints: pool.spec.taints.clone(),
            cpu_cores: pool.class_size.0,
            memory_gib: pool.class_size.1,
            gpus: pool.gpu_count,
        })
        .collect()
}

/// The demand of `pools` through the cluster's driver.
async fn read(
    kube: &KubeDrivers,
    cluster: &Cluster,
    access: &TenantAccess,
    pools: &[DemandPool],
) -> Result<Demand, DriverError> {
    match (cluster.spec.kind, &cluster.spec.slurm) {
        (ClusterKind::Slurm, Some(slurm)) => {
            let version = SlurmVersion { stack_version: cluster.stack_version.clone(), version: slurm.version.clone() };
            kube.slurm.job_demand(access, &version, pools).await
        }
        _ => kube.nodes.pod_demand(access, pools).await,
    }
}

/// The decisions worth writing: a pool whose target or memory moves. Without `room` the pools
/// are unbounded but by their `max` (a first look: only a scale-up needs the bounds).
fn decisions<'a>(
    found: &Found,
    autoscaled: &[&'a NodePool],
    demand: &Demand,
    room: Option<&Room>,
) -> Vec<PoolDecision<'a>> {
    let now = Utc::now();
    let noun = match found.cluster.spec.kind {
        ClusterKind::Slurm => "pending jobs",
        // A ray cluster's pools are never autoscaled (`check_autoscalable`); its pods would be the demand.
        ClusterKind::Kubernetes | ClusterKind::Ray => "unschedulable pods",
    };
    let mut out = Vec::new();
    for (pool, read) in autoscaled.iter().zip(&demand.pools) {
        let Some(autoscaling) = pool.spec.autoscaling else { continue };
        // A job wider than the pool's partition can ever be pends for good: the pool neither
        // grows nor stays grown for it, and its condition says so.
        let most = most_nodes(found, pool);
        let (wants, never) = set_apart(read, demand.wide_jobs.iter().filter(|j| j.node_pool_id == pool.id), most);
        let wants = &wants;
        let conditions = fits_conditions(pool, &never, most, now);
        let (ceiling, ceiling_by) = room.map_or((u32::MAX, None), |room| ceiling(found, room, pool));
        let now_pool = PoolNow {
            autoscaling,
            target: pool.status.desired_count,
            held: held_by(&found.held, pool),
            memory: pool.scaling,
            ceiling,
            ceiling_by,
        };
        let decided = decide(&now_pool, wants, noun, now);
        if decided.scale.is_none() && decided.memory == pool.scaling && conditions.is_none() {
            continue;
        }
        let idle_node_names = match &decided.scale {
            Some(_) => {
                let mine: Vec<&String> = found
                    .held
                    .iter()
                    .filter(|m| m.node_pool_id == pool.id)
                    .filter_map(|m| m.node_name.as_ref())
                    .collect();
                demand.idle_node_names.iter().filter(|n| mine.contains(n)).cloned().collect()
            }
            None => pool.release_first.clone(),
        };
        out.push(PoolDecision { pool, memory: decided.memory, scale: decided.scale, idle_node_names, conditions });
    }
    out
}

/// The most nodes one job counted for `pool` can ever be given: the largest of its partitions,
/// each with its elastic pools at `max` and its fixed pools at their count (the pool alone when
/// it is in no partition: a `kubernetes` cluster's).
fn most_nodes(found: &Found, pool: &NodePool) -> u32 {
    let ever = |p: &NodePool| p.spec.autoscaling.map_or(p.status.desired_count, |a| a.max);
    let live: Vec<&NodePool> = found.pools.iter().filter(|p| !p.deleting).collect();
    let compute: Vec<&str> =
        live.iter().filter(|p| p.spec.role == NodePoolRole::Compute).map(|p| p.spec.name.as_str()).collect();
    let partitions = found.cluster.spec.slurm.as_ref().map(|s| resolved_partitions(s, &compute)).unwrap_or_default();
    partitions
        .iter()
        .filter(|part| part.node_pools.contains(&pool.spec.name))
        .map(|part| {
            let members = live.iter().filter(|p| part.node_pools.contains(&p.spec.name));
            members.fold(0u32, |sum, p| sum.saturating_add(ever(p)))
        })
        .max()
        .unwrap_or_else(|| ever(pool))
}

/// The pool's conditions with its [`DEMAND_FITS`] as the jobs that `never` fit say, when that
/// changes it.
fn fits_conditions(pool: &NodePool, never: &[&WideJob], most: u32, now: DateTime<Utc>) -> Option<Vec<Condition>> {
    let said_so = pool.status.conditions.iter().any(|c| c.type_ == DEMAND_FITS);
    let (status, reason, message) = demand_fits(never, most, said_so)?;
    let mut conditions = pool.status.conditions.clone();
    set_condition(&mut conditions, DEMAND_FITS, status, reason, &message, now).then_some(conditions)
}

/// The most `pool` could hold now besides its `max`, and what bounds it: the fleet of its class
/// less what the cluster's other pools of the class ask for (all or nothing: more could never
/// be allocated), and the tenant's quota room on top of what the pool holds.
fn ceiling(found: &Found, room: &Room, pool: &NodePool) -> (u32, Option<&'static str>) {
    let others: u64 = found
        .pools
        .iter()
        .filter(|p| p.id != pool.id && !p.deleting && p.machine_class_id == pool.machine_class_id)
        .map(|p| u64::from(p.status.desired_count))
        .sum();
    let fleet = room.fleet_of(pool.machine_class_id).saturating_sub(others);
    let held = u64::from(held_by(&found.held, pool));
    let by_nodes = room.nodes.map(|room| held + room);
    let by_gpus = match (room.gpus, pool.gpu_count) {
        (Some(room), gpus) if gpus > 0 => Some(held + room / u64::from(gpus)),
        _ => None,
    };
    let quota = by_nodes.into_iter().chain(by_gpus).min();
    let max = u64::from(pool.spec.autoscaling.map_or(u32::MAX, |a| a.max));
    let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    match quota {
        Some(q) if q < fleet && q < max => (clamp(q), Some("the tenant's quota")),
        _ if fleet < max => (clamp(fleet), Some("the machine class's capacity")),
        _ => (clamp(max), None),
    }
}

/// The machines `pool` holds (allocated, provisioning, active).
fn held_by(held: &[HeldMachine], pool: &NodePool) -> u32 {
    let n = held.iter().filter(|m| m.node_pool_id == pool.id && HELD.contains(&m.state)).count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl JobHandler for Autoscaler {
    fn kind(&self) -> &'static str {
        CLUSTER_AUTOSCALE
    }

    fn run<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        if job.target_type == FLEET_TARGET_TYPE {
            return self.sweep().boxed();
        }
        match ClusterJob::from_value(&job.payload) {
            Ok(c) => self.check(c.tenant_id, c.cluster_id).boxed(),
            Err(e) => bad_payload(e),
        }
    }
}
