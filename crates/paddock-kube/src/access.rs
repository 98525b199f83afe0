//! The worker's rights in a tenant namespace when its platform-cluster account holds them there
//! alone: with a namespace role (`PADDOCK_KUBE_NAMESPACE_ROLE`, the chart's).
//!
//! RBAC has no label selectors and admission never sees reads, so a cluster-wide role that reads
//! the Kamaji Secrets reads every Secret, and one that deletes tenant namespaces deletes every
//! namespace. The chart's cluster-wide worker role therefore only reads and creates namespaces
//! and creates RoleBindings of the namespace role; in each tenant namespace the worker binds its
//! own account to that role ([`isolation::worker_binding`]), which grants everything else it does
//! there, deleting the namespace itself included (a RoleBinding in a namespace covers the
//! namespace object). The chart's admission policies let that account create only namespaces
//! named and labelled as paddock's, and bind only in them, only that role, only itself.
//!
//! Without a namespace role (an account that may work in every namespace), nothing here does
//! anything.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{RoleBinding, Subject};
use kube::api::PostParams;
use kube::{Api, Client};
use paddock_domain::driver::ClusterRef;
use tokio::sync::OnceCell;
use tracing::info;

use crate::apply::{converge, Target};
use crate::isolation::{self, MANAGER, WORKER_BINDING_NAME};
use crate::KubeError;

/// How long a new RoleBinding may take to reach the API server's authorizer (its informer).
const BINDING_PROPAGATION: Duration = Duration::from_secs(10);

/// The worker's way into tenant namespaces; cheap to clone.
#[derive(Clone)]
pub(crate) struct NamespaceAccess {
    client: Client,
    /// The ClusterRole bound in each tenant namespace; None: the account works everywhere.
    role: Option<String>,
    /// This account as an RBAC subject, asked once.
    account: Arc<OnceCell<Subject>>,
}

/// What a tenant namespace is to [`NamespaceAccess::enter`].
pub(crate) enum Entry {
    /// It does not exist.
    Absent,
    /// It is being deleted (and its binding with it): nothing more is made in it.
    Terminating,
    /// It exists, is the cluster's, and this account is bound in it.
    Bound,
}

impl NamespaceAccess {
    pub(crate) fn new(client: Client, role: Option<String>) -> Self {
        Self { client, role, account: Arc::default() }
    }

    pub(crate) fn role(&self) -> Option<&str> {
        self.role.as_deref()
    }

    /// Reads the cluster's namespace and, if it is there, the cluster's and not terminating,
    /// makes sure this account is bound in it.
    pub(crate) async fn enter(&self, cluster: &ClusterRef) -> Result<Entry, KubeError> {
        let name = isolation::namespace_name(cluster.cluster_id);
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let found =
            namespaces.get_opt(&name).await.map_err(|source| KubeError::api("get", "Namespace", &*name, source))?;
        let Some(ns) = found else { return Ok(Entry::Absent) };
        crate::driver::check_ours(&ns, cluster)?;
        if ns.metadata.deletion_timestamp.is_some() {
            return Ok(Entry::Terminating);
        }
        self.ensure(cluster).await?;
        Ok(Entry::Bound)
    }

    /// Makes sure this account is bound to the namespace role in the cluster's namespace (which
    /// exists, is the cluster's and is not terminating); whether that created or corrected the
    /// binding. A binding it cannot read is one it is not bound by (yet): it creates it, then
    /// waits until the binding grants reading itself.
    pub(crate) async fn ensure(&self, cluster: &ClusterRef) -> Result<bool, KubeError> {
        let Some(role) = &self.role else { return Ok(false) };
        let ns = isolation::namespace_name(cluster.cluster_id);
        let full = format!("{ns}/{WORKER_BINDING_NAME}");
        let target = Target { kind: "RoleBinding", name: WORKER_BINDING_NAME, full_name: &full };
        let desired = isolation::worker_binding(cluster, role, self.account().await?.clone());
        let bindings: Api<RoleBinding> = Api::namespaced(self.client.clone(), &ns);
        match bindings.get_opt(WORKER_BINDING_NAME).await {
            Ok(Some(live)) => return Ok(converge(&bindings, target, Some(live), &desired).await?.changed),
            Ok(None) => {}
            Err(e) if forbidden(&e) => {}
            Err(source) => return Err(KubeError::api("get", target.kind, full, source)),
        }
        let params = PostParams { field_manager: Some(MANAGER.to_owned()), ..PostParams::default() };
        match bindings.create(&params, &desired).await {
            Ok(_) => info!(namespace = %ns, "bound the worker's account to {role} in namespace {ns}"),
            // Made before, by a run that stopped before it could read it.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(source) => return Err(KubeError::api("create", target.kind, full, source)),
        }
        let live = self.wait_bound(&bindings, &ns).await?;
        converge(&bindings, target, Some(live), &desired).await?;
        Ok(true)
    }

    /// Reads the binding until it grants reading itself, for at most [`BINDING_PROPAGATION`].
    async fn wait_bound(&self, bindings: &Api<RoleBinding>, ns: &str) -> Result<RoleBinding, KubeError> {
        let deadline = tokio::time::Instant::now() + BINDING_PROPAGATION;
        loop {
            match bindings.get_opt(WORKER_BINDING_NAME).await {
                Ok(Some(live)) => return Ok(live),
                Ok(None) => {}
                Err(e) if forbidden(&e) => {}
                Err(source) => {
                    return Err(KubeError::api("get", "RoleBinding", format!("{ns}/{WORKER_BINDING_NAME}"), source))
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(KubeError::BindingPending { namespace: ns.to_owned() });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// This account as the API server knows it (a SelfSubjectReview, which every authenticated
    /// account may make).
    async fn account(&self) -> Result<&Subject, KubeError> {
        self.account
            .get_or_try_init(|| async {
                let reviews: Api<SelfSubjectReview> = Api::all(self.client.clone());
                let review = reviews
                    .create(&PostParams::default(), &SelfSubjectReview::default())
                    .await
                    .map_err(|source| KubeError::api("create", "SelfSubjectReview", "self", source))?;
                let user = review.status.and_then(|s| s.user_info).and_then(|u| u.username).unwrap_or_default();
                Ok(isolation::subject(&user))
            })
            .await
    }
}

/// A 403: RBAC (or admission) refused the request.
pub(crate) fn forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 403)
}
