//! Failures of the API server itself.

use paddock_domain::driver::PlatformDriver;
use paddock_kube::KubeError;

use crate::support;

#[tokio::test]
async fn a_stopped_api_server_gives_a_transient_error() {
    let Some(server) = support::dedicated("stopped-api-server", &[]).await else { return };
    let platform = server.platform().await;
    let c = support::cluster("stopped", "c1");
    platform.ensure_isolation(&c).await.expect("ensure while it runs");

    support::delete(&server).await;
    let err = platform.ensure_isolation(&c).await.expect_err("the API server is gone");
    assert!(matches!(err, KubeError::Api { .. }), "{err:?}");
    assert!(err.is_transient(), "a connection failure is transient: {err:?}");
    assert_eq!(err.status_code(), None, "no answer, no status: {err:?}");

    // Neither the message chain nor the debug form carries the credentials.
    let mut chain = format!("{err:?}");
    let mut source: Option<&dyn std::error::Error> = Some(&err);
    while let Some(e) = source {
        chain.push_str(&e.to_string());
        source = e.source();
    }
    assert!(!chain.contains(&server.token), "the error leaks the token: {chain}");

    let err = platform.remove_isolation(&c).await.expect_err("still gone");
    assert!(err.is_transient(), "{err:?}");

    // Through the trait, as the worker sees it: transient, the chain in the message, no token.
    let driver: &dyn PlatformDriver = &platform;
    let err = driver.ensure_isolation(&c).await.expect_err("still gone");
    assert!(err.is_transient(), "{err:?}");
    assert_eq!(err.code, "kube_api_error");
    assert!(err.message.starts_with("get Namespace "), "{}", err.message);
    assert!(err.message.len() > "get Namespace ".len() + 40, "the cause is in the message: {}", err.message);
    assert!(!format!("{err:?}").contains(&server.token), "the error leaks the token: {err:?}");
}
