//! The job kinds of the durable queue: stable snake_case names shared by the services that
//! enqueue jobs and the worker's handlers that run them, and the payloads they carry.

use paddock_types::{ClusterId, MachineId, TenantId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Converges a machine to its record: lifecycle steps and operator intents.
pub const MACHINE_RECONCILE: &str = "machine_reconcile";
/// Converges a cluster and its node pools to their spec (deletion included).
pub const CLUSTER_RECONCILE: &str = "cluster_reconcile";
/// Re-verifies a ready cluster at rest (`PADDOCK_DRIFT_INTERVAL`): the reconcile's steps, which
/// read everything and correct only what changed behind paddock's back; then queued again.
pub const CLUSTER_DRIFT_CHECK: &str = "cluster_drift_check";
/// Watches the demand of a cluster's autoscaled pools (`PADDOCK_AUTOSCALE_INTERVAL`) and moves
/// their targets; queued again while the cluster has an autoscaled pool. Its target is the
/// cluster, so it never runs beside the cluster's reconcile.
pub const CLUSTER_AUTOSCALE: &str = "cluster_autoscale";
/// Writes a `slurm` cluster's share of the tenant's people (its SCIM users and groups, mapped by
/// `slurm.accounts`) into the cluster's Slurm accounting: users, accounts, QOS and associations,
/// and takes out what paddock wrote that is no longer wanted or was changed behind its back. Woken
/// by every change of the tenant's people, by every reconcile run that finds Slurm ready and so by
/// every drift check; its target is the cluster, so it never runs beside the cluster's reconcile.
pub const CLUSTER_IDENTITY_SYNC: &str = "cluster_identity_sync";
/// Keeps machines' power in line with their state: one fleet-wide job that reads the power of
/// machines in stable states, and per-machine jobs that correct a drift it found.
pub const POWER_SYNC: &str = "power_sync";
/// Seals every encrypted value again under the current key, so older keys can be retired
/// (`paddock reseal` enqueues it).
pub const RESEAL: &str = "reseal";
/// Power-cycles a machine a tenant holds, at the tenant's request (off, then on from its disk);
/// its target is the machine, so it never runs beside the machine's reconcile.
pub const MACHINE_POWER_CYCLE: &str = "machine_power_cycle";

/// The payload of a machine's power cycle: the tenancy it was asked in (a machine that has left
/// it since is not cycled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PowerCycleJob {
    /// The machine.
    pub machine_id: MachineId,
    /// Its allocation when the tenant asked.
    pub allocation_id: uuid::Uuid,
}

impl Payload for PowerCycleJob {}

/// The payload of a cluster's reconcile job (its target is the cluster).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterJob {
    /// The cluster's tenant.
    pub tenant_id: TenantId,
    /// The cluster.
    pub cluster_id: ClusterId,
}

/// The payload of a machine's reconcile or power-correction job (its target is the machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineJob {
    /// The machine.
    pub machine_id: MachineId,
}

/// A job payload: written as JSON into the queue, read back typed by the job's handler.
pub trait Payload: Serialize + for<'de> Deserialize<'de> {
    /// The payload as stored.
    fn to_value(&self) -> Value {
        // A struct of ids serializes infallibly.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The payload of a stored job; an error names what is missing or malformed.
    fn from_value(value: &Value) -> Result<Self, serde_json::Error> {
        Self::deserialize(value)
    }
}

impl Payload for ClusterJob {}
impl Payload for MachineJob {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_and_a_malformed_one_says_what_is_wrong() {
        let job = ClusterJob { tenant_id: TenantId::new(), cluster_id: ClusterId::new() };
        assert_eq!(ClusterJob::from_value(&job.to_value()).expect("round trip"), job);
        let missing =
            ClusterJob::from_value(&serde_json::json!({ "cluster_id": job.cluster_id })).expect_err("no tenant");
        assert!(missing.to_string().contains("tenant_id"), "{missing}");
        let machine = MachineJob { machine_id: MachineId::new() };
        assert_eq!(machine.to_value(), serde_json::json!({ "machine_id": machine.machine_id }));
    }
}
