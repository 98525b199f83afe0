//! Webhooks end to end: subscriptions through the API, events written by the changes themselves,
//! deliveries to a receiver on loopback (allowed by the guard's settings), each signature checked
//! with the Standard Webhooks reference library (`standardwebhooks` 1.1.0 on PyPI), retries, a
//! worker killed mid-delivery, the address guard, and a tenant's subscription seeing only its
//! tenant's events.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use futures::future::BoxFuture;
use paddock_domain::webhook::AddressGuard;
use paddock_testkit::skip::skip;
use paddock_testkit::{admin, eventually, token, TestApp};
use paddock_worker::webhook::{Deliverer, DeliveryConfig, Lookup, SystemLookup};
use serde_json::{json, Value};

use crate::common::{fleet, id, machine_class, tenant};

pub(crate) const DEADLINE: Duration = Duration::from_secs(60);

/// What the receiver got: one POST.
#[derive(Debug, Clone)]
pub(crate) struct Got {
    pub(crate) id: String,
    timestamp: String,
    signature: String,
    pub(crate) body: String,
}

/// A receiver on loopback: answers 410 while `gone` is set, 503 to the first `fail` requests,
/// holds the first request forever when `hang` is set, and records every request it answers 2xx
/// (and the `webhook-id` of every request in `tried`).
#[derive(Clone, Default)]
pub(crate) struct Receiver {
    got: Arc<Mutex<Vec<Got>>>,
    pub(crate) tried: Arc<Mutex<Vec<String>>>,
    refused: Arc<AtomicUsize>,
    pub(crate) fail: Arc<AtomicUsize>,
    pub(crate) gone: Arc<AtomicBool>,
    hang: Arc<AtomicBool>,
    hung: Arc<AtomicUsize>,
}

async fn receive(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    if r.hang.swap(false, Ordering::SeqCst) {
        r.hung.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<()>().await;
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    r.tried.lock().expect("receiver lock").push(header("webhook-id"));
    if r.gone.load(Ordering::SeqCst) {
        return StatusCode::GONE;
    }
    if r.fail.load(Ordering::SeqCst) > 0 {
        r.fail.fetch_sub(1, Ordering::SeqCst);
        r.refused.fetch_add(1, Ordering::SeqCst);
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    r.got.lock().expect("receiver lock").push(Got {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    StatusCode::NO_CONTENT
}

impl Receiver {
    /// Serves on a loopback port; returns its URL.
    pub(crate) async fn serve(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding a loopback port");
        let url = format!("http://{}/hook", listener.local_addr().expect("address"));
        let router = axum::Router::new().route("/hook", axum::routing::post(receive)).with_state(self.clone());
        tokio::spawn(async move { axum::serve(listener, router).await.expect("serving the receiver") });
        url
    }

    pub(crate) fn got(&self) -> Vec<Got> {
        self.got.lock().expect("receiver lock").clone()
    }
}

/// The guard of these tests: plain http, and loopback allowed.
pub(crate) fn loopback_guard() -> AddressGuard {
    AddressGuard { insecure_http: true, allowed: vec!["127.0.0.0/8".parse().expect("network")] }
}

pub(crate) async fn app() -> TestApp {
    TestApp::with_services(|s| s.with_webhook_guard(loopback_guard())).await
}

pub(crate) fn config(worker: &str) -> DeliveryConfig {
    DeliveryConfig {
        lease: Duration::from_secs(2),
        attempt_timeout: Duration::from_secs(1),
        poll_interval: Duration::from_millis(50),
        retry_base: Duration::from_millis(50),
        retry_cap: Duration::from_millis(200),
        ..DeliveryConfig::new("https://paddock.example", worker)
    }
}

pub(crate) fn deliverer(
    app: &TestApp,
    guard: AddressGuard,
    lookup: Arc<dyn Lookup>,
    config: DeliveryConfig,
) -> Deliverer {
    Deliverer::new(app.services.store().clone(), app.cipher.clone(), Arc::new(guard), lookup, config)
        .expect("a deliverer")
}

/// Runs a deliverer until the task is aborted (a killed worker).
pub(crate) fn start(d: Deliverer) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move { d.run(std::future::pending()).await })
}

pub(crate) async fn subscribe(app: &TestApp, path: &str, bearer: &str, url: &str, events: &[&str]) -> Value {
    app.post(path).token(bearer).json(&json!({ "url": url, "events": events })).send().await.expect(201).json()
}

pub(crate) const CLUSTER_EVENTS: [&str; 6] = [
    "operation.succeeded",
    "operation.failed",
    "cluster.ready",
    "cluster.degraded",
    "cluster.deleted",
    "node_pool.scaled",
];

/// A tenant with a one-pool cluster; returns (tenant id, its admin's token, cluster id, pool id).
pub(crate) async fn tenant_with_cluster(app: &TestApp, name: &str) -> (String, String, String, String) {
    let t = tenant(app, name).await;
    let tenant_id = id(&t);
    let bearer = token(&["tenant:admin"], Some(tenant_id.parse().expect("uuid")));
    let body = json!({
        "name": "c1", "kind": "slurm", "isolation": "private-nodes",
        "node_pools": [{ "name": "cpu", "machine_class": "cpu", "count": 1, "role": "system" }]
    });
    let made = app
        .post(format!("/v1/tenants/{tenant_id}/clusters"))
        .token(&bearer)
        .json(&body)
        .send()
        .await
        .expect(202)
        .json();
    let cluster = id(&made["cluster"]);
    let pool = made["cluster"]["node_pools"][0]["id"].as_str().expect("pool id").to_owned();
    (tenant_id, bearer, cluster, pool)
}

pub(crate) async fn sql(app: &TestApp, statement: &str, id: &str) {
    sqlx::query(statement).bind(id).execute(&app.db.pool).await.expect(statement);
}

/// A cluster's life after its creation, as the worker and the API write it: ready (its
/// operation succeeded), scaled, degraded, deleted.
async fn live(app: &TestApp, tenant_id: &str, bearer: &str, cluster: &str, pool: &str) {
    sql(app, "update clusters set phase = 'ready' where id = $1::uuid", cluster).await;
    sql(
        app,
        "update operations set state = 'succeeded', finished_at = now() where target_id = $1::uuid \
              and state in ('pending', 'running')",
        cluster,
    )
    .await;
    app.patch(format!("/v1/tenants/{tenant_id}/clusters/{cluster}/node-pools/{pool}"))
        .token(bearer)
        .json(&json!({ "count": 2 }))
        .send()
        .await
        .expect(202);
    sql(app, "update clusters set phase = 'degraded' where id = $1::uuid", cluster).await;
    app.delete(format!("/v1/tenants/{tenant_id}/clusters/{cluster}")).token(bearer).send().await.expect(202);
    sql(app, "update clusters set deleted_at = now() where id = $1::uuid", cluster).await;
}

/// The events received, parsed, once each (a repeat must carry the same `webhook-id` and body).
pub(crate) fn events(got: &[Got]) -> Vec<Value> {
    let mut seen: HashMap<String, String> = HashMap::new();
    let mut out = Vec::new();
    for g in got {
        let event: Value = serde_json::from_str(&g.body).expect("a JSON body");
        assert_eq!(event["id"].as_str(), Some(g.id.as_str()), "webhook-id is the CloudEvents id");
        match seen.get(&g.id) {
            Some(body) => assert_eq!(body, &g.body, "a repeat is the same event"),
            None => {
                seen.insert(g.id.clone(), g.body.clone());
                out.push(event);
            }
        }
    }
    out
}

/// The types per subject, in the order received.
fn by_subject(events: &[Value]) -> BTreeMap<String, Vec<String>> {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in events {
        let subject = e["subject"].as_str().expect("subject").to_owned();
        map.entry(subject).or_default().push(e["type"].as_str().expect("type").to_owned());
    }
    map
}

/// Checks every signature with the Standard Webhooks reference library; panics on any that does
/// not verify. Skips (fails under CI=true) when the library cannot be installed.
fn verify_with_reference_library(secret: &str, got: &[Got]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/standardwebhooks-venv");
    let python = match std::process::Command::new(script).output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        Ok(out) => {
            skip(format!("standardwebhooks could not be installed: {}", String::from_utf8_lossy(&out.stderr)));
            return;
        }
        Err(e) => {
            skip(format!("{script} could not run: {e}"));
            return;
        }
    };
    let cases: Vec<Value> = got
        .iter()
        .map(|g| json!({ "id": g.id, "timestamp": g.timestamp, "signature": g.signature, "body": g.body }))
        .collect();
    let program = r#"
import json, sys
from standardwebhooks.webhooks import Webhook
cases = json.load(sys.stdin)
hook = Webhook(sys.argv[1])
for c in cases:
    hook.verify(c["body"], {"webhook-id": c["id"], "webhook-timestamp": c["timestamp"], "webhook-signature": c["signature"]})
print(len(cases))
"#;
    let mut child = std::process::Command::new(&python)
        .args(["-c", program, secret])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running the verifier");
    serde_json::to_writer(child.stdin.take().expect("stdin"), &cases).expect("writing the cases");
    let out = child.wait_with_output().expect("the verifier's answer");
    assert!(out.status.success(), "a signature did not verify: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), cases.len().to_string());
}

#[tokio::test]
async fn a_clusters_life_arrives_signed_in_order_per_subject_through_an_outage() {
    let app = app().await;
    machine_class(&app, "cpu", 0).await;
    fleet(&app, "cpu", 2).await;
    let receiver = Receiver::default();
    let url = receiver.serve().await;
    let provider = subscribe(&app, "/v1/webhooks", &admin(), &url, &CLUSTER_EVENTS).await;
    let secret = provider["secret"].as_str().expect("secret shown at creation").to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");
    let listed = app.get("/v1/webhooks").token(&admin()).send().await.expect(200).json();
    assert!(listed.to_string().find("whsec_").is_none(), "the secret is shown once: {listed}");

    // The receiver is down for the first deliveries: they are retried, and hold their subjects.
    receiver.fail.store(4, Ordering::SeqCst);
    let (tenant_id, bearer, cluster, pool) = tenant_with_cluster(&app, "acme").await;
    live(&app, &tenant_id, &bearer, &cluster, &pool).await;
    let worker = start(deliverer(&app, loopback_guard(), Arc::new(SystemLookup), config("w1")));

    let cluster_subject = format!("/v1/tenants/{tenant_id}/clusters/{cluster}");
    let received = eventually(DEADLINE, || async {
        let got = receiver.got();
        let subjects = by_subject(&events(&got));
        (subjects.get(&cluster_subject).map(Vec::len) == Some(3) && subjects.len() == 3).then_some(got)
    })
    .await;
    // Every delivery made, not only the cluster's: an event of another subject may still be
    // waiting for its retry when the cluster's last one arrives.
    let hook = id(&provider);
    let deliveries = eventually(DEADLINE, || async {
        let listed = app.get(format!("/v1/webhooks/{hook}/deliveries")).token(&admin()).send().await.expect(200).json();
        let items = listed["items"].as_array().expect("items");
        items.iter().all(|d| d["state"] == "delivered").then_some(listed)
    })
    .await;
    worker.abort();
    assert_eq!(receiver.refused.load(Ordering::SeqCst), 4, "the outage was seen");
    let events = events(&received);
    let subjects = by_subject(&events);
    assert_eq!(
        subjects[&cluster_subject],
        ["dev.paddock.cluster.ready", "dev.paddock.cluster.degraded", "dev.paddock.cluster.deleted"]
    );
    let pool_subject = format!("{cluster_subject}/node-pools/{pool}");
    assert_eq!(subjects[&pool_subject], ["dev.paddock.node_pool.scaled"]);
    for e in &events {
        assert_eq!(e["specversion"], "1.0");
        assert_eq!(e["source"], "https://paddock.example");
        assert!(e["time"].is_string() && e["data"].is_object(), "{e}");
    }
    let ready = events.iter().find(|e| e["type"] == "dev.paddock.cluster.ready").expect("ready");
    assert_eq!(ready["data"]["status"]["phase"], "ready");
    assert_eq!(ready["data"]["id"], cluster.as_str());
    assert!(events.iter().any(|e| e["type"] == "dev.paddock.operation.succeeded"), "{events:?}");

    verify_with_reference_library(&secret, &received);

    // The deliveries listing shows the tries of the outage.
    let items = deliveries["items"].as_array().expect("items");
    let tries: usize = items.iter().map(|d| d["tries"].as_array().map_or(0, Vec::len)).sum();
    assert_eq!(tries, items.len() + 4, "{deliveries}");
}

#[tokio::test]
async fn a_worker_killed_mid_delivery_leaves_it_to_another_under_the_same_webhook_id() {
    let app = app().await;
    let receiver = Receiver::default();
    let url = receiver.serve().await;
    let provider = subscribe(&app, "/v1/webhooks", &admin(), &url, &["usage.period_closed"]).await;
    receiver.hang.store(true, Ordering::SeqCst);
    crate::common::close_period(&app, "2026-01", "webhook-close").await;

    // The first worker's try never gets an answer; the worker dies with it.
    let slow =
        DeliveryConfig { attempt_timeout: Duration::from_secs(300), lease: Duration::from_secs(2), ..config("w1") };
    let first = start(deliverer(&app, loopback_guard(), Arc::new(SystemLookup), slow));
    eventually(DEADLINE, || async { (receiver.hung.load(Ordering::SeqCst) == 1).then_some(()) }).await;
    first.abort();
    // Another worker takes the delivery once the claim expired, and sends the same event.
    let second = start(deliverer(&app, loopback_guard(), Arc::new(SystemLookup), config("w2")));
    let got = eventually(DEADLINE, || async { Some(receiver.got()).filter(|g| !g.is_empty()) }).await;
    second.abort();
    let event: Value = serde_json::from_str(&got[0].body).expect("json");
    assert_eq!(event["type"], "dev.paddock.usage.period_closed");
    assert_eq!(event["subject"], "/v1/usage/periods/2026-01");
    let hook = id(&provider);
    let deliveries = app.get(format!("/v1/webhooks/{hook}/deliveries")).token(&admin()).send().await.expect(200).json();
    assert_eq!(deliveries["items"][0]["state"], "delivered", "{deliveries}");
    assert_eq!(deliveries["items"][0]["event_id"], event["id"]);
}

/// An idle deliverer finds a new event by its quick look for events (`event_poll`), not by its
/// whole round (`poll_interval`, here 10 minutes, longer than the test's deadline); and writing
/// the event sent no notification: the transaction that changed the resource did not take
/// PostgreSQL's notify lock.
#[tokio::test]
async fn an_idle_deliverer_finds_a_new_event_without_a_notification() {
    let app = app().await;
    let receiver = Receiver::default();
    let url = receiver.serve().await;
    subscribe(&app, "/v1/webhooks", &admin(), &url, &["usage.period_closed"]).await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&app.db.pool).await.expect("a listener");
    listener.listen(paddock_store::job::NOTIFY_CHANNEL).await.expect("listen");
    let idle = DeliveryConfig {
        event_poll: Duration::from_millis(100),
        poll_interval: Duration::from_secs(600),
        ..config("w1")
    };
    let delivering = start(deliverer(&app, loopback_guard(), Arc::new(SystemLookup), idle));
    // The first event may be found by the deliverer's first round; once it is in, the deliverer
    // is idle, and only its look for new events can bring the second one within the deadline.
    crate::common::close_period(&app, "2026-01", "poll-1").await;
    eventually(DEADLINE, || async { (receiver.got().len() == 1).then_some(()) }).await;
    crate::common::close_period(&app, "2026-02", "poll-2").await;
    let got = eventually(DEADLINE, || async { Some(receiver.got()).filter(|g| g.len() == 2) }).await;
    delivering.abort();
    let second: Value = serde_json::from_str(&got[1].body).expect("json");
    assert_eq!(second["subject"], "/v1/usage/periods/2026-02");
    // Every notification sent meanwhile (the job queue's wake-ups among them), until none came for
    // half a second.
    let mut payloads = Vec::new();
    while let Ok(Ok(Some(n))) = tokio::time::timeout(Duration::from_millis(500), listener.try_recv()).await {
        payloads.push(n.payload().to_owned());
    }
    assert!(!payloads.iter().any(|p| p == "webhook"), "no event notified at commit: {payloads:?}");
}

/// A resolver that answers from a table, so no test sends a packet outside loopback.
struct Stub(HashMap<&'static str, Vec<IpAddr>>);

impl Lookup for Stub {
    fn lookup<'a>(&'a self, host: &'a str) -> BoxFuture<'a, std::io::Result<Vec<IpAddr>>> {
        let found = self.0.get(host).cloned().ok_or_else(|| std::io::Error::other(format!("no stub for {host}")));
        Box::pin(async move { found })
    }
}

#[tokio::test]
async fn private_addresses_are_refused_at_validation_and_at_connect() {
    let app = TestApp::new().await;
    for url in [
        "https://10.0.0.1/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://100.64.0.1/",
        "https://[::1]/",
        "https://[fd00::1]/",
        "https://[fe80::1]/",
        "https://[::ffff:127.0.0.1]/",
        "https://localhost/",
        "http://hooks.example.com/",
    ] {
        let refused = app
            .post("/v1/webhooks")
            .token(&admin())
            .json(&json!({ "url": url, "events": ["cluster.ready"] }))
            .send()
            .await;
        let body = refused.expect(422).json();
        assert_eq!(body["errors"][0]["field"], "url", "{url}: {body}");
    }

    // A name that resolves to a private address passes validation, and is refused at connect.
    let receiver = Receiver::default();
    let url = receiver.serve().await;
    let port = url.split(':').nth(2).and_then(|p| p.split('/').next()).expect("port").to_owned();
    let hook = subscribe(
        &app,
        "/v1/webhooks",
        &admin(),
        &format!("https://rebind.example:{port}/hook"),
        &["usage.period_closed"],
    )
    .await;
    crate::common::close_period(&app, "2026-02", "webhook-refused").await;
    let stub =
        Stub(HashMap::from([("rebind.example", vec!["10.1.2.3".parse().expect("ip"), "::1".parse().expect("ip")])]));
    let d = deliverer(&app, AddressGuard::default(), Arc::new(stub), config("w1"));
    let hook_id = id(&hook);
    let delivery = eventually(DEADLINE, || async {
        d.tick().await.expect("a round");
        let list =
            app.get(format!("/v1/webhooks/{hook_id}/deliveries")).token(&admin()).send().await.expect(200).json();
        let first = list["items"][0].clone();
        (first["attempts"].as_i64() >= Some(1)).then_some(first)
    })
    .await;
    assert_eq!(delivery["state"], "pending", "{delivery}");
    let error = delivery["last_error"].as_str().expect("an error");
    assert!(error.contains("10.1.2.3") && error.contains("may not"), "{error}");
    assert!(receiver.got().is_empty());
}

#[tokio::test]
async fn a_tenants_subscription_sees_only_its_own_tenants_events() {
    let app = app().await;
    machine_class(&app, "cpu", 0).await;
    fleet(&app, "cpu", 4).await;
    let mine = Receiver::default();
    let mine_url = mine.serve().await;
    let all = Receiver::default();
    let all_url = all.serve().await;
    let (a, a_bearer, a_cluster, a_pool) = tenant_with_cluster(&app, "acme").await;
    let (b, b_bearer, b_cluster, b_pool) = tenant_with_cluster(&app, "globex").await;
    // A tenant may neither ask for fleet or billing events nor manage another's subscriptions.
    let fleet_events = json!({ "url": mine_url, "events": ["machine.state_changed"] });
    app.post(format!("/v1/tenants/{a}/webhooks")).token(&a_bearer).json(&fleet_events).send().await.expect(422);
    app.post(format!("/v1/tenants/{b}/webhooks"))
        .token(&a_bearer)
        .json(&json!({ "url": mine_url, "events": ["cluster.ready"] }))
        .send()
        .await
        .expect(404);
    app.post("/v1/webhooks")
        .token(&a_bearer)
        .json(&json!({ "url": mine_url, "events": ["cluster.ready"] }))
        .send()
        .await
        .expect(403);
    let billing = token(&["billing:reader"], None);
    app.get("/v1/webhooks").token(&billing).send().await.expect(403);

    subscribe(&app, &format!("/v1/tenants/{a}/webhooks"), &a_bearer, &mine_url, &CLUSTER_EVENTS).await;
    let provider_events = [&CLUSTER_EVENTS[..], &["machine.state_changed"]].concat();
    subscribe(&app, "/v1/webhooks", &admin(), &all_url, &provider_events).await;
    live(&app, &b, &b_bearer, &b_cluster, &b_pool).await;
    live(&app, &a, &a_bearer, &a_cluster, &a_pool).await;
    // A machine changes state: a fleet fact.
    let machine: String = sqlx::query_scalar("select id::text from machines where allocation_id is null limit 1")
        .fetch_one(&app.db.pool)
        .await
        .expect("a free machine");
    crate::common::set_machine_state(&app, &machine, "maintenance").await;
    let worker = start(deliverer(&app, loopback_guard(), Arc::new(SystemLookup), config("w1")));
    let b_subject = format!("/v1/tenants/{b}/clusters/{b_cluster}");
    let a_subject = format!("/v1/tenants/{a}/clusters/{a_cluster}");
    let everything = eventually(DEADLINE, || async {
        let subjects = by_subject(&events(&all.got()));
        let done = [&a_subject, &b_subject].iter().all(|s| subjects.get(*s).map(Vec::len) == Some(3))
            && subjects.keys().any(|s| s.starts_with("/v1/machines/"));
        done.then_some(subjects)
    })
    .await;
    let own = eventually(DEADLINE, || async {
        let subjects = by_subject(&events(&mine.got()));
        (subjects.get(&a_subject).map(Vec::len) == Some(3)).then_some(subjects)
    })
    .await;
    // The provider's subscription got both tenants; let the worker run on, then look at A's.
    assert!(everything.contains_key(&b_subject));
    worker.abort();
    let mine_all = serde_json::to_string(&events(&mine.got())).expect("json");
    assert!(!mine_all.contains(&b) && !mine_all.contains(&b_cluster), "another tenant's events: {mine_all}");
    assert!(!mine_all.contains("/v1/machines/"), "a fleet fact: {mine_all}");
    assert!(
        own.keys().all(|s| s.starts_with(&format!("/v1/tenants/{a}/")) || s.starts_with("/v1/operations/")),
        "{own:?}"
    );
    // A pool's view names its cluster, not its tenant.
    for event in events(&mine.got()) {
        let (key, owner) = if event["type"] == "dev.paddock.node_pool.scaled" {
            ("cluster_id", &a_cluster)
        } else {
            ("tenant_id", &a)
        };
        assert_eq!(event["data"][key], owner.as_str(), "{event}");
    }
}

#[tokio::test]
async fn subscriptions_are_managed_and_a_rotated_secret_signs_beside_the_old_one() {
    let app = app().await;
    let receiver = Receiver::default();
    let url = receiver.serve().await;
    let made = subscribe(&app, "/v1/webhooks", &admin(), &url, &["usage.period_closed"]).await;
    let hook = id(&made);
    let old = made["secret"].as_str().expect("secret").to_owned();
    let rotated =
        app.post(format!("/v1/webhooks/{hook}/rotate-secret")).token(&admin()).send().await.expect(200).json();
    let new = rotated["secret"].as_str().expect("secret").to_owned();
    assert_ne!(old, new);
    assert!(rotated["previous_secret_expires_at"].is_string(), "{rotated}");
    let patched = app
        .patch(format!("/v1/webhooks/{hook}"))
        .token(&admin())
        .json(&json!({ "description": "billing" }))
        .send()
        .await
        .expect(200)
        .json();
    assert_eq!(patched["description"], "billing");
    app.patch(format!("/v1/webhooks/{hook}"))
        .token(&admin())
        .json(&json!({ "events": ["nope"] }))
        .send()
        .await
        .expect(422);
    crate::common::close_period(&app, "2026-03", "webhook-rotate").await;
    let d = deliverer(&app, loopback_guard(), Arc::new(SystemLookup), config("w1"));
    let got = eventually(DEADLINE, || async {
        d.tick().await.expect("a round");
        Some(receiver.got()).filter(|g| !g.is_empty())
    })
    .await;
    assert_eq!(got[0].signature.split(' ').count(), 2, "both secrets sign: {}", got[0].signature);
    verify_with_reference_library(&old, &got);
    verify_with_reference_library(&new, &got);
    app.delete(format!("/v1/webhooks/{hook}")).token(&admin()).send().await.expect(204);
    app.get(format!("/v1/webhooks/{hook}")).token(&admin()).send().await.expect(404);
}

/// The numbers of BENCHMARKS.md ("Webhooks"): events per second delivered to one receiver, and
/// what 10,000 idle subscriptions cost a worker's idle round and a fan-out. Not a check: run it
/// by hand (`cargo test -p paddock-tests --test api -- --ignored webhook_throughput --nocapture`).
#[tokio::test]
#[ignore = "a benchmark, run by hand"]
async fn webhook_throughput() {
    const EVENTS: i64 = 2000;
    let app = app().await;
    let receiver = Receiver::default();
    let url = receiver.serve().await;
    subscribe(&app, "/v1/webhooks", &admin(), &url, &["cluster.ready"]).await;
    // One subject per event (a cluster each): order holds per subject, so they may go in parallel.
    sqlx::query(
        "select webhook_emit('dev.paddock.cluster.ready', '/v1/tenants/t/clusters/' || i, null, \
           jsonb_build_object('id', i, 'status', jsonb_build_object('phase', 'ready')), null) \
         from generate_series(1, $1) i",
    )
    .bind(EVENTS)
    .execute(&app.db.pool)
    .await
    .expect("events");
    let d = deliverer(&app, loopback_guard(), Arc::new(SystemLookup), config("bench"));
    let started = std::time::Instant::now();
    while receiver.got().len() < EVENTS as usize {
        d.tick().await.expect("a round");
    }
    let elapsed = started.elapsed();
    println!("delivered {EVENTS} events in {elapsed:?}: {:.0}/s", EVENTS as f64 / elapsed.as_secs_f64());

    // 10,000 subscriptions that want nothing that happens.
    sqlx::query(
        "insert into webhook_subscriptions (id, url, events, secret_enc) \
         select gen_random_uuid(), 'https://hooks.example.com/' || i, array['machine.quarantined'], '\\x00' \
         from generate_series(1, 10000) i",
    )
    .execute(&app.db.pool)
    .await
    .expect("idle subscriptions");
    let rounds = 200;
    let started = std::time::Instant::now();
    for _ in 0..rounds {
        d.tick().await.expect("an idle round");
    }
    println!("idle round with 10,000 idle subscriptions: {:?}", started.elapsed() / rounds);
    sqlx::query("select webhook_emit('dev.paddock.cluster.ready', '/v1/x', null, '{}', null)")
        .execute(&app.db.pool)
        .await
        .expect("one event");
    let started = std::time::Instant::now();
    d.tick().await.expect("a fan-out round");
    println!("one event fanned out past 10,000 subscriptions: {:?}", started.elapsed());
}
