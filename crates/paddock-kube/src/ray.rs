//! `KubeRayDriver`: the [`RayDriver`] (docs/architecture.md, cluster reconciler step 5 of a `ray`
//! cluster) on a tenant cluster's own API server, through KubeRay's operator (`ray.io/v1`
//! `RayCluster`; the operator and its CRDs are components of the tenant base stack that are
//! applied only into `ray` clusters, [`crate::stack`]).
//!
//! One object, in one namespace of the tenant cluster ([`RaySettings::namespace`], default
//! [`NAMESPACE`], created if absent), written by server-side apply with the field manager
//! [`MANAGER`], forced, and restored when it drifts ([`crate::apply`]):
//!
//! | object | name | what |
//! |---|---|---|
//! | `RayCluster` | [`RAYCLUSTER`] | the head on the head pool, one worker group per node pool |
//!
//! The head pod runs on a node of the spec's head pool (`ray.head.node_pool`: the node label
//! `paddock.dev/node-pool`, the pool's taints tolerated) with `num-cpus: 0` (Ray schedules no
//! task there: it shares its node with that pool's worker), the dashboard on or off as the spec
//! says (`include-dashboard`). Every node pool is a worker group named after it: `replicas` =
//! `minReplicas` = `maxReplicas` = the pool's count (worker groups do not autoscale), pinned to
//! the pool's nodes the same way, each worker limited to the GPUs of the pool's class
//! (`nvidia.com/gpu`, the device plugin's resource) and running the CUDA image when it has any.
//! A pool that is gone leaves the list, so its worker group goes with it (the list is compared
//! whole). Images come from the cluster's stack's Ray catalogue ([`RayCatalog`]), keyed by
//! `ray.version` (an unknown version is the permanent error `ray_version_unsupported`, before
//! anything is written).
//!
//! Ready ([`RayStatus`]) when the operator reports the RayCluster ready for the current spec
//! (`status.observedGeneration` current, `status.state` `ready`, the `HeadPodReady` condition
//! true, `status.readyWorkerReplicas` the pools' total) and then the head answers
//! ([`RayProbe::head_answers`]: Ray's own health endpoints on the head pod, through the tenant API
//! server's pod proxy). Each missing item is named in `reason`.
//!
//! Endpoints: the operator's head Service (`<name>-head-svc`, ClusterIP) gives the Ray client
//! address `ray://<service>.<namespace>.svc:10001` and, with the dashboard on, the dashboard
//! `http://<service>.<namespace>.svc:8265`: addresses inside the tenant cluster. Ray's client
//! port and the dashboard's job API run code for whoever reaches them, and KubeRay v1.5.0 cannot
//! switch on Ray's token authentication: paddock never exposes them beyond the cluster (no
//! LoadBalancer, no NodePort); a tenant reaches them only through its kubeconfig
//! (`kubectl port-forward`).
//!
//! Removing ([`RayDriver::remove_ray`]): the RayCluster; `Gone` once it and every pod of it are
//! gone (the operator's pods and Services are owned by it). The namespace stays.

mod objects;
mod probe;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::FutureExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client};
use paddock_domain::driver::{BoxFuture, DriverError, RayDesired, RayDriver, RayStatus, Removal, TenantAccess};
use paddock_domain::stack::{self, RayImages, RayRelease, StackDefinition};
use serde_json::Value;
use tracing::{debug, info, instrument};

pub use objects::{labels, raycluster, readiness};
pub use probe::{PodProxyProbe, RayProbe};

use crate::apply::{get_and_converge, Target};
use crate::KubeError;

/// KubeRay's API group.
pub const GROUP: &str = "ray.io";
/// KubeRay's API version.
pub const VERSION: &str = "v1";
/// The default namespace of Ray in a tenant cluster.
pub const NAMESPACE: &str = "ray";
/// The RayCluster's name.
pub const RAYCLUSTER: &str = "ray";
/// The operator's head Service (`<name>-head-svc`).
pub const HEAD_SERVICE: &str = "ray-head-svc";
/// The Ray client server's port.
pub const CLIENT_PORT: u16 = 10001;
/// The dashboard's port (also Ray's job API and the GCS health check).
pub const DASHBOARD_PORT: u16 = 8265;
/// The dashboard agent's port on every Ray pod (the raylet health check).
pub const AGENT_PORT: u16 = 52365;
/// Label marking the objects of this driver (value [`crate::isolation::MANAGER`]).
pub const LABEL_RAY: &str = "paddock.dev/ray";
/// KubeRay's pod label naming the RayCluster.
pub const LABEL_RAY_CLUSTER: &str = "ray.io/cluster";
/// KubeRay's pod label naming the node type (`head`, `worker`).
pub const LABEL_NODE_TYPE: &str = "ray.io/node-type";

/// The `ApiResource` of the RayCluster kind.
pub fn raycluster_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, "RayCluster"), "rayclusters")
}

/// The Ray images the driver deploys, by base stack version (each definition's `ray` section).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RayCatalog {
    stacks: BTreeMap<String, RayImages>,
}

impl RayCatalog {
    /// The catalog of these stack definitions (those with a `ray` section).
    pub fn of<'a>(definitions: impl IntoIterator<Item = &'a StackDefinition>) -> Self {
        Self { stacks: definitions.into_iter().filter_map(|d| Some((d.version.clone(), d.ray.clone()?))).collect() }
    }

    /// The catalog of every embedded stack definition.
    pub fn embedded() -> Self {
        Self::of(stack::definitions())
    }

    /// The images and release of Ray `version` on base stack `stack`; one the stack does not run
    /// is the permanent error `ray_version_unsupported`.
    pub fn release(&self, stack: &str, version: &str) -> Result<(&RayImages, &RayRelease), DriverError> {
        let images = self.stacks.get(stack);
        if let Some(found) = images.and_then(|i| Some((i, i.release(version)?))) {
            return Ok(found);
        }
        let supported = images.map(RayImages::versions).unwrap_or_default().join(", ");
        Err(DriverError::permanent(
            "ray_version_unsupported",
            format!("Ray {version} is not in the Ray catalogue of the base stack {stack} (supported: {supported})"),
        ))
    }
}

/// Settings of the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaySettings {
    /// The namespace in every tenant cluster.
    pub namespace: String,
    /// The images, from the tenant stack's definitions.
    pub catalog: RayCatalog,
}

impl Default for RaySettings {
    fn default() -> Self {
        Self { namespace: NAMESPACE.to_owned(), catalog: RayCatalog::embedded() }
    }
}

/// Ray in tenant clusters through KubeRay (see the module documentation).
pub struct KubeRayDriver {
    settings: RaySettings,
    probe: Arc<dyn RayProbe>,
}

impl std::fmt::Debug for KubeRayDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeRayDriver").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl KubeRayDriver {
    /// A driver with `settings`, asking the head through `probe`.
    pub fn new(settings: RaySettings, probe: Arc<dyn RayProbe>) -> Self {
        Self { settings, probe }
    }

    /// The production driver: [`PodProxyProbe`].
    pub fn with_pod_proxy(settings: RaySettings) -> Self {
        Self::new(settings, Arc::new(PodProxyProbe))
    }

    fn rayclusters(&self, client: &Client) -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), &self.settings.namespace, &raycluster_resource())
    }

    /// Applies the cluster's RayCluster and reports where it stands (see the module
    /// documentation).
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id))]
    pub async fn ensure_ray(&self, tenant: &TenantAccess, desired: &RayDesired) -> Result<RayStatus, DriverError> {
        let version = desired.spec.version.as_deref().unwrap_or_default();
        let (images, release) = self.settings.catalog.release(&desired.stack_version, version)?;
        let cluster = tenant.cluster.cluster_id;
        let ns = self.settings.namespace.as_str();
        let client = crate::nodes::tenant_client(tenant).await?;
        let mut changed = Vec::new();
        crate::apply::ensure_namespace(&client, &self.settings.namespace, labels(cluster), &mut changed).await?;
        let body = raycluster(ns, cluster, images, release, desired);
        let full_name = format!("{ns}/{RAYCLUSTER}");
        let target = Target { kind: "RayCluster", name: RAYCLUSTER, full_name: &full_name };
        let converged = get_and_converge(&self.rayclusters(&client), target, &body).await.map_err(DriverError::from)?;
        if converged.changed {
            changed.push(target.describe());
            info!(cluster.id = %cluster, changed = ?changed, "applied the RayCluster of cluster {cluster}");
        }
        let live = serde_json::to_value(&converged.object).unwrap_or(Value::Null);
        let mut waiting = readiness(&live, desired);
        if waiting.is_empty() {
            match self.probe.head_answers(tenant, ns, desired.spec.dashboard).await {
                Ok(true) => {}
                Ok(false) => waiting.push("RayHeadAnswers".to_owned()),
                Err(e) => waiting.push(format!("RayHeadAnswers ({e})")),
            }
        }
        let services: Api<Service> = Api::namespaced(client.clone(), ns);
        let head = services
            .get_opt(HEAD_SERVICE)
            .await
            .map_err(|source| KubeError::api("get", "Service", format!("{ns}/{HEAD_SERVICE}"), source))?;
        let host = head.map(|_| format!("{HEAD_SERVICE}.{ns}.svc"));
        let status = RayStatus {
            ready: waiting.is_empty(),
            reason: waiting.join(", "),
            ray_client: host.as_ref().map(|h| format!("ray://{h}:{CLIENT_PORT}")),
            dashboard: host.filter(|_| desired.spec.dashboard).map(|h| format!("http://{h}:{DASHBOARD_PORT}")),
            changed,
        };
        debug!(cluster.id = %cluster, ready = status.ready, reason = %status.reason, "ensured Ray");
        Ok(status)
    }

    /// Deletes the RayCluster; `Gone` once it and its pods are gone.
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id))]
    pub async fn remove_ray(&self, tenant: &TenantAccess) -> Result<Removal, DriverError> {
        let ns = self.settings.namespace.as_str();
        let client = crate::nodes::tenant_client(tenant).await?;
        let what = format!("{ns}/{RAYCLUSTER}");
        let api = self.rayclusters(&client);
        let left = match api.delete(RAYCLUSTER, &DeleteParams::background()).await {
            // No RayCluster, or no CRD (the stack never got that far): nothing of it is left.
            Err(kube::Error::Api(status)) if status.code == 404 => false,
            Err(source) => return Err(KubeError::api("delete", "RayCluster", what, source).into()),
            Ok(_) => match api.get_opt(RAYCLUSTER).await {
                Ok(found) => found.is_some(),
                Err(kube::Error::Api(status)) if status.code == 404 => false,
                Err(source) => return Err(KubeError::api("get", "RayCluster", what, source).into()),
            },
        };
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let selector = ListParams::default().labels(&format!("{LABEL_RAY_CLUSTER}={RAYCLUSTER}"));
        let pods = pods
            .list(&selector)
            .await
            .map_err(|source| KubeError::api("list", "Pod", format!("{ns}/{LABEL_RAY_CLUSTER}={RAYCLUSTER}"), source))?
            .items
            .len();
        debug!(cluster.id = %tenant.cluster.cluster_id, left, pods, "removing Ray");
        Ok(if left || pods > 0 { Removal::Deleting } else { Removal::Gone })
    }
}

impl RayDriver for KubeRayDriver {
    fn ensure_ray<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        desired: &'a RayDesired,
    ) -> BoxFuture<'a, Result<RayStatus, DriverError>> {
        self.ensure_ray(tenant, desired).boxed()
    }

    fn remove_ray<'a>(&'a self, tenant: &'a TenantAccess) -> BoxFuture<'a, Result<Removal, DriverError>> {
        self.remove_ray(tenant).boxed()
    }
}
