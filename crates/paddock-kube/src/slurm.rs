//! `SlinkyDriver`: the [`SlurmDriver`] (docs/architecture.md, cluster reconciler step 5) on a tenant cluster's own API
//! server, through SchedMD's Slinky operator (`slinky.slurm.net/v1beta1` custom resources; the
//! operator itself is part of the tenant base stack, [`crate::stack`]).
//!
//! Every object lives in one namespace of the tenant cluster ([`SlinkySettings::namespace`],
//! default [`NAMESPACE`], created if absent) and is written by server-side apply with the field
//! manager [`MANAGER`], forced. Names are fixed:
//!
//! | object | name | what |
//! |---|---|---|
//! | Secret | [`SECRET_SLURM_KEY`] (`slurm.key`) | `auth/slurm` key |
//! | Secret | [`SECRET_JWT`] (`jwt_hs256.key`) | `auth/jwt` HS256 key |
//! | Secret | [`SECRET_DB`] (`password`) | the accounting database password |
//! | Secret | [`SECRET_SSSD`] (`sssd.conf`) | the LoginSet's minimal `sssd.conf` (files provider) |
//! | ConfigMap | [`CONFIG_FILES`] (`gres.conf`) | only when a pool has GPUs: `AutoDetect=nvidia` |
//! | StatefulSet + headless Service | [`MARIADB`] | MariaDB for accounting (the stack's image, one PVC) |
//! | `Accounting` | [`ACCOUNTING`] | slurmdbd on [`MARIADB`] |
//! | `Controller` | [`CONTROLLER`] | slurmctld, persistence on the storage class, partitions |
//! | `RestApi` | [`RESTAPI`] | slurmrestd |
//! | `LoginSet` | [`LOGINSET`] | login pods, root's SSH keys from the spec |
//! | `NodeSet` | the pool's name | slurmd pods pinned to the pool's nodes (compute pools only) |
//!
//! The control pods (MariaDB, and the pods of the Accounting, Controller, RestApi and LoginSet,
//! through each CR's `template.spec`) are pinned to the nodes of the cluster's `system` pool
//! ([`objects::placement`]: the node label `paddock.dev/node-pool`, the pool's taints
//! tolerated), so the local-path volumes of MariaDB and slurmctld are made on, and stay on,
//! machines paddock releases only with the cluster. The system pool gets no NodeSet: the
//! NodeSets, partitions and GRES below are those of the compute pools.
//!
//! The three key Secrets hold [`SlurmSecrets`] exactly (their values are base64 already, as the
//! Secret `data` field wants them: the files hold the random bytes), so re-applying them changes
//! nothing (same `resourceVersion`); they are never logged.
//!
//! Images come from the tenant stack's definition ([`SlurmCatalog`], its `slurm` section: a
//! registry, a pinned tag per Slurm version, MariaDB's image; never `latest`), keyed by
//! `spec.version` (an unknown version is the permanent error `slurm_version_unsupported`, before
//! anything is written). A deployment's registry (`PADDOCK_SLURM_IMAGE_REGISTRY`,
//! [`SlurmCatalog::with_registry`]) replaces every registry of the catalogue, MariaDB's included,
//! and keeps names and tags. The slurmrestd calls speak the data-parser version the release pins
//! ([`Images::rest_api_version`]).
//!
//! Partitions: with none in the spec, each NodeSet gets its own partition through the NodeSet's
//! `partition` field (`PartitionName=<pool> Nodes=<pool>`, which is what the operator writes
//! into `slurm.conf` for an enabled NodeSet partition), the first pool's with `Default=YES`.
//! With partitions in the spec, NodeSet partitions are off and the Controller's `extraConf`
//! carries one `PartitionName=<name> Nodes=<nodeset>,... Default=YES|NO [MaxTime=...] State=UP`
//! line each (the operator declares a Slurm `NodeSet=<name>` for every NodeSet CR, and `Nodes=`
//! accepts NodeSet names). GPUs: `Gres=gpu:<n>` in the NodeSet's `extraConf` (the operator passes
//! it to slurmd as `--conf`), `nvidia.com/gpu: <n>` as the slurmd container's limit, and
//! `GresTypes=gpu` in the Controller's `extraConf`. An elastic pool's `max` nodes of its class are
//! declared there too, as `FUTURE` nodes its pods never take the names of
//! ([`elastic::future_nodes`]: why, and why not `CLOUD` nodes), so that work for its machines to
//! come is accepted and pends.
//!
//! Readiness ([`SlurmStatus`]), in order, each missing item named in `reason`:
//! `MariaDbReady` (its StatefulSet), `SlurmAccountingReady` (the operator's StatefulSet
//! `<accounting>-accounting`), `SlurmControllerReady` (StatefulSet `<controller>-controller`),
//! `SlurmRestApiReady` (Deployment `<restapi>-restapi`), `SlurmLoginReady` (Deployment
//! `<loginset>`), `NodeSetsReady: <pool> <ready>/<count>, ...` (the NodeSet's
//! `status.observedGeneration` current and `status.replicas` == `status.readyReplicas` ==
//! `count`), then `SlurmRestApiPing` ([`SlurmProbe::ping`], asked once slurmctld and slurmrestd
//! are ready; while anything else waits, its answer nudges the operator about the NodeSets still
//! without their pods: `slurm/nudge.rs` says why). A
//! workload is ready when its `status.observedGeneration` is current and its ready (and
//! updated) replicas reach `spec.replicas`. The workload names are those of the operator's
//! sources (`api/v1beta1/*_keys.go`, `internal/builder/*builder`).
//!
//! `rest_api` and `login_ssh` are the Services `<restapi>-restapi` (port 6820) and `<loginset>`
//! (port 22): a LoadBalancer ingress address when there is one, else `clusterIP:port`. The login
//! SSH host keys are the public halves the operator publishes in `<loginset>-ssh-host-keys`
//! ([`login_host_keys`]), shown with their SHA-256 fingerprints.
//!
//! Draining ([`SlurmDriver::drain_node`], a release; `release.rs` says why, from the operator's
//! scale-down): every NodeSet pod on the Node gets its Slurm node drained through slurmrestd
//! ([`SlurmProbe::drain`], by its Slurm node name: the pod label
//! `nodeset.slinky.slurm.net/pod-hostname`, else the pod's hostname or name) with
//! [`DRAIN_REASON`] (prefix `paddock:release`); the Node is not cordoned (the operator would drain
//! with its own reason: the Node's drain, [`crate::drain`], cordons once the pods are gone).
//! While those pods are not handed over, the NodeSet keeps counting them ([`replicas`]: the
//! pool's count, or the pods not handed over on the pool's Nodes if more); once Slurm reports
//! their nodes drained they are handed over (the lowest `pod-deletion-cost`), the next
//! `ensure_slurm` lowers `replicas`, and the operator deletes exactly those pods.
//!
//! Reading health ([`SlurmDriver::node_states`], `health.rs`): every Slurm node a NodeSet pod on a
//! Node runs, as slurmrestd's `GET /slurm/<version>/nodes` reports it (state flags and reason),
//! with that Node; the worker rates the node's machine from it (only a `paddock:hw:` drain reason
//! is a fault). Tested against a slurmrestd stand-in; the real-Slurm proof comes with the
//! real-Slurm path.
//!
//! People ([`SlurmDriver::sync_identity`], `slurm/accounting.rs`): the tenant's users, accounts,
//! QOS and associations written through slurmrestd's `slurmdb` endpoints in the pinned version.
//!
//! Demand ([`SlurmDriver::job_demand`], elastic pools): the jobs and nodes slurmctld knows, read
//! through slurmrestd ([`SlurmProbe::queue`]) in the pinned version, become each pool's pending
//! work and idle nodes by the rules of `slurm/demand.rs`.
//!
//! Removing ([`SlurmDriver::remove_slurm`]): every NodeSet paddock applied, the LoginSet,
//! RestApi, Controller and Accounting, MariaDB (StatefulSet, Service, PVCs), the ConfigMap and the
//! Secrets; `Gone` once none is left. The namespace stays (objects the operator created are
//! owned by the CRs and go with them).
//!
//! Known limit: a pool named like one of the fixed names (`slurm-mariadb`, `slurm-controller`,
//! ...) would have NodeSet pods named like those objects' pods.

pub mod accounting;
mod demand;
pub mod elastic;
#[cfg(test)]
mod fixtures;
mod health;
pub mod nudge;
pub mod objects;
mod probe;
mod release;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::FutureExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::chrono::Utc;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client, Resource};
use paddock_domain::driver::{
    BoxFuture, Demand, DemandPool, DriverError, Removal, SlurmDesired, SlurmDrain, SlurmDriver, SlurmFault,
    SlurmNodeState, SlurmPool, SlurmStatus, SlurmVersion, TenantAccess,
};
use paddock_domain::stack::{self, SlurmImages, SlurmRelease, StackDefinition};
use paddock_types::cluster::{NodePoolRole, SlurmSpec};
use paddock_types::ClusterId;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tracing::{debug, info, instrument};

pub use demand::{
    curable, demand_of, parse_jobs, parse_nodes, NoVal, SlurmJob, SlurmNode, SlurmQueue, CURABLE_REASONS,
};
use objects::{
    accounting, config_files, controller, controller_pods, crash_loop, deployment_ready, has_gpus, labels,
    login_host_keys, loginset, mariadb_service, mariadb_statefulset, nodeset, nodeset_progress, restapi, secret_bodies,
    service_address, statefulset_ready,
};
pub use probe::{needs_drain, node_drained, ping_succeeded, ServiceProxyProbe, SlurmProbe, REASON_PREFIX, SLURM_USER};
pub use release::{handed_over, replicas, ANNOTATION_HANDED_OVER, ANNOTATION_POD_DELETION_COST, HANDED_OVER_COST};

use crate::apply::{get_and_converge, Target};
use crate::isolation::MANAGER;
use crate::KubeError;

/// The Slinky API group.
pub const GROUP: &str = "slinky.slurm.net";
/// The Slinky API version.
pub const VERSION: &str = "v1beta1";

/// The default namespace of Slurm in a tenant cluster.
pub const NAMESPACE: &str = "slurm";
/// The default storage class (the base stack's).
pub const DEFAULT_STORAGE_CLASS: &str = "local-path";

/// The `auth/slurm` key Secret and its key.
pub const SECRET_SLURM_KEY: &str = "slurm-key";
/// Key of [`SECRET_SLURM_KEY`].
pub const SECRET_SLURM_KEY_KEY: &str = "slurm.key";
/// The JWT HS256 key Secret.
pub const SECRET_JWT: &str = "slurm-jwt-hs256";
/// Key of [`SECRET_JWT`].
pub const SECRET_JWT_KEY: &str = "jwt_hs256.key";
/// The accounting database password Secret.
pub const SECRET_DB: &str = "slurm-db";
/// Key of [`SECRET_DB`].
pub const SECRET_DB_KEY: &str = "password";
/// The LoginSet's `sssd.conf` Secret.
pub const SECRET_SSSD: &str = "slurm-sssd-conf";
/// Key of [`SECRET_SSSD`].
pub const SECRET_SSSD_KEY: &str = "sssd.conf";
/// Extra Slurm configuration files (`gres.conf`), mounted by the Controller.
pub const CONFIG_FILES: &str = "slurm-config-files";

/// MariaDB's StatefulSet and headless Service.
pub const MARIADB: &str = "slurm-mariadb";
/// MariaDB's image, pinned (the 11.4 LTS series).
/// MariaDB's volume size.
pub const MARIADB_STORAGE: &str = "8Gi";
/// The accounting database and its user.
pub const DATABASE: &str = "slurm_acct_db";
/// The accounting database user.
pub const DATABASE_USER: &str = "slurm";

/// The `Accounting` CR.
pub const ACCOUNTING: &str = "slurm";
/// The `Controller` CR.
pub const CONTROLLER: &str = "slurm";
/// The `RestApi` CR.
pub const RESTAPI: &str = "slurm";
/// The `LoginSet` CR.
pub const LOGINSET: &str = "slurm-login";
/// slurmctld's state volume size.
pub const CONTROLLER_STORAGE: &str = "4Gi";

/// The operator's StatefulSet of the Accounting (`<name>-accounting`).
pub const ACCOUNTING_WORKLOAD: &str = "slurm-accounting";
/// The operator's StatefulSet of the Controller (`<name>-controller`).
pub const CONTROLLER_WORKLOAD: &str = "slurm-controller";
/// The operator's Deployment and Service of the RestApi (`<name>-restapi`).
pub const RESTAPI_SERVICE: &str = "slurm-restapi";
/// slurmrestd's port.
pub const RESTAPI_PORT: u16 = 6820;
/// The operator's Deployment and Service of the LoginSet (its name).
pub const LOGIN_SERVICE: &str = LOGINSET;
/// The Secret in which the operator publishes the login pods' SSH host keys
/// (`<loginset>-ssh-host-keys`: `ssh_host_<type>_key` and `ssh_host_<type>_key.pub`).
pub const LOGIN_HOST_KEYS_SECRET: &str = "slurm-login-ssh-host-keys";

/// Label marking the objects of this driver (value [`MANAGER`]: `app.kubernetes.io/managed-by`
/// alone would also match other paddock objects).
pub const LABEL_SLURM: &str = "paddock.dev/slurm";
/// The Slinky pod label naming a NodeSet pod's Slurm node.
pub const LABEL_POD_HOSTNAME: &str = "nodeset.slinky.slurm.net/pod-hostname";
/// The Slinky Node annotation with the reason of the Slurm DRAIN of a cordoned Node.
pub const ANNOTATION_CORDON_REASON: &str = "nodeset.slinky.slurm.net/node-cordon-reason";
/// The controller's entry in what Slurm waits for.
const CONTROLLER_WAITING: &str = "SlurmControllerReady";
/// slurmrestd's entry in what Slurm waits for.
const RESTAPI_WAITING: &str = "SlurmRestApiReady";
/// The NodeSets' entry in what Slurm waits for.
const NODESETS_WAITING: &str = "NodeSetsReady";

/// The reason paddock drains a released machine's Slurm node with (prefix `paddock:release`).
pub const DRAIN_REASON: &str = paddock_domain::health::SLURM_RELEASE_REASON;

/// The images the driver deploys, by base stack version: each stack definition's `slurm` section
/// ([`SlurmImages`]); a cluster runs the images of its own stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmCatalog {
    stacks: BTreeMap<String, SlurmImages>,
    /// The deployment's registry, replacing the catalogue's (`PADDOCK_SLURM_IMAGE_REGISTRY`).
    registry: Option<String>,
}

impl SlurmCatalog {
    /// The catalog of these stack definitions (those with a `slurm` section).
    pub fn of<'a>(definitions: impl IntoIterator<Item = &'a StackDefinition>) -> Self {
        let stacks = definitions.into_iter().filter_map(|d| Some((d.version.clone(), d.slurm.clone()?))).collect();
        Self { stacks, registry: None }
    }

    /// The same catalog with every image taken from `registry` instead (None: the catalogue's
    /// own), names and tags kept: `<registry>/slurmctld:<tag>`, `<registry>/mariadb:<tag>`. The
    /// value was checked at start ([`paddock_domain::stack::is_image_registry`]).
    pub fn with_registry(mut self, registry: Option<String>) -> Self {
        self.registry = registry.map(|r| r.trim_end_matches('/').to_owned());
        self
    }

    /// The catalog of every embedded stack definition (the ones the binary applies).
    pub fn embedded() -> Self {
        Self::of(stack::definitions())
    }

    /// The images of Slurm `version` on base stack `stack`; an unknown stack or a Slurm release
    /// the stack does not run is a permanent error (`slurm_version_unsupported`).
    pub fn images(&self, stack: &str, version: &str) -> Result<Images<'_>, DriverError> {
        let images = self.stacks.get(stack);
        if let Some((images, release)) = images.and_then(|i| Some((i, i.release(version)?))) {
            return Ok(Images { images, release, registry: self.registry.as_deref() });
        }
        let supported = images.map(SlurmImages::versions).unwrap_or_default().join(", ");
        Err(DriverError::permanent(
            "slurm_version_unsupported",
            format!("Slurm {version} is not supported by the base stack {stack} (supported: {supported})"),
        ))
    }
}

/// The images of one cluster's Slurm: a release of its stack's catalog.
#[derive(Debug, Clone, Copy)]
pub struct Images<'a> {
    images: &'a SlurmImages,
    release: &'a SlurmRelease,
    /// The deployment's registry, when it names one.
    registry: Option<&'a str>,
}

impl Images<'_> {
    /// A Slinky component's image (`slurmctld`, `slurmd`, `slurmdbd`, `slurmrestd`, `login`).
    pub fn of(&self, component: &str) -> String {
        let registry = self.registry.unwrap_or_else(|| self.images.registry_of(self.release));
        format!("{}/{component}:{}", registry.trim_end_matches('/'), self.release.image_tag)
    }

    /// MariaDB's image.
    pub fn mariadb(&self) -> String {
        match self.registry {
            Some(registry) => format!("{registry}/{}", self.images.mariadb_name()),
            None => self.images.mariadb_image.clone(),
        }
    }

    /// The slurmrestd data-parser version paddock speaks to this release.
    pub fn rest_api_version(&self) -> &str {
        self.release.rest_api_version()
    }
}

/// The `ApiResource` of a Slinky kind.
pub fn api_resource(kind: &str) -> ApiResource {
    let plural = match kind {
        "RestApi" => "restapis".to_owned(),
        other => format!("{}s", other.to_ascii_lowercase()),
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, kind), &plural)
}

/// The Slurm `ClusterName` of a tenant cluster: `c` and its id's 32 hex digits (lowercase, no
/// dashes, so it also makes valid MariaDB table names).
pub fn cluster_name(cluster: ClusterId) -> String {
    format!("c{}", cluster.to_string().replace('-', ""))
}

/// Settings of the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlinkySettings {
    /// The namespace in every tenant cluster.
    pub namespace: String,
    /// The storage class of MariaDB's and slurmctld's volumes (the tenant stack's).
    pub storage_class: String,
    /// The images, from the tenant stack's definition.
    pub catalog: SlurmCatalog,
}

impl Default for SlinkySettings {
    /// The default namespace and storage class, and the images of the newest embedded stack.
    fn default() -> Self {
        Self {
            namespace: NAMESPACE.to_owned(),
            storage_class: DEFAULT_STORAGE_CLASS.to_owned(),
            catalog: SlurmCatalog::embedded(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The driver.

/// Slurm in tenant clusters through Slinky (see the module documentation).
pub struct SlinkyDriver {
    settings: SlinkySettings,
    probe: Arc<dyn SlurmProbe>,
}

impl std::fmt::Debug for SlinkyDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlinkyDriver").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// Converges one object (read, applied only when it lacks one of paddock's fields) and adds it to
/// `changed` when that created or corrected it.
async fn apply<K>(
    changed: &mut Vec<String>,
    api: &Api<K>,
    kind: &'static str,
    ns: &str,
    name: &str,
    body: &Value,
) -> Result<K, KubeError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let full_name = format!("{ns}/{name}");
    let target = Target { kind, name, full_name: &full_name };
    let converged = get_and_converge(api, target, body).await?;
    if converged.changed {
        changed.push(target.describe());
    }
    Ok(converged.object)
}

async fn get<K>(api: &Api<K>, kind: &'static str, ns: &str, name: &str) -> Result<Option<K>, KubeError>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.map_err(|source| KubeError::api("get", kind, format!("{ns}/{name}"), source))
}

/// Deletes `name` (NotFound counts as done) and reports whether it still exists (finalizers, a
/// pending graceful deletion). A kind whose CRD is not installed has nothing left.
async fn remove<K>(api: &Api<K>, kind: &'static str, ns: &str, name: &str) -> Result<bool, KubeError>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(false),
        Err(source) => return Err(KubeError::api("delete", kind, format!("{ns}/{name}"), source)),
        Ok(_) => {}
    }
    match api.get_opt(name).await {
        Ok(found) => Ok(found.is_some()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(source) => Err(KubeError::api("get", kind, format!("{ns}/{name}"), source)),
    }
}

impl SlinkyDriver {
    /// A driver with `settings`, asking slurmrestd through `probe`.
    pub fn new(settings: SlinkySettings, probe: Arc<dyn SlurmProbe>) -> Self {
        Self { settings, probe }
    }

    /// The production driver: [`ServiceProxyProbe`] in the settings' namespace.
    pub fn with_service_proxy(settings: SlinkySettings) -> Self {
        let probe = Arc::new(ServiceProxyProbe::new(settings.namespace.clone()));
        Self::new(settings, probe)
    }

    /// The settings.
    pub fn settings(&self) -> &SlinkySettings {
        &self.settings
    }

    fn dynamic(&self, client: &Client, kind: &str) -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), &self.settings.namespace, &api_resource(kind))
    }

    /// Applies the cluster's Slurm and reports where it stands (see the module documentation):
    /// the objects applied, NodeSets of pools that are gone pruned, readiness read, endpoints
    /// found.
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id))]
    pub async fn ensure_slurm(
        &self,
        tenant: &TenantAccess,
        desired: &SlurmDesired,
    ) -> Result<SlurmStatus, DriverError> {
        let images = self.settings.catalog.images(&desired.stack_version, &desired.spec.version)?;
        let cluster = tenant.cluster.cluster_id;
        let client = crate::nodes::tenant_client(tenant).await?;
        let mut changed = Vec::new();
        crate::apply::ensure_namespace(&client, &self.settings.namespace, labels(cluster), &mut changed).await?;
        let compute = compute_pools(desired);
        let mariadb = self.apply_objects(&mut changed, &client, cluster, images, desired).await?;
        let nodesets = self.apply_nodesets(&mut changed, &client, cluster, images, &desired.spec, &compute).await?;
        self.prune_nodesets(&client, cluster, &compute).await?;
        let mut waiting = self.waiting(&client, &mariadb, &nodesets).await?;
        let fault = match waiting.iter().any(|w| w == CONTROLLER_WAITING) {
            true => self.controller_fault(&client).await?,
            false => None,
        };
        self.ping(tenant, &client, images, &nodesets, &mut waiting).await?;
        let mut status = self.endpoints(&client, waiting).await?;
        status.fault = fault;
        if !changed.is_empty() {
            info!(cluster.id = %cluster, changed = ?changed, "applied Slurm objects of cluster {cluster}");
        }
        status.changed = changed;
        debug!(cluster.id = %cluster, ready = status.ready, reason = %status.reason, "ensured Slurm");
        Ok(status)
    }

    /// Pings slurmctld through slurmrestd once slurmctld and slurmrestd are ready. When nothing
    /// else is `waiting`, a failed ping is; before that, an answer nudges the NodeSets still
    /// without their pods (`slurm/nudge.rs`), whatever else (MariaDB's probe, the login pods)
    /// is still coming.
    async fn ping(
        &self,
        tenant: &TenantAccess,
        client: &Client,
        images: Images<'_>,
        nodesets: &[(&SlurmPool, u32, DynamicObject)],
        waiting: &mut Vec<String>,
    ) -> Result<(), KubeError> {
        if waiting.iter().any(|w| w == CONTROLLER_WAITING || w == RESTAPI_WAITING) {
            return Ok(());
        }
        match (waiting.is_empty(), self.probe.ping(tenant, images.rest_api_version()).await) {
            (false, Ok(true)) => {
                let objects: Vec<&DynamicObject> = nodesets.iter().map(|(_, _, o)| o).collect();
                let api = self.dynamic(client, "NodeSet");
                nudge::nudge_unstarted(&api, &self.settings.namespace, &objects, Utc::now()).await?;
            }
            (false, _) | (true, Ok(true)) => {}
            (true, Ok(false)) => waiting.push("SlurmRestApiPing".to_owned()),
            (true, Err(e)) => waiting.push(format!("SlurmRestApiPing ({e})")),
        }
        Ok(())
    }

    /// Applies the Secrets, the ConfigMap, MariaDB and the Slinky custom resources but the
    /// NodeSets; MariaDB's StatefulSet as applied.
    async fn apply_objects(
        &self,
        changed: &mut Vec<String>,
        client: &Client,
        cluster: ClusterId,
        images: Images<'_>,
        desired: &SlurmDesired,
    ) -> Result<StatefulSet, KubeError> {
        let ns = self.settings.namespace.as_str();
        let storage_class = &self.settings.storage_class;
        let (pools, system) = (compute_pools(desired), system_pool(desired));
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        for (name, body) in secret_bodies(ns, cluster, &desired.secrets) {
            apply(changed, &secrets, "Secret", ns, name, &body).await?;
        }
        if has_gpus(&pools) {
            let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
            apply(changed, &config_maps, "ConfigMap", ns, CONFIG_FILES, &config_files(ns, cluster)).await?;
        }
        let services: Api<Service> = Api::namespaced(client.clone(), ns);
        apply(changed, &services, "Service", ns, MARIADB, &mariadb_service(ns, cluster)).await?;
        let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
        let mariadb = mariadb_statefulset(ns, cluster, storage_class, &images.mariadb(), system);
        let mariadb = apply(changed, &statefulsets, "StatefulSet", ns, MARIADB, &mariadb).await?;
        let objects = [
            ("Accounting", ACCOUNTING, accounting(ns, cluster, images, system)),
            ("Controller", CONTROLLER, controller(ns, cluster, images, storage_class, &desired.spec, &pools, system)),
            ("RestApi", RESTAPI, restapi(ns, cluster, images, system)),
            ("LoginSet", LOGINSET, loginset(ns, cluster, images, &desired.spec, system)),
        ];
        for (kind, name, body) in &objects {
            apply(changed, &self.dynamic(client, kind), kind, ns, name, body).await?;
        }
        Ok(mariadb)
    }

    /// Applies one NodeSet per pool; each pool with the pods its NodeSet counts beyond the pool's
    /// count (see [`replicas`]) and its NodeSet as applied.
    async fn apply_nodesets<'p>(
        &self,
        changed: &mut Vec<String>,
        client: &Client,
        cluster: ClusterId,
        images: Images<'_>,
        spec: &SlurmSpec,
        pools: &'p [SlurmPool],
    ) -> Result<Vec<(&'p SlurmPool, u32, DynamicObject)>, KubeError> {
        let ns = self.settings.namespace.as_str();
        let nodesets = self.dynamic(client, "NodeSet");
        let own_partitions = spec.partitions.is_empty();
        let pods = self.slurm_pods(client).await?;
        let mut applied = Vec::new();
        for (i, pool) in pools.iter().enumerate() {
            // The pods of machines being released stay counted until paddock drained their
            // Slurm nodes and handed them over: the operator then removes exactly those.
            let replicas = replicas(&pods, pool);
            let held = replicas - pool.count;
            let body = nodeset(ns, cluster, images, pool, replicas, own_partitions, i == 0);
            let object = apply(changed, &nodesets, "NodeSet", ns, &pool.name, &body).await?;
            applied.push((pool, held, object));
        }
        Ok(applied)
    }

    /// Deletes the NodeSets paddock applied for pools that are gone.
    async fn prune_nodesets(&self, client: &Client, cluster: ClusterId, pools: &[SlurmPool]) -> Result<(), KubeError> {
        let ns = self.settings.namespace.as_str();
        let nodesets = self.dynamic(client, "NodeSet");
        let wanted: BTreeSet<&str> = pools.iter().map(|p| p.name.as_str()).collect();
        let selector = format!("{LABEL_SLURM}={MANAGER}");
        let existing = nodesets
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|source| KubeError::api("list", "NodeSet", ns, source))?;
        for stale in existing.items.iter().filter_map(|n| n.metadata.name.as_deref()) {
            if !wanted.contains(stale) {
                remove(&nodesets, "NodeSet", ns, stale).await?;
                info!(cluster.id = %cluster, "deleting NodeSet {ns}/{stale}: its pool is gone");
            }
        }
        Ok(())
    }

    /// What Slurm still waits for, in order (empty: every workload is ready).
    async fn waiting(
        &self,
        client: &Client,
        mariadb: &StatefulSet,
        nodesets: &[(&SlurmPool, u32, DynamicObject)],
    ) -> Result<Vec<String>, KubeError> {
        let ns = self.settings.namespace.as_str();
        let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
        let mut waiting = Vec::new();
        if !statefulset_ready(mariadb) {
            waiting.push("MariaDbReady".to_owned());
        }
        for (name, condition) in
            [(ACCOUNTING_WORKLOAD, "SlurmAccountingReady"), (CONTROLLER_WORKLOAD, CONTROLLER_WAITING)]
        {
            if !get(&statefulsets, "StatefulSet", ns, name).await?.as_ref().is_some_and(statefulset_ready) {
                waiting.push(condition.to_owned());
            }
        }
        for (name, condition) in [(RESTAPI_SERVICE, RESTAPI_WAITING), (LOGIN_SERVICE, "SlurmLoginReady")] {
            if !get(&deployments, "Deployment", ns, name).await?.as_ref().is_some_and(deployment_ready) {
                waiting.push(condition.to_owned());
            }
        }
        let behind: Vec<String> = nodesets
            .iter()
            .filter_map(|(pool, held, object)| {
                let (ready, ok) = nodeset_progress(object, pool.count);
                let releasing = if *held > 0 { format!(" ({held} draining for release)") } else { String::new() };
                (!ok).then(|| format!("{} {ready}/{}{releasing}", pool.name, pool.count))
            })
            .collect();
        if !behind.is_empty() {
            waiting.push(format!("{NODESETS_WAITING}: {}", behind.join(", ")));
        }
        Ok(waiting)
    }

    /// Why the controller is not ready when waiting will not make it: a crash loop of one of its
    /// pods' containers ([`crash_loop`]).
    async fn controller_fault(&self, client: &Client) -> Result<Option<SlurmFault>, KubeError> {
        let ns = self.settings.namespace.as_str();
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let listed = pods
            .list(&ListParams::default().labels(&controller_pods()))
            .await
            .map_err(|source| KubeError::api("list", "Pod", ns, source))?;
        Ok(crash_loop(&listed.items))
    }

    /// The status: ready when nothing is `waiting`, with the REST API and login endpoints and the
    /// login host keys.
    async fn endpoints(&self, client: &Client, waiting: Vec<String>) -> Result<SlurmStatus, KubeError> {
        let ns = self.settings.namespace.as_str();
        let services: Api<Service> = Api::namespaced(client.clone(), ns);
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        let rest_api = get(&services, "Service", ns, RESTAPI_SERVICE).await?.as_ref().and_then(service_address);
        let login_ssh = get(&services, "Service", ns, LOGIN_SERVICE).await?.as_ref().and_then(service_address);
        let login_ssh_host_keys = get(&secrets, "Secret", ns, LOGIN_HOST_KEYS_SECRET)
            .await?
            .as_ref()
            .map(login_host_keys)
            .unwrap_or_default();
        Ok(SlurmStatus {
            ready: waiting.is_empty(),
            reason: waiting.join("; "),
            rest_api,
            login_ssh,
            login_ssh_host_keys,
            changed: Vec::new(),
            fault: None,
        })
    }

    /// Drains the Slurm node(s) on the Kubernetes Node `node_name` and hands their pods to the
    /// NodeSet's scale-down (see the module documentation), speaking the slurmrestd version
    /// `slurm`'s release pins.
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id, node.name = %node_name))]
    pub async fn drain_node(
        &self,
        tenant: &TenantAccess,
        slurm: &SlurmVersion,
        node_name: &str,
    ) -> Result<SlurmDrain, DriverError> {
        let images = self.settings.catalog.images(&slurm.stack_version, &slurm.version)?;
        self.drain_and_hand_over(tenant, images.rest_api_version(), node_name).await
    }

    /// The demand of `pools` (the rules of `slurm/demand.rs`), read through slurmrestd in the version
    /// `slurm`'s release pins.
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id))]
    pub async fn job_demand(
        &self,
        tenant: &TenantAccess,
        slurm: &SlurmVersion,
        pools: &[DemandPool],
    ) -> Result<Demand, DriverError> {
        let images = self.settings.catalog.images(&slurm.stack_version, &slurm.version)?;
        let queue = self.probe.queue(tenant, images.rest_api_version()).await?;
        Ok(demand_of(pools, &queue))
    }

    /// Deletes the cluster's Slurm; `Gone` once none of its objects is left.
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id))]
    pub async fn remove_slurm(&self, tenant: &TenantAccess) -> Result<Removal, DriverError> {
        let client = crate::nodes::tenant_client(tenant).await?;
        let ns = self.settings.namespace.as_str();
        let mut left = false;

        let selector = format!("{LABEL_SLURM}={MANAGER}");
        let nodesets = self.dynamic(&client, "NodeSet");
        match nodesets.list(&ListParams::default().labels(&selector)).await {
            Ok(list) => {
                for name in list.items.iter().filter_map(|n| n.metadata.name.as_deref()) {
                    left |= remove(&nodesets, "NodeSet", ns, name).await?;
                }
            }
            // No such resource (the CRDs are not installed): no NodeSet can exist.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => return Err(KubeError::api("list", "NodeSet", ns, source).into()),
        }
        for (kind, name) in
            [("LoginSet", LOGINSET), ("RestApi", RESTAPI), ("Controller", CONTROLLER), ("Accounting", ACCOUNTING)]
        {
            left |= remove(&self.dynamic(&client, kind), kind, ns, name).await?;
        }
        let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
        left |= remove(&statefulsets, "StatefulSet", ns, MARIADB).await?;
        let services: Api<Service> = Api::namespaced(client.clone(), ns);
        left |= remove(&services, "Service", ns, MARIADB).await?;
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
        let claim_list = claims
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|source| KubeError::api("list", "PersistentVolumeClaim", ns, source))?;
        for name in claim_list.items.iter().filter_map(|c| c.metadata.name.as_deref()) {
            left |= remove(&claims, "PersistentVolumeClaim", ns, name).await?;
        }
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        left |= remove(&config_maps, "ConfigMap", ns, CONFIG_FILES).await?;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        for name in [SECRET_SLURM_KEY, SECRET_JWT, SECRET_DB, SECRET_SSSD] {
            left |= remove(&secrets, "Secret", ns, name).await?;
        }
        if left {
            info!(cluster.id = %tenant.cluster.cluster_id, "deleting Slurm in namespace {ns}");
            Ok(Removal::Deleting)
        } else {
            Ok(Removal::Gone)
        }
    }
}

/// The compute pools of a cluster: one NodeSet each, in the desired order.
fn compute_pools(desired: &SlurmDesired) -> Vec<SlurmPool> {
    desired.pools.iter().filter(|p| p.role == NodePoolRole::Compute).cloned().collect()
}

/// The cluster's system pool, the control pods' place.
fn system_pool(desired: &SlurmDesired) -> Option<&SlurmPool> {
    desired.pools.iter().find(|p| p.role == NodePoolRole::System)
}

/// The Slurm node name of a NodeSet pod, None for other pods.
fn slurm_node_name(pod: &Pod) -> Option<String> {
    let labels = pod.metadata.labels.as_ref()?;
    if let Some(host) = labels.get(LABEL_POD_HOSTNAME) {
        return Some(host.clone());
    }
    // A NodeSet pod without the hostname label (older operators): its hostname, else its name.
    labels.keys().any(|k| k.starts_with("nodeset.slinky.slurm.net/")).then(|| {
        pod.spec.as_ref().and_then(|s| s.hostname.clone()).or_else(|| pod.metadata.name.clone()).unwrap_or_default()
    })
}

impl SlurmDriver for SlinkyDriver {
    fn ensure_slurm<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        desired: &'a SlurmDesired,
    ) -> BoxFuture<'a, Result<SlurmStatus, DriverError>> {
        SlinkyDriver::ensure_slurm(self, tenant, desired).boxed()
    }

    fn drain_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        slurm: &'a SlurmVersion,
        node_name: &'a str,
    ) -> BoxFuture<'a, Result<SlurmDrain, DriverError>> {
        SlinkyDriver::drain_node(self, tenant, slurm, node_name).boxed()
    }

    fn remove_slurm<'a>(&'a self, tenant: &'a TenantAccess) -> BoxFuture<'a, Result<Removal, DriverError>> {
        SlinkyDriver::remove_slurm(self, tenant).boxed()
    }

    fn node_states<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        slurm: &'a SlurmVersion,
    ) -> BoxFuture<'a, Result<Vec<SlurmNodeState>, DriverError>> {
        SlinkyDriver::node_states(self, tenant, slurm).boxed()
    }

    fn job_demand<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        slurm: &'a SlurmVersion,
        pools: &'a [DemandPool],
    ) -> BoxFuture<'a, Result<Demand, DriverError>> {
        SlinkyDriver::job_demand(self, tenant, slurm, pools).boxed()
    }

    fn sync_identity<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        slurm: &'a SlurmVersion,
        desired: &'a paddock_domain::slurm_identity::Slurmdb,
    ) -> BoxFuture<'a, Result<Vec<String>, DriverError>> {
        SlinkyDriver::sync_identity(self, tenant, slurm, desired).boxed()
    }
}
