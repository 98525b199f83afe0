//! One database per test, cloned from a template that is migrated once per migration set: paddock's
//! own and the simulated world's (schema `paddock_sim`), so tests on the simulated drivers find it.

use sha2::{Digest, Sha256};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::OnceCell;

static TEMPLATE: OnceCell<String> = OnceCell::const_new();

fn admin_url() -> String {
    std::env::var("PADDOCK_TEST_DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "PADDOCK_TEST_DATABASE_URL is not set: run the tests with `scripts/test` (it starts a \
             private PostgreSQL), or point it at a PostgreSQL superuser URL"
        )
    })
}

/// The template's name changes with either set of migrations, so a stale template is never reused.
fn template_name() -> String {
    let mut hash = Sha256::new();
    for m in paddock_store::MIGRATOR.iter().chain(paddock_sim::MIGRATOR.iter()) {
        hash.update(m.version.to_le_bytes());
        hash.update(&*m.checksum);
    }
    format!("paddock_tpl_{}", &hex::encode(hash.finalize())[..16])
}

async fn admin_conn() -> PgConnection {
    PgConnection::connect(&admin_url()).await.expect("connecting to the test PostgreSQL")
}

/// Creates and migrates the template once; an advisory lock keeps concurrent test binaries apart.
async fn template() -> &'static str {
    TEMPLATE
        .get_or_init(|| async {
            let name = template_name();
            let mut conn = admin_conn().await;
            sqlx::query("select pg_advisory_lock(727274)").execute(&mut conn).await.expect("lock");
            let exists: bool = sqlx::query_scalar("select exists (select 1 from pg_database where datname = $1)")
                .bind(&name)
                .fetch_one(&mut conn)
                .await
                .expect("template lookup");
            if !exists {
                let building = format!("{name}_building");
                sqlx::query(&format!("drop database if exists {building}")).execute(&mut conn).await.expect("drop");
                sqlx::query(&format!("create database {building}")).execute(&mut conn).await.expect("create template");
                let options: PgConnectOptions = admin_url().parse().expect("url");
                let pool = PgPoolOptions::new()
                    .max_connections(1)
                    .connect_with(options.database(&building))
                    .await
                    .expect("connect template");
                paddock_store::MIGRATOR.run(&pool).await.expect("migrating the template");
                let store = paddock_store::Store::from_pool(pool.clone());
                paddock_sim::migrate(&store).await.expect("migrating the template's simulated world");
                pool.close().await;
                // `close` returns before the server has ended the session: end any session still
                // on the database (ours, going away) and rename. Renamed only when complete, so a
                // crashed run never leaves a half-migrated template.
                let mut renamed = Err(None);
                for _ in 0..50 {
                    sqlx::query("select pg_terminate_backend(pid) from pg_stat_activity where datname = $1")
                        .bind(&building)
                        .execute(&mut conn)
                        .await
                        .expect("ending the template's sessions");
                    match sqlx::query(&format!("alter database {building} rename to {name}")).execute(&mut conn).await {
                        Ok(_) => {
                            renamed = Ok(());
                            break;
                        }
                        Err(e) => renamed = Err(Some(e)),
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                renamed.unwrap_or_else(|e| panic!("renaming the template: {e:?}"));
            }
            sqlx::query("select pg_advisory_unlock(727274)").execute(&mut conn).await.expect("unlock");
            name
        })
        .await
}

/// A test's own database.
pub struct TestDb {
    /// Its name.
    pub name: String,
    /// Its URL.
    pub url: String,
    /// A pool on it.
    pub pool: PgPool,
}

impl TestDb {
    /// A fresh, migrated database.
    pub async fn new() -> TestDb {
        let template = template().await;
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        let mut conn = admin_conn().await;
        sqlx::query(&format!("create database {name} template {template}"))
            .execute(&mut conn)
            .await
            .expect("cloning the template");
        let options: PgConnectOptions = admin_url().parse().expect("url");
        let options = options.database(&name);
        let pool = PgPoolOptions::new().max_connections(16).connect_with(options.clone()).await.expect("connect");
        let url = admin_url().rsplit_once('/').map_or(admin_url(), |(base, _)| format!("{base}/{name}"));
        TestDb { name, url, pool }
    }

    /// A fresh database with no schema at all (for migration tests).
    pub async fn empty() -> TestDb {
        let name = format!("e_{}", uuid::Uuid::new_v4().simple());
        let mut conn = admin_conn().await;
        sqlx::query(&format!("create database {name}")).execute(&mut conn).await.expect("create database");
        let options: PgConnectOptions = admin_url().parse().expect("url");
        let pool =
            PgPoolOptions::new().max_connections(16).connect_with(options.database(&name)).await.expect("connect");
        let url = admin_url().rsplit_once('/').map_or(admin_url(), |(base, _)| format!("{base}/{name}"));
        TestDb { name, url, pool }
    }

    /// Rows in `table`.
    pub async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(&format!("select count(*) from {table}")).fetch_one(&self.pool).await.expect("count")
    }
}
