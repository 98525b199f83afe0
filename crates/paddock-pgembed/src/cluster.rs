//! The running cluster: first-use `initdb`, start (or adopt) the server, databases, stop.
//!
//! See the crate documentation for the directory layout and the root fallback directory.

use std::fmt::Write as _;
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::exec::{create_dirs, describe, output_text, owner_of, run, scrub, Runner, SERVER_USER};
use crate::{PgBinaries, PgError};

/// Where the cluster lives when, as root, the requested location is not reachable for `postgres`.
const ROOT_FALLBACK_BASE: &str = "/var/tmp/paddock-pg";
/// How often `start` tries another port after losing a port to someone else.
const PORT_ATTEMPTS: usize = 5;
/// How long `pg_ctl` waits for start/stop, in seconds.
const PG_CTL_TIMEOUT_SECS: &str = "60";
/// How long an adopted server gets to accept TCP connections.
const ADOPT_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest Unix socket path we hand to the server (macOS `sun_path` is 104 bytes, Linux 108).
const MAX_SOCKET_PATH: usize = 103;
/// The first line of every `pg_hba.conf` we write, so the file explains itself.
const HBA_CONF: &str = "\
# Written by paddock-pgembed: trust authentication, but only over the local socket and 127.0.0.1.
# The server listens on 127.0.0.1 only (see paddock.conf).
# TYPE  DATABASE  USER  ADDRESS       METHOD
local   all       all                 trust
host    all       all   127.0.0.1/32  trust
";

/// How to start a private cluster.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// The data directory; created and initialised (`initdb`) when it holds no `PG_VERSION`.
    pub data_dir: PathBuf,
    /// The TCP port on 127.0.0.1; `None` picks a free one. A taken port is replaced by a free one
    /// (logged), and an adopted server keeps the port it already has: read [`PgCluster::port`].
    pub port: Option<u16>,
    /// The server binaries to run, usually from [`crate::find_binaries`].
    pub bin: PgBinaries,
}

/// A running private PostgreSQL server on 127.0.0.1. Dropping it stops the server
/// (`pg_ctl stop -m fast`); [`PgCluster::stop`] does the same and reports errors.
#[derive(Debug)]
pub struct PgCluster {
    bin: PgBinaries,
    layout: Layout,
    runner: Runner,
    port: u16,
    pid: u32,
    adopted: bool,
    running: bool,
}

/// The files of one cluster: `<parent>/<name>` plus its siblings.
#[derive(Debug, Clone)]
struct Layout {
    /// `<parent>/<name>`: the PostgreSQL data directory.
    data_dir: PathBuf,
    /// `<parent>/<name>.run`: the Unix socket directory.
    run_dir: PathBuf,
    /// `<parent>/<name>.log`: the server log (`pg_ctl -l`).
    log_file: PathBuf,
    /// `<parent>/.<name>.initdb`: scratch directory for `initdb`, renamed to `data_dir` when done.
    init_dir: PathBuf,
}

impl Layout {
    fn beside(data_dir: PathBuf) -> Result<Layout, PgError> {
        let (Some(parent), Some(name)) = (data_dir.parent(), data_dir.file_name()) else {
            return Err(PgError::UnsafeDirectory {
                path: data_dir,
                reason: "a data directory needs a parent directory and a name",
            });
        };
        let name = name.to_string_lossy();
        Ok(Layout {
            run_dir: parent.join(format!("{name}.run")),
            log_file: parent.join(format!("{name}.log")),
            init_dir: parent.join(format!(".{name}.initdb")),
            data_dir,
        })
    }

    /// `/var/tmp/paddock-pg/<hash of requested>/<name>`: stable per requested path.
    fn root_fallback(requested: &Path) -> Result<Layout, PgError> {
        let base = Path::new(ROOT_FALLBACK_BASE);
        create_dirs(base)?;
        // /var/tmp is world-writable: make sure nobody else planted our base directory.
        let meta = fs::symlink_metadata(base).map_err(|source| PgError::Io {
            action: "inspecting",
            path: base.to_path_buf(),
            source,
        })?;
        if !meta.is_dir() || meta.uid() != 0 || meta.mode() & 0o022 != 0 {
            return Err(PgError::UnsafeDirectory {
                path: base.to_path_buf(),
                reason: "it must be a directory owned by root and writable only by root",
            });
        }
        let name = requested.file_name().map_or_else(|| "data".into(), |n| n.to_string_lossy().into_owned());
        let dir = base.join(format!("{:016x}", fnv1a64(requested.as_os_str().as_encoded_bytes())));
        create_dirs(&dir)?;
        Layout::beside(dir.join(name))
    }

    fn parent(&self) -> &Path {
        // `beside` guarantees a parent; `/` is only a fallback that is never reached.
        self.data_dir.parent().unwrap_or(Path::new("/"))
    }
}

impl PgCluster {
    /// Starts the cluster in `opts.data_dir`, running `initdb` first when it is new, or adopts a
    /// server that is already running there. Returns once the server accepts connections.
    pub fn start(opts: PgOptions) -> Result<PgCluster, PgError> {
        let runner = Runner::detect()?;
        let requested = std::path::absolute(&opts.data_dir).map_err(|source| PgError::Io {
            action: "resolving",
            path: opts.data_dir.clone(),
            source,
        })?;
        let mut layout = Layout::beside(requested.clone())?;
        create_dirs(layout.parent())?;
        // As root the server runs as `postgres`, which must be able to reach the data directory.
        // We never loosen the caller's directory permissions; we move the cluster instead.
        if runner.is_switching() && !runner.can_traverse(layout.parent())? {
            let fallback = Layout::root_fallback(&requested)?;
            tracing::warn!(
                pg.data_dir = %fallback.data_dir.display(),
                "the {SERVER_USER} user cannot reach {}; keeping the PostgreSQL data in {} instead",
                layout.parent().display(),
                fallback.data_dir.display(),
            );
            layout = fallback;
        }

        let mut cluster = PgCluster { bin: opts.bin, layout, runner, port: 0, pid: 0, adopted: false, running: false };
        if let Some((pid, port)) = cluster.live_server()? {
            // A server left running on this data directory (say by a killed `paddock dev`):
            // reuse it instead of failing on the lock, and stop it when we are done.
            cluster.pid = pid;
            cluster.port = port;
            cluster.adopted = true;
            cluster.running = true;
            cluster.wait_accepting(ADOPT_READY_TIMEOUT)?;
            tracing::info!(
                pg.port = port,
                pg.data_dir = %cluster.layout.data_dir.display(),
                "reusing the PostgreSQL server already running on {} (port {port})",
                cluster.layout.data_dir.display(),
            );
            return Ok(cluster);
        }
        cluster.ensure_initialized()?;
        cluster.prepare_run_files()?;
        cluster.start_server(opts.port)?;
        Ok(cluster)
    }

    /// A connection URL for `database` as the `postgres` superuser (trust auth, no password).
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{}", self.port, percent_encode(database))
    }

    /// The TCP port the server listens on (127.0.0.1 only).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The data directory actually in use (differs from the requested one under the root fallback).
    pub fn data_dir(&self) -> &Path {
        &self.layout.data_dir
    }

    /// The server's log file.
    pub fn log_file(&self) -> &Path {
        &self.layout.log_file
    }

    /// The postmaster's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// True when `start` found the server already running and reused it.
    pub fn adopted(&self) -> bool {
        self.adopted
    }

    /// The binaries this cluster runs.
    pub fn binaries(&self) -> &PgBinaries {
        &self.bin
    }

    /// Creates the database `name` unless it exists already (existing is success).
    pub fn create_database(&self, name: &str) -> Result<(), PgError> {
        validate_db_name(name)?;
        let exists = self.psql(&format!("select 1 from pg_database where datname = {}", sql_literal(name)))?;
        if exists.trim() == "1" {
            return Ok(());
        }
        match self.psql(&format!("create database {}", sql_ident(name))) {
            Ok(_) => Ok(()),
            // Another client created it between our check and our create: that is what we wanted.
            Err(PgError::CommandFailed { output, .. }) if output.contains("already exists") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Stops the server (`pg_ctl stop -m fast`) and waits until it is gone.
    pub fn stop(mut self) -> Result<(), PgError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), PgError> {
        if !self.running {
            return Ok(());
        }
        // Cleared first: if stopping fails, Drop must not try the same thing again.
        self.running = false;
        let pg_ctl = self.bin.program("pg_ctl");
        let mut cmd = self.runner.command(&pg_ctl);
        cmd.args(["stop", "-m", "fast", "-w", "-t", PG_CTL_TIMEOUT_SECS, "-D"]).arg(&self.layout.data_dir);
        match run(&mut cmd, &describe(&pg_ctl, "stop")) {
            Ok(_) => {
                tracing::info!(pg.port = self.port, "stopped PostgreSQL on port {}", self.port);
                Ok(())
            }
            // Already stopped (by someone else, or it died): the state we wanted.
            Err(_) if self.live_server()?.is_none() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `(pid, port)` of a server running on our data directory, from `pg_ctl status` and
    /// `postmaster.pid` (line 1: pid, line 4: port).
    fn live_server(&self) -> Result<Option<(u32, u16)>, PgError> {
        let pid_file = self.layout.data_dir.join("postmaster.pid");
        if !pid_file.is_file() {
            return Ok(None);
        }
        let pg_ctl = self.bin.program("pg_ctl");
        let mut cmd = self.runner.command(&pg_ctl);
        cmd.arg("status").arg("-D").arg(&self.layout.data_dir);
        let status = cmd
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|source| PgError::Spawn { program: describe(&pg_ctl, "status"), source })?;
        // Exit 0: running. 3: not running (a stale postmaster.pid, which the server replaces).
        if !status.status.success() {
            return Ok(None);
        }
        read_pid_file(&pid_file).map(Some)
    }

    /// Runs `initdb` in a scratch directory and moves the result into place (see crate docs).
    fn ensure_initialized(&self) -> Result<(), PgError> {
        let l = &self.layout;
        if l.data_dir.join("PG_VERSION").is_file() {
            return Ok(());
        }
        if let Ok(mut entries) = fs::read_dir(&l.data_dir) {
            if entries.next().is_some() {
                return Err(PgError::NotADataDir { path: l.data_dir.clone() });
            }
        }
        // A leftover from an interrupted first start: it never became the data directory.
        if l.init_dir.exists() {
            fs::remove_dir_all(&l.init_dir).map_err(|source| PgError::Io {
                action: "removing",
                path: l.init_dir.clone(),
                source,
            })?;
        }
        // Created by us (the server user may not write to the parent), then handed over.
        fs::create_dir(&l.init_dir).map_err(|source| PgError::Io {
            action: "creating",
            path: l.init_dir.clone(),
            source,
        })?;
        fs::set_permissions(&l.init_dir, fs::Permissions::from_mode(0o700)).map_err(|source| PgError::Io {
            action: "setting mode 0700 on",
            path: l.init_dir.clone(),
            source,
        })?;
        self.runner.give(&l.init_dir)?;

        tracing::info!(pg.data_dir = %l.data_dir.display(), "initialising a PostgreSQL {} cluster in {}", self.bin.version, l.data_dir.display());
        let initdb = self.bin.program("initdb");
        let mut cmd = self.runner.command(&initdb);
        cmd.arg("-D").arg(&l.init_dir).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-instructions",
        ]);
        run(&mut cmd, &describe(&initdb, "-D ..."))?;

        // Trust only on loopback: replace initdb's pg_hba.conf (which also trusts ::1 and replication).
        let hba = l.init_dir.join("pg_hba.conf");
        write_file(&hba, HBA_CONF)?;
        self.runner.give(&hba)?;
        // Per-start settings live in paddock.conf, included last so that they win.
        let conf = l.init_dir.join("postgresql.conf");
        let mut f = OpenOptions::new().append(true).open(&conf).map_err(|source| PgError::Io {
            action: "opening",
            path: conf.clone(),
            source,
        })?;
        io::Write::write_all(&mut f, b"\n# paddock-pgembed: per-start settings (address, port, socket directory).\ninclude_if_exists = 'paddock.conf'\n")
            .map_err(|source| PgError::Io { action: "writing", path: conf.clone(), source })?;

        // The rename is what makes the cluster exist; it replaces an empty data_dir if present.
        fs::rename(&l.init_dir, &l.data_dir).map_err(|source| PgError::Io {
            action: "moving the new cluster to",
            path: l.data_dir.clone(),
            source,
        })
    }

    /// Creates the socket directory and log file, owned by whoever runs the server.
    fn prepare_run_files(&self) -> Result<(), PgError> {
        let l = &self.layout;
        if !l.run_dir.is_dir() {
            fs::create_dir(&l.run_dir).map_err(|source| PgError::Io {
                action: "creating",
                path: l.run_dir.clone(),
                source,
            })?;
            fs::set_permissions(&l.run_dir, fs::Permissions::from_mode(0o700)).map_err(|source| PgError::Io {
                action: "setting mode 0700 on",
                path: l.run_dir.clone(),
                source,
            })?;
        }
        OpenOptions::new().create(true).append(true).open(&l.log_file).map_err(|source| PgError::Io {
            action: "creating",
            path: l.log_file.clone(),
            source,
        })?;
        let server_uid = self.runner.server_uid()?;
        for p in [&l.run_dir, &l.log_file] {
            if owner_of(p) != Some(server_uid) {
                self.runner.give(p)?;
            }
        }
        Ok(())
    }

    /// `pg_ctl start -w` on the requested (or a free) port, retrying on a port lost to a race.
    fn start_server(&mut self, requested: Option<u16>) -> Result<(), PgError> {
        let mut last = None;
        for attempt in 0..PORT_ATTEMPTS {
            let port = match requested {
                Some(p) if attempt == 0 && port_is_free(p) => p,
                Some(p) if attempt == 0 => {
                    let free = free_port()?;
                    tracing::warn!(
                        pg.port = free,
                        "port {p} on 127.0.0.1 is taken; starting PostgreSQL on port {free} instead"
                    );
                    free
                }
                _ => free_port()?,
            };
            self.write_settings(port)?;
            let log_start = fs::metadata(&self.layout.log_file).map_or(0, |m| m.len());

            let pg_ctl = self.bin.program("pg_ctl");
            let mut cmd = self.runner.command(&pg_ctl);
            cmd.args(["start", "-w", "-t", PG_CTL_TIMEOUT_SECS, "-D"])
                .arg(&self.layout.data_dir)
                .arg("-l")
                .arg(&self.layout.log_file);
            let out = cmd
                .stdin(std::process::Stdio::null())
                .output()
                .map_err(|source| PgError::Spawn { program: describe(&pg_ctl, "start"), source })?;
            if out.status.success() {
                let (pid, _) = read_pid_file(&self.layout.data_dir.join("postmaster.pid"))?;
                self.port = port;
                self.pid = pid;
                self.running = true;
                tracing::info!(
                    pg.port = port,
                    pg.data_dir = %self.layout.data_dir.display(),
                    "PostgreSQL {} is running on 127.0.0.1:{port} (data in {})",
                    self.bin.version,
                    self.layout.data_dir.display(),
                );
                return Ok(());
            }

            let mut log_tail = read_from(&self.layout.log_file, log_start);
            if log_tail.trim().is_empty() {
                log_tail = output_text(&out);
            }
            let lost_port = log_tail.contains("Address already in use");
            let err = PgError::StartFailed { port, log: self.layout.log_file.clone(), log_tail };
            if !lost_port {
                // `-w` may have given up while the server still comes up: do not leave it behind.
                let mut stop = self.runner.command(&pg_ctl);
                stop.args(["stop", "-m", "immediate", "-D"]).arg(&self.layout.data_dir);
                let _ignored = stop.stdin(std::process::Stdio::null()).output();
                return Err(err);
            }
            tracing::warn!(pg.port = port, "port {port} was taken before PostgreSQL could bind it; trying another");
            last = Some(err);
        }
        Err(last.unwrap_or(PgError::NoFreePort { source: None }))
    }

    /// Writes `paddock.conf`: listen on 127.0.0.1 only, on `port`, socket in the run directory.
    fn write_settings(&self, port: u16) -> Result<(), PgError> {
        let run_dir = self.layout.run_dir.to_string_lossy();
        // A too-long socket path makes the server fail; TCP is all we use, so drop the socket.
        let sockets =
            if run_dir.len() + "/.s.PGSQL.65535".len() <= MAX_SOCKET_PATH { conf_quote(&run_dir) } else { "''".into() };
        let mut text = String::from("# Written by paddock-pgembed before every start; edits are overwritten.\n");
        let _infallible =
            write!(text, "listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = {sockets}\n");
        let path = self.layout.data_dir.join("paddock.conf");
        write_file(&path, &text)?;
        self.runner.give(&path)
    }

    /// Polls a TCP connect to the server until it succeeds or `timeout` passes.
    fn wait_accepting(&self, timeout: Duration) -> Result<(), PgError> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let deadline = Instant::now() + timeout;
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(PgError::NotReady { data_dir: self.layout.data_dir.clone(), port: self.port });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs one SQL statement with `psql` against the `postgres` database; returns its stdout.
    fn psql(&self, sql: &str) -> Result<String, PgError> {
        let bundled = self.bin.program("psql");
        // Debian ships psql in the server's bin dir; elsewhere it may only be on PATH.
        let psql = if bundled.is_file() { bundled } else { PathBuf::from("psql") };
        let mut cmd = Command::new(&psql);
        scrub(&mut cmd);
        cmd.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(format!(
                "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=disable connect_timeout=10",
                self.port
            ))
            .arg("-c")
            .arg(sql);
        let out = run(&mut cmd, &describe(&psql, "-c ..."))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(pg.port = self.port, "could not stop PostgreSQL on port {}: {}", self.port, error_chain(&e));
        }
    }
}

/// `(pid, port)` from a `postmaster.pid` file.
fn read_pid_file(path: &Path) -> Result<(u32, u16), PgError> {
    let text = fs::read_to_string(path).map_err(|source| PgError::Io {
        action: "reading",
        path: path.to_path_buf(),
        source,
    })?;
    let lines: Vec<&str> = text.lines().collect();
    let pid = lines.first().and_then(|l| l.trim().parse().ok());
    let port = lines.get(3).and_then(|l| l.trim().parse().ok());
    match (pid, port) {
        (Some(pid), Some(port)) => Ok((pid, port)),
        _ => Err(PgError::BadPidFile { path: path.to_path_buf() }),
    }
}

/// Whether 127.0.0.1:`port` can be bound right now.
fn port_is_free(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// A port the kernel considers free on 127.0.0.1 (it may be taken again before the server binds
/// it; `start_server` retries when that happens).
fn free_port() -> Result<u16, PgError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| PgError::NoFreePort { source: Some(e) })?;
    let port = listener.local_addr().map_err(|e| PgError::NoFreePort { source: Some(e) })?.port();
    Ok(port)
}

/// The text appended to `path` after byte `offset` (best effort: empty when unreadable).
fn read_from(path: &Path, offset: u64) -> String {
    let mut buf = Vec::new();
    if let Ok(mut f) = fs::File::open(path) {
        if f.seek(SeekFrom::Start(offset)).is_ok() {
            let _partial = f.read_to_end(&mut buf);
        }
    }
    let text = String::from_utf8_lossy(&buf);
    // Only the last lines matter; a log from a crash loop can be long.
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn write_file(path: &Path, text: &str) -> Result<(), PgError> {
    fs::write(path, text).map_err(|source| PgError::Io { action: "writing", path: path.to_path_buf(), source })
}

fn validate_db_name(name: &str) -> Result<(), PgError> {
    let reason = if name.is_empty() {
        "it is empty"
    } else if name.len() > 63 {
        "it is longer than 63 bytes"
    } else if name.contains('\0') {
        "it contains a NUL byte"
    } else {
        return Ok(());
    };
    Err(PgError::InvalidDatabaseName { name: name.to_owned(), reason })
}

/// A SQL string literal (standard_conforming_strings is on by default).
fn sql_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A quoted SQL identifier.
fn sql_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// A quoted postgresql.conf string value (the config parser treats `\` as an escape).
fn conf_quote(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

/// Percent-encodes everything but RFC 3986 unreserved characters (for the URL path).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _infallible = write!(out, "%{b:02X}");
        }
    }
    out
}

/// FNV-1a, 64 bit: a hash that, unlike std's `DefaultHasher`, is stable across Rust releases,
/// so the root fallback directory for a path never moves.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// `outer: inner: innermost`, for the one place an error is logged instead of returned.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        let _infallible = write!(s, ": {inner}");
        cur = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_puts_socket_and_log_beside_the_data_dir() {
        let l = Layout::beside(PathBuf::from("/srv/dev/pg")).expect("layout");
        assert_eq!(l.run_dir, Path::new("/srv/dev/pg.run"));
        assert_eq!(l.log_file, Path::new("/srv/dev/pg.log"));
        assert_eq!(l.init_dir, Path::new("/srv/dev/.pg.initdb"));
        assert!(Layout::beside(PathBuf::from("/")).is_err());
    }

    #[test]
    fn quoting_escapes_what_each_language_needs() {
        assert_eq!(sql_literal("o'hara"), "'o''hara'");
        assert_eq!(sql_ident("we\"ird"), "\"we\"\"ird\"");
        assert_eq!(conf_quote("/a b/it's\\x"), "'/a b/it''s\\\\x'");
        assert_eq!(percent_encode("app_db-1"), "app_db-1");
        assert_eq!(percent_encode("a b/c"), "a%20b%2Fc");
    }

    #[test]
    fn fnv_hash_is_stable() {
        // Pinned: changing it would move every root fallback data directory.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn database_names_are_validated() {
        assert!(validate_db_name("paddock").is_ok());
        assert!(validate_db_name("").is_err());
        assert!(validate_db_name(&"x".repeat(64)).is_err());
    }
}
