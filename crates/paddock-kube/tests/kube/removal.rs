//! `remove_isolation` against a real API server with the real namespace controller (which takes
//! at least 5 s before it starts deleting content).

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use paddock_domain::driver::Removal;
use paddock_kube::{isolation, KubeError};

use crate::support::{self, eventually};

#[tokio::test]
async fn remove_isolation_is_deleting_until_the_namespace_is_gone() {
    let Some(server) = support::shared().await else { return };
    let platform = server.platform().await;
    let client = server.client().await;
    let c = support::cluster("remove", "c1");
    let ns = platform.ensure_isolation(&c).await.expect("ensure").namespace;

    assert_eq!(platform.remove_isolation(&c).await.expect("remove"), Removal::Deleting);
    // The namespace controller waits >= 5 s, so the namespace is still there, terminating.
    let terminating = Api::<Namespace>::all(client.clone()).get(&ns).await.expect("still there");
    assert!(terminating.metadata.deletion_timestamp.is_some(), "marked for deletion");
    assert_eq!(platform.remove_isolation(&c).await.expect("remove again"), Removal::Deleting);
    // Ensuring meanwhile cannot succeed, and says so as a transient condition.
    let err = platform.ensure_isolation(&c).await.expect_err("namespace terminating");
    assert!(matches!(err, KubeError::NamespaceTerminating { .. }), "{err:?}");
    assert!(err.is_transient());

    eventually(Duration::from_secs(90), "the namespace controller to finish", || {
        let platform = platform.clone();
        let c = c.clone();
        async move { (platform.remove_isolation(&c).await.expect("remove while waiting") == Removal::Gone).then_some(()) }
    })
    .await;
    let gone = Api::<Namespace>::all(client.clone()).get_opt(&ns).await.expect("get");
    assert!(gone.is_none(), "Gone means the namespace no longer exists");
    assert_eq!(platform.remove_isolation(&c).await.expect("remove once more"), Removal::Gone);
}

#[tokio::test]
async fn remove_isolation_of_a_cluster_never_isolated_is_gone() {
    let Some(server) = support::shared().await else { return };
    let platform = server.platform().await;
    let c = support::cluster("never", "c1");
    assert_eq!(platform.remove_isolation(&c).await.expect("remove"), Removal::Gone);
    assert!(isolation::namespace_name(c.cluster_id).starts_with("pc-"));
}
