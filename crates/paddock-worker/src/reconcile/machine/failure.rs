//! Failures: a driver's or the store's, recorded on the machine, and the wait that follows.

use std::time::Duration;

use chrono::Utc;
use paddock_domain::bmc::{BmcError, BmcErrorKind, NO_SECOND_VIRTUAL_MEDIA, SYSTEM_UUID_MISMATCH};
use paddock_domain::driver::DriverError;
use paddock_domain::model::Machine;
use paddock_store::{machine, StoreError};
use paddock_types::machine::{LastError, MachineState};

use crate::metrics::{self, Driver};
use crate::Outcome;

use super::{MachineReconciler, Step, BMC_FIX_WAIT};

impl MachineReconciler {
    /// Records `code` on the machine (guarded) and waits long: only a spec change fixes it.
    pub(super) async fn wait_for_fix(&self, m: &Machine, code: &str, message: &str) -> Step {
        self.wait_with(m, BMC_FIX_WAIT, code, message).await
    }

    /// Records `code` on the machine (guarded) and waits `after`.
    pub(super) async fn wait_with(&self, m: &Machine, after: Duration, code: &str, message: &str) -> Step {
        if let Err(e) = self.record_error(m, code, message).await {
            return e.into();
        }
        Step::Stop(Outcome::wait(after, code, message))
    }

    pub(super) async fn bmc_failed(&self, m: &Machine, e: BmcError) -> Step {
        use MachineState as S;
        metrics::driver_failed(Driver::Bmc, &e.code);
        // A BMC that cannot do what the lifecycle needs, or another system behind the BMC:
        // out of service with the reason, through the path the state allows.
        if e.code == NO_SECOND_VIRTUAL_MEDIA || e.code == SYSTEM_UUID_MISMATCH {
            let reason =
                if e.code == NO_SECOND_VIRTUAL_MEDIA { NO_SECOND_VIRTUAL_MEDIA.to_owned() } else { e.message.clone() };
            match m.state {
                S::Cleaning | S::Enrolling | S::Inspecting => {
                    return self.end_run(m, S::Maintenance, Some((&e.code, &e.message)), Some(&reason)).await;
                }
                S::Allocated | S::Provisioning => return self.provision_failed(m, &e.code, &e.message).await,
                _ => {}
            }
        }
        match e.kind {
            // A retry cannot help: wait for the credentials or system_id PATCH (which enqueues
            // a new job) and look again only after a long while.
            BmcErrorKind::AuthFailed
            | BmcErrorKind::AmbiguousSystem
            | BmcErrorKind::CapabilityGap
            | BmcErrorKind::Permanent => {
                // The open operations cannot get further without that fix: they end `failed`
                // with the BMC's problem (the PATCH that fixes it opens its own).
                if let Err(se) = self.fail_operations(m, &e).await {
                    return se.into();
                }
                self.wait_for_fix(m, &e.code, &e.message).await
            }
            BmcErrorKind::Transient => {
                if let Err(se) = self.record_error(m, &e.code, &e.message).await {
                    return se.into();
                }
                Step::Stop(Outcome::retry(e.code, e.message))
            }
        }
    }

    pub(super) async fn driver_failed(&self, m: &Machine, e: DriverError) -> Step {
        metrics::driver_failed(Driver::Kube, &e.code);
        if let Err(se) = self.record_error(m, &e.code, &e.message).await {
            return se.into();
        }
        if e.is_transient() {
            Step::Stop(Outcome::retry(e.code, e.message))
        } else {
            Step::Stop(Outcome::wait(self.settings.poll.max(Duration::from_secs(60)), e.code, e.message))
        }
    }

    async fn fail_operations(&self, m: &Machine, e: &BmcError) -> Result<(), StoreError> {
        let mut conn = self.services.store().conn().await?;
        let problem = crate::failed_problem(409, e.code.clone(), format!("the machine's BMC: {}", e.message));
        paddock_store::operation::fail_open(&mut conn, &[m.id.uuid()], &problem).await
    }

    async fn record_error(&self, m: &Machine, code: &str, message: &str) -> Result<(), StoreError> {
        let mut conn = self.services.store().conn().await?;
        let error = LastError { code: code.to_owned(), message: message.to_owned(), at: Utc::now() };
        // Guarded: a machine someone else moved on keeps its own status.
        machine::set_last_error_guarded(&mut conn, m.id, m.state, m.status_version, Some(&error)).await?;
        Ok(())
    }
}
