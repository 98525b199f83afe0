//! The simulated platform cluster, tenant control planes and tenant clusters
//! (`paddock_sim.clusters`, `paddock_sim.nodes`). Readiness is a matter of time since the first
//! call that created a thing; removal answers `Deleting` until `delete_latency` has passed since
//! the first removal call, then `Gone`.

use std::sync::Arc;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use paddock_domain::driver::{
    BoxFuture, ClusterRef, ControlPlaneBackend, ControlPlaneSpec, ControlPlaneStatus, Demand, DemandPool, Drain,
    DriverError, Isolation, JoinConfig, NodeRef, NodeStatus, PlatformDriver, PoolDemand, RayDesired, RayDriver,
    RayStatus, RegisteredNode, Removal, StackStatus, TenantAccess, TenantCredentials, TenantNodes, TenantStack,
    WideJob,
};
use paddock_domain::secret::SecretString;
use paddock_domain::ssh;
use paddock_types::cluster::SshHostKey;
use paddock_types::ClusterId;
use rand::Rng;
use sqlx::{PgConnection, Row};

use crate::{micros, ClusterFault, Inner, MachineFault, SimError, SimNode};

mod slurm;

/// The simulated cluster-side drivers; see [`crate::SimWorld::kube`].
#[derive(Clone)]
pub struct SimKube {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for SimKube {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimKube").finish_non_exhaustive()
    }
}

/// The namespace of a tenant cluster on the simulated platform (the real driver's scheme).
pub fn namespace_name(cluster: ClusterId) -> String {
    format!("pc-{}", cluster.uuid().simple())
}

/// The API server endpoint of a simulated tenant control plane.
pub fn endpoint(cluster: ClusterId) -> String {
    format!("sim-{}.paddock.invalid:6443", cluster.uuid())
}

/// The simulation's own database failed: worth another try.
fn unavailable(e: impl Into<SimError>) -> DriverError {
    let e = e.into();
    tracing::warn!(error = %e, "the simulated cluster drivers cannot reach their world");
    DriverError::transient("sim_world_unavailable", "the simulated world's database is unavailable")
}

type Conn = sqlx::pool::PoolConnection<sqlx::Postgres>;

/// What the world holds about one cluster, with the ages of its parts by the database's clock.
struct ClusterRow {
    namespace_exists: bool,
    namespace_deleting: bool,
    control_plane_exists: bool,
    control_plane_deleting: bool,
    kubernetes_version: Option<String>,
    /// Microseconds since the control plane, the stack and every pool's first node were there.
    control_plane_age: Option<i64>,
    stack_age: Option<i64>,
    slurm_nodes_age: Option<i64>,
    slurm_applied: bool,
    slurm_deleting: bool,
    slurm_pools: Option<serde_json::Value>,
    faults: Vec<String>,
}

impl ClusterRow {
    fn has(&self, fault: ClusterFault) -> bool {
        self.faults.iter().any(|f| f == fault.as_str())
    }
}

/// Whether a part that has been there `age` microseconds is ready after `latency`.
fn aged(age: Option<i64>, latency: std::time::Duration) -> bool {
    age.is_some_and(|age| age >= micros(latency))
}

/// Where a removal stands after this call, decided in one statement from the database's clock:
/// the first call stamps `deleting_at`; once `delete_latency` has passed the object is cleared
/// (`clear` is the `set` list that erases it) and the call answers `Gone`. Nothing there: `Gone`.
async fn remove(
    conn: &mut PgConnection,
    cluster: ClusterId,
    exists_col: &str,
    deleting_col: &str,
    clear: &str,
    latency_us: i64,
) -> Result<Removal, SimError> {
    // Stamp the start of the deletion once; a repeated call keeps the first stamp.
    sqlx::query(&format!(
        "update paddock_sim.clusters set {deleting_col} = coalesce({deleting_col}, now()), updated_at = now()
         where cluster_id = $1 and {exists_col} is not null"
    ))
    .bind(cluster.uuid())
    .execute(&mut *conn)
    .await?;
    let done = sqlx::query(&format!(
        "update paddock_sim.clusters set {clear}, {deleting_col} = null, updated_at = now()
         where cluster_id = $1 and {exists_col} is not null
           and {deleting_col} + $2 * interval '1 microsecond' <= now()"
    ))
    .bind(cluster.uuid())
    .bind(latency_us)
    .execute(&mut *conn)
    .await?;
    let left: Option<bool> =
        sqlx::query_scalar(&format!("select {exists_col} is not null from paddock_sim.clusters where cluster_id = $1"))
            .bind(cluster.uuid())
            .fetch_optional(&mut *conn)
            .await?;
    Ok(if done.rows_affected() > 0 || left != Some(true) { Removal::Gone } else { Removal::Deleting })
}

impl SimKube {
    async fn conn(&self) -> Result<Conn, DriverError> {
        self.inner.store.conn().await.map_err(unavailable)
    }

    /// The cluster's record, created empty on first contact: one read when it exists.
    async fn cluster(&self, conn: &mut PgConnection, cluster: ClusterId) -> Result<ClusterRow, DriverError> {
        const READ: &str = "select namespace_created_at is not null as ns, namespace_deleting_at is not null as ns_del,
                control_plane_created_at is not null as cp, control_plane_deleting_at is not null as cp_del,
                kubernetes_version,
                (extract(epoch from now() - control_plane_created_at) * 1000000)::int8 as cp_age,
                (extract(epoch from now() - stack_applied_at) * 1000000)::int8 as stack_age,
                (extract(epoch from now() - slurm_nodes_at) * 1000000)::int8 as nodes_age,
                slurm_applied_at is not null as slurm, slurm_deleting_at is not null as slurm_del, slurm_pools,
                faults
            from paddock_sim.clusters where cluster_id = $1";
        let mut row = sqlx::query(READ).bind(cluster.uuid()).fetch_optional(&mut *conn).await.map_err(unavailable)?;
        if row.is_none() {
            sqlx::query(
                "insert into paddock_sim.clusters (cluster_id) values ($1) on conflict (cluster_id) do nothing",
            )
            .bind(cluster.uuid())
            .execute(&mut *conn)
            .await
            .map_err(unavailable)?;
            row = Some(sqlx::query(READ).bind(cluster.uuid()).fetch_one(&mut *conn).await.map_err(unavailable)?);
        }
        let row = row.expect("read or created above");
        let get = |col: &str| row.try_get::<bool, _>(col).map_err(unavailable);
        let age = |col: &str| row.try_get::<Option<i64>, _>(col).map_err(unavailable);
        Ok(ClusterRow {
            namespace_exists: get("ns")?,
            namespace_deleting: get("ns_del")?,
            control_plane_exists: get("cp")?,
            control_plane_deleting: get("cp_del")?,
            kubernetes_version: row.try_get("kubernetes_version").map_err(unavailable)?,
            control_plane_age: age("cp_age")?,
            stack_age: age("stack_age")?,
            slurm_nodes_age: age("nodes_age")?,
            slurm_applied: get("slurm")?,
            slurm_deleting: get("slurm_del")?,
            slurm_pools: row.try_get("slurm_pools").map_err(unavailable)?,
            faults: row.try_get("faults").map_err(unavailable)?,
        })
    }

    /// Reaches a tenant cluster's API server: its control plane must exist (and not be going
    /// away), and the cluster must not be cut off by a fault.
    async fn tenant(&self, conn: &mut PgConnection, tenant: &TenantAccess) -> Result<ClusterRow, DriverError> {
        let id = tenant.cluster.cluster_id;
        let row = self.cluster(conn, id).await?;
        if row.has(ClusterFault::TenantUnreachable) {
            return Err(DriverError::transient(
                "tenant_unreachable",
                format!("the simulated API server of cluster {id} does not answer"),
            ));
        }
        if !row.control_plane_exists || row.control_plane_deleting {
            return Err(DriverError::transient(
                "tenant_unreachable",
                format!("cluster {id} has no simulated control plane to answer at {}", tenant.endpoint),
            ));
        }
        Ok(row)
    }
}

impl PlatformDriver for SimKube {
    fn ensure_isolation<'a>(&'a self, cluster: &'a ClusterRef) -> BoxFuture<'a, Result<Isolation, DriverError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            let id = cluster.cluster_id;
            let row = self.cluster(&mut conn, id).await?;
            let namespace = namespace_name(id);
            if row.namespace_deleting {
                // As a terminating namespace refuses new objects.
                return Err(DriverError::transient(
                    "namespace_terminating",
                    format!("namespace {namespace} is being deleted"),
                ));
            }
            if row.namespace_exists {
                return Ok(Isolation { namespace, changed: Vec::new() });
            }
            let created = sqlx::query(
                "update paddock_sim.clusters set namespace = $2, namespace_created_at = now(), updated_at = now()
                 where cluster_id = $1 and namespace_created_at is null",
            )
            .bind(id.uuid())
            .bind(&namespace)
            .execute(&mut *conn)
            .await
            .map_err(unavailable)?;
            let changed = if created.rows_affected() > 0 { vec![format!("Namespace {namespace}")] } else { Vec::new() };
            Ok(Isolation { namespace, changed })
        })
    }

    fn remove_isolation<'a>(&'a self, cluster: &'a ClusterRef) -> BoxFuture<'a, Result<Removal, DriverError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            self.cluster(&mut conn, cluster.cluster_id).await?;
            // Everything in the namespace goes with it, the control plane (and so the tenant
            // cluster's contents) included.
            let removal = remove(
                &mut conn,
                cluster.cluster_id,
                "namespace_created_at",
                "namespace_deleting_at",
                "namespace = null, namespace_created_at = null, control_plane_created_at = null,
                 control_plane_deleting_at = null, stack_applied_at = null, slurm_applied_at = null,
                 slurm_nodes_at = null, slurm_deleting_at = null",
                micros(self.inner.config.delete_latency),
            )
            .await
            .map_err(unavailable)?;
            if removal == Removal::Gone {
                nodes_clear(&mut conn, cluster.cluster_id).await?;
            }
            Ok(removal)
        })
    }
}

/// Forgets the Nodes of a tenant cluster that no longer exists.
async fn nodes_clear(conn: &mut PgConnection, cluster: ClusterId) -> Result<(), DriverError> {
    sqlx::query("delete from paddock_sim.nodes where cluster_id = $1")
        .bind(cluster.uuid())
        .execute(conn)
        .await
        .map_err(unavailable)?;
    Ok(())
}

/// A small, fake admin kubeconfig of a simulated control plane (nothing can connect with it).
fn admin_kubeconfig(cluster: ClusterId) -> Vec<u8> {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n  - name: sim-{id}\n    cluster:\n      server: https://{endpoint}\n\
         contexts:\n  - name: admin@sim-{id}\n    context:\n      cluster: sim-{id}\n      user: admin\n\
         current-context: admin@sim-{id}\nusers:\n  - name: admin\n    user:\n      token: sim-admin-{simple}\n",
        id = cluster.uuid(),
        endpoint = endpoint(cluster),
        simple = cluster.uuid().simple(),
    )
    .into_bytes()
}

/// The simulated login nodes' SSH host key: a well-formed ed25519 public key whose 32 key bytes
/// are the cluster id twice (no private key exists; nothing can connect with it).
fn sim_host_key(cluster: ClusterId) -> SshHostKey {
    let mut blob = Vec::with_capacity(51);
    for part in [&b"ssh-ed25519"[..], &[cluster.uuid().as_bytes().as_slice(), cluster.uuid().as_bytes()].concat()] {
        blob.extend_from_slice(&(part.len() as u32).to_be_bytes());
        blob.extend_from_slice(part);
    }
    ssh::host_key(&format!("ssh-ed25519 {}", STANDARD.encode(blob))).expect("a well-formed ed25519 key")
}

impl ControlPlaneBackend for SimKube {
    fn ensure_control_plane<'a>(
        &'a self,
        spec: &'a ControlPlaneSpec,
    ) -> BoxFuture<'a, Result<ControlPlaneStatus, DriverError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            let id = spec.cluster.cluster_id;
            let row = self.cluster(&mut conn, id).await?;
            if !row.namespace_exists || row.namespace_deleting {
                // The control plane lives in the cluster's namespace: step 1 comes first.
                return Err(DriverError::transient(
                    "namespace_missing",
                    format!("namespace {} does not exist (or is terminating)", namespace_name(id)),
                ));
            }
            if row.control_plane_deleting {
                return Err(DriverError::transient(
                    "control_plane_deleting",
                    format!("the control plane of cluster {id} is being deleted"),
                ));
            }
            let mut changed = Vec::new();
            let mut age = row.control_plane_age;
            if !row.control_plane_exists || row.kubernetes_version.as_deref() != Some(spec.kubernetes_version.as_str())
            {
                age = sqlx::query_scalar(
                    "update paddock_sim.clusters set control_plane_created_at = coalesce(control_plane_created_at, now()),
                            kubernetes_version = $2, updated_at = now()
                     where cluster_id = $1
                     returning (extract(epoch from now() - control_plane_created_at) * 1000000)::int8",
                )
                .bind(id.uuid())
                .bind(&spec.kubernetes_version)
                .fetch_one(&mut *conn)
                .await
                .map_err(unavailable)?;
                changed.push(format!("TenantControlPlane {}", namespace_name(id)));
            }
            let started = aged(age, self.inner.config.control_plane_latency);
            let ready = started && !row.has(ClusterFault::ControlPlaneNeverReady);
            Ok(ControlPlaneStatus {
                ready,
                reason: if ready { String::new() } else { "the simulated control plane is starting".to_owned() },
                endpoint: ready.then(|| endpoint(id)),
                admin_kubeconfig: ready.then(|| admin_kubeconfig(id)),
                changed,
            })
        })
    }

    fn delete_control_plane<'a>(&'a self, cluster: &'a ClusterRef) -> BoxFuture<'a, Result<Removal, DriverError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            self.cluster(&mut conn, cluster.cluster_id).await?;
            // The tenant cluster's contents (stack, Slurm, Nodes) go with its control plane.
            let removal = remove(
                &mut conn,
                cluster.cluster_id,
                "control_plane_created_at",
                "control_plane_deleting_at",
                "control_plane_created_at = null, stack_applied_at = null, slurm_applied_at = null,
                 slurm_nodes_at = null, slurm_deleting_at = null",
                micros(self.inner.config.delete_latency),
            )
            .await
            .map_err(unavailable)?;
            if removal == Removal::Gone {
                nodes_clear(&mut conn, cluster.cluster_id).await?;
            }
            Ok(removal)
        })
    }
}

/// A kubeadm-shaped bootstrap token (`[a-z0-9]{6}.[a-z0-9]{16}`); fake, nothing checks it.
fn bootstrap_token() -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let mut part =
        |n: usize| -> String { (0..n).map(|_| char::from(CHARS[rng.random_range(0..CHARS.len())])).collect() };
    format!("{}.{}", part(6), part(16))
}

/// The Nodes of a cluster, as tests see them.
pub(crate) async fn nodes_list(conn: &mut PgConnection, cluster: ClusterId) -> Result<Vec<SimNode>, SimError> {
    let rows = sqlx::query(
        "select node_name, system_uuid, labels, taints, joined_at is not null as joined,
                coalesce(ready_at <= now(), false) as ready
         from paddock_sim.nodes where cluster_id = $1 order by node_name",
    )
    .bind(cluster.uuid())
    .fetch_all(conn)
    .await?;
    rows.into_iter()
        .map(|row| {
            Ok(SimNode {
                cluster_id: cluster,
                node_name: row.try_get("node_name")?,
                system_uuid: row.try_get("system_uuid")?,
                joined: row.try_get("joined")?,
                ready: row.try_get("ready")?,
                labels: row.try_get("labels")?,
                taints: row.try_get("taints")?,
            })
        })
        .collect()
}

impl SimKube {
    /// The join of a machine behind a real BMC (not `sim://`), which no simulated agent or BMC
    /// plays: its Node registers once paddock holds the verified report of the machine's current
    /// provisioning boot (its agent booted the OS image, fetched the join configuration with the
    /// run's token and reported the first boot) and has restarted it from disk
    /// (`run_finished_at`); Ready `node_ready_latency` later. Both are read from paddock's own
    /// records, since there is no kubelet to register it. Simulated machines join as before.
    async fn join_reported(
        &self,
        conn: &mut PgConnection,
        tenant: &TenantAccess,
        node: &NodeRef,
        labels: &serde_json::Value,
        taints: &serde_json::Value,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "insert into paddock_sim.nodes (cluster_id, node_name, system_uuid, labels, taints, joined_at, ready_at)
             select $1, $3, $2, $4, $5, now(), now() + $6 * interval '1 microsecond'
             from machines m
             where m.id = $7 and m.system_uuid = $2 and m.bmc_url not like 'sim://%'
               and m.run_purpose = 'provision' and m.run_finished_at is not null
               and exists (select 1 from agent_tokens t
                           where t.machine_id = m.id and t.run_id = m.run_id and t.used_at is not null
                             and coalesce(t.verified, false))
               and not exists (select 1 from paddock_sim.nodes n where n.cluster_id = $1 and n.system_uuid = $2)
             on conflict do nothing",
        )
        .bind(tenant.cluster.cluster_id.uuid())
        .bind(&node.system_uuid)
        .bind(&node.node_name)
        .bind(labels)
        .bind(taints)
        .bind(micros(self.inner.config.node_ready_latency))
        .bind(node.machine_id.uuid())
        .execute(conn)
        .await
        .map(drop)
    }
}

impl SimKube {
    /// The demand of `pools` as the knob ([`crate::SimWorld::set_demand`]) sets it: the busy nodes
    /// are at most the nodes the pool has; the rest of its nodes are idle (the last ones by name).
    /// The widest job, when singled out, is listed as a job of several nodes.
    async fn demand(&self, tenant: &TenantAccess, pools: &[DemandPool]) -> Result<Demand, DriverError> {
        let mut conn = self.conn().await?;
        self.tenant(&mut conn, tenant).await?;
        let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
        let rows: Vec<(String, i32, i32, i32, i32)> = sqlx::query_as(
            "select pool, pending_jobs, pending_nodes, busy_nodes, widest_job_nodes from paddock_sim.demand
             where cluster_id = $1 and pool = any($2)",
        )
        .bind(tenant.cluster.cluster_id.uuid())
        .bind(&names)
        .fetch_all(&mut *conn)
        .await
        .map_err(unavailable)?;
        let count = |v: i32| u32::try_from(v).unwrap_or(0);
        let mut demand = Demand::default();
        for pool in pools {
            let row = rows.iter().find(|r| r.0 == pool.name);
            let (pending, pending_nodes, busy) = row.map_or((0, 0, 0), |r| (count(r.1), count(r.2), count(r.3)));
            let widest = row.map_or(0, |r| count(r.4));
            if widest > 1 && pending > 0 {
                // Slurm lists it by its id; the simulated queue has one such job a pool.
                demand.wide_jobs.push(WideJob { node_pool_id: pool.node_pool_id, job: "1".to_owned(), nodes: widest });
            }
            let mut nodes = pool.node_names.clone();
            nodes.sort();
            let known = u32::try_from(nodes.len()).unwrap_or(u32::MAX);
            let busy = busy.min(known);
            demand.idle_node_names.extend(nodes.into_iter().skip(busy as usize));
            demand.pools.push(PoolDemand { pending, pending_nodes, nodes: known, idle_nodes: known - busy });
        }
        Ok(demand)
    }
}

impl TenantNodes for SimKube {
    fn pod_demand<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        pools: &'a [DemandPool],
    ) -> BoxFuture<'a, Result<Demand, DriverError>> {
        Box::pin(self.demand(tenant, pools))
    }

    fn join_config<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
        ttl_seconds: u64,
    ) -> BoxFuture<'a, Result<JoinConfig, DriverError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            self.tenant(&mut conn, tenant).await?;
            let ttl = i64::try_from(ttl_seconds).unwrap_or(i64::MAX).min(i64::from(u32::MAX));
            let expires_at = chrono::Utc::now() + chrono::Duration::seconds(ttl);
            // The simulated agent reads `cluster_id` and `node_name` to register the Node.
            Ok(JoinConfig(serde_json::json!({
                "simulated": true,
                "cluster_id": tenant.cluster.cluster_id,
                "api_endpoint": endpoint(tenant.cluster.cluster_id),
                "ca_cert": SIMULATED_CA_PEM,
                "api_server": endpoint(tenant.cluster.cluster_id),
                "ca_cert_hash": "sha256:0000000000000000000000000000000000000000000000000000000000000000",
                "bootstrap_token": bootstrap_token(),
                "expires_at": expires_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                "node_name": node.node_name,
                "system_uuid": node.system_uuid,
                "pool": node.pool_name,
                "labels": node.labels,
                "taints": node.taints,
            })))
        })
    }

    fn node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Option<NodeStatus>, DriverError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            self.tenant(&mut conn, tenant).await?;
            // Maps of strings and plain structs: serializing them cannot fail.
            let labels = serde_json::to_value(&node.labels).unwrap_or_else(|_| serde_json::json!({}));
            let taints = serde_json::to_value(&node.taints).unwrap_or_else(|_| serde_json::json!([]));
            self.join_reported(&mut conn, tenant, node, &labels, &taints).await.map_err(unavailable)?;
            // Converge the registered Node's labels and taints to the pool's, then read it. A
            // machine with `never_joins` stays NotReady even if the fault came later.
            let row = sqlx::query(
                "update paddock_sim.nodes n set labels = $3, taints = $4
                 where n.cluster_id = $1 and n.system_uuid = $2 and n.joined_at is not null
                 returning n.node_name,
                   coalesce(n.ready_at <= now(), false) and not exists (
                       select 1 from paddock_sim.machines m where m.system_uuid = n.system_uuid and $5 = any (m.faults)
                   ) as ready",
            )
            .bind(tenant.cluster.cluster_id.uuid())
            .bind(&node.system_uuid)
            .bind(&labels)
            .bind(&taints)
            .bind(MachineFault::NeverJoins.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(unavailable)?;
            let Some(row) = row else { return Ok(None) };
            Ok(Some(NodeStatus {
                name: row.try_get("node_name").map_err(unavailable)?,
                ready: row.try_get("ready").map_err(unavailable)?,
            }))
        })
    }

    fn registered_nodes<'a>(
        &'a self,
        tenant: &'a TenantAccess,
    ) -> BoxFuture<'a, Result<Vec<RegisteredNode>, DriverError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            self.tenant(&mut conn, tenant).await?;
            let rows = sqlx::query(
                "select n.node_name, n.system_uuid,
                   coalesce(n.ready_at <= now(), false) and not exists (
                       select 1 from paddock_sim.machines m where m.system_uuid = n.system_uuid and $2 = any (m.faults)
                   ) as ready
                 from paddock_sim.nodes n where n.cluster_id = $1 and n.joined_at is not null order by n.node_name",
            )
            .bind(tenant.cluster.cluster_id.uuid())
            .bind(MachineFault::NeverJoins.as_str())
            .fetch_all(&mut *conn)
            .await
            .map_err(unavailable)?;
            rows.iter()
                .map(|row| {
                    Ok(RegisteredNode {
                        name: row.try_get("node_name").map_err(unavailable)?,
                        system_uuid: row.try_get("system_uuid").map_err(unavailable)?,
                        ready: row.try_get("ready").map_err(unavailable)?,
                        // The simulated Nodes do not record when they stopped being Ready.
                        not_ready_since: None,
                    })
                })
                .collect()
        })
    }

    fn drain_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        _node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Drain, DriverError>> {
        Box::pin(async move {
            // Simulated Nodes run no pods: nothing to evict beyond the reachability check every
            // tenant call makes.
            let mut conn = self.conn().await?;
            self.tenant(&mut conn, tenant).await?;
            Ok(Drain::Drained)
        })
    }

    fn foreign_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Option<String>, DriverError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            self.tenant(&mut conn, tenant).await?;
            sqlx::query_scalar(
                "select system_uuid from paddock_sim.nodes where cluster_id = $1 and node_name = $2 \
                 and joined_at is not null and system_uuid <> '' and lower(system_uuid) <> lower($3)",
            )
            .bind(tenant.cluster.cluster_id.uuid())
            .bind(&node.node_name)
            .bind(node.system_uuid.trim())
            .fetch_optional(&mut *conn)
            .await
            .map_err(unavailable)
        })
    }

    fn remove_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Removal, DriverError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            self.tenant(&mut conn, tenant).await?;
            // Not found counts as removed.
            sqlx::query("delete from paddock_sim.nodes where cluster_id = $1 and (system_uuid = $2 or node_name = $3)")
                .bind(tenant.cluster.cluster_id.uuid())
                .bind(&node.system_uuid)
                .bind(&node.node_name)
                .execute(&mut *conn)
                .await
                .map_err(unavailable)?;
            Ok(Removal::Gone)
        })
    }

    fn delete_join_tokens<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        _node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            // The simulated tokens are never stored: nothing to delete beyond the reachability
            // check every tenant call makes.
            let mut conn = self.conn().await?;
            self.tenant(&mut conn, tenant).await?;
            Ok(())
        })
    }

    fn abandon_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        // Simulated Nodes have no finalizers and no Leases: removing them is the whole of it.
        Box::pin(async move { self.remove_node(tenant, node).await.map(|_| ()) })
    }
}

impl TenantStack for SimKube {
    fn ensure_stack<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        version: &'a str,
        _kind: paddock_types::cluster::ClusterKind,
    ) -> BoxFuture<'a, Result<StackStatus, DriverError>> {
        Box::pin(async move {
            // The simulated stack follows the same definitions as the real one.
            paddock_domain::stack::definition(version).map_err(|e| DriverError::permanent(e.code(), e.to_string()))?;
            let mut conn = self.conn().await?;
            let row = self.tenant(&mut conn, tenant).await?;
            let id = tenant.cluster.cluster_id;
            let mut changed = Vec::new();
            let mut age = row.stack_age;
            if age.is_none() {
                age = sqlx::query_scalar(
                    "update paddock_sim.clusters set stack_applied_at = coalesce(stack_applied_at, now()),
                            updated_at = now()
                     where cluster_id = $1
                     returning (extract(epoch from now() - stack_applied_at) * 1000000)::int8",
                )
                .bind(id.uuid())
                .fetch_one(&mut *conn)
                .await
                .map_err(unavailable)?;
                changed.push(format!("stack {version}"));
            }
            let ready = aged(age, self.inner.config.stack_latency);
            let reason = if ready { String::new() } else { "the simulated base stack is rolling out".to_owned() };
            Ok(StackStatus { ready, reason, version: version.to_owned(), changed })
        })
    }
}

/// The CA certificate a simulated tenant cluster hands joining machines (not a real certificate:
/// nothing in the simulation verifies TLS).
const SIMULATED_CA_PEM: &str =
    "-----BEGIN CERTIFICATE-----\nc2ltdWxhdGVkIHRlbmFudCBjbHVzdGVyIENB\n-----END CERTIFICATE-----\n";

impl TenantCredentials for SimKube {
    fn tenant_kubeconfig<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        ttl_seconds: u64,
    ) -> BoxFuture<'a, Result<SecretString, DriverError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            self.tenant(&mut conn, tenant).await?;
            let id = tenant.cluster.cluster_id;
            let mut raw = [0u8; 24];
            rand::rng().fill(&mut raw);
            let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
            let yaml = format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: {id}\n  cluster:\n    server: https://{endpoint}\n\
                 contexts:\n- name: {id}\n  context:\n    cluster: {id}\n    user: paddock-tenant\n\
                 current-context: {id}\nusers:\n- name: paddock-tenant\n  user:\n    token: sim-{token}\n\
                 # simulated: expires in {ttl_seconds} s\n",
                endpoint = tenant.endpoint,
            );
            Ok(SecretString::new(yaml))
        })
    }
}

/// The simulated Ray: the version checked against the stack's Ray catalogue like the real
/// driver's, then ready at once with in-cluster endpoints under `.paddock.invalid` (no RayCluster
/// runs anywhere); removed at once.
impl RayDriver for SimKube {
    fn ensure_ray<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        desired: &'a RayDesired,
    ) -> BoxFuture<'a, Result<RayStatus, DriverError>> {
        Box::pin(async move {
            let version = desired.spec.version.as_deref().unwrap_or_default();
            let supported = paddock_domain::stack::ray_versions(&desired.stack_version);
            if !supported.contains(&version) {
                let message = format!(
                    "Ray {version} is not in the Ray catalogue of the base stack {} (supported: {})",
                    desired.stack_version,
                    supported.join(", ")
                );
                return Err(DriverError::permanent("ray_version_unsupported", message));
            }
            let mut conn = self.conn().await?;
            self.tenant(&mut conn, tenant).await?;
            let host = format!("ray-head.{}.paddock.invalid", tenant.cluster.cluster_id.uuid().simple());
            Ok(RayStatus {
                ready: true,
                reason: String::new(),
                ray_client: Some(format!("ray://{host}:10001")),
                dashboard: desired.spec.dashboard.then(|| format!("http://{host}:8265")),
                changed: Vec::new(),
            })
        })
    }

    fn remove_ray<'a>(&'a self, tenant: &'a TenantAccess) -> BoxFuture<'a, Result<Removal, DriverError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            let row = self.cluster(&mut conn, tenant.cluster.cluster_id).await?;
            if row.control_plane_exists && !row.control_plane_deleting {
                self.tenant(&mut conn, tenant).await?;
            }
            Ok(Removal::Gone)
        })
    }
}
