//! Acceptance on a real VM (docs/acceptance.md): a machine class names the testbed's acceptance
//! image (the wipe image's bytes under a digest of their own, scripts/vm-start), and the agent in
//! it, told by its run's config that this boot is an acceptance, checks the VM's drives and memory
//! against the class and reports.

use std::time::Instant;

use serde_json::{json, Value};

use crate::testbed::{console_tail, virsh, Paddock, Testbed};
use crate::{assert_wiped, custody_entry, settle, SETTLE};

/// The memory the accepted VM gets: the 1 GiB its class promises (the least a class can promise),
/// which the agent's memory check finds in the kernel's online memory blocks. The testbed's small
/// VMs have 448 MiB; the next lease of the VM defines it again as the testbed did.
const MEMORY_KIB: &str = "1048576";

/// A VM enrolled through the API into a class with an acceptance image is wiped, then boots the
/// acceptance image through the BMC's virtual media in a run of its own, reports its checks and
/// becomes `available`: the operation's `acceptance` step succeeded, the report names the
/// acceptance image's digest (not the wipe image's), the ledger holds the wipe and then the pass,
/// and the disks stay erased (the acceptance writes nothing).
#[tokio::test(flavor = "multi_thread")]
async fn a_vm_of_a_class_with_an_acceptance_image_is_wiped_then_accepted_for_real() {
    let Some(bed) = Testbed::from_env() else { return };
    let lease = bed.lease(1, false).await;
    let vm = &lease.vms[0];
    virsh(&["setmaxmem", &vm.name, MEMORY_KIB, "--config"]);
    virsh(&["setmem", &vm.name, MEMORY_KIB, "--config"]);
    let p = Paddock::start(&bed, std::time::Duration::from_secs(3600), None).await;
    let acceptance =
        json!({ "image_url": bed.accept_image_url, "image_sha256": bed.accept_image_sha256, "timeout_seconds": 900 });
    let class = json!({
        "name": "accepted", "cpu_cores": 1, "memory_gib": 1, "gpu_model": "", "gpu_count": 0, "acceptance": acceptance,
    });
    let (status, body) = p.call(reqwest::Method::POST, "/v1/machine-classes", Some(class)).await;
    assert_eq!(status, 201, "{body}");

    let t0 = Instant::now();
    let body = json!({ "name": "vm-accepted", "machine_class": "accepted", "bmc": bed.bmc(vm, true) });
    let (status, created) = p.call(reqwest::Method::POST, "/v1/machines", Some(body)).await;
    assert_eq!(status, 202, "{created}");
    let id = created["machine"]["id"].as_str().expect("machine id").to_owned();
    let operation = created["operation"]["id"].as_str().expect("operation id").to_owned();
    let m = settle(&p, vm, &id, &["available", "clean_failed", "maintenance"]).await;
    let elapsed = t0.elapsed().as_secs_f64();
    assert_eq!(m["state"], "available", "{m}\nconsole:\n{}", console_tail(vm, 30));
    assert_eq!(virsh(&["domstate", &vm.name]), "shut off", "powered off after the acceptance");

    let op = ended(&p, &operation).await;
    assert_eq!(op["state"], "succeeded", "{op}");
    let steps = op["steps"].as_array().expect("steps");
    let names: Vec<&str> = steps.iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["inspect", "record_inventory", "clean", "acceptance", "available"], "{op}");
    let acceptance_step = steps.iter().find(|s| s["name"] == "acceptance").expect("the acceptance step");
    assert_eq!(acceptance_step["state"], "succeeded", "{op}");

    // The wipe: the wipe image's report, every disk erased (still, after the acceptance's boot);
    // the same entry starts the acceptance.
    let started = custody_entry(&p, &id, "cleaning").await;
    assert_eq!(started["reason"], "verified wipe: every listed drive wiped; acceptance started", "{started}");
    assert_wiped(&bed, vm, &started["evidence"]["clean"]);
    assert_eq!(started["evidence"]["acceptance"]["image_url"], bed.accept_image_url, "{started}");

    // The pass: the acceptance image's report, its digest not the wipe image's, every check healthy.
    let passed = custody_entry(&p, &id, "available").await;
    assert_eq!(passed["reason"], "acceptance passed", "{passed}");
    let evidence = &passed["evidence"]["acceptance"];
    assert_ne!(bed.accept_image_sha256, bed.image_sha256);
    assert_eq!(evidence["image_sha256"], bed.accept_image_sha256, "{passed}");
    assert_eq!(evidence["report"]["image_sha256"], bed.accept_image_sha256, "{passed}");
    assert_eq!(evidence["report"]["result"], "success", "{passed}");
    let checks = evidence["checks"].as_array().expect("checks");
    let names: Vec<&str> = checks.iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["drives", "memory"], "{passed}");
    assert!(checks.iter().all(|c| c["status"] == "healthy"), "{passed}");
    let report = &evidence["report"];
    eprintln!(
        "{}: enroll -> available through a wipe and an acceptance in {elapsed:.1} s (the acceptance's checks {:.1} s); {checks:?}",
        vm.name,
        crate::secs(&report["started_at"], &report["finished_at"]),
    );
}

/// The operation once it ended.
async fn ended(p: &Paddock, operation: &str) -> Value {
    let deadline = Instant::now() + SETTLE;
    loop {
        let op = p.get(&format!("/v1/operations/{operation}")).await;
        if op["state"] != "running" && op["state"] != "pending" {
            return op;
        }
        assert!(Instant::now() < deadline, "operation not ended after {SETTLE:?}: {op}");
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}
