//! The operator console (docs/console.md) in a real browser against `paddock dev`:
//! `scripts/console-browser --run` drives Debian's chromium with playwright-core through
//! tests/console/console.test.mjs (sign in as the provider, the fleet chart, a machine's ledger, a
//! cluster created through the API followed to `succeeded` on its page, a CSV export; a tenant
//! that sees no other tenant and no fleet; a bad token's sign-in error), and writes a screenshot
//! of each page into `PADDOCK_CONSOLE_SCREENSHOTS` (default: under the target directory).
//! `paddock dev` runs with the test's OIDC provider (tests/console/oidc-provider.mjs, started by
//! the browser tests on a port chosen here) as its JWT issuer and JWKS and as the console's issuer
//! (`PADDOCK_CONSOLE_OIDC_*`): the sign-in through it as the provider and as a tenant, a forged
//! state and a wrong PKCE verifier refused, a 401 signing the user out.
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
    let free = || std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let (port, idp_port) = (free(), free());
    let issuer = format!("http://127.0.0.1:{idp_port}");
    let dev = support::Dev::start_with(&[
        ("PADDOCK_LISTEN", format!("127.0.0.1:{port}")),
        ("PADDOCK_JWT_ISSUER", issuer.clone()),
        ("PADDOCK_JWT_JWKS_URL", format!("{issuer}/jwks")),
        ("PADDOCK_CONSOLE_OIDC_DISCOVERY_URL", format!("{issuer}/.well-known/openid-configuration")),
        ("PADDOCK_CONSOLE_OIDC_CLIENT_ID", "paddock-console".to_owned()),
        ("PADDOCK_CONSOLE_OIDC_REDIRECT_URI", format!("http://127.0.0.1:{port}/console/")),
    ]);
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
        .env("PADDOCK_CONSOLE_IDP_PORT", idp_port.to_string())
        .envs(dev.exports.iter().map(|(n, v)| (n.as_str(), v.as_str())))
        .output()
        .expect("running scripts/console-browser");
    drop(dev);
    let said = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{said}");
    assert!(out.status.success(), "the console's browser tests failed ({}):\n{said}", out.status);
    assert!(said.contains("fail 0") && !said.contains("pass 0"), "the browser tests ran and passed:\n{said}");
    let pages = ["fleet", "machine", "cluster", "tenants", "audit", "usage", "tenant", "sign-in-error"];
    for page in pages.into_iter().chain(["oidc-fleet", "oidc-signed-out", "oidc-state-error"]) {
        assert!(Path::new(&shots).join(format!("{page}.png")).is_file(), "a screenshot of {page} in {shots}");
    }
}

/// The console's OIDC settings are checked at start, all at once with the others, each problem
/// naming its variable (`paddock check-config api`, as `paddock api` would refuse to start).
#[test]
fn the_consoles_oidc_settings_are_checked_at_start() {
    let check = |env: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_paddock"));
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("PADDOCK_")) {
            cmd.env_remove(k);
        }
        let out = cmd.args(["check-config", "api"]).envs(env.iter().copied()).output().expect("running paddock");
        assert!(!out.status.success(), "accepted: {env:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let why = check(&[("PADDOCK_CONSOLE_OIDC_CLIENT_ID", "paddock-console")]);
    assert!(
        why.contains("missing: PADDOCK_CONSOLE_OIDC_DISCOVERY_URL, PADDOCK_CONSOLE_OIDC_REDIRECT_URI"),
        "all or none: {why}"
    );
    let why = check(&[
        ("PADDOCK_JWT_ISSUER", "http://id.example"),
        ("PADDOCK_CONSOLE_OIDC_DISCOVERY_URL", "http://id.example/.well-known/openid-configuration"),
        ("PADDOCK_CONSOLE_OIDC_CLIENT_ID", "paddock-console"),
        ("PADDOCK_CONSOLE_OIDC_REDIRECT_URI", "http://paddock.example/console/"),
        ("PADDOCK_CONSOLE_OIDC_SCOPES", "profile"),
    ]);
    for named in [
        "PADDOCK_CONSOLE_OIDC_DISCOVERY_URL must be an https URL (plain http only to a loopback address)",
        "PADDOCK_CONSOLE_OIDC_REDIRECT_URI must be an https URL",
        "PADDOCK_CONSOLE_OIDC_SCOPES must be space-separated scopes including `openid`",
        "PADDOCK_JWT_JWKS_URL (or PADDOCK_JWT_PUBLIC_KEYS) is required for the console's sign-in",
        "PADDOCK_DATABASE_URL",
    ] {
        assert!(why.contains(named), "{named} missing from: {why}");
    }
}
