//! Steps 4 and 5: the tenant base stack, and Slurm (`kind: slurm`) or Ray (`kind: ray`) on it.

use paddock_domain::cluster::{Cluster, NodePool};
use paddock_domain::driver::{KubeDrivers, RayDesired, RayPool, SlurmDesired, SlurmPool, SlurmSecrets, TenantAccess};
use paddock_domain::secret::{Binding, SecretString};
use paddock_store::allocation::HeldMachine;
use paddock_store::{cluster as store, StoreError};
use paddock_types::cluster::ClusterKind;
use paddock_types::machine::MachineState;
use serde_json::{json, Value};

use super::{ClusterReconciler, Observed, Run, Stop, RAY_READY, SLURM_READY, STACK_READY};

impl ClusterReconciler {
    /// Step 4: the tenant base stack; true once it is ready.
    pub(super) async fn stack(
        &self,
        kube: &KubeDrivers,
        cluster: &Cluster,
        access: &TenantAccess,
        observed: &mut Observed,
    ) -> Result<bool, Stop> {
        let stack = kube
            .stack
            .ensure_stack(access, &cluster.stack_version, cluster.spec.kind)
            .await
            .map_err(|e| Stop::Driver(STACK_READY, e))?;
        observed.changed.extend(stack.changed);
        observed.set(STACK_READY, stack.ready, if stack.ready { "Ready" } else { "Applying" }, &stack.reason);
        Ok(stack.ready)
    }

    /// Step 5 (`kind: slurm`), on the ready base stack: Slurm, with its endpoints.
    pub(super) async fn slurm(
        &self,
        kube: &KubeDrivers,
        run: &Run<'_>,
        access: &TenantAccess,
        observed: &mut Observed,
    ) -> Result<(), Stop> {
        let Run { cluster, pools, held, sealed, .. } = *run;
        let (ClusterKind::Slurm, Some(slurm)) = (cluster.spec.kind, &cluster.spec.slurm) else {
            return Ok(());
        };
        let secrets = self.slurm_secrets(cluster, sealed.slurm_secrets.clone()).await?;
        let desired = slurm_desired(cluster, slurm, pools, held, secrets);
        let status = kube.slurm.ensure_slurm(access, &desired).await.map_err(|e| Stop::Driver(SLURM_READY, e))?;
        observed.changed.extend(status.changed);
        match &status.fault {
            // Waiting will not heal it: the cluster says so, and is degraded while it lasts.
            Some(fault) => {
                observed.set(SLURM_READY, false, &fault.reason, &fault.message);
                observed.faulted = true;
            }
            None => {
                let reason = if status.ready { "Ready" } else { "Applying" };
                observed.set(SLURM_READY, status.ready, reason, &status.reason);
            }
        }
        observed.endpoints.slurm_rest_api = status.rest_api;
        observed.endpoints.login_ssh = status.login_ssh;
        observed.endpoints.login_ssh_host_keys = status.login_ssh_host_keys;
        Ok(())
    }

    /// Step 5 (`kind: ray`), on the ready base stack: the RayCluster, with its endpoints.
    pub(super) async fn ray(
        &self,
        kube: &KubeDrivers,
        run: &Run<'_>,
        access: &TenantAccess,
        observed: &mut Observed,
    ) -> Result<(), Stop> {
        let Run { cluster, pools, .. } = *run;
        let (ClusterKind::Ray, Some(ray)) = (cluster.spec.kind, &cluster.spec.ray) else {
            return Ok(());
        };
        let pools = pools
            .iter()
            .filter(|p| !p.deleting)
            .map(|p| RayPool {
                node_pool_id: p.id,
                name: p.spec.name.clone(),
                count: p.status.desired_count,
                gpus_per_node: p.gpu_count,
                taints: p.spec.taints.clone(),
            })
            .collect();
        let desired = RayDesired { spec: ray.clone(), stack_version: cluster.stack_version.clone(), pools };
        let status = kube.ray.ensure_ray(access, &desired).await.map_err(|e| Stop::Driver(RAY_READY, e))?;
        observed.changed.extend(status.changed);
        let reason = if status.ready { "Ready" } else { "Applying" };
        observed.set(RAY_READY, status.ready, reason, &status.reason);
        observed.endpoints.ray_client = status.ray_client;
        observed.endpoints.dashboard = status.dashboard;
        Ok(())
    }

    /// The cluster's Slurm secrets: generated once, stored sealed, then always the stored ones
    /// (`stored`, read with the run's input).
    async fn slurm_secrets(&self, cluster: &Cluster, mut stored: Option<Vec<u8>>) -> Result<SlurmSecrets, StoreError> {
        let binding = Binding { table: "clusters", column: "slurm_secrets_enc", row: cluster.id.uuid() };
        if stored.is_none() {
            let mut conn = self.services.store().conn().await?;
            let fresh = json!({
                "slurm_key": random_base64(1024),
                "jwt_hs256_key": random_base64(64),
                "database_password": random_alphanumeric(32),
            });
            let sealed = self.services.cipher().seal(fresh.to_string().as_bytes(), binding)?;
            store::init_slurm_secrets(&mut conn, cluster.tenant_id, cluster.id, &sealed).await?;
            // Read back: a concurrent run's secrets win if it stored them first.
            stored = store::slurm_secrets(&mut conn, cluster.tenant_id, cluster.id).await?;
        }
        let sealed = stored
            .ok_or_else(|| StoreError::Corrupt(format!("the Slurm secrets of cluster {} vanished", cluster.id)))?;
        let corrupt = |what: &str| StoreError::Corrupt(format!("the Slurm secrets of cluster {}: {what}", cluster.id));
        let opened = self.services.cipher().open(&sealed, binding).map_err(|e| corrupt(&e.to_string()))?;
        let value: Value = serde_json::from_slice(&opened).map_err(|e| corrupt(&e.to_string()))?;
        let field = |k: &str| {
            value[k]
                .as_str()
                .map(|s| SecretString::new(s.to_owned()))
                .ok_or_else(|| corrupt(&format!("{k} is missing")))
        };
        Ok(SlurmSecrets {
            slurm_key: field("slurm_key")?,
            jwt_hs256_key: field("jwt_hs256_key")?,
            database_password: field("database_password")?,
        })
    }
}

fn random_base64(bytes: usize) -> String {
    use base64::Engine;
    let mut raw = vec![0u8; bytes];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut raw);
    base64::engine::general_purpose::STANDARD.encode(raw)
}

fn random_alphanumeric(len: usize) -> String {
    use rand::Rng;
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::rng();
    (0..len).map(|_| char::from(CHARS[rng.random_range(0..CHARS.len())])).collect()
}

fn slurm_desired(
    cluster: &Cluster,
    spec: &paddock_types::cluster::SlurmSpec,
    pools: &[NodePool],
    held: &[HeldMachine],
    secrets: SlurmSecrets,
) -> SlurmDesired {
    let pools = pools
        .iter()
        .filter(|p| !p.deleting)
        .map(|p| SlurmPool {
            node_pool_id: p.id,
            name: p.spec.name.clone(),
            count: p.status.desired_count,
            node_names: held
                .iter()
                .filter(|m| m.node_pool_id == p.id && m.state == MachineState::Active)
                .filter_map(|m| m.node_name.clone())
                .collect(),
            releasing: held
                .iter()
                .filter(|m| m.node_pool_id == p.id && m.state == MachineState::Releasing)
                .filter_map(|m| m.node_name.clone())
                .collect(),
            gpus_per_node: p.gpu_count,
            class_size: p.class_size,
            autoscaling_max: p.spec.autoscaling.map(|a| a.max),
            taints: p.spec.taints.clone(),
            role: p.spec.role,
        })
        .collect();
    SlurmDesired { spec: spec.clone(), stack_version: cluster.stack_version.clone(), pools, secrets }
}
