//! Locating PostgreSQL's server binaries (`initdb`, `pg_ctl`, `postgres`) on this machine.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::exec::{run, scrub};
use crate::PgError;

/// The programs a directory must hold to count as a server binary directory.
const REQUIRED: [&str; 3] = ["pg_ctl", "initdb", "postgres"];

/// A directory holding PostgreSQL's server programs, and their version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgBinaries {
    /// The directory holding `initdb`, `pg_ctl`, `postgres` (and usually `psql`).
    pub bin_dir: PathBuf,
    /// The server version as `postgres --version` reports it, e.g. `15.13`.
    pub version: String,
}

impl PgBinaries {
    /// Checks that `dir` holds the server programs and reads their version.
    pub fn from_dir(dir: &Path) -> Result<PgBinaries, PgError> {
        if let Some(missing) = REQUIRED.into_iter().find(|p| !dir.join(p).is_file()) {
            return Err(PgError::IncompleteBinDir { dir: dir.to_path_buf(), missing });
        }
        let postgres = dir.join("postgres");
        let mut cmd = Command::new(&postgres);
        scrub(&mut cmd);
        // `--version` is answered before PostgreSQL's "do not run as root" check.
        let out = run(cmd.arg("--version"), &format!("{} --version", postgres.display()))?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let version = parse_version(&text).ok_or(PgError::UnknownVersion { output: text })?;
        Ok(PgBinaries { bin_dir: dir.to_path_buf(), version })
    }

    /// The path of a program in the binary directory, e.g. `program("pg_ctl")`.
    pub fn program(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    /// The major version (`15` for `15.13`, `9` for `9.6.24`), when it parses.
    pub fn major(&self) -> Option<u32> {
        self.version.split('.').next().and_then(|m| m.parse().ok())
    }
}

/// Finds the server binaries.
///
/// `explicit` (the `--pg-bin-dir` flag or `PADDOCK_PG_BIN_DIR`, read by the caller's config) wins
/// and must be complete. Otherwise the first complete directory among these is used:
/// `pg_ctl` on `PATH` (symlinks resolved), `/usr/lib/postgresql/<highest>/bin` (Debian/Ubuntu),
/// `/usr/local/pgsql/bin` (source installs), `/opt/homebrew/opt/postgresql*/bin` and
/// `/usr/local/opt/postgresql*/bin` (Homebrew, highest version first).
pub fn find_binaries(explicit: Option<&Path>) -> Result<PgBinaries, PgError> {
    if let Some(dir) = explicit {
        return PgBinaries::from_dir(dir);
    }
    for dir in candidates() {
        if REQUIRED.iter().all(|p| dir.join(p).is_file()) {
            tracing::debug!(pg.bin_dir = %dir.display(), "using PostgreSQL binaries in {}", dir.display());
            return PgBinaries::from_dir(&dir);
        }
    }
    Err(PgError::BinariesNotFound)
}

/// Candidate binary directories, in search order.
fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    // PATH is the OS's program search path, not paddock configuration, so reading it here is
    // program lookup like a shell would do it.
    if let Some(path) = std::env::var_os("PATH") {
        for entry in std::env::split_paths(&path) {
            let pg_ctl = entry.join("pg_ctl");
            if pg_ctl.is_file() {
                // /usr/local/bin/pg_ctl may be a symlink into the real bin dir, which is the one
                // that also holds initdb and postgres.
                if let Some(parent) = fs::canonicalize(&pg_ctl).ok().and_then(|p| p.parent().map(Path::to_path_buf)) {
                    out.push(parent);
                }
            }
        }
    }
    out.extend(versioned_dirs(Path::new("/usr/lib/postgresql"), |name| Some(name)).into_iter().map(|d| d.join("bin")));
    out.push(PathBuf::from("/usr/local/pgsql/bin"));
    for brew in ["/opt/homebrew/opt", "/usr/local/opt"] {
        let dirs = versioned_dirs(Path::new(brew), |name| {
            // `postgresql@16` -> "16"; a bare `postgresql` formula sorts below versioned ones.
            if name == "postgresql" {
                Some("0")
            } else {
                name.strip_prefix("postgresql@")
            }
        });
        out.extend(dirs.into_iter().map(|d| d.join("bin")));
    }
    out
}

/// Subdirectories of `root` whose name maps (through `version_of`) to a dotted version number,
/// highest version first.
fn versioned_dirs(root: &Path, version_of: impl Fn(&str) -> Option<&str>) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(root) else {
        return Vec::new();
    };
    let mut found: Vec<(Vec<u32>, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let version = version_key(version_of(&name)?)?;
            Some((version, e.path()))
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0));
    found.into_iter().map(|(_, p)| p).collect()
}

/// `"9.6"` -> `[9, 6]`; `None` when any component is not a number.
fn version_key(s: &str) -> Option<Vec<u32>> {
    s.split('.').map(|c| c.parse().ok()).collect()
}

/// Extracts `15.13` from `postgres (PostgreSQL) 15.13 (Debian 15.13-0+deb12u1)`.
fn parse_version(text: &str) -> Option<String> {
    let mut words = text.split_whitespace();
    words.find(|w| *w == "(PostgreSQL)")?;
    let v = words.next()?;
    v.chars().next().filter(char::is_ascii_digit)?;
    Some(v.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_version_reads_distribution_and_plain_output() {
        assert_eq!(parse_version("postgres (PostgreSQL) 15.13 (Debian 15.13-0+deb12u1)").as_deref(), Some("15.13"));
        assert_eq!(parse_version("postgres (PostgreSQL) 17.2").as_deref(), Some("17.2"));
        assert_eq!(parse_version("postgres (PostgreSQL) 18beta1").as_deref(), Some("18beta1"));
        assert_eq!(parse_version("something else"), None);
    }

    #[test]
    fn version_key_orders_numerically() {
        let mut v = vec![version_key("9.6"), version_key("15"), version_key("10")];
        v.sort();
        assert_eq!(v, vec![version_key("9.6"), version_key("10"), version_key("15")]);
        assert_eq!(version_key("main"), None);
    }

    #[test]
    fn missing_binaries_error_says_what_to_install() {
        let msg = PgError::BinariesNotFound.to_string();
        assert_eq!(
            msg,
            "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found. Install them: \
             Debian/Ubuntu `sudo apt-get install postgresql`, Fedora `sudo dnf install postgresql-server`, \
             macOS `brew install postgresql@16`; or point --pg-bin-dir at the directory holding pg_ctl."
        );
    }
}
