//! STAND-IN for slurmrestd (where a test says why it is not the real one): the `v0.0.44` endpoints
//! that slurm-client v1.2.1 calls for the operator (nodes, reservations, jobs), answering only
//! tokens signed with the JWT key paddock wrote (HS256, `sun` = `slurm`, `exp` required), and
//! `v0.0.42`'s ping, node list and node read/update for paddock's own probe (its drain, and its
//! read of the nodes' drain reasons), and job and node lists (the demand of elastic pools). No
//! `slurmdb` endpoints: paddock's accounting writes are tested against a real slurmdbd. Its
//! Slurm nodes are the slurmd pods the played
//! kubelet started ([`StandInRestd::register`], as `slurmd -Z --conf ...` registers a dynamic
//! node with slurmctld); updates (comment, DRAIN/UNDRAIN with their reason, as slurmctld keeps a
//! reason until the node resumes) are kept and readable by the test, each in the order it came
//! ([`StandInRestd::updates`]). A test can play a job on a node ([`StandInRestd::set_job`]:
//! ALLOCATED instead of IDLE), so that a DRAIN waits for it as slurmctld's does, and submit jobs
//! that wait in a partition ([`StandInRestd::submit`]: PENDING, as `sbatch` leaves a job no node
//! can take yet). The v0.0.42 lists answer the shapes of Slurm's OpenAPI for v0.0.42
//! (`v0.0.42_openapi_job_info_resp`, `v0.0.42_openapi_nodes_resp`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Json;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

/// A Slurm node as the stand-in holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlurmNode {
    /// Its `Features` (from slurmd's `--conf`).
    pub features: Vec<String>,
    /// Its `Gres` (from slurmd's `--conf`), empty without.
    pub gres: String,
    /// The comment the operator writes (its pod info).
    pub comment: String,
    /// State flags (`IDLE` or `ALLOCATED`, `DRAIN`).
    pub state: Vec<String>,
    /// The reason of its DRAIN (empty without).
    pub reason: String,
}

/// A job as the stand-in holds it: what `sbatch` asked for, and where slurmctld has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlayedJob {
    /// Its id.
    pub id: u64,
    /// Its partition(s), comma-separated.
    pub partition: String,
    /// `PENDING` or `RUNNING`.
    pub state: String,
    /// Why it waits (`Resources`, `Dependency`, ...; `None` once running).
    pub reason: String,
    /// Nodes asked for (`-N`).
    pub nodes: u32,
    /// CPUs asked for (`-n` times `-c`).
    pub cpus: u32,
}

/// One node update the stand-in took, as it left the node.
#[derive(Debug, Clone)]
pub struct Update {
    /// When.
    pub at: std::time::Instant,
    /// The Slurm node.
    pub node: String,
    /// The REST version it came through (`v0.0.42`: paddock; `v0.0.44`: the operator).
    pub version: String,
    /// The node after it.
    pub after: SlurmNode,
}

#[derive(Default)]
struct Inner {
    /// The JWT key; empty (every request refused) until [`StandInRestd::set_key`].
    key: Mutex<Vec<u8>>,
    nodes: Mutex<BTreeMap<String, SlurmNode>>,
    jobs: Mutex<Vec<PlayedJob>>,
    /// `METHOD path` of every authorized request.
    seen: Mutex<BTreeSet<String>>,
    /// The same, in the order they came, with when.
    log: Mutex<Vec<(std::time::Instant, String)>>,
    /// Every node update, in order.
    updates: Mutex<Vec<Update>>,
    denied: AtomicUsize,
}

/// The stand-in; clones share its state.
#[derive(Clone)]
pub struct StandInRestd(Arc<Inner>);

type Answer = (StatusCode, Json<Value>);

fn openapi(body: Value) -> Answer {
    let mut body = body;
    body["errors"] = json!([]);
    body["warnings"] = json!([]);
    body["meta"] = json!({ "plugin": { "type": "openapi/slurmctld", "name": "Slurm OpenAPI slurmctld" } });
    (StatusCode::OK, Json(body))
}

fn not_found(what: &str) -> Answer {
    (StatusCode::NOT_FOUND, Json(json!({ "errors": [{ "error": format!("{what} not found") }], "warnings": [] })))
}

fn node_json(name: &str, node: &SlurmNode) -> Value {
    let busy = node.state.iter().any(|s| s == "ALLOCATED");
    json!({
        "name": name, "hostname": name, "address": name, "state": node.state, "features": node.features,
        "active_features": node.features, "gres": node.gres, "comment": node.comment, "reason": node.reason,
        // A NodeSet's partition is named after it.
        "partitions": node.features, "architecture": "x86_64", "operating_system": "Linux",
        "cpus": 16, "alloc_cpus": if busy { 16 } else { 0 }, "alloc_idle_cpus": if busy { 0 } else { 16 },
        "real_memory": 65536, "alloc_memory": 0, "port": 6818, "weight": 1, "version": "25.11.4",
        "slurmd_start_time": no_val(1_765_000_000), "last_busy": no_val(1_765_000_000),
    })
}

/// A `v0.0.42_uint32_no_val_struct` (or `..._uint64_...`) holding `n`.
fn no_val(n: u64) -> Value {
    json!({ "set": true, "infinite": false, "number": n })
}

/// A job as `GET /slurm/v0.0.42/jobs/` lists it (`v0.0.42_job_info`: the fields slurmctld fills
/// for a batch job; unset numbers are `set: false`).
fn job_json(job: &PlayedJob) -> Value {
    let unset = json!({ "set": false, "infinite": false, "number": 0 });
    json!({
        "account": "root", "batch_flag": true, "cluster": "slurm", "command": "/root/job.sh",
        "current_working_directory": "/root", "job_id": job.id, "name": format!("job-{}", job.id),
        "partition": job.partition, "job_state": [job.state], "state_reason": job.reason,
        "state_description": "", "hold": false, "node_count": no_val(u64::from(job.nodes)),
        "cpus": no_val(u64::from(job.cpus)), "tasks": no_val(u64::from(job.cpus)),
        "cpus_per_task": no_val(1), "memory_per_node": unset, "memory_per_cpu": no_val(1024),
        "minimum_cpus_per_node": no_val(1), "priority": no_val(4_294_901_759), "qos": "normal",
        "shared": [], "tres_per_node": "", "tres_req_str": format!("cpu={},node={}", job.cpus, job.nodes),
        "nodes": "", "time_limit": unset, "submit_time": no_val(1_765_000_000), "user_name": "root", "user_id": 0,
        "group_name": "root", "group_id": 0, "exit_code": { "status": ["PENDING"], "return_code": unset },
    })
}

impl StandInRestd {
    /// A stand-in accepting tokens signed with `key` (the JWT key's bytes).
    pub fn new(key: Vec<u8>) -> Self {
        Self(Arc::new(Inner { key: Mutex::new(key), ..Inner::default() }))
    }

    /// Accepts tokens signed with `key` from now on (when the key is known only later).
    pub fn set_key(&self, key: Vec<u8>) {
        *self.0.key.lock().expect("lock") = key;
    }

    /// slurmd of pod `name` started with `args`: registers its dynamic node (`--conf` gives its
    /// Features and Gres), once.
    pub fn register(&self, name: &str, args: &[String]) {
        let mut nodes = self.0.nodes.lock().expect("lock");
        if nodes.contains_key(name) {
            return;
        }
        // The operator quotes the value for slurmd's entrypoint: `--conf 'Features=gpu Gres=gpu:4'`.
        let conf = args.iter().skip_while(|a| *a != "--conf").nth(1).cloned().unwrap_or_default();
        let conf = conf.trim_matches('\'');
        let mut node = SlurmNode { state: vec!["IDLE".to_owned()], ..SlurmNode::default() };
        for item in conf.split_whitespace() {
            match item.split_once('=') {
                Some(("Features", v)) => node.features = v.split(',').map(str::to_owned).collect(),
                Some(("Gres", v)) => node.gres = v.to_owned(),
                _ => {}
            }
        }
        nodes.insert(name.to_owned(), node);
    }

    /// PLAYS THE OPERATOR writing a Slurm node its pod's information (`nodeSetName`, `node`).
    pub fn set_comment(&self, name: &str, comment: &str) {
        if let Some(node) = self.0.nodes.lock().expect("lock").get_mut(name) {
            node.comment = comment.to_owned();
        }
    }

    /// PLAYS `sbatch -p <partition> -N <nodes> -n <cpus>` that no node can take yet: a PENDING job
    /// waiting for resources. Returns its id.
    pub fn submit(&self, partition: &str, nodes: u32, cpus: u32) -> u64 {
        let mut jobs = self.0.jobs.lock().expect("lock");
        let id = 1000 + jobs.len() as u64;
        let state = "PENDING".to_owned();
        jobs.push(PlayedJob {
            id,
            partition: partition.to_owned(),
            state,
            reason: "Resources".to_owned(),
            nodes,
            cpus,
        });
        id
    }

    /// PLAYS slurmctld moving job `id` on: `RUNNING` (reason `None`), or gone once it ended.
    pub fn set_job_state(&self, id: u64, state: Option<&str>) {
        let mut jobs = self.0.jobs.lock().expect("lock");
        match state {
            Some(state) => jobs.iter_mut().filter(|j| j.id == id).for_each(|j| {
                j.state = state.to_owned();
                j.reason = if state == "PENDING" { "Resources" } else { "None" }.to_owned();
            }),
            None => jobs.retain(|j| j.id != id),
        }
    }

    /// PLAYS A JOB on Slurm node `name`: running (ALLOCATED) or ended (IDLE).
    pub fn set_job(&self, name: &str, running: bool) {
        let mut nodes = self.0.nodes.lock().expect("lock");
        let Some(node) = nodes.get_mut(name) else { return };
        node.state.retain(|s| s != "IDLE" && s != "ALLOCATED");
        node.state.insert(0, if running { "ALLOCATED" } else { "IDLE" }.to_owned());
    }

    /// PLAYS THE TENANT'S ADMIN: `scontrol update nodename=<name> state=drain reason=<reason>`.
    pub fn drain(&self, name: &str, reason: &str) {
        let mut nodes = self.0.nodes.lock().expect("lock");
        let Some(node) = nodes.get_mut(name) else { return };
        if !node.state.iter().any(|s| s == "DRAIN") {
            node.state.push("DRAIN".to_owned());
        }
        node.reason = reason.to_owned();
    }

    /// Every node update so far, in order.
    pub fn updates(&self) -> Vec<Update> {
        self.0.updates.lock().expect("lock").clone()
    }

    /// The Slurm nodes.
    pub fn nodes(&self) -> BTreeMap<String, SlurmNode> {
        self.0.nodes.lock().expect("lock").clone()
    }

    /// `METHOD path` of every authorized request so far.
    pub fn seen(&self) -> BTreeSet<String> {
        self.0.seen.lock().expect("lock").clone()
    }

    /// `METHOD path` of every authorized request so far, in order, with when it came.
    pub fn log(&self) -> Vec<(std::time::Instant, String)> {
        self.0.log.lock().expect("lock").clone()
    }

    /// How many requests were refused (no token, or a token of another key).
    pub fn denied(&self) -> usize {
        self.0.denied.load(Ordering::SeqCst)
    }

    fn authorize(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> bool {
        let token = headers.get("X-SLURM-USER-TOKEN").and_then(|v| v.to_str().ok()).unwrap_or_default();
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
        validation.set_required_spec_claims(&["exp"]);
        let key = jsonwebtoken::DecodingKey::from_secret(&self.0.key.lock().expect("lock"));
        let ok = jsonwebtoken::decode::<Value>(token, &key, &validation).is_ok_and(|t| t.claims["sun"] == "slurm");
        if ok {
            let request = format!("{method} {}", uri.path());
            self.0.log.lock().expect("lock").push((std::time::Instant::now(), request.clone()));
            self.0.seen.lock().expect("lock").insert(request);
        } else {
            self.0.denied.fetch_add(1, Ordering::SeqCst);
            eprintln!("slurmrestd stand-in: refused {method} {uri} (no token or another key)");
        }
        ok
    }

    /// Serves on `addr` until the test ends.
    pub async fn serve(self, addr: SocketAddr) -> JoinHandle<()> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("binding the slurmrestd stand-in to {addr}: {e}"));
        self.serve_on(listener)
    }

    /// Serves on `listener` until the test ends (a free port of the test's choosing).
    pub fn serve_on(self, listener: tokio::net::TcpListener) -> JoinHandle<()> {
        let app = router(self);
        tokio::spawn(async move { axum::serve(listener, app).await.expect("the slurmrestd stand-in serves") })
    }
}

const UNAUTHORIZED: (StatusCode, Json<Value>) = (StatusCode::UNAUTHORIZED, Json(Value::Null));

/// Every endpoint wants a JWT of the cluster's key (as slurmrestd with auth/jwt does).
async fn authorized(State(r): State<StandInRestd>, request: Request, next: Next) -> Response {
    if !r.authorize(request.method(), request.uri(), request.headers()) {
        return UNAUTHORIZED.into_response();
    }
    next.run(request).await
}

async fn nodes(State(r): State<StandInRestd>) -> Answer {
    let nodes: Vec<Value> = r.nodes().iter().map(|(name, n)| node_json(name, n)).collect();
    openapi(json!({ "nodes": nodes, "last_update": { "set": true, "infinite": false, "number": 1 } }))
}

async fn node_get(State(r): State<StandInRestd>, Path(name): Path<String>) -> Answer {
    match r.nodes().get(&name) {
        Some(n) => openapi(json!({ "nodes": [node_json(&name, n)] })),
        None => not_found(&format!("node {name}")),
    }
}

async fn node_post(
    State(r): State<StandInRestd>,
    Path(name): Path<String>,
    uri: Uri,
    Json(update): Json<Value>,
) -> Answer {
    let mut nodes = r.0.nodes.lock().expect("lock");
    let Some(node) = nodes.get_mut(&name) else { return not_found(&format!("node {name}")) };
    if let Some(comment) = update["comment"].as_str() {
        node.comment = comment.to_owned();
    }
    let reason = update["reason"].as_str().map(str::to_owned);
    for state in update["state"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        match state {
            "DRAIN" => {
                if !node.state.iter().any(|s| s == "DRAIN") {
                    node.state.push("DRAIN".to_owned());
                }
                node.reason = reason.clone().unwrap_or_default();
            }
            // slurmctld forgets the reason when the node resumes.
            "UNDRAIN" | "RESUME" => {
                node.state.retain(|s| s != "DRAIN");
                node.reason.clear();
            }
            _ => {}
        }
    }
    let version = uri.path().split('/').nth(2).unwrap_or_default().to_owned();
    let after = node.clone();
    r.0.updates.lock().expect("lock").push(Update { at: std::time::Instant::now(), node: name, version, after });
    openapi(json!({}))
}

async fn node_delete(State(r): State<StandInRestd>, Path(name): Path<String>) -> Answer {
    r.0.nodes.lock().expect("lock").remove(&name);
    openapi(json!({}))
}

async fn jobs() -> Answer {
    openapi(json!({ "jobs": [], "last_update": { "set": true, "infinite": false, "number": 1 } }))
}

/// paddock's demand read: every job, in v0.0.42's shape.
async fn jobs_v42(State(r): State<StandInRestd>) -> Answer {
    let jobs: Vec<Value> = r.0.jobs.lock().expect("lock").iter().map(job_json).collect();
    openapi(json!({ "jobs": jobs, "last_backfill": no_val(1_765_000_100), "last_update": no_val(1_765_000_100) }))
}

async fn reservations() -> Answer {
    openapi(json!({ "reservations": [], "last_update": { "set": true, "infinite": false, "number": 1 } }))
}

async fn reservation(Path(name): Path<String>) -> Answer {
    not_found(&format!("reservation {name}"))
}

/// paddock's probe (`ServiceProxyProbe`) pings v0.0.42 through the API server's service proxy.
async fn ping() -> Answer {
    let pings = json!([{ "hostname": "slurm-controller-0", "pinged": "UP", "latency": 93, "mode": "primary",
                         "primary": true, "responding": true }]);
    openapi(json!({ "pings": pings }))
}

async fn unknown(method: Method, uri: Uri) -> Answer {
    eprintln!("slurmrestd stand-in: no such endpoint here: {method} {uri}");
    not_found(&format!("{method} {uri}"))
}

fn router(restd: StandInRestd) -> axum::Router {
    const V44: &str = "/slurm/v0.0.44";
    axum::Router::new()
        .route(&format!("{V44}/nodes/"), get(nodes))
        .route(&format!("{V44}/nodes"), get(nodes))
        .route(&format!("{V44}/node/{{name}}"), get(node_get).post(node_post).delete(node_delete))
        .route(&format!("{V44}/jobs/"), get(jobs))
        .route(&format!("{V44}/jobs"), get(jobs))
        .route(&format!("{V44}/reservations/"), get(reservations))
        .route(&format!("{V44}/reservations"), get(reservations))
        .route(&format!("{V44}/reservation/{{name}}"), get(reservation))
        // paddock's probe drains through v0.0.42 (a version Slurm 25.11 still serves).
        .route("/slurm/v0.0.42/node/{name}", get(node_get).post(node_post))
        // and reads the queue through v0.0.42 for the demand of elastic pools.
        .route("/slurm/v0.0.42/jobs/", get(jobs_v42))
        .route("/slurm/v0.0.42/jobs", get(jobs_v42))
        .route("/slurm/v0.0.42/nodes/", get(nodes))
        .route("/slurm/v0.0.42/nodes", get(nodes))
        .route("/slurm/v0.0.42/ping", get(ping))
        .route("/slurm/v0.0.42/ping/", get(ping))
        .route_layer(axum::middleware::from_fn_with_state(restd.clone(), authorized))
        .fallback(unknown)
        .with_state(restd)
}
