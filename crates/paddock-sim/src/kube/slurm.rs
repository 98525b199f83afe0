//! The simulated Slurm of a tenant cluster (the `slurm_*` columns of `paddock_sim.clusters`, and
//! a Slurm node on each simulated Node, drained or not and down or not:
//! `paddock_sim.nodes.slurm_drain_reason` and `slurm_down_reason`). No job runs and no slurmd pod
//! exists: a drain completes at once. Its accounting (users, accounts, QOS, associations) is one
//! document per cluster in `paddock_sim.slurmdb`.

use paddock_domain::driver::{
    BoxFuture, Demand, DemandPool, DriverError, Removal, SlurmDesired, SlurmDrain, SlurmDriver, SlurmNodeState,
    SlurmStatus, SlurmVersion, TenantAccess,
};

use paddock_domain::slurm_identity::{plan, Slurmdb};
use sqlx::Connection;

use super::{aged, micros, remove, sim_host_key, unavailable, SimKube};

/// The simulated Slurm runs the releases of the cluster's stack, as the real driver does.
fn supported_slurm(desired: &SlurmDesired) -> Result<(), DriverError> {
    let supported = paddock_domain::stack::slurm_versions(&desired.stack_version);
    if supported.contains(&desired.spec.version.as_str()) {
        return Ok(());
    }
    Err(DriverError::permanent(
        "slurm_version_unsupported",
        format!(
            "Slurm {} is not supported by the base stack {} (supported: {})",
            desired.spec.version,
            desired.stack_version,
            supported.join(", ")
        ),
    ))
}

impl SlurmDriver for SimKube {
    fn job_demand<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        _slurm: &'a SlurmVersion,
        pools: &'a [DemandPool],
    ) -> BoxFuture<'a, Result<Demand, DriverError>> {
        Box::pin(self.demand(tenant, pools))
    }

    fn ensure_slurm<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        desired: &'a SlurmDesired,
    ) -> BoxFuture<'a, Result<SlurmStatus, DriverError>> {
        Box::pin(async move {
            supported_slurm(desired)?;
            let mut conn = self.conn().await?;
            let row = self.tenant(&mut conn, tenant).await?;
            let id = tenant.cluster.cluster_id;
            let empty: Vec<&str> = desired
                .pools
                .iter()
                .filter(|p| p.count > 0 && p.node_names.is_empty())
                .map(|p| p.name.as_str())
                .collect();
            let pools = serde_json::Value::Array(
                desired
                    .pools
                    .iter()
                    .map(|p| {
                        // The system pool holds the control pods, the others a NodeSet each.
                        serde_json::json!({"name": p.name, "role": p.role, "count": p.count, "node_names": p.node_names})
                    })
                    .collect(),
            );
            let mut changed = Vec::new();
            let mut nodes_age = row.slurm_nodes_age;
            let held = row.slurm_applied
                && !row.slurm_deleting
                && row.slurm_pools.as_ref() == Some(&pools)
                && nodes_age.is_some() == empty.is_empty();
            if !held {
                // `slurm_nodes_at` is when every pool with a count first had a node; it is reset
                // when one loses its last node, so readiness waits for the NodeSets again.
                nodes_age = sqlx::query_scalar(
                    "update paddock_sim.clusters set slurm_applied_at = coalesce(slurm_applied_at, now()),
                            slurm_nodes_at = case when $2 then coalesce(slurm_nodes_at, now()) else null end,
                            slurm_deleting_at = null, slurm_pools = $3, updated_at = now()
                     where cluster_id = $1
                     returning (extract(epoch from now() - slurm_nodes_at) * 1000000)::int8",
                )
                .bind(id.uuid())
                .bind(empty.is_empty())
                .bind(&pools)
                .fetch_one(&mut *conn)
                .await
                .map_err(unavailable)?;
                changed.push(format!("Slurm of cluster {id}"));
            }
            let (ready, reason) = if !empty.is_empty() {
                (false, format!("node pools without nodes: {}", empty.join(", ")))
            } else if aged(nodes_age, self.inner.config.slurm_latency) {
                (true, String::new())
            } else {
                (false, "the simulated Slurm workloads are starting".to_owned())
            };
            Ok(SlurmStatus {
                ready,
                reason,
                rest_api: Some(format!("http://slurmrestd.{}.paddock.invalid:6820", id.uuid().simple())),
                login_ssh: Some(format!("login.{}.paddock.invalid:22", id.uuid().simple())),
                login_ssh_host_keys: vec![sim_host_key(id)],
                changed,
                fault: None,
            })
        })
    }

    fn drain_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        _slurm: &'a SlurmVersion,
        node_name: &'a str,
    ) -> BoxFuture<'a, Result<SlurmDrain, DriverError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            self.tenant(&mut conn, tenant).await?;
            // paddock's reason, as the real driver writes it: unless the node drains for a reason
            // of paddock's already (a tenant's `paddock:hw:` report stays).
            sqlx::query(
                "update paddock_sim.nodes set slurm_drain_reason = $3 where cluster_id = $1 and node_name = $2 \
                   and (slurm_drain_reason is null or slurm_drain_reason not like 'paddock:%')",
            )
            .bind(tenant.cluster.cluster_id.uuid())
            .bind(node_name)
            .bind(paddock_domain::health::SLURM_RELEASE_REASON)
            .execute(&mut *conn)
            .await
            .map_err(unavailable)?;
            // The simulated Slurm runs no jobs and no slurmd pods: every node drains at once,
            // with nothing for a NodeSet to remove.
            Ok(SlurmDrain::Done)
        })
    }

    /// The simulated Slurm's nodes: one on each registered Node of the cluster, named as its
    /// Node, idle or down ([`crate::SimWorld::set_slurm_down`]), drained or not with the reason
    /// the knob ([`crate::SimWorld::set_slurm_drain`]) or paddock's own drain gave it.
    fn node_states<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        _slurm: &'a SlurmVersion,
    ) -> BoxFuture<'a, Result<Vec<SlurmNodeState>, DriverError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            self.tenant(&mut conn, tenant).await?;
            let rows: Vec<(String, Option<String>, Option<String>)> = sqlx::query_as(
                "select node_name, slurm_drain_reason, slurm_down_reason from paddock_sim.nodes \
                 where cluster_id = $1 and joined_at is not null order by node_name",
            )
            .bind(tenant.cluster.cluster_id.uuid())
            .fetch_all(&mut *conn)
            .await
            .map_err(unavailable)?;
            Ok(rows
                .into_iter()
                .map(|(node_name, drain, down)| {
                    let mut states = vec![if down.is_some() { "DOWN" } else { "IDLE" }.to_owned()];
                    if drain.is_some() {
                        states.push("DRAIN".into());
                    }
                    // Slurm keeps one reason: the drain's when there is one.
                    let reason = drain.or(down).unwrap_or_default();
                    SlurmNodeState { slurm_node: node_name.clone(), node_name, states, reason }
                })
                .collect())
        })
    }

    /// The simulated Slurm's accounting (`paddock_sim.slurmdb`): read under a row lock, brought
    /// to `desired` by the same plan the real driver follows, written back.
    fn sync_identity<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        _slurm: &'a SlurmVersion,
        desired: &'a Slurmdb,
    ) -> BoxFuture<'a, Result<Vec<String>, DriverError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            self.tenant(&mut conn, tenant).await?;
            let id = tenant.cluster.cluster_id;
            let mut tx = conn.begin().await.map_err(unavailable)?;
            let state: Option<serde_json::Value> =
                sqlx::query_scalar("select state from paddock_sim.slurmdb where cluster_id = $1 for update")
                    .bind(id.uuid())
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(unavailable)?;
            let mut db: Slurmdb = state.and_then(|s| serde_json::from_value(s).ok()).unwrap_or_default();
            let changes = plan(desired, &db);
            if changes.is_empty() {
                return Ok(Vec::new());
            }
            for change in &changes {
                db.apply(change);
            }
            sqlx::query(
                "insert into paddock_sim.slurmdb (cluster_id, state) values ($1, $2) \
                 on conflict (cluster_id) do update set state = excluded.state, updated_at = now()",
            )
            .bind(id.uuid())
            .bind(sqlx::types::Json(&db))
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?;
            tx.commit().await.map_err(unavailable)?;
            Ok(changes.iter().map(ToString::to_string).collect())
        })
    }

    fn remove_slurm<'a>(&'a self, tenant: &'a TenantAccess) -> BoxFuture<'a, Result<Removal, DriverError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            let id = tenant.cluster.cluster_id;
            let row = self.cluster(&mut conn, id).await?;
            if !row.control_plane_exists || row.control_plane_deleting {
                // No tenant cluster (or one being deleted), no Slurm in it: it goes with the
                // control plane, so a resumed deletion never waits on it.
                return Ok(Removal::Gone);
            }
            self.tenant(&mut conn, tenant).await?;
            remove(
                &mut conn,
                id,
                "slurm_applied_at",
                "slurm_deleting_at",
                "slurm_applied_at = null, slurm_nodes_at = null, slurm_pools = null",
                micros(self.inner.config.delete_latency),
            )
            .await
            .map_err(unavailable)
        })
    }
}
