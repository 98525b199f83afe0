//! Slurm's accounting for a [`crate::slurm_host::SlurmHost`]: a MariaDB server and slurmdbd
//! (`accounting_storage/mysql`), as a tenant's cluster has them, from the roots
//! `scripts/slurm-host` builds: MariaDB chrooted into the bookworm root beside the Slurm root
//! (`<digest>/mariadb`, the MariaDB of paddock's Slurm images), slurmdbd chrooted into the Slurm
//! root.
//!
//! Each test gets a MariaDB of its own (a data directory under the MariaDB root's `/run`, removed
//! at the end) on a free port of 127.0.0.1, with a database and user for slurmdbd made at its
//! start (`--init-file`), and a slurmdbd on another free port with the test's `auth/slurm` key
//! and JWT key (slurmrestd's `slurmdb` endpoints pass the caller's JWT on to slurmdbd). slurmctld
//! registers the cluster at its start, as a tenant's slurmctld does.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::skip;
use crate::slurm_host::Namespace;

/// The database and user slurmdbd keeps its records in and as.
const DATABASE: &str = "slurm_acct_db";
const USER: &str = "slurm";
const PASSWORD: &str = "paddock-test";

/// How long MariaDB and slurmdbd may take to start on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(120);

/// The MariaDB root beside the Slurm root `root` (`scripts/slurm-host` builds both), when it is
/// there; otherwise a [`skip`] (a failure under `CI=true`).
#[track_caller]
pub fn mariadb_root(root: &Path) -> Option<PathBuf> {
    let mariadb = root.parent().map(|p| p.join("mariadb")).unwrap_or_default();
    let server = mariadb.join("usr/sbin/mariadbd");
    let why = format_args!("{} is missing: scripts/slurm-host builds it beside the Slurm root", server.display());
    skip::require(server.symlink_metadata().ok(), why)?;
    Some(mariadb)
}

/// A running MariaDB and slurmdbd; stopped (slurmdbd first) and MariaDB's files removed on drop.
#[derive(Debug)]
pub(crate) struct Accounting {
    mariadb_dir: PathBuf,
    slurmdbd: Child,
    mariadb: Child,
}

/// The lines of slurmdbd.conf for the test directory `dir` (as the chrooted daemons see it).
fn slurmdbd_conf(dir: &str, dbd_port: u16, db_port: u16, host_name: &str) -> String {
    format!(
        "AuthType=auth/slurm\nAuthInfo={dir}/slurm.key\nAuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key={dir}/jwt.key\n\
         DbdHost={host_name}\nDbdAddr=127.0.0.1\nDbdPort={dbd_port}\nSlurmUser=slurm\n\
         LogFile={dir}/slurmdbd.log\nPidFile={dir}/slurmdbd.pid\n\
         StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\nStoragePort={db_port}\n\
         StorageUser={USER}\nStoragePass={PASSWORD}\nStorageLoc={DATABASE}\n"
    )
}

impl Accounting {
    /// Starts MariaDB from `mariadb_root` and slurmdbd from the Slurm root for the test directory `dir`
    /// (`host` on this host), listening on `dbd_port`, slurmdbd in the test's namespace `ns`; waits
    /// until slurmdbd listens.
    pub(crate) fn start(ns: &Namespace, mariadb_root: &Path, (dir, host): (&str, &Path), dbd_port: u16) -> Self {
        let db_port = super::slurm_host::free_port();
        let (mariadb_dir, mariadb) = start_mariadb(mariadb_root, dir, db_port);
        let conf = slurmdbd_conf(dir, dbd_port, db_port, &super::slurm_host::hostname());
        std::fs::write(host.join("slurmdbd.conf"), conf).expect("slurmdbd.conf");
        // slurmdbd reads its configuration only when `SlurmUser` owns it and no one else can.
        let out = Command::new("chown").arg("401:401").arg(host.join("slurmdbd.conf")).output().expect("chown");
        assert!(out.status.success(), "chown: {}", String::from_utf8_lossy(&out.stderr));
        std::fs::set_permissions(host.join("slurmdbd.conf"), std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("slurmdbd.conf's mode");
        // It finds slurmdbd.conf beside slurm.conf.
        let slurmdbd = ns
            .chroot()
            .arg("env")
            .arg(format!("SLURM_CONF={dir}/slurm.conf"))
            .args(["/usr/sbin/slurmdbd", "-D"])
            .stdout(super::slurm_host::log(host, "slurmdbd.out"))
            .stderr(super::slurm_host::log(host, "slurmdbd.out"))
            .spawn()
            .expect("starting slurmdbd");
        let mut accounting = Accounting { mariadb_dir, slurmdbd, mariadb };
        accounting.wait_listening(host, dbd_port);
        accounting
    }

    fn wait_listening(&mut self, host: &Path, port: u16) {
        let deadline = Instant::now() + PATIENCE;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            let exited = self.slurmdbd.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() >= deadline {
                let log = std::fs::read_to_string(host.join("slurmdbd.log")).unwrap_or_default();
                let mariadb = std::fs::read_to_string(self.mariadb_dir.join("mariadb.out")).unwrap_or_default();
                panic!("slurmdbd does not listen ({exited:?}); its log:\n{log}\nMariaDB's:\n{mariadb}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Makes a data directory under `mariadb_root`'s `/run` named as the test directory `dir`, and
/// starts MariaDB on it on `port` of 127.0.0.1 (in a mount namespace with `/proc` mounted into
/// the root, which mariadbd reads); waits until it listens. Returns the directory (on this host)
/// and the server.
fn start_mariadb(mariadb_root: &Path, dir: &str, port: u16) -> (PathBuf, Child) {
    let host = mariadb_root.join(dir.trim_start_matches('/'));
    let _ = std::fs::remove_dir_all(&host);
    std::fs::create_dir_all(&host).expect("MariaDB's directory");
    let init = format!(
        "CREATE DATABASE IF NOT EXISTS {DATABASE};\n\
         CREATE USER IF NOT EXISTS '{USER}'@'%' IDENTIFIED BY '{PASSWORD}';\n\
         GRANT ALL ON {DATABASE}.* TO '{USER}'@'%';\n"
    );
    std::fs::write(host.join("init.sql"), init).expect("init.sql");
    // Each its own tmpdir: two installs in one `/tmp` trip over each other's temporary tables.
    std::fs::create_dir_all(host.join("tmp")).expect("MariaDB's tmpdir");
    let common = format!(
        "--no-defaults --basedir=/usr --datadir={dir}/data --tmpdir={dir}/tmp \
         --innodb-log-file-size=8M --innodb-buffer-pool-size=32M"
    );
    let root = mariadb_root.display();
    let script = format!(
        "mount -t proc proc '{root}/proc' && chroot '{root}' chown mysql:mysql {dir} {dir}/tmp && \
         chroot '{root}' mariadb-install-db {common} --user=mysql --skip-test-db --skip-name-resolve --force \
             --auth-root-authentication-method=socket > '{root}{dir}/install.out' 2>&1 && \
         exec chroot '{root}' mariadbd {common} --user=mysql --skip-name-resolve --skip-log-bin \
             --bind-address=127.0.0.1 --port={port} --socket={dir}/mysqld.sock --pid-file={dir}/mysqld.pid \
             --init-file={dir}/init.sql"
    );
    let mut mariadb = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .stdout(super::slurm_host::log(&host, "mariadb.out"))
        .stderr(super::slurm_host::log(&host, "mariadb.out"))
        .spawn()
        .expect("starting MariaDB (unshare from util-linux)");
    let deadline = Instant::now() + PATIENCE;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        let exited = mariadb.try_wait().ok().flatten();
        if exited.is_some() || Instant::now() >= deadline {
            super::slurm_host::stop(&mut mariadb);
            let out = std::fs::read_to_string(host.join("mariadb.out")).unwrap_or_default();
            let install = std::fs::read_to_string(host.join("install.out")).unwrap_or_default();
            panic!("MariaDB does not listen ({exited:?}):\n{out}\nmariadb-install-db:\n{install}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    (host, mariadb)
}

impl Drop for Accounting {
    fn drop(&mut self) {
        super::slurm_host::stop(&mut self.slurmdbd);
        super::slurm_host::stop(&mut self.mariadb);
        let _ = std::fs::remove_dir_all(&self.mariadb_dir);
    }
}
