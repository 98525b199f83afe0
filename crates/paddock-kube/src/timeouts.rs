//! The timeouts of every Kubernetes client paddock builds (the platform cluster's and each tenant
//! cluster's), set explicitly rather than left to kube-rs' defaults (a read may wait 295 s
//! there). A tenant is cluster-admin of its own cluster and can make its API server slow: these
//! bound how long one call to it holds a worker slot.

use std::time::Duration;

use http_body_util::Limited;
use kube::client::{ClientBuilder, DynBody};
use kube::{Client, Config};
use tower::util::MapResponseLayer;

/// The largest answer read from a tenant's API server (64 MiB). The tenant decides how large its
/// objects are: a page of 500 Nodes of the 1.5 MiB etcd allows each would be some 750 MiB in the
/// worker's memory.
pub const MAX_TENANT_RESPONSE_BYTES: usize = 64 << 20;

/// A client over `config` that reads at most `max_body` bytes of any answer: past that the call
/// fails (a transient error, like any failed read) instead of buffering what the server sends.
pub fn bounded_client(config: Config, max_body: usize) -> Result<Client, kube::Error> {
    let limit =
        MapResponseLayer::new(move |r: http::Response<Box<DynBody>>| r.map(|body| Limited::new(body, max_body)));
    Ok(ClientBuilder::try_from(config)?.with_layer(&limit).build())
}

/// Connect, read and write timeouts of one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP connect and TLS handshake.
    pub connect: Duration,
    /// Longest wait for the next bytes of an answer. Above the 30 s an admission webhook may hold
    /// a request at most (`timeoutSeconds`), so a slow webhook slows a call but does not fail it;
    /// an API server that stops answering fails it.
    pub read: Duration,
    /// Longest wait to send the next bytes of a request.
    pub write: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self { connect: Duration::from_secs(10), read: Duration::from_secs(45), write: Duration::from_secs(45) }
    }
}

impl Timeouts {
    /// Sets them on `config`.
    pub fn apply(self, config: &mut Config) {
        config.connect_timeout = Some(self.connect);
        config.read_timeout = Some(self.read);
        config.write_timeout = Some(self.write);
    }
}
