//! Progress: the step of its operation's plan a machine is at, reported as the reconciler goes,
//! through the store function the cluster reconciler reports with (`operation::progress`).

use paddock_domain::machine::RETIRABLE;
use paddock_domain::model::Machine;
use paddock_store::operation::{self, step::*};
use paddock_store::run::{Run, RunPurpose};
use paddock_store::StoreError;
use paddock_types::machine::MachineState;
use paddock_types::operation::{OperationState, OperationStep};

use super::MachineReconciler;

impl MachineReconciler {
    /// Reports `steps` (in order; a name no open operation plans is ignored) to the open
    /// operations on `m`.
    pub(super) async fn report(&self, m: &Machine, steps: &[(&str, OperationState)]) -> Result<(), StoreError> {
        let observed: Vec<OperationStep> = steps
            .iter()
            .map(|(name, state)| OperationStep {
                name: (*name).to_owned(),
                state: *state,
                started_at: None,
                finished_at: None,
            })
            .collect();
        let mut conn = self.services.store().conn().await?;
        operation::progress(&mut conn, &[m.id.uuid()], &observed).await
    }
}

/// Where the machine `m` (in `run`) is, as the steps of the plans: what the reconciler's next
/// step carries out is `running`, what the machine's state proves done `succeeded`. Every run is
/// the `reconcile` step of a change that only the run itself carries out (new credentials).
pub(super) fn position(m: &Machine, run: Option<&Run>) -> Vec<(&'static str, OperationState)> {
    use MachineState as S;
    use OperationState::{Failed, Running, Succeeded};
    let held = matches!(m.state, S::Allocated | S::Provisioning | S::Active);
    let leaving_tenancy = matches!(m.state, S::Releasing | S::ProvisionFailed)
        || (held && (m.maintenance_reason.is_some() || m.force_release_reason.is_some()));
    let wiped = run.is_some_and(|r| r.run_finished_at.is_some());
    let accepting = run.is_some_and(|r| r.run_purpose == RunPurpose::Acceptance.as_str());
    let at: &[(&'static str, OperationState)] = match m.state {
        S::Retired => &[(RETIRE, Succeeded)],
        _ if m.retire_requested && RETIRABLE.contains(&m.state) => &[(RETIRE, Running)],
        _ if leaving_tenancy => &[(RELEASE, Running)],
        // The operator's maintenance ended: it leaves through cleaning.
        S::Maintenance if m.maintenance_reason.is_none() => &[(CLEAN, Running)],
        // The acceptance failed: the machine waits in maintenance for its operator.
        S::Maintenance if super::accept::failed(m) => {
            &[(CLEAN, Succeeded), (ACCEPTANCE, Failed), (POWER_OFF, Succeeded), (MAINTENANCE, Succeeded)]
        }
        S::Maintenance => &[(POWER_OFF, Succeeded), (MAINTENANCE, Succeeded)],
        _ if m.maintenance_reason.is_some() && !held => &[(RELEASE, Succeeded), (POWER_OFF, Running)],
        S::Enrolling => &[(INSPECT, Running)],
        S::Inspecting => &[(INSPECT, Succeeded), (RECORD_INVENTORY, Running)],
        S::Cleaning if accepting => {
            &[(RELEASE, Succeeded), (RECORD_INVENTORY, Succeeded), (CLEAN, Succeeded), (ACCEPTANCE, Running)]
        }
        // Wiped: what comes next (the acceptance, or `available`) shows once the write is made.
        S::Cleaning if wiped => &[(RELEASE, Succeeded), (RECORD_INVENTORY, Succeeded), (CLEAN, Succeeded)],
        S::Cleaning => &[(RELEASE, Succeeded), (RECORD_INVENTORY, Succeeded), (CLEAN, Running)],
        S::Available => &[(CLEAN, Succeeded), (ACCEPTANCE, Succeeded), (AVAILABLE, Succeeded)],
        S::CleanFailed => &[(CLEAN, Failed)],
        S::Allocated | S::Provisioning | S::Active => &[],
        // Covered by `leaving_tenancy`.
        S::Releasing | S::ProvisionFailed => &[],
    };
    let mut steps = vec![(RECONCILE, Running)];
    steps.extend_from_slice(at);
    steps
}
