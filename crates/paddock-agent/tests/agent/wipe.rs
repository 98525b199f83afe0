//! `paddock-agent wipe` on loop devices.

use serde_json::Value;

use crate::harness::{agent, path, sha256_hex, Loop};

const MIB: usize = 1 << 20;

fn json(stdout: &[u8]) -> Value {
    serde_json::from_slice(stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", String::from_utf8_lossy(stdout)))
}

/// The drive entry for `dev` in the output.
fn drive<'a>(out: &'a Value, dev: &Loop) -> &'a Value {
    out["drives"]
        .as_array()
        .expect("drives")
        .iter()
        .find(|d| d["device"] == path(&dev.dev))
        .expect("an entry for the device")
}

#[test]
fn wipe_erases_every_byte_of_each_device_and_reports_complete_evidence() {
    let sizes = [48 * MIB, 3 * MIB + 4096];
    let devs: Vec<Loop> = sizes.iter().zip(1u64..).map(|(&s, seed)| Loop::random(s, seed)).collect();
    let report = std::env::temp_dir().join(format!("paddock-agent-report-{}.json", std::process::id()));
    let out = agent(&["wipe", "--device", path(&devs[0].dev), path(&devs[1].dev), "--report", path(&report)]);
    assert!(out.status.success(), "wipe failed: {}", String::from_utf8_lossy(&out.stderr));
    let printed = json(&out.stdout);
    let written: Value = serde_json::from_slice(&std::fs::read(&report).expect("--report file")).expect("report JSON");
    let _ = std::fs::remove_file(&report);
    assert_eq!(printed, written, "--report holds what was printed");
    assert_eq!(printed["result"], "success");
    assert_eq!(printed["drives"].as_array().map(Vec::len), Some(2));
    for (dev, size) in devs.iter().zip(sizes) {
        let contents = dev.contents();
        assert_eq!(contents.len(), size);
        assert!(contents.iter().all(|&b| b == 0), "{} is not all zeroes", dev.dev.display());
        let d = drive(&printed, dev);
        assert_eq!(d["result"], "success");
        assert_eq!(d["method"], "overwrite-zeroes", "a loop device advertises nothing stronger");
        assert_eq!(d["identity"]["size_bytes"], size as u64);
        assert_eq!(d["identity"]["protocol"], "loop");
        for field in ["model", "serial", "wwn", "eui"] {
            assert!(d["identity"].get(field).is_some(), "identity.{field} is present (null for a loop device)");
        }
        let v = &d["verification"];
        assert_eq!(v["ranges"], 66, "first MiB, 64 samples, last MiB");
        // The first and last MiB and 64 ranges of 64 KiB; all zeroes, so the digest is theirs.
        let read = 2 * MIB + 64 * (64 << 10);
        assert_eq!(v["bytes_read"], read as u64);
        assert_eq!(v["sha256"], sha256_hex(&vec![0u8; read]));
    }
}

#[test]
fn a_read_only_device_fails_is_named_and_the_others_are_still_wiped() {
    let ro = Loop::with_contents(&crate::harness::pattern(2 * MIB, 7), true);
    let rw = Loop::random(2 * MIB, 8);
    let before = ro.contents();
    let out = agent(&["wipe", "--device", path(&ro.dev), "--device", path(&rw.dev)]);
    assert_eq!(out.status.code(), Some(1), "a failed device makes the exit status non-zero");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("{} FAILED", ro.dev.display())), "stderr names the device: {stderr}");
    let printed = json(&out.stdout);
    assert_eq!(printed["result"], "failure");
    let d = drive(&printed, &ro);
    assert_eq!(d["result"], "failure");
    assert!(d["detail"].as_str().is_some_and(|s| s.contains("read-only")), "detail says why: {d}");
    assert_eq!(d["verification"], Value::Null, "no verification for work not done");
    assert_eq!(ro.contents(), before);
    assert_eq!(drive(&printed, &rw)["result"], "success");
    assert!(rw.contents().iter().all(|&b| b == 0));
}

/// What a disk holds protects nothing: one carrying a `cidata` volume with a `paddock/agent.json`
/// (a seed its owner wrote) is wiped like any other.
#[test]
fn a_disk_carrying_a_seed_volume_is_wiped_like_any_other() {
    let agent_json = br#"{"agent_url": "https://tenant.example", "agent_token": "t", "ca_cert": null,
        "machine_id": "00000000-0000-0000-0000-000000000001", "run_id": "00000000-0000-0000-0000-000000000002"}"#;
    let iso = paddock_seed::agent_seed_iso(b"instance-id: m-1\n", b"#cloud-config\n", agent_json).expect("seed image");
    let planted = Loop::with_contents(&iso, false);
    let out = agent(&["wipe", "--device", path(&planted.dev)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(drive(&json(&out.stdout), &planted)["result"], "success");
    assert!(planted.contents().iter().all(|&b| b == 0), "the planted seed is erased");
}

#[test]
fn discovery_passes_over_loop_devices_it_was_not_given() {
    let dev = Loop::random(MIB, 3);
    let out = agent(&["discover"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let found = json(&out.stdout);
    let name = dev.dev.file_name().and_then(|n| n.to_str()).expect("name");
    assert!(found["disks"].as_array().expect("disks").iter().all(|d| d["device"] != path(&dev.dev)));
    let left = found["left"].as_array().expect("left");
    assert!(
        left.iter().any(|s| s["name"] == name
            && s["kind"] == "virtual"
            && s["action"] == "left"
            && s["reason"].as_str().is_some_and(|r| r.contains("loop"))),
        "{found}"
    );
}

#[test]
fn an_unknown_method_or_device_is_refused_before_anything_is_written() {
    let dev = Loop::random(MIB, 4);
    let before = dev.contents();
    let out = agent(&["wipe", "--device", path(&dev.dev), "--method", "shred"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown method \"shred\""));
    let out = agent(&["wipe", "--device", path(&dev.dev), "/dev/paddock-no-such-disk"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/dev/paddock-no-such-disk does not exist"));
    assert_eq!(dev.contents(), before);
}

#[test]
fn an_explicit_method_the_device_lacks_fails_without_fallback() {
    let dev = Loop::random(MIB, 5);
    let before = dev.contents();
    let out = agent(&["wipe", "--device", path(&dev.dev), "--method", "nvme-format-crypto"]);
    assert_eq!(out.status.code(), Some(1));
    let d = drive(&json(&out.stdout), &dev).clone();
    assert_eq!((d["method"].as_str(), d["result"].as_str()), (Some("nvme-format-crypto"), Some("failure")));
    assert!(d["detail"].as_str().is_some_and(|s| s.contains("not advertised")), "{d}");
    assert_eq!(dev.contents(), before);
}
