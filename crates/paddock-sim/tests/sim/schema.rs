//! The simulated world's schema: apart from paddock's own, created only by `paddock_sim::migrate`,
//! safe to migrate twice and from several processes at once, and gone from production databases
//! that the old migrations had given `sim_` tables.

use paddock_sim::{MachineFault, SimConfig, SimWorld};
use paddock_store::Store;
use paddock_testkit::TestDb;
use sqlx::migrate::Migrate;
use sqlx::PgPool;

/// The last production migration of the set that still created the `sim_` tables in paddock's
/// schema (20261130160000_create_sim_world.sql).
const LAST_OLD_MIGRATION: i64 = 20261130190000;

/// Every relation (table, index, view, sequence...), function and type named `sim_*` in any
/// schema, and the simulated world's schema itself.
async fn simulated_objects(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        r"select 'relation ' || n.nspname || '.' || c.relname
            from pg_class c join pg_namespace n on n.oid = c.relnamespace where c.relname like 'sim\_%'
          union all
          select 'function ' || n.nspname || '.' || p.proname
            from pg_proc p join pg_namespace n on n.oid = p.pronamespace where p.proname like 'sim\_%'
          union all
          select 'type ' || n.nspname || '.' || t.typname
            from pg_type t join pg_namespace n on n.oid = t.typnamespace
           where t.typname like 'sim\_%' or t.typname like '\_sim\_%'
          union all
          select 'schema ' || nspname from pg_namespace where nspname = 'paddock_sim'
          order by 1",
    )
    .fetch_all(pool)
    .await
    .expect("listing simulated objects")
}

/// Versions recorded in the `_sqlx_migrations` of `schema`.
async fn recorded(pool: &PgPool, schema: &str) -> Vec<i64> {
    sqlx::query_scalar(&format!("select version from {schema}._sqlx_migrations where success order by version"))
        .fetch_all(pool)
        .await
        .expect("recorded migrations")
}

/// The simulated drivers work on `db`: a machine's fault is kept and read back.
async fn assert_world_works(db: &TestDb) {
    let world = SimWorld::new(Store::from_pool(db.pool.clone()), SimConfig::zero());
    world.set_machine_fault("n1", MachineFault::WipeFails, true).await.expect("a fault is set");
    let machine = world.machine("n1").await.expect("read").expect("the machine exists");
    assert_eq!(machine.faults, vec![MachineFault::WipeFails]);
}

#[tokio::test]
async fn production_migrations_alone_leave_no_simulated_object() {
    let db = TestDb::empty().await;
    paddock_store::MIGRATOR.run(&db.pool).await.expect("production migrations");
    assert_eq!(simulated_objects(&db.pool).await, Vec::<String>::new());
    assert!(Store::from_pool(db.pool.clone()).ready().await.expect("ready check"));
}

#[tokio::test]
async fn processes_starting_at_once_migrate_both_schemas_and_again() {
    let db = TestDb::empty().await;
    // As `paddock serve` processes with a simulated driver do: paddock's migrations, then the
    // simulated world's, each process with its own pool.
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let url = db.url.clone();
            tokio::spawn(async move {
                let store = Store::connect_lazy(&url, 2).expect("store");
                store.migrate().await.expect("production migrations");
                paddock_sim::migrate(&store).await
            })
        })
        .collect();
    for run in runs {
        run.await.expect("task").expect("every concurrent simulated world migration succeeds");
    }
    let store = Store::from_pool(db.pool.clone());
    paddock_sim::migrate(&store).await.expect("migrating again is a no-op");

    let sim: Vec<i64> = paddock_sim::MIGRATOR.iter().map(|m| m.version).collect();
    let production: Vec<i64> = paddock_store::MIGRATOR.iter().map(|m| m.version).collect();
    assert_eq!(recorded(&db.pool, "paddock_sim").await, sim, "the simulator's bookkeeping is in its schema");
    assert_eq!(recorded(&db.pool, "public").await, production, "paddock's bookkeeping holds only its own");
    assert_eq!(simulated_objects(&db.pool).await, vec!["schema paddock_sim".to_owned()]);
    let search_path: String = sqlx::query_scalar("show search_path").fetch_one(&db.pool).await.expect("search_path");
    assert_eq!(search_path, r#""$user", public"#, "pooled connections keep the default search_path");
    assert!(store.ready().await.expect("ready check"));
    assert_world_works(&db).await;
}

#[tokio::test]
async fn the_forward_migration_drops_the_old_sim_tables_of_an_upgraded_database() {
    let db = TestDb::empty().await;
    // The database as the old migration set left it, with a simulated world in paddock's schema.
    let mut conn = db.pool.acquire().await.expect("connection");
    conn.ensure_migrations_table().await.expect("migrations table");
    for migration in paddock_store::MIGRATOR.iter().filter(|m| m.version <= LAST_OLD_MIGRATION) {
        conn.apply(migration).await.expect("an old migration");
    }
    drop(conn);
    sqlx::query(
        "insert into sim_machines (bmc_url, name, system_uuid, serial, model, drives)
         values ('sim://old', 'old', 'uuid-old', 'serial', 'model', '[]')",
    )
    .execute(&db.pool)
    .await
    .expect("an old simulated machine");
    let before = simulated_objects(&db.pool).await;
    for table in ["relation public.sim_machines", "relation public.sim_clusters", "relation public.sim_nodes"] {
        assert!(before.iter().any(|o| o == table), "{table} missing before the upgrade: {before:?}");
    }

    paddock_store::MIGRATOR.run(&db.pool).await.expect("upgrading");
    assert_eq!(simulated_objects(&db.pool).await, Vec::<String>::new());
    let store = Store::from_pool(db.pool.clone());
    assert!(store.ready().await.expect("ready check"));
    paddock_sim::migrate(&store).await.expect("the simulated world in its own schema");
    assert_world_works(&db).await;
}
