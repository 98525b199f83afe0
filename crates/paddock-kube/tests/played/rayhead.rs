//! A STAND-IN for a Ray head's health endpoints (no Ray image can run here): it answers Ray's
//! `success` to `GET /api/gcs_healthz` (the dashboard's port, 8265) and `GET
//! /api/local_raylet_healthz` (the dashboard agent's, 52365), as a Ray head does, and counts the
//! requests, so a test can show paddock's probe reached it through the API server's pod proxy.
//! It proves the probe's path, not Ray: a real Ray head is proven only once a Ray image runs on
//! a real node.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::routing::get;
use tokio::task::JoinHandle;

/// The stand-in; clones share the request count.
#[derive(Clone, Default)]
pub struct StandInHead {
    asked: Arc<AtomicUsize>,
}

impl StandInHead {
    /// How many health requests it answered.
    pub fn asked(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }

    /// Serves on `addr` until the task is aborted.
    pub async fn serve(self, addr: SocketAddr) -> JoinHandle<()> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("binding the Ray head stand-in to {addr}: {e}"));
        let answer = |head: StandInHead| async move {
            head.asked.fetch_add(1, Ordering::SeqCst);
            "success"
        };
        let (a, b) = (self.clone(), self);
        let app = axum::Router::new()
            .route("/api/gcs_healthz", get(move || answer(a.clone())))
            .route("/api/local_raylet_healthz", get(move || answer(b.clone())));
        tokio::spawn(async move { axum::serve(listener, app).await.expect("the Ray head stand-in serves") })
    }
}
