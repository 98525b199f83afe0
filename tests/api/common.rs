//! Fixtures made through the API itself.

use paddock_testkit::{admin, TestApp};
use serde_json::{json, Value};

/// Creates a tenant named `name`; returns its view.
pub async fn tenant(app: &TestApp, name: &str) -> Value {
    app.post("/v1/tenants").token(&admin()).json(&json!({ "name": name })).send().await.expect(201).json()
}

/// The id of a view.
pub fn id(view: &Value) -> String {
    view["id"].as_str().expect("view has an id").to_owned()
}

/// Creates a machine class with `gpus` GPUs.
pub async fn machine_class(app: &TestApp, name: &str, gpus: u32) -> Value {
    let model = if gpus > 0 { "NVIDIA H100" } else { "" };
    app.post("/v1/machine-classes")
        .token(&admin())
        .json(&json!({ "name": name, "cpu_cores": 64, "memory_gib": 512, "gpu_model": model, "gpu_count": gpus }))
        .send()
        .await
        .expect(201)
        .json()
}

/// Closes billing period `period` as provider:admin with idempotency key `key` (a first close:
/// 201); returns the answer `{manifest, signature, key_id}`.
pub async fn close_period(app: &TestApp, period: &str, key: &str) -> Value {
    app.post(format!("/v1/usage/periods/{period}/close"))
        .token(&admin())
        .header("idempotency-key", key)
        .send()
        .await
        .expect(201)
        .json()
}

/// An enrollment body.
pub fn enroll_body(name: &str, class: &str) -> Value {
    json!({
        "name": name,
        "machine_class": class,
        "labels": { "rack": "r1" },
        "bmc": { "url": format!("https://bmc-{name}.example:443"), "username": "admin", "password": "s3cret-pw" }
    })
}

/// Enrolls a machine; returns the machine view.
pub async fn machine(app: &TestApp, name: &str, class: &str) -> Value {
    let body = app.post("/v1/machines").token(&admin()).json(&enroll_body(name, class)).send().await.expect(202).json();
    body["machine"].clone()
}

/// Moves a machine to `state` directly in the database, as the worker would, keeping the
/// schema's invariants: an available machine gets a fixture clean; a tenancy state gets a
/// fixture holder (a tenant, cluster and pool of its own) unless it already has one; leaving a
/// tenancy closes the allocation.
pub async fn set_machine_state(app: &TestApp, machine_id: &str, state: &str) {
    hold_machine(app, machine_id, None, state).await;
}

/// Like [`set_machine_state`], for a tenancy state with the holder `(tenant, cluster, pool)`;
/// `None` parts are made up (a fixture cluster and pool in the tenant, or a fixture tenant).
pub async fn hold_machine(app: &TestApp, machine_id: &str, holder: Option<(&str, Option<(&str, &str)>)>, state: &str) {
    let pool = &app.db.pool;
    let tenancy = ["allocated", "provisioning", "active", "releasing", "provision_failed"].contains(&state);
    let held: Option<uuid::Uuid> = sqlx::query_scalar("select allocation_id from machines where id = $1::uuid")
        .bind(machine_id)
        .fetch_one(pool)
        .await
        .expect("machine");
    if tenancy && held.is_none() {
        let tenant: String = match holder {
            Some((t, _)) => t.to_owned(),
            None => sqlx::query_scalar(
                "insert into tenants (id, name, display_name) values (gen_random_uuid(), \
                 'fx-' || substr(md5(random()::text), 1, 10), 'fixture') returning id::text",
            )
            .fetch_one(pool)
            .await
            .expect("fixture tenant"),
        };
        let (cluster, node_pool): (String, String) = match holder.and_then(|(_, c)| c) {
            Some((c, p)) => (c.to_owned(), p.to_owned()),
            None => sqlx::query_as(
                "with c as (insert into clusters (id, tenant_id, name, kind, isolation, kubernetes_version, \
                   stack_version) values (gen_random_uuid(), $1::uuid, 'fx-' || substr(md5(random()::text), 1, 10), \
                   'kubernetes', 'private-nodes', 'v1.34.1', '2026.12.0') returning id) \
                 insert into node_pools (id, tenant_id, cluster_id, name, machine_class_id, count) \
                 select gen_random_uuid(), $1::uuid, c.id, 'fx', m.machine_class_id, 0 from c, machines m \
                 where m.id = $2::uuid returning cluster_id::text, id::text",
            )
            .bind(&tenant)
            .bind(machine_id)
            .fetch_one(pool)
            .await
            .expect("fixture cluster"),
        };
        sqlx::query(
            "with cl as (insert into machine_cleans (id, machine_id, run_id, method, evidence) \
               values (gen_random_uuid(), $1::uuid, gen_random_uuid(), 'fixture', '{}') returning id), \
             a as (insert into machine_allocations (id, machine_id, clean_id, tenant_id, cluster_id, node_pool_id) \
               select gen_random_uuid(), $1::uuid, cl.id, $3::uuid, $4::uuid, $5::uuid from cl returning id) \
             update machines set state = $2, allocation_id = a.id, tenant_id = $3::uuid, cluster_id = $4::uuid, \
               node_pool_id = $5::uuid, clean_id = null from a where machines.id = $1::uuid",
        )
        .bind(machine_id)
        .bind(state)
        .bind(&tenant)
        .bind(&cluster)
        .bind(&node_pool)
        .execute(pool)
        .await
        .expect("holding the machine");
        return;
    }
    // Leaving a tenancy closes the allocation and clears the holder in the same statement.
    sqlx::query(
        "with a as (update machine_allocations set released_at = now() where $3 and id = \
           (select allocation_id from machines where id = $1::uuid)), \
         clean as (insert into machine_cleans (id, machine_id, run_id, method, evidence) \
           select gen_random_uuid(), $1::uuid, gen_random_uuid(), 'fixture', '{}' where $2 = 'available' returning id) \
         update machines set state = $2, clean_id = (select id from clean), \
         allocation_id = case when $3 then null else allocation_id end, \
         tenant_id = case when $3 then null else tenant_id end, cluster_id = case when $3 then null else cluster_id end, \
         node_pool_id = case when $3 then null else node_pool_id end, \
         retired_at = case when $2 = 'retired' then now() else retired_at end where id = $1::uuid",
    )
    .bind(machine_id)
    .bind(state)
    .bind(!tenancy && held.is_some())
    .execute(pool)
    .await
    .expect("setting the machine state");
}

/// Enrolls `count` machines of `class` (named `<class>-<i>`), so that node pools of up to that
/// many nodes fit the fleet (a larger one is refused: 409 `insufficient_capacity`). No worker
/// runs in the API tests: they stay enrolling, never allocated.
pub async fn fleet(app: &TestApp, class: &str, count: usize) {
    for i in 0..count {
        machine(app, &format!("{class}-{i}"), class).await;
    }
}

/// The reconcilers' settings of the labs that run a worker: the simulated images, quick polls.
pub fn lab_settings() -> paddock_worker::reconcile::Settings {
    paddock_worker::reconcile::Settings {
        wipe_image_url: Some("http://images.invalid/wipe.iso".into()),
        os_image_url: Some("http://images.invalid/os.iso".into()),
        poll: std::time::Duration::from_millis(50),
        report_wait: std::time::Duration::from_secs(2),
        ..paddock_worker::reconcile::Settings::default()
    }
}

/// The labs' worker settings: quick polls and backoff, many attempts.
pub fn lab_worker_config() -> paddock_worker::WorkerConfig {
    paddock_worker::WorkerConfig {
        concurrency: 8,
        poll_interval: std::time::Duration::from_millis(50),
        backoff_base: std::time::Duration::from_millis(10),
        backoff_cap: std::time::Duration::from_millis(200),
        max_attempts: 100,
        ..paddock_worker::WorkerConfig::default()
    }
}

/// Runs, in this test's runtime, a worker named `name` with the machine and cluster reconcilers
/// (and the clusters' drift and demand checks)
/// over `drivers`, and the simulated machines' agent reporting to the served `app`, until the
/// returned sender says stop or is dropped; and the worker's metrics (what the `/metrics` of a
/// process running it renders).
pub fn run_worker(
    app: &TestApp,
    world: &paddock_sim::SimWorld,
    drivers: paddock_worker::reconcile::Drivers,
    settings: paddock_worker::reconcile::Settings,
    config: paddock_worker::WorkerConfig,
    name: &str,
) -> (tokio::sync::watch::Sender<bool>, std::sync::Arc<paddock_worker::WorkerMetrics>) {
    use paddock_worker::reconcile::{
        Autoscaler, ClusterReconciler, DriftCheck, IdentitySync, MachineReconciler, PowerCycle, PowerSync,
    };
    let clusters = ClusterReconciler::new(app.services.clone(), drivers.clone(), settings.clone());
    let sync = PowerSync::new(app.services.clone(), drivers.clone(), Default::default());
    let handlers: Vec<std::sync::Arc<dyn paddock_worker::JobHandler>> = vec![
        std::sync::Arc::new(PowerCycle::new(sync)),
        std::sync::Arc::new(MachineReconciler::new(app.services.clone(), drivers, settings)),
        std::sync::Arc::new(DriftCheck(clusters.clone())),
        std::sync::Arc::new(Autoscaler(clusters.clone())),
        std::sync::Arc::new(IdentitySync(clusters.clone())),
        std::sync::Arc::new(clusters),
    ];
    let store = paddock_store::Store::from_pool(app.db.pool.clone());
    let worker = paddock_worker::Worker::new(store, name, handlers, config).expect("worker");
    let metrics = worker.metrics();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut worker_stop = stopped.clone();
    tokio::spawn(async move {
        worker
            .run(async move {
                let _ = worker_stop.changed().await;
            })
            .await
    });
    let client = reqwest::Client::builder().timeout(std::time::Duration::from_secs(10)).build().expect("client");
    tokio::spawn(world.agent(client).run(stopped));
    (stop, metrics)
}

/// The API served on a fresh database through a new role granted what the runtime role gets
/// (`paddock_grant_runtime`), not the owner: what the product may and may not do to its tables.
pub async fn served_as_runtime_role() -> TestApp {
    let owner = paddock_testkit::TestDb::new().await;
    let role = format!("runtime_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(&format!("create role {role} login")).execute(&owner.pool).await.expect("create role");
    paddock_store::Store::from_pool(owner.pool.clone()).grant_runtime(&role).await.expect("grant");
    let options: sqlx::postgres::PgConnectOptions = owner.url.parse().expect("url");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.username(&role))
        .await
        .expect("connecting as the runtime role");
    TestApp::served_on(paddock_testkit::TestDb { name: owner.name.clone(), url: owner.url.clone(), pool }).await
}
