//! `KubePlatform`: the [`PlatformDriver`] on a real platform cluster, through kube-rs.
//!
//! The inherent methods return [`KubeError`] (tests and callers can look at the exact failure);
//! the trait implementation converts it into a [`DriverError`] at the boundary.
//!
//! Every write is a server-side apply with the one field manager `paddock`, forced: paddock owns
//! these objects outright, so a field another manager took over is taken back rather than failing
//! the run forever. It is made only when the object read lacks one of paddock's fields
//! ([`crate::apply`]), and what it changed is reported in [`Isolation::changed`].

use std::fmt::Debug;
use std::path::Path;

use futures::FutureExt;
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::NamespaceResourceScope;
use kube::api::DeleteParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, Resource};
use paddock_domain::driver::{BoxFuture, ClusterRef, DriverError, Isolation, PlatformDriver, Removal};
use tracing::{info, instrument};

use crate::apply::{converge, get_and_converge, Converged, Target};
use crate::isolation::{self, IsolationSettings, LABEL_CLUSTER_ID};
use crate::KubeError;

/// The platform cluster, reached with one kube-rs client.
#[derive(Clone)]
pub struct KubePlatform {
    client: Client,
    settings: IsolationSettings,
}

impl Debug for KubePlatform {
    // The client holds the credentials: show nothing of it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubePlatform").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl KubePlatform {
    /// Connects as `PADDOCK_KUBECONFIG` prescribes: the kubeconfig at `kubeconfig` (its current
    /// context) when given, else the in-cluster service account.
    pub async fn connect(kubeconfig: Option<&Path>) -> Result<Self, KubeError> {
        let mut config = match kubeconfig {
            Some(path) => {
                let kc = |source| KubeError::Kubeconfig { path: path.to_owned(), source };
                let file = Kubeconfig::read_from(path).map_err(kc)?;
                Config::from_custom_kubeconfig(file, &KubeConfigOptions::default()).await.map_err(kc)?
            }
            None => Config::incluster().map_err(|source| KubeError::InCluster { source })?,
        };
        crate::timeouts::Timeouts::default().apply(&mut config);
        let client = Client::try_from(config).map_err(|source| KubeError::Client { source: Box::new(source) })?;
        Ok(Self::new(client, IsolationSettings::default()))
    }

    /// A driver over an existing client.
    pub fn new(client: Client, settings: IsolationSettings) -> Self {
        Self { client, settings }
    }

    /// The client (for tests and later steps that share it).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Applies the cluster's isolation objects in order (namespace first: the rest live in it).
    #[instrument(skip_all, fields(tenant.id = %cluster.tenant_id, cluster.id = %cluster.cluster_id))]
    pub async fn ensure_isolation(&self, cluster: &ClusterRef) -> Result<Isolation, KubeError> {
        let ns_name = isolation::namespace_name(cluster.cluster_id);
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let existing = get_opt(&namespaces, "Namespace", &ns_name).await?;
        if let Some(ns) = &existing {
            check_ours(ns, cluster)?;
            // Applying into a terminating namespace fails object by object; say it once.
            if ns.metadata.deletion_timestamp.is_some() {
                return Err(KubeError::NamespaceTerminating { namespace: ns_name });
            }
        }
        let mut changed = Vec::new();
        let target = Target { kind: "Namespace", name: &ns_name, full_name: &ns_name };
        note(&mut changed, target, converge(&namespaces, target, existing, &isolation::namespace(cluster)).await?);
        let policies: Api<NetworkPolicy> = Api::namespaced(self.client.clone(), &ns_name);
        for policy in isolation::network_policies(cluster, &self.settings) {
            note_namespaced(&mut changed, &policies, "NetworkPolicy", &policy).await?;
        }
        let quotas: Api<ResourceQuota> = Api::namespaced(self.client.clone(), &ns_name);
        note_namespaced(&mut changed, &quotas, "ResourceQuota", &isolation::resource_quota(cluster)).await?;
        let limits: Api<LimitRange> = Api::namespaced(self.client.clone(), &ns_name);
        note_namespaced(&mut changed, &limits, "LimitRange", &isolation::limit_range(cluster)).await?;

        if !changed.is_empty() {
            info!(namespace = %ns_name, changed = ?changed, "isolation of cluster {} converged in namespace {ns_name}", cluster.cluster_id);
        }
        Ok(Isolation { namespace: ns_name, changed })
    }

    /// Deletes the cluster's namespace; the namespace controller then deletes its content.
    #[instrument(skip_all, fields(tenant.id = %cluster.tenant_id, cluster.id = %cluster.cluster_id))]
    pub async fn remove_isolation(&self, cluster: &ClusterRef) -> Result<Removal, KubeError> {
        let ns_name = isolation::namespace_name(cluster.cluster_id);
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let Some(ns) = get_opt(&namespaces, "Namespace", &ns_name).await? else {
            return Ok(Removal::Gone);
        };
        check_ours(&ns, cluster)?;
        if ns.metadata.deletion_timestamp.is_some() {
            return Ok(Removal::Deleting);
        }
        match namespaces.delete(&ns_name, &DeleteParams::default()).await {
            // NotFound: someone else finished the job in between, which is what we wanted.
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Removal::Gone),
            Err(source) => Err(KubeError::api("delete", "Namespace", ns_name, source)),
            // Even a namespace without content is only marked: it goes once the controller ran.
            Ok(_) => {
                info!(namespace = %ns_name, "deleting namespace {ns_name} of cluster {}", cluster.cluster_id);
                Ok(Removal::Deleting)
            }
        }
    }
}

impl PlatformDriver for KubePlatform {
    fn ensure_isolation<'a>(&'a self, cluster: &'a ClusterRef) -> BoxFuture<'a, Result<Isolation, DriverError>> {
        KubePlatform::ensure_isolation(self, cluster).map(|r| r.map_err(DriverError::from)).boxed()
    }

    fn remove_isolation<'a>(&'a self, cluster: &'a ClusterRef) -> BoxFuture<'a, Result<Removal, DriverError>> {
        KubePlatform::remove_isolation(self, cluster).map(|r| r.map_err(DriverError::from)).boxed()
    }
}

/// A namespace with our derived name but another cluster's label is not ours to touch. (A missing
/// label is treated the same: paddock always sets it, so someone else made that namespace.)
pub(crate) fn check_ours(ns: &Namespace, cluster: &ClusterRef) -> Result<(), KubeError> {
    let label = ns.metadata.labels.as_ref().and_then(|l| l.get(LABEL_CLUSTER_ID));
    if label.map(String::as_str) == Some(cluster.cluster_id.to_string().as_str()) {
        Ok(())
    } else {
        Err(KubeError::ForeignNamespace {
            namespace: ns.metadata.name.clone().unwrap_or_default(),
            cluster_id: cluster.cluster_id,
        })
    }
}

fn full_name<K: Resource>(obj: &K) -> String {
    let meta = obj.meta();
    let name = meta.name.clone().unwrap_or_default();
    match &meta.namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name,
    }
}

async fn get_opt<K>(api: &Api<K>, kind: &'static str, name: &str) -> Result<Option<K>, KubeError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + Debug,
{
    api.get_opt(name).await.map_err(|source| KubeError::api("get", kind, name, source))
}

/// Converges one namespaced object paddock owns; its name is added to `changed` when that
/// created or corrected it.
async fn note_namespaced<K>(
    changed: &mut Vec<String>,
    api: &Api<K>,
    kind: &'static str,
    desired: &K,
) -> Result<(), KubeError>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + serde::Serialize + serde::de::DeserializeOwned + Debug,
{
    let name = desired.meta().name.clone().unwrap_or_default();
    let full_name = full_name(desired);
    let target = Target { kind, name: &name, full_name: &full_name };
    note(changed, target, get_and_converge(api, target, desired).await?);
    Ok(())
}

fn note<K>(changed: &mut Vec<String>, target: Target<'_>, converged: Converged<K>) {
    if converged.changed {
        changed.push(target.describe());
    }
}
