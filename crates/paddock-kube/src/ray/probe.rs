//! Asking a Ray head whether it answers: the [`RayProbe`] seam and its production implementation
//! [`PodProxyProbe`], which goes through the tenant API server's pod proxy
//! (`/api/v1/namespaces/<ns>/pods/<head pod>:<port>/proxy/...`), so paddock needs no network path
//! into the tenant cluster beyond the API server it already reaches, and nothing of Ray is
//! exposed for it.
//!
//! With the dashboard on, the head's GCS health check (`GET :8265/api/gcs_healthz`, what KubeRay's
//! own head readiness probe asks); with it off, the head raylet's (`GET
//! :52365/api/local_raylet_healthz`, the dashboard agent every Ray pod runs). Ray answers
//! `success` to both.

use futures::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::Api;
use paddock_domain::driver::{BoxFuture, DriverError, TenantAccess};
use tracing::debug;

use super::{AGENT_PORT, DASHBOARD_PORT, LABEL_NODE_TYPE, LABEL_RAY_CLUSTER, RAYCLUSTER};
use crate::KubeError;

/// What paddock asks of a Ray head. The production implementation is [`PodProxyProbe`]; tests
/// use stand-ins.
pub trait RayProbe: Send + Sync {
    /// Whether the head pod of the RayCluster in `namespace` answers its health check (the GCS's
    /// with the `dashboard` on, else the raylet's).
    fn head_answers<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        namespace: &'a str,
        dashboard: bool,
    ) -> BoxFuture<'a, Result<bool, DriverError>>;
}

/// The head through the tenant API server's pod proxy (see the module documentation).
#[derive(Debug, Clone, Copy, Default)]
pub struct PodProxyProbe;

/// Whether a health endpoint's answer is Ray's `success`.
pub fn healthy(body: &str) -> bool {
    body.trim() == "success"
}

impl PodProxyProbe {
    async fn head_answers(&self, tenant: &TenantAccess, ns: &str, dashboard: bool) -> Result<bool, DriverError> {
        let client = crate::nodes::tenant_client(tenant).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let selector = format!("{LABEL_RAY_CLUSTER}={RAYCLUSTER},{LABEL_NODE_TYPE}=head");
        let heads = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|source| KubeError::api("list", "Pod", format!("{ns}/{selector}"), source))?
            .items;
        let running = heads.iter().find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
        let Some(name) = running.and_then(|p| p.metadata.name.clone()) else {
            return Ok(false);
        };
        let (port, path) =
            if dashboard { (DASHBOARD_PORT, "api/gcs_healthz") } else { (AGENT_PORT, "api/local_raylet_healthz") };
        let uri = format!("/api/v1/namespaces/{ns}/pods/{name}:{port}/proxy/{path}");
        let request = http::Request::get(uri.as_str())
            .body(Vec::new())
            .map_err(|e| DriverError::permanent("ray_probe_request_invalid", format!("GET {uri}: {e}")))?;
        let ok = match client.request_text(request).await {
            Ok(text) => healthy(&text),
            // The proxy could not reach the head (yet), or the head answered an error: not healthy.
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 500 | 502 | 503) => false,
            Err(source) => {
                return Err(KubeError::api("proxy", "Pod", format!("{ns}/{name}:{port}/{path}"), source).into())
            }
        };
        debug!(cluster.id = %tenant.cluster.cluster_id, ok, "asked the Ray head");
        Ok(ok)
    }
}

impl RayProbe for PodProxyProbe {
    fn head_answers<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        namespace: &'a str,
        dashboard: bool,
    ) -> BoxFuture<'a, Result<bool, DriverError>> {
        self.head_answers(tenant, namespace, dashboard).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::healthy;

    #[test]
    fn only_success_is_healthy() {
        assert!(healthy("success"));
        assert!(healthy("success\n"));
        assert!(!healthy("Error: GCS is down"));
        assert!(!healthy(""));
    }
}
