//! `KubePlatform`: the [`PlatformDriver`] on a real platform cluster, through kube-rs.
//!
//! The inherent methods return [`KubeError`] (tests and callers can look at the exact failure);
//! the trait implementation converts it into a [`DriverError`] at the boundary.
//!
//! Every write is a server-side apply with the one field manager `paddock`, forced: paddock owns
//! these objects outright, so a field another manager took over is taken back rather than failing
//! the run forever. It is made only when the object read lacks one of paddock's fields
//! ([`crate::apply`]), and what it changed is reported in [`Isolation::changed`]. The namespace
//! alone is made with a plain create: with a namespace role ([`KubePlatform::with_namespace_role`],
//! [`crate::access`]) the account may not patch a namespace before it is bound in it.

use std::fmt::Debug;
use std::path::Path;

use futures::FutureExt;
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, Resource};
use paddock_domain::driver::{BoxFuture, ClusterRef, DriverError, Isolation, PlatformDriver, Removal};
use tracing::{info, instrument};

use crate::access::NamespaceAccess;
use crate::apply::{converge, get_and_converge, Converged, Target};
use crate::isolation::{self, IsolationSettings, LABEL_CLUSTER_ID, MANAGER, WORKER_BINDING_NAME};
use crate::KubeError;

/// The platform cluster, reached with one kube-rs client.
#[derive(Clone)]
pub struct KubePlatform {
    client: Client,
    settings: IsolationSettings,
    access: NamespaceAccess,
}

impl Debug for KubePlatform {
    // The client holds the credentials: show nothing of it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let role = self.access.role();
        f.debug_struct("KubePlatform")
            .field("settings", &self.settings)
            .field("namespace_role", &role)
            .finish_non_exhaustive()
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
        let access = NamespaceAccess::new(client.clone(), None);
        Self { client, settings, access }
    }

    /// Binds this account to the ClusterRole `role` in each tenant namespace (and works there
    /// through it), for an account whose own role only creates namespaces (the chart's worker,
    /// `PADDOCK_KUBE_NAMESPACE_ROLE`); None: the account works in every namespace.
    pub fn with_namespace_role(mut self, role: Option<String>) -> Self {
        self.access = NamespaceAccess::new(self.client.clone(), role);
        self
    }

    /// The ClusterRole bound in each tenant namespace, if any.
    pub fn namespace_role(&self) -> Option<&str> {
        self.access.role()
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
        let target = Target { kind: "Namespace", name: &ns_name, full_name: &ns_name };
        let (existing, created) = match get_opt(&namespaces, "Namespace", &ns_name).await? {
            Some(ns) => (ns, false),
            None => (create_namespace(&namespaces, cluster).await?, true),
        };
        check_ours(&existing, cluster)?;
        // Applying into a terminating namespace fails object by object; say it once.
        if existing.metadata.deletion_timestamp.is_some() {
            return Err(KubeError::NamespaceTerminating { namespace: ns_name });
        }
        // Before anything else in it: with a namespace role, the binding grants the rest.
        let bound = self.access.ensure(cluster).await?;
        let converged = converge(&namespaces, target, Some(existing), &isolation::namespace(cluster)).await?;
        let mut changed = Vec::new();
        if created || converged.changed {
            changed.push(target.describe());
        }
        if bound {
            changed.push(format!("RoleBinding {ns_name}/{WORKER_BINDING_NAME}"));
        }
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
        // With a namespace role, deleting it is a right of the binding (made again if missing).
        self.access.ensure(cluster).await?;
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

/// Creates the cluster's namespace (a plain create: see the module's documentation); made in
/// between by someone else, it is read back for the caller to check.
async fn create_namespace(namespaces: &Api<Namespace>, cluster: &ClusterRef) -> Result<Namespace, KubeError> {
    let name = isolation::namespace_name(cluster.cluster_id);
    let params = PostParams { field_manager: Some(MANAGER.to_owned()), ..PostParams::default() };
    match namespaces.create(&params, &isolation::namespace(cluster)).await {
        Ok(ns) => Ok(ns),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            get_opt(namespaces, "Namespace", &name).await?.ok_or(KubeError::NamespaceMissing { namespace: name })
        }
        Err(source) => Err(KubeError::api("create", "Namespace", name, source)),
    }
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
