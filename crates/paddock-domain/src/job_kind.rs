//! The job kinds of the durable queue: stable snake_case names shared by the services that
//! enqueue jobs and the worker's handlers that run them.

/// Converges a machine to its record: lifecycle steps and operator intents.
pub const MACHINE_RECONCILE: &str = "machine_reconcile";
/// Converges a cluster and its node pools to their spec (deletion included).
pub const CLUSTER_RECONCILE: &str = "cluster_reconcile";
