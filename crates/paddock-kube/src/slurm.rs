//! `SlinkyDriver`: the [`SlurmDriver`] (SPEC section 6 step 5) on a tenant cluster's own API
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
//! | `NodeSet` | the pool's name | slurmd pods pinned to the pool's nodes |
//!
//! The three key Secrets hold [`SlurmSecrets`] exactly (their values are base64 already, as the
//! Secret `data` field wants them: the files hold the random bytes), so re-applying them changes
//! nothing (same `resourceVersion`); they are never logged.
//!
//! Images come from the tenant stack's definition ([`SlurmCatalog`], its `slurm` section: a
//! registry, a pinned tag per Slurm version, MariaDB's image; never `latest`), keyed by
//! `spec.version` (an unknown version is the permanent error `slurm_version_unsupported`, before
//! anything is written).
//!
//! Partitions: with none in the spec, each NodeSet gets its own partition through the NodeSet's
//! `partition` field (`PartitionName=<pool> Nodes=<pool>`, which is what the operator writes
//! into `slurm.conf` for an enabled NodeSet partition), the first pool's with `Default=YES`.
//! With partitions in the spec, NodeSet partitions are off and the Controller's `extraConf`
//! carries one `PartitionName=<name> Nodes=<nodeset>,... Default=YES|NO [MaxTime=...] State=UP`
//! line each (the operator declares a Slurm `NodeSet=<name>` for every NodeSet CR, and `Nodes=`
//! accepts NodeSet names). GPUs: `Gres=gpu:<n>` in the NodeSet's `extraConf` (the operator passes
//! it to slurmd as `--conf`), `nvidia.com/gpu: <n>` as the slurmd container's limit, and
//! `GresTypes=gpu` in the Controller's `extraConf`.
//!
//! Readiness ([`SlurmStatus`]), in order, each missing item named in `reason`:
//! `MariaDbReady` (its StatefulSet), `SlurmAccountingReady` (the operator's StatefulSet
//! `<accounting>-accounting`), `SlurmControllerReady` (StatefulSet `<controller>-controller`),
//! `SlurmRestApiReady` (Deployment `<restapi>-restapi`), `SlurmLoginReady` (Deployment
//! `<loginset>`), `NodeSetsReady: <pool> <ready>/<count>, ...` (the NodeSet's
//! `status.observedGeneration` current and `status.replicas` == `status.readyReplicas` ==
//! `count`), then `SlurmRestApiPing` ([`SlurmProbe::ping`], only asked once all else holds). A
//! workload is ready when its `status.observedGeneration` is current and its ready (and
//! updated) replicas reach `spec.replicas`. The workload names are those of the operator's
//! sources (`api/v1beta1/*_keys.go`, `internal/builder/*builder`).
//!
//! `rest_api` and `login_ssh` are the Services `<restapi>-restapi` (port 6820) and `<loginset>`
//! (port 22): a LoadBalancer ingress address when there is one, else `clusterIP:port`. The login
//! SSH host keys are the public halves the operator publishes in `<loginset>-ssh-host-keys`
//! ([`login_host_keys`]), shown with their SHA-256 fingerprints.
//!
//! Draining ([`SlurmDriver::drain_node`]): the Kubernetes Node is cordoned (merge patch, so
//! paddock's server-side apply of the Node's labels in [`crate::nodes`] never takes it back) with
//! the operator's `nodeset.slinky.slurm.net/node-cordon-reason` annotation, which is how Slinky
//! itself drains the Slurm node of a cordoned Kube node; then every NodeSet pod on that node is
//! drained through slurmrestd ([`SlurmProbe::drain`]) by its Slurm node name (the pod label
//! `nodeset.slinky.slurm.net/pod-hostname`, else the pod's hostname or name). True once each is
//! drained, or when none runs there or Slurm does not know it.
//!
//! Removing ([`SlurmDriver::remove_slurm`]): every NodeSet paddock applied, the LoginSet,
//! RestApi, Controller and Accounting, MariaDB (StatefulSet, Service, PVCs), the ConfigMap and the
//! Secrets; `Gone` once none is left. The namespace stays (objects the operator created are
//! owned by the CRs and go with them).
//!
//! Known limit: a pool named like one of the fixed names (`slurm-mariadb`, `slurm-controller`,
//! ...) would have NodeSet pods named like those objects' pods.

mod probe;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::FutureExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, PersistentVolumeClaim, Pod, Secret, Service};
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use paddock_domain::driver::{
    BoxFuture, DriverError, Removal, SlurmDesired, SlurmDriver, SlurmPool, SlurmSecrets, SlurmStatus, TenantAccess,
};
use paddock_domain::ssh;
use paddock_types::cluster::{SlurmSpec, SshHostKey, Taint};
use paddock_types::ClusterId;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tracing::{debug, info, instrument, warn};

pub use probe::{node_drained, ping_succeeded, ServiceProxyProbe, SlurmProbe, REST_API_VERSION, SLURM_USER};

use crate::isolation::{LABEL_CLUSTER_ID, LABEL_MANAGED_BY, MANAGER};
use crate::nodes::{admin_client, admin_kubeconfig, LABEL_NODE_POOL};
use crate::stack::{SlurmImages, StackDefinition};
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
/// The reason paddock drains with.
pub const DRAIN_REASON: &str = "paddock: machine released";

/// A Slurm release a stack runs: its version and the tag of its Slinky images.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmRelease {
    /// `spec.version`.
    pub version: String,
    /// The tag of the Slinky images.
    pub image_tag: String,
}

/// The images the driver deploys: the stack definition's `slurm` section ([`SlurmImages`]) with
/// the registry resolved, so a release carries its image references.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmCatalog {
    images: SlurmImages,
}

impl SlurmCatalog {
    /// The catalog of a stack definition; `None` when it has no `slurm` section.
    pub fn of(definition: &StackDefinition) -> Option<Self> {
        definition.slurm.clone().map(|images| Self { images })
    }

    /// The catalog of the newest embedded stack definition (the one the binary applies by
    /// default).
    pub fn embedded() -> Self {
        let definition = StackDefinition::embedded(crate::stack::latest_version())
            .expect("the embedded stack definitions parse (a unit test checks it)");
        Self::of(&definition).expect("the embedded stack definition has a slurm section (a unit test checks it)")
    }

    /// The release of `version`, if the stack runs it.
    pub fn release(&self, version: &str) -> Option<&SlurmRelease> {
        self.images.releases.iter().find(|r| r.version == version)
    }

    /// The versions the stack runs.
    pub fn versions(&self) -> Vec<&str> {
        self.images.releases.iter().map(|r| r.version.as_str()).collect()
    }

    /// A Slinky component's image (`slurmctld`, `slurmd`, `slurmdbd`, `slurmrestd`, `login`).
    pub fn image(&self, component: &str, release: &SlurmRelease) -> String {
        format!("{}/{component}:{}", self.images.registry.trim_end_matches('/'), release.image_tag)
    }

    /// MariaDB's image.
    pub fn mariadb_image(&self) -> &str {
        &self.images.mariadb_image
    }
}

/// The images of one cluster's Slurm: a release of a catalog.
#[derive(Debug, Clone, Copy)]
pub struct Images<'a> {
    catalog: &'a SlurmCatalog,
    release: &'a SlurmRelease,
}

impl Images<'_> {
    fn of(&self, component: &str) -> String {
        self.catalog.image(component, self.release)
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

fn labels(cluster: ClusterId) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_owned(), MANAGER.to_owned()),
        (LABEL_SLURM.to_owned(), MANAGER.to_owned()),
        (LABEL_CLUSTER_ID.to_owned(), cluster.to_string()),
    ])
}

fn secret_key_ref(name: &str, key: &str) -> Value {
    json!({ "name": name, "key": key })
}

/// A minimal `sssd.conf` for the login pods: local files only (root logs in with SSH keys).
pub const SSSD_CONF: &str = "[sssd]\nconfig_file_version = 2\nservices = nss,pam\ndomains = DEFAULT\n\n[nss]\n\
                             filter_groups = root,slurm\nfilter_users = root,slurm\n\n[pam]\n\n\
                             [domain/DEFAULT]\nid_provider = files\nauth_provider = files\n";

/// The Secrets (name, key, value as the `data` field holds it).
fn secret_bodies(ns: &str, cluster: ClusterId, secrets: &SlurmSecrets) -> Vec<(&'static str, Value)> {
    use base64::Engine;
    let sssd = base64::engine::general_purpose::STANDARD.encode(SSSD_CONF);
    let db = base64::engine::general_purpose::STANDARD.encode(secrets.database_password.expose());
    [
        (SECRET_SLURM_KEY, SECRET_SLURM_KEY_KEY, secrets.slurm_key.expose().to_owned()),
        (SECRET_JWT, SECRET_JWT_KEY, secrets.jwt_hs256_key.expose().to_owned()),
        (SECRET_DB, SECRET_DB_KEY, db),
        (SECRET_SSSD, SECRET_SSSD_KEY, sssd),
    ]
    .into_iter()
    .map(|(name, key, data)| {
        let body = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": { "name": name, "namespace": ns, "labels": labels(cluster) },
            "type": "Opaque",
            "data": { key: data },
        });
        (name, body)
    })
    .collect()
}

/// MariaDB's headless Service.
pub fn mariadb_service(ns: &str, cluster: ClusterId) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": MARIADB, "namespace": ns, "labels": labels(cluster) },
        "spec": {
            "clusterIP": "None",
            "selector": { "app.kubernetes.io/name": MARIADB },
            "ports": [{ "name": "mysql", "port": 3306, "targetPort": 3306 }],
        },
    })
}

/// MariaDB's StatefulSet: one replica, one volume of `storage_class`, the database and user of
/// the accounting, the password from [`SECRET_DB`].
pub fn mariadb_statefulset(ns: &str, cluster: ClusterId, storage_class: &str, image: &str) -> Value {
    let password = json!({ "secretKeyRef": secret_key_ref(SECRET_DB, SECRET_DB_KEY) });
    let mut pod_labels = labels(cluster);
    pod_labels.insert("app.kubernetes.io/name".to_owned(), MARIADB.to_owned());
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": { "name": MARIADB, "namespace": ns, "labels": labels(cluster) },
        "spec": {
            "replicas": 1,
            "serviceName": MARIADB,
            "selector": { "matchLabels": { "app.kubernetes.io/name": MARIADB } },
            "template": {
                "metadata": { "labels": pod_labels },
                "spec": {
                    "automountServiceAccountToken": false,
                    "containers": [{
                        "name": "mariadb",
                        "image": image,
                        "env": [
                            { "name": "MARIADB_DATABASE", "value": DATABASE },
                            { "name": "MARIADB_USER", "value": DATABASE_USER },
                            { "name": "MARIADB_PASSWORD", "valueFrom": password },
                            { "name": "MARIADB_RANDOM_ROOT_PASSWORD", "value": "1" },
                        ],
                        "ports": [{ "name": "mysql", "containerPort": 3306 }],
                        "readinessProbe": {
                            "exec": { "command": ["healthcheck.sh", "--connect", "--innodb_initialized"] },
                            "periodSeconds": 10,
                        },
                        "volumeMounts": [{ "name": "data", "mountPath": "/var/lib/mysql" }],
                    }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": { "name": "data", "labels": labels(cluster) },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": storage_class,
                    "resources": { "requests": { "storage": MARIADB_STORAGE } },
                },
            }],
        },
    })
}

fn cr(kind: &str, name: &str, ns: &str, cluster: ClusterId, spec: Value) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": kind,
        "metadata": { "name": name, "namespace": ns, "labels": labels(cluster) },
        "spec": spec,
    })
}

/// The `Accounting`.
pub fn accounting(ns: &str, cluster: ClusterId, images: Images<'_>) -> Value {
    cr(
        "Accounting",
        ACCOUNTING,
        ns,
        cluster,
        json!({
            "slurmKeyRef": secret_key_ref(SECRET_SLURM_KEY, SECRET_SLURM_KEY_KEY),
            "jwtHs256KeyRef": secret_key_ref(SECRET_JWT, SECRET_JWT_KEY),
            "slurmdbd": { "image": images.of("slurmdbd") },
            "storageConfig": {
                "host": MARIADB,
                "port": 3306,
                "database": DATABASE,
                "username": DATABASE_USER,
                "passwordKeyRef": secret_key_ref(SECRET_DB, SECRET_DB_KEY),
            },
        }),
    )
}

fn has_gpus(pools: &[SlurmPool]) -> bool {
    pools.iter().any(|p| p.gpus_per_node > 0)
}

/// The Controller's `extraConf`: `GresTypes=gpu` when a pool has GPUs, and the spec's
/// partitions (none when the spec has none: the NodeSets then carry one each).
pub fn controller_extra_conf(spec: &SlurmSpec, pools: &[SlurmPool]) -> String {
    let mut lines = Vec::new();
    if has_gpus(pools) {
        lines.push("GresTypes=gpu".to_owned());
    }
    let known: BTreeSet<&str> = pools.iter().map(|p| p.name.as_str()).collect();
    for partition in &spec.partitions {
        let mut line = format!("PartitionName={}", partition.name);
        let nodes: Vec<&str> = partition.node_pools.iter().map(String::as_str).filter(|p| known.contains(p)).collect();
        if !nodes.is_empty() {
            line.push_str(&format!(" Nodes={}", nodes.join(",")));
        }
        line.push_str(if partition.default { " Default=YES" } else { " Default=NO" });
        if let Some(max_time) = partition.max_time.as_deref().filter(|t| !t.is_empty()) {
            line.push_str(&format!(" MaxTime={max_time}"));
        }
        line.push_str(" State=UP");
        lines.push(line);
    }
    lines.join("\n")
}

/// The `Controller`.
pub fn controller(
    ns: &str,
    cluster: ClusterId,
    images: Images<'_>,
    storage_class: &str,
    spec: &SlurmSpec,
    pools: &[SlurmPool],
) -> Value {
    let mut body = json!({
        "clusterName": cluster_name(cluster),
        "slurmKeyRef": secret_key_ref(SECRET_SLURM_KEY, SECRET_SLURM_KEY_KEY),
        "jwtHs256KeyRef": secret_key_ref(SECRET_JWT, SECRET_JWT_KEY),
        "accountingRef": { "name": ACCOUNTING },
        "slurmctld": { "image": images.of("slurmctld") },
        "reconfigure": { "image": images.of("slurmctld") },
        "persistence": {
            "enabled": true,
            "storageClassName": storage_class,
            "accessModes": ["ReadWriteOnce"],
            "resources": { "requests": { "storage": CONTROLLER_STORAGE } },
        },
    });
    let extra = controller_extra_conf(spec, pools);
    if !extra.is_empty() {
        body["extraConf"] = json!(extra);
    }
    if has_gpus(pools) {
        body["configFileRefs"] = json!([{ "name": CONFIG_FILES }]);
    }
    cr("Controller", CONTROLLER, ns, cluster, body)
}

/// The `RestApi`.
pub fn restapi(ns: &str, cluster: ClusterId, images: Images<'_>) -> Value {
    cr(
        "RestApi",
        RESTAPI,
        ns,
        cluster,
        json!({
            "controllerRef": { "name": CONTROLLER },
            "replicas": 1,
            "slurmrestd": { "image": images.of("slurmrestd") },
        }),
    )
}

/// The `LoginSet`: replicas and root's authorized keys from the spec.
pub fn loginset(ns: &str, cluster: ClusterId, images: Images<'_>, spec: &SlurmSpec) -> Value {
    let mut body = json!({
        "controllerRef": { "name": CONTROLLER },
        "replicas": spec.login.replicas,
        "login": { "image": images.of("login") },
        "sssdConfRef": secret_key_ref(SECRET_SSSD, SECRET_SSSD_KEY),
        "service": { "spec": { "type": "LoadBalancer" } },
    });
    if !spec.login.ssh_authorized_keys.is_empty() {
        let mut keys = spec.login.ssh_authorized_keys.join("\n");
        keys.push('\n');
        body["rootSshAuthorizedKeys"] = json!(keys);
    }
    cr("LoginSet", LOGINSET, ns, cluster, body)
}

fn effect(t: &Taint) -> String {
    serde_json::to_value(t.effect).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// The tolerations of a pool's taints (Exists when the taint has no value).
pub fn tolerations(taints: &[Taint]) -> Vec<Value> {
    taints
        .iter()
        .map(|t| {
            if t.value.is_empty() {
                json!({ "key": t.key, "operator": "Exists", "effect": effect(t) })
            } else {
                json!({ "key": t.key, "operator": "Equal", "value": t.value, "effect": effect(t) })
            }
        })
        .collect()
}

/// A pool's `NodeSet`: `count` replicas pinned to the pool's nodes, GPUs as GRES, and its own
/// partition when the spec has none (`default`: the first pool's).
pub fn nodeset(
    ns: &str,
    cluster: ClusterId,
    images: Images<'_>,
    pool: &SlurmPool,
    own_partition: bool,
    default: bool,
) -> Value {
    let mut slurmd = json!({ "image": images.of("slurmd") });
    let mut body = json!({
        "controllerRef": { "name": CONTROLLER },
        "replicas": pool.count,
        "scalingMode": "StatefulSet",
        "template": {
            "metadata": { "labels": { LABEL_NODE_POOL: pool.name } },
            "spec": {
                "nodeSelector": { LABEL_NODE_POOL: pool.name },
                "tolerations": tolerations(&pool.taints),
            },
        },
    });
    if pool.gpus_per_node > 0 {
        body["extraConf"] = json!(format!("Gres=gpu:{}", pool.gpus_per_node));
        slurmd["resources"] = json!({ "limits": { "nvidia.com/gpu": pool.gpus_per_node } });
    }
    body["slurmd"] = slurmd;
    body["partition"] = if own_partition {
        let config = if default { "Default=YES State=UP" } else { "Default=NO State=UP" };
        json!({ "enabled": true, "config": config })
    } else {
        json!({ "enabled": false })
    };
    let mut object = cr("NodeSet", &pool.name, ns, cluster, body);
    object["metadata"]["labels"][LABEL_NODE_POOL] = json!(pool.name);
    object
}

/// The ConfigMap of extra Slurm configuration files (only with GPUs).
pub fn config_files(ns: &str, cluster: ClusterId) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": CONFIG_FILES, "namespace": ns, "labels": labels(cluster) },
        "data": { "gres.conf": "AutoDetect=nvidia\n" },
    })
}

// ---------------------------------------------------------------------------------------------
// Readiness.

fn generation_current(generation: Option<i64>, observed: Option<i64>) -> bool {
    match (generation, observed) {
        (Some(g), Some(o)) => o >= g,
        (None, _) => true,
        _ => false,
    }
}

/// A StatefulSet is ready: current, and its ready and updated replicas reach `spec.replicas`.
pub fn statefulset_ready(s: &StatefulSet) -> bool {
    let want = s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(status) = s.status.as_ref() else { return false };
    generation_current(s.metadata.generation, status.observed_generation)
        && status.ready_replicas.unwrap_or(0) >= want
        && status.updated_replicas.unwrap_or(0) >= want
}

/// A Deployment is ready: current, and its ready and updated replicas reach `spec.replicas`.
pub fn deployment_ready(d: &Deployment) -> bool {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(status) = d.status.as_ref() else { return false };
    generation_current(d.metadata.generation, status.observed_generation)
        && status.ready_replicas.unwrap_or(0) >= want
        && status.updated_replicas.unwrap_or(0) >= want
}

/// A NodeSet's ready replicas, and whether it is ready for `count` (status current,
/// `status.replicas` == `status.readyReplicas` == `count`).
pub fn nodeset_progress(nodeset: &DynamicObject, count: u32) -> (i64, bool) {
    let status = nodeset.data.get("status");
    let int = |k: &str| status.and_then(|s| s.get(k)).and_then(Value::as_i64);
    let ready = int("readyReplicas").unwrap_or(0);
    let current = generation_current(nodeset.metadata.generation, int("observedGeneration"));
    let count = i64::from(count);
    (ready, current && int("replicas").unwrap_or(0) == count && ready == count)
}

/// The public host keys in the operator's [`LOGIN_HOST_KEYS_SECRET`] (its `*.pub` entries; the
/// private keys beside them are never read out), sorted by algorithm. An entry that is not an
/// OpenSSH public key is left out with a warning naming the entry, not its content.
pub fn login_host_keys(secret: &Secret) -> Vec<SshHostKey> {
    let mut keys: Vec<SshHostKey> = secret
        .data
        .iter()
        .flatten()
        .filter(|(name, _)| name.ends_with(".pub"))
        .filter_map(|(name, value)| {
            let parsed = std::str::from_utf8(&value.0).map_err(|_| ssh::SshKeyError::Shape).and_then(ssh::host_key);
            parsed.map_err(|e| warn!("{LOGIN_HOST_KEYS_SECRET}: entry {name} is left out: {e}")).ok()
        })
        .collect();
    keys.sort_by(|a, b| a.algorithm.cmp(&b.algorithm));
    keys
}

/// A Service's address: a LoadBalancer ingress, else `clusterIP:port`.
pub fn service_address(svc: &Service) -> Option<String> {
    let port = svc.spec.as_ref()?.ports.as_ref()?.first()?.port;
    let join = |host: &str| if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
    let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref());
    if let Some(i) = ingress.and_then(|i| i.first()) {
        if let Some(host) = i.ip.as_deref().or(i.hostname.as_deref()).filter(|h| !h.is_empty()) {
            return Some(join(host));
        }
    }
    let ip = svc.spec.as_ref()?.cluster_ip.as_deref().filter(|ip| !ip.is_empty() && *ip != "None")?;
    Some(join(ip))
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

fn apply_params() -> PatchParams {
    PatchParams::apply(MANAGER).force()
}

async fn apply<K>(api: &Api<K>, kind: &'static str, ns: &str, name: &str, body: &Value) -> Result<K, KubeError>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &apply_params(), &Patch::Apply(body))
        .await
        .map_err(|source| KubeError::api("apply", kind, format!("{ns}/{name}"), source))
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

    async fn client(&self, tenant: &TenantAccess) -> Result<Client, KubeError> {
        let (client, _) = admin_client(tenant.cluster.cluster_id, admin_kubeconfig(tenant)?).await?;
        Ok(client)
    }

    fn dynamic(&self, client: &Client, kind: &str) -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), &self.settings.namespace, &api_resource(kind))
    }

    async fn ensure_namespace(&self, client: &Client, cluster: ClusterId) -> Result<(), KubeError> {
        let ns = &self.settings.namespace;
        let api: Api<Namespace> = Api::all(client.clone());
        let body = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": { "name": ns, "labels": labels(cluster) },
        });
        let applied = api
            .patch(ns, &apply_params(), &Patch::Apply(&body))
            .await
            .map_err(|source| KubeError::api("apply", "Namespace", ns.as_str(), source))?;
        if applied.status.and_then(|s| s.phase).as_deref() == Some("Terminating") {
            return Err(KubeError::NamespaceTerminating { namespace: ns.clone() });
        }
        Ok(())
    }

    /// Applies the cluster's Slurm and reports where it stands (see the module documentation).
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id))]
    pub async fn ensure_slurm(
        &self,
        tenant: &TenantAccess,
        desired: &SlurmDesired,
    ) -> Result<SlurmStatus, DriverError> {
        let version = desired.spec.version.as_str();
        let catalog = &self.settings.catalog;
        let release = catalog.release(version).ok_or_else(|| {
            DriverError::permanent(
                "slurm_version_unsupported",
                format!("Slurm {version} is not supported (supported: {})", catalog.versions().join(", ")),
            )
        })?;
        let release = Images { catalog, release };
        let cluster = tenant.cluster.cluster_id;
        let ns = self.settings.namespace.as_str();
        let client = self.client(tenant).await?;
        self.ensure_namespace(&client, cluster).await?;

        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        for (name, body) in secret_bodies(ns, cluster, &desired.secrets) {
            apply(&secrets, "Secret", ns, name, &body).await?;
        }
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        if has_gpus(&desired.pools) {
            apply(&config_maps, "ConfigMap", ns, CONFIG_FILES, &config_files(ns, cluster)).await?;
        }
        let services: Api<Service> = Api::namespaced(client.clone(), ns);
        apply(&services, "Service", ns, MARIADB, &mariadb_service(ns, cluster)).await?;
        let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
        let mariadb = mariadb_statefulset(ns, cluster, &self.settings.storage_class, catalog.mariadb_image());
        let mariadb = apply(&statefulsets, "StatefulSet", ns, MARIADB, &mariadb).await?;

        let objects = [
            ("Accounting", ACCOUNTING, accounting(ns, cluster, release)),
            (
                "Controller",
                CONTROLLER,
                controller(ns, cluster, release, &self.settings.storage_class, &desired.spec, &desired.pools),
            ),
            ("RestApi", RESTAPI, restapi(ns, cluster, release)),
            ("LoginSet", LOGINSET, loginset(ns, cluster, release, &desired.spec)),
        ];
        for (kind, name, body) in &objects {
            apply(&self.dynamic(&client, kind), kind, ns, name, body).await?;
        }

        let nodesets = self.dynamic(&client, "NodeSet");
        let own_partitions = desired.spec.partitions.is_empty();
        let mut applied = Vec::new();
        for (i, pool) in desired.pools.iter().enumerate() {
            let body = nodeset(ns, cluster, release, pool, own_partitions, i == 0);
            applied.push((pool, apply(&nodesets, "NodeSet", ns, &pool.name, &body).await?));
        }
        // NodeSets of pools that are gone.
        let wanted: BTreeSet<&str> = desired.pools.iter().map(|p| p.name.as_str()).collect();
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

        // Readiness, in order.
        let mut waiting = Vec::new();
        if !statefulset_ready(&mariadb) {
            waiting.push("MariaDbReady".to_owned());
        }
        let accounting = get(&statefulsets, "StatefulSet", ns, ACCOUNTING_WORKLOAD).await?;
        if !accounting.as_ref().is_some_and(statefulset_ready) {
            waiting.push("SlurmAccountingReady".to_owned());
        }
        let controller = get(&statefulsets, "StatefulSet", ns, CONTROLLER_WORKLOAD).await?;
        if !controller.as_ref().is_some_and(statefulset_ready) {
            waiting.push("SlurmControllerReady".to_owned());
        }
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
        let restapi = get(&deployments, "Deployment", ns, RESTAPI_SERVICE).await?;
        if !restapi.as_ref().is_some_and(deployment_ready) {
            waiting.push("SlurmRestApiReady".to_owned());
        }
        let login = get(&deployments, "Deployment", ns, LOGIN_SERVICE).await?;
        if !login.as_ref().is_some_and(deployment_ready) {
            waiting.push("SlurmLoginReady".to_owned());
        }
        let behind: Vec<String> = applied
            .iter()
            .filter_map(|(pool, object)| {
                let (ready, ok) = nodeset_progress(object, pool.count);
                (!ok).then(|| format!("{} {ready}/{}", pool.name, pool.count))
            })
            .collect();
        if !behind.is_empty() {
            waiting.push(format!("NodeSetsReady: {}", behind.join(", ")));
        }
        if waiting.is_empty() {
            match self.probe.ping(tenant).await {
                Ok(true) => {}
                Ok(false) => waiting.push("SlurmRestApiPing".to_owned()),
                Err(e) => waiting.push(format!("SlurmRestApiPing ({e})")),
            }
        }

        let rest_api = get(&services, "Service", ns, RESTAPI_SERVICE).await?.as_ref().and_then(service_address);
        let login_ssh = get(&services, "Service", ns, LOGIN_SERVICE).await?.as_ref().and_then(service_address);
        let login_ssh_host_keys = get(&secrets, "Secret", ns, LOGIN_HOST_KEYS_SECRET)
            .await?
            .as_ref()
            .map(login_host_keys)
            .unwrap_or_default();
        let status = SlurmStatus {
            ready: waiting.is_empty(),
            reason: waiting.join("; "),
            rest_api,
            login_ssh,
            login_ssh_host_keys,
        };
        debug!(cluster.id = %cluster, ready = status.ready, reason = %status.reason, "ensured Slurm");
        Ok(status)
    }

    /// Drains the Slurm node(s) on the Kubernetes Node `node_name` (see the module documentation).
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id, node.name = %node_name))]
    pub async fn drain_node(&self, tenant: &TenantAccess, node_name: &str) -> Result<bool, DriverError> {
        let client = self.client(tenant).await?;
        let nodes: Api<Node> = Api::all(client.clone());
        let node = nodes.get_opt(node_name).await.map_err(|source| KubeError::api("get", "Node", node_name, source))?;
        if let Some(node) = node {
            let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
            let annotated = node.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_CORDON_REASON)).is_some();
            if !cordoned || !annotated {
                // A merge patch (an Update, not an Apply): paddock's apply of the Node's labels
                // does not own `unschedulable`, so it never uncordons.
                let patch = json!({
                    "metadata": { "annotations": { ANNOTATION_CORDON_REASON: DRAIN_REASON } },
                    "spec": { "unschedulable": true },
                });
                let params = PatchParams { field_manager: Some(MANAGER.to_owned()), ..PatchParams::default() };
                nodes
                    .patch(node_name, &params, &Patch::Merge(&patch))
                    .await
                    .map_err(|source| KubeError::api("cordon", "Node", node_name, source))?;
                info!(cluster.id = %tenant.cluster.cluster_id, "cordoned node {node_name} to drain Slurm");
            }
        }
        let ns = self.settings.namespace.as_str();
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let on_node = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
            .await
            .map_err(|source| KubeError::api("list", "Pod", ns, source))?;
        let mut drained = true;
        for pod in &on_node.items {
            let Some(slurm_node) = slurm_node_name(pod) else { continue };
            match self.probe.drain(tenant, &slurm_node, DRAIN_REASON).await? {
                None | Some(true) => {}
                Some(false) => drained = false,
            }
        }
        Ok(drained)
    }

    /// Deletes the cluster's Slurm; `Gone` once none of its objects is left.
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id))]
    pub async fn remove_slurm(&self, tenant: &TenantAccess) -> Result<Removal, DriverError> {
        let client = self.client(tenant).await?;
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
        node_name: &'a str,
    ) -> BoxFuture<'a, Result<bool, DriverError>> {
        SlinkyDriver::drain_node(self, tenant, node_name).boxed()
    }

    fn remove_slurm<'a>(&'a self, tenant: &'a TenantAccess) -> BoxFuture<'a, Result<Removal, DriverError>> {
        SlinkyDriver::remove_slurm(self, tenant).boxed()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use paddock_types::cluster::{Partition, TaintEffect};
    use paddock_types::NodePoolId;

    use super::*;

    fn pool(name: &str, count: u32, gpus: u32) -> SlurmPool {
        SlurmPool {
            node_pool_id: NodePoolId::new(),
            name: name.to_owned(),
            count,
            node_names: Vec::new(),
            gpus_per_node: gpus,
            taints: Vec::new(),
        }
    }

    #[test]
    fn versions_map_to_the_stacks_pinned_images() {
        let catalog = SlurmCatalog::embedded();
        let r = catalog.release("25.05").expect("25.05 is supported");
        assert_eq!(catalog.image("slurmctld", r), "ghcr.io/slinkyproject/slurmctld:25.05-ubuntu24.04");
        assert!(catalog.release("23.02").is_none());
        for version in catalog.versions() {
            let r = catalog.release(version).expect("listed");
            assert!(!r.image_tag.is_empty() && !r.image_tag.contains("latest"), "{r:?}");
        }
        let mariadb = catalog.mariadb_image();
        assert!(!mariadb.ends_with(":latest") && mariadb.contains(':'), "{mariadb}");
    }

    #[test]
    fn the_cluster_name_is_lowercase_hex_from_the_id() {
        let id = ClusterId::new();
        let name = cluster_name(id);
        assert_eq!(name.len(), 33);
        assert!(name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
    }

    #[test]
    fn spec_partitions_become_partition_lines_over_known_pools() {
        let spec = SlurmSpec {
            partitions: vec![
                Partition {
                    name: "all".to_owned(),
                    node_pools: vec!["cpu".to_owned(), "gpu".to_owned(), "gone".to_owned()],
                    default: true,
                    max_time: Some("2-00:00:00".to_owned()),
                },
                Partition {
                    name: "gpu".to_owned(),
                    node_pools: vec!["gpu".to_owned()],
                    default: false,
                    max_time: None,
                },
            ],
            ..SlurmSpec::default()
        };
        let conf = controller_extra_conf(&spec, &[pool("cpu", 1, 0), pool("gpu", 1, 8)]);
        assert_eq!(
            conf,
            "GresTypes=gpu\nPartitionName=all Nodes=cpu,gpu Default=YES MaxTime=2-00:00:00 State=UP\n\
             PartitionName=gpu Nodes=gpu Default=NO State=UP"
        );
        assert_eq!(controller_extra_conf(&SlurmSpec::default(), &[pool("cpu", 1, 0)]), "");
    }

    #[test]
    fn taints_become_tolerations() {
        let taints = vec![
            Taint { key: "gpu".to_owned(), value: "true".to_owned(), effect: TaintEffect::NoSchedule },
            Taint { key: "dedicated".to_owned(), value: String::new(), effect: TaintEffect::NoExecute },
        ];
        assert_eq!(
            tolerations(&taints),
            vec![
                json!({"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}),
                json!({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}),
            ]
        );
    }

    #[test]
    fn a_nodeset_is_pinned_and_carries_its_gres() {
        let catalog = SlurmCatalog::embedded();
        let r = Images { catalog: &catalog, release: catalog.release("25.05").expect("supported") };
        let mut gpu = pool("gpu", 2, 4);
        gpu.taints = vec![Taint { key: "gpu".to_owned(), value: String::new(), effect: TaintEffect::NoSchedule }];
        let body = nodeset("slurm", ClusterId::new(), r, &gpu, true, false);
        assert_eq!(body["spec"]["replicas"], 2);
        assert_eq!(body["spec"]["template"]["spec"]["nodeSelector"], json!({ LABEL_NODE_POOL: "gpu" }));
        assert_eq!(body["spec"]["extraConf"], "Gres=gpu:4");
        assert_eq!(body["spec"]["slurmd"]["resources"]["limits"]["nvidia.com/gpu"], 4);
        assert_eq!(body["spec"]["partition"], json!({"enabled": true, "config": "Default=NO State=UP"}));
        let cpu = nodeset("slurm", ClusterId::new(), r, &pool("cpu", 1, 0), false, true);
        assert_eq!(cpu["spec"]["partition"], json!({"enabled": false}));
        assert!(cpu["spec"].get("extraConf").is_none());
    }

    #[test]
    fn login_host_keys_are_the_public_halves_sorted() {
        let ed25519 =
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL2AmpA4kI/TYTmjC3Vf+h3HQc/vvGHZNgUIITHqcjcJ root@slurm-login";
        let data = [
            ("ssh_host_ed25519_key", "-----BEGIN OPENSSH PRIVATE KEY-----\n..."),
            ("ssh_host_ed25519_key.pub", ed25519),
            ("ssh_host_rsa_key.pub", "not a key"),
        ];
        let secret = Secret {
            data: Some(data.iter().map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec()))).collect()),
            ..Secret::default()
        };
        let keys = login_host_keys(&secret);
        assert_eq!(keys, vec![ssh::host_key(ed25519).expect("a host key")]);
        assert_eq!(keys[0].fingerprint, "SHA256:gZv72HZq4UhmTQ3QmrF3VWb5PXSV+UVu9JVQwPE7sL0");
        assert!(login_host_keys(&Secret::default()).is_empty());
    }

    #[test]
    fn service_addresses_prefer_the_load_balancer() {
        let svc = |status: Value| -> Service {
            serde_json::from_value(json!({
                "metadata": {"name": "s"},
                "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 22}]},
                "status": status,
            }))
            .expect("service")
        };
        assert_eq!(service_address(&svc(json!({}))).as_deref(), Some("10.96.0.10:22"));
        let lb = json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}});
        assert_eq!(service_address(&svc(lb)).as_deref(), Some("203.0.113.7:22"));
        let none: Service =
            serde_json::from_value(json!({"spec": {"clusterIP": "None", "ports": [{"port": 3306}]}})).expect("service");
        assert_eq!(service_address(&none), None);
    }

    #[test]
    fn nodesets_are_ready_when_current_and_complete() {
        let ns = |generation: i64, status: Value| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
                "metadata": {"name": "gpu", "generation": generation},
                "status": status,
            }))
            .expect("nodeset")
        };
        assert_eq!(nodeset_progress(&ns(1, json!(null)), 2), (0, false));
        let done = json!({"observedGeneration": 2, "replicas": 2, "readyReplicas": 2});
        assert_eq!(nodeset_progress(&ns(2, done.clone()), 2), (2, true));
        assert_eq!(nodeset_progress(&ns(3, done.clone()), 2), (2, false), "an old generation");
        assert_eq!(nodeset_progress(&ns(2, done), 3), (2, false), "scaled up");
    }
}
