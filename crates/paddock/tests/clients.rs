//! The generated clients, as integrators generate them from openapi/openapi.json, against
//! `paddock dev`: `scripts/clients --smoke` generates the Python client (openapi-python-client)
//! and the TypeScript types (openapi-typescript, type-checked by tsc in strict mode), then runs a
//! portal's first steps with each (a tenant, the tenant list page by page, a cluster followed to
//! ready through its operation, the tenant's usage, a problem's code). A change of the document
//! that breaks a generator, the types or what a client parses fails here.

mod support;

use std::path::Path;
use std::process::Command;

#[test]
fn the_generated_python_and_typescript_clients_drive_paddock_dev() {
    let dev = support::Dev::start();
    support::wait_ready(&dev);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/clients");
    let out = Command::new("timeout")
        .arg("600")
        .arg(&script)
        .arg("--smoke")
        .envs(dev.exports.iter().map(|(n, v)| (n.as_str(), v.as_str())))
        .output()
        .expect("running scripts/clients");
    drop(dev);
    let said = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{said}");
    assert!(out.status.success(), "the clients' smoke failed ({}):\n{said}", out.status);
    for line in ["Python smoke", "TypeScript smoke", "problem: not_found"] {
        assert!(said.contains(line), "the smoke's output has {line:?}:\n{said}");
    }
    assert_eq!(said.matches("problem: not_found").count(), 2, "both clients ran to their end:\n{said}");
}
