//! The whole asynchronous flow through the API: machines enrolled, inspected and wiped, clusters
//! created, made ready, scaled and deleted, capacity waits, faults, operator intents, and every
//! side effect repeated after an injected crash. The worker runs in-process with the SIMULATED
//! drivers (paddock-sim: their world in this test's database); the simulated machines' agent
//! reports to the real API served on a port. This proves the reconcilers and the lifecycle, not
//! the real drivers (those have their own tests against a real API server and a Redfish emulator).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, DurationRound, Utc};
use paddock_domain::bmc::{
    AfterBoot, BmcAccess, BmcDriver, BmcError, BmcErrorKind, BootMedia, BoxFuture, Inventory, SystemStatus,
};
use paddock_domain::driver::{
    ClusterRef, ControlPlaneBackend, ControlPlaneSpec, ControlPlaneStatus, Drain, DriverError, Isolation, JoinConfig,
    KubeDrivers, NodeRef, NodeStatus, PlatformDriver, RegisteredNode, Removal, SlurmDesired, SlurmDrain, SlurmDriver,
    SlurmStatus, SlurmVersion, StackStatus, TenantAccess, TenantCredentials, TenantNodes, TenantStack,
};
use paddock_domain::secret::SecretString;
use paddock_sim::{ClusterFault, MachineFault, SimConfig, SimWorld};
use paddock_store::Store;
use paddock_testkit::{admin, eventually, token, TestApp};
use paddock_types::ClusterId;
use paddock_worker::reconcile::{Drivers, Settings};
use serde_json::{json, Value};
use tokio::sync::watch;
use uuid::Uuid;

use crate::common::{id, lab_settings, lab_worker_config, machine_class, run_worker, tenant};

const WAIT: Duration = Duration::from_secs(60);

/// How long the crash-injection test's cluster may take to get ready: every side effect is
/// repeated after a crash and retried with backoff, and the whole api binary runs beside it on
/// two cores (alone it takes seconds; twice in full runs it outlasted 60 s).
const CRASH_WAIT: Duration = Duration::from_secs(180);

/// A tenant and its admin's token.
#[derive(Clone)]
pub(crate) struct Seat {
    pub(crate) tenant: String,
    pub(crate) token: String,
}

/// The API on a port, a worker and the simulated machines' agent, over one database.
pub(crate) struct Lab {
    pub(crate) app: TestApp,
    pub(crate) world: SimWorld,
    stop: watch::Sender<bool>,
    metrics: Arc<paddock_worker::WorkerMetrics>,
    pub(crate) tenant: String,
    pub(crate) tenant_token: String,
}

impl Lab {
    pub(crate) async fn new() -> Lab {
        Self::with(|drivers| drivers).await
    }

    /// A lab whose drivers pass through `wrap` (fault injection).
    pub(crate) async fn with(wrap: impl FnOnce(Drivers) -> Drivers) -> Lab {
        Self::tuned(|_| {}, wrap).await
    }

    /// A lab whose reconcilers' settings pass through `tune` and drivers through `wrap`.
    pub(crate) async fn tuned(tune: impl FnOnce(&mut Settings), wrap: impl FnOnce(Drivers) -> Drivers) -> Lab {
        Self::on(TestApp::served().await, tune, wrap).await
    }

    /// [`Lab::tuned`] on a served `app` of the test's making (services of its own).
    pub(crate) async fn on(
        app: TestApp,
        tune: impl FnOnce(&mut Settings),
        wrap: impl FnOnce(Drivers) -> Drivers,
    ) -> Lab {
        let store = Store::from_pool(app.db.pool.clone());
        let world = SimWorld::new(store, SimConfig::zero());
        let drivers = wrap(Drivers { bmc: Some(world.bmc()), kube: Some(world.kube()) });
        // A fault healed after the quick retries are spent (on a loaded machine they go fast) is
        // tried again within a second, not five minutes.
        let mut settings = Settings { outage_wait: Duration::from_secs(1), ..lab_settings() };
        tune(&mut settings);
        let (stop, metrics) = run_worker(&app, &world, drivers, settings, lab_worker_config(), "lab-worker");
        let t = tenant(&app, "acme").await;
        let tenant_token = token(&["tenant:admin"], Some(id(&t).parse().expect("uuid")));
        Lab { app, world, stop, metrics, tenant: id(&t), tenant_token }
    }

    /// Enrolls `sim://<name>` machines of `class`; returns their ids.
    pub(crate) async fn enroll(&self, class: &str, names: &[&str]) -> Vec<String> {
        let mut ids = Vec::new();
        for name in names {
            let body = json!({
                "name": name, "machine_class": class,
                "bmc": { "url": format!("sim://{name}"), "username": "admin", "password": "simulated" }
            });
            let created = self.app.post("/v1/machines").token(&admin()).json(&body).send().await.expect(202).json();
            ids.push(id(&created["machine"]));
        }
        ids
    }

    /// Enrolls machines and waits until each is `available` (wiped, powered off).
    pub(crate) async fn available(&self, class: &str, names: &[&str]) -> Vec<String> {
        let ids = self.enroll(class, names).await;
        for m in &ids {
            self.machine_in(m, "available").await;
        }
        ids
    }

    async fn machine(&self, id: &str) -> Value {
        self.app.get(format!("/v1/machines/{id}")).token(&admin()).send().await.expect(200).json()
    }

    pub(crate) async fn machine_in(&self, id: &str, state: &str) -> Value {
        eventually(WAIT, || async {
            let m = self.machine(id).await;
            (m["state"] == state).then_some(m)
        })
        .await
    }

    /// The lab's own tenant.
    pub(crate) fn own(&self) -> Seat {
        Seat { tenant: self.tenant.clone(), token: self.tenant_token.clone() }
    }

    /// Another tenant.
    pub(crate) async fn seat(&self, name: &str) -> Seat {
        let tenant = id(&tenant(&self.app, name).await);
        let token = token(&["tenant:admin"], Some(tenant.parse().expect("uuid")));
        Seat { tenant, token }
    }

    pub(crate) async fn create(&self, body: Value) -> Value {
        self.create_as(&self.own(), body).await
    }

    pub(crate) async fn create_as(&self, seat: &Seat, body: Value) -> Value {
        let path = format!("/v1/tenants/{}/clusters", seat.tenant);
        self.app.post(path).token(&seat.token).json(&body).send().await.expect(202).json()
    }

    pub(crate) fn cluster_path(&self, cluster: &str) -> String {
        cluster_path(&self.own(), cluster)
    }

    pub(crate) async fn cluster(&self, cluster: &str) -> Value {
        self.cluster_as(&self.own(), cluster).await
    }

    pub(crate) async fn cluster_as(&self, seat: &Seat, cluster: &str) -> Value {
        self.app.get(cluster_path(seat, cluster)).token(&seat.token).send().await.expect(200).json()
    }

    /// Waits until the cluster is ready at its current generation.
    pub(crate) async fn ready(&self, cluster: &str) -> Value {
        self.ready_as(&self.own(), cluster, WAIT).await
    }

    /// Waits up to `within` until `seat`'s cluster is ready at its current generation.
    pub(crate) async fn ready_as(&self, seat: &Seat, cluster: &str, within: Duration) -> Value {
        eventually(within, || async {
            let c = self.cluster_as(seat, cluster).await;
            (c["status"]["phase"] == "ready" && c["status"]["observed_generation"] == c["generation"]).then_some(c)
        })
        .await
    }

    /// Waits until `seat`'s cluster waits for machines.
    pub(crate) async fn waiting_as(&self, seat: &Seat, cluster: &str) -> Value {
        eventually(WAIT, || async {
            let c = self.cluster_as(seat, cluster).await;
            (condition(&c, "MachinesAllocated")["reason"] == "InsufficientCapacity").then_some(c)
        })
        .await
    }

    async fn gone(&self, cluster: &str) {
        eventually(WAIT, || async {
            let status =
                self.app.get(self.cluster_path(cluster)).token(&self.tenant_token).send().await.status.as_u16();
            (status == 404).then_some(())
        })
        .await
    }

    pub(crate) async fn operation(&self, op: &Value) -> Value {
        self.app.get(format!("/v1/operations/{}", id(op))).token(&admin()).send().await.expect(200).json()
    }

    pub(crate) async fn scale(&self, cluster: &str, pool: &str, count: u32) -> Value {
        let path = format!("{}/node-pools/{pool}", self.cluster_path(cluster));
        self.app.patch(path).token(&self.tenant_token).json(&json!({ "count": count })).send().await.expect(202).json()
    }

    pub(crate) async fn delete(&self, cluster: &str) -> Value {
        self.app.delete(self.cluster_path(cluster)).token(&self.tenant_token).send().await.expect(202).json()
    }

    /// The value of one sample of the worker's metrics (`name{labels}` exactly as rendered);
    /// `None` when the series is not there.
    fn sample(&self, series: &str) -> Option<f64> {
        let mut out = String::new();
        self.metrics.render(&mut out);
        out.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// Waits until the API's `/metrics` (the database gauges, read at most every few seconds)
    /// has the line `line`.
    async fn gauge_shows(&self, line: &str) {
        eventually(WAIT, || async {
            let body = self.app.get("/metrics").send().await.expect(200).body.to_vec();
            String::from_utf8(body).expect("utf8").lines().any(|l| l == line).then_some(())
        })
        .await
    }

    /// Waits until the worker's metrics show `series` at `value`: a run records what it did just
    /// after committing it, so the API may show the effect a moment before.
    async fn metric_reaches(&self, series: &str, value: f64) {
        eventually(WAIT, || async { (self.sample(series) == Some(value)).then_some(()) }).await
    }

    pub(crate) async fn scalar(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.app.db.pool).await.expect(sql)
    }

    /// Like [`Lab::ready_as`] within [`CRASH_WAIT`], but a cluster that never gets there fails
    /// the test with what a reader needs to find the stall: the cluster's status, every
    /// machine's state and last error, the open jobs and the crashes injected so far.
    async fn ready_or_tell(&self, cluster: &str, crashes: &Crashes) {
        let end = std::time::Instant::now() + CRASH_WAIT;
        loop {
            let c = self.cluster(cluster).await;
            if c["status"]["phase"] == "ready" && c["status"]["observed_generation"] == c["generation"] {
                return;
            }
            if std::time::Instant::now() > end {
                let rows = |sql: &'static str| async move {
                    let rows: Vec<(String,)> = sqlx::query_as(sql).fetch_all(&self.app.db.pool).await.expect(sql);
                    rows.into_iter().map(|r| r.0).collect::<Vec<_>>().join("\n  ")
                };
                let machines = rows(
                    "select concat_ws(' ', name, state, status_version, last_error::text) from machines order by name",
                )
                .await;
                let jobs = rows(
                    "select concat_ws(' ', kind, target_id, state, attempts, run_at, locked_until, last_error::text) \
                     from jobs where state in ('queued', 'running') order by id",
                )
                .await;
                let mut crashed: Vec<String> = crashes.0.lock().expect("crash log").iter().cloned().collect();
                crashed.sort();
                panic!(
                    "cluster {cluster} not ready at its generation within {CRASH_WAIT:?}\ncluster: {c}\nmachines:\n  \
                     {machines}\nopen jobs:\n  {jobs}\ncrashes injected: {crashed:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The schema-level history invariants (docs/security.md).
    pub(crate) async fn check_invariants(&self) {
        let overlapping = self
            .scalar(
                "select count(*) from machine_allocations a join machine_allocations b \
                 on a.machine_id = b.machine_id and a.id < b.id \
                 and tstzrange(a.allocated_at, coalesce(a.released_at, 'infinity')) && \
                     tstzrange(b.allocated_at, coalesce(b.released_at, 'infinity'))",
            )
            .await;
        assert_eq!(overlapping, 0, "a machine was in two live allocations");
        // Every allocation used a clean completed after the machine's previous tenancy ended.
        let unclean = self
            .scalar(
                "select count(*) from machine_allocations a join machine_cleans c on c.id = a.clean_id \
                 where c.completed_at > a.allocated_at or exists (select 1 from machine_allocations p \
                   where p.machine_id = a.machine_id and p.allocated_at < a.allocated_at \
                   and (p.released_at is null or p.released_at > c.completed_at))",
            )
            .await;
        assert_eq!(unclean, 0, "an allocation without a clean since the last tenancy");
        let dirty_available = self
            .scalar(
                "select count(*) from machines m where m.state = 'available' and exists (\
                   select 1 from machine_allocations a where a.machine_id = m.id and a.released_at is not null \
                   and not exists (select 1 from machine_cleans c where c.machine_id = m.id \
                                   and c.completed_at >= a.released_at))",
            )
            .await;
        assert_eq!(dirty_available, 0, "a machine became available after a tenancy without a clean");
    }
}

/// The path of `seat`'s cluster.
pub(crate) fn cluster_path(seat: &Seat, cluster: &str) -> String {
    format!("/v1/tenants/{}/clusters/{cluster}", seat.tenant)
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// A Slurm cluster of `pools`; the first is its system pool unless a pool names its role.
pub(crate) fn slurm(name: &str, mut pools: Value) -> Value {
    let list = pools.as_array_mut().expect("pools");
    if !list.iter().any(|p| p.get("role").is_some()) {
        if let Some(first) = list.first_mut() {
            first["role"] = json!("system");
        }
    }
    json!({ "name": name, "kind": "slurm", "isolation": "private-nodes", "node_pools": pools })
}

/// A compute pool `gpu` of `count` and a system pool `sys` of one machine, both of class gpu.
pub(crate) fn gpu_and_system(count: u32) -> Value {
    json!([
        { "name": "gpu", "machine_class": "gpu", "count": count },
        { "name": "sys", "machine_class": "gpu", "count": 1, "role": "system" },
    ])
}

/// The id of `cluster`'s pool `name`.
pub(crate) fn pool_named(cluster: &Value, name: &str) -> String {
    let pools = cluster["node_pools"].as_array().expect("pools");
    id(pools.iter().find(|p| p["name"] == name).expect("the pool"))
}

fn conditions(cluster: &Value) -> Vec<(String, String, String)> {
    cluster["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
            (s("type"), s("status"), s("reason"))
        })
        .collect()
}

pub(crate) fn condition(cluster: &Value, type_: &str) -> Value {
    cluster["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn a_slurm_cluster_goes_ready_scales_and_is_deleted_back_to_clean_machines() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("gpu", &["n1", "n2", "n3", "n4", "n5"]).await;
    assert_eq!(lab.scalar("select count(*) from machine_cleans").await, 5, "one verified wipe each");

    let created = lab.create(slurm("hpc", gpu_and_system(2))).await;
    let cluster = id(&created["cluster"]);
    let pool = pool_named(&created["cluster"], "gpu");
    let ready = lab.ready(&cluster).await;
    for (type_, status, _) in conditions(&ready) {
        assert_eq!(status, "True", "{type_}: {ready}");
    }
    assert!(ready["status"]["endpoints"]["kubernetes_api"].as_str().is_some_and(|e| e.starts_with("https://")));
    let op = lab.operation(&created["operation"]).await;
    assert_eq!(op["state"], "succeeded", "{op}");
    let steps: Vec<&str> =
        op["steps"].as_array().expect("steps").iter().map(|s| s["name"].as_str().expect("step name")).collect();
    assert_eq!(steps, ["namespace", "control_plane", "machines", "nodes", "stack", "slurm"]);
    assert!(op["steps"].as_array().expect("steps").iter().all(|s| s["state"] == "succeeded"), "{op}");
    let held = lab.scalar("select count(*) from machines where state = 'active'").await;
    assert_eq!(held, 3, "two compute machines and the system pool's");
    let pool_view = lab
        .app
        .get(format!("{}/node-pools/{pool}", lab.cluster_path(&cluster)))
        .token(&lab.tenant_token)
        .send()
        .await
        .expect(200)
        .json();
    assert_eq!((pool_view["status"]["ready"].as_u64(), pool_view["status"]["allocated"].as_u64()), (Some(2), Some(2)));
    // Tenant-visible machine list never shows BMC details, and names the node.
    let listed = lab
        .app
        .get(format!("{}/node-pools/{pool}/machines", lab.cluster_path(&cluster)))
        .token(&lab.tenant_token)
        .send()
        .await
        .expect(200)
        .json();
    assert_eq!(listed["items"].as_array().map(Vec::len), Some(2));
    assert!(listed["items"][0]["node_name"].as_str().is_some_and(|n| n.starts_with("m-")));
    assert!(!listed.to_string().contains("sim://"));
    // The cluster's machines, every pool's, by the ids a tenant names them with.
    let held = lab.app.get(format!("{}/machines", lab.cluster_path(&cluster))).token(&lab.tenant_token);
    let held = held.send().await.expect(200).json();
    let ids = |page: &Value| -> Vec<String> { page["items"].as_array().expect("items").iter().map(id).collect() };
    assert_eq!(ids(&held).len(), 3, "{held}");
    let of_pool: Vec<Value> = held["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|m| m["node_pool_id"] == pool.as_str())
        .cloned()
        .collect();
    assert_eq!(ids(&json!({ "items": of_pool })), ids(&listed), "the pool's machines are the pool's listing");
    let first = ids(&held)[0].clone();
    let one = lab.app.get(format!("{}/machines/{first}", lab.cluster_path(&cluster))).token(&lab.tenant_token);
    assert_eq!(one.send().await.expect(200).json(), held["items"][0]);

    // Scale up, then down: the pool converges and the operation completes at its generation.
    let up = lab.scale(&cluster, &pool, 3).await;
    lab.ready(&cluster).await;
    assert_eq!(lab.operation(&up["operation"]).await["state"], "succeeded");
    assert_eq!(lab.scalar("select count(*) from machines where state = 'active'").await, 4);
    let down = lab.scale(&cluster, &pool, 1).await;
    let after = lab.ready(&cluster).await;
    assert_eq!(lab.operation(&down["operation"]).await["state"], "succeeded");
    let gpu = after["node_pools"].as_array().expect("pools").iter().find(|p| p["name"] == "gpu").cloned();
    assert_eq!(gpu.expect("the gpu pool")["count"], 1);
    eventually(WAIT, || async {
        (lab.scalar("select count(*) from machines where state = 'available'").await == 3).then_some(())
    })
    .await;
    // Released machines went back through a wipe: seven cleans now (five first ones, two after release).
    assert_eq!(lab.scalar("select count(*) from machine_cleans").await, 7);
    // A released machine is no longer the tenant's to read.
    let kept = lab.app.get(format!("{}/machines", lab.cluster_path(&cluster))).token(&lab.tenant_token);
    let kept = ids(&kept.send().await.expect(200).json());
    assert_eq!(kept.len(), 2, "one compute machine and the system pool's");
    for gone in ids(&held).iter().filter(|m| !kept.contains(m)) {
        let path = format!("{}/machines/{gone}", lab.cluster_path(&cluster));
        assert_eq!(lab.app.get(path).token(&lab.tenant_token).send().await.status.as_u16(), 404);
    }

    // A patch that changes nothing is answered with an operation too, and it ends: the run it
    // asks for finds the cluster ready at its generation (before, it stayed pending for good).
    let same = lab
        .app
        .patch(lab.cluster_path(&cluster))
        .token(&lab.tenant_token)
        .json(&json!({ "kubernetes_version": after["kubernetes_version"] }))
        .send()
        .await
        .expect(202)
        .json();
    assert_eq!(same["cluster"]["generation"], after["generation"], "nothing changed");
    let same_pool = lab.scale(&cluster, &pool, 1).await;
    for op in [&same["operation"], &same_pool["operation"]] {
        let ended = eventually(WAIT, || async {
            let op = lab.operation(op).await;
            (op["state"] != "pending" && op["state"] != "running").then_some(op)
        })
        .await;
        assert_eq!(ended["state"], "succeeded", "{ended}");
    }

    // Delete: every machine back to available, through cleaning; then 404.
    let deleted = lab.delete(&cluster).await;
    assert_eq!(deleted["cluster"]["status"]["phase"], "deleting");
    lab.gone(&cluster).await;
    assert_eq!(lab.operation(&deleted["operation"]).await["state"], "succeeded");
    eventually(WAIT, || async {
        (lab.scalar("select count(*) from machines where state = 'available'").await == 5).then_some(())
    })
    .await;
    assert_eq!(lab.scalar("select count(*) from machine_allocations where released_at is null").await, 0);
    assert_eq!(lab.scalar("select count(*) from machine_cleans").await, 9);
    assert!(lab.world.nodes(ClusterId(cluster.parse().expect("cluster id"))).await.expect("nodes").is_empty());
    let events = lab
        .app
        .get(format!("{}/events", lab.cluster_path(&cluster)))
        .token(&lab.tenant_token)
        .send()
        .await
        .status
        .as_u16();
    assert_eq!(events, 404, "a deleted cluster's events are gone with it");
    lab.check_invariants().await;
}

#[tokio::test]
async fn demand_beyond_the_machines_waits_first_come_first_served_and_never_over_allocates() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("gpu", &["n1", "n2", "n3"]).await;
    let pool = |count: u32| json!([{ "name": "gpu", "machine_class": "gpu", "count": count }]);
    let a = id(&lab.create(slurm("a", pool(2))).await["cluster"]);
    lab.ready(&a).await;
    // B needs 2 of the 1 left: it waits, and takes nothing meanwhile (all or nothing).
    let b = id(&lab.create(slurm("b", pool(2))).await["cluster"]);
    let waiting = eventually(WAIT, || async {
        let c = lab.cluster(&b).await;
        (condition(&c, "MachinesAllocated")["reason"] == "InsufficientCapacity").then_some(c)
    })
    .await;
    assert_eq!(condition(&waiting, "MachinesAllocated")["status"], "False");
    assert_eq!(waiting["status"]["phase"], "provisioning");
    // C needs only the 1 left, but came later: first come, first served. Neither is told why
    // beyond waiting (nothing about the fleet, the free machines or an earlier request).
    let c = id(&lab.create(slurm("c", pool(1))).await["cluster"]);
    let behind = eventually(WAIT, || async {
        let v = lab.cluster(&c).await;
        (condition(&v, "MachinesAllocated")["reason"] == "InsufficientCapacity").then_some(v)
    })
    .await;
    for waiting in [&waiting, &behind] {
        let message = condition(waiting, "MachinesAllocated")["message"].as_str().unwrap_or_default().to_owned();
        assert!(
            message.starts_with("waiting for machines") && !message.chars().any(|c| c.is_ascii_digit()),
            "{message}"
        );
        assert!(!message.contains("earlier request") && !message.contains("available,"), "{message}");
    }
    // Once the passes that told them so are over (neither has a run in progress), still only A's 2.
    let running = format!("select count(*) from jobs where target_id in ('{b}', '{c}') and state = 'running'");
    eventually(WAIT, || async { (lab.scalar(&running).await == 0).then_some(()) }).await;
    assert_eq!(
        lab.scalar("select count(*) from machines where cluster_id is not null").await,
        2,
        "never over-allocated"
    );
    let events: Value = lab
        .app
        .get(format!("{}/events", lab.cluster_path(&b)))
        .token(&lab.tenant_token)
        .send()
        .await
        .expect(200)
        .json();
    assert!(
        events["items"].as_array().expect("items").iter().any(|e| e["reason"] == "InsufficientCapacity"),
        "{events}"
    );

    // A goes: its machines are wiped, then B (first in line) and then C get them.
    lab.delete(&a).await;
    lab.gone(&a).await;
    lab.ready(&b).await;
    lab.ready(&c).await;
    assert_eq!(lab.scalar("select count(*) from machines where state = 'active'").await, 3);
    lab.check_invariants().await;

    // Quota: the API refuses what a tenant may never hold (409), before anything waits.
    lab.app
        .patch(format!("/v1/tenants/{}", lab.tenant))
        .token(&admin())
        .json(&json!({ "quotas": { "max_nodes": 3 } }))
        .send()
        .await
        .expect(200);
    lab.app
        .post(format!("/v1/tenants/{}/clusters", lab.tenant))
        .token(&lab.tenant_token)
        .json(&slurm("d", pool(1)))
        .send()
        .await
        .problem(409, "quota_exceeded");
}

/// Allocation (docs/architecture.md) through the worker: a head that cannot be met holds the line of its class
/// only for `PADDOCK_ALLOCATION_HEAD_TIMEOUT`; a later, smaller request of another tenant is then
/// served (woken when the timeout ends, not a capacity wait later); machines freed after the
/// timeout are kept for the head, which is served once enough are released; the line goes on.
/// Nothing any tenant can read on the way names the fleet, another tenant or a platform error
/// (docs/api.md), also while its cluster's API server does not answer.
#[tokio::test]
async fn a_head_that_cannot_be_met_holds_the_line_only_until_its_timeout_and_nothing_a_tenant_reads_discloses_the_fleet(
) {
    let head_timeout = Duration::from_secs(2);
    let lab = Lab::tuned(|s| s.allocation_head_timeout = head_timeout, |d| d).await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("gpu", &["n1", "n2", "n3", "n4"]).await;
    let pool = |count: u32| json!([{ "name": "gpu", "machine_class": "gpu", "count": count }]);
    let (a, b, c) = (lab.own(), lab.seat("initech").await, lab.seat("umbrella").await);
    let x = id(&lab.create_as(&a, slurm("x", pool(3))).await["cluster"]);
    lab.ready_as(&a, &x, WAIT).await;
    // B's head wants three of the four; one is free: it waits at the head of the line.
    let head = id(&lab.create_as(&b, slurm("head", gpu_and_system(2))).await["cluster"]);
    lab.waiting_as(&b, &head).await;
    // A's small request fits the free machine but came later: behind the head until its timeout,
    // then served, woken when the timeout ends (a capacity wait is a minute).
    let small = id(&lab.create_as(&a, slurm("small", pool(1))).await["cluster"]);
    lab.waiting_as(&a, &small).await;
    let seats = [(&a, "acme"), (&b, "initech"), (&c, "umbrella")];
    for (seat, _) in seats {
        discloses_nothing(&lab, seat, &seats).await;
    }
    lab.ready_as(&a, &small, Duration::from_secs(30)).await;
    let since: DateTime<Utc> = sqlx::query_scalar("select waiting_since from clusters where id = $1::uuid")
        .bind(&head)
        .fetch_one(&lab.app.db.pool)
        .await
        .expect("the head still waits");
    let served: DateTime<Utc> =
        sqlx::query_scalar("select min(allocated_at) from machine_allocations where cluster_id = $1::uuid")
            .bind(&small)
            .fetch_one(&lab.app.db.pool)
            .await
            .expect("the small one's allocation");
    assert!(served >= since + head_timeout, "served at {served}, the head waits since {since}");

    // X goes: its three machines are wiped and kept for the head. C asks for one now, when any
    // of them would do: it gets none, the head gets all three.
    lab.delete(&x).await;
    let late = id(&lab.create_as(&c, slurm("late", pool(1))).await["cluster"]);
    lab.ready_as(&b, &head, WAIT).await;
    lab.waiting_as(&c, &late).await;
    let held_by_late = sqlx::query_scalar::<_, i64>("select count(*) from machines where cluster_id = $1::uuid")
        .bind(&late)
        .fetch_one(&lab.app.db.pool)
        .await
        .expect("count");
    assert_eq!(held_by_late, 0, "a machine freed after the head's timeout went to a later request");

    // The head's API server stops answering while B scales it down: its tenant is told a step is
    // retried, not why, and its machine stays its own until the node is gone.
    let head_id = ClusterId(head.parse().expect("cluster id"));
    lab.world.set_cluster_fault(head_id, ClusterFault::TenantUnreachable, true).await.expect("fault");
    let head_pool = pool_named(&lab.cluster_as(&b, &head).await, "gpu");
    let path = format!("{}/node-pools/{head_pool}", cluster_path(&b, &head));
    lab.app.patch(path).token(&b.token).json(&json!({ "count": 1 })).send().await.expect(202);
    eventually(WAIT, || async {
        let c = lab.cluster_as(&b, &head).await;
        (condition(&c, "Ready")["reason"] == "tenant_unreachable").then_some(())
    })
    .await;
    for (seat, _) in seats {
        discloses_nothing(&lab, seat, &seats).await;
    }
    // Healed, the line goes on: the machine the head let go is wiped and serves the late one.
    lab.world.set_cluster_fault(head_id, ClusterFault::TenantUnreachable, false).await.expect("heal");
    lab.ready_as(&b, &head, WAIT).await;
    lab.ready_as(&c, &late, WAIT).await;
    for (seat, _) in seats {
        discloses_nothing(&lab, seat, &seats).await;
    }
    lab.check_invariants().await;
}

/// Everything `seat` can read about itself: the tenant, its clusters with their events, node
/// pools and machines, its operations, audit events and isolation report.
async fn seen_by(lab: &Lab, seat: &Seat) -> Vec<Value> {
    let get = |path: String| async move { lab.app.get(path).token(&seat.token).send().await.expect(200).json() };
    let base = format!("/v1/tenants/{}", seat.tenant);
    let mut seen = vec![get(base.clone()).await];
    let clusters: Value = get(format!("{base}/clusters?limit=100")).await;
    for cluster in clusters["items"].as_array().expect("items") {
        let path = format!("{base}/clusters/{}", id(cluster));
        seen.push(get(format!("{path}/events?limit=100")).await);
        let pools: Value = get(format!("{path}/node-pools")).await;
        for pool in pools["items"].as_array().expect("items") {
            seen.push(get(format!("{path}/node-pools/{}/machines", id(pool))).await);
        }
        seen.push(pools);
        seen.push(get(format!("{path}/machines?limit=100")).await);
    }
    seen.push(clusters);
    for tail in ["operations?limit=100", "audit-events?limit=100", "isolation-report"] {
        seen.push(get(format!("{base}/{tail}")).await);
    }
    seen
}

/// What `seat` reads names no other tenant (its id, name or clusters), holds no platform error
/// text, and its messages carry no number but the sizes of its own node pools (nothing of the
/// fleet, of free machines or of other requests).
async fn discloses_nothing(lab: &Lab, seat: &Seat, seats: &[(&Seat, &str)]) {
    let seen = seen_by(lab, seat).await;
    let text = serde_json::to_string(&seen).expect("json");
    for (other, name) in seats.iter().filter(|(s, _)| s.tenant != seat.tenant) {
        assert!(!text.contains(&other.tenant) && !text.contains(&format!("\"{name}\"")), "{name} is named: {text}");
        let theirs: Vec<String> = sqlx::query_scalar("select id::text from clusters where tenant_id = $1::uuid")
            .bind(&other.tenant)
            .fetch_all(&lab.app.db.pool)
            .await
            .expect("clusters");
        for cluster in theirs {
            assert!(!text.contains(&cluster), "{name}'s cluster {cluster} is named: {text}");
        }
    }
    // Key material is random base64, which may spell anything ("...VSqLX..." did).
    let words = serde_json::to_string(&without_keys(Value::Array(seen.clone()))).expect("json").to_lowercase();
    for internal in ["simulated", "does not answer", "sim://", "images.invalid", "sqlx", "database error", "panicked"] {
        assert!(!words.contains(internal), "platform text {internal:?} reaches a tenant: {text}");
    }
    // Its own counts ("0 of 3 nodes ready", "3 machine(s) allocated") are at most what its pools
    // ask for or the machines it ever held.
    let own: i64 = sqlx::query_scalar(
        "select greatest((select count(*) from machine_allocations where tenant_id = $1::uuid), \
           (select coalesce(sum(p.count), 0) from node_pools p join clusters c on c.id = p.cluster_id \
             where c.tenant_id = $1::uuid))::bigint",
    )
    .bind(&seat.tenant)
    .fetch_one(&lab.app.db.pool)
    .await
    .expect("pool sizes");
    let mut messages = Vec::new();
    collect_messages(&Value::Array(seen.clone()), &mut messages);
    for message in messages {
        let numbers = message.split(|c: char| !c.is_ascii_digit()).filter(|n| !n.is_empty());
        for n in numbers {
            let n: i64 = n.parse().unwrap_or(i64::MAX);
            assert!(n <= own, "a number beyond what the tenant asked for or held ({own}) in {message:?}");
        }
    }
    // A wait for machines says nothing countable at all.
    for cluster in seen.iter().filter_map(|v| v["items"].as_array()).flatten() {
        let waiting = condition(cluster, "MachinesAllocated");
        if waiting["reason"] == "InsufficientCapacity" {
            let message = waiting["message"].as_str().unwrap_or_default();
            assert!(!message.chars().any(|c| c.is_ascii_digit()), "{message}");
        }
    }
}

/// `value` without its SSH keys and fingerprints.
fn without_keys(value: Value) -> Value {
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .filter(|(key, _)| !matches!(key.as_str(), "login_ssh_host_keys" | "ssh_authorized_keys"))
                .map(|(key, v)| (key, without_keys(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_keys).collect()),
        other => other,
    }
}

/// Every `message`, `detail` and `title` string in `value`.
fn collect_messages(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            for (key, v) in fields {
                match (key.as_str(), v) {
                    ("message" | "detail" | "title", Value::String(s)) => out.push(s.clone()),
                    _ => collect_messages(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_messages(v, out)),
        _ => {}
    }
}

#[tokio::test]
async fn a_failed_wipe_quarantines_the_machine_until_maintenance_takes_it_back_through_cleaning() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.world.set_machine_fault("bad", MachineFault::WipeFails, true).await.expect("fault");
    let ids = lab.enroll("gpu", &["bad"]).await;
    let m = lab.machine_in(&ids[0], "clean_failed").await;
    assert_eq!(m["last_error"]["code"], "wipe_failed", "{m}");
    assert!(m["last_error"]["message"].as_str().expect("message").contains("disk"), "{m}");
    assert_eq!(lab.scalar("select count(*) from machine_cleans").await, 0, "an unverified wipe is no clean");
    // The worker's scrape counts the failed wipe, and no completed one.
    lab.metric_reaches("paddock_wipe_failures_total{machine_class=\"gpu\",code=\"wipe_failed\"}", 1.0).await;
    assert_eq!(lab.sample("paddock_wipe_duration_seconds_count{machine_class=\"gpu\"}"), None);
    // The enrollment did not give the provider a usable machine: its operation failed, saying why.
    let enroll: (String, Option<String>) = eventually(WAIT, || async {
        let op: (String, Option<String>) = sqlx::query_as(
            "select state, error->>'code' from operations where target_id = $1::uuid and kind = 'machine_enroll'",
        )
        .bind(&ids[0])
        .fetch_one(&lab.app.db.pool)
        .await
        .expect("enroll operation");
        (op.0 != "running" && op.0 != "pending").then_some(op)
    })
    .await;
    assert_eq!(enroll, ("failed".to_owned(), Some("wipe_failed".to_owned())));

    // A cluster that wants it waits: a quarantined machine is never allocated.
    let cluster =
        id(&lab.create(slurm("hpc", json!([{ "name": "gpu", "machine_class": "gpu", "count": 1 }]))).await["cluster"]);
    eventually(WAIT, || async {
        (condition(&lab.cluster(&cluster).await, "MachinesAllocated")["reason"] == "InsufficientCapacity").then_some(())
    })
    .await;
    lab.gauge_shows("paddock_clusters_waiting_for_machines 1").await;

    // The operator takes it into maintenance, fixes it, and lets it go: it leaves through a wipe.
    let path = format!("/v1/machines/{}/maintenance", ids[0]);
    lab.app.post(&path).token(&admin()).json(&json!({ "reason": "replace disk1" })).send().await.expect(202);
    lab.machine_in(&ids[0], "maintenance").await;
    lab.world.set_machine_fault("bad", MachineFault::WipeFails, false).await.expect("fault");
    lab.app.delete(&path).token(&admin()).send().await.expect(202);
    lab.ready(&cluster).await;
    assert_eq!(lab.scalar("select count(*) from machine_cleans").await, 1);
    lab.check_invariants().await;

    // The worker's scrape: one wipe completed, one machine provisioned, one allocation, which
    // had waited in line (since the cluster's first try); no cluster waits any more.
    lab.gauge_shows("paddock_clusters_waiting_for_machines 0").await;
    lab.metric_reaches("paddock_wipe_duration_seconds_count{machine_class=\"gpu\"}", 1.0).await;
    lab.metric_reaches("paddock_provisioning_duration_seconds_count{machine_class=\"gpu\"}", 1.0).await;
    lab.metric_reaches("paddock_allocation_wait_seconds_count", 1.0).await;
    let waited = lab.sample("paddock_allocation_wait_seconds_sum").expect("the wait's sum");
    assert!(waited > 0.0, "the allocation waited for the machine's return: {waited}");
    assert_eq!(lab.sample("paddock_wipe_failures_total{machine_class=\"gpu\",code=\"wipe_failed\"}"), Some(1.0));
}

#[tokio::test]
async fn bmc_and_control_plane_faults_end_in_their_documented_states() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.world.set_machine_fault("one-slot", MachineFault::SingleVirtualMedia, true).await.expect("fault");
    lab.world.set_machine_fault("slow", MachineFault::BmcTimeout, true).await.expect("fault");
    let ids = lab.enroll("gpu", &["one-slot", "slow", "good"]).await;
    let m = lab.machine_in(&ids[0], "maintenance").await;
    assert_eq!(m["maintenance_reason"], "no_second_virtual_media", "{m}");
    let slow = eventually(WAIT, || async {
        let m = lab.machine(&ids[1]).await;
        (m["last_error"]["code"] == "bmc_timeout").then_some(m)
    })
    .await;
    assert_eq!(slow["state"], "enrolling", "a BMC that times out keeps the machine where it was");
    // Both failed BMC calls are on the worker's scrape (counted before the machine records them).
    for code in ["no_second_virtual_media", "bmc_timeout"] {
        let series = format!("paddock_driver_errors_total{{driver=\"bmc\",code=\"{code}\"}}");
        assert!(lab.sample(&series).is_some_and(|n| n >= 1.0), "{series}");
    }
    lab.machine_in(&ids[2], "available").await;
    // Healed, the slow one carries on by itself (retries with backoff).
    lab.world.set_machine_fault("slow", MachineFault::BmcTimeout, false).await.expect("heal");
    lab.machine_in(&ids[1], "available").await;

    // A control plane that never becomes ready: the cluster stays provisioning and says why;
    // its operation runs at the control plane step.
    let created = lab.create(slurm("stuck", json!([{ "name": "gpu", "machine_class": "gpu", "count": 1 }]))).await;
    let cluster = id(&created["cluster"]);
    lab.world
        .set_cluster_fault(ClusterId(cluster.parse().expect("cluster id")), ClusterFault::ControlPlaneNeverReady, true)
        .await
        .expect("fault");
    // Two passes of its reconcile find the control plane not ready (each ends waiting, converging).
    let pass = format!(
        "select coalesce(max(extract(epoch from run_at) * 1000000)::bigint, 0) from jobs where target_id = '{cluster}' \
         and kind = 'cluster_reconcile' and state = 'queued' and last_error->>'code' = 'converging'"
    );
    let at_control_plane = || async {
        let op = lab.operation(&created["operation"]).await;
        let c = lab.cluster(&cluster).await;
        op["current_step"] == "control_plane" && condition(&c, "ControlPlaneReady")["status"] == "False"
    };
    let first = eventually(WAIT, || async {
        let at = lab.scalar(&pass).await;
        (at > 0 && at_control_plane().await).then_some(at)
    })
    .await;
    eventually(WAIT, || async { (lab.scalar(&pass).await > first).then_some(()) }).await;
    let c = lab.cluster(&cluster).await;
    assert_eq!(c["status"]["phase"], "provisioning", "{c}");
    assert_eq!(condition(&c, "ControlPlaneReady")["status"], "False");
    let op = lab.operation(&created["operation"]).await;
    assert_eq!((op["state"].as_str(), op["current_step"].as_str()), (Some("running"), Some("control_plane")), "{op}");
    // Healed: ready.
    lab.world
        .set_cluster_fault(ClusterId(cluster.parse().expect("cluster id")), ClusterFault::ControlPlaneNeverReady, false)
        .await
        .expect("heal");
    lab.ready(&cluster).await;
    lab.check_invariants().await;
}

// ---------------------------------------------------------------------------------------------
// Crash injection: every driver call's side effect happens, then the run "crashes" before it can
// record it (the call answers a transient error once per distinct call). The job runs again
// from the top, repeats the side effect, and must converge to exactly the same end state.

/// Remembers which calls already crashed once.
#[derive(Default)]
pub(crate) struct Crashes(Mutex<HashSet<String>>);

impl Crashes {
    /// True the first time `key` is seen: the caller crashes after its side effect.
    fn first(&self, key: String) -> bool {
        self.0.lock().expect("lock").insert(key)
    }

    pub(crate) fn count(&self) -> usize {
        self.0.lock().expect("lock").len()
    }

    /// The calls that crashed.
    pub(crate) fn keys(&self) -> HashSet<String> {
        self.0.lock().expect("lock").clone()
    }
}

fn crash() -> DriverError {
    DriverError::transient("injected_crash", "the run crashed after its side effect (test)")
}

fn bmc_crash() -> BmcError {
    BmcError::new(BmcErrorKind::Transient, "injected_crash", "the run crashed after its side effect (test)")
}

pub(crate) struct CrashingBmc(pub(crate) Arc<dyn BmcDriver>, pub(crate) Arc<Crashes>);

impl BmcDriver for CrashingBmc {
    fn inspect<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<Inventory, BmcError>> {
        self.0.inspect(access)
    }

    fn boot_from_media<'a>(&'a self, a: &'a BmcAccess, media: &'a BootMedia) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            self.0.boot_from_media(a, media).await?;
            // Keyed by the seed: each boot of each run crashes once after booting.
            let key = format!("boot:{}:{}", a.machine_id, media.image_url);
            if self.1.first(key) {
                Err(bmc_crash())
            } else {
                Ok(())
            }
        })
    }

    fn finish_boot<'a>(&'a self, a: &'a BmcAccess, after: AfterBoot) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            self.0.finish_boot(a, after).await?;
            if self.1.first(format!("finish:{}:{after:?}", a.machine_id)) {
                Err(bmc_crash())
            } else {
                Ok(())
            }
        })
    }

    fn power_off<'a>(&'a self, a: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            self.0.power_off(a).await?;
            if self.1.first(format!("off:{}", a.machine_id)) {
                Err(bmc_crash())
            } else {
                Ok(())
            }
        })
    }

    // The power sync's calls pass through: these tests crash the lifecycle's steps only.
    fn power_on<'a>(&'a self, a: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        self.0.power_on(a)
    }

    fn system_status<'a>(&'a self, a: &'a BmcAccess) -> BoxFuture<'a, Result<SystemStatus, BmcError>> {
        self.0.system_status(a)
    }
}

struct CrashingKube(KubeDrivers, Arc<Crashes>);

impl CrashingKube {
    fn after<T>(&self, key: String, result: Result<T, DriverError>) -> Result<T, DriverError> {
        let value = result?;
        if self.1.first(key) {
            Err(crash())
        } else {
            Ok(value)
        }
    }
}

impl PlatformDriver for CrashingKube {
    fn ensure_isolation<'a>(&'a self, c: &'a ClusterRef) -> BoxFuture<'a, Result<Isolation, DriverError>> {
        Box::pin(async move { self.after(format!("iso:{}", c.cluster_id), self.0.platform.ensure_isolation(c).await) })
    }

    fn remove_isolation<'a>(&'a self, c: &'a ClusterRef) -> BoxFuture<'a, Result<Removal, DriverError>> {
        Box::pin(
            async move { self.after(format!("uniso:{}", c.cluster_id), self.0.platform.remove_isolation(c).await) },
        )
    }
}

impl ControlPlaneBackend for CrashingKube {
    fn ensure_control_plane<'a>(
        &'a self,
        spec: &'a ControlPlaneSpec,
    ) -> BoxFuture<'a, Result<ControlPlaneStatus, DriverError>> {
        Box::pin(async move {
            let result = self.0.control_plane.ensure_control_plane(spec).await;
            self.after(format!("cp:{}", spec.cluster.cluster_id), result)
        })
    }

    fn delete_control_plane<'a>(&'a self, c: &'a ClusterRef) -> BoxFuture<'a, Result<Removal, DriverError>> {
        Box::pin(async move {
            self.after(format!("uncp:{}", c.cluster_id), self.0.control_plane.delete_control_plane(c).await)
        })
    }
}

impl TenantNodes for CrashingKube {
    fn join_config<'a>(
        &'a self,
        t: &'a TenantAccess,
        node: &'a NodeRef,
        ttl: u64,
    ) -> BoxFuture<'a, Result<JoinConfig, DriverError>> {
        Box::pin(async move {
            self.after(format!("join:{}", node.machine_id), self.0.nodes.join_config(t, node, ttl).await)
        })
    }

    fn node<'a>(
        &'a self,
        t: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Option<NodeStatus>, DriverError>> {
        self.0.nodes.node(t, node)
    }

    fn registered_nodes<'a>(&'a self, t: &'a TenantAccess) -> BoxFuture<'a, Result<Vec<RegisteredNode>, DriverError>> {
        self.0.nodes.registered_nodes(t)
    }

    fn drain_node<'a>(&'a self, t: &'a TenantAccess, node: &'a NodeRef) -> BoxFuture<'a, Result<Drain, DriverError>> {
        self.0.nodes.drain_node(t, node)
    }

    fn foreign_node<'a>(
        &'a self,
        t: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Option<String>, DriverError>> {
        self.0.nodes.foreign_node(t, node)
    }

    fn remove_node<'a>(
        &'a self,
        t: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Removal, DriverError>> {
        Box::pin(
            async move { self.after(format!("unnode:{}", node.machine_id), self.0.nodes.remove_node(t, node).await) },
        )
    }

    fn delete_join_tokens<'a>(
        &'a self,
        t: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            self.after(format!("untoken:{}", node.machine_id), self.0.nodes.delete_join_tokens(t, node).await)
        })
    }

    fn abandon_node<'a>(&'a self, t: &'a TenantAccess, node: &'a NodeRef) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(
            async move { self.after(format!("abandon:{}", node.machine_id), self.0.nodes.abandon_node(t, node).await) },
        )
    }
}

impl TenantStack for CrashingKube {
    fn ensure_stack<'a>(
        &'a self,
        t: &'a TenantAccess,
        version: &'a str,
        kind: paddock_types::cluster::ClusterKind,
    ) -> BoxFuture<'a, Result<StackStatus, DriverError>> {
        Box::pin(async move {
            self.after(format!("stack:{}", t.cluster.cluster_id), self.0.stack.ensure_stack(t, version, kind).await)
        })
    }
}

impl TenantCredentials for CrashingKube {
    fn tenant_kubeconfig<'a>(
        &'a self,
        t: &'a TenantAccess,
        ttl: u64,
    ) -> BoxFuture<'a, Result<SecretString, DriverError>> {
        self.0.credentials.tenant_kubeconfig(t, ttl)
    }
}

impl SlurmDriver for CrashingKube {
    fn ensure_slurm<'a>(
        &'a self,
        t: &'a TenantAccess,
        d: &'a SlurmDesired,
    ) -> BoxFuture<'a, Result<SlurmStatus, DriverError>> {
        Box::pin(
            async move { self.after(format!("slurm:{}", t.cluster.cluster_id), self.0.slurm.ensure_slurm(t, d).await) },
        )
    }

    fn drain_node<'a>(
        &'a self,
        t: &'a TenantAccess,
        slurm: &'a SlurmVersion,
        node: &'a str,
    ) -> BoxFuture<'a, Result<SlurmDrain, DriverError>> {
        Box::pin(async move { self.after(format!("drain:{node}"), self.0.slurm.drain_node(t, slurm, node).await) })
    }

    fn remove_slurm<'a>(&'a self, t: &'a TenantAccess) -> BoxFuture<'a, Result<Removal, DriverError>> {
        Box::pin(
            async move { self.after(format!("unslurm:{}", t.cluster.cluster_id), self.0.slurm.remove_slurm(t).await) },
        )
    }
}

#[tokio::test]
async fn a_crash_after_every_side_effect_repeats_it_and_converges_to_the_same_end() {
    let crashes = Arc::new(Crashes::default());
    let injected = crashes.clone();
    let lab = Lab::with(move |drivers| {
        let inner = drivers.kube.expect("kube");
        // Ray is the simulated one as it is: this test's cluster is a Slurm one.
        let ray = inner.ray.clone();
        let kube = Arc::new(CrashingKube(inner, injected.clone()));
        Drivers {
            bmc: Some(Arc::new(CrashingBmc(drivers.bmc.expect("bmc"), injected))),
            kube: Some(KubeDrivers {
                platform: kube.clone(),
                control_plane: kube.clone(),
                nodes: kube.clone(),
                stack: kube.clone(),
                slurm: kube.clone(),
                ray,
                credentials: kube,
            }),
        }
    })
    .await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("gpu", &["n1", "n2", "n3", "n4"]).await;
    let created = lab.create(slurm("hpc", gpu_and_system(2))).await;
    let cluster = id(&created["cluster"]);
    let pool = pool_named(&created["cluster"], "gpu");
    lab.ready_or_tell(&cluster, &crashes).await;
    lab.scale(&cluster, &pool, 1).await;
    lab.ready_or_tell(&cluster, &crashes).await;
    lab.delete(&cluster).await;
    lab.gone(&cluster).await;
    eventually(WAIT, || async {
        (lab.scalar("select count(*) from machines where state = 'available'").await == 4).then_some(())
    })
    .await;
    // The same end as without crashes: every machine wiped once per tenancy, nothing held.
    assert_eq!(lab.scalar("select count(*) from machine_allocations").await, 3);
    assert_eq!(lab.scalar("select count(*) from machine_cleans").await, 7);
    assert_eq!(lab.scalar("select count(*) from machine_allocations where released_at is null").await, 0);
    assert_eq!(lab.scalar("select count(*) from jobs where state = 'failed'").await, 0);
    // Every kind of side effect crashed at least once.
    let seen: Vec<String> = crashes
        .0
        .lock()
        .expect("crash log")
        .iter()
        .map(|k| k.split(':').next().unwrap_or_default().to_owned())
        .collect();
    for kind in
        ["boot", "finish", "off", "iso", "cp", "join", "stack", "slurm", "drain", "unnode", "unslurm", "uncp", "uniso"]
    {
        assert!(seen.iter().any(|k| k == kind), "no crash injected after {kind}: {seen:?}");
    }
    assert!(crashes.count() > 20, "{} crashes", crashes.count());
    lab.check_invariants().await;
}

/// A machine's time, by conservation categories of docs/billing.md, in whole seconds.
#[derive(Debug, Default, PartialEq, Eq)]
struct Conservation {
    billable: i64,
    provisioning: i64,
    cleaning: i64,
    maintenance: i64,
    unallocated: i64,
}

impl Conservation {
    fn add(&mut self, state: &str, after_active: bool, seconds: i64) {
        let slot = match state {
            "active" => &mut self.billable,
            "releasing" if after_active => &mut self.billable,
            "allocated" | "provisioning" | "provision_failed" | "releasing" => &mut self.provisioning,
            "cleaning" => &mut self.cleaning,
            "maintenance" | "clean_failed" => &mut self.maintenance,
            _ => &mut self.unallocated,
        };
        *slot += seconds;
    }

    fn total(&self) -> i64 {
        self.billable + self.provisioning + self.cleaning + self.maintenance + self.unallocated
    }
}

/// A billable stretch of the ledger: `[start, end)`.
type Stretch = (DateTime<Utc>, DateTime<Utc>);

/// One machine's categories over `[from, to)` from its custody ledger alone (every state change,
/// in chain order, at the whole second of its transaction), and its billable stretches: from an
/// entry into `active` to the entry that ends the tenant's control (the one after `active` other
/// than the start of the release: the power-off that ends the release, or a forced release).
/// Nothing here reads the usage tables: the meter is compared with this, not with itself.
fn categorize(
    entries: &[(DateTime<Utc>, Option<String>, String)],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> (Conservation, Vec<Stretch>) {
    let second = chrono::Duration::seconds(1);
    // Boundaries: (time, state from then on, whether a release follows `active`).
    let mut bounds: Vec<(DateTime<Utc>, Option<String>, bool)> = Vec::new();
    let mut stretches = Vec::new();
    let mut billing_since: Option<DateTime<Utc>> = None;
    for (at, from_state, to_state) in entries {
        let mut t = at.duration_trunc(second).unwrap_or(*at);
        // An entry's transaction may have started (its `at`) before the previous one committed
        // and then waited for the machine's row: the order is the chain's.
        if let Some(last) = bounds.last() {
            t = t.max(last.0);
        }
        let after_active = if to_state == "active" {
            billing_since = Some(t);
            true
        } else if to_state == "releasing" && from_state.as_deref() == Some("active") {
            true
        } else {
            if let Some(start) = billing_since.take() {
                stretches.push((start, t));
            }
            false
        };
        if to_state == "retired" {
            bounds.push((t, None, false));
            break;
        }
        bounds.push((t, Some(to_state.clone()), after_active));
    }
    if let Some(start) = billing_since {
        stretches.push((start, to));
    }
    let mut sums = Conservation::default();
    for (i, (start, state, after)) in bounds.iter().enumerate() {
        let end = bounds.get(i + 1).map_or(to, |b| b.0);
        let Some(state) = state else { break };
        let (s, e) = ((*start).max(from), end.min(to));
        if e > s {
            sums.add(state, *after, (e - s).num_seconds());
        }
    }
    (sums, stretches)
}

/// Checks the meter's records of one machine against its ledger's billable stretches: one record
/// per stretch, each bound within the second after the ledger's (a segment's bounds are the
/// whole seconds of the writing transaction's clock, the ledger's those of its start), and
/// `node_seconds` the record's own length.
fn check_meter(machine: &str, records: &[&Value], stretches: &[Stretch]) {
    assert_eq!(records.len(), stretches.len(), "machine {machine}: one record per tenancy: {records:?} {stretches:?}");
    let second = chrono::Duration::seconds(1);
    let time = |r: &Value, k: &str| -> DateTime<Utc> { r[k].as_str().expect("a time").parse().expect("RFC 3339") };
    for (r, (start, end)) in records.iter().zip(stretches) {
        let (rs, re) = (time(r, "start"), time(r, "end"));
        assert!(rs >= *start && rs - *start <= second, "machine {machine}: metered from {rs}, active at {start}");
        assert!(re >= *end && re - *end <= second, "machine {machine}: metered to {re}, control ended at {end}");
        assert_eq!(r["node_seconds"].as_i64(), Some((re - rs).num_seconds()), "machine {machine}: {r}");
    }
}

/// The usage watermark, once it is past `after` (the meter counts whole seconds: a state held
/// this long is seconds, not zero).
async fn watermark_past(app: &TestApp, after: DateTime<Utc>) -> DateTime<Utc> {
    eventually(WAIT, || async {
        let page = app.get("/v1/usage/records?from=2000-01-01T00:00:00Z&to=2000-01-02T00:00:00Z").token(&admin());
        let as_of: DateTime<Utc> = page.send().await.expect(200).json()["as_of"].as_str()?.parse().ok()?;
        if as_of > after {
            return Some(as_of);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        None
    })
    .await
}

#[tokio::test]
async fn conservation_per_machine_the_categories_add_up_to_the_wall_clock_seconds() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    let machines = lab.available("gpu", &["n1", "n2", "n3", "n4"]).await;
    // Tenancies of varying length: a compute pool up to 2, up to 3, down to 1, deleted, beside a
    // system pool of one; then a round of maintenance, which leaves through cleaning.
    let created = lab.create(slurm("hpc", gpu_and_system(2))).await;
    let cluster = id(&created["cluster"]);
    let pool = pool_named(&created["cluster"], "gpu");
    lab.ready(&cluster).await;
    watermark_past(&lab.app, Utc::now() + chrono::Duration::seconds(2)).await;
    lab.scale(&cluster, &pool, 3).await;
    lab.ready(&cluster).await;
    watermark_past(&lab.app, Utc::now() + chrono::Duration::seconds(1)).await;
    lab.scale(&cluster, &pool, 1).await;
    lab.ready(&cluster).await;
    watermark_past(&lab.app, Utc::now() + chrono::Duration::seconds(1)).await;
    lab.delete(&cluster).await;
    lab.gone(&cluster).await;
    for m in &machines {
        lab.machine_in(m, "available").await;
    }
    lab.app
        .post(format!("/v1/machines/{}/maintenance", machines[0]))
        .token(&admin())
        .json(&json!({ "reason": "fan swap" }))
        .send()
        .await
        .expect(202);
    lab.machine_in(&machines[0], "maintenance").await;
    lab.app.delete(format!("/v1/machines/{}/maintenance", machines[0])).token(&admin()).send().await.expect(202);
    lab.machine_in(&machines[0], "available").await;

    // Per machine, the period from its enrollment to a watermark taken once all is quiet; billable
    // seconds as the meter reads them (the records API), the rest from the ledger.
    let last: DateTime<Utc> = sqlx::query_scalar("select max(at) from custody_entries")
        .fetch_one(&lab.app.db.pool)
        .await
        .expect("last entry");
    let as_of = watermark_past(&lab.app, last + chrono::Duration::seconds(1)).await;
    let first: DateTime<Utc> = sqlx::query_scalar("select date_trunc('second', min(at)) from custody_entries")
        .fetch_one(&lab.app.db.pool)
        .await
        .expect("first entry");
    let range = format!(
        "from={}&to={}&as_of={}&kind=machine&limit=1000",
        first.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        as_of.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        as_of.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    let records = lab.app.get(format!("/v1/usage/records?{range}")).token(&admin()).send().await.expect(200).json();
    assert!(records["next_cursor"].is_null(), "one page holds them: {records}");
    let mut tenancies = 0;
    for m in &machines {
        let uuid: Uuid = m.parse().expect("uuid");
        let entries: Vec<(DateTime<Utc>, Option<String>, String)> = sqlx::query_as(
            "select at, from_state, to_state from custody_entries where machine_id = $1 and at < $2 order by seq",
        )
        .bind(uuid)
        .bind(as_of)
        .fetch_all(&lab.app.db.pool)
        .await
        .expect("ledger");
        let enrolled = entries.first().expect("an enrollment entry").0;
        let enrolled = enrolled.duration_trunc(chrono::Duration::seconds(1)).expect("whole seconds");
        let (sums, stretches) = categorize(&entries, enrolled, as_of);
        tenancies += stretches.len();
        let mine: Vec<&Value> =
            records["items"].as_array().expect("items").iter().filter(|r| r["machine_id"] == m.as_str()).collect();
        check_meter(m, &mine, &stretches);
        // Billable seconds as the API meters them, every other category from the ledger: they add
        // up to the wall clock, up to the second each tenancy's two bounds may lie after the
        // ledger's.
        let metered: i64 = mine.iter().map(|r| r["node_seconds"].as_i64().expect("node_seconds")).sum();
        let conserved = Conservation { billable: metered, ..sums };
        let wall = (as_of - enrolled).num_seconds();
        let slack = 2 * i64::try_from(stretches.len()).expect("few");
        assert!(
            (conserved.total() - wall).abs() <= slack,
            "machine {m}: {conserved:?} adds up to {} of {wall} wall-clock seconds (ledger billable {})",
            conserved.total(),
            sums.billable
        );
    }
    assert_eq!(tenancies, 4, "up to three compute machines and the system pool's, one tenancy each");
}
