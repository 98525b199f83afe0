//! Agent runs: the boot with the run's token and seed, and the end of a run.

use futures::FutureExt;
use paddock_domain::bmc::{BmcAccess, BmcDriver, BootMedia, PowerProgress};
use paddock_domain::model::Machine;
use paddock_service::agent::AgentRun;
use paddock_store::lifecycle;
use paddock_store::run::{self, Run};
use paddock_store::StoreError;
use paddock_types::agent::{AgentPurpose, AgentRunConfig};
use paddock_types::machine::MachineState;

use crate::metrics::{self};
use crate::Outcome;

use super::{MachineReconciler, Step, POWERING};

impl MachineReconciler {
    /// Issues the run's token (valid for `token_ttl`) and boots the machine from `image` with the
    /// run's seed; then records the boot. The tokens of an earlier boot of the same run end first.
    #[expect(clippy::too_many_arguments, reason = "the machine, its access and run, and what to boot for how long")]
    pub(super) async fn boot(
        &self,
        bmc: &dyn BmcDriver,
        m: &Machine,
        access: &BmcAccess,
        run: &Run,
        config: AgentRunConfig,
        image_url: String,
        token_ttl: std::time::Duration,
    ) -> Step {
        let purpose = config.purpose();
        // Issuing the boot's token ends the unused ones of the run's earlier boots.
        let agent_run = AgentRun { machine_id: m.id, run_id: run.run_id, config };
        let seed_token = match self.services.agent_token_issue(&agent_run, token_ttl).await {
            Ok(t) => t,
            Err(e) => return Step::Stop(Outcome::retry("agent_token", format!("issuing the run's token failed: {e}"))),
        };
        let media = BootMedia { image_url, seed_url: self.services.agent_seed_url(&seed_token) };
        // A wipe's (and an acceptance's) boot does not wait for the power: the power-off before
        // the media ends the run until it is through, the power-on is settled by the next runs.
        let booted = match purpose {
            AgentPurpose::Wipe | AgentPurpose::Acceptance => bmc.start_boot_from_media(access, &media).await,
            _ => bmc.boot_from_media(access, &media).await.map(|()| PowerProgress::Done),
        };
        match booted {
            Ok(PowerProgress::Done) => {}
            Ok(PowerProgress::Pending(after)) => {
                return Step::Stop(Outcome::wait(after, POWERING, "the machine is powering off before its boot"))
            }
            Err(e) => return self.bmc_failed(m, e).await,
        }
        let (state, version) = (m.state, m.status_version);
        self.guarded(m.id, |c, _| run::mark_booted(c, m.id, state, version).boxed()).await
    }

    pub(super) async fn expire_tokens(&self, current: &Run) -> Result<(), StoreError> {
        let mut conn = self.services.store().conn().await?;
        run::expire_unused_tokens(&mut conn, current.run_id).await
    }

    /// Ends the machine's run (guarded), moving it to `to` with `error` (code, message); a wipe
    /// that ends in `clean_failed` is counted once the move committed.
    pub(super) async fn end_run(
        &self,
        m: &Machine,
        to: MachineState,
        error: Option<(&str, &str)>,
        maintenance_reason: Option<&str>,
    ) -> Step {
        let (id, from, version) = (m.id, m.state, m.status_version);
        let code = error.map_or("clean_failed", |(code, _)| code);
        let error = error.map(|(code, message)| (code.to_owned(), message.to_owned()));
        let reason = maintenance_reason.map(str::to_owned);
        self.guarded_then(
            m.id,
            move |c, k| {
                async move {
                    let error = error.as_ref().map(|(code, message)| (code.as_str(), message.as_str()));
                    lifecycle::end_run(c, k, id, from, version, to, error, reason.as_deref()).await
                }
                .boxed()
            },
            |moved| {
                if moved && to == MachineState::CleanFailed {
                    metrics::observe(|w| w.wipe_failed(&m.machine_class, code));
                }
            },
        )
        .await
    }
}
