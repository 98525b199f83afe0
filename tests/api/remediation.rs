//! Remediation on the simulated drivers: a `failed` report on a machine a tenant holds drains it,
//! allocates a spare of its class to its pool through the normal allocation (within the tenant's
//! quota, which the spare does not exceed), releases the failed machine into maintenance once the
//! spare is active, and an operator's return wipes it. No spare: the cluster says so and waits,
//! then proceeds. A pool may turn it off; a flapping report starts one; a Slurm system pool's
//! machine waits for an operator.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use paddock_domain::driver::{
    BoxFuture, DriverError, KubeDrivers, Removal, SlurmDesired, SlurmDrain, SlurmDriver, SlurmStatus, SlurmVersion,
    TenantAccess,
};
use paddock_testkit::{admin, eventually};
use paddock_worker::reconcile::Drivers;
use serde_json::{json, Value};

use crate::common::{id, machine_class};
use crate::lifecycle::{condition, gpu_and_system, pool_named, slurm, Lab};

const WAIT: Duration = Duration::from_secs(60);

pub(crate) const FAILED: &str = r#"{"status": "failed", "checks": [{"name": "gpu.ecc", "status": "failed", "detail": "GPU 3: 41 uncorrectable ECC errors"}]}"#;

pub(crate) async fn report(lab: &Lab, machine: &str, body: &str) -> Value {
    let body: Value = serde_json::from_str(body).expect("json");
    let path = format!("/v1/machines/{machine}/health-reports");
    lab.app.post(path).token(&admin()).json(&body).send().await.expect(201).json()
}

/// The remediations of `machine` as stored: (state, source, spare, outcome).
pub(crate) async fn remediations(lab: &Lab, machine: &str) -> Vec<(String, String, Option<String>, Option<String>)> {
    sqlx::query_as(
        "select state, source, spare_machine_id::text, outcome from machine_remediations \
         where machine_id = $1::uuid order by id",
    )
    .bind(machine)
    .fetch_all(&lab.app.db.pool)
    .await
    .expect("remediations")
}

/// The machine's one remediation once it has ended (the cluster ends it when the machine has
/// left the tenancy).
pub(crate) async fn ended(lab: &Lab, machine: &str) -> (String, String, Option<String>, Option<String>) {
    eventually(WAIT, || async {
        let mut all = remediations(lab, machine).await;
        assert_eq!(all.len(), 1, "{all:?}");
        (all[0].0 == "ended").then(|| all.remove(0))
    })
    .await
}

/// A Kubernetes cluster of one pool `gpu` of `count`, with the pool's `remediation` when given.
pub(crate) fn kubernetes(count: u32, remediation: Option<Value>) -> Value {
    let mut pool = json!({ "name": "gpu", "machine_class": "gpu", "count": count });
    if let Some(r) = remediation {
        pool["remediation"] = r;
    }
    json!({ "name": "k", "kind": "kubernetes", "isolation": "private-nodes", "node_pools": [pool] })
}

/// A `gpu` class with machines `names` available, and the tenant's Kubernetes cluster of one
/// pool `gpu` of `count` (automatic remediation), ready: (the machines' ids, the creation's
/// answer, the cluster's id).
pub(crate) async fn ready_kubernetes(lab: &Lab, names: &[&str], count: u32) -> (Vec<String>, Value, String) {
    machine_class(&lab.app, "gpu", 8).await;
    let ids = lab.available("gpu", names).await;
    let created = lab.create(kubernetes(count, None)).await;
    let cluster = id(&created["cluster"]);
    lab.ready(&cluster).await;
    (ids, created, cluster)
}

/// The machines the tenant's cluster holds, by id.
pub(crate) async fn held(lab: &Lab, cluster: &str) -> Vec<Value> {
    let path = format!("{}/machines", lab.cluster_path(cluster));
    let page = lab.app.get(path).token(&lab.tenant_token).send().await.expect(200).json();
    page["items"].as_array().expect("items").clone()
}

#[tokio::test]
async fn a_failed_machine_is_swapped_for_a_spare_within_the_quota_and_goes_to_maintenance_until_returned_wiped() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    let ids = lab.available("gpu", &["h1", "h2"]).await;
    // A quota of one node: the spare takes the failed machine's place, not a second one.
    let quota = json!({ "quotas": { "max_nodes": 1 } });
    lab.app.patch(format!("/v1/tenants/{}", lab.tenant)).token(&admin()).json(&quota).send().await.expect(200);
    let created = lab.create(kubernetes(1, None)).await;
    let cluster = id(&created["cluster"]);
    let pool =
        lab.app.get(format!("{}/node-pools/{}", lab.cluster_path(&cluster), id(&created["cluster"]["node_pools"][0])));
    assert_eq!(
        pool.token(&lab.tenant_token).send().await.expect(200).json()["remediation"],
        json!({ "automatic": true })
    );
    lab.ready(&cluster).await;
    let failed = id(&held(&lab, &cluster).await[0]);
    let spare = ids.iter().find(|m| **m != failed).expect("the other machine").clone();

    let recorded = report(&lab, &failed, FAILED).await;
    let started = remediations(&lab, &failed).await;
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[0].1, "operator");
    let report_id: Option<String> =
        sqlx::query_scalar("select report_id::text from machine_remediations where machine_id = $1::uuid")
            .bind(&failed)
            .fetch_one(&lab.app.db.pool)
            .await
            .expect("report");
    assert_eq!(report_id.as_deref(), recorded["id"].as_str(), "the report that started it is its evidence");

    // The spare becomes active in the same pool; the failed machine is released into maintenance.
    lab.machine_in(&spare, "active").await;
    let m = lab.machine_in(&failed, "maintenance").await;
    let reason = m["maintenance_reason"].as_str().expect("a reason");
    assert!(reason.contains("GPU 3: 41 uncorrectable ECC errors"), "{m}");
    lab.ready(&cluster).await;
    let now_held: Vec<String> = held(&lab, &cluster).await.iter().map(id).collect();
    assert_eq!(now_held, std::slice::from_ref(&spare));
    let ended = ended(&lab, &failed).await;
    assert_eq!((ended.2.as_deref(), ended.3.as_deref()), (Some(spare.as_str()), Some("replaced")), "{ended:?}");

    // Nobody gets it until an operator returns it, which wipes it.
    let cleans = lab.scalar(&format!("select count(*) from machine_cleans where machine_id = '{failed}'")).await;
    lab.app.delete(format!("/v1/machines/{failed}/maintenance")).token(&admin()).send().await.expect(202);
    lab.machine_in(&failed, "available").await;
    let after = lab.scalar(&format!("select count(*) from machine_cleans where machine_id = '{failed}'")).await;
    assert_eq!(after, cleans + 1, "the return went through a wipe");
    // A later failed report of the machine, now in the fleet, starts nothing.
    report(&lab, &failed, FAILED).await;
    assert_eq!(remediations(&lab, &failed).await.len(), 1);
}

/// A Slurm driver that records the nodes it is asked to drain.
struct RecordingSlurm(Arc<dyn SlurmDriver>, Arc<Mutex<Vec<String>>>);

impl SlurmDriver for RecordingSlurm {
    fn ensure_slurm<'a>(
        &'a self,
        t: &'a TenantAccess,
        d: &'a SlurmDesired,
    ) -> BoxFuture<'a, Result<SlurmStatus, DriverError>> {
        self.0.ensure_slurm(t, d)
    }

    fn drain_node<'a>(
        &'a self,
        t: &'a TenantAccess,
        slurm: &'a SlurmVersion,
        node: &'a str,
    ) -> BoxFuture<'a, Result<SlurmDrain, DriverError>> {
        self.1.lock().expect("lock").push(node.to_owned());
        self.0.drain_node(t, slurm, node)
    }

    fn remove_slurm<'a>(&'a self, t: &'a TenantAccess) -> BoxFuture<'a, Result<Removal, DriverError>> {
        self.0.remove_slurm(t)
    }
}

#[tokio::test]
async fn without_a_spare_the_cluster_says_so_without_fleet_counts_drains_the_node_and_proceeds_when_one_frees_up() {
    let drained = Arc::new(Mutex::new(Vec::new()));
    let recorder = drained.clone();
    let lab = Lab::with(move |drivers| {
        let kube = drivers.kube.expect("kube");
        let slurm = Arc::new(RecordingSlurm(kube.slurm.clone(), recorder));
        Drivers { bmc: drivers.bmc, kube: Some(KubeDrivers { slurm, ..kube }) }
    })
    .await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("gpu", &["s1", "g1"]).await;
    let created = lab.create(slurm("s", gpu_and_system(1))).await;
    let cluster = id(&created["cluster"]);
    lab.ready(&cluster).await;
    let gpu_pool = pool_named(&created["cluster"], "gpu");
    let machines = held(&lab, &cluster).await;
    let failed = machines.iter().find(|m| m["node_pool_id"] == gpu_pool.as_str()).expect("gpu machine");
    let (failed_id, node) = (id(failed), failed["node_name"].as_str().expect("node name").to_owned());

    report(&lab, &failed_id, FAILED).await;
    let waiting = eventually(WAIT, || async {
        let c = lab.cluster(&cluster).await;
        (condition(&c, "NodesReady")["reason"] == "AwaitingSpare").then_some(c)
    })
    .await;
    assert_eq!(waiting["status"]["phase"], "degraded", "{waiting}");
    let message = condition(&waiting, "NodesReady")["message"].as_str().expect("message").to_owned();
    assert!(!message.chars().any(|c| c.is_ascii_digit()), "no fleet counts: {message}");
    assert!(drained.lock().expect("lock").contains(&node), "the failed machine's Slurm node is drained");
    assert_eq!(lab.machine_in(&failed_id, "active").await["state"], "active", "it serves until a spare is active");
    assert_eq!(remediations(&lab, &failed_id).await[0].0, "awaiting_spare");

    // A machine frees up (here: a new one, taken as soon as it is wiped): the remediation proceeds.
    let spare = lab.enroll("gpu", &["g2"]).await.remove(0);
    lab.machine_in(&spare, "active").await;
    lab.machine_in(&failed_id, "maintenance").await;
    lab.ready(&cluster).await;
    let ended = ended(&lab, &failed_id).await;
    assert_eq!((ended.2.as_deref(), ended.3.as_deref()), (Some(spare.as_str()), Some("replaced")), "{ended:?}");
}

#[tokio::test]
async fn a_failed_machine_its_pool_can_do_without_is_released_into_maintenance_without_a_spare() {
    let lab = Lab::new().await;
    let (_, created, cluster) = ready_kubernetes(&lab, &["h1", "h2"], 2).await;
    let machines = held(&lab, &cluster).await;
    let (failed, kept) = (id(&machines[0]), id(&machines[1]));
    report(&lab, &failed, FAILED).await;
    eventually(WAIT, || async {
        let c = lab.cluster(&cluster).await;
        (condition(&c, "NodesReady")["reason"] == "AwaitingSpare").then_some(())
    })
    .await;

    // The pool is scaled to one while the failed machine waits for a spare: the healthy machine
    // is that one, so no spare will ever come, and the failed machine leaves at once.
    lab.scale(&cluster, &id(&created["cluster"]["node_pools"][0]), 1).await;
    let m = lab.machine_in(&failed, "maintenance").await;
    assert!(m["maintenance_reason"].as_str().is_some_and(|r| r.contains("uncorrectable ECC")), "{m}");
    let path = format!("/v1/machines/{failed}/custody");
    let custody = lab.app.get(path).token(&admin()).send().await.expect(200).json();
    let items = custody["items"].as_array().expect("entries");
    let release = items.iter().rev().find(|e| e["to"] == "releasing").expect("the release's entry");
    let why = release["reason"].as_str().unwrap_or_default();
    assert!(why.starts_with("tenancy ends for maintenance: ") && why.contains("uncorrectable ECC"), "{release}");
    lab.ready(&cluster).await;
    let now_held: Vec<String> = held(&lab, &cluster).await.iter().map(id).collect();
    assert_eq!(now_held, [kept], "the healthy machine stays");
    let ended = ended(&lab, &failed).await;
    assert_eq!((ended.2.as_deref(), ended.3.as_deref()), (None, Some("released")), "{ended:?}");
}

#[tokio::test]
async fn a_pool_without_automatic_remediation_keeps_its_failed_machine() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    let ids = lab.available("gpu", &["h1", "h2"]).await;
    let created = lab.create(kubernetes(1, Some(json!({ "automatic": false })))).await;
    let cluster = id(&created["cluster"]);
    assert_eq!(created["cluster"]["node_pools"][0]["name"], "gpu");
    lab.ready(&cluster).await;
    let pool = format!("{}/node-pools/{}", lab.cluster_path(&cluster), id(&created["cluster"]["node_pools"][0]));
    let view = lab.app.get(&pool).token(&lab.tenant_token).send().await.expect(200).json();
    assert_eq!(view["remediation"], json!({ "automatic": false }));
    let failed = id(&held(&lab, &cluster).await[0]);

    // The remediation would start in the report's transaction: none did.
    report(&lab, &failed, FAILED).await;
    assert!(remediations(&lab, &failed).await.is_empty());
    lab.ready(&cluster).await;
    let other = ids.iter().find(|m| **m != failed).expect("other");
    assert_eq!(lab.machine_in(other, "available").await["state"], "available");
    // A bad setting is refused naming the field.
    let bad = kubernetes(1, Some(json!({ "automatic": "sometimes" })));
    let path = format!("/v1/tenants/{}/clusters", lab.tenant);
    let resp = lab.app.post(path).token(&lab.tenant_token).json(&bad).send().await;
    assert_eq!(resp.status.as_u16(), 422);
    assert!(resp.json().to_string().contains("remediation"));
}

#[tokio::test]
async fn a_flapping_report_starts_exactly_one_remediation() {
    let lab = Lab::new().await;
    let (_, _, cluster) = ready_kubernetes(&lab, &["h1"], 1).await;
    let machine = id(&held(&lab, &cluster).await[0]);
    for status in ["healthy", "failed", "healthy", "failed", "healthy", "failed"] {
        report(&lab, &machine, &json!({ "status": status }).to_string()).await;
    }
    let started = remediations(&lab, &machine).await;
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[0].0, "awaiting_spare");

    // The cluster goes before a spare came: the failed machine still goes to maintenance, not
    // back to the fleet, and the remediation ends.
    lab.app.delete(lab.cluster_path(&cluster)).token(&lab.tenant_token).send().await.expect(202);
    lab.machine_in(&machine, "maintenance").await;
    assert_eq!(ended(&lab, &machine).await.3.as_deref(), Some("released"));
}

#[tokio::test]
async fn a_failed_machine_of_a_slurm_system_pool_waits_for_an_operator_and_is_not_released() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    let ids = lab.available("gpu", &["s1", "g1", "g2"]).await;
    let created = lab.create(slurm("s", gpu_and_system(1))).await;
    let cluster = id(&created["cluster"]);
    lab.ready(&cluster).await;
    let sys_pool = pool_named(&created["cluster"], "sys");
    let machines = held(&lab, &cluster).await;
    let system = id(machines.iter().find(|m| m["node_pool_id"] == sys_pool.as_str()).expect("system machine"));

    report(&lab, &system, FAILED).await;
    assert_eq!(remediations(&lab, &system).await[0].0, "needs_operator");
    let degraded = eventually(WAIT, || async {
        let c = lab.cluster(&cluster).await;
        (condition(&c, "NodesReady")["reason"] == "AwaitingOperator").then_some(c)
    })
    .await;
    assert_eq!(degraded["status"]["phase"], "degraded");
    assert_eq!(lab.machine_in(&system, "active").await["state"], "active");
    let free: Vec<&String> = ids.iter().filter(|m| !machines.iter().any(|h| id(h) == **m)).collect();
    assert_eq!(lab.machine_in(free[0], "available").await["state"], "available", "no spare was allocated");
}

#[tokio::test]
async fn the_runtime_role_cannot_delete_a_remediation_or_rewrite_what_started_it() {
    let app = crate::common::served_as_runtime_role().await;
    for statement in [
        "delete from machine_remediations",
        "truncate machine_remediations",
        "alter table machine_remediations disable trigger machine_remediations_evidence",
    ] {
        let refused = sqlx::query(statement).execute(&app.db.pool).await.expect_err(statement);
        let code = refused.as_database_error().and_then(|e| e.code()).map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some("42501"), "{statement}: {refused}");
    }
}

#[tokio::test]
async fn a_tenant_replaces_a_machine_it_holds_and_reads_the_remediation_and_nothing_else() {
    let lab = Lab::new().await;
    let (ids, _, cluster) = ready_kubernetes(&lab, &["h1", "h2", "h3"], 1).await;
    let machine = id(&held(&lab, &cluster).await[0]);
    let machines = format!("{}/machines", lab.cluster_path(&cluster));
    let replace = |m: &str| format!("{machines}/{m}/replace");
    let reason = json!({ "reason": "  jobs on this node keep failing with NCCL timeouts " });

    // Bad input, and machines the cluster does not hold, change nothing.
    let empty = lab.app.post(replace(&machine)).token(&lab.tenant_token).json(&json!({ "reason": " " })).send().await;
    assert_eq!(empty.status.as_u16(), 422, "{}", empty.json());
    let unknown = lab.app.post(replace(&machine)).token(&lab.tenant_token).json(&json!({ "why": "x" })).send().await;
    assert_eq!(unknown.status.as_u16(), 422);
    let fleet = ids.iter().find(|m| **m != machine).expect("a fleet machine");
    let not_held = lab.app.post(replace(fleet)).token(&lab.tenant_token).json(&reason).send().await;
    assert_eq!((not_held.status.as_u16(), not_held.json()["code"].as_str()), (404, Some("not_found")));
    let other = lab.seat("other").await;
    let foreign = replace(&machine).replace(&lab.tenant, &other.tenant);
    assert_eq!(lab.app.post(&foreign).token(&other.token).json(&reason).send().await.status.as_u16(), 404);
    assert_eq!(lab.scalar("select count(*) from machine_remediations").await, 0);

    let accepted = lab.app.post(replace(&machine)).token(&lab.tenant_token).json(&reason).send().await;
    assert_eq!(accepted.status.as_u16(), 202);
    let accepted = accepted.json();
    let remediation = &accepted["remediation"];
    assert_eq!(remediation["source"], "tenant");
    assert_eq!(remediation["reason"], "jobs on this node keep failing with NCCL timeouts");
    assert_eq!(remediation["machine_id"].as_str(), Some(machine.as_str()));
    let again = lab.app.post(replace(&machine)).token(&lab.tenant_token).json(&reason).send().await;
    assert_eq!((again.status.as_u16(), again.json()["code"].as_str()), (409, Some("remediation_open")));

    // The operation succeeds once the spare is active and the machine on its way out.
    let op = format!("/v1/tenants/{}/operations/{}", lab.tenant, id(&accepted["operation"]));
    eventually(WAIT, || async {
        let o = lab.app.get(&op).token(&lab.tenant_token).send().await.expect(200).json();
        (o["state"] == "succeeded").then_some(())
    })
    .await;
    lab.machine_in(&machine, "maintenance").await;
    let ended = ended(&lab, &machine).await;
    assert_eq!(ended.1, "tenant");

    let listed = format!("{}/remediations", lab.cluster_path(&cluster));
    let page = lab.app.get(&listed).token(&lab.tenant_token).send().await.expect(200).json();
    let items = page["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{page}");
    assert_eq!((items[0]["state"].as_str(), items[0]["outcome"].as_str()), (Some("ended"), Some("replaced")));
    assert!(items[0]["spare_machine_id"].is_string() && items[0]["ended_at"].is_string(), "{page}");
    let all = lab.app.get("/v1/remediations").token(&admin()).send().await.expect(200).json();
    assert_eq!(all["items"][0]["id"], items[0]["id"]);
    let foreign = listed.replace(&lab.tenant, &other.tenant);
    assert_eq!(lab.app.get(&foreign).token(&other.token).send().await.status.as_u16(), 404);
    let audit = lab.app.get("/v1/audit-events?action=machine.replace").token(&admin()).send().await.expect(200).json();
    let outcomes: Vec<&str> =
        audit["items"].as_array().expect("items").iter().filter_map(|e| e["outcome"].as_str()).collect();
    assert!(outcomes.contains(&"success") && outcomes.len() >= 3, "{audit}");
}

#[tokio::test]
async fn a_tenant_power_cycles_a_machine_it_holds_through_its_bmc_and_keeps_it() {
    let lab = Lab::new().await;
    let (ids, _, cluster) = ready_kubernetes(&lab, &["p1", "p2"], 1).await;
    let machine = id(&held(&lab, &cluster).await[0]);
    let name = lab.machine_in(&machine, "active").await["name"].as_str().expect("name").to_owned();
    let cycle = |m: &str| format!("{}/machines/{m}/power-cycle", lab.cluster_path(&cluster));

    let fleet = ids.iter().find(|m| **m != machine).expect("a fleet machine");
    let not_held = lab.app.post(cycle(fleet)).token(&lab.tenant_token).send().await;
    assert_eq!(not_held.status.as_u16(), 404);
    let member = paddock_testkit::token(&["tenant:member"], Some(lab.tenant.parse().expect("uuid")));
    assert_eq!(lab.app.post(cycle(&machine)).token(&member).send().await.status.as_u16(), 403);

    let off_on = || async {
        sqlx::query_as::<_, (chrono::DateTime<chrono::Utc>, bool)>(
            "select updated_at, power_on from paddock_sim.machines where bmc_url = $1",
        )
        .bind(format!("sim://{name}"))
        .fetch_one(&lab.app.db.pool)
        .await
        .expect("the simulated machine")
    };
    let (before, on) = off_on().await;
    assert!(on);
    let accepted = lab.app.post(cycle(&machine)).token(&lab.tenant_token).send().await;
    assert_eq!(accepted.status.as_u16(), 202);
    let op = format!("/v1/tenants/{}/operations/{}", lab.tenant, id(&accepted.json()));
    let done = eventually(WAIT, || async {
        let o = lab.app.get(&op).token(&lab.tenant_token).send().await.expect(200).json();
        (o["state"] == "succeeded" || o["state"] == "failed").then_some(o)
    })
    .await;
    assert_eq!(done["state"], "succeeded", "{done}");
    let (after, on) = off_on().await;
    assert!(after > before && on, "the BMC powered it off and on again");
    assert_eq!(lab.machine_in(&machine, "active").await["cluster_id"].as_str(), Some(cluster.as_str()));
    lab.ready(&cluster).await;
    let audit = lab.app.get("/v1/audit-events?action=machine.power_cycle").token(&admin()).send().await;
    assert!(audit.expect(200).json()["items"].as_array().is_some_and(|i| i.len() >= 3));
}

#[tokio::test]
async fn a_cluster_without_remediations_does_not_try_to_end_any_while_it_reconciles() {
    let lab = Lab::new().await;
    let (_, created, cluster) = ready_kubernetes(&lab, &["q1", "q2"], 1).await;
    // From here a statement that ends remediations fails, even one that matches no row: a
    // reconcile that tried to end remediations the cluster does not have would fail.
    sqlx::raw_sql(
        "create function refuse_ending() returns trigger language plpgsql as $$ begin \
           if current_query() like '%set state = ''ended''%' then \
             raise exception 'ending remediations of a cluster that has none'; \
           end if; return null; end $$; \
         create trigger refuse_ending before update on machine_remediations \
           for each statement execute function refuse_ending();",
    )
    .execute(&lab.app.db.pool)
    .await
    .expect("the trigger");
    let pool = format!("{}/node-pools/{}", lab.cluster_path(&cluster), id(&created["cluster"]["node_pools"][0]));
    lab.app.patch(&pool).token(&lab.tenant_token).json(&json!({ "count": 2 })).send().await.expect(202);
    lab.ready(&cluster).await;
    assert_eq!(held(&lab, &cluster).await.len(), 2, "the scale-up went through the reconcile");
}
