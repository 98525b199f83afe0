//! The independent readers: pycdlib (PyPI) in a private venv, `xorriso` (libisofs) and `blkid`.
//!
//! The venv lives in `$HOME/.cache/paddock/pycdlib-venv` and is created once, then reused. A
//! missing reader skips the check that needs it ([`skip`]: a notice, or a failure under
//! `CI=true`, whose runner installs all three).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use paddock_testkit::skip;
use serde_json::Value;

/// The pycdlib release the venv installs.
const PYCDLIB_VERSION: &str = "1.22.0";

/// Reads an image with pycdlib and prints what it sees as JSON: both volume identifiers, the
/// volume size and, for each tree, every file (by path, dot entries left out, directories walked)
/// with its contents in hex.
const READ_SCRIPT: &str = r#"
import io, json, sys
import pycdlib

def walk(iso, key, decode, prefix=""):
    """Every file under `prefix` as (path without the leading slash, record), depth first."""
    out = []
    for rec in iso.list_children(**{key: "/" + prefix}):
        if rec.is_dot() or rec.is_dotdot():
            continue
        name = prefix + decode(rec.file_identifier())
        if rec.is_dir():
            out.extend(walk(iso, key, decode, name + "/"))
        else:
            out.append(name)
    return out

def read(iso, **path):
    buf = io.BytesIO()
    iso.get_file_from_iso_fp(buf, **path)
    return buf.getvalue().hex()

def tree(iso, key, decode):
    return {n: read(iso, **{key: "/" + n}) for n in walk(iso, key, decode)}

iso = pycdlib.PyCdlib()
iso.open(sys.argv[1])
result = {
    "pvd_volume_id": iso.pvd.volume_identifier.decode("ascii").rstrip(" "),
    "has_joliet": iso.has_joliet(),
    "joliet_volume_id": iso.joliet_vd.volume_identifier.decode("utf-16_be").rstrip(" ") if iso.has_joliet() else None,
    "joliet": tree(iso, "joliet_path", lambda b: b.decode("utf-16_be")) if iso.has_joliet() else {},
    "iso9660": tree(iso, "iso_path", lambda b: b.decode("ascii")),
    "volume_bytes": iso.pvd.space_size * iso.pvd.log_block_size,
}
iso.close()
print(json.dumps(result))
"#;

/// Files by name with their contents, sorted by name.
pub type Files = Vec<(String, Vec<u8>)>;

/// What pycdlib saw in an image.
pub struct Seen {
    /// The whole JSON report of [`READ_SCRIPT`].
    pub report: Value,
    /// pycdlib's stderr (warnings), empty when it had nothing to say.
    pub warnings: String,
}

impl Seen {
    /// Files of the Joliet tree (real names) or the ISO 9660 tree (mangled names), sorted by name.
    pub fn files(&self, tree: &str) -> Files {
        let mut files: Files = self.report[tree]
            .as_object()
            .expect("tree object")
            .iter()
            .map(|(name, hex)| (name.clone(), unhex(hex.as_str().expect("hex string"))))
            .collect();
        files.sort();
        files
    }
}

/// The venv's python with pycdlib, or `None` (the check is skipped: [`skip`]) when it cannot be
/// had.
pub fn pycdlib_python() -> Option<&'static Path> {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match PYTHON.get_or_init(ensure_venv) {
        Ok(python) => Some(python),
        Err(why) => {
            skip::skip(format_args!(
                "pycdlib {PYCDLIB_VERSION} is unavailable, so the seed image is not read by it: {why}"
            ));
            None
        }
    }
}

/// The output of `command`, or `None` (the check is skipped: [`skip`]) when its program is not
/// installed; any other failure to run it fails the test.
fn run_reader(command: &mut Command) -> Option<std::process::Output> {
    match command.output() {
        Ok(output) => Some(output),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            skip::skip(format_args!("{:?} is not installed, so the image is not read by it", command.get_program()));
            None
        }
        Err(e) => panic!("running {:?}: {e}", command.get_program()),
    }
}

fn ensure_venv() -> Result<PathBuf, String> {
    let home = std::env::var_os("HOME").ok_or("HOME is not set")?;
    let venv = Path::new(&home).join(".cache/paddock/pycdlib-venv");
    let python = venv.join("bin/python");
    let has_pycdlib = |python: &Path| {
        Command::new(python)
            .args(["-c", "import importlib.metadata as m, sys; sys.exit(m.version('pycdlib') != sys.argv[1])"])
            .arg(PYCDLIB_VERSION)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if has_pycdlib(&python) {
        return Ok(python);
    }
    eprintln!("creating {} with pycdlib {PYCDLIB_VERSION}", venv.display());
    run(Command::new("python3").args(["-m", "venv", "--clear"]).arg(&venv))?;
    run(Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .arg(format!("pycdlib=={PYCDLIB_VERSION}")))?;
    if has_pycdlib(&python) {
        Ok(python)
    } else {
        Err(format!("pycdlib {PYCDLIB_VERSION} still not importable from {}", python.display()))
    }
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command.output().map_err(|e| format!("running {command:?}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("{command:?} exited with {}: {}", output.status, String::from_utf8_lossy(&output.stderr)))
    }
}

/// A scratch file for one image, removed on drop.
pub struct ImageFile(pub PathBuf);

impl ImageFile {
    /// Writes `image` to a file named after the test.
    pub fn new(test: &str, image: &[u8]) -> Self {
        let path = std::env::temp_dir().join(format!("paddock-seed-{}-{test}.iso", std::process::id()));
        std::fs::write(&path, image).expect("write image");
        Self(path)
    }
}

impl Drop for ImageFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Reads `image` with pycdlib; `None` when pycdlib is unavailable locally.
pub fn read_with_pycdlib(test: &str, image: &[u8]) -> Option<Seen> {
    let python = pycdlib_python()?;
    let file = ImageFile::new(test, image);
    let output =
        Command::new(python).args(["-W", "always", "-c", READ_SCRIPT]).arg(&file.0).output().expect("run pycdlib");
    let warnings = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "pycdlib could not read the image: {warnings}");
    if !warnings.is_empty() {
        eprintln!("pycdlib said: {warnings}");
    }
    let report = serde_json::from_slice(&output.stdout).expect("pycdlib JSON report");
    Some(Seen { report, warnings })
}

/// The PVD volume id and the Joliet tree's files (by path) as `xorriso` (libisofs) reads them, with
/// Rock Ridge ignored (`-read_fs norock`); `None` (skipped) when xorriso is not installed.
pub fn xorriso_extract(test: &str, image: &[u8]) -> Option<(String, Files)> {
    let file = ImageFile::new(test, image);
    let out = std::env::temp_dir().join(format!("paddock-seed-{}-{test}.d", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let output = run_reader(
        Command::new("xorriso")
            .args(["-abort_on", "FAILURE", "-read_fs", "norock", "-osirrox", "on", "-indev"])
            .arg(&file.0)
            .args(["-pvd_info", "-extract", "/"])
            .arg(&out),
    )?;
    let report = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "xorriso failed: {}", String::from_utf8_lossy(&output.stderr));
    let volume_id = report
        .lines()
        .find_map(|l| l.strip_prefix("Volume Id    : "))
        .expect("xorriso -pvd_info prints the volume id")
        .to_owned();
    let mut files = Vec::new();
    let mut dirs = vec![(String::new(), out.clone())];
    while let Some((prefix, dir)) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("extracted tree") {
            let entry = entry.expect("dir entry");
            let name = format!("{prefix}{}", entry.file_name().into_string().expect("UTF-8 name"));
            if entry.file_type().expect("file type").is_dir() {
                dirs.push((format!("{name}/"), entry.path()));
            } else {
                files.push((name, std::fs::read(entry.path()).expect("extracted file")));
            }
        }
    }
    files.sort();
    // xorriso restores files and directory read-only; make them writable again to remove them.
    let _ = Command::new("chmod").arg("-R").arg("u+w").arg(&out).status();
    let _ = std::fs::remove_dir_all(&out);
    Some((volume_id, files))
}

/// `blkid -p -o export` of `image` as KEY=VALUE lines; `None` (skipped) when blkid is not installed.
pub fn blkid(test: &str, image: &[u8]) -> Option<String> {
    let file = ImageFile::new(test, image);
    let output = run_reader(Command::new("blkid").args(["-p", "-o", "export"]).arg(&file.0))?;
    assert!(output.status.success(), "blkid failed: {}", String::from_utf8_lossy(&output.stderr));
    Some(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex digit")).collect()
}
