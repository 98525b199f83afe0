//! Kamaji as the [`ControlPlaneBackend`]: one `TenantControlPlane` (`kamaji.clastix.io/v1alpha1`)
//! per tenant cluster, named `tcp-<cluster id, 32 hex digits>`, in the cluster's namespace from
//! [`crate::isolation`] (docs/architecture.md, cluster reconciler step 2).
//!
//! The object is handled as a [`DynamicObject`] with a hand-built body: the CRD is ~729 KB of
//! embedded PodSpecs, and paddock sets a handful of fields. The body sets only what paddock
//! decides (version, replicas, service type, konnectivity, CoreDNS and kube-proxy add-ons, an
//! optional DataStore) and leaves every other field to the CRD's defaults, which the API server
//! fills in without them becoming ours under server-side apply. So applying the same spec twice
//! changes nothing, not even the resourceVersion.
//!
//! Readiness, from Kamaji's own status (clastix/kamaji: `api/v1alpha1/tenantcontrolplane_status.go`,
//! `controllers/tenantcontrolplane_controller.go`, `controllers/resources.go`,
//! `internal/resources/kubeconfig.go`):
//! - `status.observedGeneration` equals `metadata.generation`: Kamaji writes it only after a
//!   complete, successful reconciliation of that generation;
//! - `status.kubernetesResources.version.status` is `Ready` (an enum: Unknown, Provisioning,
//!   CertificateAuthorityRotating, Upgrading, Migrating, Ready, NotReady, Sleeping, WriteLimited);
//! - `status.controlPlaneEndpoint` is set (a string, `host:port`);
//! - the Secret named by `status.kubeconfig.admin.secretName` (Kamaji names it
//!   `<tcp name>-admin-kubeconfig`) exists in the TenantControlPlane's namespace and holds a
//!   non-empty `admin.conf` (kubeadm's admin kubeconfig file name; Kamaji adds `admin.svc`, the
//!   same kubeconfig pointing at the in-cluster Service).

use std::fmt::Debug;

use futures::FutureExt;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use paddock_domain::driver::{
    BoxFuture, ClusterRef, ControlPlaneBackend, ControlPlaneSpec, ControlPlaneStatus, DriverError, Removal,
};
use paddock_types::ClusterId;
use serde_json::{json, Value};
use tracing::{debug, info, instrument};

use crate::access::{forbidden, Entry, NamespaceAccess};
use crate::apply::{get_and_converge, Target};
use crate::isolation::{self, ANNOTATION_CLUSTER_NAME, ANNOTATION_TENANT_NAME};
use crate::KubeError;

/// Kamaji's API group.
pub const GROUP: &str = "kamaji.clastix.io";
/// The served (and only) version of the TenantControlPlane CRD.
pub const VERSION: &str = "v1alpha1";
/// The kind paddock applies.
pub const KIND: &str = "TenantControlPlane";
/// Its plural, the URL segment.
pub const PLURAL: &str = "tenantcontrolplanes";
/// The key of the admin kubeconfig in Kamaji's admin kubeconfig Secret (kubeadm's
/// `AdminKubeConfigFileName`).
pub const ADMIN_KUBECONFIG_KEY: &str = "admin.conf";
/// The value of `status.kubernetesResources.version.status` that means ready.
pub const VERSION_READY: &str = "Ready";

const OBJECT: &str = "TenantControlPlane";

/// The TenantControlPlane resource, for `Api::namespaced_with`.
pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

/// The TenantControlPlane of a cluster: `tcp-` and the id's 32 hex digits (36 characters, a valid
/// DNS-1123 label that leaves room for Kamaji's suffixes such as `-admin-kubeconfig`).
pub fn tenant_control_plane_name(cluster: ClusterId) -> String {
    format!("tcp-{}", cluster.uuid().simple())
}

/// The server-side-apply body of the cluster's TenantControlPlane: only the fields paddock owns.
pub fn tenant_control_plane(spec: &ControlPlaneSpec) -> Value {
    let c = &spec.cluster;
    let mut body = json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": KIND,
        "metadata": {
            "name": tenant_control_plane_name(c.cluster_id),
            "namespace": isolation::namespace_name(c.cluster_id),
            "labels": isolation::labels(c),
            "annotations": {
                ANNOTATION_TENANT_NAME: c.tenant_name,
                ANNOTATION_CLUSTER_NAME: c.cluster_name,
            },
        },
        "spec": {
            "controlPlane": {
                "deployment": { "replicas": spec.replicas },
                "service": { "serviceType": spec.service_type.as_str() },
            },
            // `kubelet` is required by the CRD; its content is left to the defaults.
            "kubernetes": { "version": spec.kubernetes_version, "kubelet": {} },
            // Required by the CRD's CEL rules (which read `self.networkProfile.*`); the defaults
            // give the ports the NetworkPolicies of `isolation` open.
            "networkProfile": {},
            // An empty object enables an add-on with Kamaji's defaults. Konnectivity is needed
            // because the tenant's machines are outside the platform cluster's network.
            "addons": { "konnectivity": {}, "coreDNS": {}, "kubeProxy": {} },
        },
    });
    if let Some(datastore) = &spec.datastore {
        body["spec"]["dataStore"] = json!(datastore);
    }
    body
}

/// The admin kubeconfig Secret's name as Kamaji reports it, if it does yet.
pub fn admin_kubeconfig_secret_name(tcp: &DynamicObject) -> Option<&str> {
    non_empty(&tcp.data["status"]["kubeconfig"]["admin"]["secretName"])
}

/// Judges readiness from the TenantControlPlane as the API server returned it and the admin
/// kubeconfig Secret (`None`: not found, or not named yet). Pure, so every condition is testable.
pub fn assess(tcp: &DynamicObject, admin_secret: Option<&Secret>) -> ControlPlaneStatus {
    let status = &tcp.data["status"];
    let mut missing = Vec::new();
    // Applying to an object that is being deleted succeeds, and its status may still say ready.
    if tcp.metadata.deletion_timestamp.is_some() {
        missing.push("the TenantControlPlane is being deleted".to_owned());
    }

    // A spec change bumps the generation; until Kamaji has reconciled it, everything else in the
    // status may describe the previous spec (e.g. the old version reported Ready).
    let generation = tcp.metadata.generation;
    let observed = status["observedGeneration"].as_i64();
    if generation.is_none() || observed != generation {
        let observed = observed.map_or_else(|| "none".to_owned(), |g| g.to_string());
        let generation = generation.map_or_else(|| "unknown".to_owned(), |g| g.to_string());
        missing.push(format!(
            "Kamaji has not reconciled generation {generation} yet (status.observedGeneration is {observed})"
        ));
    }
    match non_empty(&status["kubernetesResources"]["version"]["status"]) {
        Some(VERSION_READY) => {}
        Some(other) => missing.push(format!("the Kubernetes version status is {other}, not {VERSION_READY}")),
        None => missing.push("the Kubernetes version status is not reported yet".to_owned()),
    }
    let endpoint = non_empty(&status["controlPlaneEndpoint"]).map(str::to_owned);
    if endpoint.is_none() {
        missing.push("no control-plane endpoint is published yet (status.controlPlaneEndpoint)".to_owned());
    }
    let namespace = tcp.metadata.namespace.as_deref().unwrap_or_default();
    let admin_kubeconfig = match admin_kubeconfig_secret_name(tcp) {
        None => {
            missing
                .push("the admin kubeconfig secret is not named yet (status.kubeconfig.admin.secretName)".to_owned());
            None
        }
        Some(name) => {
            let data = admin_secret.and_then(|s| s.data.as_ref());
            let kubeconfig = data.and_then(|d| d.get(ADMIN_KUBECONFIG_KEY)).filter(|k| !k.0.is_empty());
            match (admin_secret, kubeconfig) {
                (None, _) => missing.push(format!("the admin kubeconfig secret {namespace}/{name} does not exist")),
                (Some(_), None) => missing
                    .push(format!("the admin kubeconfig secret {namespace}/{name} holds no {ADMIN_KUBECONFIG_KEY}")),
                (Some(_), Some(_)) => {}
            }
            kubeconfig.map(|k| k.0.clone())
        }
    };
    ControlPlaneStatus {
        ready: missing.is_empty(),
        reason: missing.join("; "),
        endpoint,
        admin_kubeconfig,
        changed: Vec::new(),
    }
}

fn non_empty(v: &Value) -> Option<&str> {
    v.as_str().filter(|s| !s.is_empty())
}

/// Kamaji on the platform cluster, reached with one kube-rs client.
#[derive(Clone)]
pub struct KamajiBackend {
    client: Client,
    access: NamespaceAccess,
}

impl Debug for KamajiBackend {
    // The client holds the credentials: show nothing of it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KamajiBackend").finish_non_exhaustive()
    }
}

impl KamajiBackend {
    /// A backend over an existing client (usually [`crate::KubePlatform::client`]'s).
    pub fn new(client: Client) -> Self {
        let access = NamespaceAccess::new(client.clone(), None);
        Self { client, access }
    }

    /// Works in tenant namespaces through the worker's RoleBinding to `role` there, as
    /// [`crate::KubePlatform::with_namespace_role`] (whose role this should be).
    pub fn with_namespace_role(mut self, role: Option<String>) -> Self {
        self.access = NamespaceAccess::new(self.client.clone(), role);
        self
    }

    fn tcps(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &api_resource())
    }

    /// Applies the cluster's TenantControlPlane and reports its readiness.
    #[instrument(skip_all, fields(tenant.id = %spec.cluster.tenant_id, cluster.id = %spec.cluster.cluster_id))]
    pub async fn ensure_control_plane(&self, spec: &ControlPlaneSpec) -> Result<ControlPlaneStatus, KubeError> {
        let cluster = &spec.cluster;
        let ns_name = isolation::namespace_name(cluster.cluster_id);
        // Isolation (step 1) comes first. Checking the namespace here turns a skipped or undone
        // step 1 into one clear, transient error instead of a 404 or 403 from the apply.
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let ns = namespaces
            .get_opt(&ns_name)
            .await
            .map_err(|source| KubeError::api("get", "Namespace", ns_name.as_str(), source))?
            .ok_or_else(|| KubeError::NamespaceMissing { namespace: ns_name.clone() })?;
        crate::driver::check_ours(&ns, cluster)?;
        if ns.metadata.deletion_timestamp.is_some() {
            return Err(KubeError::NamespaceTerminating { namespace: ns_name });
        }

        let name = tenant_control_plane_name(cluster.cluster_id);
        let full = format!("{ns_name}/{name}");
        let tcps = self.tcps(&ns_name);
        // Forced: paddock owns these fields outright (see `driver`). A rejected body (e.g. an
        // unset dataStore, which the CRD forbids) is a 422, hence permanent.
        let target = Target { kind: OBJECT, name: &name, full_name: &full };
        let converged = get_and_converge(&tcps, target, &tenant_control_plane(spec)).await?;
        if converged.changed {
            info!(namespace = %ns_name, "applied TenantControlPlane {full} of cluster {}", cluster.cluster_id);
        }
        let applied = converged.object;
        let secret = match admin_kubeconfig_secret_name(&applied) {
            Some(secret_name) => {
                let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &ns_name);
                secrets
                    .get_opt(secret_name)
                    .await
                    .map_err(|source| KubeError::api("get", "Secret", format!("{ns_name}/{secret_name}"), source))?
            }
            None => None,
        };
        let mut status = assess(&applied, secret.as_ref());
        if converged.changed {
            status.changed.push(target.describe());
        }
        debug!(ready = status.ready, reason = %status.reason, "TenantControlPlane {full}");
        Ok(status)
    }

    /// Deletes the cluster's TenantControlPlane; Kamaji's finalizer then cleans up its DataStore
    /// content, and the garbage collector the Secrets and Deployments it owns.
    #[instrument(skip_all, fields(tenant.id = %cluster.tenant_id, cluster.id = %cluster.cluster_id))]
    pub async fn delete_control_plane(&self, cluster: &ClusterRef) -> Result<Removal, KubeError> {
        let ns_name = isolation::namespace_name(cluster.cluster_id);
        let name = tenant_control_plane_name(cluster.cluster_id);
        let full = format!("{ns_name}/{name}");
        let tcps = self.tcps(&ns_name);
        let get = || async {
            tcps.get_opt(&name).await.map_err(|source| KubeError::api("get", OBJECT, full.as_str(), source))
        };
        let found = match get().await {
            // With a namespace role, unreadable is unbound: the namespace (and the binding in it)
            // is gone or going, which takes the object with it, or the binding is to be made again.
            Err(KubeError::Api { source, .. }) if self.access.role().is_some() && forbidden(&source) => {
                match self.access.enter(cluster).await? {
                    Entry::Absent => None,
                    Entry::Terminating => return Ok(Removal::Deleting),
                    Entry::Bound => get().await?,
                }
            }
            found => found?,
        };
        // Also None when the namespace is gone: nothing can be left in it.
        let Some(tcp) = found else {
            return Ok(Removal::Gone);
        };
        if tcp.metadata.deletion_timestamp.is_some() {
            return Ok(Removal::Deleting);
        }
        match tcps.delete(&name, &DeleteParams::default()).await {
            // NotFound: someone else finished the job in between, which is what we wanted.
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Removal::Gone),
            Err(source) => Err(KubeError::api("delete", OBJECT, full, source)),
            // Left: the object is still there, marked, waiting for its finalizers (Kamaji's).
            // Right: the API server removed it at once (no finalizers).
            Ok(outcome) => {
                info!(namespace = %ns_name, "deleting TenantControlPlane {full} of cluster {}", cluster.cluster_id);
                Ok(if outcome.is_left() { Removal::Deleting } else { Removal::Gone })
            }
        }
    }
}

impl ControlPlaneBackend for KamajiBackend {
    fn ensure_control_plane<'a>(
        &'a self,
        spec: &'a ControlPlaneSpec,
    ) -> BoxFuture<'a, Result<ControlPlaneStatus, DriverError>> {
        KamajiBackend::ensure_control_plane(self, spec).map(|r| r.map_err(DriverError::from)).boxed()
    }

    fn delete_control_plane<'a>(&'a self, cluster: &'a ClusterRef) -> BoxFuture<'a, Result<Removal, DriverError>> {
        KamajiBackend::delete_control_plane(self, cluster).map(|r| r.map_err(DriverError::from)).boxed()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use paddock_types::TenantId;

    use paddock_domain::driver::ServiceType;

    use super::*;

    fn spec(datastore: Option<&str>) -> ControlPlaneSpec {
        ControlPlaneSpec {
            cluster: ClusterRef {
                tenant_id: TenantId::new(),
                cluster_id: ClusterId::new(),
                tenant_name: "acme".to_owned(),
                cluster_name: "gpu".to_owned(),
            },
            kubernetes_version: "v1.34.1".to_owned(),
            replicas: 2,
            service_type: ServiceType::NodePort,
            datastore: datastore.map(str::to_owned),
        }
    }

    /// A TenantControlPlane at generation 3 with every readiness condition met.
    fn ready_tcp() -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "kamaji.clastix.io/v1alpha1",
            "kind": "TenantControlPlane",
            "metadata": { "name": "tcp-x", "namespace": "pc-x", "generation": 3 },
            "spec": {},
            "status": {
                "observedGeneration": 3,
                "controlPlaneEndpoint": "192.0.2.10:6443",
                "kubeconfig": { "admin": { "secretName": "tcp-x-admin-kubeconfig" } },
                "kubernetesResources": { "version": { "status": "Ready", "version": "v1.34.1" } },
            },
        }))
        .expect("a valid DynamicObject")
    }

    fn secret(data: &[(&str, &[u8])]) -> Secret {
        let data: BTreeMap<String, ByteString> =
            data.iter().map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec()))).collect();
        Secret { data: Some(data), ..Secret::default() }
    }

    #[test]
    fn names_derive_from_the_cluster_id() {
        let s = spec(None);
        let name = tenant_control_plane_name(s.cluster.cluster_id);
        assert_eq!(name, format!("tcp-{}", s.cluster.cluster_id.uuid().simple()));
        let body = tenant_control_plane(&s);
        assert_eq!(body["metadata"]["name"], json!(name));
        assert_eq!(body["metadata"]["namespace"], json!(isolation::namespace_name(s.cluster.cluster_id)));
        assert_eq!(body["metadata"]["labels"][isolation::LABEL_CLUSTER_ID], json!(s.cluster.cluster_id.to_string()));
    }

    #[test]
    fn the_body_sets_what_paddock_decides_and_nothing_else() {
        let body = tenant_control_plane(&spec(None));
        let spec_json = &body["spec"];
        assert_eq!(spec_json["kubernetes"]["version"], json!("v1.34.1"));
        assert_eq!(spec_json["controlPlane"]["deployment"]["replicas"], json!(2));
        assert_eq!(spec_json["controlPlane"]["service"]["serviceType"], json!("NodePort"));
        assert_eq!(spec_json["networkProfile"], json!({}));
        assert_eq!(spec_json["addons"], json!({ "konnectivity": {}, "coreDNS": {}, "kubeProxy": {} }));
        assert!(spec_json.get("dataStore").is_none(), "{spec_json}");
        let with = tenant_control_plane(&spec(Some("tenant-etcd")));
        assert_eq!(with["spec"]["dataStore"], json!("tenant-etcd"));
    }

    #[test]
    fn ready_when_every_condition_holds() {
        let s = assess(&ready_tcp(), Some(&secret(&[("admin.conf", b"kind: Config"), ("admin.svc", b"x")])));
        assert!(s.ready, "{s:?}");
        assert_eq!(s.reason, "");
        assert_eq!(s.endpoint.as_deref(), Some("192.0.2.10:6443"));
        assert_eq!(s.admin_kubeconfig.as_deref(), Some(&b"kind: Config"[..]));
    }

    /// A change to a ready status, the Secret found, and the words the reason must contain.
    type Case = (fn(&mut Value), Option<Secret>, &'static str);

    #[test]
    fn each_missing_condition_is_named() {
        let ok_secret = secret(&[("admin.conf", b"kind: Config")]);
        let cases: Vec<Case> = vec![
            (
                |st| st["observedGeneration"] = json!(2),
                Some(ok_secret.clone()),
                "not reconciled generation 3 yet (status.observedGeneration is 2)",
            ),
            (
                |st| st["kubernetesResources"]["version"]["status"] = json!("Upgrading"),
                Some(ok_secret.clone()),
                "version status is Upgrading, not Ready",
            ),
            (|st| st["controlPlaneEndpoint"] = json!(""), Some(ok_secret.clone()), "no control-plane endpoint"),
            (|st| st["kubeconfig"] = json!({}), Some(ok_secret.clone()), "secret is not named yet"),
            (|_| {}, None, "secret pc-x/tcp-x-admin-kubeconfig does not exist"),
            (|_| {}, Some(secret(&[("admin.conf", b"")])), "holds no admin.conf"),
        ];
        for (change, secret, expected) in cases {
            let mut tcp = ready_tcp();
            change(&mut tcp.data["status"]);
            let s = assess(&tcp, secret.as_ref());
            assert!(!s.ready, "{expected}: {s:?}");
            assert!(s.reason.contains(expected), "expected {expected:?} in {:?}", s.reason);
            assert!(!s.reason.contains(';'), "only one condition is missing: {:?}", s.reason);
        }
    }

    #[test]
    fn an_object_being_deleted_is_not_ready() {
        let mut tcp = ready_tcp();
        tcp.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::chrono::Utc::now()));
        let s = assess(&tcp, Some(&secret(&[("admin.conf", b"kind: Config")])));
        assert!(!s.ready);
        assert_eq!(s.reason, "the TenantControlPlane is being deleted");
    }

    #[test]
    fn a_fresh_object_lists_every_missing_condition() {
        let mut tcp = ready_tcp();
        tcp.data.as_object_mut().expect("object").remove("status");
        let s = assess(&tcp, None);
        assert!(!s.ready);
        assert_eq!(s.reason.split("; ").count(), 4, "{}", s.reason);
        assert!(s.reason.contains("status.observedGeneration is none"), "{}", s.reason);
        assert_eq!((s.endpoint, s.admin_kubeconfig), (None, None));
    }
}
