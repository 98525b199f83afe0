//! The objects of a cluster's Slurm, as the driver applies them, and the readiness and endpoints
//! read back from what the API server answers: pure functions of the desired state (see the
//! [`crate::slurm`] documentation for what each object is).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::DynamicObject;
use paddock_domain::driver::{SlurmFault, SlurmPool, SlurmSecrets};
use paddock_domain::ssh;
use paddock_types::cluster::{SlurmSpec, SshHostKey, Taint};
use paddock_types::ClusterId;
use serde_json::{json, Value};
use tracing::warn;

use super::{
    cluster_name, elastic, Images, ACCOUNTING, CONFIG_FILES, CONTROLLER, CONTROLLER_STORAGE, DATABASE, DATABASE_USER,
    GROUP, LABEL_SLURM, LOGINSET, LOGIN_HOST_KEYS_SECRET, MARIADB, MARIADB_STORAGE, RESTAPI, SECRET_DB, SECRET_DB_KEY,
    SECRET_JWT, SECRET_JWT_KEY, SECRET_SLURM_KEY, SECRET_SLURM_KEY_KEY, SECRET_SSSD, SECRET_SSSD_KEY, VERSION,
};
use crate::isolation::{LABEL_CLUSTER_ID, LABEL_MANAGED_BY, MANAGER};
use crate::nodes::LABEL_NODE_POOL;

pub(super) fn labels(cluster: ClusterId) -> BTreeMap<String, String> {
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
pub(super) fn secret_bodies(ns: &str, cluster: ClusterId, secrets: &SlurmSecrets) -> Vec<(&'static str, Value)> {
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
pub fn mariadb_statefulset(
    ns: &str,
    cluster: ClusterId,
    storage_class: &str,
    image: &str,
    system: Option<&SlurmPool>,
) -> Value {
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
                    "nodeSelector": placement(system)["nodeSelector"],
                    "tolerations": placement(system)["tolerations"],
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

/// Where the control pods go: the nodes of the cluster's system pool (its node label, its taints
/// tolerated), so that the volumes local-path makes for them live there too; nowhere in
/// particular when there is no system pool.
pub fn placement(system: Option<&SlurmPool>) -> Value {
    match system {
        Some(pool) => json!({
            "nodeSelector": { LABEL_NODE_POOL: pool.name },
            "tolerations": tolerations(&pool.taints),
        }),
        None => json!({ "nodeSelector": {}, "tolerations": [] }),
    }
}

/// A Slinky control CR's pod template, pinned to the system pool ([`placement`]).
fn pinned_template(system: Option<&SlurmPool>) -> Value {
    json!({ "spec": placement(system) })
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
pub fn accounting(ns: &str, cluster: ClusterId, images: Images<'_>, system: Option<&SlurmPool>) -> Value {
    cr(
        "Accounting",
        ACCOUNTING,
        ns,
        cluster,
        json!({
            "slurmKeyRef": secret_key_ref(SECRET_SLURM_KEY, SECRET_SLURM_KEY_KEY),
            "jwtHs256KeyRef": secret_key_ref(SECRET_JWT, SECRET_JWT_KEY),
            "slurmdbd": { "image": images.of("slurmdbd") },
            "template": pinned_template(system),
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

/// What the accounting enforces in a cluster that maps groups to accounts.
pub const ENFORCE: &str = "AccountingStorageEnforce=associations,limits,qos";

pub(super) fn has_gpus(pools: &[SlurmPool]) -> bool {
    pools.iter().any(|p| p.gpus_per_node > 0)
}

/// The Controller's `extraConf`: `GresTypes=gpu` when a pool has GPUs; when the spec maps
/// groups to accounts, the accounting enforced (only users with an association submit, within
/// their QOS's limits: without it a removed user still submits, and no limit holds) and
/// `gres/gpu` tracked when an account limits GPU minutes (slurmdbd drops a QOS limit of a TRES it
/// does not track, without an error); the nodes slurm.conf declares for the elastic pools
/// ([`elastic::declared`]); and the spec's partitions (none when the spec has none: the NodeSets
/// then carry one each).
pub fn controller_extra_conf(spec: &SlurmSpec, pools: &[SlurmPool]) -> String {
    let mut lines = Vec::new();
    if has_gpus(pools) {
        lines.push("GresTypes=gpu".to_owned());
    }
    if !spec.accounts.is_empty() {
        lines.push(ENFORCE.to_owned());
    }
    if spec.accounts.iter().any(|a| a.limits.gpu_minutes.is_some()) {
        lines.push("AccountingStorageTRES=gres/gpu".to_owned());
    }
    lines.extend(elastic::declared(pools));
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

/// The `Controller`: `pools` are the compute pools (partitions, GRES), `system` the pool its pod
/// and volume are pinned to.
pub fn controller(
    ns: &str,
    cluster: ClusterId,
    images: Images<'_>,
    storage_class: &str,
    spec: &SlurmSpec,
    pools: &[SlurmPool],
    system: Option<&SlurmPool>,
) -> Value {
    let mut body = json!({
        "clusterName": cluster_name(cluster),
        "template": pinned_template(system),
        "slurmKeyRef": secret_key_ref(SECRET_SLURM_KEY, SECRET_SLURM_KEY_KEY),
        "jwtHs256KeyRef": secret_key_ref(SECRET_JWT, SECRET_JWT_KEY),
        "accountingRef": { "name": ACCOUNTING },
        "slurmctld": { "image": images.of("slurmctld") },
        "reconfigure": { "image": images.of("slurmctld") },
        // The operator's `logfile` sidecar (a POSIX `sh` script) has no default image: the
        // pinned slurmctld image runs it (upstream's chart would use alpine:latest).
        "logfile": { "image": images.of("slurmctld") },
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
pub fn restapi(ns: &str, cluster: ClusterId, images: Images<'_>, system: Option<&SlurmPool>) -> Value {
    cr(
        "RestApi",
        RESTAPI,
        ns,
        cluster,
        json!({
            "controllerRef": { "name": CONTROLLER },
            "replicas": 1,
            "slurmrestd": { "image": images.of("slurmrestd") },
            "template": pinned_template(system),
        }),
    )
}

/// The `LoginSet`: replicas and root's authorized keys from the spec.
pub fn loginset(
    ns: &str,
    cluster: ClusterId,
    images: Images<'_>,
    spec: &SlurmSpec,
    system: Option<&SlurmPool>,
) -> Value {
    let mut body = json!({
        "template": pinned_template(system),
        "controllerRef": { "name": CONTROLLER },
        "replicas": spec.login.replicas,
        "login": { "image": images.of("login") },
        // The operator's `initconf` init container (a POSIX `sh` script) has no default image:
        // the pinned login image runs it.
        "initconf": { "image": images.of("login") },
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

/// A pool's `NodeSet`: `replicas` (the pool's count, plus the pods of machines being released
/// that are not handed over yet) pinned to the pool's nodes, GPUs as GRES, and its own partition
/// when the spec has none (`default`: the first pool's).
pub fn nodeset(
    ns: &str,
    cluster: ClusterId,
    images: Images<'_>,
    pool: &SlurmPool,
    replicas: u32,
    own_partition: bool,
    default: bool,
) -> Value {
    let mut slurmd = json!({ "image": images.of("slurmd") });
    let mut body = json!({
        "controllerRef": { "name": CONTROLLER },
        "replicas": replicas,
        // The operator's `logfile` sidecar has no default image: the pinned slurmd image runs it.
        "logfile": { "image": images.of("slurmd") },
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

/// The label selector of the controller's pods (the operator's `app.kubernetes.io/name` and
/// `app.kubernetes.io/instance` labels: `internal/builder/labels`).
pub fn controller_pods() -> String {
    format!("app.kubernetes.io/name=slurmctld,app.kubernetes.io/instance={CONTROLLER}")
}

/// `SlurmReady`'s reason while slurmctld crash-loops.
pub const CONTROLLER_CRASH_LOOP: &str = "ControllerCrashLoopBackOff";

/// A crash loop of the controller: the first container (init containers first) of `pods` that
/// waits in `CrashLoopBackOff`, named with its pod, its restarts and its last termination's
/// reason and exit code (never its message or logs).
pub fn crash_loop(pods: &[Pod]) -> Option<SlurmFault> {
    pods.iter().find_map(|pod| {
        let status = pod.status.as_ref()?;
        let init = status.init_container_statuses.iter().flatten();
        init.chain(status.container_statuses.iter().flatten()).find_map(|c| {
            let waiting = c.state.as_ref()?.waiting.as_ref()?;
            (waiting.reason.as_deref() == Some("CrashLoopBackOff")).then_some(())?;
            let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref()).map_or_else(String::new, |t| {
                format!("; it last exited with code {} ({})", t.exit_code, t.reason.as_deref().unwrap_or("no reason"))
            });
            let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
            let message = format!(
                "slurmctld is crash-looping: container {} of pod {pod_name} is in CrashLoopBackOff after {} \
                 restart(s){last}",
                c.name, c.restart_count
            );
            Some(SlurmFault { reason: CONTROLLER_CRASH_LOOP.to_owned(), message })
        })
    })
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

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use paddock_types::cluster::{Partition, TaintEffect};

    use super::*;
    use crate::slurm::fixtures::pool;
    use crate::slurm::SlurmCatalog;

    #[test]
    fn versions_map_to_the_pinned_images_of_the_clusters_stack() {
        let catalog = SlurmCatalog::embedded();
        let r = catalog.images("2026.12.0", "25.11").expect("25.11 runs on 2026.12.0");
        assert_eq!(r.of("slurmctld"), "ghcr.io/slinkyproject/slurmctld:25.11-ubuntu24.04");
        let older = catalog.images("2026.11.0", "25.05").expect("25.05 runs on 2026.11.0");
        assert_eq!(older.of("slurmd"), "ghcr.io/slinkyproject/slurmd:25.05-ubuntu24.04");
        let e = catalog.images("2026.12.0", "25.05").expect_err("slurm-operator 1.2.1 needs 25.11");
        assert_eq!(e.code, "slurm_version_unsupported");
        assert!(e.message.contains("supported: 25.11"), "{}", e.message);
        let e = catalog.images("2026.12.0", "26.05").expect_err("2026.12.0 has no 26.05 images");
        assert!(e.message.contains("(supported: 25.11)"), "{}", e.message);
        let e = catalog.images("2026.12.1", "25.05").expect_err("no image of 25.05 on 2026.12.1");
        assert!(e.message.contains("(supported: 25.11, 26.05)"), "{}", e.message);
        assert!(catalog.images("1999.1.0", "25.11").is_err());
        for (version, _) in paddock_domain::stack::DEFINITIONS {
            for slurm in paddock_domain::stack::slurm_versions(version) {
                let images = catalog.images(version, slurm).expect("listed");
                let (image, mariadb) = (images.of("slurmd"), images.mariadb());
                assert!(!image.contains("latest") && !mariadb.ends_with(":latest") && mariadb.contains(':'), "{image}");
            }
        }
    }

    #[test]
    fn images_are_the_catalogues_or_the_deployments_registry_with_the_pinned_tags() {
        let catalog = SlurmCatalog::embedded();
        // Without a deployment registry: the catalogue's. 26.05 and MariaDB are paddock's own
        // builds; 25.11 SchedMD's; a cluster on 2026.12.0 keeps 2026.12.0's images.
        let new = catalog.images("2026.12.1", "26.05").expect("26.05 runs on 2026.12.1");
        let old = catalog.images("2026.12.0", "25.11").expect("25.11 runs on 2026.12.0");
        let upstream = catalog.images("2026.12.1", "25.11").expect("25.11 runs on 2026.12.1");
        let spec = SlurmSpec::default();
        let refs = |r: Images<'_>| {
            let c = controller("slurm", ClusterId::new(), r, "local-path", &spec, &[pool("cpu", 1, 0)], None);
            let m = mariadb_statefulset("slurm", ClusterId::new(), "local-path", &r.mariadb(), None);
            let login = loginset("slurm", ClusterId::new(), r, &spec, None);
            let n = nodeset("slurm", ClusterId::new(), r, &pool("cpu", 1, 0), 1, true, true);
            [
                c["spec"]["slurmctld"]["image"].clone(),
                n["spec"]["slurmd"]["image"].clone(),
                restapi("slurm", ClusterId::new(), r, None)["spec"]["slurmrestd"]["image"].clone(),
                accounting("slurm", ClusterId::new(), r, None)["spec"]["slurmdbd"]["image"].clone(),
                login["spec"]["login"]["image"].clone(),
                m["spec"]["template"]["spec"]["containers"][0]["image"].clone(),
            ]
        };
        let names = |registry: &str, tag: &str, mariadb: &str| {
            let mut all: Vec<Value> = ["slurmctld", "slurmd", "slurmrestd", "slurmdbd", "login"]
                .iter()
                .map(|c| json!(format!("{registry}/{c}:{tag}")))
                .collect();
            all.push(json!(mariadb));
            all
        };
        assert_eq!(refs(new).to_vec(), names("paddock.local/slurm", "26.05.5", "paddock.local/slurm/mariadb:10.11.19"));
        let slinky = "ghcr.io/slinkyproject";
        assert_eq!(refs(old).to_vec(), names(slinky, "25.11-ubuntu24.04", "docker.io/library/mariadb:11.4.5"));
        let mariadb = "paddock.local/slurm/mariadb:10.11.19";
        assert_eq!(refs(upstream).to_vec(), names(slinky, "25.11-ubuntu24.04", mariadb));

        // A deployment's registry replaces every registry, MariaDB's too; names and tags stay.
        let mirror = SlurmCatalog::embedded().with_registry(Some("registry.example:5000/mirror/".to_owned()));
        let at = |stack: &str, slurm: &str| mirror.images(stack, slurm).expect("listed");
        let m = "registry.example:5000/mirror";
        assert_eq!(refs(at("2026.12.1", "26.05")).to_vec(), names(m, "26.05.5", &format!("{m}/mariadb:10.11.19")));
        assert_eq!(
            refs(at("2026.12.0", "25.11")).to_vec(),
            names(m, "25.11-ubuntu24.04", &format!("{m}/mariadb:11.4.5"))
        );
        let local = SlurmCatalog::embedded().with_registry(Some("paddock.local/slurm".to_owned()));
        let local = local.images("2026.12.1", "26.05").expect("listed");
        assert_eq!(refs(local).to_vec(), refs(new).to_vec(), "the local builds under their own names");
        assert_eq!(local.rest_api_version(), "v0.0.42");
    }

    #[test]
    fn a_crash_loop_of_a_controller_container_is_named_with_its_exit() {
        let pod = |containers: Value, init: Value| -> Pod {
            serde_json::from_value(json!({
                "metadata": { "name": "slurm-controller-0" },
                "status": { "containerStatuses": containers, "initContainerStatuses": init },
            }))
            .expect("a pod")
        };
        let running = json!({ "name": "slurmctld", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                              "state": { "running": {} } });
        let looping = json!({ "name": "slurmctld", "image": "i", "imageID": "", "ready": false, "restartCount": 7,
                              "state": { "waiting": { "reason": "CrashLoopBackOff", "message": "back-off 5m0s" } },
                              "lastState": { "terminated": { "exitCode": 1, "reason": "Error" } } });
        let pulling = json!({ "name": "slurmctld", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                              "state": { "waiting": { "reason": "ContainerCreating" } } });
        assert_eq!(crash_loop(&[pod(json!([running]), json!([]))]), None);
        assert_eq!(crash_loop(&[pod(json!([pulling]), json!([]))]), None, "starting is no fault");
        assert_eq!(crash_loop(&[]), None);
        let fault = crash_loop(&[pod(json!([running.clone(), looping.clone()]), json!([]))]).expect("a crash loop");
        assert_eq!(fault.reason, "ControllerCrashLoopBackOff");
        assert_eq!(
            fault.message,
            "slurmctld is crash-looping: container slurmctld of pod slurm-controller-0 is in CrashLoopBackOff \
             after 7 restart(s); it last exited with code 1 (Error)"
        );
        let mut init = looping;
        init["name"] = json!("init");
        init["lastState"] = json!({});
        let fault = crash_loop(&[pod(json!([running]), json!([init]))]).expect("an init container's loop");
        assert!(fault.message.contains("container init of pod") && !fault.message.contains("exited"), "{fault:?}");
        assert_eq!(controller_pods(), "app.kubernetes.io/name=slurmctld,app.kubernetes.io/instance=slurm");
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
        let r = catalog.images("2026.12.0", "25.11").expect("supported");
        let mut gpu = pool("gpu", 2, 4);
        gpu.taints = vec![Taint { key: "gpu".to_owned(), value: String::new(), effect: TaintEffect::NoSchedule }];
        let body = nodeset("slurm", ClusterId::new(), r, &gpu, 2, true, false);
        assert_eq!(body["spec"]["replicas"], 2);
        assert_eq!(body["spec"]["template"]["spec"]["nodeSelector"], json!({ LABEL_NODE_POOL: "gpu" }));
        assert_eq!(body["spec"]["extraConf"], "Gres=gpu:4");
        assert_eq!(body["spec"]["slurmd"]["resources"]["limits"]["nvidia.com/gpu"], 4);
        assert_eq!(body["spec"]["partition"], json!({"enabled": true, "config": "Default=NO State=UP"}));
        assert_eq!(body["spec"]["logfile"]["image"], "ghcr.io/slinkyproject/slurmd:25.11-ubuntu24.04");
        let cpu = nodeset("slurm", ClusterId::new(), r, &pool("cpu", 1, 0), 1, false, true);
        assert_eq!(cpu["spec"]["partition"], json!({"enabled": false}));
        assert!(cpu["spec"].get("extraConf").is_none());
    }

    #[test]
    fn the_operators_helper_containers_get_the_pinned_slurm_images() {
        // The operator gives its logfile sidecars and the login's initconf no image of its own.
        let catalog = SlurmCatalog::embedded();
        let r = catalog.images("2026.12.0", "25.11").expect("supported");
        let spec = SlurmSpec::default();
        let controller = controller("slurm", ClusterId::new(), r, "local-path", &spec, &[pool("cpu", 1, 0)], None);
        assert_eq!(controller["spec"]["logfile"]["image"], "ghcr.io/slinkyproject/slurmctld:25.11-ubuntu24.04");
        assert_eq!(controller["spec"]["reconfigure"]["image"], "ghcr.io/slinkyproject/slurmctld:25.11-ubuntu24.04");
        let login = loginset("slurm", ClusterId::new(), r, &spec, None);
        assert_eq!(login["spec"]["initconf"]["image"], "ghcr.io/slinkyproject/login:25.11-ubuntu24.04");
        let nodeset = nodeset("slurm", ClusterId::new(), r, &pool("cpu", 1, 0), 1, true, true);
        assert_eq!(nodeset["spec"]["logfile"]["image"], "ghcr.io/slinkyproject/slurmd:25.11-ubuntu24.04");
    }

    #[test]
    fn the_control_pods_are_pinned_to_the_system_pool() {
        let catalog = SlurmCatalog::embedded();
        let r = catalog.images("2026.12.0", "25.11").expect("supported");
        let mut system = pool("sys", 1, 0);
        system.role = paddock_types::cluster::NodePoolRole::System;
        system.taints = vec![Taint { key: "ctl".to_owned(), value: String::new(), effect: TaintEffect::NoSchedule }];
        let (id, spec, s) = (ClusterId::new(), SlurmSpec::default(), Some(&system));
        let want = json!({
            "nodeSelector": { LABEL_NODE_POOL: "sys" },
            "tolerations": [{ "key": "ctl", "operator": "Exists", "effect": "NoSchedule" }],
        });
        for body in [
            accounting("slurm", id, r, s),
            controller("slurm", id, r, "local-path", &spec, &[], s),
            restapi("slurm", id, r, s),
            loginset("slurm", id, r, &spec, s),
        ] {
            assert_eq!(body["spec"]["template"]["spec"], want, "{}", body["kind"]);
        }
        let mariadb = mariadb_statefulset("slurm", id, "local-path", "mariadb:11.4", s);
        let pod = &mariadb["spec"]["template"]["spec"];
        assert_eq!((&pod["nodeSelector"], &pod["tolerations"]), (&want["nodeSelector"], &want["tolerations"]));
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
