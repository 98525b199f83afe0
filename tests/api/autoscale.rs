//! Elastic pools through the API: the contract of `autoscaling` (targets in status, quotas
//! against `max`, `count` the autoscaler's), and the autoscaler on the SIMULATED drivers (its
//! demand knob stands for slurmrestd and the tenant's scheduler): pools grow with demand within
//! max and quota, shrink to zero after the delay with machines wiped and usage ended at their
//! power-off, wait in line first come first served, do not thrash, and survive killed workers.

use std::time::Duration;

use paddock_sim::SimDemand;
use paddock_testkit::{admin, eventually, token, TestApp};
use paddock_types::ClusterId;
use serde_json::{json, Value};

use crate::common::{fleet, id, machine_class, tenant};
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
    let knob = SimDemand { pending_jobs, pending_nodes, busy_nodes };
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
