//! Running PostgreSQL's programs: directly, or as the `postgres` OS user when we are root
//! (PostgreSQL's `initdb`, `pg_ctl` and `postgres` all refuse to run as root).

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{chown, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::PgError;

/// The OS user the server runs as when the process itself is root.
pub(crate) const SERVER_USER: &str = "postgres";

/// Environment variables that would redirect libpq or the server away from what we pass on the
/// command line; children never inherit them.
const SCRUBBED_ENV: &[&str] = &[
    "PGDATA",
    "PGPORT",
    "PGHOST",
    "PGHOSTADDR",
    "PGUSER",
    "PGDATABASE",
    "PGSERVICE",
    "PGOPTIONS",
    "PGPASSWORD",
    "PGPASSFILE",
    "PGSSLMODE",
];

/// How PostgreSQL's server programs are run.
#[derive(Debug, Clone)]
pub(crate) enum Runner {
    /// As the current (non-root) user.
    Direct,
    /// We are root: run as `user` through `runuser` (or `su` where `runuser` is missing).
    AsUser { user: &'static str, uid: u32, gid: u32, runuser: Option<PathBuf> },
}

impl Runner {
    /// Picks how to run the server programs for this process.
    pub(crate) fn detect() -> Result<Runner, PgError> {
        if effective_uid()? != 0 {
            return Ok(Runner::Direct);
        }
        let uid = id_of(&["-u", SERVER_USER])?.ok_or(PgError::NoPostgresUser)?;
        let gid = id_of(&["-g", SERVER_USER])?.ok_or(PgError::NoPostgresUser)?;
        let runuser = ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser", "/bin/runuser"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file());
        Ok(Runner::AsUser { user: SERVER_USER, uid, gid, runuser })
    }

    /// True when the server runs as another user than this process.
    pub(crate) fn is_switching(&self) -> bool {
        matches!(self, Runner::AsUser { .. })
    }

    /// A command that runs `program` as the server user, with a neutral cwd and scrubbed env.
    pub(crate) fn command(&self, program: &Path) -> Command {
        let mut cmd = match self {
            Runner::Direct => Command::new(program),
            Runner::AsUser { user, runuser: Some(runuser), .. } => {
                let mut c = Command::new(runuser);
                c.args(["-u", user, "--"]).arg(program);
                c
            }
            Runner::AsUser { user, runuser: None, .. } => {
                // `su USER -c CMD ARG0 ARGS...` hands ARG0 and ARGS to the shell as $0 and $@,
                // so no argument is ever re-parsed by a shell.
                let mut c = Command::new("su");
                c.args(["-s", "/bin/sh", user, "-c", r#"exec "$0" "$@""#]).arg(program);
                c
            }
        };
        scrub(&mut cmd);
        // The caller's cwd may be unreadable for the server user (e.g. under /root).
        cmd.current_dir("/");
        cmd
    }

    /// Hands `path` (not recursively) to the server user; a no-op when not switching users.
    pub(crate) fn give(&self, path: &Path) -> Result<(), PgError> {
        if let Runner::AsUser { uid, gid, .. } = self {
            chown(path, Some(*uid), Some(*gid)).map_err(|source| PgError::Io {
                action: "handing to the postgres user",
                path: path.to_path_buf(),
                source,
            })?;
        }
        Ok(())
    }

    /// Whether the server user can traverse `dir` (and therefore every ancestor of it).
    pub(crate) fn can_traverse(&self, dir: &Path) -> Result<bool, PgError> {
        match self {
            Runner::Direct => Ok(dir.is_dir()),
            Runner::AsUser { .. } => {
                // Ask the kernel as that user rather than re-implementing permission checks
                // (groups, ACLs): `test -x` on a directory means search permission, and the
                // path lookup itself needs search permission on every ancestor.
                let mut cmd = self.command(Path::new("test"));
                cmd.arg("-x").arg(dir).stdout(Stdio::null()).stderr(Stdio::null());
                let status = cmd.status().map_err(|source| PgError::Spawn {
                    program: format!("test -x {} (as {SERVER_USER})", dir.display()),
                    source,
                })?;
                Ok(status.success())
            }
        }
    }

    /// The uid that owns the server's files.
    pub(crate) fn server_uid(&self) -> Result<u32, PgError> {
        match self {
            Runner::AsUser { uid, .. } => Ok(*uid),
            Runner::Direct => effective_uid(),
        }
    }
}

/// Removes the libpq/server environment variables that would override our explicit arguments.
pub(crate) fn scrub(cmd: &mut Command) {
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
}

/// Runs `cmd` to completion and turns a non-zero exit into [`PgError::CommandFailed`].
pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<Output, PgError> {
    let output =
        cmd.stdin(Stdio::null()).output().map_err(|source| PgError::Spawn { program: what.to_owned(), source })?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(PgError::CommandFailed { program: what.to_owned(), status: output.status, output: output_text(&output) })
    }
}

/// The most useful text a failed command printed: stderr, or stdout when stderr is empty.
pub(crate) fn output_text(output: &Output) -> String {
    let err = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    if err.is_empty() {
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    } else {
        err
    }
}

/// The effective uid of this process, without `libc` (the workspace forbids `unsafe`).
///
/// Linux: the second field of `Uid:` in `/proc/self/status`. Elsewhere (macOS has no /proc):
/// `id -u`, which reports the effective uid.
pub(crate) fn effective_uid() -> Result<u32, PgError> {
    if let Ok(status) = fs::read_to_string("/proc/self/status") {
        let euid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok());
        if let Some(euid) = euid {
            return Ok(euid);
        }
    }
    let out = run(Command::new("id").arg("-u"), "id -u")?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    text.parse().map_err(|_| PgError::UnknownUid { output: text })
}

/// Runs `id ARGS`; `None` when `id` reports that the user does not exist.
fn id_of(args: &[&str]) -> Result<Option<u32>, PgError> {
    let out = Command::new("id")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| PgError::Spawn { program: format!("id {}", args.join(" ")), source })?;
    if !out.status.success() {
        return Ok(None);
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse().ok())
}

/// Creates `dir` and any missing ancestors. Directories created here get mode 0755 regardless of
/// the umask, so that the server user can traverse them when we are root.
pub(crate) fn create_dirs(dir: &Path) -> Result<(), PgError> {
    use std::os::unix::fs::PermissionsExt;
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(d) = cur {
        if d.exists() {
            break;
        }
        missing.push(d);
        cur = d.parent();
    }
    for d in missing.into_iter().rev() {
        match fs::create_dir(d) {
            Ok(()) => {}
            // Someone else created it in the meantime: fine, we only need it to exist.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(source) => return Err(PgError::Io { action: "creating", path: d.to_path_buf(), source }),
        }
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).map_err(|source| PgError::Io {
            action: "setting mode 0755 on",
            path: d.to_path_buf(),
            source,
        })?;
    }
    Ok(())
}

/// Owner uid of `path` (not following a final symlink), if it exists.
pub(crate) fn owner_of(path: &Path) -> Option<u32> {
    fs::symlink_metadata(path).ok().map(|m| m.uid())
}

/// A display form of a program invocation for error messages.
pub(crate) fn describe(program: &Path, step: impl AsRef<OsStr>) -> String {
    let name = program.file_name().unwrap_or(program.as_os_str()).to_string_lossy();
    format!("{name} {}", step.as_ref().to_string_lossy())
}
