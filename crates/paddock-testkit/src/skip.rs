//! The one way a test may skip: when what it needs is not here (a test server, a tool, an input
//! file, root, a routable address), [`skip`] prints `SKIPPED: <reason>` on stderr and the test
//! returns, passing vacuously; under `CI=true` (what `.ci/run` sets) the same call panics with the
//! reason, so that CI never passes a test that did not run. Every test that can skip goes through
//! here; no test decides on its own whether a missing precondition is fatal.

use std::fmt::Display;
use std::io::Write;

/// Whether this is a CI run (`CI=true`), where nothing may be skipped.
pub fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Skips the calling test for `reason` (the caller returns next): a notice on stderr locally
/// (written past the test harness's capture, so that a skip is seen in a passing run), a panic
/// naming the reason under `CI=true`.
#[track_caller]
pub fn skip(reason: impl Display) {
    assert!(!on_ci(), "CI=true, and this test would skip: {reason}");
    let _ = writeln!(std::io::stderr(), "SKIPPED ({}): {reason}", std::thread::current().name().unwrap_or("a test"));
}

/// `value`, or, when it is `None`, a [`skip`] for `reason` (and `None`): the caller returns on
/// `None` (`let Some(x) = require(..) else { return };`).
#[track_caller]
pub fn require<T>(value: Option<T>, reason: impl Display) -> Option<T> {
    if value.is_none() {
        skip(reason);
    }
    value
}

/// The value of the environment variable `name` when it is set and not empty, or a [`skip`]
/// naming it and `why` it is needed (and `None`).
#[track_caller]
pub fn env(name: &str, why: impl Display) -> Option<String> {
    let value = std::env::var(name).ok().filter(|v| !v.is_empty());
    require(value, format_args!("{name} is not set ({why})"))
}

/// Whether the test runs as root; otherwise a [`skip`] naming what needs root.
#[track_caller]
pub fn root(what: impl Display) -> bool {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0");
    if !root {
        skip(format_args!("{what} needs root"));
    }
    root
}
