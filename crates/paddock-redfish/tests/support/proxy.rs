//! TEST-ONLY fault-injecting HTTP proxy in front of the REAL emulator.
//!
//! Every request is forwarded to the emulator unless a rule answers it; the faults are what real
//! BMCs do and sushy-tools does not: bursts of 503 with `Retry-After`, stalls, `202 Accepted`
//! with a task monitor, a silently dropped action, 501 for an action, resources that look
//! different (a JSON rewrite). It also counts requests in flight, per system and in total, which
//! is how the concurrency bounds are observed from the BMC's side.
//!
//! It is not a mock: without rules it is a transparent relay, and every state change still
//! happens in the emulator.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use axum::Router;
use paddock_redfish::Url;
use serde_json::{json, Value};

/// Where task monitors live on the proxy.
const TASK_PREFIX: &str = "/redfish/v1/TaskService/TaskMonitors/";

/// What the proxy does to a matching request.
#[derive(Clone)]
pub enum Fault {
    /// Answer this status without forwarding, with `Retry-After` if given.
    Status { status: u16, retry_after: Option<String> },
    /// Wait this long, then forward.
    Stall(Duration),
    /// Forward, then answer `202` with a task monitor that reports `Running` `polls` times and
    /// then relays the emulator's answer (or reports `Exception` when `fail` is set).
    Accepted { polls: usize, fail: Option<String> },
    /// Answer `204` without forwarding: an action the BMC accepts and then loses.
    Drop,
    /// Answer `200` with a JSON body that never ends (whitespace, chunked, no `Content-Length`),
    /// without forwarding: a broken or hostile BMC.
    Endless,
    /// Forward, then edit the JSON body of a successful answer.
    Rewrite(Arc<dyn Fn(&mut Value) + Send + Sync>),
    /// Answer this status, `Location` (if given) and JSON body (none when `Null`) without
    /// forwarding: a real BMC's answer replayed, for what the emulator cannot do at all.
    Replay { status: u16, location: Option<String>, body: Value },
}

/// Which requests a rule applies to, and how many times.
#[derive(Clone)]
pub struct Rule {
    method: Option<Method>,
    path: String,
    exact: bool,
    times: Option<usize>,
    fault: Fault,
}

impl Rule {
    /// Requests to exactly `path` (any method when `None`), every time.
    pub fn exact(method: Option<Method>, path: &str, fault: Fault) -> Rule {
        Rule { method, path: path.to_owned(), exact: true, times: None, fault }
    }

    /// Requests whose path contains `needle`, every time.
    pub fn containing(method: Option<Method>, needle: &str, fault: Fault) -> Rule {
        Rule { method, path: needle.to_owned(), exact: false, times: None, fault }
    }

    /// Only the next `n` matching requests.
    pub fn times(mut self, n: usize) -> Rule {
        self.times = Some(n);
        self
    }

    fn matches(&self, method: &Method, path: &str) -> bool {
        self.method.as_ref().is_none_or(|m| m == method)
            && if self.exact { path == self.path } else { path.contains(&self.path) }
            && self.times != Some(0)
    }
}

/// One request as the proxy saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub at: Instant,
    /// The status the client got.
    pub status: u16,
    /// The request's body, when it was JSON.
    pub body: Option<Value>,
}

#[derive(Default)]
struct InFlight {
    per_system: HashMap<String, (usize, usize)>,
    total: (usize, usize),
}

struct Task {
    polls_left: usize,
    fail: Option<String>,
    status: StatusCode,
    body: Vec<u8>,
}

struct Shared {
    upstream: Url,
    http: reqwest::Client,
    rules: Mutex<Vec<Rule>>,
    seen: Mutex<Vec<Seen>>,
    in_flight: Mutex<InFlight>,
    tasks: Mutex<HashMap<u64, Task>>,
    next_task: AtomicU64,
    delay: Mutex<Duration>,
}

/// A running proxy; it stops with the test's runtime.
pub struct FaultProxy {
    pub url: Url,
    shared: Arc<Shared>,
}

impl FaultProxy {
    /// Starts a proxy on 127.0.0.1 in front of `upstream`.
    pub async fn start(upstream: &Url) -> FaultProxy {
        let shared = Arc::new(Shared {
            upstream: upstream.clone(),
            // Redirects are the client's business: relay them as they are.
            http: reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("proxy client"),
            rules: Mutex::new(Vec::new()),
            seen: Mutex::new(Vec::new()),
            in_flight: Mutex::new(InFlight::default()),
            tasks: Mutex::new(HashMap::new()),
            next_task: AtomicU64::new(1),
            delay: Mutex::new(Duration::ZERO),
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FaultProxy { url: Url::parse(&format!("http://{addr}/")).expect("url"), shared }
    }

    /// Adds a rule (rules are tried in the order added).
    pub fn rule(&self, rule: Rule) -> &Self {
        self.shared.rules.lock().expect("rules").push(rule);
        self
    }

    /// Delays every forwarded request, so that overlapping calls become visible.
    pub fn delay_all(&self, delay: Duration) {
        *self.shared.delay.lock().expect("delay") = delay;
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().expect("seen").clone()
    }

    /// Requests so far with this method whose path contains `needle`.
    pub fn count(&self, method: &Method, needle: &str) -> usize {
        self.seen().iter().filter(|s| s.method == *method && s.path.contains(needle)).count()
    }

    /// Requests that could change state (anything but GET).
    pub fn changes(&self) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.method != Method::GET).collect()
    }

    /// The most requests ever in flight at once for one system (by the id after `Systems/` or
    /// `Managers/`; the emulator names a system's manager after the system).
    pub fn max_in_flight_for(&self, system: &str) -> usize {
        self.shared.in_flight.lock().expect("in flight").per_system.get(system).map_or(0, |c| c.1)
    }

    /// The most requests ever in flight at once, all systems together.
    pub fn max_in_flight_total(&self) -> usize {
        self.shared.in_flight.lock().expect("in flight").total.1
    }
}

/// The system a path belongs to, if any.
fn system_of(path: &str) -> Option<String> {
    let rest = path.split_once("/Systems/").or_else(|| path.split_once("/Managers/"))?.1;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then(|| id.to_owned())
}

/// Counts a request in flight for as long as it lives (also when the client gives up on it).
struct Counted {
    shared: Arc<Shared>,
    system: Option<String>,
}

impl Counted {
    fn new(shared: &Arc<Shared>, path: &str) -> Counted {
        let system = system_of(path);
        let mut f = shared.in_flight.lock().expect("in flight");
        f.total.0 += 1;
        f.total.1 = f.total.1.max(f.total.0);
        if let Some(s) = &system {
            let c = f.per_system.entry(s.clone()).or_default();
            c.0 += 1;
            c.1 = c.1.max(c.0);
        }
        drop(f);
        Counted { shared: shared.clone(), system }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut f = self.shared.in_flight.lock().expect("in flight");
        f.total.0 -= 1;
        if let Some(s) = &self.system {
            if let Some(c) = f.per_system.get_mut(s) {
                c.0 -= 1;
            }
        }
    }
}

fn reply(status: StatusCode, headers: &[(&str, String)], body: Vec<u8>) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    for (name, value) in headers {
        response.headers_mut().insert(
            axum::http::HeaderName::from_bytes(name.as_bytes()).expect("header name"),
            HeaderValue::from_str(value).expect("header value"),
        );
    }
    response
}

fn task_body(state: &str, message: Option<&str>) -> Vec<u8> {
    let messages: Vec<Value> = message.map(|m| json!({ "Message": m })).into_iter().collect();
    serde_json::to_vec(&json!({
        "@odata.type": "#Task.v1_4_3.Task",
        "Id": "1",
        "TaskState": state,
        "TaskStatus": if state == "Exception" { "Critical" } else { "OK" },
        "Messages": messages,
    }))
    .expect("json")
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let method = parts.method.clone();
    let path = parts.uri.path().to_owned();
    let path_and_query = parts.uri.path_and_query().map_or(path.clone(), |p| p.as_str().to_owned());
    let _counted = Counted::new(&shared, &path);
    let body = axum::body::to_bytes(body, 16 << 20).await.expect("request body");
    let json = serde_json::from_slice(&body).ok();
    let response = respond(&shared, &method, &path, &path_and_query, &parts.headers, body).await;
    shared.seen.lock().expect("seen").push(Seen {
        method,
        path,
        at: Instant::now(),
        status: response.status().as_u16(),
        body: json,
    });
    response
}

async fn respond(
    shared: &Arc<Shared>,
    method: &Method,
    path: &str,
    path_and_query: &str,
    headers: &HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    // Task monitors are the proxy's own resources.
    if let Some(id) = path.strip_prefix(TASK_PREFIX).and_then(|id| id.parse::<u64>().ok()) {
        let mut tasks = shared.tasks.lock().expect("tasks");
        let Some(task) = tasks.get_mut(&id) else {
            return reply(StatusCode::NOT_FOUND, &[], Vec::new());
        };
        if task.polls_left > 0 {
            task.polls_left -= 1;
            return reply(
                StatusCode::ACCEPTED,
                &[("content-type", "application/json".into())],
                task_body("Running", None),
            );
        }
        return match &task.fail {
            Some(message) => reply(
                StatusCode::OK,
                &[("content-type", "application/json".into())],
                task_body("Exception", Some(message)),
            ),
            None => reply(task.status, &[("content-type", "application/json".into())], task.body.clone()),
        };
    }

    let fault = {
        let mut rules = shared.rules.lock().expect("rules");
        rules.iter_mut().find(|r| r.matches(method, path)).map(|r| {
            if let Some(n) = &mut r.times {
                *n -= 1;
            }
            r.fault.clone()
        })
    };
    match &fault {
        Some(Fault::Status { status, retry_after }) => {
            let headers: Vec<(&str, String)> = retry_after.iter().map(|r| ("retry-after", r.clone())).collect();
            let body = serde_json::to_vec(
                &json!({"error": {"code": "Base.1.0.GeneralError", "message": "injected by the test proxy"}}),
            )
            .expect("json");
            return reply(StatusCode::from_u16(*status).expect("status"), &headers, body);
        }
        Some(Fault::Drop) => return reply(StatusCode::NO_CONTENT, &[], Vec::new()),
        Some(Fault::Replay { status, location, body }) => {
            let mut headers = vec![("content-type", "application/json".to_owned())];
            headers.extend(location.iter().map(|l| ("location", l.clone())));
            let body = if body.is_null() { Vec::new() } else { serde_json::to_vec(body).expect("json") };
            return reply(StatusCode::from_u16(*status).expect("status"), &headers, body);
        }
        Some(Fault::Endless) => {
            let spaces = axum::body::Bytes::from_static(&[b' '; 64 * 1024]);
            let endless = futures::stream::repeat_with(move || Ok::<_, std::io::Error>(spaces.clone()));
            let mut response = Response::new(Body::from_stream(endless));
            response.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
            return response;
        }
        Some(Fault::Stall(d)) => tokio::time::sleep(*d).await,
        _ => {}
    }
    let delay = *shared.delay.lock().expect("delay");
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }

    // Forward to the emulator.
    let url = shared.upstream.join(path_and_query).expect("upstream url");
    let mut forward = shared.http.request(method.clone(), url).body(body.to_vec());
    for (name, value) in headers {
        if name != "host" && name != "content-length" {
            forward = forward.header(name, value);
        }
    }
    let upstream = match forward.send().await {
        Ok(r) => r,
        Err(e) => return reply(StatusCode::BAD_GATEWAY, &[], e.to_string().into_bytes()),
    };
    let status = upstream.status();
    let mut out_headers: Vec<(&str, String)> = Vec::new();
    for name in ["content-type", "location", "www-authenticate", "retry-after", "etag"] {
        if let Some(v) = upstream.headers().get(name).and_then(|v| v.to_str().ok()) {
            out_headers.push((name, v.to_owned()));
        }
    }
    let mut bytes = upstream.bytes().await.map(|b| b.to_vec()).unwrap_or_default();

    match fault {
        Some(Fault::Rewrite(edit)) if status.is_success() => {
            if let Ok(mut value) = serde_json::from_slice::<Value>(&bytes) {
                edit(&mut value);
                bytes = serde_json::to_vec(&value).expect("json");
            }
            reply(status, &out_headers, bytes)
        }
        Some(Fault::Accepted { polls, fail }) if status.is_success() => {
            let id = shared.next_task.fetch_add(1, Ordering::SeqCst);
            shared.tasks.lock().expect("tasks").insert(id, Task { polls_left: polls, fail, status, body: bytes });
            reply(
                StatusCode::ACCEPTED,
                &[("location", format!("{TASK_PREFIX}{id}")), ("content-type", "application/json".into())],
                task_body("New", None),
            )
        }
        _ => reply(status, &out_headers, bytes),
    }
}
