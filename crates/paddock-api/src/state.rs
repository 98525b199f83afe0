//! What every handler shares.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use paddock_auth::Verifier;
use paddock_service::Services;

use crate::limits::{Edge, Limits};
use crate::metrics::{Exposition, Metrics, Sources};

/// API settings.
#[derive(Debug, Clone, Default)]
pub struct ApiConfig {
    /// Origins allowed by CORS (the provider's portal); empty disables CORS.
    pub cors_origins: Vec<String>,
    /// The operator console's settings (its sign-in through the provider's OIDC issuer).
    pub console: crate::console::ConsoleConfig,
}

/// The shared state of the API: one `Arc`, because every middleware layer and the handler take
/// their own clone of it on every request (bench/api-load: cloning and dropping the dozen `Arc`s
/// of the parts, each an atomic shared by every core, was 4% of the API's CPU).
#[derive(Clone, Debug)]
pub struct AppState(Arc<Parts>);

/// What the API's state holds; read through [`AppState`] (`state.services`, ...).
#[derive(Clone, Debug)]
pub struct Parts {
    /// The use-cases.
    pub services: Services,
    /// Bearer token verification.
    pub verifier: Verifier,
    /// Request metrics.
    pub metrics: Arc<Metrics>,
    /// The other parts' metrics, added to every scrape.
    pub metric_sources: Sources,
    /// Whether the API listener serves `/metrics` (not when `PADDOCK_METRICS_LISTEN` gives them a
    /// listener of their own).
    pub metrics_here: bool,
    /// Whether the API listener serves the agents' routes (not when `PADDOCK_AGENT_LISTEN` gives
    /// them a listener of their own, [`crate::agent_router`]).
    pub agents_here: bool,
    /// Settings.
    pub config: Arc<ApiConfig>,
    /// The edge's limits and their state (`limits`).
    pub edge: Arc<Edge>,
    draining: Arc<AtomicBool>,
}

impl std::ops::Deref for AppState {
    type Target = Parts;

    fn deref(&self) -> &Parts {
        &self.0
    }
}

impl AppState {
    /// State for an API process.
    pub fn new(services: Services, verifier: Verifier, config: ApiConfig) -> Self {
        Self(Arc::new(Parts {
            services,
            verifier,
            metrics: Arc::new(Metrics::default()),
            metric_sources: Sources::default(),
            metrics_here: true,
            agents_here: true,
            config: Arc::new(config),
            edge: Arc::new(Edge::new(Limits::default())),
            draining: Arc::new(AtomicBool::new(false)),
        }))
    }

    /// Adds the other parts' metrics to every scrape; `served_here: false` when they have a
    /// listener of their own ([`crate::metrics::metrics_router`] over [`AppState::exposition`]),
    /// and then the API's `/metrics` answers 404.
    pub fn with_metrics(mut self, sources: Sources, served_here: bool) -> Self {
        let parts = Arc::make_mut(&mut self.0);
        parts.metric_sources = sources;
        parts.metrics_here = served_here;
        self
    }

    /// `served_here: false` when the agents' routes have a listener of their own
    /// ([`crate::agent_router`] over this state): the API's router then answers 404 for them.
    pub fn with_agent_routes(mut self, served_here: bool) -> Self {
        Arc::make_mut(&mut self.0).agents_here = served_here;
        self
    }

    /// Replaces the default limits (`limits`).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        Arc::make_mut(&mut self.0).edge = Arc::new(Edge::new(limits));
        self
    }

    /// What a scrape renders: this API's request metrics, the gauges, the other parts'.
    pub fn exposition(&self) -> Exposition {
        Exposition {
            http: Some(self.metrics.clone()),
            services: self.services.clone(),
            sources: self.metric_sources.clone(),
        }
    }

    /// Marks the process as draining: `/readyz` answers 503 so load balancers stop sending.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether the process is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}
