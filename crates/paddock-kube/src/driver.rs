//! `KubePlatform`: the [`PlatformDriver`] on a real platform cluster, through kube-rs.
//!
//! The inherent methods return [`KubeError`] (tests and callers can look at the exact failure);
//! the trait implementation converts it into a [`DriverError`] at the boundary.
//!
//! Every write is a server-side apply with the one field manager [`MANAGER`], forced: paddock
//! owns these objects outright, so a field another manager took over is taken back rather than
//! failing the run forever. Whether an apply changed anything is read from the object's
//! `resourceVersion` before and after (the API server keeps it when an apply is a no-op).

use std::fmt::Debug;
use std::path::Path;

use futures::FutureExt;
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, Resource};
use paddock_domain::driver::{BoxFuture, ClusterRef, DriverError, Isolation, PlatformDriver, Removal};
use tracing::{debug, info, instrument};

use crate::isolation::{self, IsolationSettings, LABEL_CLUSTER_ID, MANAGER};
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
        let mut changed = apply(&namespaces, "Namespace", existing, &isolation::namespace(cluster)).await?;

        let policies: Api<NetworkPolicy> = Api::namespaced(self.client.clone(), &ns_name);
        for policy in isolation::network_policies(cluster, &self.settings) {
            changed |= apply_namespaced(&policies, "NetworkPolicy", &policy).await?;
        }
        let quotas: Api<ResourceQuota> = Api::namespaced(self.client.clone(), &ns_name);
        changed |= apply_namespaced(&quotas, "ResourceQuota", &isolation::resource_quota(cluster)).await?;
        let limits: Api<LimitRange> = Api::namespaced(self.client.clone(), &ns_name);
        changed |= apply_namespaced(&limits, "LimitRange", &isolation::limit_range(cluster)).await?;

        if changed {
            info!(namespace = %ns_name, "isolation of cluster {} converged in namespace {ns_name}", cluster.cluster_id);
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

async fn apply_namespaced<K>(api: &Api<K>, kind: &'static str, desired: &K) -> Result<bool, KubeError>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + serde::Serialize + serde::de::DeserializeOwned + Debug,
{
    let name = desired.meta().name.clone().unwrap_or_default();
    let existing =
        api.get_opt(&name).await.map_err(|source| KubeError::api("get", kind, full_name(desired), source))?;
    apply(api, kind, existing, desired).await
}

/// Server-side applies `desired`; true when the object was created or its resourceVersion moved.
async fn apply<K>(api: &Api<K>, kind: &'static str, existing: Option<K>, desired: &K) -> Result<bool, KubeError>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + Debug,
{
    let name = desired.meta().name.clone().unwrap_or_default();
    let before = existing.and_then(|o| o.meta().resource_version.clone());
    // k8s-openapi serializes apiVersion and kind with the object, as an apply body needs.
    let params = PatchParams::apply(MANAGER).force();
    let applied = api
        .patch(&name, &params, &Patch::Apply(desired))
        .await
        .map_err(|source| KubeError::api("apply", kind, full_name(desired), source))?;
    let changed = before.is_none() || before != applied.meta().resource_version;
    debug!(kind, name = %full_name(desired), changed, "applied {kind} {}", full_name(desired));
    Ok(changed)
}
