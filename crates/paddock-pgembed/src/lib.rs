//! paddock-pgembed: a private PostgreSQL cluster for `paddock dev`, run from the server binaries
//! already installed on the machine (nothing is downloaded).
//!
//! - [`find_binaries`] locates `initdb`, `pg_ctl` and `postgres`, or says exactly what to install.
//! - [`PgCluster::start`] initialises a data directory on first use and starts the server on
//!   `127.0.0.1` only; [`PgCluster::stop`] or `Drop` stops it again (`pg_ctl stop -m fast`).
//!
//! Invariants this crate keeps:
//! - **Trust auth only on loopback.** The cluster is created with `--auth=trust`, and its
//!   `pg_hba.conf` is rewritten to accept only the local socket and `127.0.0.1/32`; the server
//!   listens on nothing else.
//! - **A data directory holding `PG_VERSION` is complete.** `initdb` runs in a sibling scratch
//!   directory that is renamed into place only after it succeeded and was configured, so an
//!   interrupted first start never leaves a half-made cluster behind.
//! - **Durability defaults are kept.** No `--no-sync`, no `fsync = off`: `paddock dev` data
//!   survives a crash. (The throw-away test cluster of `scripts/pg-start` is tuned differently.)
//!
//! # Layout
//!
//! For a data directory `<parent>/<name>`, the server's Unix socket lives in `<parent>/<name>.run/`
//! and its log in `<parent>/<name>.log`. Per-start settings (address, port, socket directory) are
//! rewritten into `<name>/paddock.conf`, which `postgresql.conf` includes last.
//!
//! # Running as root
//!
//! PostgreSQL refuses to run as root. When the process is root, every `initdb`/`pg_ctl` call runs
//! as the `postgres` OS user (`runuser -u postgres --`, or `su` where `runuser` is missing) and
//! the directories the server writes are handed to that user. The server must be able to reach
//! its data directory, so when `postgres` cannot traverse `<parent>` (typically a checkout under
//! `/root`, mode 0700) the cluster is placed in a **fallback directory** instead:
//! `/var/tmp/paddock-pg/<hash>/<name>`, where `<hash>` is a stable hash of the requested absolute
//! path. The same request always maps to the same fallback, so data persists across runs; the
//! choice is logged and [`PgCluster::data_dir`] reports where the data really is. Ancestor
//! permissions of the caller's directories are never changed.
//!
//! # An already running server
//!
//! When a server is already running on the data directory (a live `postmaster.pid`, e.g. left
//! over by a `paddock dev` that was killed), `start` adopts it: it reads its port from
//! `postmaster.pid` and returns a handle that stops it like one it started itself.

mod binaries;
mod cluster;
mod exec;

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;

pub use binaries::{find_binaries, PgBinaries};
pub use cluster::{PgCluster, PgOptions};

/// Everything that can go wrong while finding, starting, using or stopping PostgreSQL.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// No directory with the server binaries was found in any of the usual places.
    #[error(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found. Install them: \
         Debian/Ubuntu `sudo apt-get install postgresql`, Fedora `sudo dnf install postgresql-server`, \
         macOS `brew install postgresql@16`; or point --pg-bin-dir at the directory holding pg_ctl."
    )]
    BinariesNotFound,

    /// The explicitly given binary directory lacks one of the server programs.
    #[error(
        "{} does not hold the PostgreSQL server binaries: `{missing}` is missing; \
         point --pg-bin-dir at the directory holding pg_ctl, initdb and postgres",
        dir.display()
    )]
    IncompleteBinDir {
        /// The directory that was searched.
        dir: PathBuf,
        /// The first program that was not found there.
        missing: &'static str,
    },

    /// The output of `postgres --version` could not be understood.
    #[error("cannot read the PostgreSQL version from `{output}`")]
    UnknownVersion {
        /// What the program printed.
        output: String,
    },

    /// A program could not be started at all.
    #[error("running `{program}`")]
    Spawn {
        /// The program (with a short description of the step).
        program: String,
        /// Why spawning failed.
        #[source]
        source: io::Error,
    },

    /// A program ran and exited unsuccessfully.
    #[error("`{program}` failed ({status}): {output}")]
    CommandFailed {
        /// The program (with a short description of the step).
        program: String,
        /// Its exit status.
        status: ExitStatus,
        /// Its trimmed stderr (or stdout when stderr was empty).
        output: String,
    },

    /// A file-system step on the cluster's directories failed.
    #[error("{action} {}", path.display())]
    Io {
        /// What was being done, e.g. "creating".
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The effective user id of this process could not be determined.
    #[error("cannot determine the effective user id (`id -u` printed `{output}`)")]
    UnknownUid {
        /// What `id -u` printed.
        output: String,
    },

    /// The process runs as root, but there is no `postgres` OS user to run the server as.
    #[error(
        "PostgreSQL refuses to run as root and there is no `postgres` OS user to run it as; \
         install the distribution's postgresql package (it creates the user) or run as a regular user"
    )]
    NoPostgresUser,

    /// A directory we would create or use is not safe to use (wrong owner or type).
    #[error("refusing to use {}: {reason}", path.display())]
    UnsafeDirectory {
        /// The offending path.
        path: PathBuf,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The data directory exists, is not empty, and is not a PostgreSQL cluster.
    #[error(
        "{} exists but is not a PostgreSQL data directory (no PG_VERSION); \
         choose another --data-dir or remove it",
        path.display()
    )]
    NotADataDir {
        /// The data directory.
        path: PathBuf,
    },

    /// `pg_ctl start` did not bring the server up.
    #[error("PostgreSQL did not start on 127.0.0.1:{port}; server log {}:\n{log_tail}", log.display())]
    StartFailed {
        /// The port it tried.
        port: u16,
        /// The server's log file.
        log: PathBuf,
        /// The log lines written during this attempt (or pg_ctl's output when there are none).
        log_tail: String,
    },

    /// A server already running on the data directory did not accept connections in time.
    #[error("the PostgreSQL server already running on {} (port {port}) does not accept connections", data_dir.display())]
    NotReady {
        /// Its data directory.
        data_dir: PathBuf,
        /// The port read from its `postmaster.pid`.
        port: u16,
    },

    /// `postmaster.pid` could not be parsed.
    #[error("cannot parse {}", path.display())]
    BadPidFile {
        /// The pid file.
        path: PathBuf,
    },

    /// No free TCP port could be found, or every attempt lost the race for one.
    #[error("no free TCP port on 127.0.0.1 for PostgreSQL")]
    NoFreePort {
        /// The last error seen, if any.
        #[source]
        source: Option<io::Error>,
    },

    /// The database name cannot be used.
    #[error("invalid database name `{name}`: {reason}")]
    InvalidDatabaseName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
}
