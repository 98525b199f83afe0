//! Remediations through the API: a tenant asks to replace a machine its cluster holds (the same
//! remediation a `failed` health report starts, with source `tenant`); the tenant lists its
//! cluster's remediations, the provider every one.

use paddock_domain::cursor::PageRequest;
use paddock_domain::job_kind::MACHINE_POWER_CYCLE;
use paddock_domain::validate::Checks;
use paddock_domain::{Error, Permission, Result};
use paddock_store::node_pool::{self, MachinesOf};
use paddock_store::operation::{self as operations, NewOperation, PlanContext};
use paddock_store::remediation::{self as store, Start, Started};
use paddock_types::machine::MachineState;
use paddock_types::operation::OperationView;
use paddock_types::remediation::{RemediationAccepted, RemediationSource, RemediationView, ReplaceRequest};
use paddock_types::{ClusterId, MachineId, TenantId};
use serde_json::json;

use crate::cluster::cluster_for_change;
use crate::{Body, Ctx, Done, Listed, Services};

/// The kind of a `replace`'s operation.
pub const MACHINE_REPLACE: &str = "machine_replace";

impl Services {
    /// Starts the replacement of a machine the tenant's cluster holds (202): 404 for a machine it
    /// does not hold, 409 `remediation_open` while one is under way, 409 `machine_leaving` for
    /// one already on its way out of the cluster.
    pub async fn cluster_machine_replace(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        cluster_id: ClusterId,
        id: MachineId,
        body: &Body,
    ) -> Result<RemediationAccepted> {
        self.audited(ctx, "machine.replace", "machine", async |audit| {
            audit.target(id.uuid(), Some(tenant_id));
            let (mut tx, _) = self.begin_tenant_write(ctx, tenant_id, "cluster").await?;
            cluster_for_change(&mut tx, tenant_id, cluster_id).await?;
            let of = MachinesOf { pool: None, machine: Some(id) };
            let held = node_pool::machines(&mut tx, tenant_id, cluster_id, of, None, 1).await?;
            if held.is_empty() {
                return Err(Error::NotFound { kind: "machine" });
            }
            let request: ReplaceRequest = body.decode()?;
            let reason = request.reason.trim();
            let mut c = Checks::new();
            c.text("reason", reason, 1000);
            c.finish()?;
            let actor = ctx.actor.subject.as_str();
            let start = Start { machine: id, reason, source: RemediationSource::Tenant, report_id: None, actor };
            let remediation = match store::start(&mut tx, &self.ledger_key, &start).await? {
                Started::New(remediation) => remediation,
                Started::AlreadyOpen => {
                    return Err(Error::conflict("remediation_open", "the machine is already being replaced"))
                }
                Started::NotApplicable => {
                    return Err(Error::conflict("machine_leaving", "the machine is already leaving the cluster"))
                }
            };
            let new = NewOperation {
                kind: MACHINE_REPLACE,
                target_type: "remediation",
                target_id: remediation.id,
                tenant_id: Some(tenant_id),
                target_generation: 0,
                supersedes: &[],
                context: PlanContext::default(),
            };
            let operation = operations::insert(&mut tx, &new).await?;
            let details = json!({ "reason": reason, "remediation_id": remediation.id, "cluster_id": cluster_id });
            Ok(Done::Commit { tx, value: RemediationAccepted { remediation, operation }, details })
        })
        .await
    }

    /// Power-cycles an `active` machine the tenant's cluster holds (202): the worker powers it
    /// off and on again through its BMC; the machine stays the tenant's. 404 for a machine the
    /// cluster does not hold, 409 `machine_not_active` for one that is not serving.
    pub async fn cluster_machine_power_cycle(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        cluster_id: ClusterId,
        id: MachineId,
    ) -> Result<OperationView> {
        self.audited(ctx, "machine.power_cycle", "machine", async |audit| {
            audit.target(id.uuid(), Some(tenant_id));
            let (mut tx, _) = self.begin_tenant_write(ctx, tenant_id, "cluster").await?;
            cluster_for_change(&mut tx, tenant_id, cluster_id).await?;
            let (allocation, state) = store::tenancy_of(&mut tx, tenant_id, cluster_id, id)
                .await?
                .ok_or(Error::NotFound { kind: "machine" })?;
            if state != MachineState::Active.as_str() {
                return Err(Error::conflict(
                    "machine_not_active",
                    format!("a machine in state {state} is not serving; only an active machine is power-cycled"),
                ));
            }
            let new = NewOperation {
                kind: MACHINE_POWER_CYCLE,
                target_type: "machine",
                target_id: id.uuid(),
                tenant_id: Some(tenant_id),
                target_generation: 0,
                supersedes: &[],
                context: PlanContext::default(),
            };
            let operation = operations::insert(&mut tx, &new).await?;
            store::enqueue_power_cycle(&mut tx, id, allocation, tenant_id, operation.id).await?;
            let details = json!({ "cluster_id": cluster_id, "operation_id": operation.id });
            Ok(Done::Commit { tx, value: operation, details })
        })
        .await
    }

    /// The remediations of a tenant's cluster, newest first.
    pub async fn cluster_remediations(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        cluster_id: ClusterId,
        page: PageRequest,
    ) -> Result<Listed<RemediationView>> {
        ctx.actor.authorize_tenant(Permission::ClusterRead, tenant_id, "cluster")?;
        let mut conn = self.store.conn().await?;
        paddock_store::cluster::get(&mut conn, tenant_id, cluster_id)
            .await?
            .ok_or(Error::NotFound { kind: "cluster" })?;
        let items = store::of_cluster(&mut conn, tenant_id, cluster_id, page.after, page.limit).await?;
        let next_cursor = page.next_cursor(&items, |r| r.id);
        Ok(Listed { items, next_cursor })
    }

    /// Every remediation, newest first (provider roles).
    pub async fn remediations(&self, ctx: &Ctx, page: PageRequest) -> Result<Listed<RemediationView>> {
        ctx.actor.authorize(Permission::MachineRead)?;
        let mut conn = self.store.conn().await?;
        let items = store::list(&mut conn, page.after, page.limit).await?;
        let next_cursor = page.next_cursor(&items, |r| r.id);
        Ok(Listed { items, next_cursor })
    }
}
