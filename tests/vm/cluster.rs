//! The cluster path on the testbed: a Slurm cluster on the simulated Kubernetes
//! drivers and the real Redfish driver. Its machines are real VMs: wiped for real when enrolled,
//! provisioned by a real boot of the node OS image URL (the BMC downloads it, QEMU boots it, the
//! image's agent fetches the run's join configuration and reports the first boot; paddock ejects
//! and restarts the VM from disk), released (on scale-down, and on the cluster's deletion) and
//! wiped for real again before they are `available`. Only the join is simulated: the simulated
//! tenant cluster registers a real machine's Node once paddock holds its verified first-boot
//! report and has restarted it from disk.

use std::time::{Duration, Instant, SystemTime};

use reqwest::Method;
use serde_json::{json, Value};

use crate::testbed::{console_tail, fill, holds_pattern, Paddock, Testbed, Vm};
use crate::{assert_wiped, custody_entry, enroll, settle, vm_class, SETTLE};

/// Waits until `what` (polled every second) returns something; fails with `why` after [`SETTLE`].
async fn until<T, F: std::future::Future<Output = Option<T>>>(why: &str, what: impl Fn() -> F) -> T {
    let deadline = Instant::now() + SETTLE;
    loop {
        if let Some(found) = what().await {
            return found;
        }
        assert!(Instant::now() < deadline, "{why} within {SETTLE:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The cluster, as its tenant reads it.
async fn cluster(p: &Paddock, token: &str, path: &str) -> Value {
    let (status, body) = p.call_as(token, Method::GET, path, None).await;
    assert_eq!(status, 200, "GET {path}: {body}");
    body
}

/// Waits until the cluster is ready at its current generation; fails with its status and every
/// machine's state.
async fn ready(p: &Paddock, token: &str, path: &str) -> Value {
    let deadline = Instant::now() + SETTLE;
    loop {
        let c = cluster(p, token, path).await;
        if c["status"]["phase"] == "ready" && c["status"]["observed_generation"] == c["generation"] {
            return c;
        }
        if Instant::now() >= deadline {
            let machines = p.get("/v1/machines").await;
            panic!("cluster not ready within {SETTLE:?}: {c}\nmachines: {machines}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The verified report of `machine`'s provisioning boot, as the agent endpoint recorded it:
/// (image digest, verified).
async fn first_boot_report(p: &Paddock, machine: &str) -> (String, bool) {
    sqlx::query_as(
        "select report->>'image_sha256', coalesce(verified, false) from agent_tokens \
         where machine_id = $1::uuid and purpose = 'provision' and used_at is not null",
    )
    .bind(machine)
    .fetch_one(&p.app.db.pool)
    .await
    .unwrap_or_else(|e| panic!("machine {machine} has no reported provisioning boot: {e}"))
}

/// Whether the BMC downloaded the node OS image for `vm` since `since` (the emulator uploads what
/// it inserts into a volume of its storage pool named after the image and the system).
fn node_image_inserted(bed: &Testbed, vm: &Vm, since: SystemTime) -> bool {
    std::fs::read_dir(bed.dir.join("pool")).expect("the BMC's pool").filter_map(Result::ok).any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let written = e.metadata().and_then(|m| m.modified()).is_ok_and(|t| t >= since);
        name.starts_with("paddock-node") && name.contains(&vm.uuid) && written
    })
}

/// What `vm`'s BMC (the one it was enrolled through) says it boots next: the boot source override
/// target, and every virtual media device holding media (its id and image).
async fn bmc_boot(bed: &Testbed, vm: &Vm, tls: bool) -> (Value, Vec<String>) {
    let system = bed.redfish(tls, &format!("/redfish/v1/Systems/{}", vm.uuid)).await;
    let link = |v: &Value, at: &str| v.pointer(at).and_then(Value::as_str).expect("a link").to_owned();
    let manager = bed.redfish(tls, &link(&system, "/Links/ManagedBy/0/@odata.id")).await;
    let devices = bed.redfish(tls, &link(&manager, "/VirtualMedia/@odata.id")).await;
    let mut inserted = Vec::new();
    for member in devices["Members"].as_array().expect("the virtual media devices") {
        let device = bed.redfish(tls, &link(member, "/@odata.id")).await;
        let image = device["Image"].as_str().unwrap_or_default();
        if device["Inserted"] == true || !image.is_empty() {
            inserted.push(format!("{}: {image}", device["Id"]));
        }
    }
    (system["Boot"]["BootSourceOverrideTarget"].clone(), inserted)
}

/// The removable media (CD, floppy) in the running domain's live definition, by target and source:
/// what the VM was started with.
fn live_media(vm: &Vm) -> Vec<String> {
    let xml = crate::testbed::virsh(&["dumpxml", &vm.name]);
    let disks = xml.split("<disk ").skip(1).map(|d| d.split("</disk>").next().unwrap_or_default());
    disks
        .filter(|d| d.contains("device='cdrom'") || d.contains("device='floppy'"))
        .filter(|d| d.contains("<source "))
        .map(|d| {
            d.split_whitespace()
                .filter(|w| w.starts_with("file=") || w.starts_with("dev="))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// The custody entries of a machine, oldest first (the chain verified).
async fn custody(p: &Paddock, id: &str) -> Vec<Value> {
    let custody = p.get(&format!("/v1/machines/{id}/custody")).await;
    assert_eq!(custody["verified"], true, "{custody}");
    custody["items"].as_array().expect("items").clone()
}

/// Two VMs enrolled and wiped; a Slurm cluster with a two-machine pool
/// allocates both, each boots the node OS image for real and reports its first boot (writing
/// nothing to the disks: the pattern written onto the disk files before is intact, and stands for
/// the tenant's data), both go `active`; the pool is scaled to 1 (a Slurm cluster keeps at least
/// one node): one is released, wiped for real (every byte of every disk file erased) and
/// `available` again, the custody ledger showing the tenant's hold and the wipe after it; the
/// cluster is deleted, and the other one goes the same way.
#[tokio::test(flavor = "multi_thread")]
async fn a_slurm_cluster_takes_two_vms_and_releasing_them_wipes_them_for_real() {
    let Some(bed) = Testbed::from_env() else { return };
    let lease = bed.lease(2, false).await;
    let vms = &lease.vms;
    let p = Paddock::with_clusters(&bed).await;
    vm_class(&p).await;
    let tls = [true, false];
    let ids = [enroll(&p, &bed, &vms[0], tls[0]).await, enroll(&p, &bed, &vms[1], tls[1]).await];
    for (vm, id) in vms.iter().zip(&ids) {
        let m = settle(&p, vm, id, &["available", "clean_failed", "maintenance"]).await;
        assert_eq!(m["state"], "available", "{m}\nconsole:\n{}", console_tail(vm, 30));
        // A pattern the provisioning boot must leave alone, and the tenant's data after it.
        vm.disks.iter().for_each(fill);
    }

    // A tenant and its Slurm cluster of both VMs.
    let (status, tenant) = p.call(Method::POST, "/v1/tenants", Some(json!({ "name": "vm-tenant" }))).await;
    assert_eq!(status, 201, "{tenant}");
    let tenant_id = tenant["id"].as_str().expect("tenant id").to_owned();
    let token = paddock_testkit::token(&["tenant:admin"], Some(tenant_id.parse().expect("uuid")));
    let pools = json!([{ "name": "vm", "machine_class": "vm", "count": 2 }]);
    let body = json!({ "name": "hpc", "kind": "slurm", "isolation": "private-nodes", "node_pools": pools });
    let clusters = format!("/v1/tenants/{tenant_id}/clusters");
    let (status, created) = p.call_as(&token, Method::POST, &clusters, Some(body)).await;
    assert_eq!(status, 202, "{created}");
    let cluster_id = created["cluster"]["id"].as_str().expect("cluster id").to_owned();
    let pool_id = created["cluster"]["node_pools"][0]["id"].as_str().expect("pool id").to_owned();
    let path = format!("{clusters}/{cluster_id}");
    let (t0, created_at) = (Instant::now(), SystemTime::now());
    ready(&p, &token, &path).await;
    eprintln!("cluster ready with both VMs provisioned in {:.1} s", t0.elapsed().as_secs_f64());

    assert_ne!(bed.os_image_sha256, bed.image_sha256, "the testbed's node OS image has its own digest");
    for ((vm, id), tls) in vms.iter().zip(&ids).zip(tls) {
        let m = p.get(&format!("/v1/machines/{id}")).await;
        assert_eq!(m["state"], "active", "{m}");
        assert_eq!(m["cluster_id"].as_str(), Some(cluster_id.as_str()), "{m}");
        // The VM booted the node OS image the BMC downloaded, and its agent reported the first
        // boot naming that image, not the wipe image.
        assert!(node_image_inserted(&bed, vm, created_at), "the BMC inserted the node OS image into {}", vm.name);
        let (digest, verified) = first_boot_report(&p, id).await;
        assert_eq!((digest.as_str(), verified), (bed.os_image_sha256.as_str(), true), "{}", vm.name);
        // paddock handed it over: the BMC boots it from its disk with no media inserted (the
        // Redfish driver ejects every device and sets the override to Hdd, then restarts it), and
        // the VM runs as restarted that way: no medium in its live definition. (It runs whatever
        // its disk holds: here, the tenant's pattern, since the first boot installed nothing.)
        let (target, media) = bmc_boot(&bed, vm, tls).await;
        assert_eq!(target, "Hdd", "{}'s BMC boots it from disk, not the node OS image", vm.name);
        assert!(media.is_empty(), "{}'s BMC holds no virtual media: {media:?}", vm.name);
        assert_eq!(crate::testbed::virsh(&["domstate", &vm.name]), "running", "{} restarted", vm.name);
        let live = live_media(vm);
        assert!(live.is_empty(), "{} was restarted without media, not on the ISO: {live:?}", vm.name);
        for disk in &vm.disks {
            assert!(holds_pattern(disk), "the first boot wrote nothing to {} of {}", disk.name, vm.name);
        }
    }

    // Scale to 1: one is released, wiped for real and available; the other serves on.
    let pool_path = format!("{path}/node-pools/{pool_id}");
    let (status, scaled) = p.call_as(&token, Method::PATCH, &pool_path, Some(json!({ "count": 1 }))).await;
    assert_eq!(status, 202, "{scaled}");
    let t1 = Instant::now();
    let released = until("one machine is released and wiped", || async {
        let mut states = Vec::new();
        for id in &ids {
            states.push(p.get(&format!("/v1/machines/{id}")).await["state"].as_str().unwrap_or_default().to_owned());
        }
        assert!(!states.iter().any(|s| s == "clean_failed" || s == "maintenance"), "{states:?}");
        match (states[0].as_str(), states[1].as_str()) {
            ("available", "active") => Some(0),
            ("active", "available") => Some(1),
            _ => None,
        }
    })
    .await;
    eprintln!("scale to 1: a VM released and wiped in {:.1} s", t1.elapsed().as_secs_f64());
    ready(&p, &token, &path).await;
    released_and_wiped(&p, &bed, &vms[released], &ids[released], &tenant_id).await;

    // Delete the cluster: the other one is released and wiped for real too.
    let kept = 1 - released;
    let (status, deleted) = p.call_as(&token, Method::DELETE, &path, None).await;
    assert_eq!(status, 202, "{deleted}");
    until("the cluster is deleted", || async {
        (p.call_as(&token, Method::GET, &path, None).await.0 == 404).then_some(())
    })
    .await;
    let m = settle(&p, &vms[kept], &ids[kept], &["available", "clean_failed", "maintenance"]).await;
    assert_eq!(m["state"], "available", "{m}\nconsole:\n{}", console_tail(&vms[kept], 30));
    released_and_wiped(&p, &bed, &vms[kept], &ids[kept], &tenant_id).await;
    let world = p.world.as_ref().expect("the simulated clusters");
    let cluster: uuid::Uuid = cluster_id.parse().expect("cluster id");
    assert!(world.nodes(paddock_types::ClusterId(cluster)).await.expect("nodes").is_empty());
}

/// The machine's tenancy ended in a verified wipe: every byte of its disks erased (the tenant's
/// pattern gone), and the custody ledger shows the tenant's hold (allocated, provisioning,
/// active, releasing, each naming the tenant) and then the wipe, a run after the first one.
async fn released_and_wiped(p: &Paddock, bed: &Testbed, vm: &Vm, id: &str, tenant_id: &str) {
    let wipe = custody_entry(p, id, "available").await;
    assert_wiped(bed, vm, &wipe["evidence"]);
    let entries = custody(p, id).await;
    let moves: Vec<&str> = entries.iter().filter_map(|e| e["to"].as_str()).collect();
    let held = moves.iter().position(|s| *s == "allocated").expect("an allocation");
    assert_eq!(
        moves[held..],
        ["allocated", "provisioning", "active", "releasing", "cleaning", "available"],
        "{}: {moves:?}",
        vm.name
    );
    for entry in &entries[held..held + 4] {
        assert_eq!(entry["evidence"]["tenant_id"].as_str(), Some(tenant_id), "{entry}");
    }
    assert_eq!(moves.iter().filter(|s| **s == "available").count(), 2, "two verified wipes: {moves:?}");
    assert_ne!(wipe["evidence"]["run_id"], entries[held - 1]["evidence"]["run_id"], "a new wipe");
}
