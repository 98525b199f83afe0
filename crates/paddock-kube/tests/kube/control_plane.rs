//! `KamajiBackend` against a real API server with the real Kamaji CRDs (no Kamaji operator): the
//! tests play Kamaji by writing the TenantControlPlane's status through the `/status` subresource
//! and by creating the admin kubeconfig Secret, as Kamaji names and fills it.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::Api;
use paddock_domain::driver::{
    ClusterRef, ControlPlaneBackend, ControlPlaneSpec, ControlPlaneStatus, Removal, ServiceType,
};
use paddock_kube::kamaji::{self, ADMIN_KUBECONFIG_KEY};
use paddock_kube::{isolation, KamajiBackend, KubeError, KubePlatform};
use serde_json::{json, Value};

use crate::support::{self, eventually, ApiServer};

const ENDPOINT: &str = "192.0.2.10:6443";
const KUBECONFIG: &[u8] = b"apiVersion: v1\nkind: Config\nclusters: []\n";

/// One test's world: an isolated cluster on the shared Kamaji API server.
struct World {
    server: ApiServer,
    platform: KubePlatform,
    backend: KamajiBackend,
    cluster: ClusterRef,
    tcps: Api<DynamicObject>,
    secrets: Api<Secret>,
    name: String,
}

impl World {
    /// None: no harness or no CRDs (the test is skipped, as `support` explains).
    async fn new(tenant: &str, isolate: bool) -> Option<Self> {
        let server = support::kamaji().await?;
        let platform = server.platform().await;
        let cluster = support::cluster(tenant, "c1");
        if isolate {
            platform.ensure_isolation(&cluster).await.expect("ensure isolation");
        }
        let ns = isolation::namespace_name(cluster.cluster_id);
        let client = server.client().await;
        Some(Self {
            backend: KamajiBackend::new(platform.client().clone()),
            tcps: Api::namespaced_with(client.clone(), &ns, &kamaji::api_resource()),
            secrets: Api::namespaced(client, &ns),
            name: kamaji::tenant_control_plane_name(cluster.cluster_id),
            server,
            platform,
            cluster,
        })
    }

    fn spec(&self, version: &str) -> ControlPlaneSpec {
        ControlPlaneSpec {
            cluster: self.cluster.clone(),
            kubernetes_version: version.to_owned(),
            replicas: 2,
            service_type: ServiceType::LoadBalancer,
            datastore: None,
        }
    }

    async fn ensure(&self, version: &str) -> ControlPlaneStatus {
        self.backend.ensure_control_plane(&self.spec(version)).await.expect("ensure control plane")
    }

    async fn tcp(&self) -> DynamicObject {
        self.tcps.get(&self.name).await.expect("the TenantControlPlane exists")
    }

    fn secret_name(&self) -> String {
        format!("{}-admin-kubeconfig", self.name)
    }

    /// Plays Kamaji: merges `status` into the TenantControlPlane's status (generation untouched).
    async fn write_status(&self, status: Value) {
        self.tcps
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(json!({ "status": status })))
            .await
            .expect("status accepted by the CRD schema");
    }

    /// Plays Kamaji after a complete reconciliation of the current generation of `version`.
    async fn reconcile_as_kamaji(&self, version: &str) {
        let generation = self.tcp().await.metadata.generation.expect("generation");
        self.write_status(json!({
            "observedGeneration": generation,
            "controlPlaneEndpoint": ENDPOINT,
            "kubeconfig": { "admin": { "secretName": self.secret_name(), "checksum": "c" } },
            "kubernetesResources": { "version": { "status": "Ready", "version": version } },
        }))
        .await;
        self.put_secret(&[(ADMIN_KUBECONFIG_KEY, KUBECONFIG), ("admin.svc", KUBECONFIG)]).await;
    }

    /// Creates or replaces the admin kubeconfig Secret with `data`.
    async fn put_secret(&self, data: &[(&str, &[u8])]) {
        let data: BTreeMap<String, ByteString> =
            data.iter().map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec()))).collect();
        let secret = Secret {
            metadata: ObjectMeta { name: Some(self.secret_name()), ..ObjectMeta::default() },
            data: Some(data),
            ..Secret::default()
        };
        match self.secrets.get_opt(&self.secret_name()).await.expect("get secret") {
            Some(_) => self.secrets.replace(&self.secret_name(), &PostParams::default(), &secret).await,
            None => self.secrets.create(&PostParams::default(), &secret).await,
        }
        .expect("write the admin kubeconfig secret");
    }

    async fn assert_ready(&self, version: &str) {
        let status = self.ensure(version).await;
        assert!(status.ready, "{status:?}");
        assert_eq!(status.reason, "");
    }

    async fn assert_not_ready(&self, version: &str, expected: &str) -> ControlPlaneStatus {
        let status = self.ensure(version).await;
        assert!(!status.ready, "{expected}: {status:?}");
        assert!(status.reason.contains(expected), "expected {expected:?} in {:?}", status.reason);
        status
    }
}

#[tokio::test]
async fn ensure_control_plane_applies_a_tenant_control_plane_the_crd_accepts() {
    let Some(w) = World::new("tcp-apply", true).await else { return };
    let mut spec = w.spec("v1.34.1");
    spec.datastore = Some("tenant-etcd".to_owned());
    // Through the trait object, as the worker will hold it.
    let backend: &dyn ControlPlaneBackend = &w.backend;
    let status = backend.ensure_control_plane(&spec).await.expect("ensure");
    assert!(!status.ready, "nothing has reconciled it: {status:?}");
    assert!(status.reason.contains("generation 1"), "{}", status.reason);
    assert!(status.reason.contains("version status is not reported"), "{}", status.reason);
    assert_eq!((status.endpoint, status.admin_kubeconfig), (None, None));

    let tcp = w.tcp().await;
    let spec_json = &tcp.data["spec"];
    assert_eq!(spec_json["kubernetes"]["version"], json!("v1.34.1"), "{spec_json}");
    assert_eq!(spec_json["controlPlane"]["deployment"]["replicas"], json!(2), "{spec_json}");
    assert_eq!(spec_json["controlPlane"]["service"]["serviceType"], json!("LoadBalancer"), "{spec_json}");
    assert_eq!(spec_json["dataStore"], json!("tenant-etcd"), "{spec_json}");
    // The CRD's defaults fill what paddock leaves out, with the ports the NetworkPolicies open.
    assert_eq!(spec_json["networkProfile"]["port"], json!(isolation::API_SERVER_PORT), "{spec_json}");
    let addons = &spec_json["addons"];
    assert_eq!(addons["konnectivity"]["server"]["port"], json!(isolation::KONNECTIVITY_PORT), "{addons}");
    assert!(addons["coreDNS"].is_object() && addons["kubeProxy"].is_object(), "{addons}");
    let labels = tcp.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(isolation::LABEL_CLUSTER_ID), Some(&w.cluster.cluster_id.to_string()));
    let managers: Vec<_> = tcp.metadata.managed_fields.iter().flatten().filter_map(|m| m.manager.clone()).collect();
    assert_eq!(managers, [isolation::MANAGER], "one field manager");

    // Applying the same spec again changes nothing, not even the resourceVersion.
    let before = tcp.metadata.resource_version.clone();
    backend.ensure_control_plane(&spec).await.expect("ensure again");
    assert_eq!(w.tcp().await.metadata.resource_version, before);
}

#[tokio::test]
async fn control_plane_is_ready_once_kamaji_reports_it_and_wrote_the_admin_kubeconfig() {
    let Some(w) = World::new("tcp-ready", true).await else { return };
    w.assert_not_ready("v1.34.1", "generation 1").await;
    w.reconcile_as_kamaji("v1.34.1").await;

    let status = w.ensure("v1.34.1").await;
    assert!(status.ready, "{status:?}");
    assert_eq!(status.reason, "");
    assert_eq!(status.endpoint.as_deref(), Some(ENDPOINT));
    assert_eq!(status.admin_kubeconfig.as_deref(), Some(KUBECONFIG));

    // Kamaji's status writes moved the resourceVersion; ensuring again does not.
    let before = w.tcp().await.metadata.resource_version;
    w.assert_ready("v1.34.1").await;
    assert_eq!(w.tcp().await.metadata.resource_version, before);
}

#[tokio::test]
async fn each_missing_readiness_condition_alone_keeps_it_not_ready_with_a_reason() {
    let Some(w) = World::new("tcp-conditions", true).await else { return };
    let v = "v1.34.1";
    w.ensure(v).await;
    w.reconcile_as_kamaji(v).await;
    w.assert_ready(v).await;

    // Each case breaks one condition, checks the reason names it (and only it), then restores.
    w.write_status(json!({ "observedGeneration": 0 })).await;
    let s = w.assert_not_ready(v, "not reconciled generation 1 yet (status.observedGeneration is 0)").await;
    assert!(!s.reason.contains(';'), "{}", s.reason);
    w.reconcile_as_kamaji(v).await;
    w.assert_ready(v).await;

    w.write_status(json!({ "kubernetesResources": { "version": { "status": "Provisioning" } } })).await;
    let s = w.assert_not_ready(v, "version status is Provisioning, not Ready").await;
    assert!(!s.reason.contains(';'), "{}", s.reason);
    w.reconcile_as_kamaji(v).await;
    w.assert_ready(v).await;

    // A merge patch's null removes the field.
    w.write_status(json!({ "controlPlaneEndpoint": null })).await;
    let s = w.assert_not_ready(v, "no control-plane endpoint").await;
    assert!(!s.reason.contains(';'), "{}", s.reason);
    assert_eq!(s.endpoint, None);
    w.reconcile_as_kamaji(v).await;
    w.assert_ready(v).await;

    w.write_status(json!({ "kubeconfig": { "admin": { "secretName": null } } })).await;
    let s = w.assert_not_ready(v, "admin kubeconfig secret is not named yet").await;
    assert!(!s.reason.contains(';'), "{}", s.reason);
    w.reconcile_as_kamaji(v).await;
    w.assert_ready(v).await;

    w.secrets.delete(&w.secret_name(), &DeleteParams::default()).await.expect("delete the secret");
    let s = w.assert_not_ready(v, &format!("{} does not exist", w.secret_name())).await;
    assert!(!s.reason.contains(';'), "{}", s.reason);
    assert_eq!(s.admin_kubeconfig, None);
    w.reconcile_as_kamaji(v).await;
    w.assert_ready(v).await;

    w.put_secret(&[("admin.svc", KUBECONFIG)]).await;
    let s = w.assert_not_ready(v, "holds no admin.conf").await;
    assert!(!s.reason.contains(';'), "{}", s.reason);
    w.reconcile_as_kamaji(v).await;
    w.assert_ready(v).await;
}

#[tokio::test]
async fn a_version_upgrade_is_not_ready_until_kamaji_has_reconciled_it() {
    let Some(w) = World::new("tcp-upgrade", true).await else { return };
    w.ensure("v1.34.1").await;
    w.reconcile_as_kamaji("v1.34.1").await;
    w.assert_ready("v1.34.1").await;

    // The spec change bumps the generation; the status still describes the old one.
    let s = w.assert_not_ready("v1.35.0", "not reconciled generation 2 yet (status.observedGeneration is 1)").await;
    assert!(!s.reason.contains(';'), "{}", s.reason);
    let tcp = w.tcp().await;
    assert_eq!(tcp.metadata.generation, Some(2));
    assert_eq!(tcp.data["spec"]["kubernetes"]["version"], json!("v1.35.0"));

    // Kamaji picked up generation 2 and is upgrading.
    w.write_status(json!({
        "observedGeneration": 2,
        "kubernetesResources": { "version": { "status": "Upgrading", "version": "v1.34.1" } },
    }))
    .await;
    w.assert_not_ready("v1.35.0", "version status is Upgrading, not Ready").await;

    w.reconcile_as_kamaji("v1.35.0").await;
    w.assert_ready("v1.35.0").await;
    assert_eq!(w.tcp().await.metadata.generation, Some(2), "ensuring the upgraded spec changes nothing");
}

#[tokio::test]
async fn delete_control_plane_is_gone_without_finalizers_and_deleting_while_one_remains() {
    let Some(w) = World::new("tcp-delete", false).await else { return };
    // Neither namespace nor control plane exist yet: nothing to delete.
    assert_eq!(w.backend.delete_control_plane(&w.cluster).await.expect("delete"), Removal::Gone);
    w.platform.ensure_isolation(&w.cluster).await.expect("ensure isolation");
    assert_eq!(w.backend.delete_control_plane(&w.cluster).await.expect("delete"), Removal::Gone);

    // Without Kamaji there is no finalizer, so the API server removes it at once.
    w.ensure("v1.34.1").await;
    assert_eq!(w.backend.delete_control_plane(&w.cluster).await.expect("delete"), Removal::Gone);
    assert!(w.tcps.get_opt(&w.name).await.expect("get").is_none(), "Gone means it no longer exists");
    assert_eq!(w.backend.delete_control_plane(&w.cluster).await.expect("delete again"), Removal::Gone);

    // With a finalizer (as Kamaji adds one to clean up its DataStore), it is Deleting until the
    // finalizer goes.
    w.ensure("v1.34.1").await;
    let finalizer = json!({ "metadata": { "finalizers": ["paddock.dev/test-finalizer"] } });
    w.tcps.patch(&w.name, &PatchParams::default(), &Patch::Merge(&finalizer)).await.expect("add a finalizer");
    assert_eq!(w.backend.delete_control_plane(&w.cluster).await.expect("delete"), Removal::Deleting);
    assert_eq!(w.backend.delete_control_plane(&w.cluster).await.expect("delete again"), Removal::Deleting);
    let clear = json!({ "metadata": { "finalizers": null } });
    w.tcps.patch(&w.name, &PatchParams::default(), &Patch::Merge(&clear)).await.expect("remove the finalizer");
    eventually(Duration::from_secs(30), "the TenantControlPlane to go", || {
        let (backend, c) = (w.backend.clone(), w.cluster.clone());
        async move { (backend.delete_control_plane(&c).await.expect("delete") == Removal::Gone).then_some(()) }
    })
    .await;
    assert!(w.tcps.get_opt(&w.name).await.expect("get").is_none());
}

#[tokio::test]
async fn ensure_control_plane_before_isolation_is_a_transient_error() {
    let Some(w) = World::new("tcp-no-namespace", false).await else { return };
    let err = w.backend.ensure_control_plane(&w.spec("v1.34.1")).await.expect_err("no namespace yet");
    assert!(matches!(err, KubeError::NamespaceMissing { .. }), "{err:?}");
    assert!(err.is_transient());
    assert!(!format!("{err:?} {err}").contains(&w.server.token), "no credential in the error");

    // Through the trait, as the worker sees it.
    let backend: &dyn ControlPlaneBackend = &w.backend;
    let err = backend.ensure_control_plane(&w.spec("v1.34.1")).await.expect_err("no namespace yet");
    assert!(err.is_transient(), "{err:?}");
    assert_eq!(err.code, "namespace_missing");
    assert!(err.message.contains(&isolation::namespace_name(w.cluster.cluster_id)), "{}", err.message);
}
