//! The job kinds of the durable queue: stable snake_case names shared by the services that
//! enqueue jobs and the worker's handlers that run them.

/// Converges a machine to its record: lifecycle steps and operator intents.
pub const MACHINE_RECONCILE: &str = "machine_reconcile";
/// Converges a cluster and its node pools to their spec (deletion included).
pub const CLUSTER_RECONCILE: &str = "cluster_reconcile";
/// Keeps machines' power in line with their state: one fleet-wide job that reads the power of
/// machines in stable states, and per-machine jobs that correct a drift it found.
pub const POWER_SYNC: &str = "power_sync";
