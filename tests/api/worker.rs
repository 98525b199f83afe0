//! The worker runs the reconcile jobs the API enqueues. With the drivers set to `none`, a machine shows
//! `driver_not_configured` and a cluster a `Ready=False` condition, the job waits (its attempts
//! untouched), and the machine's operation is running: docs/configuration.md for a driver set to `none`.

use std::sync::Arc;
use std::time::Duration;

use paddock_testkit::{admin, eventually, token, TestApp};
use paddock_worker::reconcile::{ClusterReconciler, Drivers, MachineReconciler, Settings};
use paddock_worker::{JobHandler, Worker, WorkerConfig};
use serde_json::json;

use crate::common::{id, machine, machine_class, tenant};

#[tokio::test]
async fn without_drivers_jobs_wait_with_driver_not_configured() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let m = machine(&app, "node-1", "gpu").await;
    let t = tenant(&app, "acme").await;
    let tenant_token = token(&["tenant:admin"], Some(id(&t).parse().expect("uuid")));
    let created = app
        .post(format!("/v1/tenants/{}/clusters", id(&t)))
        .token(&tenant_token)
        .json(&json!({ "name": "k8s", "kind": "kubernetes", "isolation": "private-nodes" }))
        .send()
        .await
        .expect(202)
        .json();

    let store = app.services.store().clone();
    let (services, none) = (app.services.clone(), Drivers::default());
    let handlers: Vec<Arc<dyn JobHandler>> = vec![
        Arc::new(MachineReconciler::new(services.clone(), none.clone(), Settings::default())),
        Arc::new(ClusterReconciler::new(services, none, Settings::default())),
    ];
    let config = WorkerConfig { poll_interval: Duration::from_millis(50), ..WorkerConfig::default() };
    let worker = Worker::new(store, "test-worker", handlers, config).expect("worker");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        worker
            .run(async move {
                let _ = stopped.await;
            })
            .await
    });

    let machine_path = format!("/v1/machines/{}", id(&m));
    let seen = eventually(Duration::from_secs(20), || async {
        let body = app.get(&machine_path).token(&admin()).send().await.expect(200).json();
        (body["last_error"]["code"] == "driver_not_configured").then_some(body)
    })
    .await;
    assert_eq!(seen["state"], "enrolling", "nothing moves without a driver");
    let cluster_path = format!("/v1/tenants/{}/clusters/{}", id(&t), id(&created["cluster"]));
    let cluster = eventually(Duration::from_secs(20), || async {
        let body = app.get(&cluster_path).token(&tenant_token).send().await.expect(200).json();
        let waiting = body["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["reason"] == "DriverNotConfigured"));
        waiting.then_some(body)
    })
    .await;
    assert_eq!(cluster["status"]["conditions"][0]["status"], "False");
    assert_eq!(cluster["generation"], 1, "status writes never change the etag");

    let operations =
        app.get(format!("/v1/operations?target_id={}", id(&m))).token(&admin()).send().await.expect(200).json();
    assert_eq!(operations["items"][0]["state"], "running");
    // Polled: on a loaded machine the job may be between two runs of the worker when first read.
    let (attempts, code): (i32, Option<String>) = eventually(Duration::from_secs(20), || async {
        sqlx::query_as("select attempts, last_error->>'code' from jobs where target_id = $1::uuid and state = 'queued'")
            .bind(id(&m))
            .fetch_optional(&app.db.pool)
            .await
            .expect("reading the machine's job")
    })
    .await;
    assert_eq!((attempts, code.as_deref()), (0, Some("driver_not_configured")), "waiting uses no attempt");

    let _ = stop.send(());
    run.await.expect("the worker stops");
}
