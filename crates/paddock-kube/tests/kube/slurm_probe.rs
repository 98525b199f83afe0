//! paddock's production slurmrestd probe ([`ServiceProxyProbe`]) through a real API server's
//! service proxy, against a STAND-IN slurmrestd: a loopback HTTP server answering the real
//! `/slurm/v0.0.42/...` JSON shapes behind a selector-less Service, with the tokens of the JWT key
//! the driver wrote. Its ping, its drain and its read of the nodes' drain reasons (the proof
//! against real Slurm daemons comes with the real-Slurm path).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use paddock_domain::driver::SlurmSecrets;
use paddock_domain::secret::SecretString;
use paddock_kube::slurm::{self, ServiceProxyProbe, SlurmNode};
use serde_json::{json, Value};

use crate::slurm::{b64, desired, pool, random_bytes, unique};
use crate::slurm_rest::RestCluster;

#[derive(Clone)]
struct StandInRestd {
    key: Vec<u8>,
    /// Slurm node -> state flags.
    nodes: Arc<Mutex<BTreeMap<String, Vec<String>>>>,
    /// Slurm node -> its reason, when it has one.
    reasons: Arc<Mutex<BTreeMap<String, String>>>,
}

impl StandInRestd {
    /// A node as slurmrestd v0.0.42 shows it (fields cut).
    fn node(&self, name: &str, state: &[String]) -> Value {
        let reason = self.reasons.lock().expect("lock").get(name).cloned().unwrap_or_default();
        json!({ "name": name, "state": state, "reason": reason, "reason_set_by_user": "slurm" })
    }
}

impl StandInRestd {
    fn authorized(&self, headers: &axum::http::HeaderMap) -> bool {
        let Some(token) = headers.get("X-SLURM-USER-TOKEN").and_then(|v| v.to_str().ok()) else { return false };
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
        validation.set_required_spec_claims(&["exp"]);
        let key = jsonwebtoken::DecodingKey::from_secret(&self.key);
        jsonwebtoken::decode::<Value>(token, &key, &validation).is_ok_and(|t| t.claims["sun"] == "slurm")
    }
}

async fn restd_router(restd: StandInRestd) -> axum::Router {
    use axum::extract::{Path, State};
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::get;
    use axum::Json;

    type Answer = (StatusCode, Json<Value>);
    async fn ping(State(r): State<StandInRestd>, headers: HeaderMap) -> Answer {
        if !r.authorized(&headers) {
            return (StatusCode::UNAUTHORIZED, Json(json!({"errors": [{"error": "unauthorized"}]})));
        }
        // The shape of slurmrestd v0.0.42's `GET /slurm/v0.0.42/ping`.
        let pings = json!([{ "hostname": "slurm-controller-0", "pinged": "UP", "latency": 93, "mode": "primary",
                             "primary": true, "responding": true }]);
        (StatusCode::OK, Json(json!({ "pings": pings, "meta": {}, "errors": [], "warnings": [] })))
    }
    async fn node_get(State(r): State<StandInRestd>, Path(name): Path<String>, headers: HeaderMap) -> Answer {
        if !r.authorized(&headers) {
            return (StatusCode::UNAUTHORIZED, Json(json!({})));
        }
        let state = r.nodes.lock().expect("lock").get(&name).cloned();
        match state {
            Some(state) => (StatusCode::OK, Json(json!({ "nodes": [r.node(&name, &state)], "errors": [] }))),
            None => (StatusCode::NOT_FOUND, Json(json!({ "nodes": [], "errors": [{ "error": "Invalid node name" }] }))),
        }
    }
    async fn node_post(
        State(r): State<StandInRestd>,
        Path(name): Path<String>,
        headers: HeaderMap,
        Json(update): Json<Value>,
    ) -> Answer {
        if !r.authorized(&headers) {
            return (StatusCode::UNAUTHORIZED, Json(json!({})));
        }
        let mut nodes = r.nodes.lock().expect("lock");
        let Some(state) = nodes.get_mut(&name) else { return (StatusCode::NOT_FOUND, Json(json!({}))) };
        let reason = update["reason"].as_str().unwrap_or_default();
        if update["state"] == json!(["DRAIN"]) && !reason.is_empty() {
            state.push("DRAIN".to_owned());
            r.reasons.lock().expect("lock").insert(name, reason.to_owned());
        }
        (StatusCode::OK, Json(json!({ "errors": [] })))
    }
    // The shape of slurmrestd v0.0.42's `GET /slurm/v0.0.42/nodes`.
    async fn nodes(State(r): State<StandInRestd>, headers: HeaderMap) -> Answer {
        if !r.authorized(&headers) {
            return (StatusCode::UNAUTHORIZED, Json(json!({})));
        }
        let all = r.nodes.lock().expect("lock").clone();
        let nodes: Vec<Value> = all.iter().map(|(name, state)| r.node(name, state)).collect();
        (StatusCode::OK, Json(json!({ "nodes": nodes, "last_update": {}, "meta": {}, "errors": [], "warnings": [] })))
    }
    axum::Router::new()
        .route("/slurm/v0.0.42/ping", get(ping))
        .route("/slurm/v0.0.42/nodes", get(nodes))
        .route("/slurm/v0.0.42/node/{name}", get(node_get).post(node_post))
        .with_state(restd)
}

#[tokio::test]
async fn the_service_proxy_probe_pings_and_drains_through_the_api_server() {
    let Some(cluster) = RestCluster::new(vec![pool(&unique("cpu"), 1, 0, Vec::new())]).await else { return };
    let RestCluster { tenant, ns, secrets, driver, .. } = &cluster;
    let nodes = Arc::new(Mutex::new(BTreeMap::from([("cpu-0".to_owned(), vec!["IDLE".to_owned()])])));
    // A tenant's admin drained `cpu-1` to report a fault (`scontrol update ... state=drain
    // reason="paddock:hw: ..."`).
    let failed = vec!["IDLE".to_owned(), "DRAIN".to_owned()];
    nodes.lock().expect("lock").insert("cpu-1".to_owned(), failed.clone());
    let reasons = Arc::new(Mutex::new(BTreeMap::from([("cpu-1".to_owned(), "paddock:hw: GPU 3 ECC".to_owned())])));
    let restd = StandInRestd { key: cluster.jwt_key(), nodes: nodes.clone(), reasons };
    let (listener, port) = cluster.listener().await;
    let app = restd_router(restd).await;
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    cluster.route_to(port).await;

    let probe = ServiceProxyProbe::new(ns.clone());
    assert!(probe.ping(tenant, "v0.0.42").await.expect("ping through the service proxy"));
    assert_eq!(probe.drain(tenant, "v0.0.42", "cpu-0", slurm::DRAIN_REASON).await.expect("drain"), Some(true));
    assert_eq!(nodes.lock().expect("lock")["cpu-0"], vec!["IDLE".to_owned(), "DRAIN".to_owned()]);
    assert_eq!(probe.drain(tenant, "v0.0.42", "cpu-0", slurm::DRAIN_REASON).await.expect("again"), Some(true));
    assert_eq!(probe.drain(tenant, "v0.0.42", "unknown-7", slurm::DRAIN_REASON).await.expect("unknown"), None);
    // Every node with its state and reason: the tenant's fault report, and paddock's own drain.
    let listed = probe.nodes(tenant, "v0.0.42").await.expect("nodes through the service proxy");
    let drained = |name: &str, reason: &str| SlurmNode {
        name: name.into(),
        state: failed.clone(),
        reason: reason.into(),
        ..SlurmNode::default()
    };
    assert_eq!(listed, [drained("cpu-0", slurm::DRAIN_REASON), drained("cpu-1", "paddock:hw: GPU 3 ECC")]);

    // A token signed with another key is refused by the stand-in: the ping is not a success.
    let other = secrets_with_jwt(secrets, b64(&random_bytes(64)));
    driver.ensure_slurm(tenant, &desired(vec![pool(&unique("cpu"), 1, 0, Vec::new())], &other)).await.expect("ensure");
    let denied = probe.ping(tenant, "v0.0.42").await;
    assert!(!matches!(denied, Ok(true)), "a token of the old key was accepted: {denied:?}");
}

fn secrets_with_jwt(secrets: &SlurmSecrets, jwt: String) -> SlurmSecrets {
    SlurmSecrets { jwt_hs256_key: SecretString::new(jwt), ..secrets.clone() }
}
