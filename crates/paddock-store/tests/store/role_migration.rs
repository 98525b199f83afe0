//! The migration that gives node pools their role, on a database that already holds clusters:
//! each live Slurm cluster's first pool by creation (the first with a node, when one has) becomes
//! its system pool; every other pool, and every pool of a kubernetes cluster, is a compute pool.

use paddock_store::MIGRATOR;
use paddock_testkit::TestDb;
use sqlx::migrate::Migrator;

/// The migration under test.
const ROLE_MIGRATION: i64 = 20261207120000;

async fn insert_cluster(db: &TestDb, tenant: uuid::Uuid, name: &str, kind: &str) -> uuid::Uuid {
    let id = uuid::Uuid::now_v7();
    let slurm = (kind == "slurm").then(|| serde_json::json!({ "version": "25.11" }));
    sqlx::query(
        "insert into clusters (id, tenant_id, name, kind, isolation, kubernetes_version, slurm, stack_version) \
         values ($1, $2, $3, $4, 'private-nodes', 'v1.35.0', $5, '2026.12.0')",
    )
    .bind(id)
    .bind(tenant)
    .bind(name)
    .bind(kind)
    .bind(slurm)
    .execute(&db.pool)
    .await
    .expect("a cluster");
    id
}

/// A pool created `age` minutes ago.
async fn insert_pool(
    db: &TestDb,
    (tenant, cluster, class): (uuid::Uuid, uuid::Uuid, uuid::Uuid),
    name: &str,
    count: i32,
    age: i32,
) -> uuid::Uuid {
    let id = uuid::Uuid::now_v7();
    sqlx::query(
        "insert into node_pools (id, tenant_id, cluster_id, name, machine_class_id, count, created_at) \
         values ($1, $2, $3, $4, $5, $6, now() - make_interval(mins => $7))",
    )
    .bind(id)
    .bind(tenant)
    .bind(cluster)
    .bind(name)
    .bind(class)
    .bind(count)
    .bind(age)
    .execute(&db.pool)
    .await
    .expect("a pool");
    id
}

async fn role(db: &TestDb, pool: uuid::Uuid) -> String {
    sqlx::query_scalar("select role from node_pools where id = $1").bind(pool).fetch_one(&db.pool).await.expect("role")
}

#[tokio::test]
async fn existing_slurm_clusters_get_their_first_pool_as_system_pool() {
    let db = TestDb::empty().await;
    assert!(MIGRATOR.iter().any(|m| m.version == ROLE_MIGRATION), "the migration exists");
    // The schema as it was: the migrations before this one, from a copy of the directory.
    let dir = std::env::temp_dir().join(format!("paddock-migrations-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let all = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    for entry in std::fs::read_dir(&all).expect("the migrations").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let version: i64 = name.split('_').next().and_then(|v| v.parse().ok()).unwrap_or(i64::MAX);
        if version < ROLE_MIGRATION {
            std::fs::copy(entry.path(), dir.join(&name)).expect("copy a migration");
        }
    }
    let older = Migrator::new(dir.as_path()).await.expect("the older migrations");
    older.run(&db.pool).await.expect("the migrations before");
    let _ = std::fs::remove_dir_all(&dir);

    let tenant = uuid::Uuid::now_v7();
    sqlx::query("insert into tenants (id, name, display_name) values ($1, 'acme', 'Acme')")
        .bind(tenant)
        .execute(&db.pool)
        .await
        .expect("a tenant");
    let class = uuid::Uuid::now_v7();
    sqlx::query(
        "insert into machine_classes (id, name, cpu_cores, memory_gib, gpu_count) values ($1, 'cpu', 8, 32, 0)",
    )
    .bind(class)
    .execute(&db.pool)
    .await
    .expect("a class");
    // A Slurm cluster whose oldest pool was created before the one listed first by id.
    let hpc = insert_cluster(&db, tenant, "hpc", "slurm").await;
    let gpu = insert_pool(&db, (tenant, hpc, class), "gpu", 2, 10).await;
    let cpu = insert_pool(&db, (tenant, hpc, class), "cpu", 1, 20).await;
    // One whose oldest pool has no node: the next has.
    let lean = insert_cluster(&db, tenant, "lean", "slurm").await;
    let empty = insert_pool(&db, (tenant, lean, class), "empty", 0, 30).await;
    let busy = insert_pool(&db, (tenant, lean, class), "busy", 3, 5).await;
    // A kubernetes cluster: no system pool.
    let kube = insert_cluster(&db, tenant, "k8s", "kubernetes").await;
    let workers = insert_pool(&db, (tenant, kube, class), "workers", 2, 40).await;

    MIGRATOR.run(&db.pool).await.expect("the role migration");
    assert_eq!(role(&db, cpu).await, "system", "the first pool by creation");
    assert_eq!(role(&db, gpu).await, "compute");
    assert_eq!(role(&db, empty).await, "compute", "a pool with no node cannot carry the control pods");
    assert_eq!(role(&db, busy).await, "system");
    assert_eq!(role(&db, workers).await, "compute");
    // One system pool per cluster, from now on.
    let second = sqlx::query("update node_pools set role = 'system' where id = $1").bind(gpu).execute(&db.pool).await;
    assert!(second.is_err(), "a second system pool: {second:?}");
}
