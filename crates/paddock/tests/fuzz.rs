//! The API fuzzed against `paddock dev`: `scripts/fuzz --run` runs schemathesis on every operation
//! of the served document (its examples, boundary values, generated and invalid input, and
//! stateful sequences that follow the document's links from created resources), once with the
//! demo tenant's admin token and once with the provider admin's. Any 5xx, and any answer the
//! document does not describe (status, content type, headers, body), fails the test; schemathesis'
//! report is printed. The seed is fixed, so a failure replays.

mod support;

use std::path::Path;
use std::process::Command;

#[test]
fn schemathesis_finds_no_server_error_and_no_answer_off_the_document() {
    let dev = support::Dev::start();
    support::wait_ready(&dev);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fuzz");
    let out = Command::new("timeout")
        .arg("900")
        .arg(&script)
        .arg("--run")
        .envs(dev.exports.iter().map(|(n, v)| (n.as_str(), v.as_str())))
        .output()
        .expect("running scripts/fuzz");
    drop(dev);
    let said = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{said}");
    // schemathesis exits 1 on a finding, 2 when it could not run (or tested nothing).
    assert!(out.status.success(), "the fuzzer found something or could not run ({}):\n{said}", out.status);
    for who in ["tenant", "provider"] {
        assert!(said.contains(&format!("schemathesis as the {who}")), "the {who}'s run ran:\n{said}");
    }
}
