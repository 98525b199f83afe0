//! Release: drain (Slurm, then the Node by eviction), power off, remove the Node and its Lease and
//! any bootstrap token left, end the tenancy; forced when it takes too long.

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::FutureExt;
use paddock_domain::bmc::BmcDriver;
use paddock_domain::driver::{Drain, KubeDrivers, NodeRef, Removal, SlurmDrain, SlurmVersion, TenantAccess};
use paddock_domain::model::Machine;
use paddock_store::cluster;
use paddock_store::lifecycle;
use paddock_store::remediation;
use paddock_store::run::{self};
use paddock_types::cluster::ClusterKind;
use serde_json::json;

use crate::metrics::{self, Driver};
use crate::Outcome;

use super::{ttl, MachineReconciler, Step, RELEASE_POWER_OFF_FAILED};

/// How long a forced release waits for the tenant API server to take the deletes of the Node
/// and its Lease (best effort: the release goes on either way).
const ABANDON_BOUND: Duration = Duration::from_secs(30);

impl MachineReconciler {
    /// `releasing` / `provision_failed` -> `cleaning`: drain the Slurm node and the Node, power
    /// off, remove the Node and its Lease and the machine's bootstrap tokens, end the tenancy.
    /// Every step checks its postcondition, so a repeat is harmless.
    /// Bounded by `PADDOCK_RELEASE_TIMEOUT` (docs/architecture.md): after it, or at once when an
    /// operator asks, the release is forced ([`Self::force_release`]); nothing a tenant does
    /// inside its cluster can keep the machine out of cleaning.
    pub(super) async fn release(&self, bmc: &dyn BmcDriver, m: &Machine) -> Step {
        let clock = {
            let mut conn = match self.services.store().conn().await {
                Ok(c) => c,
                Err(e) => return e.into(),
            };
            match lifecycle::release_clock(&mut conn, m.id).await {
                Ok(Some(clock)) => clock,
                // The tenancy ended under us (a race): read the machine again.
                Ok(None) => return Step::Again,
                Err(e) => return e.into(),
            }
        };
        let deadline = clock.started_at + ttl(self.settings.release_timeout);
        let forcing = if clock.forced_at.is_some() {
            Some(Forcing::Recorded)
        } else if let Some(reason) = &m.force_release_reason {
            Some(Forcing::Operator(reason.clone()))
        } else if Utc::now() >= deadline {
            Some(Forcing::Timeout(clock.started_at))
        } else {
            None
        };
        match forcing {
            Some(forcing) => self.force_release(bmc, m, forcing).await,
            // A wait (a drain, a terminating Node, a permanent driver error) never outlasts the
            // deadline: the job is back when the release is due to be forced.
            None => cap_wait(self.release_in_time(bmc, m).await, deadline),
        }
    }

    /// The release before its deadline (docs/architecture.md, "Release"): drain (Slurm first,
    /// then the Node: cordoned, its pods evicted), power off, and only then delete the Node, its
    /// Lease and any bootstrap token of the machine still there; cleaning. A repeat (the Node
    /// still terminating) finds the Node cordoned and emptied and the machine off, so it goes
    /// straight on; whatever it has to wait for, the deadline forces.
    async fn release_in_time(&self, bmc: &dyn BmcDriver, m: &Machine) -> Step {
        let tenant_side = match self.drivers.kube.clone() {
            Some(kube) => match self.tenant_side(m).await {
                Ok(found) => found.map(|side| (kube, side)),
                Err(e) => return e.into(),
            },
            None => None,
        };
        // The control plane never came up (or is gone): no node to drain or remove.
        if let Some((kube, (tenant, node))) = &tenant_side {
            if let Some(step) = self.drain(kube, m, tenant, node).await {
                return step;
            }
        }
        let access = match self.access(m) {
            Ok(a) => a,
            Err(step) => return step,
        };
        // A machine that never got a UUID recorded was never booted by us: nothing to power off.
        if access.system_uuid.is_some() {
            if let Err(e) = bmc.power_off(&access).await {
                return self.bmc_failed(m, e).await;
            }
        }
        if let Some((kube, (tenant, node))) = &tenant_side {
            if let Some(step) = self.remove_node(kube, m, tenant, node).await {
                return step;
            }
        }
        self.end_tenancy(m, None).await
    }

    /// The forced release (docs/security.md): first recorded (ledger entry with the reason, the
    /// usage segment closed: the machine leaves the tenant's control at this moment), then the
    /// power-off through the BMC, then the Node and its Lease deleted best effort, then cleaning;
    /// a failed power-off ends the tenancy in maintenance with `release_power_off_failed`. Each
    /// step is idempotent, so a crash anywhere repeats it harmlessly.
    async fn force_release(&self, bmc: &dyn BmcDriver, m: &Machine, forcing: Forcing) -> Step {
        if let Some((reason, evidence)) = forcing.describe(m, self.settings.release_timeout) {
            tracing::warn!(machine.id = %m.id, "forcing the release of machine {}: {reason}", m.id);
            let (id, state, version) = (m.id, m.state, m.status_version);
            return self
                .guarded(m.id, move |c, k| {
                    async move { lifecycle::record_forced_release(c, k, id, state, version, &reason, &evidence).await }
                        .boxed()
                })
                .await;
        }
        let powered_off = match self.access(m) {
            Ok(access) if access.system_uuid.is_none() => Ok(()),
            Ok(access) => bmc.power_off(&access).await.map_err(|e| {
                metrics::driver_failed(Driver::Bmc, &e.code);
                tracing::error!(machine.id = %m.id, error = %e, "the forced release could not power machine {} off", m.id);
                format!("the BMC did not power the machine off ({}): {}", e.code, e.message)
            }),
            Err(_) => Err("the BMC password cannot be opened, so the machine could not be powered off".to_owned()),
        };
        self.abandon_node(m).await;
        match powered_off {
            Ok(()) => self.end_tenancy(m, None).await,
            Err(message) => self.end_tenancy(m, Some((RELEASE_POWER_OFF_FAILED, &message))).await,
        }
    }

    /// Deletes the machine's Node and its Lease, then its bootstrap tokens, best effort and
    /// bounded in time: a tenant API server that refuses or does not answer no longer holds the
    /// machine.
    async fn abandon_node(&self, m: &Machine) {
        let Some(kube) = self.drivers.kube.clone() else { return };
        let (tenant, node) = match self.tenant_side(m).await {
            Ok(Some(found)) => found,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(machine.id = %m.id, error = %e, "the forced release skips the node of machine {}", m.id);
                return;
            }
        };
        let deletes = async {
            let abandoned = kube.nodes.abandon_node(&tenant, &node).await;
            abandoned.and(kube.nodes.delete_join_tokens(&tenant, &node).await)
        };
        match tokio::time::timeout(ABANDON_BOUND, deletes).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                metrics::driver_failed(Driver::Kube, &e.code);
                tracing::warn!(
                    machine.id = %m.id,
                    error = %e,
                    "the forced release could not delete node {} of machine {}; it goes on",
                    node.node_name,
                    m.id
                );
            }
            Err(_) => tracing::warn!(
                machine.id = %m.id,
                "the tenant API server did not answer the forced release's deletes of node {} within {ABANDON_BOUND:?}",
                node.node_name
            ),
        }
    }

    /// Ends the tenancy (guarded): its run's unused tokens end, then cleaning, or maintenance
    /// with `failure` (code, message).
    async fn end_tenancy(&self, m: &Machine, failure: Option<(&str, &str)>) -> Step {
        let (id, state, version) = (m.id, m.state, m.status_version);
        let failure = failure.map(|(code, message)| (code.to_owned(), message.to_owned()));
        self.guarded(m.id, move |c, k| {
            async move {
                if let Some(current) = run::run_of(c, id).await? {
                    run::expire_unused_tokens(c, current.run_id).await?;
                }
                // A machine being replaced goes to maintenance, whatever ended its tenancy.
                remediation::keep_out_of_service(c, id).await?;
                match &failure {
                    None => lifecycle::finish_release(c, k, id, state, version).await,
                    Some((code, message)) => {
                        let failure = (code.as_str(), message.as_str());
                        lifecycle::end_tenancy_in_maintenance(c, k, id, state, version, failure).await
                    }
                }
            }
            .boxed()
        })
        .await
    }

    /// Drains the machine's node (Slurm first, for a Slurm cluster, then the Node by eviction);
    /// `Some` to stop (waiting, or a failure).
    async fn drain(&self, kube: &KubeDrivers, m: &Machine, tenant: &TenantAccess, node: &NodeRef) -> Option<Step> {
        let slurm = {
            let mut conn = match self.services.store().conn().await {
                Ok(c) => c,
                Err(e) => return Some(e.into()),
            };
            let (Some(t), Some(c)) = (m.tenant_id, m.cluster_id) else { return None };
            match cluster::get(&mut conn, t, c).await {
                // The Slurm it runs: its release's pinned slurmrestd version is the drain's.
                Ok(found) => found.and_then(|c| match (c.spec.kind, c.spec.slurm) {
                    (ClusterKind::Slurm, Some(s)) => {
                        Some(SlurmVersion { stack_version: c.stack_version, version: s.version })
                    }
                    _ => None,
                }),
                Err(e) => return Some(e.into()),
            }
        };
        if let Some(slurm) = slurm.filter(|_| m.node_name.is_some()) {
            match kube.slurm.drain_node(tenant, &slurm, &node.node_name).await {
                Ok(SlurmDrain::Done) => {}
                // The slurmd pod is handed over: the cluster's run lowers its NodeSet now, and
                // the operator deletes that pod (the Node's drain below waits for it).
                Ok(SlurmDrain::HandedOver) => {
                    if let Some(step) = self.wake_cluster(m).await {
                        return Some(step);
                    }
                }
                Ok(SlurmDrain::Draining) => {
                    let message = "draining the Slurm node before the machine is released";
                    return Some(Step::Stop(Outcome::wait(self.settings.poll, "draining", message)));
                }
                Err(e) => return Some(self.driver_failed(m, e).await),
            }
        }
        match kube.nodes.drain_node(tenant, node).await {
            Ok(Drain::Drained) => None,
            Ok(Drain::Draining { leaving, blocked }) => {
                let message = format!(
                    "draining node {}: {leaving} pod(s) evicted (or left to their NodeSet) and not gone yet, \
                     {blocked} held by a PodDisruptionBudget",
                    node.node_name
                );
                Some(Step::Stop(Outcome::wait(self.settings.poll, "draining_node", message)))
            }
            Err(e) => Some(self.driver_failed(m, e).await),
        }
    }

    /// Enqueues the reconcile of the machine's cluster; `Some` to stop on a store failure.
    async fn wake_cluster(&self, m: &Machine) -> Option<Step> {
        let (Some(tenant), Some(cluster)) = (m.tenant_id, m.cluster_id) else { return None };
        let woken = async {
            let mut tx = self.services.store().begin().await?;
            lifecycle::enqueue_cluster(&mut tx, tenant, cluster).await?;
            Ok::<_, paddock_store::StoreError>(tx.commit().await?)
        };
        woken.await.err().map(Step::from)
    }

    /// Once the machine is off: deletes its Node and the Node's Lease, then any bootstrap token
    /// of the machine still there; `Some` to stop (waiting, or a failure).
    async fn remove_node(
        &self,
        kube: &KubeDrivers,
        m: &Machine,
        tenant: &TenantAccess,
        node: &NodeRef,
    ) -> Option<Step> {
        match kube.nodes.remove_node(tenant, node).await {
            Ok(Removal::Gone) => {}
            Ok(Removal::Deleting) => {
                return Some(Step::Stop(Outcome::wait(
                    self.settings.poll,
                    "removing_node",
                    "waiting for the node to go",
                )))
            }
            Err(e) => return Some(self.driver_failed(m, e).await),
        }
        match kube.nodes.delete_join_tokens(tenant, node).await {
            Ok(()) => None,
            Err(e) => Some(self.driver_failed(m, e).await),
        }
    }
}

/// Why a release is forced.
enum Forcing {
    /// An operator asked (`force-release`), with this reason.
    Operator(String),
    /// The release started at this moment and outlasted `PADDOCK_RELEASE_TIMEOUT`.
    Timeout(DateTime<Utc>),
    /// Recorded already: carry it out.
    Recorded,
}

impl Forcing {
    /// The ledger reason and evidence of a forcing still to record; `None` once recorded.
    fn describe(&self, m: &Machine, timeout: Duration) -> Option<(String, serde_json::Value)> {
        let last_error = m.last_error.as_ref().map(|e| json!({ "code": e.code, "message": e.message }));
        match self {
            Forcing::Recorded => None,
            Forcing::Operator(reason) => Some((
                format!("release forced by an operator: {reason}"),
                json!({ "cause": "operator", "operator_reason": reason, "last_error": last_error }),
            )),
            Forcing::Timeout(started_at) => Some((
                format!(
                    "release forced: not finished within PADDOCK_RELEASE_TIMEOUT ({} s) of its start",
                    timeout.as_secs()
                ),
                json!({
                    "cause": "release_timeout", "release_started_at": started_at,
                    "timeout_seconds": timeout.as_secs(), "last_error": last_error,
                }),
            )),
        }
    }
}

/// A step that waits no longer than until `deadline` (and at least a second: no busy loop).
fn cap_wait(step: Step, deadline: DateTime<Utc>) -> Step {
    match step {
        Step::Stop(Outcome::Wait { after, reason, cause }) => {
            let left = (deadline - Utc::now()).to_std().unwrap_or_default().max(Duration::from_secs(1));
            Step::Stop(Outcome::Wait { after: after.min(left), reason, cause })
        }
        other => other,
    }
}
