//! `KubeTenantCredentials`: the [`TenantCredentials`] driver (docs/architecture.md, cluster
//! reconciler step 2), the tenant's
//! own kubeconfig for its cluster. Never the admin kubeconfig paddock itself uses.
//!
//! On the tenant cluster's API server, reached with the admin kubeconfig the control plane backend
//! wrote ([`TenantAccess::admin_kubeconfig`], checked as [`crate::nodes`] does), every call:
//! - applies (server-side, field manager [`MANAGER`], forced) the ServiceAccount
//!   [`SERVICE_ACCOUNT`] in [`NAMESPACE`] (`kube-system`: it exists in every cluster, so there is
//!   no namespace of paddock's to create and keep; the account mounts no token into pods) and the
//!   ClusterRoleBinding [`CLUSTER_ROLE_BINDING`] of it to `cluster-admin`. Re-applying every time
//!   repairs what a tenant (who is cluster-admin) deleted or changed;
//! - asks the TokenRequest subresource (`serviceaccounts/{name}/token`) for a token of
//!   `ttl_seconds` (the API server's default audiences; no bound object, so the token lives until
//!   it expires or the ServiceAccount is deleted: deleting [`SERVICE_ACCOUNT`] revokes every token
//!   handed out);
//! - returns a kubeconfig: the cluster `https://<endpoint>` with the admin kubeconfig's
//!   `certificate-authority-data` (the CA is public), and a user holding only that token.
//!
//! Tokens are never logged, and errors never quote a kubeconfig or a token.

use futures::FutureExt;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use kube::Api;
use paddock_domain::driver::{BoxFuture, DriverError, TenantAccess, TenantCredentials};
use paddock_domain::secret::SecretString;
use serde_json::json;
use tracing::{info, instrument};

use crate::isolation::MANAGER;
use crate::nodes::{admin_client, admin_kubeconfig};
use crate::KubeError;

/// The namespace of the tenant's ServiceAccount.
pub const NAMESPACE: &str = "kube-system";
/// The tenant's ServiceAccount (one per tenant cluster: each has its own API server).
pub const SERVICE_ACCOUNT: &str = "paddock-tenant-admin";
/// The ClusterRoleBinding of [`SERVICE_ACCOUNT`] to [`CLUSTER_ROLE`].
pub const CLUSTER_ROLE_BINDING: &str = "paddock-tenant-admin";
/// What the tenant may do in its cluster: everything.
pub const CLUSTER_ROLE: &str = "cluster-admin";
/// The shortest token lifetime the TokenRequest API accepts (a shorter request is raised to it).
pub const MIN_TTL_SECONDS: u64 = 600;
/// The longest lifetime requested (a year): a longer one is a caller's mistake, and capping keeps
/// the number representable. The API answers with a much lower bound of its own.
const MAX_TTL_SECONDS: u64 = 366 * 24 * 3600;

/// Tenant kubeconfigs with TokenRequest tokens, through the tenant clusters' API servers.
#[derive(Debug, Default, Clone, Copy)]
pub struct KubeTenantCredentials;

impl KubeTenantCredentials {
    /// The driver (it holds no state: a kubeconfig is asked for rarely, so every call builds its
    /// client from the admin kubeconfig it is given).
    pub fn new() -> Self {
        Self
    }

    /// Ensures the ServiceAccount and its binding, requests a token valid for `ttl_seconds`
    /// (within [`MIN_TTL_SECONDS`] and a year), and returns the tenant's kubeconfig (YAML).
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id))]
    pub async fn tenant_kubeconfig(&self, tenant: &TenantAccess, ttl_seconds: u64) -> Result<SecretString, KubeError> {
        let cluster_id = tenant.cluster.cluster_id;
        let parsed = admin_kubeconfig(tenant)?;
        let ca_data = ca_data(&parsed)
            .ok_or_else(|| KubeError::TenantCa { cluster_id, reason: "no certificate-authority-data".to_owned() })?;
        let (client, _) = admin_client(cluster_id, parsed).await?;

        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
        let apply = PatchParams::apply(MANAGER).force();
        let account = json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {
                "name": SERVICE_ACCOUNT,
                "namespace": NAMESPACE,
                "labels": { "app.kubernetes.io/managed-by": MANAGER },
            },
            // The account is for people with a kubeconfig, not for pods.
            "automountServiceAccountToken": false,
        });
        accounts.patch(SERVICE_ACCOUNT, &apply, &Patch::Apply(&account)).await.map_err(|source| {
            KubeError::api("apply", "ServiceAccount", format!("{NAMESPACE}/{SERVICE_ACCOUNT}"), source)
        })?;
        let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {
                "name": CLUSTER_ROLE_BINDING,
                "labels": { "app.kubernetes.io/managed-by": MANAGER },
            },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE },
            "subjects": [{ "kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE }],
        });
        bindings
            .patch(CLUSTER_ROLE_BINDING, &apply, &Patch::Apply(&binding))
            .await
            .map_err(|source| KubeError::api("apply", "ClusterRoleBinding", CLUSTER_ROLE_BINDING, source))?;

        let ttl = ttl_seconds.clamp(MIN_TTL_SECONDS, MAX_TTL_SECONDS);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                // Empty: the API server's own audiences, so the token authenticates to it.
                audiences: Vec::new(),
                expiration_seconds: Some(i64::try_from(ttl).unwrap_or(i64::MAX)),
                bound_object_ref: None,
            },
            ..TokenRequest::default()
        };
        let name = format!("{NAMESPACE}/{SERVICE_ACCOUNT}");
        let answer = accounts
            .create_token_request(SERVICE_ACCOUNT, &PostParams::default(), &request)
            .await
            .map_err(|source| KubeError::api("create", "TokenRequest", name.as_str(), source))?;
        let status = answer.status.filter(|s| !s.token.is_empty()).ok_or(KubeError::TenantToken { cluster_id })?;
        let expires = status.expiration_timestamp.0;
        info!(
            ttl_seconds = ttl,
            "issued a token of service account {name} in tenant cluster {cluster_id}, expiring {expires}"
        );
        Ok(SecretString::new(kubeconfig_yaml(tenant, &ca_data, &status.token)))
    }
}

impl TenantCredentials for KubeTenantCredentials {
    fn tenant_kubeconfig<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        ttl_seconds: u64,
    ) -> BoxFuture<'a, Result<SecretString, DriverError>> {
        KubeTenantCredentials::tenant_kubeconfig(self, tenant, ttl_seconds)
            .map(|r| r.map_err(DriverError::from))
            .boxed()
    }
}

/// The `certificate-authority-data` of the cluster the admin kubeconfig uses (its current
/// context's, else its only cluster's): the CA the client built from it trusts.
fn ca_data(kubeconfig: &Kubeconfig) -> Option<String> {
    let clusters: Vec<_> = kubeconfig.clusters.iter().collect();
    let current = kubeconfig.current_context.as_deref().and_then(|name| {
        let context = kubeconfig.contexts.iter().find(|c| c.name == name)?.context.as_ref()?;
        clusters.iter().find(|c| c.name == context.cluster)
    });
    let cluster = match current {
        Some(c) => c,
        None if clusters.len() == 1 => clusters[0],
        None => return None,
    };
    cluster.cluster.as_ref()?.certificate_authority_data.clone().filter(|d| !d.trim().is_empty())
}

/// A YAML string scalar: JSON's double-quoted string is one (YAML 1.2 is a superset of JSON), so
/// nothing in a value can break out of it.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// The tenant's kubeconfig: one cluster, one context, one user with the token.
fn kubeconfig_yaml(tenant: &TenantAccess, ca_data: &str, token: &str) -> String {
    let reference = &tenant.cluster;
    let cluster = quoted(&format!("paddock-{}-{}", reference.tenant_name, reference.cluster_name));
    let user = quoted(&format!("paddock-{}-{}-admin", reference.tenant_name, reference.cluster_name));
    let server = quoted(&format!("https://{}", tenant.endpoint.trim_start_matches("https://")));
    let (ca_data, token) = (quoted(ca_data.trim()), quoted(token));
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: {cluster}\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca_data}\n\
         contexts:\n\
         - name: {cluster}\n  context:\n    cluster: {cluster}\n    user: {user}\n\
         current-context: {cluster}\n\
         users:\n\
         - name: {user}\n  user:\n    token: {token}\n"
    )
}

#[cfg(test)]
mod tests {
    use paddock_domain::driver::ClusterRef;
    use paddock_types::{ClusterId, TenantId};

    use super::*;

    fn access(admin: &str) -> TenantAccess {
        TenantAccess {
            cluster: ClusterRef {
                tenant_id: TenantId::new(),
                cluster_id: ClusterId::new(),
                tenant_name: "acme".to_owned(),
                cluster_name: "hpc".to_owned(),
            },
            endpoint: "10.0.0.7:6443".to_owned(),
            admin_kubeconfig: SecretString::new(admin.to_owned()),
        }
    }

    #[test]
    fn the_kubeconfig_holds_the_endpoint_the_ca_and_only_the_token() {
        let yaml = kubeconfig_yaml(&access(""), "Q0EtREFUQQ==", "eyJh.b.c");
        let parsed = Kubeconfig::from_yaml(&yaml).expect("a kubeconfig");
        assert_eq!(parsed.current_context.as_deref(), Some("paddock-acme-hpc"));
        let cluster = parsed.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://10.0.0.7:6443"));
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0EtREFUQQ=="));
        let user = parsed.auth_infos[0].auth_info.as_ref().expect("user");
        assert!(user.token.is_some() && yaml.contains("token: \"eyJh.b.c\"\n"), "{yaml}");
        assert!(user.client_certificate_data.is_none() && user.client_key_data.is_none());
        assert_eq!(
            parsed.contexts[0].context.as_ref().map(|c| c.user.clone()),
            Some(Some("paddock-acme-hpc-admin".to_owned()))
        );
    }

    #[test]
    fn the_ca_is_the_current_contexts() {
        let admin = "apiVersion: v1\nkind: Config\n\
            clusters: [{name: a, cluster: {server: 'https://a', certificate-authority-data: QUFB}},\n\
                       {name: b, cluster: {server: 'https://b', certificate-authority-data: QkJC}}]\n\
            contexts: [{name: ctx, context: {cluster: b, user: u}}]\n\
            current-context: ctx\n\
            users: [{name: u, user: {client-certificate-data: Q0VSVA==, client-key-data: S0VZ}}]\n";
        let parsed = Kubeconfig::from_yaml(admin).expect("yaml");
        assert_eq!(ca_data(&parsed).as_deref(), Some("QkJC"));
        let none = Kubeconfig::from_yaml("clusters: [{name: a, cluster: {server: 'https://a'}}]").expect("yaml");
        assert_eq!(ca_data(&none), None);
    }
}
