//! What every handler shares.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use paddock_auth::Verifier;
use paddock_service::Services;

use crate::metrics::Metrics;

/// API settings.
#[derive(Debug, Clone, Default)]
pub struct ApiConfig {
    /// Origins allowed by CORS (the provider's portal); empty disables CORS.
    pub cors_origins: Vec<String>,
}

/// The shared state of the API.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The use-cases.
    pub services: Services,
    /// Bearer token verification.
    pub verifier: Verifier,
    /// Request metrics.
    pub metrics: Arc<Metrics>,
    /// Settings.
    pub config: Arc<ApiConfig>,
    draining: Arc<AtomicBool>,
}

impl AppState {
    /// State for an API process.
    pub fn new(services: Services, verifier: Verifier, config: ApiConfig) -> Self {
        Self {
            services,
            verifier,
            metrics: Arc::new(Metrics::default()),
            config: Arc::new(config),
            draining: Arc::new(AtomicBool::new(false)),
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
