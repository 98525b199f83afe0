//! Steps 1 and 2: the cluster's isolation on the platform cluster, and its tenant control plane.

use paddock_domain::cluster::Cluster;
use paddock_domain::driver::{ClusterRef, ControlPlaneSpec, ControlPlaneStatus, KubeDrivers, TenantAccess};
use paddock_store::{cluster as store, StoreError};

use crate::reconcile::{access, kubeconfig_binding, open_access};

use super::{ClusterReconciler, Observed, Run, Stop, CONTROL_PLANE_READY, NAMESPACE_READY};

impl ClusterReconciler {
    /// Step 1: the cluster's namespace and its isolation on the platform cluster.
    pub(super) async fn isolation(
        &self,
        kube: &KubeDrivers,
        reference: &ClusterRef,
        observed: &mut Observed,
    ) -> Result<(), Stop> {
        let isolation =
            kube.platform.ensure_isolation(reference).await.map_err(|e| Stop::Driver(NAMESPACE_READY, e))?;
        observed.changed.extend(isolation.changed);
        observed.set(NAMESPACE_READY, true, "Ready", "");
        Ok(())
    }

    /// Step 2: the tenant control plane; its admin kubeconfig is stored sealed and its endpoint
    /// shown.
    pub(super) async fn control_plane(
        &self,
        kube: &KubeDrivers,
        run: &Run<'_>,
        observed: &mut Observed,
    ) -> Result<ControlPlaneStatus, Stop> {
        let Run { cluster, reference, sealed, .. } = *run;
        let spec = ControlPlaneSpec {
            cluster: reference.clone(),
            kubernetes_version: cluster.spec.kubernetes_version.clone(),
            replicas: self.settings.control_plane_replicas,
            service_type: self.settings.service_type,
            datastore: None,
        };
        let mut cp =
            kube.control_plane.ensure_control_plane(&spec).await.map_err(|e| Stop::Driver(CONTROL_PLANE_READY, e))?;
        observed.changed.append(&mut cp.changed);
        if let Some(kubeconfig) = &cp.admin_kubeconfig {
            self.store_kubeconfig(cluster, kubeconfig, sealed.admin_kubeconfig.as_deref()).await?;
        }
        if let Some(endpoint) = &cp.endpoint {
            observed.endpoints.kubernetes_api = Some(format!("https://{endpoint}"));
        }
        let reason = if cp.ready { "Ready" } else { "Provisioning" };
        observed.set(CONTROL_PLANE_READY, cp.ready, reason, &cp.reason);
        Ok(cp)
    }

    /// Access to the tenant cluster, once its control plane is ready.
    pub(super) fn tenant_access(
        &self,
        run: &Run<'_>,
        cp: &ControlPlaneStatus,
    ) -> Result<Option<TenantAccess>, StoreError> {
        if !cp.ready {
            return Ok(None);
        }
        if let (Some(kubeconfig), Some(endpoint)) = (&cp.admin_kubeconfig, &cp.endpoint) {
            // The kubeconfig the control plane just reported (and `control_plane` stored): not
            // read back.
            return access(run.reference.clone(), endpoint, kubeconfig.clone()).map(Some);
        }
        let sealed = run.sealed.admin_kubeconfig.as_deref();
        open_access(self.services.cipher(), run.reference.clone(), cp.endpoint.as_deref(), sealed)
    }

    /// Stores the control plane's admin kubeconfig sealed, when it differs from `stored` (read
    /// with the run's input).
    async fn store_kubeconfig(
        &self,
        cluster: &Cluster,
        kubeconfig: &[u8],
        stored: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        let binding = kubeconfig_binding(cluster.id);
        let same = stored
            .and_then(|sealed| self.services.cipher().open(sealed, binding).ok())
            .is_some_and(|opened| opened == kubeconfig);
        if !same {
            let mut conn = self.services.store().conn().await?;
            let sealed = self.services.cipher().seal(kubeconfig, binding)?;
            store::set_admin_kubeconfig(&mut conn, cluster.tenant_id, cluster.id, Some(&sealed)).await?;
        }
        Ok(())
    }
}
