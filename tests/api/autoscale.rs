//! Elastic pools through the API: the contract of `autoscaling` (targets in status, quotas
//! against `max`, `count` the autoscaler's), and the autoscaler on the SIMULATED drivers (its
//! demand knob stands for slurmrestd and the tenant's scheduler): pools grow with demand within
//! max and quota, shrink to zero after the delay with machines wiped and usage ended at their
//! power-off, wait in line first come first served, do not thrash, and survive killed workers.

use std::sync::Arc;
use std::time::Duration;

use paddock_domain::driver::{
    BoxFuture, Drain, DriverError, JoinConfig, NodeRef, NodeStatus, RegisteredNode, Removal, TenantAccess, TenantNodes,
};
use paddock_service::agent::AgentSettings;
use paddock_service::Services;
use paddock_sim::{SimConfig, SimDemand, SimWorld};
use paddock_testkit::{admin, eventually, token, TestApp};
use paddock_types::ClusterId;
use paddock_worker::reconcile::{Drivers, Settings};
use serde_json::{json, Value};

use crate::common::{fleet, id, lab_settings, lab_worker_config, machine_class, tenant};
use crate::lifecycle::{cluster_path, condition, pool_named, slurm, Lab, Seat};

const WAIT: Duration = Duration::from_secs(90);

/// A lab whose demand checks run every 100 ms.
async fn elastic_lab() -> Lab {
    Lab::tuned(|s| s.autoscale_interval = Duration::from_millis(100), |d| d).await
}

/// A Slurm cluster with a system pool of one and the autoscaled compute pool `work`.
fn elastic_slurm(name: &str, count: u32, autoscaling: Value) -> Value {
    slurm(
        name,
        json!([
            { "name": "sys", "machine_class": "gpu", "count": 1, "role": "system" },
            { "name": "work", "machine_class": "gpu", "count": count, "autoscaling": autoscaling },
        ]),
    )
}

/// A `kubernetes` cluster with the one autoscaled pool `work` of class `cpu`.
fn elastic_kubernetes(name: &str, max: u32) -> Value {
    json!({ "name": name, "kind": "kubernetes", "isolation": "private-nodes", "node_pools": [
        { "name": "work", "machine_class": "cpu", "count": 0,
          "autoscaling": { "min": 0, "max": max, "scale_down_delay_seconds": 3600 } } ] })
}

async fn pool_of(lab: &Lab, seat: &Seat, cluster: &str, pool: &str) -> Value {
    let path = format!("{}/node-pools/{pool}", cluster_path(seat, cluster));
    lab.app.get(path).token(&seat.token).send().await.expect(200).json()
}

/// Waits until the pool's target is `target` and it holds exactly that many ready machines.
async fn pool_at(lab: &Lab, seat: &Seat, cluster: &str, pool: &str, target: u64) -> Value {
    eventually(WAIT, || async {
        let p = pool_of(lab, seat, cluster, pool).await;
        let s = &p["status"];
        let held = lab.scalar(&format!("select count(*) from machines where node_pool_id = '{pool}'")).await;
        let at = s["desired_count"] == target && s["ready"] == target && s["allocated"] == target;
        (at && held == i64::try_from(target).expect("small")).then_some(p)
    })
    .await
}

async fn demand(lab: &Lab, cluster: &str, pending_jobs: u32, pending_nodes: u32, busy_nodes: u32) {
    let cluster = ClusterId(cluster.parse().expect("uuid"));
    let knob = SimDemand { pending_jobs, pending_nodes, busy_nodes, ..SimDemand::default() };
    lab.world.set_demand(cluster, "work", knob).await.expect("demand knob");
}

/// The pool's scaling operations, oldest first: (state, reason).
async fn scalings(lab: &Lab, pool: &str) -> Vec<(String, String)> {
    sqlx::query_as(
        "select state, coalesce(reason, '') from operations where target_id = $1 and kind = 'node_pool_scale' \
         order by created_at, id",
    )
    .bind(uuid::Uuid::parse_str(pool).expect("uuid"))
    .fetch_all(&lab.app.db.pool)
    .await
    .expect("operations")
}

async fn events(lab: &Lab, cluster: &str, reason: &str) -> Vec<String> {
    let page = lab.app.get(format!("{}/events?limit=1000", lab.cluster_path(cluster))).token(&lab.tenant_token);
    let page = page.send().await.expect(200).json();
    let items = page["items"].as_array().expect("items").iter();
    items.filter(|e| e["reason"] == reason).map(|e| e["message"].as_str().unwrap_or_default().to_owned()).collect()
}

#[tokio::test]
async fn an_elastic_pool_grows_with_pending_jobs_within_max_and_shrinks_to_zero_after_the_delay() {
    let lab = elastic_lab().await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("gpu", &["e1", "e2", "e3", "e4"]).await;
    let created =
        lab.create(elastic_slurm("elastic", 0, json!({ "min": 0, "max": 2, "scale_down_delay_seconds": 2 }))).await;
    let (cluster, seat) = (id(&created["cluster"]), lab.own());
    let pool = pool_named(&created["cluster"], "work");
    lab.ready(&cluster).await;
    let before = pool_at(&lab, &seat, &cluster, &pool, 0).await;
    let defaults = json!({ "min": 0, "max": 2, "scale_down_delay_seconds": 2, "scale_up_delay_seconds": 0 });
    assert_eq!(before["autoscaling"], defaults, "{before}");

    // Three jobs ask for five nodes: the pool grows to its max, the rest stays pending.
    demand(&lab, &cluster, 3, 5, 0).await;
    let grown = pool_at(&lab, &seat, &cluster, &pool, 2).await;
    assert_eq!(
        (&grown["generation"], &grown["etag"], &grown["count"]),
        (&before["generation"], &before["etag"], &before["count"])
    );
    let ready = lab.ready(&cluster).await;
    let summary = ready["node_pools"].as_array().expect("pools").iter().find(|p| p["name"] == "work").cloned();
    assert_eq!(summary.expect("work")["desired_count"], 2);
    let ops = eventually(WAIT, || async {
        let ops = scalings(&lab, &pool).await;
        ops.iter().all(|(state, _)| state == "succeeded").then_some(ops)
    })
    .await;
    assert_eq!(ops, [("succeeded".to_owned(), "scale_up: 3 pending jobs need 5 nodes (capped at max 2)".to_owned())]);
    let up = events(&lab, &cluster, "NodePoolScaledUp").await;
    assert_eq!(
        up,
        ["node pool work grows from 0 to 2 machines: scale_up: 3 pending jobs need 5 nodes (capped at max 2)"]
    );

    // The jobs run, then end: after the delay the idle pool shrinks to its min, zero.
    demand(&lab, &cluster, 0, 0, 0).await;
    pool_at(&lab, &seat, &cluster, &pool, 0).await;
    lab.ready(&cluster).await;
    eventually(WAIT, || async {
        (lab.scalar("select count(*) from machines where state = 'available'").await == 3).then_some(())
    })
    .await;
    let ops = eventually(WAIT, || async {
        let ops = scalings(&lab, &pool).await;
        (ops.len() == 2 && ops[1].0 == "succeeded").then_some(ops)
    })
    .await;
    assert!(ops[1].1.starts_with("scale_down: idle ") && ops[1].1.ends_with(" s"), "{ops:?}");
    // Billing stopped at each released machine's power-off (the end of its release).
    let segments = format!("select count(*) from usage_segments where node_pool_id = '{pool}'");
    assert_eq!(lab.scalar(&segments).await, 2);
    let at_power_off = lab
        .scalar(&format!(
            "{segments} and exists (select 1 from custody_entries e where e.machine_id = usage_segments.machine_id \
               and e.from_state = 'releasing' and e.to_state = 'cleaning' \
               and end_at >= date_trunc('second', e.at) and end_at <= e.at + interval '1 second')"
        ))
        .await;
    assert_eq!(at_power_off, 2, "each segment ends at its machine's power-off");
    lab.check_invariants().await;
}

/// The sweep job's `updated_at` (every run ends by queueing it again).
async fn sweep_runs(lab: &Lab) -> Option<chrono::DateTime<chrono::Utc>> {
    sqlx::query_scalar("select max(updated_at) from jobs where kind = 'cluster_autoscale' and target_type = 'fleet'")
        .fetch_one(&lab.app.db.pool)
        .await
        .expect("the sweep")
}

/// At rest one sweep watches every elastic pool: a cluster's own check runs only when a decision
/// would write, so a pool without demand has none queued or running once it is ready, however
/// many sweeps pass; demand arms it again.
#[tokio::test]
async fn at_rest_the_sweep_watches_and_no_cluster_check_runs() {
    let lab = elastic_lab().await;
    machine_class(&lab.app, "cpu", 0).await;
    lab.available("cpu", &["r1"]).await;
    let created = lab.create(elastic_kubernetes("calm", 1)).await;
    let (cluster, seat) = (id(&created["cluster"]), lab.own());
    let pool = pool_named(&created["cluster"], "work");
    lab.ready(&cluster).await;
    let own = format!(
        "select count(*) from jobs where target_id = '{cluster}' and kind = 'cluster_autoscale' \
         and state in ('queued', 'running')"
    );
    eventually(WAIT, || async { (count(&lab.app, &own).await == 0).then_some(()) }).await;
    // Sweeps after that (each run moves the job twice: claimed, queued again): none of them armed
    // the cluster's check.
    let mut seen = sweep_runs(&lab).await;
    for _ in 0..4 {
        seen = Some(eventually(WAIT, || async { sweep_runs(&lab).await.filter(|at| Some(*at) > seen) }).await);
        assert_eq!(count(&lab.app, &own).await, 0, "a sweep at rest armed the cluster's check");
    }
    assert!(scalings(&lab, &pool).await.is_empty());
    // Demand: a sweep arms the cluster's check, which grows the pool.
    demand(&lab, &cluster, 1, 1, 0).await;
    pool_at(&lab, &seat, &cluster, &pool, 1).await;
}

#[tokio::test]
async fn a_scaling_never_moves_the_spec_and_count_is_the_autoscalers() {
    let app = TestApp::served().await;
    machine_class(&app, "gpu", 8).await;
    fleet(&app, "gpu", 4).await;
    let t = tenant(&app, "acme").await;
    let seat = Seat { tenant: id(&t), token: token(&["tenant:admin"], Some(id(&t).parse().expect("uuid"))) };
    let path = format!("/v1/tenants/{}/clusters", seat.tenant);
    // The system pool is never autoscaled.
    let mut body = elastic_slurm("c", 1, json!({ "min": 0, "max": 2 }));
    body["node_pools"][0]["autoscaling"] = json!({ "min": 1, "max": 2 });
    app.post(&path).token(&seat.token).json(&body).send().await.problem(422, "system_pool_autoscaled");
    // The initial size lies within the bounds, and min <= max.
    let outside = elastic_slurm("c", 3, json!({ "min": 0, "max": 2 }));
    app.post(&path).token(&seat.token).json(&outside).send().await.problem(422, "validation_failed");
    let inverted = elastic_slurm("c", 1, json!({ "min": 3, "max": 2 }));
    app.post(&path).token(&seat.token).json(&inverted).send().await.problem(422, "validation_failed");
    // Quotas count max.
    let quotas = json!({ "quotas": { "max_clusters": null, "max_nodes": 3, "max_gpus": null } });
    app.patch(format!("/v1/tenants/{}", seat.tenant)).token(&admin()).json(&quotas).send().await.expect(200);
    let over = elastic_slurm("c", 0, json!({ "min": 0, "max": 3 }));
    app.post(&path).token(&seat.token).json(&over).send().await.problem(409, "quota_exceeded");
    let created = app.post(&path).token(&seat.token).json(&elastic_slurm("c", 1, json!({ "min": 0, "max": 2 })));
    let created = created.send().await.expect(202).json();
    let pool = pool_named(&created["cluster"], "work");
    let pool_path = format!("{path}/{}/node-pools/{pool}", id(&created["cluster"]));
    let view = app.get(&pool_path).token(&seat.token).send().await.expect(200).json();
    assert_eq!((&view["count"], &view["status"]["desired_count"]), (&json!(1), &json!(1)), "{view}");
    // A patch of `count` is the autoscaler's: 409 naming the field, also with a matching etag.
    let patch = app.patch(&pool_path).token(&seat.token).header("if-match", view["etag"].as_str().expect("etag"));
    let refused = patch.json(&json!({ "count": 2 })).send().await.problem(409, "autoscaled_count");
    assert!(refused["detail"].as_str().is_some_and(|d| d.contains("`count`")), "{refused}");
    // New bounds clamp the target; turning autoscaling off keeps the target as the count.
    let narrowed = app.patch(&pool_path).token(&seat.token).json(&json!({ "autoscaling": { "max": 0 } }));
    let narrowed = narrowed.send().await.expect(202).json();
    assert_eq!(narrowed["node_pool"]["status"]["desired_count"], 0, "{narrowed}");
    let off = app.patch(&pool_path).token(&seat.token).json(&json!({ "autoscaling": null })).send().await.expect(202);
    let off = off.json();
    assert_eq!((&off["node_pool"]["count"], &off["node_pool"]["autoscaling"]), (&json!(0), &Value::Null), "{off}");
    app.patch(&pool_path).token(&seat.token).json(&json!({ "count": 2 })).send().await.expect(202);
}

#[tokio::test]
async fn an_elastic_pool_is_bounded_by_its_tenants_quota_lowered_after_it_was_created() {
    let lab = elastic_lab().await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("gpu", &["q1", "q2", "q3", "q4"]).await;
    let created = lab.create(elastic_slurm("quota", 0, json!({ "min": 0, "max": 3 }))).await;
    let (cluster, seat) = (id(&created["cluster"]), lab.own());
    let pool = pool_named(&created["cluster"], "work");
    lab.ready(&cluster).await;
    // The provider lowers the quota below what max allows: the pool grows only as far as it.
    let quotas = json!({ "quotas": { "max_clusters": null, "max_nodes": 2, "max_gpus": null } });
    lab.app.patch(format!("/v1/tenants/{}", lab.tenant)).token(&admin()).json(&quotas).send().await.expect(200);
    demand(&lab, &cluster, 4, 4, 0).await;
    pool_at(&lab, &seat, &cluster, &pool, 1).await;
    let ops = scalings(&lab, &pool).await;
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert_eq!(ops[0].1, "scale_up: 4 pending jobs need 4 nodes (capped by the tenant's quota)");
}

#[tokio::test]
async fn elastic_pools_of_two_tenants_competing_for_the_last_machines_are_served_first_come_first_served() {
    let lab = elastic_lab().await;
    machine_class(&lab.app, "cpu", 0).await;
    lab.available("cpu", &["f1", "f2"]).await;
    // A third tenant holds every machine of the class.
    let holder = lab.seat("holder").await;
    let fixed = json!({ "name": "fixed", "kind": "kubernetes", "isolation": "private-nodes",
        "node_pools": [{ "name": "all", "machine_class": "cpu", "count": 2 }] });
    let fixed = id(&lab.create_as(&holder, fixed).await["cluster"]);
    lab.ready_as(&holder, &fixed, WAIT).await;
    let (first, second) = (lab.seat("first").await, lab.seat("second").await);
    let a = lab.create_as(&first, elastic_kubernetes("a", 2)).await;
    let b = lab.create_as(&second, elastic_kubernetes("b", 2)).await;
    let (a, pool_a, b, pool_b) =
        (id(&a["cluster"]), pool_named(&a["cluster"], "work"), id(&b["cluster"]), pool_named(&b["cluster"], "work"));
    lab.ready_as(&first, &a, WAIT).await;
    lab.ready_as(&second, &b, WAIT).await;
    // The first tenant's demand comes first and waits in line; then the second's.
    demand(&lab, &a, 2, 2, 0).await;
    lab.waiting_as(&first, &a).await;
    demand(&lab, &b, 2, 2, 0).await;
    lab.waiting_as(&second, &b).await;
    // The machines free up: the first in line gets them, the second keeps waiting.
    lab.app.delete(cluster_path(&holder, &fixed)).token(&holder.token).send().await.expect(202);
    pool_at(&lab, &first, &a, &pool_a, 2).await;
    let waiting = lab.cluster_as(&second, &b).await;
    assert_eq!(condition(&waiting, "MachinesAllocated")["reason"], "InsufficientCapacity", "{waiting}");
    assert_eq!(pool_of(&lab, &second, &b, &pool_b).await["status"]["allocated"], 0);
    // Its demand ends while it waits: the waiting scale-up is withdrawn at once.
    demand(&lab, &b, 0, 0, 0).await;
    pool_at(&lab, &second, &b, &pool_b, 0).await;
    let ops = scalings(&lab, &pool_b).await;
    assert_eq!(ops.len(), 2, "{ops:?}");
    assert_eq!(ops[0].0, "superseded");
    assert!(ops[1].1.starts_with("scale_down: demand dropped to 0 nodes"), "{ops:?}");
    lab.ready_as(&second, &b, WAIT).await;
}

#[tokio::test]
async fn flapping_demand_does_not_thrash_one_scale_down_per_delay() {
    let lab = elastic_lab().await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("gpu", &["t1", "t2", "t3"]).await;
    let delay = 4;
    let created =
        lab.create(elastic_slurm("flap", 2, json!({ "min": 0, "max": 2, "scale_down_delay_seconds": delay }))).await;
    let (cluster, seat) = (id(&created["cluster"]), lab.own());
    let pool = pool_named(&created["cluster"], "work");
    // Both nodes run jobs from the start.
    demand(&lab, &cluster, 0, 0, 2).await;
    lab.ready(&cluster).await;
    pool_at(&lab, &seat, &cluster, &pool, 2).await;
    let since = format!("select count(*) from node_pools where id = '{pool}' and scale_down_since is not null");
    // Idle, busy, idle, ... for more than two delays: each idle stretch the autoscaler sees
    // ends before the delay, so the pool never shrinks.
    let end = std::time::Instant::now() + Duration::from_secs(2 * delay + 1);
    while std::time::Instant::now() < end {
        demand(&lab, &cluster, 0, 0, 0).await;
        eventually(WAIT, || async { (lab.scalar(&since).await == 1).then_some(()) }).await;
        demand(&lab, &cluster, 0, 0, 2).await;
        eventually(WAIT, || async { (lab.scalar(&since).await == 0).then_some(()) }).await;
    }
    assert_eq!(scalings(&lab, &pool).await, [], "no scale-down while demand flaps");
    // Idle for good: one scale-down, to zero.
    demand(&lab, &cluster, 0, 0, 0).await;
    pool_at(&lab, &seat, &cluster, &pool, 0).await;
    let ops = scalings(&lab, &pool).await;
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert_eq!(events(&lab, &cluster, "NodePoolScaledDown").await.len(), 1);
}

/// A worker process: the reconcilers and the demand checks in a runtime of their own, with
/// their own database pool and simulated drivers, killed (runtime shut down: every task and
/// connection dropped, open transactions rolled back, leases left to expire) when dropped.
struct Killable(Option<tokio::runtime::Runtime>);

impl Drop for Killable {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

fn killable_worker(app: &TestApp, settings: &Settings, name: &str) -> Killable {
    use paddock_worker::reconcile::{Autoscaler, ClusterReconciler, MachineReconciler};
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let (url, cipher, base) = (app.db.url.clone(), app.cipher.clone(), app.base_url.clone().expect("served"));
    let (settings, name) = (settings.clone(), name.to_owned());
    runtime.spawn(async move {
        let pool = sqlx::postgres::PgPoolOptions::new().max_connections(8).connect(&url).await.expect("pool");
        let store = paddock_store::Store::from_pool(pool);
        let agent = AgentSettings { base_url: base.clone(), seed_base_url: base, ..AgentSettings::default() };
        let services = Services::new(store.clone(), cipher, paddock_testkit::ledger_key()).with_agent(agent);
        let world = SimWorld::new(store.clone(), SimConfig::zero());
        let drivers = Drivers { bmc: Some(world.bmc()), kube: Some(world.kube()) };
        let clusters = ClusterReconciler::new(services.clone(), drivers.clone(), settings.clone());
        let handlers: Vec<Arc<dyn paddock_worker::JobHandler>> = vec![
            Arc::new(MachineReconciler::new(services, drivers, settings)),
            Arc::new(Autoscaler(clusters.clone())),
            Arc::new(clusters),
        ];
        let config = paddock_worker::WorkerConfig { lease: Duration::from_millis(500), ..lab_worker_config() };
        let worker = paddock_worker::Worker::new(store, &name, handlers, config).expect("worker");
        worker.run(std::future::pending::<()>()).await;
    });
    Killable(Some(runtime))
}

#[tokio::test]
async fn workers_killed_around_scaling_decisions_never_allocate_twice_nor_leave_a_machine_held_at_zero() {
    let app = TestApp::served().await;
    let world = SimWorld::new(paddock_store::Store::from_pool(app.db.pool.clone()), SimConfig::zero());
    let settings = Settings {
        autoscale_interval: Duration::from_millis(50),
        outage_wait: Duration::from_secs(1),
        ..lab_settings()
    };
    let (_agent_stop, agent_stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(world.agent(reqwest::Client::new()).run(agent_stopped));
    let mut worker = killable_worker(&app, &settings, "w0");
    machine_class(&app, "cpu", 0).await;
    for i in 0..3 {
        let body = json!({ "name": format!("k{i}"), "machine_class": "cpu",
            "bmc": { "url": format!("sim://k{i}"), "username": "admin", "password": "simulated" } });
        app.post("/v1/machines").token(&admin()).json(&body).send().await.expect(202);
    }
    let t = tenant(&app, "acme").await;
    let seat = Seat { tenant: id(&t), token: token(&["tenant:admin"], Some(id(&t).parse().expect("uuid"))) };
    let mut body = elastic_kubernetes("k", 2);
    body["node_pools"][0]["autoscaling"]["scale_down_delay_seconds"] = json!(0);
    let created = app.post(format!("/v1/tenants/{}/clusters", seat.tenant)).token(&seat.token).json(&body);
    let created = created.send().await.expect(202).json();
    let (cluster, pool) = (id(&created["cluster"]), pool_named(&created["cluster"], "work"));
    let cluster_id = ClusterId(cluster.parse().expect("uuid"));
    let view = |path: String| {
        let (app, token) = (&app, seat.token.clone());
        async move { app.get(path).token(&token).send().await.expect(200).json() }
    };
    let cluster_at = cluster_path(&seat, &cluster);
    eventually(WAIT, || async {
        let ready = view(cluster_at.clone()).await["status"]["phase"] == "ready";
        (ready && count(&app, "select count(*) from machines where state = 'available'").await == 3).then_some(())
    })
    .await;
    // Demand up and down while workers are killed at varying moments around the decisions.
    for round in 0u64..8 {
        let busy = if round % 2 == 0 { 2 } else { 0 };
        world
            .set_demand(
                cluster_id,
                "work",
                SimDemand { pending_jobs: busy, pending_nodes: busy, ..SimDemand::default() },
            )
            .await
            .expect("knob");
        // The decision first (a loaded machine may take longer than a round to come to it), then
        // the kill's timing (not a wait for a condition): spread over the decision's life.
        eventually(WAIT, || async {
            let p = view(format!("{cluster_at}/node-pools/{pool}")).await;
            (p["status"]["desired_count"] == busy).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(40 + (round * 97) % 400)).await;
        drop(worker);
        worker = killable_worker(&app, &settings, &format!("w{}", round + 1));
    }
    // Demand ends for good: the pool reaches zero, every machine wiped and available.
    world.set_demand(cluster_id, "work", SimDemand::default()).await.expect("knob");
    eventually(WAIT, || async {
        let c = view(cluster_at.clone()).await;
        let p = view(format!("{cluster_at}/node-pools/{pool}")).await;
        let ready = c["status"]["phase"] == "ready" && p["status"]["desired_count"] == 0;
        let held = count(&app, &format!("select count(*) from machines where node_pool_id = '{pool}'")).await;
        let available = count(&app, "select count(*) from machines where state = 'available'").await;
        (ready && held == 0 && available == 3).then_some(())
    })
    .await;
    // Never more machines held at once than the pool's max, never one machine twice. The pool
    // holds a machine from its allocation until its release starts (`HELD`: allocated,
    // provisioning, active): a releasing machine is no longer counted, billed or in a quota, and a
    // scale-up does not wait for its drain.
    let most = count(
        &app,
        &format!(
            "select coalesce(max((select count(*) from machine_allocations b where b.node_pool_id = a.node_pool_id \
               and b.allocated_at <= a.allocated_at \
               and (b.release_started_at is null or b.release_started_at > a.allocated_at))), 0) \
             from machine_allocations a where a.node_pool_id = '{pool}'"
        ),
    )
    .await;
    assert!(most <= 2, "the pool held {most} machines at once:\n{}", allocations(&app, &pool).await);
    let allocated =
        count(&app, &format!("select count(*) from machine_allocations where node_pool_id = '{pool}'")).await;
    let scaled = format!("select count(*) from operations where target_id = '{pool}' and kind = 'node_pool_scale'");
    let scaled = count(&app, &scaled).await;
    assert!(allocated >= 2 && scaled >= 2, "the pool scaled ({allocated} allocations, {scaled} decisions)");
    let overlapping = "select count(*) from machine_allocations a join machine_allocations b \
        on a.machine_id = b.machine_id and a.id < b.id \
        and tstzrange(a.allocated_at, coalesce(a.released_at, 'infinity')) && \
            tstzrange(b.allocated_at, coalesce(b.released_at, 'infinity'))";
    assert_eq!(count(&app, overlapping).await, 0, "a machine was in two live allocations");
    let open =
        format!("select count(*) from operations where target_id = '{pool}' and state in ('pending', 'running')");
    assert_eq!(count(&app, &open).await, 0, "every scaling operation ended");
    drop(worker);
}

/// A pool's allocations, one line each, for a failure's message.
async fn allocations(app: &TestApp, pool: &str) -> String {
    let rows: Vec<(String,)> = sqlx::query_as(
        "select format('machine %s allocated %s, release started %s, released %s', machine_id, allocated_at, \
             release_started_at, released_at) from machine_allocations where node_pool_id = $1::uuid order by allocated_at",
    )
    .bind(pool)
    .fetch_all(&app.db.pool)
    .await
    .expect("allocations");
    rows.into_iter().map(|(line,)| line).collect::<Vec<_>>().join("\n")
}

async fn count(app: &TestApp, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(&app.db.pool).await.expect(sql)
}

/// The simulated tenant nodes, but without a demand read (`TenantNodes::pod_demand`'s default):
/// a driver that can never read an elastic pool's demand, as the real one today.
struct NoDemand(Arc<dyn TenantNodes>);

impl TenantNodes for NoDemand {
    fn join_config<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
        ttl_seconds: u64,
    ) -> BoxFuture<'a, Result<JoinConfig, DriverError>> {
        self.0.join_config(tenant, node, ttl_seconds)
    }
    fn node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Option<NodeStatus>, DriverError>> {
        self.0.node(tenant, node)
    }
    fn registered_nodes<'a>(
        &'a self,
        tenant: &'a TenantAccess,
    ) -> BoxFuture<'a, Result<Vec<RegisteredNode>, DriverError>> {
        self.0.registered_nodes(tenant)
    }
    fn drain_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Drain, DriverError>> {
        self.0.drain_node(tenant, node)
    }
    fn foreign_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Option<String>, DriverError>> {
        self.0.foreign_node(tenant, node)
    }
    fn remove_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Removal, DriverError>> {
        self.0.remove_node(tenant, node)
    }
    fn delete_join_tokens<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        self.0.delete_join_tokens(tenant, node)
    }
    fn abandon_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        self.0.abandon_node(tenant, node)
    }
}

/// A driver that can never read the demand: the tenant is told once (a Warning event), the pool
/// keeps its target, and the checks end instead of failing every interval.
#[tokio::test]
async fn a_demand_the_driver_cannot_read_is_said_once_and_the_checks_end() {
    let lab = Lab::tuned(
        |s| s.autoscale_interval = Duration::from_millis(100),
        |d| {
            let mut kube = d.kube.expect("kube");
            kube.nodes = Arc::new(NoDemand(kube.nodes.clone()));
            Drivers { kube: Some(kube), ..d }
        },
    )
    .await;
    machine_class(&lab.app, "cpu", 0).await;
    lab.available("cpu", &["u1"]).await;
    let created = lab.create(elastic_kubernetes("blind", 1)).await;
    let cluster = id(&created["cluster"]);
    lab.ready(&cluster).await;
    let said = eventually(WAIT, || async {
        let said = events(&lab, &cluster, "AutoscalingUnavailable").await;
        (!said.is_empty()).then_some(said)
    })
    .await;
    assert!(said[0].contains("demand_unsupported"), "{said:?}");
    // The checks end: no demand check is queued or running for the cluster any more.
    let checks = format!(
        "select count(*) from jobs where target_id = '{cluster}' and kind = 'cluster_autoscale' \
         and state in ('queued', 'running')"
    );
    eventually(WAIT, || async { (count(&lab.app, &checks).await == 0).then_some(()) }).await;
    tokio::time::sleep(Duration::from_millis(500)).await; // five intervals
    assert_eq!(events(&lab, &cluster, "AutoscalingUnavailable").await.len(), 1, "said once");
    assert_eq!(count(&lab.app, &checks).await, 0, "not checked again");
    let pool = pool_named(&created["cluster"], "work");
    assert_eq!(pool_of(&lab, &lab.own(), &cluster, &pool).await["status"]["desired_count"], 0);
}

/// Sets the demand of the pool `work` with its widest pending job singled out.
async fn wide_demand(lab: &Lab, cluster: &str, pending_jobs: u32, pending_nodes: u32, widest_job_nodes: u32) {
    let cluster = ClusterId(cluster.parse().expect("uuid"));
    let knob = SimDemand { pending_jobs, pending_nodes, widest_job_nodes, ..SimDemand::default() };
    lab.world.set_demand(cluster, "work", knob).await.expect("demand knob");
}

/// A job asking for more nodes than the pool can ever have pends in Slurm for good: the pool
/// neither grows nor stays grown for it, and the tenant is told once (a Warning event naming the
/// job and the numbers, and the pool's `DemandFits` condition), while work that fits still
/// grows the pool.
#[tokio::test]
async fn a_job_wider_than_the_pools_max_neither_grows_nor_holds_the_pool_and_the_tenant_is_told() {
    let lab = elastic_lab().await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("gpu", &["w1", "w2", "w3", "w4"]).await;
    let created =
        lab.create(elastic_slurm("wide", 0, json!({ "min": 0, "max": 2, "scale_down_delay_seconds": 1 }))).await;
    let (cluster, seat) = (id(&created["cluster"]), lab.own());
    let pool = pool_named(&created["cluster"], "work");
    lab.ready(&cluster).await;
    pool_at(&lab, &seat, &cluster, &pool, 0).await;

    // Job 1 asks for three nodes; the pool's max is two.
    wide_demand(&lab, &cluster, 1, 3, 3).await;
    let told = eventually(WAIT, || async {
        let told = events(&lab, &cluster, "NodePoolDemandExceedsMax").await;
        (!told.is_empty()).then_some(told)
    })
    .await;
    let said = "job 1 asks for 3 nodes, more than the pool's partition can ever have (2): it stays pending, \
                and the pool does not grow for it";
    assert_eq!(told, [format!("node pool work: {said}")]);
    // The event was written with the decision on that demand: the target did not move.
    let view = pool_of(&lab, &seat, &cluster, &pool).await;
    assert_eq!(view["status"]["desired_count"], 0, "{view}");
    let fits = condition(&view, "DemandFits");
    assert_eq!(
        (&fits["status"], &fits["reason"], &fits["message"]),
        (&json!("False"), &json!("JobExceedsMax"), &json!(said))
    );
    assert!(scalings(&lab, &pool).await.is_empty());

    // A job of one node comes beside it: the pool grows for that one only.
    wide_demand(&lab, &cluster, 2, 4, 3).await;
    pool_at(&lab, &seat, &cluster, &pool, 1).await;
    let ops = scalings(&lab, &pool).await;
    assert_eq!(
        ops.iter().map(|(_, reason)| reason.as_str()).collect::<Vec<_>>(),
        ["scale_up: 1 pending jobs need 1 nodes"]
    );

    // It runs and ends; the wide job still pends, and holds nothing: the pool shrinks to zero.
    wide_demand(&lab, &cluster, 1, 3, 3).await;
    pool_at(&lab, &seat, &cluster, &pool, 0).await;

    // The wide job is cancelled: the condition turns true, and the tenant was told once.
    demand(&lab, &cluster, 0, 0, 0).await;
    eventually(WAIT, || async {
        let view = pool_of(&lab, &seat, &cluster, &pool).await;
        (condition(&view, "DemandFits")["status"] == "True").then_some(())
    })
    .await;
    assert_eq!(events(&lab, &cluster, "NodePoolDemandExceedsMax").await.len(), 1, "told once");
    lab.check_invariants().await;
}
