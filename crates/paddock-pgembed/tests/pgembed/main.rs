//! Integration tests: they start real PostgreSQL servers from the machine's binaries.
//! Run as root (as in CI) they exercise the `runuser -u postgres` path.

use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use paddock_pgembed::{find_binaries, PgBinaries, PgCluster, PgError, PgOptions};

/// A fresh directory under the system temp dir, removed (with any cluster files) on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(test: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").subsec_nanos();
        let dir = std::env::temp_dir().join(format!(
            "pgembed-{test}-{}-{nanos}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        // Mode 0755 whatever the umask, so that a root test run's postgres user can enter it.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn binaries() -> PgBinaries {
    find_binaries(None)
        .expect("PostgreSQL server binaries are required for these tests (scripts/pg-start installs them)")
}

fn options(data_dir: PathBuf) -> PgOptions {
    PgOptions { data_dir, port: None, bin: binaries() }
}

/// Runs `sql` through psql against `url` and returns the trimmed output.
fn psql(bin: &PgBinaries, url: &str, sql: &str) -> String {
    let psql = if bin.program("psql").is_file() { bin.program("psql") } else { PathBuf::from("psql") };
    let out = Command::new(psql)
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql])
        .output()
        .expect("run psql");
    assert!(out.status.success(), "psql {sql:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// True while `pid` is a live process (a zombie waiting for a reaper counts as gone).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Field 3 (after the parenthesised command name) is the state.
        Ok(stat) => stat.rsplit_once(')').map(|(_, rest)| rest.trim_start()).is_some_and(|s| !s.starts_with('Z')),
        // /proc exists but not this pid: gone.
        Err(_) if Path::new("/proc/self").exists() => false,
        // No /proc (macOS): ask kill -0.
        Err(_) => Command::new("kill").args(["-0", &pid.to_string()]).status().is_ok_and(|s| s.success()),
    }
}

/// Polls until `pid` is gone or the deadline passes.
fn gone_within(pid: u32, deadline: Duration) -> bool {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    !alive(pid)
}

#[test]
fn start_create_database_connect_stop_and_restart_keeps_data() {
    let tmp = TempDir::new("lifecycle");
    let data_dir = tmp.0.join("pg");
    let cluster = PgCluster::start(options(data_dir.clone())).expect("start");
    assert!(!cluster.adopted());
    assert_eq!(cluster.data_dir(), data_dir, "a traversable directory is used as given");
    assert!(data_dir.join("PG_VERSION").is_file());
    assert!(tmp.0.join("pg.log").is_file(), "the log lives beside the data dir");
    assert!(tmp.0.join("pg.run").is_dir(), "the socket dir lives beside the data dir");
    assert!(!tmp.0.join(".pg.initdb").exists(), "the initdb scratch dir was renamed into place");
    let hba = std::fs::read_to_string(data_dir.join("pg_hba.conf")).expect("pg_hba.conf");
    assert!(!hba.contains("::1") && hba.contains("127.0.0.1/32"), "trust is limited to loopback: {hba}");

    cluster.create_database("app").expect("create database");
    cluster.create_database("app").expect("creating an existing database is fine");
    let url = cluster.url("app");
    assert_eq!(url, format!("postgres://postgres@127.0.0.1:{}/app", cluster.port()));
    assert_eq!(psql(cluster.binaries(), &url, "select 1"), "1");
    psql(cluster.binaries(), &url, "create table kept (v int); insert into kept values (42)");
    let first_pid = cluster.pid();
    cluster.stop().expect("stop");
    assert!(gone_within(first_pid, Duration::from_secs(10)), "postmaster {first_pid} still runs after stop");

    let again = PgCluster::start(options(data_dir)).expect("restart on the same data dir");
    assert!(!again.adopted());
    assert_eq!(psql(again.binaries(), &again.url("app"), "select v from kept"), "42");
    again.stop().expect("stop again");
}

#[test]
fn dropping_the_cluster_stops_the_server() {
    let tmp = TempDir::new("drop");
    let cluster = PgCluster::start(options(tmp.0.join("pg"))).expect("start");
    let pid = cluster.pid();
    assert!(alive(pid), "postmaster {pid} should run");
    drop(cluster);
    assert!(gone_within(pid, Duration::from_secs(10)), "postmaster {pid} still runs after drop");
}

#[test]
fn start_adopts_a_server_already_running_on_the_data_dir() {
    let tmp = TempDir::new("adopt");
    let first = PgCluster::start(options(tmp.0.join("pg"))).expect("start");
    let second = PgCluster::start(options(tmp.0.join("pg"))).expect("start while running");
    assert!(second.adopted());
    assert_eq!(second.port(), first.port());
    assert_eq!(second.pid(), first.pid());
    assert_eq!(psql(second.binaries(), &second.url("postgres"), "select 1"), "1");
    second.stop().expect("the adopted server stops");
    assert!(gone_within(first.pid(), Duration::from_secs(10)));
    first.stop().expect("stopping a server that is already gone is fine");
}

#[test]
fn a_taken_port_is_replaced_by_a_free_one() {
    let tmp = TempDir::new("port");
    let squatter = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let taken = squatter.local_addr().expect("addr").port();
    let cluster = PgCluster::start(PgOptions { data_dir: tmp.0.join("pg"), port: Some(taken), bin: binaries() })
        .expect("start despite the taken port");
    assert_ne!(cluster.port(), taken);
    assert_eq!(psql(cluster.binaries(), &cluster.url("postgres"), "select 1"), "1");
    cluster.stop().expect("stop");
}

#[test]
fn an_explicit_port_is_used_when_free() {
    let tmp = TempDir::new("explicit-port");
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind").local_addr().expect("addr").port();
    let cluster =
        PgCluster::start(PgOptions { data_dir: tmp.0.join("pg"), port: Some(port), bin: binaries() }).expect("start");
    assert_eq!(cluster.port(), port);
    cluster.stop().expect("stop");
}

#[test]
fn a_non_empty_foreign_directory_is_refused() {
    let tmp = TempDir::new("foreign");
    let data_dir = tmp.0.join("pg");
    std::fs::create_dir(&data_dir).expect("mkdir");
    std::fs::write(data_dir.join("notes.txt"), "mine").expect("write");
    let err = PgCluster::start(options(data_dir)).expect_err("must not initdb over user files");
    assert!(matches!(err, PgError::NotADataDir { .. }), "{err}");
}

#[test]
fn an_explicit_bin_dir_without_server_programs_is_rejected() {
    let tmp = TempDir::new("bindir");
    let err = find_binaries(Some(&tmp.0)).expect_err("empty dir");
    assert!(matches!(err, PgError::IncompleteBinDir { missing: "pg_ctl", .. }), "{err}");
    let found = binaries();
    assert_eq!(find_binaries(Some(&found.bin_dir)).expect("explicit dir"), found);
    assert!(found.major().is_some(), "version {} parses", found.version);
}

#[test]
fn as_root_an_unreachable_data_dir_falls_back_to_var_tmp() {
    if !paddock_testkit::skip::root("the fallback when PostgreSQL, started by root, cannot reach its data directory") {
        return;
    }
    let tmp = TempDir::new("fallback");
    let private = tmp.0.join("private");
    std::fs::create_dir(&private).expect("mkdir");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod 0700");
    let cluster = PgCluster::start(options(private.join("pg"))).expect("start with fallback");
    let used = cluster.data_dir().to_path_buf();
    assert!(used.starts_with("/var/tmp/paddock-pg"), "fallback dir used: {}", used.display());
    assert!(used.ends_with("pg"));
    assert_eq!(psql(cluster.binaries(), &cluster.url("postgres"), "select 1"), "1");
    cluster.stop().expect("stop");
    // The same request maps to the same fallback, so data persists across runs.
    let again = PgCluster::start(options(private.join("pg"))).expect("restart with fallback");
    assert_eq!(again.data_dir(), used);
    again.stop().expect("stop");
    if let Some(hash_dir) = used.parent() {
        let _ = std::fs::remove_dir_all(hash_dir);
    }
}
