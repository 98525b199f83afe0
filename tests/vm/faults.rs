//! Faults on the testbed, each on a real VM.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::testbed::{self, console_tail, fill, not_erased, virsh, Disk, Paddock, Testbed, Vm};
use crate::{custody_entry, enroll, settle, vm_class};

/// A port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a port")
}

/// The seeds the BMC downloaded for `vm` (files of its storage pool named `<seed token>-iso-<uuid>`,
/// not the images `paddock-wipe` and `paddock-node`), oldest first.
fn seeds_of(bed: &Testbed, vm: &Vm) -> Vec<std::path::PathBuf> {
    let suffix = format!("-iso-{}.img", vm.uuid);
    let mut seeds: Vec<(std::time::SystemTime, std::path::PathBuf)> = std::fs::read_dir(bed.dir.join("pool"))
        .expect("the BMC's pool")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(&suffix))
        .filter(|e| !e.file_name().to_string_lossy().starts_with("paddock-"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    seeds.sort();
    seeds.into_iter().map(|(_, p)| p).collect()
}

/// The agent token in a seed file, as the booted machine reads it.
fn agent_token(seed: &Path) -> String {
    let iso = std::fs::read(seed).expect("the seed");
    let json = paddock_seed::read_file(&iso, "paddock/agent.json").expect("paddock/agent.json in the seed");
    let seed: Value = serde_json::from_slice(&json).expect("agent.json");
    seed["agent_token"].as_str().expect("agent_token").to_owned()
}

/// A complete report of success for the VM's two disks, as an agent would send it.
fn forged_report(bed: &Testbed, vm: &Vm) -> Value {
    let drives: Vec<Value> = vm
        .disks
        .iter()
        .map(|d| json!({
            "id": d.name, "match_basis": "protocol_capacity",
            "identity": { "model": "QEMU", "serial": d.serial, "wwn": null, "eui": null, "size_bytes": d.size_bytes },
            "method": "overwrite-zeroes", "result": "success", "detail": null,
            "verification": { "ranges": 66, "bytes_read": 69_206_016, "sha256": "a".repeat(64) },
        }))
        .collect();
    json!({
        "result": "success", "drives": drives, "image_sha256": bed.image_sha256,
        "started_at": chrono::Utc::now() - chrono::Duration::minutes(1), "finished_at": chrono::Utc::now(),
    })
}

/// A VM whose agent never reaches paddock (its seed names a port nothing listens on) times out
/// into `clean_failed` with `wipe_timed_out` once its token expires, and is powered off; its disks
/// were never touched. Taken through maintenance it starts a new run; a report carrying the first
/// run's token (read from the seed the BMC downloaded) is refused, and the new run goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_vm_that_never_reports_times_out_and_another_runs_token_is_refused() {
    let Some(bed) = Testbed::from_env() else { return };
    let lease = bed.lease(1, false).await;
    let vm = &lease.vms[0];
    let p = Paddock::start(&bed, Duration::from_secs(60), Some(closed_port())).await;
    vm_class(&p).await;
    let before = seeds_of(&bed, vm).len();
    let id = enroll(&p, &bed, vm, false).await;
    let m = settle(&p, vm, &id, &["available", "clean_failed", "maintenance"]).await;
    assert_eq!(m["state"], "clean_failed", "{m}");
    assert_eq!(m["last_error"]["code"], "wipe_timed_out", "{m}");
    assert_eq!(virsh(&["domstate", &vm.name]), "shut off", "powered off on the way to clean_failed");
    for disk in &vm.disks {
        assert!(not_erased(&disk.path).is_some(), "{} was not wiped: no config ever reached the agent", disk.name);
    }
    let seeds = seeds_of(&bed, vm);
    assert_eq!(seeds.len(), before + 1, "one seed downloaded for the run: {seeds:?}");
    let old_token = agent_token(seeds.last().expect("the run's seed"));

    // Through maintenance into a new run: its seed is the second one the BMC downloads.
    let path = format!("/v1/machines/{id}/maintenance");
    let (status, body) = p.call(reqwest::Method::POST, &path, Some(json!({ "reason": "retry the wipe" }))).await;
    assert_eq!(status, 202, "{body}");
    settle(&p, vm, &id, &["maintenance"]).await;
    let (status, body) = p.call(reqwest::Method::DELETE, &path, None).await;
    assert_eq!(status, 202, "{body}");
    let second = || seeds_of(&bed, vm).len() == before + 2;
    until(vm, Duration::from_secs(600), "the BMC downloaded the new run's seed", second).await;
    let base = p.app.base_url.as_deref().expect("served");
    let rsp = testbed::client()
        .post(format!("{base}/v1/agent/report"))
        .bearer_auth(&old_token)
        .json(&forged_report(&bed, vm))
        .send()
        .await
        .expect("report");
    let code = rsp.status().as_u16();
    assert!([404, 409, 410].contains(&code), "the first run's token is refused: {code}");
    let m = p.get(&format!("/v1/machines/{id}")).await;
    assert_eq!(m["state"], "cleaning", "the new run is not completed by the old token: {m}");
}

/// A third disk, attached to the domain as an operator would (virtio, not in the BMC's drive
/// inventory), filled with its pattern; `mode` is `readonly` or empty.
fn attach_extra(bed: &Testbed, vm: &Vm, readonly: bool) -> Disk {
    let path = bed.dir.join(format!("disks/{}-extra.raw", vm.name));
    let serial = format!("PVX{}", if readonly { "RO" } else { "RW" });
    let disk = Disk { name: "vdb".into(), path, serial, size_bytes: 16 << 20 };
    fill(&disk);
    let path = disk.path.to_str().expect("utf-8 path");
    let mut args = vec!["attach-disk", &vm.name, path, "vdb", "--config", "--targetbus", "virtio"];
    args.extend(["--serial", &disk.serial]);
    if readonly {
        args.extend(["--mode", "readonly"]);
    }
    virsh(&args);
    disk
}

fn detach_extra(vm: &Vm, path: &Path) {
    virsh(&["detach-disk", &vm.name, "vdb", "--config"]);
    let _ = std::fs::remove_file(path);
}

/// A disk the BMC does not report is found by the agent, wiped and reported (with no inventory
/// id); the machine becomes `available` and every byte of the three disks is zero.
#[tokio::test(flavor = "multi_thread")]
async fn a_disk_the_bmc_does_not_report_is_wiped_and_reported() {
    let Some(bed) = Testbed::from_env() else { return };
    let lease = bed.lease(1, false).await;
    let vm = &lease.vms[0];
    let extra = attach_extra(&bed, vm, false);
    let p = Paddock::start(&bed, Duration::from_secs(3600), None).await;
    vm_class(&p).await;
    let id = enroll(&p, &bed, vm, true).await;
    let m = settle(&p, vm, &id, &["available", "clean_failed", "maintenance"]).await;
    let unlisted = not_erased(&extra.path);
    detach_extra(vm, &extra.path);
    assert_eq!(m["state"], "available", "{m}\n{}", console_tail(vm, 30));
    let evidence = custody_entry(&p, &id, "available").await["evidence"].clone();
    let drives = evidence["drives"].as_array().expect("drives");
    assert_eq!(drives.len(), 3, "{evidence}");
    let found = drives.iter().find(|d| d["identity"]["serial"] == extra.serial).expect("the unlisted disk is reported");
    assert!(found["id"].is_null(), "no inventory id for a disk the BMC did not list: {found}");
    assert_eq!(found["result"], "success", "{found}");
    assert_eq!(unlisted, None, "the unlisted disk is erased");
    for disk in &vm.disks {
        assert_eq!(not_erased(&disk.path), None, "{} erased", disk.name);
    }
}

/// A disk the guest cannot write (attached read-only, and not in the BMC's inventory, so the agent
/// must wipe it) fails the clean: `clean_failed`, with the drive named in the machine's error.
#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_disk_ends_in_clean_failed_naming_the_drive() {
    let Some(bed) = Testbed::from_env() else { return };
    let lease = bed.lease(1, false).await;
    let vm = &lease.vms[0];
    let extra = attach_extra(&bed, vm, true);
    let p = Paddock::start(&bed, Duration::from_secs(3600), None).await;
    vm_class(&p).await;
    let id = enroll(&p, &bed, vm, false).await;
    let m = settle(&p, vm, &id, &["available", "clean_failed", "maintenance"]).await;
    let untouched = not_erased(&extra.path).is_some();
    detach_extra(vm, &extra.path);
    assert_eq!(m["state"], "clean_failed", "{m}");
    assert_eq!(m["last_error"]["code"], "wipe_failed", "{m}");
    let message = m["last_error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(&extra.serial) || message.contains("vdb"), "the drive is named: {m}");
    assert!(untouched, "the read-only disk kept its pattern");
    assert_eq!(virsh(&["domstate", &vm.name]), "shut off", "powered off on the way to clean_failed");
    testbed::reset(vm);
}

/// `scripts/vm-bmc <action> main`.
fn main_bmc(action: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/vm-bmc");
    let status = std::process::Command::new(script).args([action, "main"]).status().expect("scripts/vm-bmc");
    assert!(status.success(), "scripts/vm-bmc {action} main");
}

/// Polls `what` once a second until it holds, failing with `why` and the console after `within`.
async fn until(vm: &Vm, within: Duration, why: &str, what: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !what() {
        assert!(std::time::Instant::now() < deadline, "{why} within {within:?}; console:\n{}", console_tail(vm, 30));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The BMC emulator stopped while the VM wipes (the VM goes on: it wipes, reports and powers itself
/// off), then started again: the clean resumes and ends `available`, the disks erased.
#[tokio::test(flavor = "multi_thread")]
async fn the_bmc_stopped_mid_wipe_then_started_again_the_clean_resumes() {
    let Some(bed) = Testbed::from_env() else { return };
    let lease = bed.lease(1, true).await;
    let vm = &lease.vms[0];
    let p = Paddock::start(&bed, Duration::from_secs(3600), None).await;
    vm_class(&p).await;
    let id = enroll(&p, &bed, vm, false).await;
    let booted = || std::fs::read_to_string(&vm.console).is_ok_and(|c| c.contains("paddock-agent: seed on"));
    until(vm, Duration::from_secs(600), "the VM booted the wipe image", booted).await;
    main_bmc("stop");
    let off = || virsh(&["domstate", &vm.name]) == "shut off";
    until(vm, Duration::from_secs(600), "the agent wiped, reported and powered the VM off", off).await;
    let m = p.get(&format!("/v1/machines/{id}")).await;
    assert_eq!(m["state"], "cleaning", "no clean completes while its BMC is away: {m}");
    main_bmc("start");
    let m = settle(&p, vm, &id, &["available", "clean_failed", "maintenance"]).await;
    assert_eq!(m["state"], "available", "{m}");
    let evidence = custody_entry(&p, &id, "available").await["evidence"].clone();
    assert_eq!(evidence["image_sha256"], bed.image_sha256, "{evidence}");
    for disk in &vm.disks {
        assert_eq!(not_erased(&disk.path), None, "{} erased", disk.name);
    }
}

/// A drive of the BMC's inventory taken out of the domain (the SATA disk, detached as an operator
/// would): the agent cannot find it, so the wipe fails and the machine ends `clean_failed`, the
/// drive named. (The next lease defines the domain again as the testbed made it.)
#[tokio::test(flavor = "multi_thread")]
async fn an_inventory_drive_removed_from_the_domain_fails_the_wipe() {
    let Some(bed) = Testbed::from_env() else { return };
    let lease = bed.lease(1, false).await;
    let vm = &lease.vms[0];
    virsh(&["detach-disk", &vm.name, "sda", "--config"]);
    let p = Paddock::start(&bed, Duration::from_secs(3600), None).await;
    vm_class(&p).await;
    let id = enroll(&p, &bed, vm, true).await;
    let m = settle(&p, vm, &id, &["available", "clean_failed", "maintenance"]).await;
    assert_eq!(m["state"], "clean_failed", "{m}");
    assert_eq!(m["last_error"]["code"], "wipe_failed", "{m}");
    let message = m["last_error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("sda"), "the missing inventory drive is named: {m}");
    assert_eq!(virsh(&["domstate", &vm.name]), "shut off", "powered off on the way to clean_failed");
}
