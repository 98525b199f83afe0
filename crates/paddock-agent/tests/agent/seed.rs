//! A seed without the agent's part: the run stops before touching a disk (finding the seed is
//! `discovery.rs`'s).

use crate::harness::Loop;

#[test]
fn run_without_a_readable_seed_wipes_nothing_and_fails() {
    let mut iso = paddock_seed::seed_iso(b"instance-id: m-1\n", b"#cloud-config\n", None).expect("seed image");
    iso.resize(1_474_560, 0);
    let seed = Loop::with_contents(&iso, true);
    let disk = Loop::random(1 << 20, 11);
    let before = disk.contents();
    let out = crate::harness::agent(&[
        "run",
        "--seed-device",
        crate::harness::path(&seed.dev),
        "--device",
        crate::harness::path(&disk.dev),
        "--image-sha256",
        &"a".repeat(64),
        "--no-poweroff",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("the seed has no paddock/agent.json"), "{stderr}");
    assert_eq!(disk.contents(), before, "no wipe without a run's config");
}
