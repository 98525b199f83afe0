//! `KubeError`: failures of the Kubernetes driver, classified transient or permanent.
//!
//! Messages name the object and the verb, never a credential: the kubeconfig's token stays inside
//! kube-rs' `Config`, which no variant holds. kube-rs' own errors (the `#[source]`) carry the API
//! server's `Status` message or the connection failure, neither of which contains the token.

use std::path::PathBuf;

use paddock_domain::driver::DriverError;
use paddock_types::ClusterId;

/// A failure of the Kubernetes driver.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The kubeconfig file could not be read or did not yield a usable configuration.
    #[error("loading the kubeconfig {path}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Not running in a pod, or the service-account files are unusable.
    #[error("loading the in-cluster Kubernetes configuration")]
    InCluster {
        /// Why.
        #[source]
        source: kube::config::InClusterError,
    },
    /// The HTTP client could not be built from the configuration.
    #[error("building the Kubernetes client")]
    Client {
        /// Why.
        #[source]
        source: Box<kube::Error>,
    },
    /// A request to the API server failed.
    #[error("{verb} {kind} {name}")]
    Api {
        /// `get`, `apply` or `delete`.
        verb: &'static str,
        /// The object's kind, e.g. `NetworkPolicy`.
        kind: &'static str,
        /// `namespace/name`, or just the name for cluster-scoped objects.
        name: String,
        /// What kube-rs reported (boxed: kube's error is large, and this is the cold path).
        #[source]
        source: Box<kube::Error>,
    },
    /// The cluster's namespace is being deleted, so nothing can be ensured in it now.
    #[error("namespace {namespace} is being deleted")]
    NamespaceTerminating {
        /// The namespace.
        namespace: String,
    },
    /// The cluster's namespace does not exist (yet): isolation must be ensured first.
    #[error("namespace {namespace} does not exist")]
    NamespaceMissing {
        /// The namespace.
        namespace: String,
    },
    /// A namespace with the derived name exists but is labelled for another cluster: paddock
    /// neither adopts nor deletes it.
    #[error("namespace {namespace} exists but does not belong to cluster {cluster_id}")]
    ForeignNamespace {
        /// The namespace.
        namespace: String,
        /// The cluster that was expected in its label.
        cluster_id: paddock_types::ClusterId,
    },
    /// The worker's RoleBinding in a tenant namespace was made but did not yet grant anything
    /// (the API server's authorizer had not seen it); the next run finds it in effect.
    #[error("the worker's RoleBinding in namespace {namespace} is not in effect yet")]
    BindingPending {
        /// The namespace.
        namespace: String,
    },
    /// The admin kubeconfig of a tenant cluster did not yield a usable configuration.
    #[error("loading the admin kubeconfig of tenant cluster {cluster_id}")]
    TenantKubeconfig {
        /// The tenant cluster.
        cluster_id: ClusterId,
        /// Why. Never shown beyond this level by [`DriverError::from`]: a YAML error may quote
        /// the text around it, which is a credential here.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The admin kubeconfig of a tenant cluster asks for something paddock does not do with a
    /// tenant's kubeconfig: run a program (`exec`, `auth-provider`) or read local files.
    #[error("the admin kubeconfig of tenant cluster {cluster_id} is refused: {reason}")]
    TenantKubeconfigRefused {
        /// The tenant cluster.
        cluster_id: ClusterId,
        /// What is refused (a field name, no value).
        reason: &'static str,
    },
    /// The admin kubeconfig of a tenant cluster names no usable CA certificate, so no CA pin
    /// can be given to joining machines.
    #[error("the admin kubeconfig of tenant cluster {cluster_id} has no usable CA certificate: {reason}")]
    TenantCa {
        /// The tenant cluster.
        cluster_id: ClusterId,
        /// What is wrong (no secret: the CA certificate is public).
        reason: String,
    },
    /// A tenant cluster holds more Nodes than the driver reads ([`crate::nodes::NodeLimits`]).
    /// Transient: the tenant may delete some.
    #[error("tenant cluster {cluster_id} holds more than {max} Nodes")]
    TooManyNodes {
        /// The tenant cluster.
        cluster_id: ClusterId,
        /// The limit.
        max: usize,
    },
    /// A tenant cluster holds more running and pending pods than the demand read of its elastic
    /// pools reads ([`crate::nodes::NodeLimits`]). Transient: the pods may end.
    #[error("tenant cluster {cluster_id} runs more than {max} pods")]
    TooManyPods {
        /// The tenant cluster.
        cluster_id: ClusterId,
        /// The limit.
        max: usize,
    },
    /// An object could not be encoded as JSON to compare it with what the API server holds.
    #[error("encoding {kind} {name} as JSON")]
    Encode {
        /// The object's kind.
        kind: &'static str,
        /// `namespace/name`, or just the name.
        name: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The TokenRequest of the tenant's ServiceAccount was answered without a token.
    #[error("the API server of tenant cluster {cluster_id} answered a TokenRequest without a token")]
    TenantToken {
        /// The tenant cluster.
        cluster_id: ClusterId,
    },
}

impl KubeError {
    /// A failed request: `verb` of the `kind` object `name`.
    pub(crate) fn api(verb: &'static str, kind: &'static str, name: impl Into<String>, source: kube::Error) -> Self {
        Self::Api { verb, kind, name: name.into(), source: Box::new(source) }
    }

    /// Whether retrying the same call later may succeed: server errors (5xx), throttling (429),
    /// conflicts (409: a concurrent writer, or a namespace that was being deleted), timeouts (408,
    /// 504) and connection failures are transient; other 4xx answers (validation, forbidden,
    /// malformed) and configuration problems are permanent.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Kubeconfig { .. }
            | Self::InCluster { .. }
            | Self::Client { .. }
            | Self::ForeignNamespace { .. }
            | Self::TenantKubeconfigRefused { .. }
            | Self::TenantCa { .. }
            | Self::TenantToken { .. }
            | Self::Encode { .. } => false,
            // Kamaji rewrites a broken admin kubeconfig when it reconciles; paddock re-reads it
            // from the control plane on every run. Until then, retrying the same one is useless.
            Self::TenantKubeconfig { .. } => false,
            // The namespace finishes terminating by itself; ensuring again then recreates it.
            Self::NamespaceTerminating { .. } => true,
            // The reconciler ensures isolation before the control plane; the next run creates it.
            Self::NamespaceMissing { .. } => true,
            Self::BindingPending { .. } => true,
            Self::TooManyNodes { .. } | Self::TooManyPods { .. } => true,
            Self::Api { source, .. } => source_is_transient(source),
        }
    }

    /// The stable snake_case code of this kind of failure (a [`DriverError`]'s `code`).
    pub fn code(&self) -> &'static str {
        match self {
            Self::Kubeconfig { .. } => "kubeconfig_invalid",
            Self::InCluster { .. } => "in_cluster_config_invalid",
            Self::Client { .. } => "kube_client_error",
            Self::Api { .. } => "kube_api_error",
            Self::NamespaceTerminating { .. } => "namespace_terminating",
            Self::NamespaceMissing { .. } => "namespace_missing",
            Self::ForeignNamespace { .. } => "foreign_namespace",
            Self::BindingPending { .. } => "namespace_binding_pending",
            Self::TenantKubeconfig { .. } => "tenant_kubeconfig_invalid",
            Self::TenantKubeconfigRefused { .. } => "tenant_kubeconfig_refused",
            Self::TenantCa { .. } => "tenant_ca_invalid",
            Self::TenantToken { .. } => "tenant_token_missing",
            Self::TooManyNodes { .. } => "tenant_nodes_over_limit",
            Self::TooManyPods { .. } => "tenant_pods_over_limit",
            Self::Encode { .. } => "kube_encode_error",
        }
    }

    /// The message of the error and its causes, `: `-separated. Kubeconfig parse errors stop at
    /// this crate's level: YAML and PEM errors may quote the surrounding text, which holds keys
    /// and tokens.
    pub fn message_chain(&self) -> String {
        let mut message = self.to_string();
        if matches!(self, Self::Kubeconfig { .. } | Self::TenantKubeconfig { .. }) {
            return message;
        }
        let mut source = std::error::Error::source(self);
        while let Some(e) = source {
            let text = e.to_string();
            // kube-rs' errors often repeat their source's message in their own; say it once.
            if !text.is_empty() && !message.ends_with(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            source = e.source();
        }
        message
    }

    /// The HTTP status the API server answered with, if it answered.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            Self::Client { source } | Self::Api { source, .. } => match source.as_ref() {
                kube::Error::Api(status) => Some(status.code),
                _ => None,
            },
            _ => None,
        }
    }
}

impl From<KubeError> for DriverError {
    /// Transient per [`KubeError::is_transient`], [`KubeError::code`], and the whole chain as the
    /// message (never a credential: see [`KubeError::message_chain`]).
    fn from(e: KubeError) -> Self {
        let (code, message) = (e.code(), e.message_chain());
        if e.is_transient() {
            DriverError::transient(code, message)
        } else {
            DriverError::permanent(code, message)
        }
    }
}

fn source_is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => matches!(status.code, 408 | 409 | 429) || status.code >= 500,
        // The request did not get an answer: connection refused or reset, TLS, timeouts.
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        // A body that did not parse, a bad proxy setting, an auth plugin, ...: retrying the same
        // request will not help.
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> KubeError {
        let status = kube::core::ErrorResponse {
            status: "Failure".to_owned(),
            message: "m".to_owned(),
            reason: "r".to_owned(),
            code,
        };
        KubeError::api("apply", "Namespace", "pc-x", kube::Error::Api(status))
    }

    #[test]
    fn server_errors_conflicts_and_throttling_are_transient() {
        for code in [409, 429, 500, 503, 504] {
            assert!(api(code).is_transient(), "{code}");
        }
    }

    #[test]
    fn validation_and_authorization_errors_are_permanent() {
        for code in [400, 401, 403, 404, 422] {
            assert!(!api(code).is_transient(), "{code}");
        }
        assert_eq!(api(422).status_code(), Some(422));
    }

    #[test]
    fn message_names_only_its_own_level() {
        assert_eq!(api(500).to_string(), "apply Namespace pc-x");
    }

    #[test]
    fn driver_errors_keep_the_classification_a_code_and_the_chain() {
        let e = DriverError::from(api(503));
        assert!(e.is_transient());
        assert_eq!(e.code, "kube_api_error");
        assert!(e.message.starts_with("apply Namespace pc-x: "), "{}", e.message);
        assert!(e.message.contains('m'), "the API server's message is kept: {}", e.message);

        let e = DriverError::from(api(422));
        assert!(!e.is_transient());

        let e = DriverError::from(KubeError::ForeignNamespace {
            namespace: "pc-x".to_owned(),
            cluster_id: ClusterId::new(),
        });
        assert_eq!((e.code.as_str(), e.is_transient()), ("foreign_namespace", false));
        let e = DriverError::from(KubeError::NamespaceTerminating { namespace: "pc-x".to_owned() });
        assert_eq!((e.code.as_str(), e.is_transient()), ("namespace_terminating", true));
        assert_eq!(e.message, "namespace pc-x is being deleted");
    }

    #[test]
    fn kubeconfig_errors_do_not_quote_the_kubeconfig() {
        let text = "users: [ {name: a, user: {token: SECRET-TOKEN}} ]\nclusters: 12";
        let source = kube::config::Kubeconfig::from_yaml(text).expect_err("malformed");
        let e = DriverError::from(KubeError::TenantKubeconfig { cluster_id: ClusterId::new(), source });
        assert_eq!(e.code, "tenant_kubeconfig_invalid");
        assert!(!e.message.contains("SECRET"), "{}", e.message);
        assert!(!e.is_transient());
    }
}
