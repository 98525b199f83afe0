//! The Kubernetes driver of paddock (kube-rs + k8s-openapi): what the worker does on the
//! **platform** cluster for each tenant cluster (SPEC section 6).
//!
//! This first piece owns step 1, isolation: one namespace per tenant cluster, named from the
//! cluster id, with default-deny NetworkPolicies plus the flows a Kamaji tenant control plane
//! needs, a ResourceQuota and a LimitRange ([`isolation`] documents each object and default).
//! Invariants: object names derive from our ids only; every write is a server-side apply with the
//! one field manager `paddock`; a namespace labelled for another cluster is never touched.
//!
//! Step 2, the tenant control plane, sits behind [`ControlPlaneBackend`] ([`control_plane`]),
//! implemented with Kamaji's `TenantControlPlane` by [`KamajiBackend`] ([`kamaji`]).
//!
//! The [`PlatformDriver`] and [`ControlPlaneBackend`] traits are defined here for now and move to
//! `paddock-domain` later.

pub mod control_plane;
mod driver;
mod error;
pub mod isolation;
pub mod kamaji;
pub mod platform;

pub use control_plane::{ControlPlaneBackend, ControlPlaneSpec, ControlPlaneStatus, ServiceType};
pub use driver::KubePlatform;
pub use error::KubeError;
pub use isolation::IsolationSettings;
pub use kamaji::KamajiBackend;
pub use platform::{ClusterRef, Isolation, PlatformDriver, Removal};
