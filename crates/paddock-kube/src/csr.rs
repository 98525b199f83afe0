//! A node's certificate signing requests: its kubelet's bootstrap request and renewals, deleted
//! with the node when its machine is released (see `nodes`).

use base64::Engine;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};
use paddock_domain::driver::NodeRef;
use tracing::info;

use crate::KubeError;

/// Deletes the certificate signing requests of the machine's node: its kubelet's client
/// certificate requests, the bootstrap one and the renewals (their subject is
/// `system:node:<name>`). The certificates they carry name the node, and the cluster keeps
/// approved requests for an hour: nothing of the machine's stay outlives its release.
pub(crate) async fn delete_of_node(client: &Client, node: &NodeRef) -> Result<(), KubeError> {
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let list = csrs
        .list(&ListParams::default())
        .await
        .map_err(|source| KubeError::api("list", "CertificateSigningRequest", "*", source))?;
    let subject = format!("system:node:{}", node.node_name);
    for csr in list.items.iter().filter(|c| requests_for(c, &subject)) {
        let name = csr.metadata.name.clone().unwrap_or_default();
        match csrs.delete(&name, &DeleteParams::default()).await {
            // Someone else finished the job in between.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => return Err(KubeError::api("delete", "CertificateSigningRequest", name, source)),
            Ok(_) => info!(
                node.name = %node.node_name,
                "deleted certificate signing request {name} of machine {}",
                node.machine_id
            ),
        }
    }
    Ok(())
}

/// Whether `csr` asks for a certificate of `subject`: its requester (a node renewing its own), or
/// the subject inside its PKCS#10 request (the bootstrap request, made with the bootstrap token).
pub fn requests_for(csr: &CertificateSigningRequest, subject: &str) -> bool {
    if csr.spec.username.as_deref() == Some(subject) {
        return true;
    }
    let pem = String::from_utf8_lossy(&csr.spec.request.0);
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(body.trim())
        .is_ok_and(|der| der.windows(subject.len()).any(|w| w == subject.as_bytes()))
}
