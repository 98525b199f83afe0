//! Real machines: virtual machines booted through a real BMC emulator (sushy-tools with
//! its libvirt driver), wiped for real, end to end through the API (served on a loopback port, as
//! `paddock serve` serves it) and the worker's machine reconciler with the real Redfish driver. Nothing in this path is played by the test: the BMC downloads the wipe image
//! (HTTPS) and the run's seed, QEMU boots the image, the agent finds its seed on the floppy, wipes
//! the emulated NVMe and SATA disks and reports to paddock over QEMU's user-mode network; the test
//! then reads the disk files on this host. `scripts/test` starts the testbed (scripts/vm-start);
//! without it the tests skip locally, and fail on CI.
//!
//! Each test leases the VMs it uses from the testbed (`Testbed::lease`), so tests run side by side
//! on different VMs.

mod acceptance;
mod addons;
mod egress;
mod faults;
mod join;
mod network;
mod node;
mod slurm;
mod stack;
mod tenantnet;
mod testbed;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testbed::{console_tail, not_erased, Paddock, Testbed, Vm};

/// How long one machine may take from enrollment to a settled state (a TCG boot and wipe of two
/// 64 MiB disks takes about a minute here; the bound is for a loaded CI machine).
const SETTLE: Duration = Duration::from_secs(900);

/// The machine class of the VMs: one vCPU (what the emulator reports); memory is not reported by
/// the emulator's libvirt driver, so it stays unverified.
async fn vm_class(p: &Paddock) {
    let class = json!({ "name": "vm", "cpu_cores": 1, "memory_gib": 1, "gpu_model": "", "gpu_count": 0 });
    let (status, body) = p.call(reqwest::Method::POST, "/v1/machine-classes", Some(class)).await;
    assert_eq!(status, 201, "{body}");
}

/// Enrolls `vm` through the API (its BMC over https or http); returns the machine's id.
async fn enroll(p: &Paddock, bed: &Testbed, vm: &Vm, tls: bool) -> String {
    enroll_as(p, bed, vm, tls, "vm").await
}

/// [`enroll`] in machine class `class`.
async fn enroll_as(p: &Paddock, bed: &Testbed, vm: &Vm, tls: bool, class: &str) -> String {
    let name = vm.name.rsplit('-').next().map(|i| format!("vm-{i}")).expect("name");
    let body = json!({ "name": name, "machine_class": class, "bmc": bed.bmc(vm, tls) });
    let (status, body) = p.call(reqwest::Method::POST, "/v1/machines", Some(body)).await;
    assert_eq!(status, 202, "{body}");
    body["machine"]["id"].as_str().expect("machine id").to_owned()
}

/// Waits until the machine is in one of `settled` states; fails with its state, last error,
/// and the console when it is not within [`SETTLE`].
async fn settle(p: &Paddock, vm: &Vm, id: &str, settled: &[&str]) -> Value {
    let deadline = Instant::now() + SETTLE;
    loop {
        let m = p.get(&format!("/v1/machines/{id}")).await;
        if settled.contains(&m["state"].as_str().unwrap_or_default()) {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "{} not {settled:?} after {SETTLE:?}: state {}, last_error {}\nconsole:\n{}",
            vm.name,
            m["state"],
            m["last_error"],
            console_tail(vm, 30)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The custody entry into `to` (the last one).
async fn custody_entry(p: &Paddock, id: &str, to: &str) -> Value {
    let custody = p.get(&format!("/v1/machines/{id}/custody")).await;
    assert_eq!(custody["verified"], true, "{custody}");
    let items = custody["items"].as_array().expect("items");
    items.iter().rev().find(|e| e["to"] == to).cloned().unwrap_or_else(|| panic!("no entry to {to}: {custody}"))
}

/// Seconds between two RFC 3339 timestamps.
fn secs(from: &Value, to: &Value) -> f64 {
    let t = |v: &Value| chrono::DateTime::parse_from_rfc3339(v.as_str().expect("timestamp")).expect("rfc3339");
    (t(to) - t(from)).num_milliseconds() as f64 / 1000.0
}

/// Where one machine's clean went: enroll -> available, and within the clean: boot (power-on to the
/// agent's start), wipe (the agent's own start to finish), report and power-off (the rest).
async fn timings(p: &Paddock, id: &str, evidence: &Value) -> String {
    let custody = p.get(&format!("/v1/machines/{id}/custody")).await;
    let items = custody["items"].as_array().expect("items");
    let at = |to: &str| items.iter().find(|e| e["to"] == to).map(|e| e["at"].clone()).expect("entry");
    let report = &evidence["report"];
    let (enrolled, cleaning, available) = (at("enrolling"), at("cleaning"), at("available"));
    let (started, finished) = (&report["started_at"], &report["finished_at"]);
    format!(
        "enroll->available {:.1} s: enroll+inspect {:.1} s, cleaning->agent start {:.1} s (power, media, boot), \
         wipe {:.1} s, agent finish->available {:.1} s (report, power off, eject)",
        secs(&enrolled, &available),
        secs(&enrolled, &cleaning),
        secs(&cleaning, started),
        secs(started, finished),
        secs(finished, &available),
    )
}

/// Checks a verified clean of `vm`: the evidence names every disk by its serial with a complete
/// verification, the image digest is the testbed's, and every byte of every disk file is zero.
fn assert_wiped(bed: &Testbed, vm: &Vm, evidence: &Value) {
    assert_eq!(evidence["image_sha256"], bed.image_sha256, "{evidence}");
    let drives = evidence["drives"].as_array().expect("drives");
    let mut serials: Vec<&str> = drives.iter().filter_map(|d| d["identity"]["serial"].as_str()).collect();
    serials.sort_unstable();
    let mut expected: Vec<&str> = vm.disks.iter().map(|d| d.serial.as_str()).collect();
    expected.sort_unstable();
    assert_eq!(serials, expected, "the evidence names every disk of {}: {evidence}", vm.name);
    for d in drives {
        assert_eq!(d["result"], "success", "{d}");
        assert!(d["verification"]["ranges"].as_u64().is_some_and(|n| n >= 64), "{d}");
        assert!(d["method"].is_string(), "{d}");
    }
    for disk in &vm.disks {
        assert_eq!(
            not_erased(&disk.path),
            None,
            "{} of {}: (first non-zero offset, non-zero bytes)",
            disk.name,
            vm.name
        );
    }
}

/// Two VMs enrolled through the API (one BMC over https, one over http with
/// basic auth), inspected, cleaned by the real wipe image booted from virtual media, `available`,
/// powered off; every byte of their disks erased; the custody entry carries the evidence.
#[tokio::test(flavor = "multi_thread")]
async fn two_vms_are_enrolled_inspected_and_wiped_for_real_through_the_api() {
    let Some(bed) = Testbed::from_env() else { return };
    let lease = bed.lease(2, false).await;
    let vms = &lease.vms;
    for vm in vms {
        assert!(vm.disks.iter().all(|d| not_erased(&d.path).is_some()), "the pattern is on the disks");
    }
    let p = Paddock::start(&bed, Duration::from_secs(3600), None).await;
    vm_class(&p).await;
    let t0 = Instant::now();
    let ids = [enroll(&p, &bed, &vms[0], true).await, enroll(&p, &bed, &vms[1], false).await];
    for (vm, id) in vms.iter().zip(&ids) {
        let m = settle(&p, vm, id, &["available", "clean_failed", "maintenance"]).await;
        assert_eq!(m["state"], "available", "{m}\nconsole:\n{}", console_tail(vm, 30));
        assert_eq!(testbed::virsh(&["domstate", &vm.name]), "shut off", "powered off after the wipe");
        let entry = custody_entry(&p, id, "available").await;
        let evidence = &entry["evidence"];
        assert_wiped(&bed, vm, evidence);
        let inventory = &m["inventory"];
        assert_eq!(inventory["system_uuid"].as_str().map(str::to_lowercase), Some(vm.uuid.to_lowercase()), "{m}");
        eprintln!("{}: {}", vm.name, timings(&p, id, evidence).await);
    }
    eprintln!("two VMs at once: enroll -> both available in {:.1} s", t0.elapsed().as_secs_f64());
}

/// CPU seconds (user + system) QEMU has used for each running domain of `vms` so far, by the PID
/// libvirt records; sampled while they run, the largest sample of each counts.
fn qemu_cpu_seconds(vms: &[Vm]) -> Vec<f64> {
    let ticks = 100.0; // USER_HZ on Linux
    vms.iter()
        .map(|vm| {
            let pid = std::fs::read_to_string(format!("/run/libvirt/qemu/{}.pid", vm.name)).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
            let fields: Vec<&str> =
                stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
            let tick = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            (tick(11) + tick(12)) / ticks
        })
        .collect()
}

/// The benchmark of BENCHMARKS.md ("Real VMs cleaned through the API", `bench/vm-clean`): every VM
/// of the testbed enrolled at once, each one's enroll -> available and where it went, the wall
/// time of all, and the CPU QEMU used (TCG is CPU-bound: its share of the machine's cores).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: bench/vm/run runs it"]
async fn bench_every_vm_of_the_testbed_cleaned_at_once() {
    let Some(bed) = Testbed::from_env() else { return };
    let _lease = bed.lease(bed.vms.len(), true).await;
    let p = Paddock::start(&bed, Duration::from_secs(3600), None).await;
    vm_class(&p).await;
    let t0 = Instant::now();
    let mut ids = Vec::new();
    for (i, vm) in bed.vms.iter().enumerate() {
        ids.push(enroll(&p, &bed, vm, i % 2 == 0).await);
    }
    let mut cpu = vec![0.0; bed.vms.len()];
    let mut left: Vec<usize> = (0..bed.vms.len()).collect();
    while !left.is_empty() {
        for (c, now) in cpu.iter_mut().zip(qemu_cpu_seconds(&bed.vms)) {
            *c = f64::max(*c, now);
        }
        let mut still = Vec::new();
        for i in left {
            let m = p.get(&format!("/v1/machines/{}", ids[i])).await;
            match m["state"].as_str() {
                Some("available") => {}
                Some("clean_failed" | "maintenance") => panic!("{}: {m}", bed.vms[i].name),
                _ => still.push(i),
            }
        }
        left = still;
        assert!(t0.elapsed() < SETTLE, "not all available within {SETTLE:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let wall = t0.elapsed().as_secs_f64();
    for (vm, id) in bed.vms.iter().zip(&ids) {
        let entry = custody_entry(&p, id, "available").await;
        assert_wiped(&bed, vm, &entry["evidence"]);
        println!("bench: {}: {}", vm.name, timings(&p, id, &entry["evidence"]).await);
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    let qemu: f64 = cpu.iter().sum();
    println!(
        "bench: {} VMs at once: all available in {wall:.1} s; QEMU used {qemu:.1} CPU s ({:.0}% of {cores} cores over the run)",
        bed.vms.len(),
        100.0 * qemu / (wall * cores)
    );
}
