//! Finding the seed by its label on a block device and reading it.

use paddock_agent::device::Roots;
use paddock_agent::seed;

use crate::harness::Loop;

#[test]
fn the_seed_is_found_by_its_label_and_read_as_iso_9660() {
    let mut iso = paddock_seed::seed_iso(b"instance-id: m-1\n", b"#cloud-config\n", None).expect("seed image");
    iso.resize(1_474_560, 0);
    let dev = Loop::with_contents(&iso, true);
    let other = Loop::random(1 << 20, 9);
    let found = seed::devices(&Roots::default()).expect("scanning block devices");
    assert!(found.contains(&dev.dev), "{found:?} holds {}", dev.dev.display());
    assert!(!found.contains(&other.dev));
    // paddock-seed on main writes only the NoCloud files, without paddock/agent.json: the agent
    // reads the image, finds the file missing and says so.
    let err = seed::read(&dev.dev).expect_err("no agent.json on this seed");
    assert!(format!("{err:#}").contains("the seed has no paddock/agent.json"), "{err:#}");
}

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
