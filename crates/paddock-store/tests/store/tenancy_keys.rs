//! The schema ties a tenancy's rows together with composite foreign keys: whatever a bug in the
//! code writes, PostgreSQL itself refuses a pool in another tenant's cluster, an allocation of
//! another tenant's pool, and a machine whose holder columns are not those of its allocation.

use paddock_store::{node_pool, StoreError};
use uuid::Uuid;

use crate::support::{class, cluster, db, machine, tenant};

/// The constraint a refused statement violated, if it was a foreign key.
fn foreign_key(result: Result<sqlx::postgres::PgQueryResult, sqlx::Error>) -> String {
    let e = result.expect_err("the database refuses the write");
    let db = e.as_database_error().expect("a database error");
    assert_eq!(db.code().as_deref(), Some("23503"), "a foreign key violation: {db}");
    db.constraint().expect("names its constraint").to_owned()
}

#[tokio::test]
async fn cross_tenant_rows_are_refused_by_the_database() {
    let (_db, store) = db().await;
    let cpu = class(&store, "cpu", 0).await;
    let (a, b) = (tenant(&store, None, None).await, tenant(&store, None, None).await);
    let (cluster_a, need_a) = cluster(&store, a, cpu, 0, 1).await;
    let (cluster_b, need_b) = cluster(&store, b, cpu, 0, 1).await;
    let (pool_a, pool_b) = (need_a.node_pool_id.uuid(), need_b.node_pool_id.uuid());

    // A pool of tenant B in tenant A's cluster.
    let mut conn = store.conn().await.expect("conn");
    let spec = paddock_domain::cluster::NodePoolSpec {
        name: "stray".to_owned(),
        machine_class: "cpu".to_owned(),
        count: 1,
        labels: Default::default(),
        taints: Vec::new(),
        role: Default::default(),
        remediation: Default::default(),
        autoscaling: None,
    };
    let stray = node_pool::insert(&mut conn, b, cluster_a, paddock_types::NodePoolId::new(), cpu, &spec).await;
    assert!(
        matches!(&stray, Err(StoreError::ForeignKey { constraint, .. }) if constraint == "node_pools_cluster_tenant_fkey"),
        "{stray:?}"
    );

    // An allocation for tenant A's cluster of tenant B's pool.
    let m = machine(&store, cpu).await.uuid();
    let clean: Uuid = sqlx::query_scalar("select clean_id from machines where id = $1")
        .bind(m)
        .fetch_one(store.pool())
        .await
        .expect("clean");
    let allocate = |alloc: Uuid, pool: Uuid| {
        sqlx::query(
            "insert into machine_allocations (id, machine_id, clean_id, tenant_id, cluster_id, node_pool_id) \
             values ($1, $2, $3, $4, $5, $6)",
        )
        .bind(alloc)
        .bind(m)
        .bind(clean)
        .bind(a.uuid())
        .bind(cluster_a.uuid())
        .bind(pool)
    };
    assert_eq!(
        foreign_key(allocate(Uuid::now_v7(), pool_b).execute(store.pool()).await),
        "machine_allocations_pool_fkey"
    );
    let alloc = Uuid::now_v7();
    allocate(alloc, pool_a).execute(store.pool()).await.expect("a consistent allocation is accepted");

    // The machine held by its allocation, then pointed at the other tenant's pool.
    let hold = |tenant: Uuid, cluster: Uuid, pool: Uuid| {
        sqlx::query(
            "update machines set state = 'allocated', clean_id = null, allocation_id = $2, tenant_id = $3, \
             cluster_id = $4, node_pool_id = $5 where id = $1",
        )
        .bind(m)
        .bind(alloc)
        .bind(tenant)
        .bind(cluster)
        .bind(pool)
    };
    let wrong = hold(b.uuid(), cluster_b.uuid(), pool_b).execute(store.pool()).await;
    assert_eq!(foreign_key(wrong), "machines_allocation_fkey");
    let mixed = hold(a.uuid(), cluster_a.uuid(), pool_b).execute(store.pool()).await;
    assert!(["machines_pool_fkey", "machines_allocation_fkey"].contains(&foreign_key(mixed).as_str()));
    hold(a.uuid(), cluster_a.uuid(), pool_a).execute(store.pool()).await.expect("its own allocation's holder");
}
