//! The Kubernetes drivers of paddock (kube-rs + k8s-openapi): what the worker does on the
//! **platform** cluster and inside each **tenant** cluster (docs/architecture.md). The traits they
//! implement live in [`paddock_domain::driver`].
//!
//! - Step 1, isolation: [`KubePlatform`] implements [`PlatformDriver`]: one namespace per tenant
//!   cluster, named from the cluster id, with default-deny NetworkPolicies plus the flows a Kamaji
//!   tenant control plane needs, a ResourceQuota and a LimitRange ([`isolation`] documents each
//!   object and default); with a namespace role, the worker's own RoleBinding there, through which
//!   alone it works in that namespace (`access`: how the chart confines the worker's account).
//! - Step 2, the tenant control plane: [`KamajiBackend`] implements [`ControlPlaneBackend`] with
//!   Kamaji's `TenantControlPlane` ([`kamaji`]).
//! - Step 3, joining machines: [`KubeTenantNodes`] implements [`TenantNodes`] against the tenant
//!   cluster's own API server, reached with the admin kubeconfig Kamaji wrote ([`nodes`]).
//! - Step 5 of a `ray` cluster: [`KubeRayDriver`] implements [`RayDriver`] with KubeRay's
//!   `RayCluster` ([`ray`]); step 5 of a `slurm` cluster is [`SlinkyDriver`] ([`slurm`]).
//! - Step 2, the tenant's own kubeconfig: [`KubeTenantCredentials`] implements
//!   [`TenantCredentials`]: a ServiceAccount bound to cluster-admin in the tenant cluster and a
//!   TokenRequest token with a TTL ([`credentials`]).
//!
//! Invariants: object names derive from our ids only; every write of a converged object is a
//! server-side apply with the one field manager `paddock`, made only when the object lacks one of
//! paddock's fields ([`apply`]: a converged cluster costs reads, no writes); a namespace labelled for another
//! cluster is never touched. Failures are [`KubeError`]s inside the crate and become
//! [`DriverError`]s (transient or permanent, a stable code) at the trait boundary.
//!
//! [`PlatformDriver`]: paddock_domain::driver::PlatformDriver
//! [`ControlPlaneBackend`]: paddock_domain::driver::ControlPlaneBackend
//! [`TenantNodes`]: paddock_domain::driver::TenantNodes
//! [`TenantCredentials`]: paddock_domain::driver::TenantCredentials
//! [`RayDriver`]: paddock_domain::driver::RayDriver
//! [`DriverError`]: paddock_domain::driver::DriverError

mod access;
pub mod apply;
pub mod credentials;
pub mod csr;
pub mod drain;
mod driver;
mod error;
pub mod isolation;
pub mod kamaji;
pub mod nodes;
pub mod ray;
pub mod slurm;
pub mod stack;
pub mod timeouts;

pub use credentials::KubeTenantCredentials;
pub use driver::KubePlatform;
pub use error::KubeError;
pub use isolation::IsolationSettings;
pub use kamaji::KamajiBackend;
pub use nodes::KubeTenantNodes;
pub use ray::KubeRayDriver;
pub use slurm::SlinkyDriver;
pub use stack::KubeTenantStack;
