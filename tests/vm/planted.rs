//! A tenant's planted seed on the testbed: a disk the BMC does not list (attached through
//! `<qemu:commandline>`, since sushy-tools lists every libvirt `<disk>`), partitioned, its one
//! partition a `cidata` volume with its own `paddock/agent.json` naming another server. The
//! agent must not take it for the seed nor leave the disk alone: it finds the run's seed on the
//! floppy, wipes the disk, and reports it among the devices it saw.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::testbed::{self, not_erased, virsh, Paddock, Testbed, Vm};
use crate::{custody_entry, enroll, settle, vm_class};

const SIZE: usize = 16 << 20;
/// Where the planted partition starts: sector 2048 (1 MiB).
const PART_LBA: u32 = 2048;
const SERIAL: &str = "PVXTENANT";

/// The planted disk: a pattern, an MBR with one Linux partition at 1 MiB, and in it a seed whose
/// `paddock/agent.json` names a server of the tenant's (an unroutable address).
fn planted_disk(path: &Path) {
    let agent = json!({
        "agent_url": "http://192.0.2.1:9", "agent_token": "planted", "ca_cert": null,
        "machine_id": "00000000-0000-0000-0000-000000000001", "run_id": "00000000-0000-0000-0000-000000000002",
    });
    let json = serde_json::to_vec(&agent).expect("agent.json");
    let seed = paddock_seed::agent_seed_iso(b"instance-id: planted\n", b"#cloud-config\n", &json).expect("a seed");
    let mut disk: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8 | 1).collect();
    let sectors = u32::try_from(seed.len() / 512).expect("sectors");
    let entry = &mut disk[446..462];
    entry.copy_from_slice(&[0, 0xfe, 0xff, 0xff, 0x83, 0xfe, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0]);
    entry[8..12].copy_from_slice(&PART_LBA.to_le_bytes());
    entry[12..16].copy_from_slice(&sectors.to_le_bytes());
    disk[510] = 0x55;
    disk[511] = 0xaa;
    let at = PART_LBA as usize * 512;
    disk[at..at + seed.len()].copy_from_slice(&seed);
    std::fs::write(path, &disk).expect("the planted disk");
    let _ = std::process::Command::new("chmod").arg("666").arg(path).status();
}

/// Adds the planted disk to the domain's definition as a QEMU virtio-blk drive, outside libvirt's
/// `<disk>` list (so outside the BMC's inventory).
fn attach_unlisted(vm: &Vm, path: &Path) {
    let xml = virsh(&["dumpxml", "--inactive", &vm.name]);
    let drive = format!("file={},if=none,id=tenant0,format=raw,cache=none", path.display());
    let device = format!("virtio-blk-pci,drive=tenant0,serial={SERIAL},bus=pci.0,addr=0x11");
    let args = format!(
        "<qemu:arg value='-drive'/><qemu:arg value='{drive}'/><qemu:arg value='-device'/><qemu:arg value='{device}'/>"
    );
    assert!(xml.contains("</qemu:commandline>"), "the testbed's domains carry a qemu:commandline: {xml}");
    let xml = xml.replacen("</qemu:commandline>", &format!("{args}</qemu:commandline>"), 1);
    let file = path.with_extension("xml");
    std::fs::write(&file, xml).expect("the domain's new definition");
    virsh(&["define", file.to_str().expect("utf-8 path")]);
}

/// The last 40 lines of a console.
fn tail(console: &str) -> String {
    let lines: Vec<&str> = console.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The device the agent reported as `name`.
fn device<'a>(report: &'a Value, name: &str) -> &'a Value {
    let devices = report["devices"].as_array().expect("devices in the report");
    devices.iter().find(|d| d["name"] == name).unwrap_or_else(|| panic!("{name} among {report}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_planted_seed_on_a_disk_the_bmc_does_not_list_is_wiped_and_reported() {
    let Some(bed) = Testbed::from_env() else { return };
    let lease = bed.lease(1, false).await;
    let vm = &lease.vms[0];
    let path = bed.dir.join(format!("disks/{}-planted.raw", vm.name));
    planted_disk(&path);
    attach_unlisted(vm, &path);
    let p = Paddock::start(&bed, Duration::from_secs(3600), None).await;
    vm_class(&p).await;
    let id = enroll(&p, &bed, vm, false).await;
    let m = settle(&p, vm, &id, &["available", "clean_failed", "maintenance"]).await;
    let left = not_erased(&path);
    let console = std::fs::read_to_string(&vm.console).unwrap_or_default();
    testbed::reset(vm);
    let _ = std::fs::remove_file(&path);
    assert_eq!(m["state"], "available", "{m}\n{}", tail(&console));
    let inventory: Vec<&str> =
        m["inventory"]["drives"].as_array().expect("drives").iter().filter_map(|d| d["id"].as_str()).collect();
    assert_eq!(inventory.len(), 2, "the BMC does not list the planted disk: {inventory:?}");
    let evidence = custody_entry(&p, &id, "available").await["evidence"].clone();
    let drives = evidence["drives"].as_array().expect("drives");
    let planted = drives.iter().find(|d| d["identity"]["serial"] == SERIAL).expect("the planted disk is reported");
    assert!(planted["id"].is_null() && planted["result"] == "success", "{planted}");
    let report = &evidence["report"];
    assert_eq!(device(report, "vda")["kind"], "disk", "{report}");
    assert_eq!(device(report, "vda")["action"], "wiped", "{report}");
    assert_eq!(device(report, "fd0")["kind"], "floppy", "the seed's floppy: {report}");
    assert_eq!(device(report, "sr0")["action"], "left", "the wipe image's CD: {report}");
    assert_eq!(left, None, "every byte of the planted disk is erased (first non-zero offset, count)");
    assert!(console.contains("seed on /dev/fd0"), "the run's seed, not the planted one:\n{}", tail(&console));
}
