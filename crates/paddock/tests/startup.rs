//! What a real `paddock` process refuses at start (docs/security.md, docs/configuration.md): outside `paddock dev`,
//! every process that serves or works needs the custody ledger's key, and says which setting; and
//! `paddock migrate` with an owner URL leaves the runtime role only reads and appends of the ledger
//! and of the price history.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn serving_processes_refuse_to_start_without_the_ledger_key_and_name_it() {
    let secret = String::from_utf8(paddock_testkit::TEST_SECRET.to_vec()).expect("utf-8");
    for role in ["serve", "api", "worker"] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_paddock"));
        cmd.arg(role);
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("PADDOCK_")) {
            cmd.env_remove(k);
        }
        // Everything else a process needs; the database is never reached (connections are lazy).
        let mut child = cmd
            .env("PADDOCK_DATABASE_URL", "postgres://paddock@127.0.0.1:1/paddock")
            .env("PADDOCK_JWT_HS256_SECRET", &secret)
            .env("PADDOCK_ENCRYPTION_KEY", paddock_domain::secret::Cipher::generate_key())
            .env("PADDOCK_LISTEN", "127.0.0.1:0")
            .env("PADDOCK_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting `paddock {role}`: {e}"));
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("`paddock {role}` started without PADDOCK_LEDGER_KEY");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let output = child.wait_with_output().expect("output");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!status.success(), "`paddock {role}` exited 0: {stderr}");
        assert!(stderr.contains("PADDOCK_LEDGER_KEY"), "`paddock {role}` did not name the setting: {stderr}");
    }
}

/// A database owned by a new role `owner`, migrated by `paddock migrate` with a second role
/// `runtime` as PADDOCK_DATABASE_URL's user; returns the server (kept for the test's length), a
/// URL builder for either role, and the two role names.
async fn migrated_with_two_roles(prefix: &str) -> (paddock_testkit::TestDb, impl Fn(&str) -> String, String, String) {
    let admin = paddock_testkit::TestDb::empty().await;
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let (owner, runtime, database) =
        (format!("owner_{suffix}"), format!("runtime_{suffix}"), format!("{prefix}_{suffix}"));
    for statement in [
        format!("create role {owner} login"),
        format!("create role {runtime} login"),
        format!("create database {database} owner {owner}"),
    ] {
        sqlx::query(&statement).execute(&admin.pool).await.unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    let base = admin.url.rsplit_once('@').map(|(_, host)| host.rsplit_once('/').map_or(host, |(h, _)| h)).expect("url");
    let base = base.to_owned();
    let url = move |role: &str| format!("postgres://{role}@{base}/{database}");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_paddock"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("PADDOCK_")) {
        cmd.env_remove(k);
    }
    let output = cmd
        .arg("migrate")
        .env("PADDOCK_MIGRATE_DATABASE_URL", url(&owner))
        .env("PADDOCK_DATABASE_URL", url(&runtime))
        .env("PADDOCK_LOG", "warn")
        .output()
        .expect("running `paddock migrate`");
    assert!(output.status.success(), "paddock migrate: {}", String::from_utf8_lossy(&output.stderr));
    (admin, url, owner, runtime)
}

/// `paddock migrate` with two roles: it migrates as the owner of PADDOCK_MIGRATE_DATABASE_URL and
/// grants the user of PADDOCK_DATABASE_URL everything it needs, but only SELECT and INSERT on the
/// custody ledger and its checkpoints.
#[tokio::test]
async fn migrate_with_an_owner_url_grants_the_runtime_role_only_reads_and_appends_of_the_ledger() {
    let (_admin, url, owner, runtime) = migrated_with_two_roles("m").await;

    let pool = sqlx::PgPool::connect(&url(&runtime)).await.expect("connecting as the runtime role");
    let may = |table: &'static str, privilege: &'static str| {
        let pool = pool.clone();
        async move {
            let granted: bool = sqlx::query_scalar("select has_table_privilege(current_user, $1, $2)")
                .bind(table)
                .bind(privilege)
                .fetch_one(&pool)
                .await
                .expect("privilege");
            granted
        }
    };
    for table in ["custody_entries", "custody_checkpoints", "machine_class_prices"] {
        assert!(may(table, "SELECT").await && may(table, "INSERT").await, "{table}: reads and appends");
        for privilege in ["UPDATE", "DELETE", "TRUNCATE", "TRIGGER"] {
            assert!(!may(table, privilege).await, "{table}: {privilege} granted to the runtime role");
        }
    }
    assert!(may("jobs", "UPDATE").await && may("machines", "DELETE").await, "the runtime role runs the rest");
    assert!(!may("_sqlx_migrations", "INSERT").await, "the runtime role may not record migrations");
    let owner_of: String =
        sqlx::query_scalar("select tableowner::text from pg_tables where tablename = 'custody_entries'")
            .fetch_one(&pool)
            .await
            .expect("owner");
    assert_eq!(owner_of, owner);
    pool.close().await;
}

/// Starts `paddock api` on `database_url` and returns what it logged once it said whether its
/// database role can rewrite the custody ledger (or panics after a deadline).
fn ledger_access_logged(database_url: &str) -> String {
    let secret = String::from_utf8(paddock_testkit::TEST_SECRET.to_vec()).expect("utf-8");
    let log = std::env::temp_dir().join(format!("paddock-ledger-access-{}.log", uuid::Uuid::new_v4().simple()));
    let file = std::fs::File::create(&log).expect("log file");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_paddock"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("PADDOCK_")) {
        cmd.env_remove(k);
    }
    let mut child = cmd
        .arg("api")
        .env("PADDOCK_DATABASE_URL", database_url)
        .env("PADDOCK_JWT_HS256_SECRET", &secret)
        .env("PADDOCK_ENCRYPTION_KEY", paddock_domain::secret::Cipher::generate_key())
        .env("PADDOCK_LEDGER_KEY", "startup-test-ledger-key-of-at-least-32-bytes")
        .env("PADDOCK_LISTEN", "127.0.0.1:0")
        .env("PADDOCK_LOG", "info,sqlx=warn")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("starting `paddock api`");
    let deadline = Instant::now() + Duration::from_secs(60);
    let logged = loop {
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        if logged.contains("custody ledger") {
            break logged;
        }
        if Instant::now() > deadline || child.try_wait().expect("waiting").is_some() {
            let _ = child.kill();
            panic!("`paddock api` said nothing about its access to the custody ledger: {logged}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&log);
    logged
}

/// A serving process warns at start when its database role could rewrite the custody ledger (one
/// role for everything, the default), and only notes it with the two roles of `paddock migrate`.
#[tokio::test]
async fn a_serving_process_warns_when_its_database_role_can_rewrite_the_ledger() {
    let (_admin, url, owner, runtime) = migrated_with_two_roles("w").await;

    let one_role = ledger_access_logged(&url(&owner));
    assert!(one_role.contains("WARN"), "{one_role}");
    assert!(one_role.contains(&format!("the database role {owner} that serves requests can rewrite")), "{one_role}");
    assert!(one_role.contains("it owns the ledger's tables"), "{one_role}");
    assert!(one_role.contains("PADDOCK_MIGRATE_DATABASE_URL"), "{one_role}");

    let two_roles = ledger_access_logged(&url(&runtime));
    assert!(two_roles.contains(&format!("the database role {runtime} may only read and append")), "{two_roles}");
    assert!(!two_roles.contains("can rewrite"), "{two_roles}");
}

/// A process with several settings missing or wrong names every one in one refusal, rather than
/// one per start; `paddock check-config` says the same without starting anything.
#[test]
fn a_process_lists_every_missing_or_invalid_setting_at_once() {
    for args in [&["serve"][..], &["check-config", "serve"]] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_paddock"));
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("PADDOCK_")) {
            cmd.env_remove(k);
        }
        let out = cmd
            .args(args)
            .env("PADDOCK_BMC_DRIVER", "redfish")
            .env("PADDOCK_WORKER_LEASE", "1")
            .env("PADDOCK_LEDGER_KEY", "too-short")
            .env("PADDOCK_LISTEN", "127.0.0.1:0")
            .stdin(Stdio::null())
            .output()
            .expect("running paddock");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "`paddock {args:?}` accepted: {stderr}");
        for named in [
            "PADDOCK_DATABASE_URL",
            "PADDOCK_ENCRYPTION_KEY",
            "PADDOCK_LEDGER_KEY must be at least 32",
            "PADDOCK_JWT_HS256_SECRET",
            "PADDOCK_AGENT_BASE_URL",
            "PADDOCK_AGENT_SEED_BASE_URL",
            "PADDOCK_WIPE_IMAGE_URL",
            "PADDOCK_WIPE_IMAGE_SHA256",
            "PADDOCK_OS_IMAGE_URL",
            "PADDOCK_OS_IMAGE_SHA256",
            "PADDOCK_WORKER_LEASE",
        ] {
            assert!(stderr.contains(named), "`paddock {args:?}` did not name {named}: {stderr}");
        }
        assert!(stderr.contains("the configuration has 11 problems"), "{stderr}");
    }
}
