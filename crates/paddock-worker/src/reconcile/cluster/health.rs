//! What the tenant cluster says of its machines' health: a Node that has not been Ready for
//! longer than `PADDOCK_NODE_NOT_READY_GRACE` is a `failed` health report (source `kubernetes`),
//! the same Node Ready again a `healthy` one. Each rating is recorded once, when it changes.

use chrono::{DateTime, Utc};
use paddock_domain::driver::RegisteredNode;
use paddock_store::allocation::HeldMachine;
use paddock_store::{health, StoreError};
use paddock_types::health::{HealthCheck, HealthSource, HealthStatus};
use paddock_types::machine::MachineState;
use paddock_types::MachineId;
use tracing::info;

use super::ClusterReconciler;

/// The check of a report from the tenant's Kubernetes.
const NODE_READY_CHECK: &str = "kubernetes.node_ready";

impl ClusterReconciler {
    /// Records the ratings of the active machines whose Node is registered: Ready (healthy), or
    /// not Ready for longer than the grace (failed). A Node within the grace, or one that never
    /// registered, rates nothing yet.
    pub(super) async fn node_health(
        &self,
        held: &[HeldMachine],
        registered: &[RegisteredNode],
    ) -> Result<(), StoreError> {
        let ratings = ratings(held, registered, self.settings.node_not_ready_grace, Utc::now());
        if ratings.is_empty() {
            return Ok(());
        }
        // A failed rating starts a remediation in the same transaction.
        let mut tx = self.services.store().begin().await?;
        let key = self.services.ledger_key();
        let written = health::record_changes(&mut tx, key, HealthSource::Kubernetes, &ratings).await?;
        tx.commit().await?;
        if written > 0 {
            info!(reports = written, "recorded {written} health report(s) from the tenant cluster's Nodes");
        }
        Ok(())
    }
}

/// Each active machine's rating by its Node (matched by system UUID) at `now`.
fn ratings(
    held: &[HeldMachine],
    registered: &[RegisteredNode],
    grace: std::time::Duration,
    now: DateTime<Utc>,
) -> Vec<(MachineId, HealthCheck)> {
    let grace = chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::MAX);
    held.iter()
        .filter(|m| m.state == MachineState::Active)
        .filter_map(|m| {
            let uuid = m.system_uuid.as_deref()?.trim();
            let node = registered.iter().find(|n| !uuid.is_empty() && n.system_uuid.eq_ignore_ascii_case(uuid))?;
            let (status, detail) = match (node.ready, node.not_ready_since) {
                (true, _) => (HealthStatus::Healthy, format!("Node {} is Ready", node.name)),
                (false, Some(since)) if now - since >= grace => (
                    HealthStatus::Failed,
                    format!("Node {} has not been Ready since {}", node.name, since.to_rfc3339()),
                ),
                _ => return None,
            };
            Some((m.id, HealthCheck { name: NODE_READY_CHECK.into(), status, detail }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(uuid: &str) -> HeldMachine {
        HeldMachine {
            id: MachineId::new(),
            node_pool_id: paddock_types::NodePoolId::new(),
            state: MachineState::Active,
            status_version: 1,
            node_name: None,
            system_uuid: Some(uuid.into()),
        }
    }

    fn node(uuid: &str, ready: bool, since: Option<DateTime<Utc>>) -> RegisteredNode {
        RegisteredNode { name: format!("m-{uuid}"), system_uuid: uuid.to_uppercase(), ready, not_ready_since: since }
    }

    #[test]
    fn a_node_rates_its_machine_only_past_the_grace_and_when_ready() {
        let now = Utc::now();
        let grace = std::time::Duration::from_secs(300);
        let held = [machine("a"), machine("b"), machine("c"), machine("d"), machine("e")];
        let registered = [
            node("a", true, None),
            node("b", false, Some(now - chrono::Duration::seconds(301))),
            node("c", false, Some(now - chrono::Duration::seconds(299))),
            node("d", false, None),
        ];
        let rated: Vec<(MachineId, HealthStatus)> =
            ratings(&held, &registered, grace, now).into_iter().map(|(m, c)| (m, c.status)).collect();
        assert_eq!(rated, [(held[0].id, HealthStatus::Healthy), (held[1].id, HealthStatus::Failed)]);
    }
}
