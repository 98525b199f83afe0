//! Machine health reports: an operator's (provider:admin, provider:operator) about any machine
//! that is not retired, read by the provider, and by the tenant whose cluster holds the machine
//! for the reports of its own tenancy.

use chrono::Utc;
use paddock_domain::cursor::PageRequest;
use paddock_domain::{validate, Error, Permission, Result};
use paddock_store::health::{self as store, NewReport};
use paddock_store::machine;
use paddock_store::node_pool::{self, MachinesOf};
use paddock_types::health::{HealthReportCreate, HealthReportView, HealthSource};
use paddock_types::machine::MachineState;
use paddock_types::{ClusterId, MachineId, TenantId};
use serde_json::json;

use crate::{Body, Ctx, Done, Listed, Services};

const NOT_FOUND: Error = Error::NotFound { kind: "machine" };

impl Services {
    /// Records an operator's health report on a machine (201); a retired machine takes none (409).
    pub async fn machine_health_report(&self, ctx: &Ctx, id: MachineId, body: &Body) -> Result<HealthReportView> {
        self.audited(ctx, "machine.health_report", "machine", async |audit| {
            audit.target(id.uuid(), None);
            ctx.actor.authorize(Permission::MachineWrite)?;
            let report: HealthReportCreate = body.decode()?;
            validate::health_report(&report, Utc::now())?;
            let mut tx = self.store.begin().await?;
            let current = machine::get(&mut tx, id).await?.ok_or(NOT_FOUND)?;
            if current.state == MachineState::Retired {
                return Err(Error::conflict("machine_retired", "the machine is retired"));
            }
            let new = NewReport {
                machine: id,
                status: report.status,
                checks: &report.checks,
                source: HealthSource::Operator,
                reporter: &ctx.actor.subject,
                observed_at: report.observed_at,
            };
            let recorded = store::insert(&mut tx, &self.ledger_key, &new).await?.ok_or(NOT_FOUND)?;
            let details = json!({ "report_id": recorded.id, "status": recorded.status.as_str() });
            Ok(Done::Commit { tx, value: recorded, details })
        })
        .await
    }

    /// A machine's health reports, newest first (provider roles).
    pub async fn machine_health_reports(
        &self,
        ctx: &Ctx,
        id: MachineId,
        page: PageRequest,
    ) -> Result<Listed<HealthReportView>> {
        ctx.actor.authorize(Permission::MachineRead)?;
        let mut conn = self.store.conn().await?;
        machine::get(&mut conn, id).await?.ok_or(NOT_FOUND)?;
        let items = store::of_machine(&mut conn, id, page.after, page.limit).await?;
        let next_cursor = page.next_cursor(&items, |r| r.id);
        Ok(Listed { items, next_cursor })
    }

    /// The health reports recorded while the tenant's cluster holds the machine, newest first;
    /// 404 for a machine the cluster does not hold.
    pub async fn cluster_machine_health_reports(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        cluster_id: ClusterId,
        id: MachineId,
        page: PageRequest,
    ) -> Result<Listed<HealthReportView>> {
        ctx.actor.authorize_tenant(Permission::ClusterRead, tenant_id, "machine")?;
        let mut conn = self.store.conn().await?;
        let items = store::of_tenancy(&mut conn, tenant_id, cluster_id, id, page.after, page.limit).await?;
        // The reports are read only for a machine the cluster holds: none found may be a machine
        // without reports (200) or one it does not hold (404), which only then costs a query.
        if items.is_empty() {
            let of = MachinesOf { pool: None, machine: Some(id) };
            node_pool::machines(&mut conn, tenant_id, cluster_id, of, None, 1).await?.first().ok_or(NOT_FOUND)?;
        }
        let next_cursor = page.next_cursor(&items, |r| r.id);
        Ok(Listed { items, next_cursor })
    }
}
