//! `GET /v1/tenants/{tenant_id}/clusters/{cluster_id}/kubeconfig`: the tenant's own kubeconfig
//! (docs/api.md, docs/tenants.md). The worker runs in-process with the SIMULATED cluster drivers
//! (their kubeconfig is a stand-in; the real one is tested in paddock-kube against a real API
//! server); no machines are needed, since the control plane comes up while the cluster waits for
//! capacity.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use paddock_api::{ApiConfig, AppState};
use paddock_auth::{Secret, Verifier, VerifierConfig};
use paddock_sim::{ClusterFault, SimConfig, SimWorld};
use paddock_store::Store;
use paddock_testkit::{admin, eventually, token, TestApp, TEST_SECRET};
use paddock_worker::reconcile::{ClusterReconciler, Drivers, Settings};
use paddock_worker::{JobHandler, Worker, WorkerConfig};
use serde_json::{json, Value};
use tokio::sync::watch;
use uuid::Uuid;

use crate::common::{id, machine_class, tenant};

const WAIT: Duration = Duration::from_secs(60);

/// The API with the simulated credentials driver, and (once started) a worker with the simulated
/// cluster drivers, over one database.
struct Lab {
    app: TestApp,
    world: SimWorld,
    stop: watch::Sender<bool>,
    tenant: String,
    admin_token: String,
}

impl Lab {
    async fn new() -> Lab {
        let mut app = TestApp::new().await;
        let store = Store::from_pool(app.db.pool.clone());
        let world = SimWorld::new(store, SimConfig::zero());
        // The router as `paddock api` builds it with PADDOCK_KUBE_DRIVER=simulated.
        let services = app.services.clone().with_credentials(world.kube().credentials);
        let verifier = Verifier::new(VerifierConfig {
            hs256_secret: Some(Secret::new(TEST_SECRET.to_vec())),
            ..Default::default()
        })
        .await
        .expect("test verifier");
        app.router = paddock_api::router(AppState::new(services, verifier, ApiConfig::default()));
        machine_class(&app, "gpu", 8).await;
        // One machine in the fleet, so that a one-node pool is not refused (insufficient_capacity);
        // it is never allocated here (no machine reconciler runs).
        crate::common::fleet(&app, "gpu", 1).await;
        let t = tenant(&app, "acme").await;
        let admin_token = token(&["tenant:admin"], Some(id(&t).parse().expect("uuid")));
        let (stop, _) = watch::channel(false);
        Lab { app, world, stop, tenant: id(&t), admin_token }
    }

    /// Starts the worker (cluster reconciler only: no machines here).
    fn start_worker(&self) {
        let store = Store::from_pool(self.app.db.pool.clone());
        let drivers = Drivers { bmc: None, kube: Some(self.world.kube()) };
        let settings = Settings { poll: Duration::from_millis(50), ..Settings::default() };
        let handlers: Vec<Arc<dyn JobHandler>> =
            vec![Arc::new(ClusterReconciler::new(self.app.services.clone(), drivers, settings))];
        let config = WorkerConfig {
            concurrency: 4,
            poll_interval: Duration::from_millis(50),
            backoff_base: Duration::from_millis(10),
            backoff_cap: Duration::from_millis(200),
            ..WorkerConfig::default()
        };
        let worker = Worker::new(store, "kubeconfig-worker", handlers, config).expect("worker");
        let mut stopped = self.stop.subscribe();
        tokio::spawn(async move {
            worker
                .run(async move {
                    let _ = stopped.changed().await;
                })
                .await
        });
    }

    async fn create(&self, name: &str) -> String {
        let body = json!({
            "name": name, "kind": "kubernetes", "isolation": "private-nodes",
            "node_pools": [{ "name": "gpu", "machine_class": "gpu", "count": 1 }]
        });
        let path = format!("/v1/tenants/{}/clusters", self.tenant);
        id(&self.app.post(path).token(&self.admin_token).json(&body).send().await.expect(202).json()["cluster"])
    }

    fn path(&self, cluster: &str) -> String {
        format!("/v1/tenants/{}/clusters/{cluster}/kubeconfig", self.tenant)
    }

    /// Waits until the cluster's control plane is ready; returns the cluster.
    async fn control_plane_ready(&self, cluster: &str) -> Value {
        let path = format!("/v1/tenants/{}/clusters/{cluster}", self.tenant);
        eventually(WAIT, || async {
            let c = self.app.get(path.as_str()).token(&admin()).send().await.expect(200).json();
            let conditions = c["status"]["conditions"].as_array().cloned().unwrap_or_default();
            let ready = conditions.iter().any(|k| k["type"] == "ControlPlaneReady" && k["status"] == "True");
            (ready && c["status"]["endpoints"]["kubernetes_api"].is_string()).then_some(c)
        })
        .await
    }

    /// The audit events of `cluster.kubeconfig` with `outcome`.
    async fn audited(&self, outcome: &str) -> Vec<Value> {
        let path = format!("/v1/audit-events?action=cluster.kubeconfig&outcome={outcome}&limit=1000");
        self.app.get(path).token(&admin()).send().await.expect(200).json()["items"].as_array().cloned().expect("items")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

fn expires_at(resp: &paddock_testkit::Resp) -> DateTime<Utc> {
    let text = resp.header("x-paddock-expires-at").expect("x-paddock-expires-at");
    DateTime::parse_from_rfc3339(text).expect("RFC 3339").with_timezone(&Utc)
}

#[tokio::test]
async fn a_ready_clusters_admins_get_an_audited_kubeconfig_with_its_endpoint() {
    let lab = Lab::new().await;
    lab.start_worker();
    let cluster = lab.create("hpc").await;
    let view = lab.control_plane_ready(&cluster).await;
    let endpoint = view["status"]["endpoints"]["kubernetes_api"].as_str().expect("endpoint").to_owned();

    let resp = lab.app.get(format!("{}?ttl=3600", lab.path(&cluster))).token(&lab.admin_token).send().await.expect(200);
    assert_eq!(resp.header("content-type"), Some("application/yaml"));
    assert_eq!(resp.header("cache-control"), Some("no-store"));
    let body = String::from_utf8(resp.body.to_vec()).expect("UTF-8");
    assert!(body.contains(&format!("server: {endpoint}")), "the kubeconfig names the endpoint {endpoint}: {body}");
    assert!(body.contains("token: "), "{body}");
    let lifetime = expires_at(&resp) - Utc::now();
    assert!((3500..=3600).contains(&lifetime.num_seconds()), "expires in {lifetime}");

    // The default TTL is 8 h; provider:admin may ask too.
    let resp = lab.app.get(lab.path(&cluster)).token(&admin()).send().await.expect(200);
    let lifetime = expires_at(&resp) - Utc::now();
    assert!((28_700..=28_800).contains(&lifetime.num_seconds()), "expires in {lifetime}");

    // Audited, without the kubeconfig.
    let events = lab.audited("success").await;
    assert_eq!(events.len(), 2, "{events:?}");
    let token_line = body.lines().find(|l| l.contains("token: ")).expect("token line");
    let token = token_line.trim().trim_start_matches("token: ").trim_matches('"');
    for event in &events {
        assert_eq!(event["target"]["id"], cluster.as_str(), "{event}");
        assert_eq!(event["tenant_id"], lab.tenant.as_str());
        assert!(!event.to_string().contains(token), "the token is in the audit trail: {event}");
        assert!(!event.to_string().contains("apiVersion"), "the kubeconfig is in the audit trail: {event}");
    }
    assert!(events.iter().any(|e| e["details"]["ttl_seconds"] == 3600), "{events:?}");

    // A tenant API server that does not answer: a 409 to retry later, audited as a failure.
    let cluster_id = paddock_types::ClusterId(cluster.parse().expect("uuid"));
    lab.world.set_cluster_fault(cluster_id, ClusterFault::TenantUnreachable, true).await.expect("fault");
    lab.app.get(lab.path(&cluster)).token(&lab.admin_token).send().await.problem(409, "cluster_unreachable");
    assert!(lab.audited("failure").await.iter().any(|e| e["code"] == "cluster_unreachable"));
}

#[tokio::test]
async fn only_admins_may_ask_and_other_tenants_clusters_are_missing() {
    let lab = Lab::new().await;
    let cluster = lab.create("hpc").await;
    let own: Uuid = lab.tenant.parse().expect("uuid");
    let path = lab.path(&cluster);
    // 403 before any lookup: also for a cluster that does not exist.
    let missing = lab.path(&Uuid::now_v7().to_string());
    for t in
        [token(&["tenant:member"], Some(own)), token(&["provider:operator"], None), token(&["billing:reader"], None)]
    {
        lab.app.get(path.as_str()).token(&t).send().await.problem(403, "forbidden");
        lab.app.get(missing.as_str()).token(&t).send().await.problem(403, "forbidden");
    }
    // Another tenant's admin: the cluster is missing, exactly like one that does not exist.
    let other = id(&tenant(&lab.app, "globex").await);
    let other_admin = token(&["tenant:admin"], Some(other.parse().expect("uuid")));
    let foreign = lab.app.get(path.as_str()).token(&other_admin).send().await.problem(404, "not_found");
    let own_path = format!("/v1/tenants/{other}/clusters/{cluster}/kubeconfig");
    let not_there = lab.app.get(own_path).token(&other_admin).send().await.problem(404, "not_found");
    assert_eq!(foreign["detail"], not_there["detail"]);
    // Refusals are audited too.
    let failures = lab.audited("failure").await;
    assert!(failures.iter().filter(|e| e["code"] == "forbidden").count() >= 6, "{failures:?}");
    assert!(failures.iter().any(|e| e["code"] == "not_found"), "{failures:?}");
    assert!(lab.audited("success").await.is_empty());
}

#[tokio::test]
async fn a_cluster_without_a_control_plane_is_not_ready_and_the_ttl_is_checked() {
    let lab = Lab::new().await;
    // No worker yet: nothing is built.
    let pending = lab.create("pending").await;
    let problem =
        lab.app.get(lab.path(&pending)).token(&lab.admin_token).send().await.problem(409, "cluster_not_ready");
    assert!(problem["detail"].as_str().is_some_and(|d| d.contains("control plane")), "{problem}");

    lab.start_worker();
    lab.control_plane_ready(&pending).await;
    let path = lab.path(&pending);
    for bad in ["90000", "86401", "599", "0", "-5"] {
        let resp = lab.app.get(format!("{path}?ttl={bad}")).token(&lab.admin_token).send().await;
        let problem = resp.problem(422, "validation_failed");
        assert_eq!(problem["errors"][0]["field"], "ttl", "{problem}");
    }
    for bad in ["abc", "1.5", "8h", ""] {
        lab.app.get(format!("{path}?ttl={bad}")).token(&lab.admin_token).send().await.problem(400, "invalid_parameter");
    }
    lab.app.get(format!("{path}?ttl=86400")).token(&lab.admin_token).send().await.expect(200);
    lab.app.get(format!("{path}?ttl=600")).token(&lab.admin_token).send().await.expect(200);
}

#[tokio::test]
async fn without_a_cluster_driver_the_answer_is_driver_not_configured() {
    // The plain test app: PADDOCK_KUBE_DRIVER=none.
    let app = TestApp::new().await;
    let t = id(&tenant(&app, "acme").await);
    machine_class(&app, "gpu", 8).await;
    crate::common::fleet(&app, "gpu", 1).await;
    let body = json!({
        "name": "hpc", "kind": "kubernetes", "isolation": "private-nodes",
        "node_pools": [{ "name": "gpu", "machine_class": "gpu", "count": 1 }]
    });
    let created = app.post(format!("/v1/tenants/{t}/clusters")).token(&admin()).json(&body).send().await.expect(202);
    let cluster = id(&created.json()["cluster"]);
    let path = format!("/v1/tenants/{t}/clusters/{cluster}/kubeconfig");
    app.get(path).token(&admin()).send().await.problem(409, "driver_not_configured");
}
