//! Prometheus metrics: requests by route template and status, request latency, and gauges read
//! from the database at scrape time (machines by state, open operations). Kept in the app state
//! rather than a global registry, so several apps in one process (tests) stay apart.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::state::AppState;

/// Upper bounds of the latency histogram, in seconds.
const BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

/// Request counters and latency histograms.
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    latency: Mutex<BTreeMap<(String, String), Histogram>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    fn observe(&self, method: &str, route: &str, status: u16, seconds: f64) {
        if let Ok(mut requests) = self.requests.lock() {
            *requests.entry((method.to_owned(), route.to_owned(), status)).or_default() += 1;
        }
        if let Ok(mut latency) = self.latency.lock() {
            let h = latency.entry((method.to_owned(), route.to_owned())).or_default();
            for (i, bound) in BUCKETS.iter().enumerate() {
                if seconds <= *bound {
                    h.counts[i] += 1;
                }
            }
            h.sum += seconds;
            h.count += 1;
        }
    }

    /// Renders the request metrics in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        out.push_str("# HELP paddock_http_requests_total HTTP requests by route template and status.\n");
        out.push_str("# TYPE paddock_http_requests_total counter\n");
        if let Ok(requests) = self.requests.lock() {
            for ((method, route, status), n) in requests.iter() {
                let _ = writeln!(
                    out,
                    "paddock_http_requests_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP paddock_http_request_duration_seconds HTTP request latency.\n");
        out.push_str("# TYPE paddock_http_request_duration_seconds histogram\n");
        if let Ok(latency) = self.latency.lock() {
            for ((method, route), h) in latency.iter() {
                let labels = format!("method=\"{method}\",route=\"{route}\"");
                for (bound, count) in BUCKETS.iter().zip(h.counts) {
                    let _ = writeln!(
                        out,
                        "paddock_http_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {count}"
                    );
                }
                let _ =
                    writeln!(out, "paddock_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
                let _ = writeln!(out, "paddock_http_request_duration_seconds_sum{{{labels}}} {}", h.sum);
                let _ = writeln!(out, "paddock_http_request_duration_seconds_count{{{labels}}} {}", h.count);
            }
        }
    }
}

/// Middleware: counts and times every request under its route template (never its raw path,
/// which could carry ids or agent tokens).
pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = req.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(req).await;
    state.metrics.observe(&method, &route, response.status().as_u16(), started.elapsed().as_secs_f64());
    response
}
