//! Operations as a portal shows them: each operation's whole step plan from the moment it is
//! accepted (every step pending), then its steps in the order they ran, with times inside the
//! operation's lifetime; a delete's own steps; an enrollment the BMC refuses ends `failed` at its
//! `inspect` step with the BMC's problem. The worker runs in-process on the simulated
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

fn names(op: &Value) -> Vec<String> {
    let steps = op["steps"].as_array().unwrap_or_else(|| panic!("no steps: {op}"));
    steps.iter().map(|s| s["name"].as_str().expect("name").to_owned()).collect()
}

/// The step names of an operation as it was accepted (a 202's): its whole plan, every step
/// pending, none started.
fn planned(op: &Value) -> Vec<String> {
    for s in op["steps"].as_array().expect("steps") {
        assert_eq!(s["state"], "pending", "{op}");
        assert!(s["started_at"].is_null() && s["finished_at"].is_null(), "{op}");
    }
    names(op)
}

/// An operation read right after its request: every step of `plan`, in order, pending, or (the
/// worker is quick) the first ones done, then at most one running, then the rest pending.
fn early(op: &Value, plan: &[&str]) {
    assert_eq!(names(op), plan, "{op}");
    let rank = |s: &Value| match s["state"].as_str() {
        Some("succeeded") => 0,
        Some("running") => 1,
        Some("pending") => 2,
        _ => panic!("unexpected step state: {op}"),
    };
    let ranks: Vec<i32> = op["steps"].as_array().expect("steps").iter().map(rank).collect();
    assert!(ranks.windows(2).all(|w| w[0] <= w[1] && !(w[0] == 1 && w[1] == 1)), "steps out of order: {op}");
}

#[tokio::test]
async fn an_enrollment_lists_its_plan_at_once_and_ends_with_every_step_succeeded() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    let created = lab.enroll("gpu", "e1").await;
    let plan = ["inspect", "record_inventory", "clean", "available"];
    assert_eq!(planned(&created["operation"]), plan);
    early(&lab.operation(&created["operation"]).await, &plan);
    let op = lab.ended(&created["operation"], "succeeded").await;
    assert_eq!(finished_steps(&op), plan);
}

#[tokio::test]
async fn maintenance_lists_its_plan_entering_and_leaving() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    let machine = lab.enroll("gpu", "m1").await;
    lab.ended(&machine["operation"], "succeeded").await;
    let path = format!("/v1/machines/{}/maintenance", id(&machine["machine"]));

    let body = json!({ "reason": "replace DIMM B2" });
    let entered = lab.app.post(&path).token(&admin()).json(&body).send().await.expect(202).json();
    let plan = ["power_off", "maintenance"];
    assert_eq!(planned(&entered["operation"]), plan);
    early(&lab.operation(&entered["operation"]).await, &plan);
    let op = lab.ended(&entered["operation"], "succeeded").await;
    assert_eq!(finished_steps(&op), plan);

    let left = lab.app.delete(&path).token(&admin()).send().await.expect(202).json();
    let plan = ["clean", "available"];
    assert_eq!(planned(&left["operation"]), plan);
    early(&lab.operation(&left["operation"]).await, &plan);
    let op = lab.ended(&left["operation"], "succeeded").await;
    assert_eq!(finished_steps(&op), plan);
}

#[tokio::test]
async fn maintenance_of_a_machine_serving_a_cluster_releases_it_first() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    let machine = lab.enroll("gpu", "h1").await;
    lab.ended(&machine["operation"], "succeeded").await;
    let body = json!({ "name": "k", "kind": "kubernetes", "isolation": "private-nodes",
                       "node_pools": [{ "name": "gpu", "machine_class": "gpu", "count": 1 }] });
    let path = format!("/v1/tenants/{}/clusters", lab.tenant);
    let created = lab.app.post(path).token(&lab.tenant_token).json(&body).send().await.expect(202).json();
    lab.ended(&created["operation"], "succeeded").await;

    let path = format!("/v1/machines/{}/maintenance", id(&machine["machine"]));
    let body = json!({ "reason": "replace DIMM B2" });
    let entered = lab.app.post(&path).token(&admin()).json(&body).send().await.expect(202).json();
    let plan = ["release", "power_off", "maintenance"];
    assert_eq!(planned(&entered["operation"]), plan);
    let op = lab.ended(&entered["operation"], "succeeded").await;
    assert_eq!(finished_steps(&op), plan);
}

#[tokio::test]
async fn a_cluster_update_lists_the_reconcilers_steps_and_ends_with_each_succeeded() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("gpu", &["u1", "u2"]).await;
    let body = json!({ "name": "hpc", "kind": "slurm", "isolation": "private-nodes",
                       "node_pools": [{ "name": "gpu", "machine_class": "gpu", "count": 2, "role": "system" }] });
    let path = format!("/v1/tenants/{}/clusters", lab.tenant);
    let created = lab.app.post(path).token(&lab.tenant_token).json(&body).send().await.expect(202).json();
    let plan = ["namespace", "control_plane", "machines", "nodes", "stack", "slurm"];
    assert_eq!(planned(&created["operation"]), plan);
    lab.ended(&created["operation"], "succeeded").await;

    let patch = json!({ "slurm": { "login": { "replicas": 2 } } });
    let path = lab.cluster_path(&id(&created["cluster"]));
    let updated = lab.app.patch(path).token(&lab.tenant_token).json(&patch).send().await.expect(202).json();
    assert_eq!(updated["operation"]["kind"], "cluster_update");
    assert_eq!(planned(&updated["operation"]), plan);
    early(&lab.operation(&updated["operation"]).await, &plan);
    let op = lab.ended(&updated["operation"], "succeeded").await;
    assert_eq!(finished_steps(&op), plan);
}

#[tokio::test]
async fn a_create_a_scale_and_a_delete_each_show_their_own_steps_in_the_order_they_ran() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("gpu", &["s1", "s2", "s3"]).await;
    let body = json!({ "name": "hpc", "kind": "slurm", "isolation": "private-nodes",
                       "node_pools": [{ "name": "gpu", "machine_class": "gpu", "count": 2, "role": "system" }] });
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
async fn an_enrollment_the_bmc_refuses_fails_at_inspect_with_bmc_auth_failed() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.world.set_machine_fault("locked", MachineFault::AuthFails, true).await.expect("fault");
    let created = lab.enroll("gpu", "locked").await;
    assert_eq!(planned(&created["operation"]), ["inspect", "record_inventory", "clean", "available"]);
    let op = lab.ended(&created["operation"], "failed").await;
    assert_eq!(op["error"]["code"], "bmc_auth_failed", "{op}");
    // The step the BMC refused ended `failed`; the steps it never reached stay pending.
    let inspect = &op["steps"][0];
    assert_eq!((&inspect["name"], &inspect["state"]), (&json!("inspect"), &json!("failed")), "{op}");
    let (start, end) = (time(&inspect["started_at"]), time(&inspect["finished_at"]));
    assert!(time(&op["created_at"]) <= start && start <= end && end <= time(&op["finished_at"]), "{op}");
    for s in &op["steps"].as_array().expect("steps")[1..] {
        assert_eq!(s["state"], "pending", "{op}");
    }
    assert_eq!(op["error"]["instance"], format!("/v1/operations/{}", id(&created["operation"])));
    // A machine that answers completes its own enrollment.
    let fine = lab.enroll("gpu", "fine").await;
    lab.ended(&fine["operation"], "succeeded").await;
}
