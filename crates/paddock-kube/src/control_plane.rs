//! The control-plane backend's contract: what the cluster reconciler asks of whatever runs tenant
//! control planes (SPEC section 6 step 2). Kamaji is the one implementation ([`crate::kamaji`]);
//! nothing here depends on kube-rs, so the trait can move to `paddock-domain` with
//! [`crate::PlatformDriver`].
//!
//! Readiness is all-or-nothing and read from the world on every call: a control plane is ready
//! only when the backend has reconciled the spec we last applied, reports its Kubernetes version
//! ready, publishes an endpoint and has written the admin kubeconfig. `reason` says which of those
//! is still missing, for the cluster's condition.

use std::fmt;

use futures::future::BoxFuture;

use crate::platform::{ClusterRef, Removal};
use crate::KubeError;

/// How the tenant API server (and konnectivity) is exposed on the platform cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServiceType {
    /// A load balancer address (the default for machines outside the platform cluster).
    LoadBalancer,
    /// A port on every platform node.
    NodePort,
    /// Reachable from inside the platform cluster only.
    ClusterIP,
}

impl ServiceType {
    /// The Kubernetes Service type, as the TenantControlPlane's `serviceType` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LoadBalancer => "LoadBalancer",
            Self::NodePort => "NodePort",
            Self::ClusterIP => "ClusterIP",
        }
    }
}

impl fmt::Display for ServiceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The desired tenant control plane of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlaneSpec {
    /// The tenant cluster (names derive from its id; it lives in the cluster's namespace).
    pub cluster: ClusterRef,
    /// The tenant's Kubernetes version, e.g. `v1.34.1`.
    pub kubernetes_version: String,
    /// API server replicas.
    pub replicas: u32,
    /// How the API server is exposed.
    pub service_type: ServiceType,
    /// A dedicated DataStore by name; None lets the backend choose its default. Once set it
    /// cannot be unset (Kamaji's CRD rejects that).
    pub datastore: Option<String>,
}

/// What the backend reports about a control plane after ensuring it.
#[derive(Clone, PartialEq, Eq)]
pub struct ControlPlaneStatus {
    /// Every readiness condition holds.
    pub ready: bool,
    /// Why it is not ready (every missing condition, `; `-separated), readable by a person;
    /// empty when ready.
    pub reason: String,
    /// The API server endpoint as the backend publishes it (Kamaji: `host:port`), when known.
    pub endpoint: Option<String>,
    /// The admin kubeconfig, when the backend has written it. A secret: paddock stores it
    /// encrypted and never logs it ([`fmt::Debug`] prints its length only).
    pub admin_kubeconfig: Option<Vec<u8>>,
}

impl fmt::Debug for ControlPlaneStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kubeconfig = self.admin_kubeconfig.as_ref().map(|k| format!("[redacted, {} bytes]", k.len()));
        f.debug_struct("ControlPlaneStatus")
            .field("ready", &self.ready)
            .field("reason", &self.reason)
            .field("endpoint", &self.endpoint)
            .field("admin_kubeconfig", &kubeconfig)
            .finish()
    }
}

/// Runs tenant control planes. Every method is idempotent and starts from the observed state.
///
/// Boxed futures (not native `async fn`) so the worker can hold a `dyn ControlPlaneBackend`.
pub trait ControlPlaneBackend: Send + Sync {
    /// Applies the desired control plane (a no-op when it already matches) and reports whether it
    /// is ready. Not being ready is not an error; failing to talk to the platform cluster is.
    fn ensure_control_plane<'a>(
        &'a self,
        spec: &'a ControlPlaneSpec,
    ) -> BoxFuture<'a, Result<ControlPlaneStatus, KubeError>>;

    /// Deletes the cluster's control plane. `Gone` only once it no longer exists.
    fn delete_control_plane<'a>(&'a self, cluster: &'a ClusterRef) -> BoxFuture<'a, Result<Removal, KubeError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_admin_kubeconfig() {
        let status = ControlPlaneStatus {
            ready: true,
            reason: String::new(),
            endpoint: Some("10.0.0.1:6443".to_owned()),
            admin_kubeconfig: Some(b"client-key-data: SECRET".to_vec()),
        };
        let shown = format!("{status:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("redacted, 23 bytes"), "{shown}");
    }
}
