//! `KubeError`: failures of the Kubernetes driver, classified transient or permanent.
//!
//! Messages name the object and the verb, never a credential: the kubeconfig's token stays inside
//! kube-rs' `Config`, which no variant holds. kube-rs' own errors (the `#[source]`) carry the API
//! server's `Status` message or the connection failure, neither of which contains the token.

use std::path::PathBuf;

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
            Self::Kubeconfig { .. } | Self::InCluster { .. } | Self::Client { .. } | Self::ForeignNamespace { .. } => {
                false
            }
            // The namespace finishes terminating by itself; ensuring again then recreates it.
            Self::NamespaceTerminating { .. } => true,
            // The reconciler ensures isolation before the control plane; the next run creates it.
            Self::NamespaceMissing { .. } => true,
            Self::Api { source, .. } => source_is_transient(source),
        }
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
}
