//! Clusters and node pools: what tenants (and providers on their behalf) ask for. Each change is
//! checked (403, 404, suspended tenant 409, 412, 422, quota 409), written with its operation, its
//! cluster event and its audit event, and enqueues the cluster's reconcile job, all in one
//! transaction. The tenant row is locked first, so concurrent requests of one tenant are checked
//! against quotas one after the other.
//!
//! Operations of clusters and pools complete when the reconciler's observed generation reaches
//! the generation they were created for (docs/api.md); jobs therefore carry no operation.

use paddock_domain::cluster::{self as rules, Cluster, ClusterSpec, NodePool, NodePoolSpec};
use paddock_domain::cursor::PageRequest;
use paddock_domain::model::Tenant;
use paddock_domain::precondition::IfMatch;
use paddock_domain::{Error, Permission, Result, Scope};
use paddock_store::node_pool::MachinesOf;
use paddock_store::{cluster as store, cluster_event, machine_class, node_pool, tenant, Conn, Tx};
use paddock_types::cluster::{
    ClusterCreate, ClusterEventView, ClusterKind, NodePoolCreate, NodePoolRole, PoolMachineView,
};
use paddock_types::operation::OperationView;
use paddock_types::tenant::TenantState;
use paddock_types::{ClusterId, MachineClassId, MachineId, NodePoolId, TenantId};
use serde_json::json;

use crate::autoscale;
use crate::operation::{accept, Accepted, Target};
use crate::{Body, Ctx, Done, Listed, Services};

const CLUSTER_NOT_FOUND: Error = Error::NotFound { kind: "cluster" };
const POOL_NOT_FOUND: Error = Error::NotFound { kind: "node pool" };

/// A cluster with its pools.
#[derive(Debug)]
pub struct ClusterWithPools {
    /// The cluster.
    pub cluster: Cluster,
    /// Its live pools (deleting ones included).
    pub pools: Vec<NodePool>,
}

/// A cluster change and the operation that follows it.
#[derive(Debug)]
pub struct ClusterChange {
    /// The cluster as it is now.
    pub cluster: ClusterWithPools,
    /// The operation.
    pub operation: OperationView,
}

/// A node pool change and the operation that follows it.
#[derive(Debug)]
pub struct NodePoolChange {
    /// The pool as it is now.
    pub pool: NodePool,
    /// The operation.
    pub operation: OperationView,
}

impl Services {
    /// Starts a tenant-side write: checks the caller may change clusters of this tenant (403, or
    /// 404 for a foreign tenant, `kind` naming what the caller asked for), opens the transaction
    /// and locks the tenant row (404 when missing; 409 when a tenant user writes while the tenant
    /// is suspended: provider writes still work). The lock also serializes the tenant's quota
    /// checks.
    pub(crate) async fn begin_tenant_write(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        kind: &'static str,
    ) -> Result<(Tx, Tenant)> {
        let scope = ctx.actor.authorize_tenant(Permission::ClusterWrite, tenant_id, kind)?;
        let mut tx = self.store.begin().await?;
        let tenant = tenant::get_for_update(&mut tx, tenant_id).await?.ok_or(Error::NotFound { kind: "tenant" })?;
        if matches!(scope, Scope::Tenant(_)) && tenant.state == TenantState::Suspended {
            return Err(Error::conflict(
                "tenant_suspended",
                "the tenant is suspended; its clusters keep running but cannot change",
            ));
        }
        Ok((tx, tenant))
    }

    /// Creates a cluster with its pools; the worker builds it.
    pub async fn cluster_create(&self, ctx: &Ctx, tenant_id: TenantId, body: &Body) -> Result<ClusterChange> {
        self.audited(ctx, "cluster.create", "cluster", async |audit| {
            audit.target_tenant(tenant_id);
            let (mut tx, tenant) = self.begin_tenant_write(ctx, tenant_id, "tenant").await?;
            // The order of checks (docs/api.md): a 409 goes before any 422. The cluster count
            // needs no body; the nodes, GPUs and the fleet need the body's counts and classes,
            // so they are checked before the values are (an unknown class adds no GPUs).
            let mut demand = store::demand(&mut tx, tenant_id, None).await?;
            demand.clusters += 1;
            rules::check_quotas(&tenant.spec.quotas, demand)?;
            let (mut spec, pools) = ClusterSpec::from_create(body.decode::<ClusterCreate>()?);
            let pools: Vec<NodePoolSpec> = pools.into_iter().map(NodePoolSpec::from).collect();
            let mut classes = Vec::with_capacity(pools.len());
            for pool in &pools {
                classes.push(known_class(&mut tx, &pool.machine_class).await?);
            }
            for (pool, class) in pools.iter().zip(&classes) {
                demand.nodes += u64::from(pool.quota_count());
                demand.gpus += u64::from(pool.quota_count()) * u64::from(class.map_or(0, |(_, gpus)| gpus));
            }
            rules::check_quotas(&tenant.spec.quotas, demand)?;
            for (class, _) in classes.iter().flatten() {
                let wanted = pools.iter().zip(&classes).filter(|(_, c)| c.is_some_and(|(c, _)| c == *class));
                check_fleet(&mut tx, ctx, *class, wanted.map(|(p, _)| u64::from(p.count)).sum()).await?;
            }
            // New clusters run the newest base stack; existing ones keep theirs.
            let stack_version = paddock_domain::stack::latest_version();
            spec.fill_stack_defaults(stack_version);
            rules::validate_cluster(&spec, &pools, stack_version)?;
            let mut classes = Vec::with_capacity(pools.len());
            for (i, pool) in pools.iter().enumerate() {
                classes.push(class_of(&mut tx, &format!("node_pools[{i}].machine_class"), &pool.machine_class).await?);
            }
            // The system pool's rules after every value passed (docs/api.md).
            rules::check_system_pool(spec.kind, &pools)?;
            check_account_groups(&mut tx, tenant_id, &spec, None).await?;

            let id = ClusterId::new();
            audit.target(id.uuid(), Some(tenant_id));
            store::insert(&mut tx, tenant_id, id, &spec, stack_version).await?;
            for (pool, (class, _)) in pools.iter().zip(&classes) {
                node_pool::insert(&mut tx, tenant_id, id, NodePoolId::new(), *class, pool).await?;
            }
            if pools.iter().any(|p| p.autoscaling.is_some()) {
                paddock_store::autoscale::arm(&mut tx, tenant_id, id, std::time::Duration::ZERO).await?;
            }
            let message = format!("cluster {} was requested", spec.name);
            cluster_event::insert(&mut tx, tenant_id, id, "Normal", "ClusterCreated", &message).await?;
            let change = Accepted { kind: "cluster_create", generation: 1, supersedes: &[], reconcile: true };
            cluster_changed(tx, tenant_id, id, change, json!({ "name": spec.name, "kind": spec.kind.as_str() })).await
        })
        .await
    }

    /// Lists a tenant's clusters.
    pub async fn cluster_list(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        page: PageRequest,
    ) -> Result<Listed<ClusterWithPools>> {
        ctx.actor.authorize_tenant(Permission::ClusterRead, tenant_id, "tenant")?;
        self.require_tenant(tenant_id).await?;
        let mut conn = self.store.conn().await?;
        let clusters = store::list(&mut conn, tenant_id, page.after, page.limit).await?;
        let ids: Vec<uuid::Uuid> = clusters.iter().map(|c| c.id.uuid()).collect();
        let mut pools = node_pool::of_clusters(&mut conn, tenant_id, &ids).await?;
        let next_cursor = page.next_cursor(&clusters, |c| c.id.uuid());
        let items = clusters
            .into_iter()
            .map(|cluster| {
                let (own, rest): (Vec<NodePool>, Vec<NodePool>) =
                    pools.drain(..).partition(|p| p.cluster_id == cluster.id);
                pools = rest;
                ClusterWithPools { cluster, pools: own }
            })
            .collect();
        Ok(Listed { items, next_cursor })
    }

    /// Reads a cluster.
    pub async fn cluster_get(&self, ctx: &Ctx, tenant_id: TenantId, id: ClusterId) -> Result<ClusterWithPools> {
        ctx.actor.authorize_tenant(Permission::ClusterRead, tenant_id, "cluster")?;
        // One transaction: the cluster and its pools as of one moment, one commit.
        let mut tx = self.store.begin().await?;
        let found = cluster_with_pools(&mut tx, tenant_id, id).await?;
        crate::commit(tx).await?;
        Ok(found)
    }

    /// Applies a merge patch to a cluster (Kubernetes version, Slurm settings).
    pub async fn cluster_update(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        id: ClusterId,
        body: &Body,
        if_match: &IfMatch,
    ) -> Result<ClusterChange> {
        self.audited(ctx, "cluster.update", "cluster", async |audit| {
            audit.target(id.uuid(), Some(tenant_id));
            let (mut tx, _) = self.begin_tenant_write(ctx, tenant_id, "cluster").await?;
            let current = cluster_for_change(&mut tx, tenant_id, id).await?;
            if_match.check(current.generation)?;
            let patch = body.value()?;
            let mut spec_patch = patch.clone();
            let stack_version = patched_stack_version(&mut spec_patch, &current.stack_version)?;
            let mut spec: ClusterSpec = body.apply_patch(&current.spec, &spec_patch, &["name", "kind", "isolation"])?;
            spec.fill_stack_defaults(&stack_version);
            let pools: Vec<NodePoolSpec> = node_pool::of_cluster(&mut tx, tenant_id, id)
                .await?
                .into_iter()
                .filter(|p| !p.deleting)
                .map(|p| p.spec)
                .collect();
            rules::validate_cluster(&spec, &pools, &stack_version)?;
            check_account_groups(&mut tx, tenant_id, &spec, Some(&current.spec)).await?;
            if rules::version_key(&spec.kubernetes_version) < rules::version_key(&current.spec.kubernetes_version) {
                return Err(Error::invalid("kubernetes_version", "a cluster's Kubernetes version can only go up"));
            }
            let changed = spec != current.spec || stack_version != current.stack_version;
            if changed {
                store::update_spec(&mut tx, tenant_id, id, &spec, &stack_version).await?;
                let message = if stack_version == current.stack_version {
                    "the cluster's spec changed".to_owned()
                } else {
                    format!("the cluster's base stack moves from {} to {stack_version}", current.stack_version)
                };
                cluster_event::insert(&mut tx, tenant_id, id, "Normal", "ClusterUpdated", &message).await?;
            }
            let change = Accepted {
                kind: "cluster_update",
                generation: current.generation + i64::from(changed),
                supersedes: &["cluster_create"],
                // Also when nothing changed: the operation ends when a run finds the cluster
                // ready at its generation, and only a run can tell.
                reconcile: true,
            };
            cluster_changed(tx, tenant_id, id, change, json!({ "patch": patch, "changed": changed })).await
        })
        .await
    }

    /// Deletes a cluster: Slurm goes, every machine goes back through cleaning, then the control
    /// plane and the namespace go; the cluster answers 404 once all of that is confirmed.
    pub async fn cluster_delete(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        id: ClusterId,
        if_match: &IfMatch,
    ) -> Result<ClusterChange> {
        self.audited(ctx, "cluster.delete", "cluster", async |audit| {
            audit.target(id.uuid(), Some(tenant_id));
            let (mut tx, _) = self.begin_tenant_write(ctx, tenant_id, "cluster").await?;
            let current = cluster_for_change(&mut tx, tenant_id, id).await?;
            if_match.check(current.generation)?;
            store::request_deletion(&mut tx, tenant_id, id).await?;
            let message = "the cluster is being deleted";
            cluster_event::insert(&mut tx, tenant_id, id, "Normal", "DeletionRequested", message).await?;
            let change = Accepted {
                kind: "cluster_delete",
                generation: current.generation + 1,
                supersedes: &["cluster_create", "cluster_update"],
                reconcile: true,
            };
            cluster_changed(tx, tenant_id, id, change, json!({ "name": current.spec.name })).await
        })
        .await
    }

    /// A cluster's events, oldest first.
    pub async fn cluster_events(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        id: ClusterId,
        page: PageRequest,
    ) -> Result<Listed<ClusterEventView>> {
        ctx.actor.authorize_tenant(Permission::ClusterRead, tenant_id, "cluster")?;
        let mut conn = self.store.conn().await?;
        store::get(&mut conn, tenant_id, id).await?.ok_or(CLUSTER_NOT_FOUND)?;
        let items = cluster_event::list(&mut conn, tenant_id, id, page.after, page.limit).await?;
        let next_cursor = page.next_cursor(&items, |e| e.id);
        Ok(Listed { items, next_cursor })
    }

    /// Adds a node pool to a cluster.
    pub async fn node_pool_create(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        cluster_id: ClusterId,
        body: &Body,
    ) -> Result<NodePoolChange> {
        self.audited(ctx, "node_pool.create", "node_pool", async |audit| {
            audit.target_tenant(tenant_id);
            let (mut tx, tenant) = self.begin_tenant_write(ctx, tenant_id, "cluster").await?;
            let cluster = cluster_for_change(&mut tx, tenant_id, cluster_id).await?;
            let spec = NodePoolSpec::from(body.decode::<NodePoolCreate>()?);
            // 409s before 422s (docs/api.md): quotas and the fleet first, an unknown class
            // adding no GPUs; then the values.
            let known = known_class(&mut tx, &spec.machine_class).await?;
            let mut demand = store::demand(&mut tx, tenant_id, None).await?;
            demand.nodes += u64::from(spec.quota_count());
            demand.gpus += u64::from(spec.quota_count()) * u64::from(known.map_or(0, |(_, gpus)| gpus));
            rules::check_quotas(&tenant.spec.quotas, demand)?;
            if let Some((class, _)) = known {
                let others = node_pool::class_count(&mut tx, tenant_id, cluster_id, class, None).await?;
                check_fleet(&mut tx, ctx, class, others + u64::from(spec.count)).await?;
            }
            rules::validate_pool(&spec)?;
            rules::check_autoscalable(cluster.spec.kind, spec.autoscaling.is_some(), "autoscaling")?;
            let (class, _) = class_of(&mut tx, "machine_class", &spec.machine_class).await?;
            if spec.role == NodePoolRole::System {
                // A slurm cluster has its system pool from its creation on, until it is deleted.
                return Err(match cluster.spec.kind {
                    ClusterKind::Kubernetes | ClusterKind::Ray => rules::system_pool_unsupported("role"),
                    ClusterKind::Slurm => rules::system_pool_duplicate("role"),
                });
            }
            let id = NodePoolId::new();
            audit.target(id.uuid(), Some(tenant_id));
            node_pool::insert(&mut tx, tenant_id, cluster_id, id, class, &spec).await?;
            store::touch(&mut tx, tenant_id, cluster_id).await?;
            if spec.autoscaling.is_some() {
                paddock_store::autoscale::arm(&mut tx, tenant_id, cluster_id, std::time::Duration::ZERO).await?;
            }
            let message =
                format!("node pool {} of {} {} machines was added", spec.name, spec.count, spec.machine_class);
            cluster_event::insert(&mut tx, tenant_id, cluster_id, "Normal", "NodePoolCreated", &message).await?;
            let change = Accepted { kind: "node_pool_create", generation: 1, supersedes: &[], reconcile: true };
            let details = json!({ "cluster_id": cluster_id, "name": spec.name, "count": spec.count });
            pool_changed(tx, (tenant_id, cluster_id, id), change, details).await
        })
        .await
    }

    /// Lists a cluster's node pools.
    pub async fn node_pool_list(&self, ctx: &Ctx, tenant_id: TenantId, cluster_id: ClusterId) -> Result<Vec<NodePool>> {
        ctx.actor.authorize_tenant(Permission::ClusterRead, tenant_id, "cluster")?;
        let mut conn = self.store.conn().await?;
        store::get(&mut conn, tenant_id, cluster_id).await?.ok_or(CLUSTER_NOT_FOUND)?;
        Ok(node_pool::of_cluster(&mut conn, tenant_id, cluster_id).await?)
    }

    /// Reads a node pool.
    pub async fn node_pool_get(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        cluster_id: ClusterId,
        id: NodePoolId,
    ) -> Result<NodePool> {
        ctx.actor.authorize_tenant(Permission::ClusterRead, tenant_id, "node pool")?;
        let mut conn = self.store.conn().await?;
        node_pool::get(&mut conn, tenant_id, cluster_id, id).await?.ok_or(POOL_NOT_FOUND)
    }

    /// Scales a pool or changes its labels and taints (JSON merge patch).
    pub async fn node_pool_update(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        cluster_id: ClusterId,
        id: NodePoolId,
        body: &Body,
        if_match: &IfMatch,
    ) -> Result<NodePoolChange> {
        self.audited(ctx, "node_pool.update", "node_pool", async |audit| {
            audit.target(id.uuid(), Some(tenant_id));
            let (mut tx, tenant) = self.begin_tenant_write(ctx, tenant_id, "node pool").await?;
            let cluster = cluster_for_change(&mut tx, tenant_id, cluster_id).await?;
            let current = pool_for_change(&mut tx, tenant_id, cluster_id, id).await?;
            if_match.check(current.generation)?;
            let patch = body.value()?;
            let patched: NodePoolSpec = body.apply_patch(&current.spec, &patch, &["name", "machine_class", "role"])?;
            let (spec, desired) = autoscale::patched(&current, patched, &patch)?;
            let mut demand = store::demand(&mut tx, tenant_id, Some(id)).await?;
            demand.nodes += u64::from(spec.quota_count());
            demand.gpus += u64::from(spec.quota_count()) * u64::from(current.gpu_count);
            // Shrinking is always allowed, even over a quota lowered in the meantime.
            if spec.quota_count() > current.spec.quota_count() {
                rules::check_quotas(&tenant.spec.quotas, demand)?;
            }
            if spec.floor_count() > current.spec.floor_count() {
                let class = current.machine_class_id;
                let others = node_pool::class_count(&mut tx, tenant_id, cluster_id, class, Some(id)).await?;
                check_fleet(&mut tx, ctx, class, others + u64::from(spec.floor_count())).await?;
            }
            // The values after the 409s (docs/api.md).
            rules::validate_pool(&spec)?;
            check_system_pool_kept(&cluster, &current, Some(spec.count))?;
            if current.spec.role == NodePoolRole::System && spec.autoscaling.is_some() {
                return Err(rules::system_pool_autoscaled("autoscaling"));
            }
            rules::check_autoscalable(cluster.spec.kind, spec.autoscaling.is_some(), "autoscaling")?;
            let changed = spec != current.spec;
            if changed {
                node_pool::update_spec(&mut tx, tenant_id, id, &spec, desired).await?;
                store::touch(&mut tx, tenant_id, cluster_id).await?;
            }
            autoscale::changed(&mut tx, &current, &spec, desired).await?;
            if spec.count != current.spec.count && spec.autoscaling.is_none() {
                let message = format!("node pool {} scaled from {} to {}", spec.name, current.spec.count, spec.count);
                cluster_event::insert(&mut tx, tenant_id, cluster_id, "Normal", "NodePoolScaled", &message).await?;
            }
            let change = Accepted {
                kind: "node_pool_update",
                generation: current.generation + i64::from(changed),
                supersedes: &["node_pool_create", autoscale::NODE_POOL_SCALE],
                // Also when nothing changed, as for a cluster's patch: a run ends the operation.
                reconcile: true,
            };
            pool_changed(
                tx,
                (tenant_id, cluster_id, id),
                change,
                json!({ "cluster_id": cluster_id, "patch": patch, "changed": changed }),
            )
            .await
        })
        .await
    }

    /// Deletes a pool: its machines are released (Slurm nodes drained first) and cleaned.
    pub async fn node_pool_delete(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        cluster_id: ClusterId,
        id: NodePoolId,
        if_match: &IfMatch,
    ) -> Result<NodePoolChange> {
        self.audited(ctx, "node_pool.delete", "node_pool", async |audit| {
            audit.target(id.uuid(), Some(tenant_id));
            let (mut tx, _) = self.begin_tenant_write(ctx, tenant_id, "node pool").await?;
            let cluster = cluster_for_change(&mut tx, tenant_id, cluster_id).await?;
            let current = pool_for_change(&mut tx, tenant_id, cluster_id, id).await?;
            if_match.check(current.generation)?;
            check_system_pool_kept(&cluster, &current, None)?;
            node_pool::request_deletion(&mut tx, tenant_id, id).await?;
            store::touch(&mut tx, tenant_id, cluster_id).await?;
            let message = format!("node pool {} is being deleted", current.spec.name);
            cluster_event::insert(&mut tx, tenant_id, cluster_id, "Normal", "NodePoolDeletionRequested", &message)
                .await?;
            let change = Accepted {
                kind: "node_pool_delete",
                generation: current.generation + 1,
                supersedes: &["node_pool_create", "node_pool_update", autoscale::NODE_POOL_SCALE],
                reconcile: true,
            };
            pool_changed(
                tx,
                (tenant_id, cluster_id, id),
                change,
                json!({ "cluster_id": cluster_id, "name": current.spec.name }),
            )
            .await
        })
        .await
    }

    /// The machines a pool holds: id, name, class, state, node name; never BMC details.
    pub async fn node_pool_machines(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        cluster_id: ClusterId,
        id: NodePoolId,
        page: PageRequest,
    ) -> Result<Listed<PoolMachineView>> {
        ctx.actor.authorize_tenant(Permission::ClusterRead, tenant_id, "node pool")?;
        let mut conn = self.store.conn().await?;
        node_pool::get(&mut conn, tenant_id, cluster_id, id).await?.ok_or(POOL_NOT_FOUND)?;
        let of = MachinesOf { pool: Some(id), machine: None };
        let items = node_pool::machines(&mut conn, tenant_id, cluster_id, of, page.after, page.limit).await?;
        let next_cursor = page.next_cursor(&items, |m| m.id.uuid());
        Ok(Listed { items, next_cursor })
    }

    /// The machines a cluster holds, every pool's, as [`Self::node_pool_machines`] shows them.
    pub async fn cluster_machines(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        cluster_id: ClusterId,
        page: PageRequest,
    ) -> Result<Listed<PoolMachineView>> {
        ctx.actor.authorize_tenant(Permission::ClusterRead, tenant_id, "cluster")?;
        let mut conn = self.store.conn().await?;
        store::get(&mut conn, tenant_id, cluster_id).await?.ok_or(CLUSTER_NOT_FOUND)?;
        let of = MachinesOf::default();
        let items = node_pool::machines(&mut conn, tenant_id, cluster_id, of, page.after, page.limit).await?;
        let next_cursor = page.next_cursor(&items, |m| m.id.uuid());
        Ok(Listed { items, next_cursor })
    }

    /// One machine the cluster holds; 404 for any other (another cluster's, another tenant's, one
    /// the cluster has released).
    pub async fn cluster_machine(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        cluster_id: ClusterId,
        id: MachineId,
    ) -> Result<PoolMachineView> {
        ctx.actor.authorize_tenant(Permission::ClusterRead, tenant_id, "machine")?;
        let mut conn = self.store.conn().await?;
        let of = MachinesOf { pool: None, machine: Some(id) };
        let found = node_pool::machines(&mut conn, tenant_id, cluster_id, of, None, 1).await?;
        found.into_iter().next().ok_or(Error::NotFound { kind: "machine" })
    }
}

/// A ray cluster's head pool keeps a machine for the head pod: 422 `ray_head_pool_empty` when a
/// patch would scale it to 0 (`Some(0)`), `ray_head_pool_undeletable` when it would be deleted
/// (`None`).
fn check_ray_head_kept(cluster: &Cluster, pool: &NodePool, count: Option<u32>) -> Result<()> {
    let head = cluster.spec.ray.as_ref().map(|r| r.head.node_pool.as_str());
    if cluster.spec.kind != ClusterKind::Ray || head != Some(pool.spec.name.as_str()) {
        return Ok(());
    }
    match count {
        Some(0) => Err(Error::rule(
            "ray_head_pool_empty",
            "count",
            "this pool carries the Ray head pod (ray.head.node_pool): it keeps at least one machine",
        )),
        Some(_) => Ok(()),
        None => Err(Error::rule(
            "ray_head_pool_undeletable",
            "node_pool",
            "this pool carries the Ray head pod (ray.head.node_pool): it goes only with its cluster",
        )),
    }
}

/// A slurm cluster's system pool keeps its machines while the cluster lives (slurmctld's state,
/// the accounting database and their volumes are on them): 422 `system_pool_shrink` when a patch
/// would lower its count (`Some`), `system_pool_undeletable` when it would be deleted (`None`).
/// Every machine of it goes back only with the cluster.
fn check_system_pool_kept(cluster: &Cluster, pool: &NodePool, count: Option<u32>) -> Result<()> {
    check_ray_head_kept(cluster, pool, count)?;
    if cluster.spec.kind != ClusterKind::Slurm || pool.spec.role != NodePoolRole::System {
        return Ok(());
    }
    match count {
        Some(count) if count >= pool.spec.count => Ok(()),
        Some(_) => Err(Error::rule(
            "system_pool_shrink",
            "count",
            format!(
                "the system pool carries Slurm's controller state and accounting database: it is never scaled \
                 down, its {} machines go back only when the cluster is deleted",
                pool.spec.count
            ),
        )),
        None => Err(Error::rule(
            "system_pool_undeletable",
            "node_pool",
            "the system pool carries Slurm's controller state and accounting database: it goes only with its cluster",
        )),
    }
}

/// Takes `stack_version` out of a cluster merge patch (it is no part of the spec) and returns the
/// cluster's base stack after the patch: a stack this binary carries, never an older one.
fn patched_stack_version(patch: &mut serde_json::Value, current: &str) -> Result<String> {
    let Some(value) = patch.as_object_mut().and_then(|p| p.remove("stack_version")) else {
        return Ok(current.to_owned());
    };
    let Some(version) = value.as_str() else {
        return Err(Error::invalid(
            "stack_version",
            "must be a base stack version such as 2026.12.0; it cannot be removed",
        ));
    };
    if let Err(e) = paddock_domain::stack::definition(version) {
        return Err(Error::invalid("stack_version", e.to_string()));
    }
    // Stack versions order as Kubernetes versions do, part by part (2026.9.0 < 2026.12.0).
    if rules::version_key(version) < rules::version_key(current) {
        return Err(Error::invalid(
            "stack_version",
            format!("a cluster's base stack can only go up (it runs {current})"),
        ));
    }
    Ok(version.to_owned())
}

/// 409 `insufficient_capacity` when a cluster would ask for more machines of a class than the
/// fleet holds: such a request could never be met and would only hold up the class's line. The
/// message keeps the fleet's size to the provider (docs/architecture.md, cluster reconciler step 3).
/// `slurm.accounts` against the tenant's people: each entry once (422 `slurm_account_duplicate`),
/// and each group one of the tenant's (422 `slurm_account_group_unknown`, naming it; a group of
/// another tenant is as unknown as a missing one). A group `before` mapped already is not looked
/// up again: one the identity provider has deleted since maps no one, and a PATCH of something
/// else still passes.
async fn check_account_groups(
    conn: &mut Conn,
    tenant: TenantId,
    spec: &ClusterSpec,
    before: Option<&ClusterSpec>,
) -> Result<()> {
    let Some(slurm) = &spec.slurm else { return Ok(()) };
    rules::check_accounts_unique(Some(slurm))?;
    let mapped = |g: &str| {
        before
            .and_then(|b| b.slurm.as_ref())
            .is_some_and(|s| s.accounts.iter().any(|a| a.group.to_lowercase() == g.to_lowercase()))
    };
    let asked: Vec<String> = slurm.accounts.iter().map(|a| a.group.clone()).filter(|g| !mapped(g)).collect();
    if asked.is_empty() {
        return Ok(());
    }
    let known = paddock_store::identity::mapped_groups(conn, tenant, &asked).await?;
    let known = |g: &str| known.iter().any(|k| k.display_name.to_lowercase() == g.to_lowercase());
    match slurm.accounts.iter().enumerate().find(|(_, a)| !mapped(&a.group) && !known(&a.group)) {
        Some((i, a)) => Err(rules::slurm_account_group_unknown(i, &a.group)),
        None => Ok(()),
    }
}

async fn check_fleet(conn: &mut Conn, ctx: &Ctx, class: MachineClassId, wanted: u64) -> Result<()> {
    let fleet = machine_class::fleet_size(conn, class).await?;
    if wanted <= fleet {
        return Ok(());
    }
    // A tenant never learns the fleet's size or what is free (docs/api.md); the provider,
    // who owns the fleet, is told which bound it hit and by how much.
    let message = if ctx.actor.home_tenant().is_some() {
        "the provider's fleet cannot hold this many machines of the class; ask for fewer".to_owned()
    } else {
        let (name, available) = machine_class::available_of(conn, class).await?;
        format!(
            "the fleet holds {fleet} machines of class {name} (not retired, {available} of them available now); \
             this tenant would want {wanted} of them"
        )
    };
    Err(Error::conflict("insufficient_capacity", message))
}

/// A machine class by name: its id and GPUs per machine, `None` if missing (its 422 comes later,
/// from [`class_of`], after the 409s).
async fn known_class(conn: &mut Conn, name: &str) -> Result<Option<(MachineClassId, u32)>> {
    Ok(machine_class::get_by_name(conn, name).await?.map(|class| (class.id, class.spec.gpu_count)))
}

/// A machine class by name for a pool: its id and GPUs per machine; 422 naming `field` if missing.
async fn class_of(conn: &mut Conn, field: &str, name: &str) -> Result<(paddock_types::MachineClassId, u32)> {
    let Some(class) = machine_class::get_by_name(conn, name).await? else {
        return Err(crate::machine_class::unknown(conn, field, name).await?);
    };
    Ok((class.id, class.spec.gpu_count))
}

async fn cluster_with_pools(conn: &mut Conn, tenant: TenantId, id: ClusterId) -> Result<ClusterWithPools> {
    let cluster = store::get(conn, tenant, id).await?.ok_or(CLUSTER_NOT_FOUND)?;
    let pools = node_pool::of_cluster(conn, tenant, id).await?;
    Ok(ClusterWithPools { cluster, pools })
}

/// Locks a cluster for a change; one being deleted takes no more changes.
pub(crate) async fn cluster_for_change(conn: &mut Conn, tenant: TenantId, id: ClusterId) -> Result<Cluster> {
    let cluster = store::get_for_update(conn, tenant, id).await?.ok_or(CLUSTER_NOT_FOUND)?;
    if cluster.deleting {
        return Err(Error::conflict("cluster_deleting", "the cluster is being deleted"));
    }
    Ok(cluster)
}

/// Locks a pool for a change; one being deleted takes no more changes.
async fn pool_for_change(conn: &mut Conn, tenant: TenantId, cluster: ClusterId, id: NodePoolId) -> Result<NodePool> {
    let pool = node_pool::get_for_update(conn, tenant, cluster, id).await?.ok_or(POOL_NOT_FOUND)?;
    if pool.deleting {
        return Err(Error::conflict("node_pool_deleting", "the node pool is being deleted"));
    }
    Ok(pool)
}

/// Ends an accepted cluster change (202): its operation and reconcile job ([`accept`]), and the
/// cluster as it is now.
async fn cluster_changed(
    mut tx: Tx,
    tenant: TenantId,
    id: ClusterId,
    change: Accepted<'_>,
    details: serde_json::Value,
) -> Result<Done<ClusterChange>> {
    let operation = accept(&mut tx, Target::Cluster { tenant, cluster: id, pool: None }, change).await?;
    let cluster = cluster_with_pools(&mut tx, tenant, id).await?;
    Ok(Done::Commit { tx, value: ClusterChange { cluster, operation }, details })
}

/// Ends an accepted node pool change (202): its operation and the cluster's reconcile job
/// ([`accept`]), and the pool as it is now.
async fn pool_changed(
    mut tx: Tx,
    (tenant, cluster, id): (TenantId, ClusterId, NodePoolId),
    change: Accepted<'_>,
    details: serde_json::Value,
) -> Result<Done<NodePoolChange>> {
    let operation = accept(&mut tx, Target::Cluster { tenant, cluster, pool: Some(id) }, change).await?;
    let pool = node_pool::get(&mut tx, tenant, cluster, id).await?.ok_or(POOL_NOT_FOUND)?;
    Ok(Done::Commit { tx, value: NodePoolChange { pool, operation }, details })
}
