//! Prometheus metrics: requests by route template and status, request latency, gauges read from
//! the database at scrape time (machines by state, queue depth), and what the process's other
//! parts add ([`MetricsSource`]: the worker's job outcomes). Kept in the app state rather than a
//! global registry, so several apps in one process (tests) stay apart.
//!
//! They are served on the API listener's `/metrics`, or, with `PADDOCK_METRICS_LISTEN`, on a
//! listener of their own ([`metrics_router`]; the only listener of a `paddock worker`), and then
//! no longer on the API's.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http::{header, HeaderValue, StatusCode};
use paddock_service::Services;

/// Something else in the process that has metrics to add to every scrape, rendered in the
/// Prometheus text format with bounded label sets (the worker's job outcome counters).
pub type MetricsSource = Arc<dyn Fn(&mut String) + Send + Sync>;

/// The [`MetricsSource`]s of a process.
#[derive(Clone, Default)]
pub struct Sources(pub Arc<[MetricsSource]>);

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sources({})", self.0.len())
    }
}

/// Everything one scrape renders.
#[derive(Clone, Debug)]
pub struct Exposition {
    /// The API's request metrics, when this process serves the API.
    pub http: Option<Arc<Metrics>>,
    /// The database gauges.
    pub services: Services,
    /// The other parts' metrics.
    pub sources: Sources,
}

impl Exposition {
    /// The scrape's response: the text format, with its content type.
    pub async fn response(&self) -> Response {
        let mut out = String::new();
        out.push_str("# HELP paddock_build_info The running build: always 1, its version a label.\n");
        out.push_str("# TYPE paddock_build_info gauge\n");
        let _ = writeln!(out, "paddock_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
        if let Some(http) = &self.http {
            http.render(&mut out);
        }
        self.services.render_gauges(&mut out).await;
        for source in self.sources.0.iter() {
            source(&mut out);
        }
        let mut response = (StatusCode::OK, out).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
        response
    }
}

/// The router of a metrics-only listener (`PADDOCK_METRICS_LISTEN`): `GET /metrics`, nothing else.
pub fn metrics_router(exposition: Exposition) -> Router {
    Router::new()
        .route("/metrics", get(|State(e): State<Exposition>| async move { e.response().await }))
        .with_state(exposition)
}

/// Upper bounds of the latency histogram, in seconds.
const BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

/// One method's requests on one route: counts by status, and the latency histogram.
#[derive(Default)]
struct Series {
    statuses: BTreeMap<u16, u64>,
    latency: Histogram,
}

/// Request counters and latency histograms, by route template and then method: one lock per
/// request, and a known route is found by its `&str` (no key allocated per request).
#[derive(Default)]
pub struct Metrics {
    routes: Mutex<HashMap<Arc<str>, BTreeMap<&'static str, Series>>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    fn observe(&self, method: &'static str, route: &str, status: u16, seconds: f64) {
        let Ok(mut routes) = self.routes.lock() else { return };
        let methods = match routes.get_mut(route) {
            Some(methods) => methods,
            None => routes.entry(Arc::from(route)).or_default(),
        };
        let series = methods.entry(method).or_default();
        *series.statuses.entry(status).or_default() += 1;
        let h = &mut series.latency;
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                h.counts[i] += 1;
            }
        }
        h.sum += seconds;
        h.count += 1;
    }

    /// Renders the request metrics in the Prometheus text format, ordered by method, route and
    /// status.
    pub fn render(&self, out: &mut String) {
        let Ok(routes) = self.routes.lock() else { return };
        let mut series: Vec<(&str, &str, &Series)> = routes
            .iter()
            .flat_map(|(route, methods)| methods.iter().map(move |(method, s)| (*method, &**route, s)))
            .collect();
        series.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        out.push_str("# HELP paddock_http_requests_total HTTP requests by route template and status.\n");
        out.push_str("# TYPE paddock_http_requests_total counter\n");
        for (method, route, s) in &series {
            for (status, n) in &s.statuses {
                let _ = writeln!(
                    out,
                    "paddock_http_requests_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP paddock_http_request_duration_seconds HTTP request latency.\n");
        out.push_str("# TYPE paddock_http_request_duration_seconds histogram\n");
        for (method, route, s) in &series {
            let h = &s.latency;
            let labels = format!("method=\"{method}\",route=\"{route}\"");
            for (bound, count) in BUCKETS.iter().zip(h.counts) {
                let _ =
                    writeln!(out, "paddock_http_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {count}");
            }
            let _ = writeln!(out, "paddock_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
            let _ = writeln!(out, "paddock_http_request_duration_seconds_sum{{{labels}}} {}", h.sum);
            let _ = writeln!(out, "paddock_http_request_duration_seconds_count{{{labels}}} {}", h.count);
        }
    }
}

/// The `method` label: the methods of HTTP itself, anything else `other`, so a client sending
/// made-up methods cannot grow the series without bound.
fn method_label(method: &http::Method) -> &'static str {
    use http::Method;
    const KNOWN: [(Method, &str); 9] = [
        (Method::GET, "GET"),
        (Method::HEAD, "HEAD"),
        (Method::POST, "POST"),
        (Method::PUT, "PUT"),
        (Method::PATCH, "PATCH"),
        (Method::DELETE, "DELETE"),
        (Method::OPTIONS, "OPTIONS"),
        (Method::TRACE, "TRACE"),
        (Method::CONNECT, "CONNECT"),
    ];
    KNOWN.iter().find(|(m, _)| m == method).map_or("other", |(_, label)| label)
}

/// Runs `handle` on `req`, counting and timing its answer under its route template (never its raw
/// path, which could carry ids or agent tokens).
pub async fn tracked(metrics: &Metrics, req: Request, handle: impl AsyncFnOnce(Request) -> Response) -> Response {
    // `MatchedPath` holds an `Arc<str>`: cloning it allocates nothing.
    let route = req.extensions().get::<MatchedPath>().cloned();
    let method = method_label(req.method());
    let started = Instant::now();
    let response = handle(req).await;
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    metrics.observe(method, route, response.status().as_u16(), started.elapsed().as_secs_f64());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_up_methods_share_one_label() {
        assert_eq!(method_label(&http::Method::PATCH), "PATCH");
        for raw in ["BREW", "PROPFIND", "get", "X-RANDOM-1"] {
            let method = http::Method::from_bytes(raw.as_bytes()).expect("a token");
            assert_eq!(method_label(&method), "other", "{raw}");
        }
    }
}
