//! A real Slurm on this host: slurmctld, and slurmd registering as dynamic nodes (`slurmd -Z`, as
//! Slinky's NodeSet pods do), from the Debian root `scripts/slurm-host` builds (Slurm 26.05.5,
//! the version of paddock's Slurm images), found through `PADDOCK_TEST_SLURM_HOST`.
//!
//! The daemons run chrooted into that root (its libraries are Debian sid's, newer than a CI
//! host's), as root. A test's files live in a directory of its own under the root's `/run`
//! (its slurm.conf, its `auth/slurm` key, slurmctld's state, the logs), removed when the
//! [`SlurmHost`] drops, and its daemons listen on ports picked free on 127.0.0.1: tests run in
//! parallel on one root. Each test's daemons and commands run in a mount namespace of the test's
//! own ([`Namespace`]): `/proc` mounted into the root there (slurmd reads it), and the sockets of
//! `auth/slurm` (fixed paths under the root's `/run`) the test's. Jobs run
//! as root under `proctrack/linuxproc` and `task/none`, with cgroups disabled: a CI host need not
//! have cgroup v2. Dropping the [`SlurmHost`] kills the daemons it started, by their process ids.
//!
//! The slurm.conf a test gives is the part under test (nodes, NodeSets, partitions, what
//! paddock's configuration adds); [`SlurmHost::start`] puts this host's own lines before it
//! (the controller's host and ports, paths, authentication, plugins that need no cgroup).
//!
//! [`SlurmHost::start_with`] takes [`Options`]: the cluster's name (paddock names a tenant's
//! cluster after its id), the JWT key (a tenant cluster's, so paddock's own tokens are accepted),
//! and accounting: a MariaDB and slurmdbd of the test's own (`crate::slurm_host_db`), slurmctld
//! storing its accounting there.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::skip;
use crate::slurm_host_db::{self, Accounting};

/// How long a daemon may take to answer on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// A running slurmctld (and the slurmds a test started) in the root of `scripts/slurm-host`.
#[derive(Debug)]
pub struct SlurmHost {
    root: PathBuf,
    /// The test's directory, as the chrooted daemons see it (`/run/paddock-test-...`).
    dir: String,
    ctld_port: u16,
    ctld: Child,
    /// The slurmds (and slurmrestd) this test started, by node name.
    slurmds: Vec<(String, Child)>,
    /// MariaDB and slurmdbd, when the test asked for accounting.
    accounting: Option<Accounting>,
    /// The mount namespace every daemon and command of the test runs in.
    ns: Namespace,
}

/// A mount namespace of the test's own, held open by a sleeping process (`unshare`), where the
/// root's `/run/slurm`, `/run/slurmctld` and `/run/slurmdbd` are directories of the test's, and
/// `/proc` is mounted in the root (slurmd reads it). Every daemon and command of the test runs in
/// it (`nsenter`): the commands of `auth/slurm` get their credentials from the daemons' sockets
/// there (fixed paths), which tests running at once on one root would otherwise share, asking
/// another test's slurmctld to sign for theirs.
#[derive(Debug)]
pub(crate) struct Namespace {
    root: PathBuf,
    holder: Child,
}

impl Namespace {
    fn start(root: &Path, host: &Path) -> Self {
        let (r, h) = (root.display(), host.display());
        let mut script = String::new();
        for (d, owner) in [("slurm", "0:0"), ("slurmctld", "401:401"), ("slurmdbd", "401:401")] {
            // The mount point in the root, and the test's own directory (each daemon's owner).
            std::fs::create_dir_all(root.join("run").join(d)).expect("a mount point");
            std::fs::create_dir_all(host.join("run").join(d)).expect("a socket directory");
            let out = Command::new("chown").arg(owner).arg(host.join("run").join(d)).output().expect("chown");
            assert!(out.status.success(), "chown: {}", String::from_utf8_lossy(&out.stderr));
            let _ = write!(script, "mount --bind '{h}/run/{d}' '{r}/run/{d}' && ");
        }
        let _ = write!(script, "mount -t proc proc '{r}/proc' && touch '{h}/namespace' && exec sleep 2147483647");
        let mut holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(log(host, "namespace.out"))
            .stderr(log(host, "namespace.out"))
            .spawn()
            .expect("a mount namespace (unshare from util-linux)");
        let deadline = Instant::now() + PATIENCE;
        while !host.join("namespace").exists() {
            let exited = holder.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() >= deadline {
                let out = std::fs::read_to_string(host.join("namespace.out")).unwrap_or_default();
                panic!("the test's mount namespace ({exited:?}): {out}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Namespace { root: root.to_owned(), holder }
    }

    /// `chroot <root>` in the namespace, to which a daemon's or command's arguments are added.
    pub(crate) fn chroot(&self) -> Command {
        let mut command = Command::new("nsenter");
        command.arg(format!("--mount=/proc/{}/ns/mnt", self.holder.id())).arg("chroot").arg(&self.root);
        command
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        stop(&mut self.holder);
    }
}

/// What a test changes of the Slurm [`SlurmHost::start_with`] starts.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `ClusterName` (default `paddocktest`).
    pub cluster: Option<String>,
    /// The key of `auth/jwt` (default: random bytes).
    pub jwt_key: Option<Vec<u8>>,
    /// Whether slurmctld keeps accounting in a slurmdbd (and MariaDB) of the test's own; without,
    /// `accounting_storage/none`.
    pub accounting: bool,
}

/// The root of `scripts/slurm-host` (`PADDOCK_TEST_SLURM_HOST`), when it is there and this test
/// runs as root; otherwise a [`skip`] (a failure under `CI=true`).
#[track_caller]
pub fn root() -> Option<PathBuf> {
    let root = skip::env("PADDOCK_TEST_SLURM_HOST", "a real slurmctld: scripts/slurm-host builds its root")?;
    let root = PathBuf::from(root);
    // An alternatives symlink, absolute inside the root: present is enough.
    let slurmctld = root.join("usr/sbin/slurmctld");
    skip::require(slurmctld.symlink_metadata().ok(), format_args!("{} is missing", slurmctld.display()))?;
    skip::root("running slurmctld chrooted").then_some(root)
}

/// [`root`], when the MariaDB root `scripts/slurm-host` builds beside it is there too (accounting
/// needs it); otherwise a [`skip`].
#[track_caller]
pub fn root_with_accounting() -> Option<PathBuf> {
    let root = root()?;
    slurm_host_db::mariadb_root(&root)?;
    Some(root)
}

pub(crate) fn free_port() -> u16 {
    free_port_on(IpAddr::from([127, 0, 0, 1]))
}

fn free_port_on(ip: IpAddr) -> u16 {
    let listener = std::net::TcpListener::bind((ip, 0)).expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// This host's name, which `SlurmctldHost` (and `DbdHost`) must name for slurmctld (slurmdbd) to
/// serve.
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").expect("the host's name").trim().to_owned()
}

impl SlurmHost {
    /// Starts slurmctld with this host's lines followed by `conf`, and waits until it answers.
    pub fn start(root: &Path, conf: &str) -> Self {
        Self::start_with(root, conf, &Options::default())
    }

    /// [`SlurmHost::start`] with `options`; with accounting, MariaDB and slurmdbd start first (a
    /// [`skip`] when the MariaDB root is missing).
    pub fn start_with(root: &Path, conf: &str, options: &Options) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = format!("/run/paddock-test-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let host = root.join(dir.trim_start_matches('/'));
        let _ = std::fs::remove_dir_all(&host);
        for sub in ["state", "spool"] {
            std::fs::create_dir_all(host.join(sub)).expect("the test's Slurm directory");
        }
        write_private(&host.join("slurm.key"), &random(1024));
        write_private(&host.join("jwt.key"), &options.jwt_key.clone().unwrap_or_else(|| random(32)));
        std::fs::write(host.join("cgroup.conf"), "CgroupPlugin=disabled\n").expect("cgroup.conf");
        // slurmctld runs as the root's `slurm` (401): its key and state are its own.
        let out = Command::new("chown").arg("-R").arg("401:401").arg(&host).output().expect("chown");
        assert!(out.status.success(), "chown: {}", String::from_utf8_lossy(&out.stderr));
        let ns = Namespace::start(root, &host);
        let ctld_port = free_port();
        let dbd_port = free_port();
        let storage = if options.accounting {
            format!("AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\nAccountingStoragePort={dbd_port}\n")
        } else {
            "AccountingStorageType=accounting_storage/none\n".to_owned()
        };
        let mut full = String::new();
        let _ = write!(
            full,
            "ClusterName={cluster}\nSlurmUser=slurm\nSlurmdUser=root\n\
             SlurmctldHost={host_name}(127.0.0.1)\nSlurmctldPort={ctld_port}\nSlurmdPort={slurmd_port}\n\
             StateSaveLocation={dir}/state\nSlurmdSpoolDir={dir}/spool\n\
             SlurmctldLogFile={dir}/slurmctld.log\nSlurmdLogFile={dir}/slurmd.log\n\
             SlurmctldPidFile={dir}/slurmctld.pid\nSlurmdPidFile={dir}/slurmd.pid\n\
             AuthType=auth/slurm\nCredType=cred/slurm\nAuthInfo={dir}/slurm.key\n\
             AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key={dir}/jwt.key\n\
             {storage}SlurmctldParameters=enable_configless\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n\
             MailProg=/bin/true\nMaxNodeCount=1024\n{conf}\n",
            cluster = options.cluster.as_deref().unwrap_or("paddocktest"),
            host_name = hostname(),
            slurmd_port = free_port(),
        );
        std::fs::write(host.join("slurm.conf"), full).expect("slurm.conf");
        let accounting = if options.accounting {
            let Some(mariadb) = slurm_host_db::mariadb_root(root) else {
                panic!("accounting asked for without the MariaDB root: check slurm_host_db::mariadb_root first")
            };
            Some(Accounting::start(&ns, &mariadb, (&dir, &host), dbd_port))
        } else {
            None
        };
        let ctld = ns
            .chroot()
            .args(["/usr/sbin/slurmctld", "-D", "-f"])
            .arg(format!("{dir}/slurm.conf"))
            .stdout(log(&host, "slurmctld.out"))
            .stderr(log(&host, "slurmctld.out"))
            .spawn()
            .expect("starting slurmctld");
        let slurm = SlurmHost { root: root.to_owned(), dir, ctld_port, ctld, slurmds: Vec::new(), accounting, ns };
        slurm.wait("slurmctld to answer", |s| s.run(&["scontrol", "ping"]).status.success().then_some(()));
        slurm
    }

    /// Where the test's files are on this host (logs to read when something fails).
    pub fn dir(&self) -> PathBuf {
        self.root.join(self.dir.trim_start_matches('/'))
    }

    /// Runs a Slurm command (`sbatch`, `squeue`, `scontrol`, ...) of the root against this
    /// slurmctld.
    pub fn run(&self, args: &[&str]) -> Output {
        self.ns
            .chroot()
            .arg("env")
            .arg(format!("SLURM_CONF={}/slurm.conf", self.dir))
            .args(args)
            .output()
            .expect("running a Slurm command")
    }

    /// Starts a slurmd that registers as the dynamic node `name` (`slurmd -Z -N <name> --conf
    /// <conf>`, as a Slinky NodeSet pod's slurmd does with `--conf "Features=<nodeset>"`). One
    /// slurmd at a time: they share the configuration's `SlurmdPort`.
    pub fn start_slurmd(&mut self, name: &str, conf: &str) {
        let child = self
            .ns
            .chroot()
            .args(["slurmd", "-D", "-Z", "-f", &format!("{}/slurm.conf", self.dir), "-N", name, "--conf", conf])
            .stdout(log(&self.dir(), &format!("slurmd-{name}.out")))
            .stderr(log(&self.dir(), &format!("slurmd-{name}.out")))
            .spawn()
            .expect("starting slurmd (nsenter from util-linux)");
        self.slurmds.push((name.to_owned(), child));
    }

    /// Starts slurmrestd (JWT authentication, as paddock's probe speaks to it) on a free port of
    /// 127.0.0.1, as the root's `nobody` (slurmrestd refuses root and `SlurmUser`), and waits until
    /// it listens; returns its port. Stopped with the rest.
    pub fn start_slurmrestd(&mut self) -> u16 {
        self.start_slurmrestd_on(IpAddr::from([127, 0, 0, 1]))
    }

    /// [`SlurmHost::start_slurmrestd`] on a free port of `ip` (an address of this host), e.g.
    /// one an API server's service proxy reaches.
    pub fn start_slurmrestd_on(&mut self, ip: IpAddr) -> u16 {
        let port = free_port_on(ip);
        let child = self
            .ns
            .chroot()
            .arg("env")
            .arg(format!("SLURM_CONF={}/slurm.conf", self.dir))
            .args(["SLURM_JWT=daemon", "slurmrestd", "-u", "65534", "-g", "65534", "-a", "rest_auth/jwt"])
            .arg(std::net::SocketAddr::from((ip, port)).to_string())
            .stdout(log(&self.dir(), "slurmrestd.out"))
            .stderr(log(&self.dir(), "slurmrestd.out"))
            .spawn()
            .expect("starting slurmrestd");
        self.slurmds.push(("slurmrestd".to_owned(), child));
        self.wait("slurmrestd to listen", |_| std::net::TcpStream::connect((ip, port)).ok().map(|_| ()));
        port
    }

    /// A JWT of `user` for slurmrestd (`scontrol token`), valid for ten minutes.
    pub fn token(&self, user: &str) -> String {
        let out = self.run(&["scontrol", "token", &format!("username={user}"), "lifespan=600"]);
        assert!(out.status.success(), "scontrol token: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim().trim_start_matches("SLURM_JWT=").to_owned()
    }

    /// Stops the slurmd of node `name`, and waits until it is gone.
    pub fn stop_slurmd(&mut self, name: &str) {
        if let Some(i) = self.slurmds.iter().position(|(n, _)| n == name) {
            let (_, mut child) = self.slurmds.remove(i);
            stop(&mut child);
        }
    }

    /// Polls `probe` until it gives a value, for at most a minute; fails naming `what` with the
    /// end of slurmctld's log.
    pub fn wait<T>(&self, what: &str, mut probe: impl FnMut(&Self) -> Option<T>) -> T {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(value) = probe(self) {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "waited {PATIENCE:?} for {what}; slurmctld's log ends:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The last lines of slurmctld's log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir().join("slurmctld.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The port slurmctld listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.ctld_port
    }
}

impl Drop for SlurmHost {
    fn drop(&mut self) {
        for (_, child) in &mut self.slurmds {
            stop(child);
        }
        stop(&mut self.ctld);
        drop(self.accounting.take());
        let _ = std::fs::remove_dir_all(self.dir());
    }
}

fn random(len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").expect("/dev/urandom"), &mut bytes)
        .expect("random bytes");
    bytes
}

/// Writes a key only its owner may read.
fn write_private(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).expect("a key");
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("a key's mode");
}

/// Ends a daemon this harness started: SIGTERM by its id (its own clean exit), then waits.
pub(crate) fn stop(child: &mut Child) {
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let _ = child.wait();
}

pub(crate) fn log(dir: &Path, name: &str) -> Stdio {
    let file = std::fs::OpenOptions::new().create(true).append(true).open(dir.join(name)).expect("a log file");
    Stdio::from(file)
}
