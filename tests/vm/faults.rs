//! Faults on the testbed, each on a real VM.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::testbed::{self, console_tail, fill, not_erased, virsh, BmcOutage, Disk, Paddock, Testbed, Vm};
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
/// inventory), filled with its pattern; read-only with `readonly`.
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

/// Where the planted partitions start: sector 2048 (1 MiB), then on the next MiB boundary.
const PART_LBA: u32 = 2048;

/// Plants on `disk`, over its pattern, what a tenant could leave behind to steer the agent: an MBR
/// with two partitions, the first a `cidata` seed whose `paddock/agent.json` sends the agent to a
/// server of the tenant's (an unroutable address), the second an ISO 9660 volume labelled
/// `PADDOCK_WIPE` as the wipe image is. The file is written in place.
fn plant(disk: &Disk) {
    let agent = json!({
        "agent_url": "http://192.0.2.1:9", "agent_token": "planted", "ca_cert": null,
        "machine_id": "00000000-0000-0000-0000-000000000001", "run_id": "00000000-0000-0000-0000-000000000002",
    });
    let agent = serde_json::to_vec(&agent).expect("agent.json");
    let seed = paddock_seed::agent_seed_iso(b"instance-id: planted\n", b"#cloud-config\n", &agent).expect("a seed");
    let image = paddock_seed::nocloud_iso(&[("planted", b"a tenant's image\n")], "PADDOCK_WIPE").expect("an image");
    let mut bytes = std::fs::read(&disk.path).expect("the disk");
    // An empty partition table first: an entry of the pattern would make the kernel reject it.
    bytes[446..510].fill(0);
    let mut lba = PART_LBA;
    for (i, part) in [seed, image].iter().enumerate() {
        let sectors = u32::try_from(part.len().div_ceil(512)).expect("sectors");
        let entry = &mut bytes[446 + 16 * i..462 + 16 * i];
        entry[..8].copy_from_slice(&[0, 0xfe, 0xff, 0xff, 0x83, 0xfe, 0xff, 0xff]);
        entry[8..12].copy_from_slice(&lba.to_le_bytes());
        entry[12..16].copy_from_slice(&sectors.to_le_bytes());
        let at = lba as usize * 512;
        bytes[at..at + part.len()].copy_from_slice(part);
        lba += sectors.next_multiple_of(PART_LBA);
    }
    assert!(lba as usize * 512 <= bytes.len(), "the planted partitions fit on {}", disk.name);
    bytes[510..512].copy_from_slice(&[0x55, 0xaa]);
    let written = std::fs::OpenOptions::new().write(true).open(&disk.path).and_then(|mut f| {
        use std::io::Write;
        f.write_all(&bytes).and_then(|()| f.sync_all())
    });
    written.unwrap_or_else(|e| panic!("planting on {}: {e}", disk.path.display()));
}

/// The devices the agent reported, each as `name kind action`.
fn devices(report: &Value) -> Vec<String> {
    let devices = report["devices"].as_array().expect("devices in the report");
    let s = |d: &Value, k: &str| d[k].as_str().unwrap_or("?").to_owned();
    devices.iter().map(|d| format!("{} {} {}", s(d, "name"), s(d, "kind"), s(d, "action"))).collect()
}

/// A disk the BMC does not report, carrying what a tenant planted (a `cidata` seed naming the
/// tenant's server, a `PADDOCK_WIPE` volume), is found by the agent, which takes the run's seed
/// from the floppy, wipes the disk (every byte of it zero, read on this host) and reports it: among
/// the drives with no inventory id, among the devices as a disk it wiped. The machine becomes
/// `available` and every byte of the three disks is zero.
#[tokio::test(flavor = "multi_thread")]
async fn a_disk_the_bmc_does_not_report_is_wiped_and_reported_whatever_it_carries() {
    let Some(bed) = Testbed::from_env() else { return };
    let lease = bed.lease(1, false).await;
    let vm = &lease.vms[0];
    let extra = attach_extra(&bed, vm, false);
    plant(&extra);
    let p = Paddock::start(&bed, Duration::from_secs(3600), None).await;
    vm_class(&p).await;
    let id = enroll(&p, &bed, vm, true).await;
    let m = settle(&p, vm, &id, &["available", "clean_failed", "maintenance"]).await;
    let unlisted = not_erased(&extra.path);
    let (console, tail) = (std::fs::read_to_string(&vm.console).unwrap_or_default(), console_tail(vm, 40));
    detach_extra(vm, &extra.path);
    // First, what the host reads: a disk left alone for what it carries keeps it.
    assert_eq!(unlisted, None, "every byte of the planted, unlisted disk is erased (state {}):\n{tail}", m["state"]);
    assert_eq!(m["state"], "available", "{m}\n{tail}");
    assert_eq!(m["inventory"]["drives"].as_array().map(Vec::len), Some(2), "the BMC lists 2 drives: {m}");
    let evidence = custody_entry(&p, &id, "available").await["evidence"].clone();
    let drives = evidence["drives"].as_array().expect("drives");
    assert_eq!(drives.len(), 3, "{evidence}");
    let found = drives.iter().find(|d| d["identity"]["serial"] == extra.serial).expect("the unlisted disk is reported");
    assert!(found["id"].is_null(), "no inventory id for a disk the BMC did not list: {found}");
    assert_eq!(found["result"], "success", "{found}");
    // Every device the guest saw: its three disks wiped (the unlisted one is the virtio disk,
    // `vda` to the guest), the run's seed on the floppy and the image on the CD left alone.
    let seen = devices(&evidence["report"]);
    let expected = ["nvme0n1 disk wiped", "sda disk wiped", "vda disk wiped", "fd0 floppy left", "sr0 cd left"];
    assert_eq!(seen, expected, "{evidence}");
    assert!(console.contains("seed on /dev/fd0"), "the run's seed, not the planted one:\n{tail}");
    assert!(console.contains(" vda: vda1 vda2"), "the guest's kernel saw the planted partitions:\n{console}");
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

/// Polls `what` until it holds, failing with `why` and the console after `within`.
async fn until(vm: &Vm, within: Duration, why: &str, what: impl Fn() -> bool) {
    let context = || async { format!("console:\n{}", console_tail(vm, 30)) };
    testbed::until(why, within, || async { what().then_some(()) }, context).await;
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
    let outage = BmcOutage::begin(&lease);
    let off = || virsh(&["domstate", &vm.name]) == "shut off";
    until(vm, Duration::from_secs(600), "the agent wiped, reported and powered the VM off", off).await;
    let m = p.get(&format!("/v1/machines/{id}")).await;
    assert_eq!(m["state"], "cleaning", "no clean completes while its BMC is away: {m}");
    drop(outage);
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
