//! PLAYS A VOLUME PROVISIONER (the tenant stack's local-path-provisioner cannot run here): the
//! StorageClass paddock's driver names, and for every pending claim of it a PersistentVolume
//! pre-bound to the claim (`claimRef`), which the harness's real persistent-volume controller
//! then binds. Requests have timeouts; errors are logged and retried on the next round.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
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
