//! Health signals paddock reads from a tenant's cluster, as pure rules: what a Slurm node's drain
//! says of its machine.
//!
//! A tenant's admin reports a broken node from Slurm by draining it with a reason that starts
//! with [`SLURM_FAULT_PREFIX`] (`scontrol update nodename=<node> state=drain reason="paddock:hw:
//! GPU 3 ECC errors"`). paddock reads the cluster's nodes through slurmrestd and records a
//! `failed` health report (source `slurm`) on the machine the node runs on, which starts its
//! replacement. Only that prefix is a fault: paddock's own drain reasons (`paddock:release: ...`,
//! written when it releases or replaces a machine), the Slinky operator's (`slurm-operator: ...`)
//! and any other reason the tenant writes are never read back as one.

use paddock_types::health::HealthStatus;

/// The prefix of a Slurm drain reason by which a tenant reports a machine's fault to paddock.
pub const SLURM_FAULT_PREFIX: &str = "paddock:hw:";

/// The reason paddock drains the Slurm node of a machine it releases or replaces with.
pub const SLURM_RELEASE_REASON: &str = "paddock:release: machine released";

/// What a Slurm node with the state flags `states` (slurmrestd's `nodes[].state`, e.g. `IDLE`,
/// `DRAIN`) and `reason` says of its machine: `failed` when it drains (DRAIN, whatever its jobs)
/// with a reason that starts with [`SLURM_FAULT_PREFIX`]; `healthy` when it neither drains nor is
/// down (the tenant resumed it); nothing otherwise (drained or down for another reason).
pub fn slurm_node_rating(states: &[String], reason: &str) -> Option<HealthStatus> {
    let has = |flag: &str| states.iter().any(|s| s.eq_ignore_ascii_case(flag));
    if has("DRAIN") {
        reason.trim_start().starts_with(SLURM_FAULT_PREFIX).then_some(HealthStatus::Failed)
    } else if has("DOWN") {
        None
    } else {
        Some(HealthStatus::Healthy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(states: &[&str], reason: &str) -> Option<HealthStatus> {
        let states: Vec<String> = states.iter().map(|s| (*s).to_owned()).collect();
        slurm_node_rating(&states, reason)
    }

    #[test]
    fn only_a_drain_with_the_fault_prefix_is_a_failure() {
        assert_eq!(rate(&["IDLE", "DRAIN"], "paddock:hw: GPU 3 ECC errors"), Some(HealthStatus::Failed));
        assert_eq!(rate(&["ALLOCATED", "DRAIN"], " paddock:hw:nvlink"), Some(HealthStatus::Failed));
        assert_eq!(rate(&["DOWN", "DRAIN"], "paddock:hw: no slurmd"), Some(HealthStatus::Failed));
        // paddock's own drains, the operator's, and the tenant's other reasons are no fault.
        assert_eq!(rate(&["IDLE", "DRAIN"], SLURM_RELEASE_REASON), None);
        assert_eq!(rate(&["IDLE", "DRAIN"], "slurm-operator: Pod (slurm/cpu-1) was cordoned"), None);
        assert_eq!(rate(&["IDLE", "DRAIN"], "maintenance window"), None);
        assert_eq!(rate(&["IDLE", "DRAIN"], "PADDOCK:HW: shouting"), None);
        assert_eq!(rate(&["IDLE", "DRAIN"], ""), None);
        // The prefix without a drain (a reason left on a resumed node) is no fault either.
        assert_eq!(rate(&["IDLE"], "paddock:hw: fixed"), Some(HealthStatus::Healthy));
        assert_eq!(rate(&["DOWN"], "Not responding"), None);
        assert_eq!(rate(&["MIXED"], ""), Some(HealthStatus::Healthy));
    }
}
