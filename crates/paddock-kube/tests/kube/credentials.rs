//! `KubeTenantCredentials` against a real API server playing the tenant cluster (the shared one,
//! reached through its admin kubeconfig as Kamaji's would be). The harness's API servers sign
//! service-account tokens (`--service-account-issuer`, signing key), so TokenRequest is real here.

use base64::Engine;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use paddock_domain::driver::{TenantAccess, TenantCredentials};
use paddock_domain::secret::SecretString;
use paddock_kube::credentials::{CLUSTER_ROLE_BINDING, NAMESPACE, SERVICE_ACCOUNT};
use paddock_kube::KubeTenantCredentials;
use serde_json::Value;

use crate::support::{self, ApiServer};

/// The tenant cluster as the API reaches it: the API server's admin kubeconfig.
fn access(server: &ApiServer) -> TenantAccess {
    let kubeconfig = std::fs::read_to_string(&server.kubeconfig).expect("read the harness kubeconfig");
    TenantAccess {
        cluster: support::cluster("acme", "hpc"),
        endpoint: server.url.trim_start_matches("https://").to_owned(),
        admin_kubeconfig: SecretString::new(kubeconfig),
    }
}

/// A client built from the tenant's kubeconfig alone.
async fn tenant_client(kubeconfig: &str) -> Client {
    let parsed = Kubeconfig::from_yaml(kubeconfig).expect("the tenant kubeconfig parses");
    let config =
        Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default()).await.expect("a usable kubeconfig");
    Client::try_from(config).expect("a client")
}

/// The claims of the kubeconfig's token (a JWT; its signature is the API server's business).
fn claims(kubeconfig: &str) -> Value {
    let parsed = Kubeconfig::from_yaml(kubeconfig).expect("yaml");
    let user = parsed.auth_infos[0].auth_info.clone().expect("user");
    // The token is in the YAML as a quoted scalar; read it back from the text (kube-rs keeps it secret).
    assert!(user.token.is_some(), "a token user");
    let line = kubeconfig.lines().find(|l| l.trim_start().starts_with("token: ")).expect("token line");
    let token: String = serde_json::from_str(line.trim_start().trim_start_matches("token: ")).expect("quoted token");
    let payload = token.split('.').nth(1).expect("a JWT");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).expect("base64url");
    serde_json::from_slice(&bytes).expect("claims JSON")
}

#[tokio::test]
async fn the_kubeconfig_works_as_the_service_account_and_expires_per_the_ttl() {
    let Some(server) = support::shared().await else { return };
    let tenant = access(&server);
    let driver = KubeTenantCredentials::new();
    let kubeconfig = driver.tenant_kubeconfig(&tenant, 1800).await.expect("a kubeconfig");
    let text = kubeconfig.expose();

    // Never the admin's credentials: the harness's admin kubeconfig holds a static token.
    assert!(!text.contains(&server.token), "the admin token leaked into the tenant kubeconfig");
    for field in ["client-key-data", "client-certificate-data", "username", "password", "exec", "auth-provider"] {
        assert!(!text.contains(field), "{field} in the tenant kubeconfig");
    }
    let parsed = Kubeconfig::from_yaml(text).expect("yaml");
    let cluster = parsed.clusters[0].cluster.clone().expect("cluster");
    assert_eq!(cluster.server.as_deref(), Some(server.url.as_str()));
    let admin = Kubeconfig::from_yaml(tenant.admin_kubeconfig.expose()).expect("admin yaml");
    let admin_ca = admin.clusters[0].cluster.clone().and_then(|c| c.certificate_authority_data);
    assert_eq!(cluster.certificate_authority_data, admin_ca, "the CA is the admin kubeconfig's");

    // It works, as the ServiceAccount (cluster-admin: it lists namespaces).
    let client = tenant_client(text).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let listed = namespaces.list(&ListParams::default()).await.expect("list namespaces with the tenant kubeconfig");
    assert!(listed.items.iter().any(|n| n.metadata.name.as_deref() == Some("kube-system")));
    let review = Api::<SelfSubjectReview>::all(client)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("SelfSubjectReview");
    let user = review.status.and_then(|s| s.user_info).and_then(|u| u.username);
    assert_eq!(user, Some(format!("system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}")));

    // The token expires per the TTL.
    let claims = claims(text);
    let (iat, exp) = (claims["iat"].as_i64().expect("iat"), claims["exp"].as_i64().expect("exp"));
    assert_eq!(exp - iat, 1800, "{claims}");
    let now = k8s_openapi::chrono::Utc::now().timestamp();
    assert!((exp - now - 1800).abs() < 120, "exp {exp} is not about 30 min from now {now}");

    // Again: idempotent, a fresh token; below the API's minimum the TTL is raised to 10 min.
    let again = driver.tenant_kubeconfig(&tenant, 60).await.expect("a second kubeconfig");
    assert_ne!(again.expose(), text, "a fresh token each time");
    let claims = self::claims(again.expose());
    assert_eq!(claims["exp"].as_i64().expect("exp") - claims["iat"].as_i64().expect("iat"), 600);
}

#[tokio::test]
async fn the_account_and_binding_are_restored_and_deleting_the_account_revokes_its_tokens() {
    // Its own API server: deleting the account must not revoke the other tests' tokens.
    let Some(server) = support::dedicated("credentials-revoke", &[]).await else { return };
    let tenant = access(&server);
    let driver = KubeTenantCredentials::new();
    let first = driver.tenant_kubeconfig(&tenant, 3600).await.expect("a kubeconfig");
    let admin = server.client().await;

    // The tenant (cluster-admin) deletes both: the old token dies with the account.
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), NAMESPACE);
    accounts.delete(SERVICE_ACCOUNT, &DeleteParams::default()).await.expect("delete the ServiceAccount");
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    bindings.delete(CLUSTER_ROLE_BINDING, &DeleteParams::default()).await.expect("delete the binding");
    let old: Api<Namespace> = Api::all(tenant_client(first.expose()).await);
    let refused = support::eventually(std::time::Duration::from_secs(30), "the old token to be refused", || {
        let old = old.clone();
        async move {
            match old.list(&ListParams::default()).await {
                Err(kube::Error::Api(status)) if status.code == 401 => Some(()),
                _ => None,
            }
        }
    });
    refused.await;

    // The next call restores both, and its kubeconfig works.
    let second = driver.tenant_kubeconfig(&tenant, 3600).await.expect("a kubeconfig after the deletion");
    accounts.get(SERVICE_ACCOUNT).await.expect("the ServiceAccount is back");
    let binding = bindings.get(CLUSTER_ROLE_BINDING).await.expect("the binding is back");
    assert_eq!(binding.role_ref.name, "cluster-admin");
    let fresh: Api<Namespace> = Api::all(tenant_client(second.expose()).await);
    fresh.list(&ListParams::default()).await.expect("the new kubeconfig works");
    support::delete(&server).await;
}

#[tokio::test]
async fn an_unreachable_tenant_cluster_is_a_transient_error_without_credentials() {
    let Some(server) = support::shared().await else { return };
    let mut tenant = access(&server);
    // The admin kubeconfig pointing at a closed port: what a control plane that went away looks like.
    let closed = tenant.admin_kubeconfig.expose().replace(&server.url, "https://127.0.0.1:9");
    tenant.admin_kubeconfig = SecretString::new(closed);
    let e = TenantCredentials::tenant_kubeconfig(&KubeTenantCredentials::new(), &tenant, 3600)
        .await
        .expect_err("nothing listens");
    assert!(e.is_transient(), "{e:?}");
    assert!(!e.message.contains(&server.token), "{e:?}");
}
