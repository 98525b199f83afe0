//! The machine lifecycle of docs/architecture.md as a transition table. The worker (and the API, for
//! operator actions) moves machines only along these edges, with a guarded update on the current
//! state, so every exit from a tenancy passes through cleaning.

use paddock_types::machine::MachineState;

use MachineState as S;

/// Whether a machine may move from `from` to `to`.
pub fn can_transition(from: MachineState, to: MachineState) -> bool {
    if to == S::Maintenance {
        // An operator may take any machine out of service, except a retired one. A machine that
        // holds a tenancy goes through releasing first; the worker handles that path.
        return !matches!(from, S::Retired | S::Maintenance);
    }
    matches!(
        (from, to),
        (S::Enrolling, S::Inspecting)
            | (S::Inspecting, S::Cleaning)
            | (S::Cleaning, S::Available)
            | (S::Cleaning, S::CleanFailed)
            | (S::Available, S::Allocated)
            | (S::Allocated, S::Provisioning)
            | (S::Allocated, S::Releasing)
            | (S::Provisioning, S::Active)
            | (S::Provisioning, S::ProvisionFailed)
            | (S::Provisioning, S::Releasing)
            | (S::Active, S::Releasing)
            | (S::Releasing, S::Cleaning)
            | (S::ProvisionFailed, S::Cleaning)
            | (S::Maintenance, S::Cleaning)
            | (S::Available | S::Maintenance | S::CleanFailed, S::Retired)
    )
}

/// The states in which a machine serves (or is being given to) its pool: what a pool *holds*.
pub const HELD: [MachineState; 3] = [S::Allocated, S::Provisioning, S::Active];

/// States from which a machine may be retired.
pub const RETIRABLE: [MachineState; 3] = [S::Available, S::Maintenance, S::CleanFailed];

/// The `last_error.code` of a record whose inspection found its system UUID held by another
/// record that is not retired: the same server enrolled twice. The record stays in `inspecting`,
/// is never powered or wiped (that would act on the other record's server, which may serve a
/// tenant), and can only be retired.
pub const DUPLICATE_SYSTEM: &str = "duplicate_system";

/// The state a duplicate record (see [`DUPLICATE_SYSTEM`]) waits in, and retires from.
pub const DUPLICATE_STATE: MachineState = S::Inspecting;

/// Whether the machine holds (or is being given to) a tenant.
pub fn holds_tenancy(state: MachineState) -> bool {
    matches!(state, S::Allocated | S::Provisioning | S::Active | S::Releasing | S::ProvisionFailed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exit_from_a_tenancy_passes_through_cleaning() {
        for from in MachineState::ALL.into_iter().filter(|s| holds_tenancy(*s)) {
            for to in MachineState::ALL {
                if can_transition(from, to) && !holds_tenancy(to) {
                    assert!(matches!(to, S::Cleaning | S::Maintenance), "{from:?} -> {to:?} skips cleaning");
                }
            }
        }
    }

    #[test]
    fn available_only_after_cleaning() {
        for from in MachineState::ALL {
            if can_transition(from, S::Available) {
                assert_eq!(from, S::Cleaning);
            }
        }
    }

    #[test]
    fn retire_only_from_retirable_states() {
        for from in MachineState::ALL {
            assert_eq!(can_transition(from, S::Retired), RETIRABLE.contains(&from), "{from:?}");
        }
    }
}
