//! The real Kamaji CRDs (from `../shared/crds/kamaji`, installed by the harness without webhook
//! conversion and the cert-manager annotation): a minimal TenantControlPlane is accepted in an
//! isolated namespace, and the ports its defaults give match the NetworkPolicies. Nothing runs
//! Kamaji's operator here; the TenantControlPlane step will play it by writing status.

use std::time::Duration;

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::Api;
use paddock_domain::driver::Removal;
use paddock_kube::isolation;
use serde_json::json;

use crate::support::{self, eventually};

#[tokio::test]
async fn a_tenant_control_plane_is_accepted_in_the_cluster_namespace() {
    let Some(crds) = support::kamaji_crds() else { return };
    let Some(server) = support::dedicated("kamaji-tcp", &crds).await else { return };
    let platform = server.platform().await;
    let c = support::cluster("kamaji", "c1");
    let ns = platform.ensure_isolation(&c).await.expect("ensure").namespace;

    let gvk = GroupVersionKind::gvk("kamaji.clastix.io", "v1alpha1", "TenantControlPlane");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "tenantcontrolplanes");
    let tcps: Api<DynamicObject> = Api::namespaced_with(server.client().await, &ns, &ar);
    let name = format!("tcp-{}", c.cluster_id.uuid().simple());
    // `networkProfile: {}` is required by the CRD's own CEL rules (no Kamaji webhook here).
    let body = json!({
        "apiVersion": "kamaji.clastix.io/v1alpha1",
        "kind": "TenantControlPlane",
        "metadata": { "name": name, "labels": isolation::labels(&c) },
        "spec": {
            "controlPlane": { "deployment": { "replicas": 2 }, "service": { "serviceType": "LoadBalancer" } },
            "kubernetes": { "version": "v1.35.0", "kubelet": {} },
            "networkProfile": {},
            "addons": { "konnectivity": {} }
        }
    });
    let tcp = tcps
        .patch(&name, &PatchParams::apply(isolation::MANAGER).force(), &Patch::Apply(&body))
        .await
        .expect("the TenantControlPlane is accepted");
    let spec = &tcp.data["spec"];
    assert_eq!(spec["networkProfile"]["port"], json!(isolation::API_SERVER_PORT), "{spec}");
    assert_eq!(spec["addons"]["konnectivity"]["server"]["port"], json!(isolation::KONNECTIVITY_PORT), "{spec}");

    // Deleting the namespace takes the custom resource with it.
    assert_eq!(platform.remove_isolation(&c).await.expect("remove"), Removal::Deleting);
    eventually(Duration::from_secs(120), "the namespace with its TenantControlPlane to go", || {
        let (platform, c) = (platform.clone(), c.clone());
        async move { (platform.remove_isolation(&c).await.expect("remove") == Removal::Gone).then_some(()) }
    })
    .await;
    support::delete(&server).await;
}
