//! What bounds a request's cost at the edge: a time limit per request, a limit on the requests in
//! flight, and a rate limit per caller (a token bucket keyed by the JWT subject once verified,
//! else by the agent token's hash once an agents' route has accepted that token, else by the
//! client address: a token nobody vouched for, a bad JWT and a path no route matches all count
//! against their address, so new strings cannot buy new buckets). Refusals
//! are Problems: 429 with `Retry-After` for a caller over its rate, 503 with `Retry-After` when
//! the process is full or a request outlives its time. The header-read timeout, which is the
//! connection's and not a request's, is the server's (`paddock::server`).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request};
use axum::response::{IntoResponse, Response};
use http::header;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use crate::auth::{self, Authn};
use crate::error::ApiError;

/// The edge's limits (`PADDOCK_HTTP_*` and `PADDOCK_RATE_LIMIT_*` settings). The defaults sit far
/// above what `bench/api-load` drives (64 connections, about 20,000 requests a second from one
/// token), so benchmarks run with them on.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest time a request may take, reading its body included.
    pub request_timeout: Duration,
    /// Requests in flight at once in this process; more are refused (503), not queued.
    pub max_in_flight: usize,
    /// Requests per second one caller may sustain.
    pub rate_per_second: u32,
    /// Requests one caller may send at once above its rate.
    pub rate_burst: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(30),
            max_in_flight: 1024,
            rate_per_second: 50_000,
            rate_burst: 100_000,
        }
    }
}

/// Callers tracked before full (idle) buckets are dropped: bounds the memory a stream of new
/// addresses or subjects can take.
const MAX_TRACKED: usize = 10_000;

/// A caller's tokens.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// Refills at `rate` up to `burst` and takes one token; `Err(seconds)` to wait when empty.
    fn take(&mut self, now: Instant, rate: f64, burst: f64) -> Result<(), u64> {
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * rate).min(burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            // Whole seconds until one token is back, at least one.
            Err(((1.0 - self.tokens) / rate).ceil().max(1.0) as u64)
        }
    }

    /// Whether the bucket is full again (its caller idle): dropping it changes nothing.
    fn full(&self, now: Instant, rate: f64, burst: f64) -> bool {
        self.tokens + now.duration_since(self.at).as_secs_f64() * rate >= burst
    }
}

/// Who a request counts against: the verified JWT subject, an agent token (hashed: it is a
/// credential) once known valid, else the client's address (none as in-process tests run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller<'a> {
    Subject(&'a str),
    /// An agent token and the client's address: the token's own bucket once it is vouched for
    /// ([`vouch`]), the address's until then.
    Agent(AgentKey, Option<IpAddr>),
    Address(Option<IpAddr>),
}

/// The hash of an agent token sent to one of the agents' bearer routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AgentKey([u8; 32]);

/// The callers' buckets, one map per kind of caller so that a request's lookup borrows its key
/// (a subject is looked up by `&str`; only a new caller's key is allocated).
#[derive(Debug, Default)]
struct Buckets {
    subjects: HashMap<String, Bucket>,
    /// The agent tokens a route has accepted (only they have buckets of their own).
    agents: HashMap<AgentKey, Bucket>,
    addresses: HashMap<Option<IpAddr>, Bucket>,
}

impl Buckets {
    fn len(&self) -> usize {
        self.subjects.len() + self.agents.len() + self.addresses.len()
    }

    fn retain(&mut self, mut keep: impl FnMut(&Bucket) -> bool) {
        self.subjects.retain(|_, b| keep(b));
        self.agents.retain(|_, b| keep(b));
        self.addresses.retain(|_, b| keep(b));
    }

    /// Takes one of `caller`'s tokens (a new caller starts with a full bucket).
    fn take(&mut self, caller: Caller<'_>, now: Instant, rate: f64, burst: f64) -> Result<(), u64> {
        let full = Bucket { tokens: burst, at: now };
        match caller {
            Caller::Subject(subject) => match self.subjects.get_mut(subject) {
                Some(bucket) => bucket.take(now, rate, burst),
                None => self.subjects.entry(subject.to_owned()).or_insert(full).take(now, rate, burst),
            },
            Caller::Agent(key, ip) => match self.agents.get_mut(&key) {
                Some(bucket) => bucket.take(now, rate, burst),
                None => self.addresses.entry(ip).or_insert(full).take(now, rate, burst),
            },
            Caller::Address(ip) => self.addresses.entry(ip).or_insert(full).take(now, rate, burst),
        }
    }
}

/// The edge's state: the in-flight permits and the callers' buckets.
#[derive(Debug)]
pub struct Edge {
    limits: Limits,
    in_flight: Arc<Semaphore>,
    buckets: Mutex<Buckets>,
}

impl Edge {
    /// The state of `limits`.
    pub fn new(limits: Limits) -> Self {
        Self { limits, in_flight: Arc::new(Semaphore::new(limits.max_in_flight)), buckets: Mutex::default() }
    }

    /// Takes one token of `caller`'s bucket; `Err(seconds)` to wait when it is empty.
    fn take(&self, caller: Caller<'_>) -> Result<(), u64> {
        let (rate, burst) = (f64::from(self.limits.rate_per_second.max(1)), f64::from(self.limits.rate_burst.max(1)));
        let now = Instant::now();
        let Ok(mut buckets) = self.buckets.lock() else { return Ok(()) };
        if buckets.len() >= MAX_TRACKED {
            buckets.retain(|b| !b.full(now, rate, burst));
        }
        buckets.take(caller, now, rate, burst)
    }

    /// Gives the agent token `key` a (full) bucket of its own, if it has none.
    fn vouch(&self, key: AgentKey) {
        let burst = f64::from(self.limits.rate_burst.max(1));
        if let Ok(mut buckets) = self.buckets.lock() {
            buckets.agents.entry(key).or_insert(Bucket { tokens: burst, at: Instant::now() });
        }
    }
}

/// Who `req` counts against.
fn caller(req: &Request) -> Caller<'_> {
    if let Some(Authn::Caller(actor)) = req.extensions().get::<Authn>() {
        return Caller::Subject(&actor.subject);
    }
    let address = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(addr)| addr.ip());
    match agent_key(req) {
        Some(key) => Caller::Agent(key, address),
        None => Caller::Address(address),
    }
}

/// The agent token of a request to one of the agents' bearer routes (`config`, `report`).
pub fn agent_key(req: &Request) -> Option<AgentKey> {
    if !matches!(req.uri().path(), "/v1/agent/config" | "/v1/agent/report") {
        return None;
    }
    match auth::bearer(req.headers().get(header::AUTHORIZATION)) {
        Some(Ok(token)) => Some(AgentKey(Sha256::digest(token.as_bytes()).into())),
        _ => None,
    }
}

/// After an agents' route has answered: a token it accepted (a success) is known valid, and from
/// now on counts against a bucket of its own rather than its client's address (one run's token
/// per machine: many machines behind one address are not limited together once their token is
/// known). A token the route refused never gets a bucket.
pub fn vouch(edge: &Edge, key: AgentKey, response: &Response) {
    if response.status().is_success() {
        edge.vouch(key);
    }
}

/// The caller's rate limit: `Err` with the 429 when the caller is over its rate.
pub fn admit(edge: &Edge, req: &Request) -> Result<(), ApiError> {
    edge.take(caller(req)).map_err(|retry_after| ApiError::RateLimited { retry_after })
}

/// Runs `request` (a request's handling, not yet started) within the process's bound on requests
/// in flight and on each request's time.
pub async fn within_bounds(edge: &Edge, request: impl std::future::Future<Output = Response>) -> Response {
    let Ok(_permit) = edge.in_flight.clone().try_acquire_owned() else {
        return ApiError::Overloaded.into_response();
    };
    match tokio::time::timeout(edge.limits.request_timeout, request).await {
        Ok(response) => response,
        Err(_) => ApiError::TimedOut.into_response(),
    }
}
