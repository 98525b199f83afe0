//! The committed configuration reference (docs/configuration.md) is what the settings'
//! definitions generate: a setting added, renamed, given another default or another help text
//! without regenerating the document fails here.

use std::process::Command;

const REGENERATE: &str = "cargo run --bin paddock -- config-reference   (writes docs/configuration.md)";

#[test]
fn committed_configuration_reference_matches_the_settings() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let out = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args(["config-reference", "--output", "-"])
        .env_clear()
        .output()
        .expect("running paddock config-reference");
    assert!(out.status.success(), "paddock config-reference failed: {}", String::from_utf8_lossy(&out.stderr));
    let generated = String::from_utf8(out.stdout).expect("utf-8");
    if committed != generated {
        let line = committed.lines().zip(generated.lines()).position(|(a, b)| a != b);
        let line = line.unwrap_or_else(|| committed.lines().count().min(generated.lines().count())) + 1;
        panic!("docs/configuration.md is out of date (first difference at line {line}); regenerate it with:\n    {REGENERATE}");
    }
}
