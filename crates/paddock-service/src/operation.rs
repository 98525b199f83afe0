//! Operations, readable by providers (all) and by tenants (their own), and [`accept`]: how a
//! change the worker carries out (the 202 path) records its operation and its reconcile job.

use paddock_domain::cursor::PageRequest;
use paddock_domain::{Error, Permission, Result};
use paddock_store::operation::{self as store, NewOperation, PlanContext};
use paddock_store::{cluster, lifecycle, machine, Conn, Txn};
use paddock_types::cluster::ClusterKind;
use paddock_types::machine::MachineState;
use paddock_types::operation::OperationFilter;
use paddock_types::operation::OperationView;
use paddock_types::{ClusterId, MachineId, NodePoolId, OperationId, TenantId};

use crate::{Ctx, Listed, Services};

const NOT_FOUND: Error = Error::NotFound { kind: "operation" };

/// What an accepted change's operation follows.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    /// A machine (provider-owned): its own reconcile job reports to the operation.
    Machine(MachineId),
    /// A cluster, or one of its node pools: the cluster's reconcile job converges both, and the
    /// operation completes when the observed generation reaches its own (docs/api.md).
    Cluster { tenant: TenantId, cluster: ClusterId, pool: Option<NodePoolId> },
}

/// A change the worker carries out: the operation that follows it.
#[derive(Debug)]
pub(crate) struct Accepted<'a> {
    /// The operation's kind.
    pub kind: &'a str,
    /// The target's generation the operation completes at.
    pub generation: i64,
    /// Open operations of these kinds on the target are superseded.
    pub supersedes: &'a [&'a str],
    /// Whether the desired state changed, so the target's reconcile job must run.
    pub reconcile: bool,
}

/// Records an accepted change in the write's transaction: its operation (superseding open ones)
/// with its step plan for the target as the change found it, and, when the desired state
/// changed, the reconcile job that carries it out (merged with one already queued). The audit event is the envelope's ([`Services::audited`]).
pub(crate) async fn accept(conn: &mut Txn<'_>, target: Target, change: Accepted<'_>) -> Result<OperationView> {
    accepted(conn, target, change, None).await
}

/// [`accept`] for a change paddock makes on its own, with the `reason` people are shown.
pub(crate) async fn accept_explained(
    conn: &mut Txn<'_>,
    target: Target,
    change: Accepted<'_>,
    reason: &str,
) -> Result<OperationView> {
    accepted(conn, target, change, Some(reason)).await
}

async fn accepted(
    conn: &mut Txn<'_>,
    target: Target,
    change: Accepted<'_>,
    reason: Option<&str>,
) -> Result<OperationView> {
    let (target_type, target_id, tenant_id) = match target {
        Target::Machine(id) => ("machine", id.uuid(), None),
        Target::Cluster { tenant, cluster, pool: None } => ("cluster", cluster.uuid(), Some(tenant)),
        Target::Cluster { tenant, pool: Some(pool), .. } => ("node_pool", pool.uuid(), Some(tenant)),
    };
    let new = NewOperation {
        kind: change.kind,
        target_type,
        target_id,
        tenant_id,
        target_generation: change.generation,
        supersedes: change.supersedes,
        context: plan_context(conn, target).await?,
    };
    let operation = match reason {
        Some(reason) => store::insert_explained(conn, &new, reason).await?,
        None => store::insert(conn, &new).await?,
    };
    match target {
        _ if !change.reconcile => {}
        Target::Machine(id) => lifecycle::enqueue_machine(conn, id, Some(operation.id)).await?,
        Target::Cluster { tenant, cluster, .. } => lifecycle::enqueue_cluster(conn, tenant, cluster).await?,
    }
    Ok(operation)
}

/// What the operation's step plan depends on: a Slurm cluster has Slurm's steps; a machine that
/// holds a tenancy (or is leaving one) is released first.
async fn plan_context(conn: &mut Conn, target: Target) -> Result<PlanContext> {
    Ok(match target {
        Target::Machine(id) => {
            let state = machine::get(conn, id).await?.map(|m| m.state);
            let held = state.is_some_and(|s| {
                use MachineState as S;
                matches!(s, S::Allocated | S::Provisioning | S::Active | S::Releasing | S::ProvisionFailed)
            });
            let acceptance = paddock_store::machine_class::acceptance_of_machine(conn, id).await?.is_some();
            PlanContext { held, acceptance, ..PlanContext::default() }
        }
        Target::Cluster { tenant, cluster, .. } => {
            let kind = cluster::get(conn, tenant, cluster).await?.map(|c| c.spec.kind);
            PlanContext {
                slurm: kind == Some(ClusterKind::Slurm),
                ray: kind == Some(ClusterKind::Ray),
                ..PlanContext::default()
            }
        }
    })
}

impl Services {
    /// `GET /v1/operations`: every operation for providers; a tenant token sees its own.
    pub async fn operation_list(
        &self,
        ctx: &Ctx,
        filter: OperationFilter,
        page: PageRequest,
    ) -> Result<Listed<OperationView>> {
        let scope = ctx.actor.authorize(Permission::OperationRead)?;
        let filter = OperationFilter { tenant_id: scope.tenant().or(filter.tenant_id), ..filter };
        self.operation_page(&filter, page).await
    }

    /// `GET /v1/operations/{operation_id}`.
    pub async fn operation_get(&self, ctx: &Ctx, id: OperationId) -> Result<OperationView> {
        let scope = ctx.actor.authorize(Permission::OperationRead)?;
        let mut conn = self.store.conn().await?;
        store::get(&mut conn, scope.tenant(), id).await?.ok_or(NOT_FOUND)
    }

    /// `GET /v1/tenants/{tenant_id}/operations`.
    pub async fn tenant_operation_list(
        &self,
        ctx: &Ctx,
        tenant: TenantId,
        filter: OperationFilter,
        page: PageRequest,
    ) -> Result<Listed<OperationView>> {
        ctx.actor.authorize_tenant(Permission::OperationRead, tenant, "tenant")?;
        self.require_tenant(tenant).await?;
        self.operation_page(&OperationFilter { tenant_id: Some(tenant), ..filter }, page).await
    }

    /// `GET /v1/tenants/{tenant_id}/operations/{operation_id}`.
    pub async fn tenant_operation_get(&self, ctx: &Ctx, tenant: TenantId, id: OperationId) -> Result<OperationView> {
        ctx.actor.authorize_tenant(Permission::OperationRead, tenant, "tenant")?;
        let mut conn = self.store.conn().await?;
        store::get(&mut conn, Some(tenant), id).await?.ok_or(NOT_FOUND)
    }

    async fn operation_page(&self, filter: &OperationFilter, page: PageRequest) -> Result<Listed<OperationView>> {
        let mut conn = self.store.conn().await?;
        let items = store::list(&mut conn, filter, page.after, page.limit).await?;
        let next_cursor = page.next_cursor(&items, |o| o.id.uuid());
        Ok(Listed { items, next_cursor })
    }
}
