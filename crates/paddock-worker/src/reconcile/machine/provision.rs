//! Provisioning: from `allocated` through the provisioning boot to a Ready node.

use chrono::{DateTime, Utc};
use futures::FutureExt;
use paddock_domain::bmc::{AfterBoot, BmcDriver};
use paddock_domain::driver::{KubeDrivers, NodeRef, TenantAccess};
use paddock_domain::model::Machine;
use paddock_store::lifecycle;
use paddock_store::run::{self, Run, RunPurpose};
use paddock_types::agent::{AgentRunConfig, ProvisionConfig};
use paddock_types::machine::MachineState;
use serde_json::Value;

use crate::metrics::{self};
use crate::reconcile::{DRIVER_NOT_CONFIGURED, DRIVER_WAIT};
use crate::Outcome;

use super::{ttl, MachineReconciler, Step};

impl MachineReconciler {
    /// From `allocated` (once the tenant control plane is up) through a provisioning boot with a
    /// join configuration to `active`, when a Ready Node with the machine's system UUID exists.
    pub(super) async fn provision(&self, bmc: &dyn BmcDriver, m: &Machine, run: Option<Run>) -> Step {
        use MachineState as S;
        let Some(kube) = self.drivers.kube.clone() else {
            let message = "no Kubernetes driver is configured (PADDOCK_KUBE_DRIVER=none); the machine waits";
            return self.wait_with(m, DRIVER_WAIT, DRIVER_NOT_CONFIGURED, message).await;
        };
        // The tenant side is read only by the steps that talk to the tenant cluster (and before
        // the run starts: not before its control plane is up).
        let run = match run {
            Some(run) if m.state == S::Provisioning && run.run_purpose == RunPurpose::Provision.as_str() => run,
            _ => {
                if let Err(step) = self.provisioning_side(m).await {
                    return step;
                }
                let (state, version) = (m.state, m.status_version);
                let purpose = RunPurpose::Provision;
                return self
                    .guarded(m.id, |c, k| run::start_run(c, k, m.id, state, version, S::Provisioning, purpose).boxed())
                    .await;
            }
        };
        let access = match self.access(m) {
            Ok(a) => a,
            Err(step) => return step,
        };
        let Some(booted_at) = run.run_booted_at else {
            let Some(image) = self.settings.os_image_url.clone() else {
                let message = "no node OS image is configured (PADDOCK_OS_IMAGE_URL); the machine waits";
                return self.wait_for_fix(m, "os_image_not_configured", message).await;
            };
            // The bootstrap token lives for the join token TTL only (docs/security.md), not the
            // run's: it is deleted once the Node has registered.
            let (tenant_access, node) = match self.provisioning_side(m).await {
                Ok(found) => found,
                Err(step) => return step,
            };
            let ttl_secs = self.settings.join_token_ttl.as_secs().max(1);
            let join = match kube.nodes.join_config(&tenant_access, &node, ttl_secs).await {
                Ok(j) => j,
                Err(e) => return self.driver_failed(m, e).await,
            };
            let os_image_sha256 = self.services.agent_settings().os_image_sha256.clone();
            let config = match provision_config(&node, join.0, os_image_sha256) {
                Ok(c) => c,
                Err(why) => return self.provision_failed(m, "join_config_invalid", &why).await,
            };
            return self
                .boot(bmc, m, &access, &run, AgentRunConfig::Provision(config), image, self.settings.agent_token_ttl)
                .await;
        };
        let report = run.report.clone();
        let Some(report) = report else {
            let deadline = booted_at + ttl(self.settings.agent_token_ttl);
            if Utc::now() >= deadline {
                return self
                    .provision_failed(m, "provision_timed_out", "the machine did not report its first boot in time")
                    .await;
            }
            let left = (deadline - Utc::now()).to_std().unwrap_or_default();
            return Step::Stop(Outcome::wait(
                left.min(self.settings.report_wait),
                "waiting_for_agent",
                "the machine is installing; waiting for its first-boot report",
            ));
        };
        if !report.verified {
            let why = report.failure.as_deref().unwrap_or("the machine reported a failed first boot");
            return self.provision_failed(m, "provision_failed", why).await;
        }
        let Some(finished_at) = run.run_finished_at else {
            if let Err(e) = bmc.finish_boot(&access, AfterBoot::BootFromDisk).await {
                return self.bmc_failed(m, e).await;
            }
            let (state, version) = (m.state, m.status_version);
            return self.guarded(m.id, |c, _| run::mark_finished(c, m.id, state, version).boxed()).await;
        };
        let (tenant_access, node) = match self.provisioning_side(m).await {
            Ok(found) => found,
            Err(step) => return step,
        };
        self.await_node(m, &kube, &tenant_access, &node, finished_at).await
    }

    /// [`Self::tenant_side`] for provisioning: without it, the machine waits for the cluster's
    /// control plane.
    async fn provisioning_side(&self, m: &Machine) -> Result<(TenantAccess, NodeRef), Step> {
        match self.tenant_side(m).await {
            Ok(Some(found)) => Ok(found),
            // The cluster reconciler enqueues this job again once its control plane is up.
            Ok(None) => {
                let message = "waiting for the cluster's control plane";
                Err(Step::Stop(Outcome::wait(self.settings.poll, "waiting_for_control_plane", message)))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The last step of provisioning: the machine booted from disk at `finished_at`; it is
    /// `active` once a Node with its system UUID is Ready, and fails after the join timeout.
    async fn await_node(
        &self,
        m: &Machine,
        kube: &KubeDrivers,
        tenant_access: &TenantAccess,
        node: &NodeRef,
        finished_at: DateTime<Utc>,
    ) -> Step {
        match kube.nodes.foreign_node(tenant_access, node).await {
            Ok(None) => {}
            Ok(Some(found)) => return self.foreign_node(m, kube, tenant_access, node, &found).await,
            Err(e) => return self.driver_failed(m, e).await,
        }
        let registered = match kube.nodes.node(tenant_access, node).await {
            Ok(found) => found,
            Err(e) => return self.driver_failed(m, e).await,
        };
        if registered.is_some() {
            // The Node has registered: its bootstrap tokens have done their work (docs/security.md).
            if let Err(e) = kube.nodes.delete_join_tokens(tenant_access, node).await {
                return self.driver_failed(m, e).await;
            }
        }
        match registered {
            Some(status) if status.ready => {
                let (id, version, holder) = (m.id, m.status_version, m.tenant_id.zip(m.cluster_id));
                self.guarded_then(
                    m.id,
                    move |c, k| {
                        async move {
                            let activated = lifecycle::activate(c, k, id, version, &status.name).await?;
                            if let (Some(_), Some((tenant, cluster))) = (activated, holder) {
                                lifecycle::enqueue_cluster(c, tenant, cluster).await?;
                            }
                            Ok(activated)
                        }
                        .boxed()
                    },
                    |since_allocation| {
                        if let Some(took) = since_allocation {
                            metrics::observe(|w| w.provisioned(&m.machine_class, took));
                        }
                    },
                )
                .await
            }
            _ => {
                if Utc::now() >= finished_at + ttl(self.settings.node_join_timeout) {
                    return self
                        .provision_failed(m, "node_never_ready", "the machine booted but never became a Ready node")
                        .await;
                }
                Step::Stop(Outcome::wait(
                    self.settings.poll,
                    "waiting_for_node",
                    "waiting for the node to become Ready",
                ))
            }
        }
    }

    /// A Node registered under the machine's node name with system UUID `found`, another
    /// machine's (docs/security.md): the run fails `provision_failed` with `node_uuid_mismatch`,
    /// recorded on this machine's ledger and on that of the machine holding `found`, then the Node
    /// is deleted (the release deletes it too, by name, if this does not get through).
    async fn foreign_node(
        &self,
        m: &Machine,
        kube: &KubeDrivers,
        tenant_access: &TenantAccess,
        node: &NodeRef,
        found: &str,
    ) -> Step {
        let (id, version, holder) = (m.id, m.status_version, m.tenant_id.zip(m.cluster_id));
        let (node_name, expected, found) = (node.node_name.clone(), node.system_uuid.clone(), found.to_owned());
        tracing::warn!(
            machine.id = %m.id,
            "node {node_name} registered with system UUID {found}, not machine {}'s {expected}", m.id
        );
        let step = self
            .guarded(m.id, move |c, k| {
                async move {
                    let mismatch =
                        lifecycle::UuidMismatch { node_name: &node_name, expected: &expected, found: &found };
                    let failed = lifecycle::fail_node_uuid_mismatch(c, k, id, version, &mismatch).await?;
                    if let (true, Some((tenant, cluster))) = (failed, holder) {
                        lifecycle::enqueue_cluster(c, tenant, cluster).await?;
                    }
                    Ok(failed)
                }
                .boxed()
            })
            .await;
        if let Err(e) = kube.nodes.remove_node(tenant_access, node).await {
            metrics::driver_failed(metrics::Driver::Kube, &e.code);
            let name = &node.node_name;
            tracing::warn!(machine.id = %m.id, error = %e, "the foreign node {name} is left to the release");
        }
        step
    }

    pub(super) async fn provision_failed(&self, m: &Machine, code: &str, message: &str) -> Step {
        let (id, state, version, holder) = (m.id, m.state, m.status_version, m.tenant_id.zip(m.cluster_id));
        let (code, message) = (code.to_owned(), message.to_owned());
        self.guarded(m.id, move |c, k| {
            async move {
                let to = MachineState::ProvisionFailed;
                let failed = lifecycle::end_run(c, k, id, state, version, to, Some((&code, &message)), None).await?;
                if let (true, Some((tenant, cluster))) = (failed, holder) {
                    // The cluster allocates a replacement.
                    lifecycle::enqueue_cluster(c, tenant, cluster).await?;
                }
                Ok(failed)
            }
            .boxed()
        })
        .await
    }
}

/// A provisioning boot's `config` (docs/security.md): the join configuration's contract keys
/// (`api_endpoint`, `ca_cert`, `ca_cert_hash`, `bootstrap_token`), the node's name and taints,
/// the digest of the node OS image the installer must be booted from (`PADDOCK_OS_IMAGE_SHA256`),
/// and the driver's whole join configuration under `join`. `Err` names a missing key.
fn provision_config(node: &NodeRef, join: Value, os_image_sha256: String) -> Result<ProvisionConfig, String> {
    let key = |k: &str| -> Result<String, String> {
        match join[k].as_str().map(str::trim) {
            Some(v) if !v.is_empty() => Ok(v.to_owned()),
            _ => Err(format!("the cluster driver's join configuration lacks {k}")),
        }
    };
    let endpoint = key("api_endpoint")?;
    // The Kubernetes drivers name the API server `host:port`, as kubeadm's join does.
    let api_endpoint = if endpoint.contains("://") { endpoint } else { format!("https://{endpoint}") };
    Ok(ProvisionConfig {
        node_name: node.node_name.clone(),
        api_endpoint,
        ca_cert: key("ca_cert")?,
        ca_cert_hash: key("ca_cert_hash")?,
        bootstrap_token: key("bootstrap_token")?,
        node_taints: node.taints.clone(),
        os_image_sha256,
        join,
    })
}
