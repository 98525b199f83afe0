//! Operations as a portal shows them: each operation's own steps in the order
//! they ran, with times inside the operation's lifetime; a delete's own steps; an enrollment the
//! BMC refuses ends `failed` with the BMC's problem. The worker runs in-process on the simulated
//! drivers, as in `lifecycle.rs`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use paddock_sim::{MachineFault, SimConfig, SimWorld};
use paddock_store::Store;
use paddock_testkit::{admin, eventually, token, TestApp};
use paddock_worker::reconcile::{Drivers, Settings};
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::common::{id, lab_settings, lab_worker_config, machine_class, run_worker, tenant};

const WAIT: Duration = Duration::from_secs(60);

struct Lab {
    app: TestApp,
    world: SimWorld,
    stop: watch::Sender<bool>,
    tenant: String,
    tenant_token: String,
}

impl Lab {
    async fn new() -> Lab {
        let app = TestApp::served().await;
        let world = SimWorld::new(Store::from_pool(app.db.pool.clone()), SimConfig::zero());
        let drivers = Drivers { bmc: Some(world.bmc()), kube: Some(world.kube()) };
        let settings = Settings { outage_wait: Duration::from_secs(1), ..lab_settings() };
        let (stop, _) = run_worker(&app, &world, drivers, settings, lab_worker_config(), "ops-worker");
        let t = tenant(&app, "acme").await;
        let tenant_token = token(&["tenant:admin"], Some(id(&t).parse().expect("uuid")));
        Lab { app, world, stop, tenant: id(&t), tenant_token }
    }

    /// Enrolls `sim://<name>`; returns the 202's body.
    async fn enroll(&self, class: &str, name: &str) -> Value {
        let body = json!({
            "name": name, "machine_class": class,
            "bmc": { "url": format!("sim://{name}"), "username": "admin", "password": "simulated" }
        });
        self.app.post("/v1/machines").token(&admin()).json(&body).send().await.expect(202).json()
    }

    async fn available(&self, class: &str, names: &[&str]) {
        for name in names {
            let created = self.enroll(class, name).await;
            self.ended(&created["operation"], "succeeded").await;
        }
    }

    fn cluster_path(&self, cluster: &str) -> String {
        format!("/v1/tenants/{}/clusters/{cluster}", self.tenant)
    }

    /// The tenant view's `quota_use`, as the tenant reads it.
    async fn quota_use(&self) -> Value {
        let path = format!("/v1/tenants/{}", self.tenant);
        let t: Value = self.app.get(path).token(&self.tenant_token).send().await.expect(200).json();
        t["quota_use"].clone()
    }

    async fn operation(&self, op: &Value) -> Value {
        self.app.get(format!("/v1/operations/{}", id(op))).token(&admin()).send().await.expect(200).json()
    }

    /// Waits until the operation is in `state`, which must be where it ends.
    async fn ended(&self, op: &Value, state: &str) -> Value {
        let done = eventually(WAIT, || async {
            let o = self.operation(op).await;
            (o["finished_at"].is_string()).then_some(o)
        })
        .await;
        assert_eq!(done["state"], state, "{done}");
        done
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

fn time(v: &Value) -> DateTime<Utc> {
    v.as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("not a time: {v}"))
}

/// The step names of a finished operation, after checking that every step succeeded, each
/// started before it finished, no earlier than the step before it, and all within the
/// operation's own lifetime.
fn finished_steps(op: &Value) -> Vec<String> {
    let (created, finished) = (time(&op["created_at"]), time(&op["finished_at"]));
    let mut previous_end = created;
    let steps = op["steps"].as_array().expect("steps");
    for s in steps {
        assert_eq!(s["state"], "succeeded", "{op}");
        let (start, end) = (time(&s["started_at"]), time(&s["finished_at"]));
        assert!(previous_end <= start && start <= end && end <= finished, "step times out of order: {op}");
        previous_end = end;
    }
    assert!(op["current_step"].is_null(), "{op}");
    steps.iter().map(|s| s["name"].as_str().expect("name").to_owned()).collect()
}

#[tokio::test]
async fn a_create_a_scale_and_a_delete_each_show_their_own_steps_in_the_order_they_ran() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("gpu", &["s1", "s2", "s3"]).await;
    let body = json!({ "name": "hpc", "kind": "slurm", "isolation": "private-nodes",
                       "node_pools": [{ "name": "gpu", "machine_class": "gpu", "count": 2 }] });
    let path = format!("/v1/tenants/{}/clusters", lab.tenant);
    let created = lab.app.post(path).token(&lab.tenant_token).json(&body).send().await.expect(202).json();
    let cluster = id(&created["cluster"]);
    let pool = id(&created["cluster"]["node_pools"][0]);
    assert_eq!(lab.quota_use().await, json!({ "clusters": 1, "nodes": 2, "gpus": 16 }));
    let create = lab.ended(&created["operation"], "succeeded").await;
    assert_eq!(finished_steps(&create), ["namespace", "control_plane", "machines", "nodes", "stack", "slurm"]);

    let pool_path = format!("{}/node-pools/{pool}", lab.cluster_path(&cluster));
    let scaled =
        lab.app.patch(pool_path).token(&lab.tenant_token).json(&json!({ "count": 3 })).send().await.expect(202).json();
    assert_eq!(lab.quota_use().await, json!({ "clusters": 1, "nodes": 3, "gpus": 24 }));
    let scale = lab.ended(&scaled["operation"], "succeeded").await;
    let steps = finished_steps(&scale);
    assert_eq!(steps[..2], ["machines", "nodes"], "{scale}");
    assert!(!steps.iter().any(|s| s == "namespace" || s == "control_plane"), "the create's steps: {scale}");
    assert!(time(&scale["steps"][0]["started_at"]) >= time(&scale["created_at"]));

    let deleted = lab.app.delete(lab.cluster_path(&cluster)).token(&lab.tenant_token).send().await.expect(202).json();
    assert_eq!(lab.quota_use().await, json!({ "clusters": 0, "nodes": 0, "gpus": 0 }), "a deletion frees it");
    let delete = lab.ended(&deleted["operation"], "succeeded").await;
    assert_eq!(
        finished_steps(&delete),
        ["remove_slurm", "release_machines", "delete_control_plane", "delete_namespace"]
    );
}

#[tokio::test]
async fn an_enrollment_the_bmc_refuses_fails_with_bmc_auth_failed() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.world.set_machine_fault("locked", MachineFault::AuthFails, true).await.expect("fault");
    let created = lab.enroll("gpu", "locked").await;
    let op = lab.ended(&created["operation"], "failed").await;
    assert_eq!(op["error"]["code"], "bmc_auth_failed", "{op}");
    assert_eq!(op["error"]["instance"], format!("/v1/operations/{}", id(&created["operation"])));
    // A machine that answers completes its own enrollment.
    let fine = lab.enroll("gpu", "fine").await;
    lab.ended(&fine["operation"], "succeeded").await;
}
