//! PLAYS A VOLUME PROVISIONER (the tenant stack's local-path-provisioner cannot run here): the
//! StorageClass paddock's driver names, and for every pending claim of it a PersistentVolume
//! pre-bound to the claim (`claimRef`), which the harness's real persistent-volume controller
//! then binds. It also PLAYS the pvc-protection controller of kube-controller-manager, which the
//! harness does not run: a claim being deleted loses its `kubernetes.io/pvc-protection`
//! finalizer once no pod uses it. Requests have timeouts; errors are logged and retried on the
//! next round.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::task::JoinHandle;

/// The provisioner name of the played StorageClass.
const PROVISIONER: &str = "paddock.test/played-provisioner";
const REQUEST: Duration = Duration::from_secs(20);

/// Creates the StorageClass `class` of the played provisioner.
pub async fn storage_class(client: &Client, class: &str) {
    let api: Api<kube::api::DynamicObject> = Api::all_with(
        client.clone(),
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("storage.k8s.io", "v1", "StorageClass")),
    );
    let body = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": { "name": class }, "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
    });
    api.patch(class, &PatchParams::apply("played-provisioner").force(), &Patch::Apply(&body))
        .await
        .unwrap_or_else(|e| panic!("creating StorageClass {class}: {e}"));
}

/// Starts the provisioner for claims of `class`; the task only ends by a panic.
pub fn spawn(client: Client, class: String) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let claims: Api<PersistentVolumeClaim> = Api::all(client.clone());
            match tokio::time::timeout(REQUEST, claims.list(&ListParams::default())).await {
                Ok(Ok(list)) => {
                    for claim in list.items.iter().filter(|c| pending(c, &class)) {
                        if let Err(e) = bind(&client, claim).await {
                            let name = claim.metadata.name.as_deref().unwrap_or_default();
                            eprintln!("played provisioner: claim {name}: {e}");
                        }
                    }
                    for claim in list.items.iter().filter(|c| protected_deletion(c, &class)) {
                        if let Err(e) = unprotect(&client, claim).await {
                            let name = claim.metadata.name.as_deref().unwrap_or_default();
                            eprintln!("played pvc-protection: claim {name}: {e}");
                        }
                    }
                }
                Ok(Err(e)) => eprintln!("played provisioner: listing claims: {e}"),
                Err(_) => eprintln!("played provisioner: listing claims: no answer within {REQUEST:?}"),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

fn pending(claim: &PersistentVolumeClaim, class: &str) -> bool {
    claim.metadata.deletion_timestamp.is_none()
        && claim.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()) == Some(class)
        && claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound")
}

async fn bind(client: &Client, claim: &PersistentVolumeClaim) -> Result<(), String> {
    let ns = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let spec = claim.spec.clone().unwrap_or_default();
    let storage = spec.resources.as_ref().and_then(|r| r.requests.as_ref()).and_then(|r| r.get("storage")).cloned();
    let storage = storage.ok_or("no storage request")?;
    let pv_name = format!("pv-{uid}");
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": { "name": pv_name, "annotations": { "pv.kubernetes.io/provisioned-by": PROVISIONER } },
        "spec": {
            "capacity": { "storage": storage }, "accessModes": spec.access_modes, "storageClassName": spec.storage_class_name,
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": { "kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": ns, "name": name, "uid": uid },
            "hostPath": { "path": format!("/var/lib/paddock-played-volumes/{pv_name}") },
        },
    }))
    .map_err(|e| format!("a PersistentVolume: {e}"))?;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    match tokio::time::timeout(REQUEST, pvs.create(&PostParams::default(), &pv)).await {
        Ok(Ok(_)) | Ok(Err(kube::Error::Api(kube::core::ErrorResponse { code: 409, .. }))) => {}
        Ok(Err(e)) => return Err(format!("creating {pv_name}: {e}")),
        Err(_) => return Err(format!("creating {pv_name}: no answer within {REQUEST:?}")),
    }
    Ok(())
}

/// The finalizer the StorageObjectInUseProtection admission plugin puts on every claim.
const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";

fn protected_deletion(claim: &PersistentVolumeClaim, class: &str) -> bool {
    claim.metadata.deletion_timestamp.is_some()
        && claim.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()) == Some(class)
        && claim.metadata.finalizers.iter().flatten().any(|f| f == PVC_PROTECTION)
}

/// Lifts the protection of a claim being deleted once no pod of its namespace uses it (a patch
/// conditional on the `resourceVersion` read; a conflict is retried on the next round).
async fn unprotect(client: &Client, claim: &PersistentVolumeClaim) -> Result<(), String> {
    let ns = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pods = match tokio::time::timeout(REQUEST, pods.list(&ListParams::default())).await {
        Ok(Ok(list)) => list.items,
        Ok(Err(e)) => return Err(format!("listing pods: {e}")),
        Err(_) => return Err(format!("listing pods: no answer within {REQUEST:?}")),
    };
    let uses = |pod: &Pod| {
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.clone()).unwrap_or_default();
        volumes.iter().any(|v| v.persistent_volume_claim.as_ref().is_some_and(|c| c.claim_name == name))
    };
    if let Some(user) = pods.iter().find(|p| uses(p)) {
        let user = user.metadata.name.as_deref().unwrap_or_default();
        eprintln!("played pvc-protection: claim {ns}/{name} is still used by pod {user}");
        return Ok(());
    }
    let kept: Vec<&String> = claim.metadata.finalizers.iter().flatten().filter(|f| *f != PVC_PROTECTION).collect();
    let patch = json!({ "metadata": { "resourceVersion": claim.metadata.resource_version, "finalizers": kept } });
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    match tokio::time::timeout(REQUEST, claims.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))).await {
        Ok(Ok(_)) | Ok(Err(kube::Error::Api(kube::core::ErrorResponse { code: 404 | 409, .. }))) => Ok(()),
        Ok(Err(e)) => Err(format!("lifting its protection: {e}")),
        Err(_) => Err(format!("lifting its protection: no answer within {REQUEST:?}")),
    }
}
