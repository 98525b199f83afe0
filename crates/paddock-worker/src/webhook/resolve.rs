//! The lookup behind webhook connections: every address a host name resolves to is checked
//! against the address guard at connect time, so a name that resolved to a public address at
//! validation cannot be rebound to a private one later (no DNS rebinding).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use futures::future::BoxFuture;
use paddock_domain::webhook::AddressGuard;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Resolves host names (the system's resolver, or a stub in tests).
pub trait Lookup: Send + Sync + 'static {
    /// The addresses of `host`.
    fn lookup<'a>(&'a self, host: &'a str) -> BoxFuture<'a, std::io::Result<Vec<IpAddr>>>;
}

/// The system's resolver.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup<'a>(&'a self, host: &'a str) -> BoxFuture<'a, std::io::Result<Vec<IpAddr>>> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, 0)).await?.map(|a| a.ip()).collect()) })
    }
}

/// Why a host was not connected to.
#[derive(Debug, thiserror::Error)]
#[error("{host} resolves only to addresses webhooks may not go to ({addresses})")]
pub struct Refused {
    host: String,
    addresses: String,
}

/// A resolver for reqwest that drops every address the guard refuses; a host left with none is
/// an error.
pub struct GuardedResolver {
    lookup: Arc<dyn Lookup>,
    guard: Arc<AddressGuard>,
}

impl GuardedResolver {
    /// Over `lookup`, keeping what `guard` allows.
    pub fn new(lookup: Arc<dyn Lookup>, guard: Arc<AddressGuard>) -> Self {
        Self { lookup, guard }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let (lookup, guard) = (self.lookup.clone(), self.guard.clone());
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found = lookup.lookup(&host).await?;
            let allowed: Vec<SocketAddr> =
                found.iter().filter(|ip| guard.allows(**ip)).map(|ip| SocketAddr::new(*ip, 0)).collect();
            if allowed.is_empty() {
                let addresses = found.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
                return Err(Box::new(Refused { host, addresses }) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}
