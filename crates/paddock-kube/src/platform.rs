//! The platform driver's contract: what the cluster reconciler asks of the platform Kubernetes
//! cluster (SPEC section 6 step 1). It lives here until a later step moves it to `paddock-domain`
//! next to the other driver traits; nothing in it depends on kube-rs.

use futures::future::BoxFuture;
use paddock_types::{ClusterId, TenantId};

use crate::KubeError;

/// The tenant cluster a platform object belongs to. Object names derive from the ids only; the
/// names are informational (annotations) and may change without renaming anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterRef {
    /// The owning tenant.
    pub tenant_id: TenantId,
    /// The tenant cluster.
    pub cluster_id: ClusterId,
    /// The tenant's name, for people reading the platform cluster.
    pub tenant_name: String,
    /// The cluster's name, for people reading the platform cluster.
    pub cluster_name: String,
}

/// What `ensure_isolation` found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Isolation {
    /// The cluster's namespace on the platform cluster.
    pub namespace: String,
    /// Whether any object was created or modified (false: everything already held).
    pub changed: bool,
}

/// Where the removal of a cluster's isolation (or of its control plane) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The object (the namespace and everything in it, or the control plane) is gone.
    Gone,
    /// The object is being deleted (terminating, or waiting for finalizers); ask again later.
    Deleting,
}

/// The platform cluster, as the cluster reconciler sees it. Every method is idempotent and starts
/// from the observed state, so a crashed or repeated run just converges again.
///
/// Boxed futures (not native `async fn`) so the worker can hold a `dyn PlatformDriver`.
pub trait PlatformDriver: Send + Sync {
    /// Converges the cluster's namespace, NetworkPolicies, ResourceQuota and LimitRange.
    fn ensure_isolation<'a>(&'a self, cluster: &'a ClusterRef) -> BoxFuture<'a, Result<Isolation, KubeError>>;

    /// Deletes the cluster's namespace (and with it everything inside). `Gone` only once the
    /// namespace no longer exists.
    fn remove_isolation<'a>(&'a self, cluster: &'a ClusterRef) -> BoxFuture<'a, Result<Removal, KubeError>>;
}
