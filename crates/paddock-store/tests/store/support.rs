//! Fixtures: tenants, classes, clean available machines and clusters, written with the store's
//! own functions where it has them, else with the SQL of the state they stand for.

use paddock_domain::cluster::{ClusterSpec, NodePoolSpec};
use paddock_store::allocation::Need;
use paddock_store::{cluster, machine_class, node_pool, Store};
use paddock_testkit::TestDb;
use paddock_types::cluster::{ClusterKind, Isolation};
use paddock_types::machine_class::MachineClassCreate;
use paddock_types::{ClusterId, MachineClassId, MachineId, NodePoolId, TenantId};
use uuid::Uuid;

/// A fresh database and a store over it.
pub async fn db() -> (TestDb, Store) {
    let db = TestDb::new().await;
    let store = Store::from_pool(db.pool.clone());
    (db, store)
}

/// A tenant with these node and GPU quotas.
pub async fn tenant(store: &Store, max_nodes: Option<i32>, max_gpus: Option<i32>) -> TenantId {
    let id = TenantId::new();
    sqlx::query("insert into tenants (id, name, display_name, max_nodes, max_gpus) values ($1, $2, $2, $3, $4)")
        .bind(id.uuid())
        .bind(format!("t-{}", id.uuid().simple()))
        .bind(max_nodes)
        .bind(max_gpus)
        .execute(store.pool())
        .await
        .expect("tenant");
    id
}

/// A machine class of `gpus` GPUs per machine.
pub async fn class(store: &Store, name: &str, gpus: u32) -> MachineClassId {
    let spec = MachineClassCreate {
        name: name.to_owned(),
        cpu_cores: 64,
        memory_gib: 512,
        gpu_model: if gpus > 0 { "H100".to_owned() } else { String::new() },
        gpu_count: gpus,
        description: String::new(),
        price: None,
        acceptance: None,
    };
    let id = MachineClassId::new();
    let mut conn = store.conn().await.expect("conn");
    machine_class::insert(&mut conn, id, &spec).await.expect("class");
    id
}

/// An `available` machine of `class` with its verified clean on record.
pub async fn machine(store: &Store, class: MachineClassId) -> MachineId {
    let id = MachineId::new();
    let clean = Uuid::now_v7();
    let mut tx = store.pool().begin().await.expect("begin");
    sqlx::query(
        "insert into machines (id, name, machine_class_id, state, bmc_url, bmc_username, bmc_password_enc) \
         values ($1, $2, $3, 'cleaning', 'https://bmc-' || $2 || '.invalid', 'u', '\\x00')",
    )
    .bind(id.uuid())
    .bind(format!("m-{}", id.uuid().simple()))
    .bind(class.uuid())
    .execute(&mut *tx)
    .await
    .expect("machine");
    sqlx::query(
        "insert into machine_cleans (id, machine_id, run_id, method, evidence) values ($1, $2, $3, 'agent', '{}')",
    )
    .bind(clean)
    .bind(id.uuid())
    .bind(Uuid::now_v7())
    .execute(&mut *tx)
    .await
    .expect("clean");
    sqlx::query("update machines set state = 'available', clean_id = $2 where id = $1")
        .bind(id.uuid())
        .bind(clean)
        .execute(&mut *tx)
        .await
        .expect("available");
    tx.commit().await.expect("commit");
    id
}

/// A `kubernetes` cluster of `tenant` with one pool of `count` machines of `class`; the pool's
/// need for all of them.
pub async fn cluster(
    store: &Store,
    tenant: TenantId,
    class: MachineClassId,
    gpus: u32,
    count: u32,
) -> (ClusterId, Need) {
    let id = ClusterId::new();
    let pool = NodePoolId::new();
    let spec = ClusterSpec {
        name: format!("c-{}", id.uuid().simple()),
        kind: ClusterKind::Kubernetes,
        isolation: Isolation::PrivateNodes,
        kubernetes_version: "v1.34.1".to_owned(),
        slurm: None,
        ray: None,
    };
    let pool_spec = NodePoolSpec {
        name: "p".to_owned(),
        machine_class: "unused".to_owned(),
        count,
        labels: Default::default(),
        taints: Vec::new(),
        role: Default::default(),
        remediation: Default::default(),
        autoscaling: None,
    };
    let mut conn = store.conn().await.expect("conn");
    cluster::insert(&mut conn, tenant, id, &spec, paddock_domain::stack::latest_version()).await.expect("cluster");
    node_pool::insert(&mut conn, tenant, id, pool, class, &pool_spec).await.expect("pool");
    (id, Need { node_pool_id: pool, machine_class_id: class, gpu_count: gpus, count })
}

/// A machine's state and status version.
pub async fn state(store: &Store, id: MachineId) -> (String, i64) {
    sqlx::query_as("select state, status_version from machines where id = $1")
        .bind(id.uuid())
        .fetch_one(store.pool())
        .await
        .expect("machine")
}

/// Rows of `sql` (a `select count(*) ...` with `$1` bound to `id`).
pub async fn count(store: &Store, sql: &str, id: Uuid) -> i64 {
    sqlx::query_scalar(sql).bind(id).fetch_one(store.pool()).await.expect("count")
}
