//! The operator console (docs/console.md) in a real browser against `paddock dev`:
//! `scripts/console-browser --run` drives Debian's chromium with playwright-core through
//! tests/console/console.test.mjs (sign in as the provider, the fleet chart, a machine's ledger, a
//! cluster created through the API followed to `succeeded` on its page, a CSV export; a tenant
//! that sees no other tenant and no fleet; a bad token's sign-in error), and writes a screenshot
//! of each page into `PADDOCK_CONSOLE_SCREENSHOTS` (default: under the target directory).
//! Without node, npm or chromium it skips locally and fails under CI=true.

mod support;

use std::path::Path;
use std::process::Command;

#[test]
fn the_console_works_in_a_real_browser_against_paddock_dev() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/console-browser");
    let check = Command::new(&script).arg("--install").output().expect("running scripts/console-browser");
    if check.status.code() == Some(2) {
        return paddock_testkit::skip::skip(String::from_utf8_lossy(&check.stderr).trim());
    }
    assert!(check.status.success(), "scripts/console-browser --install: {}", String::from_utf8_lossy(&check.stderr));
    let shots = std::env::var("PADDOCK_CONSOLE_SCREENSHOTS")
        .unwrap_or_else(|_| Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots").display().to_string());
    let dev = support::Dev::start();
    support::wait_ready(&dev);
    let url = format!("{}/console/", dev.var("B"));
    assert!(
        dev.banner.iter().any(|line| line.trim().starts_with("console") && line.contains(&url)),
        "paddock dev prints the console's URL {url}:\n{}",
        dev.banner.join("\n")
    );
    let out = Command::new("timeout")
        .arg("600")
        .arg(&script)
        .arg("--run")
        .env("PADDOCK_CONSOLE_SCREENSHOTS", &shots)
        .envs(dev.exports.iter().map(|(n, v)| (n.as_str(), v.as_str())))
        .output()
        .expect("running scripts/console-browser");
    drop(dev);
    let said = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{said}");
    assert!(out.status.success(), "the console's browser tests failed ({}):\n{said}", out.status);
    assert!(said.contains("fail 0") && !said.contains("pass 0"), "the browser tests ran and passed:\n{said}");
    for page in ["fleet", "machine", "cluster", "tenants", "audit", "usage", "tenant", "sign-in-error"] {
        assert!(Path::new(&shots).join(format!("{page}.png")).is_file(), "a screenshot of {page} in {shots}");
    }
}
