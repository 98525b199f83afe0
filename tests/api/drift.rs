//! Drift checks at rest (`PADDOCK_DRIFT_INTERVAL`) through the API, on the simulated
//! drivers: a ready cluster gets a queued drift check, which runs, writes nothing while nothing
//! changed and queues itself again; what changed behind paddock's back in the (simulated) tenant
//! cluster is restored and named in the cluster's events; with the interval at zero no check is
//! ever queued. The real drivers' side (what they read, compare and apply on real API servers) is
//! in paddock-kube's tests (`isolation::ensure_isolation_restores_...`, `stack::`, `slurm::`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use paddock_sim::{SimConfig, SimWorld};
use paddock_store::Store;
use paddock_testkit::{admin, eventually, token, TestApp};
use paddock_worker::reconcile::{Drivers, Settings};
use serde_json::{json, Value};
use tokio::sync::watch;
use uuid::Uuid;

use crate::common::{id, lab_settings, lab_worker_config, machine_class, run_worker, tenant};

const WAIT: Duration = Duration::from_secs(60);

struct Lab {
    app: TestApp,
    _stop: watch::Sender<bool>,
    tenant: String,
    token: String,
}

impl Lab {
    async fn new(drift_interval: Duration) -> Lab {
        let app = TestApp::served().await;
        let world = SimWorld::new(Store::from_pool(app.db.pool.clone()), SimConfig::zero());
        let drivers = Drivers { bmc: Some(world.bmc()), kube: Some(world.kube()) };
        let settings = Settings { drift_interval, outage_wait: Duration::from_secs(1), ..lab_settings() };
        let (stop, _) = run_worker(&app, &world, drivers, settings, lab_worker_config(), "drift-worker");
        let t = tenant(&app, "acme").await;
        let token = token(&["tenant:admin"], Some(id(&t).parse().expect("uuid")));
        machine_class(&app, "cpu", 0).await;
        for name in ["d1", "d2"] {
            let body = json!({ "name": name, "machine_class": "cpu",
                "bmc": { "url": format!("sim://{name}"), "username": "admin", "password": "simulated" } });
            app.post("/v1/machines").token(&admin()).json(&body).send().await.expect(202);
        }
        Lab { app, _stop: stop, tenant: id(&t), token }
    }

    /// A Slurm cluster of two nodes, waited for until ready; its id.
    async fn ready_cluster(&self) -> String {
        let body = json!({ "name": "hpc", "kind": "slurm", "isolation": "private-nodes",
            "node_pools": [{ "name": "cpu", "machine_class": "cpu", "count": 2, "role": "system" }] });
        let path = format!("/v1/tenants/{}/clusters", self.tenant);
        let created = self.app.post(path).token(&self.token).json(&body).send().await.expect(202).json();
        let cluster = id(&created["cluster"]);
        self.ready(&cluster).await;
        cluster
    }

    async fn ready(&self, cluster: &str) -> Value {
        let path = format!("/v1/tenants/{}/clusters/{cluster}", self.tenant);
        eventually(WAIT, || async {
            let c = self.app.get(&path).token(&self.token).send().await.expect(200).json();
            (c["status"]["phase"] == "ready" && c["status"]["observed_generation"] == c["generation"]).then_some(c)
        })
        .await
    }

    async fn events(&self, cluster: &str) -> Vec<Value> {
        let path = format!("/v1/tenants/{}/clusters/{cluster}/events", self.tenant);
        let events = self.app.get(path).token(&self.token).send().await.expect(200).json();
        events["items"].as_array().expect("items").clone()
    }

    /// The cluster's queued drift check: (run_at, last_error code), if there is one.
    async fn drift_job(&self, cluster: &str) -> Option<(DateTime<Utc>, Option<String>)> {
        sqlx::query_as(
            "select run_at, last_error->>'code' from jobs \
             where target_id = $1 and kind = 'cluster_drift_check' and state = 'queued'",
        )
        .bind(Uuid::parse_str(cluster).expect("uuid"))
        .fetch_optional(&self.app.db.pool)
        .await
        .expect("drift job")
    }

    /// Waits until the drift check has run once more after `after` (it is queued again, later).
    async fn checked_after(&self, cluster: &str, after: DateTime<Utc>) -> DateTime<Utc> {
        eventually(WAIT, || async {
            match self.drift_job(cluster).await {
                Some((run_at, Some(code))) if run_at > after && code == "at_rest" => Some(run_at),
                _ => None,
            }
        })
        .await
    }

    /// The cluster's status row: (status_version, updated_at).
    async fn status_row(&self, cluster: &str) -> (i64, DateTime<Utc>) {
        sqlx::query_as("select status_version, updated_at from clusters where id = $1")
            .bind(Uuid::parse_str(cluster).expect("uuid"))
            .fetch_one(&self.app.db.pool)
            .await
            .expect("cluster row")
    }
}

#[tokio::test]
async fn a_ready_cluster_is_checked_again_and_again_writing_nothing_and_drift_is_restored_and_told() {
    let lab = Lab::new(Duration::from_secs(1)).await;
    let cluster = lab.ready_cluster().await;
    let (armed, _) = lab.drift_job(&cluster).await.expect("the ready cluster's drift check is queued");
    let row = lab.status_row(&cluster).await;
    let events = lab.events(&cluster).await.len();

    // Two checks of a cluster that did not change: nothing written, nothing told.
    let first = lab.checked_after(&cluster, armed).await;
    lab.checked_after(&cluster, first).await;
    assert_eq!(lab.status_row(&cluster).await, row, "a check that finds nothing writes nothing");
    assert_eq!(lab.events(&cluster).await.len(), events);

    // Behind paddock's back: the tenant cluster's base stack and Slurm are gone.
    sqlx::query(
        "update paddock_sim.clusters set stack_applied_at = null, slurm_applied_at = null, slurm_pools = null \
         where cluster_id = $1",
    )
    .bind(Uuid::parse_str(&cluster).expect("uuid"))
    .execute(&lab.app.db.pool)
    .await
    .expect("drift");
    let told =
        eventually(WAIT, || async { lab.events(&cluster).await.into_iter().find(|e| e["reason"] == "DriftCorrected") })
            .await;
    assert_eq!(told["type"], "Warning", "{told}");
    let message = told["message"].as_str().expect("message");
    let stack = format!("stack {}", paddock_domain::stack::latest_version());
    assert!(message.contains(&stack) && message.contains("Slurm of cluster"), "{message}");
    lab.ready(&cluster).await;
    let (again, _) = eventually(WAIT, || lab.drift_job(&cluster)).await;
    lab.checked_after(&cluster, again).await;
    let drifts = lab.events(&cluster).await.iter().filter(|e| e["reason"] == "DriftCorrected").count();
    assert_eq!(drifts, 1, "restored once, then at rest again");
}

#[tokio::test]
async fn with_the_drift_interval_at_zero_no_check_is_queued() {
    let lab = Lab::new(Duration::ZERO).await;
    let cluster = lab.ready_cluster().await;
    // A check is armed in the transaction that makes the cluster ready (the test above finds it
    // queued at once); wait until the worker is done with the cluster, so that no pass is left
    // that could still arm one, then look for a check in any state.
    let busy = "select count(*) from jobs where target_id = $1 and state in ('queued', 'running') \
                and kind <> 'cluster_drift_check'";
    let target = Uuid::parse_str(&cluster).expect("uuid");
    eventually(WAIT, || async {
        let open: i64 = sqlx::query_scalar(busy).bind(target).fetch_one(&lab.app.db.pool).await.expect("jobs");
        (open == 0).then_some(())
    })
    .await;
    let checks: i64 =
        sqlx::query_scalar("select count(*) from jobs where target_id = $1 and kind = 'cluster_drift_check'")
            .bind(target)
            .fetch_one(&lab.app.db.pool)
            .await
            .expect("drift checks");
    assert_eq!(checks, 0, "a drift check was queued with the interval at zero");
}
