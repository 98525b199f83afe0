//! What the tenant cluster says of its machines' health, each rating recorded once, when it
//! changes:
//! - its Kubernetes: a Node that has not been Ready for longer than
//!   `PADDOCK_NODE_NOT_READY_GRACE` is a `failed` health report (source `kubernetes`), the same
//!   Node Ready again a `healthy` one;
//! - its Slurm (`kind: slurm`, once Slurm is ready): a machine's Slurm node drained with a reason
//!   that starts with `paddock:hw:` is a `failed` report (source `slurm`), the node no longer
//!   drained a `healthy` one ([`paddock_domain::health::slurm_node_rating`]). A drain stays one
//!   rating however many runs see it, so it is recorded once; a drain for any other reason
//!   (paddock's own `paddock:release: ...` among them) rates nothing.
//!
//! The same read of the Slurm nodes sets the cluster's `SlurmNodesUp`: a node Slurm holds down
//! (after an unexpected reboot, a slurmd that stopped answering, a tenant's `state=down`) is no
//! health report, since the machine may well be sound, but the tenant sees it in the status.

use chrono::{DateTime, Utc};
use paddock_domain::cluster::Cluster;
use paddock_domain::driver::{node_name, KubeDrivers, RegisteredNode, SlurmNodeState, SlurmVersion, TenantAccess};
use paddock_domain::health::slurm_node_rating;
use paddock_store::allocation::HeldMachine;
use paddock_store::{health, StoreError};
use paddock_types::cluster::ClusterKind;
use paddock_types::health::{HealthCheck, HealthSource, HealthStatus};
use paddock_types::machine::MachineState;
use paddock_types::MachineId;
use tracing::{info, warn};

use super::{ClusterReconciler, Observed, SLURM_NODES_UP, SLURM_NODE_DOWN};

/// The check of a report from the tenant's Kubernetes.
const NODE_READY_CHECK: &str = "kubernetes.node_ready";

/// The check of a report from the tenant's Slurm.
const SLURM_DRAIN_CHECK: &str = "slurm.node_drain";

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
        self.record(HealthSource::Kubernetes, &ratings).await
    }

    /// Records the ratings of the active machines by their Slurm nodes, read through slurmrestd.
    /// Best effort: a read that fails is logged and made again at the next run (a reconcile or
    /// the drift check of a cluster at rest).
    pub(super) async fn slurm_health(
        &self,
        kube: &KubeDrivers,
        cluster: &Cluster,
        held: &[HeldMachine],
        access: &TenantAccess,
        observed: &mut Observed,
    ) -> Result<(), StoreError> {
        let (ClusterKind::Slurm, Some(slurm)) = (cluster.spec.kind, &cluster.spec.slurm) else {
            return Ok(());
        };
        let version = SlurmVersion { stack_version: cluster.stack_version.clone(), version: slurm.version.clone() };
        let states = match kube.slurm.node_states(access, &version).await {
            Ok(states) => states,
            Err(e) => {
                let chain = paddock_domain::error::chain(&e);
                warn!(cluster.id = %cluster.id, "the Slurm nodes of cluster {} could not be read: {chain}", cluster.id);
                return Ok(());
            }
        };
        slurm_nodes_up(held, &states, observed);
        self.record(HealthSource::Slurm, &slurm_ratings(held, &states)).await
    }

    /// Records the `source`'s ratings that changed; a failed one starts its machine's remediation
    /// in the same transaction.
    async fn record(&self, source: HealthSource, ratings: &[(MachineId, HealthCheck)]) -> Result<(), StoreError> {
        if ratings.is_empty() {
            return Ok(());
        }
        let mut tx = self.services.store().begin().await?;
        let key = self.services.ledger_key();
        let written = health::record_changes(&mut tx, key, source, ratings).await?;
        tx.commit().await?;
        if written > 0 {
            let source = source.as_str();
            info!(reports = written, "recorded {written} health report(s) from the tenant cluster ({source})");
        }
        Ok(())
    }
}

/// `SlurmNodesUp` from the Slurm nodes of the active machines: false while Slurm holds one
/// `DOWN`, naming each with Slurm's reason, and a `Warning` event when it turns false.
fn slurm_nodes_up(held: &[HeldMachine], states: &[SlurmNodeState], observed: &mut Observed) {
    const NAMED: usize = 5;
    let mut down: Vec<String> = on_active(held, states)
        .flat_map(|(_, on)| on)
        .filter(|s| s.states.iter().any(|f| f.eq_ignore_ascii_case("DOWN")))
        .map(|s| match s.reason.trim() {
            "" => format!("{} on {}", s.slurm_node, s.node_name),
            reason => format!("{} on {} ({reason})", s.slurm_node, s.node_name),
        })
        .collect();
    if down.is_empty() {
        observed.set(SLURM_NODES_UP, true, "Up", "no node of the cluster's machines is down in Slurm");
        return;
    }
    down.sort();
    let mut message = format!("down in Slurm: {}", down[..down.len().min(NAMED)].join("; "));
    if down.len() > NAMED {
        message.push_str(&format!(" and {} more", down.len() - NAMED));
    }
    let was_down = observed.has_reason(SLURM_NODES_UP, SLURM_NODE_DOWN);
    observed.set(SLURM_NODES_UP, false, SLURM_NODE_DOWN, &message);
    if !was_down {
        observed.events.push(("Warning", SLURM_NODE_DOWN, message));
    }
}

/// Each active machine's rating by the Slurm node(s) on its Node: failed if one of them says so,
/// else healthy if one does; none when no node rates it.
fn slurm_ratings(held: &[HeldMachine], states: &[SlurmNodeState]) -> Vec<(MachineId, HealthCheck)> {
    on_active(held, states)
        .filter_map(|(m, on)| {
            let rated: Vec<(HealthStatus, &SlurmNodeState)> =
                on.filter_map(|s| Some((slurm_node_rating(&s.states, &s.reason)?, s))).collect();
            let (status, s) =
                rated.iter().find(|(status, _)| *status == HealthStatus::Failed).or_else(|| rated.first()).copied()?;
            let detail = match status {
                HealthStatus::Failed => format!("Slurm node {} drained: {}", s.slurm_node, s.reason.trim()),
                _ => format!("Slurm node {} is not drained", s.slurm_node),
            };
            Some((m.id, HealthCheck { name: SLURM_DRAIN_CHECK.into(), status, detail }))
        })
        .collect()
}

/// Each active machine with the Slurm nodes on its Node (matched by the Node's name).
fn on_active<'a>(
    held: &'a [HeldMachine],
    states: &'a [SlurmNodeState],
) -> impl Iterator<Item = (&'a HeldMachine, impl Iterator<Item = &'a SlurmNodeState>)> {
    held.iter().filter(|m| m.state == MachineState::Active).map(move |m| {
        let node = m.node_name.clone().unwrap_or_else(|| node_name(m.id));
        (m, states.iter().filter(move |s| s.node_name == node))
    })
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
    use paddock_types::cluster::ConditionStatus;

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

    fn slurm_node(node: &str, slurm_node: &str, states: &[&str], reason: &str) -> SlurmNodeState {
        SlurmNodeState {
            slurm_node: slurm_node.into(),
            node_name: node.into(),
            states: states.iter().map(|s| (*s).to_owned()).collect(),
            reason: reason.into(),
        }
    }

    #[test]
    fn a_slurm_node_rates_the_machine_on_its_node_and_paddocks_own_drain_rates_nothing() {
        let held = [machine("a"), machine("b"), machine("c"), machine("d"), machine("e")];
        let node = |i: usize| node_name(held[i].id);
        let mut releasing = machine("f");
        releasing.state = MachineState::Releasing;
        let states = [
            slurm_node(&node(0), "cpu-0", &["IDLE", "DRAIN"], "paddock:hw: GPU 3 ECC errors"),
            slurm_node(&node(1), "cpu-1", &["IDLE"], ""),
            slurm_node(&node(2), "cpu-2", &["IDLE", "DRAIN"], paddock_domain::health::SLURM_RELEASE_REASON),
            slurm_node(&node(3), "cpu-3", &["IDLE", "DRAIN"], "slurm-operator: Pod (slurm/cpu-3) was cordoned"),
            slurm_node(&node_name(releasing.id), "cpu-5", &["IDLE", "DRAIN"], "paddock:hw: x"),
        ];
        let all: Vec<HeldMachine> = held.iter().cloned().chain([releasing]).collect();
        let rated = slurm_ratings(&all, &states);
        let rated: Vec<(MachineId, HealthStatus, &str)> =
            rated.iter().map(|(m, c)| (*m, c.status, c.detail.as_str())).collect();
        assert_eq!(
            rated,
            [
                (held[0].id, HealthStatus::Failed, "Slurm node cpu-0 drained: paddock:hw: GPU 3 ECC errors"),
                (held[1].id, HealthStatus::Healthy, "Slurm node cpu-1 is not drained"),
            ]
        );
    }

    fn observed() -> Observed {
        Observed {
            conditions: Vec::new(),
            endpoints: Default::default(),
            events: Vec::new(),
            now: Utc::now(),
            changed: Vec::new(),
            faulted: false,
            scaling: false,
        }
    }

    #[test]
    fn a_node_down_in_slurm_shows_in_the_status_with_one_event_until_it_is_up() {
        let held = [machine("a"), machine("b")];
        let mut releasing = machine("c");
        releasing.state = MachineState::Releasing;
        let node = |m: &HeldMachine| node_name(m.id);
        let all: Vec<HeldMachine> = held.iter().cloned().chain([releasing.clone()]).collect();
        let states = [
            slurm_node(&node(&held[0]), "cpu-0", &["IDLE", "DRAIN"], "maintenance window"),
            slurm_node(&node(&held[1]), "cpu-1", &["DOWN"], "Node unexpectedly rebooted"),
            slurm_node(&node(&releasing), "cpu-2", &["DOWN", "DRAIN"], "paddock:release: machine released"),
        ];
        let mut o = observed();
        slurm_nodes_up(&all, &states, &mut o);
        let c = o.conditions.iter().find(|c| c.type_ == SLURM_NODES_UP).expect("the condition");
        let message = format!("down in Slurm: cpu-1 on {} (Node unexpectedly rebooted)", node(&held[1]));
        assert_eq!(
            (c.status, c.reason.as_str(), c.message.as_str()),
            (ConditionStatus::False, SLURM_NODE_DOWN, message.as_str())
        );
        assert_eq!(o.events, [("Warning", SLURM_NODE_DOWN, message.clone())]);
        // Read again, still down: no second event.
        o.events.clear();
        slurm_nodes_up(&all, &states, &mut o);
        assert!(o.events.is_empty(), "{:?}", o.events);
        // Resumed by the tenant: up again.
        let resumed = [slurm_node(&node(&held[1]), "cpu-1", &["IDLE"], "")];
        slurm_nodes_up(&all, &resumed, &mut o);
        let c = o.conditions.iter().find(|c| c.type_ == SLURM_NODES_UP).expect("the condition");
        assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::True, "Up"));
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
