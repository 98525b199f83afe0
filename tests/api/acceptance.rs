//! Acceptance through the API on the simulated drivers (docs/acceptance.md): a class's acceptance
//! image booted in a run of its own after the wipe of an enrollment or of a return from
//! maintenance; its report passes the machine or keeps it out with the reason; a timeout; a class
//! without one unchanged; wipes between tenancies never accept; a crash after each of the
//! acceptance's side effects; bad class input. The simulated acceptance image checks the drives
//! and memory it is told of (faults `acceptance_fails`, `acceptance_never_reports`).

use std::sync::Arc;

use paddock_sim::MachineFault;
use paddock_testkit::{admin, eventually};
use paddock_worker::reconcile::Drivers;
use serde_json::{json, Value};

use crate::common::id;
use crate::lifecycle::{slurm, Crashes, CrashingBmc, Lab};

const WAIT: std::time::Duration = std::time::Duration::from_secs(60);
const IMAGE_URL: &str = "https://images.invalid/accept.iso";
const IMAGE_SHA256: &str = "5d0c3f5e8a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5";

/// A class `name` (8 GPUs) whose machines are accepted by the test image.
async fn accepting_class(lab: &Lab, name: &str) -> Value {
    let body = json!({
        "name": name, "cpu_cores": 64, "memory_gib": 512, "gpu_model": "NVIDIA H100", "gpu_count": 8,
        "acceptance": { "image_url": IMAGE_URL, "image_sha256": IMAGE_SHA256, "timeout_seconds": 600 },
    });
    lab.app.post("/v1/machine-classes").token(&admin()).json(&body).send().await.expect(201).json()
}

/// Enrolls `sim://<name>` of `class`; returns the machine's id and its enrollment's operation id.
async fn enroll(lab: &Lab, class: &str, name: &str) -> (String, String) {
    let body = json!({
        "name": name, "machine_class": class,
        "bmc": { "url": format!("sim://{name}"), "username": "admin", "password": "simulated" }
    });
    let created = lab.app.post("/v1/machines").token(&admin()).json(&body).send().await.expect(202).json();
    (id(&created["machine"]), id(&created["operation"]))
}

/// The operation once it ended.
async fn ended(lab: &Lab, operation: &str) -> Value {
    eventually(WAIT, || async {
        let op = lab.app.get(format!("/v1/operations/{operation}")).token(&admin()).send().await.expect(200).json();
        (op["state"] != "running" && op["state"] != "pending").then_some(op)
    })
    .await
}

fn step<'a>(op: &'a Value, name: &str) -> &'a Value {
    op["steps"].as_array().and_then(|s| s.iter().find(|s| s["name"] == name)).unwrap_or(&Value::Null)
}

/// The machine's custody: entries oldest first, and whether the chain verifies.
async fn custody(lab: &Lab, machine: &str) -> (Vec<Value>, bool) {
    let c = lab.app.get(format!("/v1/machines/{machine}/custody")).token(&admin()).send().await.expect(200).json();
    (c["items"].as_array().cloned().unwrap_or_default(), c["verified"] == true)
}

/// How many runs of `purpose` the machine's agent tokens were issued for, and how many reported.
async fn runs(lab: &Lab, machine: &str, purpose: &str) -> (i64, i64) {
    sqlx::query_as(
        "select count(distinct run_id), count(*) filter (where used_at is not null) from agent_tokens \
         where machine_id = $1::uuid and purpose = $2",
    )
    .bind(machine)
    .bind(purpose)
    .fetch_one(&lab.app.db.pool)
    .await
    .expect("runs")
}

#[tokio::test]
async fn an_enrolled_machine_boots_its_acceptance_image_after_the_wipe_and_becomes_available_on_its_report() {
    let lab = Lab::new().await;
    accepting_class(&lab, "gpu").await;
    let (machine, operation) = enroll(&lab, "gpu", "n1").await;
    let op = ended(&lab, &operation).await;
    assert_eq!(op["state"], "succeeded", "{op}");
    let names: Vec<&str> = op["steps"].as_array().expect("steps").iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["inspect", "record_inventory", "clean", "acceptance", "available"], "{op}");
    assert_eq!(step(&op, "acceptance")["state"], "succeeded", "{op}");
    lab.machine_in(&machine, "available").await;

    // Two runs, each with its own one-time token: the wipe's and the acceptance's, both reported.
    assert_eq!(runs(&lab, &machine, "wipe").await, (1, 1));
    assert_eq!(runs(&lab, &machine, "acceptance").await, (1, 1));
    // The acceptance booted the class's image, not the wipe image: the BMC holds it still.
    let inserted: Option<String> =
        sqlx::query_scalar("select image_url from paddock_sim.machines where bmc_url = 'sim://n1'")
            .fetch_one(&lab.app.db.pool)
            .await
            .expect("sim machine");
    assert!(inserted.is_none() || inserted.as_deref() == Some(IMAGE_URL), "{inserted:?}");

    // The ledger: the wipe's clean with the acceptance image it goes on to, then the pass with
    // the image's checks; the chain verifies.
    let (entries, verified) = custody(&lab, &machine).await;
    assert!(verified, "{entries:?}");
    let started = entries.iter().find(|e| e["reason"].as_str().is_some_and(|r| r.contains("acceptance started")));
    let started = started.expect("the acceptance's start in the ledger");
    assert_eq!((&started["from"], &started["to"]), (&json!("cleaning"), &json!("cleaning")));
    assert_eq!(started["evidence"]["acceptance"]["image_sha256"], IMAGE_SHA256);
    assert!(started["evidence"]["clean"]["drives"].is_array(), "{started}");
    let last = entries.last().expect("entries");
    assert_eq!((&last["reason"], &last["to"]), (&json!("acceptance passed"), &json!("available")));
    assert_eq!(last["evidence"]["acceptance"]["image_sha256"], IMAGE_SHA256);
    let checks: Vec<&str> = last["evidence"]["acceptance"]["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(checks, ["drives", "memory"]);

    // Between tenancies the machine is only wiped: a cluster takes it and gives it back.
    let created = lab.create(slurm("hpc", json!([{ "name": "gpu", "machine_class": "gpu", "count": 1 }]))).await;
    let cluster = id(&created["cluster"]);
    lab.ready(&cluster).await;
    lab.delete(&cluster).await;
    eventually(WAIT, || async {
        (lab.scalar("select count(*) from machine_cleans").await == 2
            && lab.scalar("select count(*) from machines where state = 'available'").await == 1)
            .then_some(())
    })
    .await;
    assert_eq!(runs(&lab, &machine, "acceptance").await, (1, 1), "a tenancy's end is not accepted again");
    lab.check_invariants().await;
}

#[tokio::test]
async fn a_failed_acceptance_keeps_the_machine_in_maintenance_with_the_reason_until_a_return_passes() {
    let lab = Lab::new().await;
    accepting_class(&lab, "gpu").await;
    lab.world.set_machine_fault("bad", MachineFault::AcceptanceFails, true).await.expect("fault");
    let (machine, operation) = enroll(&lab, "gpu", "bad").await;
    let m = lab.machine_in(&machine, "maintenance").await;
    assert_eq!(m["last_error"]["code"], "acceptance_failed", "{m}");
    let reason = m["maintenance_reason"].as_str().expect("reason");
    assert!(reason.contains("memory: failed (found 256 GiB, the class promises 512 GiB)"), "{m}");
    assert!(!reason.contains("drives"), "only the failed check is the reason: {m}");

    // The enrollment failed, saying why, at its acceptance step.
    let op = ended(&lab, &operation).await;
    assert_eq!((&op["state"], &op["error"]["code"]), (&json!("failed"), &json!("acceptance_failed")), "{op}");
    assert_eq!(step(&op, "acceptance")["state"], "failed", "{op}");
    assert_eq!(step(&op, "clean")["state"], "succeeded", "{op}");

    // A health report by the acceptance, with the image's checks.
    let reports =
        lab.app.get(format!("/v1/machines/{machine}/health-reports")).token(&admin()).send().await.expect(200).json();
    let report = &reports["items"][0];
    assert_eq!((&report["source"], &report["status"]), (&json!("acceptance"), &json!("failed")), "{reports}");
    assert!(report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .any(|c| c["name"] == "memory" && c["status"] == "failed"));

    // The ledger records the failure, and the chain verifies.
    let (entries, verified) = custody(&lab, &machine).await;
    assert!(verified);
    let last = entries.last().expect("entries");
    assert_eq!((&last["from"], &last["to"]), (&json!("cleaning"), &json!("maintenance")), "{last}");
    assert_eq!(last["evidence"]["error"]["code"], "acceptance_failed");

    // A cluster asking for the class gets nothing: the machine is out of the fleet.
    let cluster =
        id(&lab.create(slurm("hpc", json!([{ "name": "gpu", "machine_class": "gpu", "count": 1 }]))).await["cluster"]);
    eventually(WAIT, || async {
        let c = lab.cluster(&cluster).await;
        (crate::lifecycle::condition(&c, "MachinesAllocated")["reason"] == "InsufficientCapacity").then_some(())
    })
    .await;

    // The operator fixes it and returns it: wiped and accepted again, then the cluster gets it.
    lab.world.set_machine_fault("bad", MachineFault::AcceptanceFails, false).await.expect("heal");
    let back =
        lab.app.delete(format!("/v1/machines/{machine}/maintenance")).token(&admin()).send().await.expect(202).json();
    let op = ended(&lab, &id(&back["operation"])).await;
    assert_eq!(op["state"], "succeeded", "{op}");
    assert_eq!(step(&op, "acceptance")["state"], "succeeded", "{op}");
    lab.ready(&cluster).await;
    assert_eq!(runs(&lab, &machine, "wipe").await, (2, 2));
    assert_eq!(runs(&lab, &machine, "acceptance").await, (2, 2));
    lab.check_invariants().await;
}

#[tokio::test]
async fn an_acceptance_image_that_never_reports_times_out_into_maintenance() {
    let lab = Lab::new().await;
    accepting_class(&lab, "gpu").await;
    lab.world.set_machine_fault("mute", MachineFault::AcceptanceNeverReports, true).await.expect("fault");
    let (machine, operation) = enroll(&lab, "gpu", "mute").await;
    // Booted into its acceptance image (the wipe reported and was recorded first).
    eventually(WAIT, || async {
        let booted: bool = sqlx::query_scalar(
            "select run_purpose = 'acceptance' and run_booted_at is not null from machines where id = $1::uuid",
        )
        .bind(&machine)
        .fetch_one(&lab.app.db.pool)
        .await
        .expect("machine");
        booted.then_some(())
    })
    .await;
    assert_eq!(lab.scalar("select count(*) from machine_cleans").await, 1);
    // The class's ten minutes pass: the boot is moved back in time, as the clock would.
    sqlx::query("update machines set run_booted_at = run_booted_at - interval '11 minutes' where id = $1::uuid")
        .bind(&machine)
        .execute(&lab.app.db.pool)
        .await
        .expect("time passes");
    let m = lab.machine_in(&machine, "maintenance").await;
    assert_eq!(m["last_error"]["code"], "acceptance_timed_out", "{m}");
    assert!(m["maintenance_reason"].as_str().expect("reason").contains("within the class's 600 s"), "{m}");
    let op = ended(&lab, &operation).await;
    assert_eq!(op["error"]["code"], "acceptance_timed_out", "{op}");
    let reports: Value =
        lab.app.get(format!("/v1/machines/{machine}/health-reports")).token(&admin()).send().await.expect(200).json();
    assert_eq!(reports["items"][0]["checks"][0]["name"], "acceptance", "{reports}");
    // Powered off and ejected: the image is not left running.
    let on: bool = sqlx::query_scalar("select power_on from paddock_sim.machines where bmc_url = 'sim://mute'")
        .fetch_one(&lab.app.db.pool)
        .await
        .expect("sim machine");
    assert!(!on);
}

#[tokio::test]
async fn a_class_without_an_acceptance_image_enrolls_as_before() {
    let lab = Lab::new().await;
    crate::common::machine_class(&lab.app, "plain", 0).await;
    let (machine, operation) = enroll(&lab, "plain", "p1").await;
    let op = ended(&lab, &operation).await;
    let names: Vec<&str> = op["steps"].as_array().expect("steps").iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["inspect", "record_inventory", "clean", "available"], "{op}");
    assert_eq!(op["state"], "succeeded");
    lab.machine_in(&machine, "available").await;
    assert_eq!(runs(&lab, &machine, "acceptance").await, (0, 0));
    let (entries, _) = custody(&lab, &machine).await;
    let last = entries.last().expect("entries");
    assert_eq!(last["reason"], "verified wipe: every listed drive wiped", "{last}");
    let class = lab.app.get("/v1/machine-classes/plain").token(&admin()).send().await.expect(200).json();
    assert_eq!(class["acceptance"], Value::Null);
}

#[tokio::test]
async fn a_crash_after_each_acceptance_side_effect_repeats_it_and_accepts_once() {
    let crashes = Arc::new(Crashes::default());
    let injected = crashes.clone();
    let lab = Lab::with(move |drivers| Drivers {
        bmc: Some(Arc::new(CrashingBmc(drivers.bmc.expect("bmc"), injected))),
        kube: drivers.kube,
    })
    .await;
    accepting_class(&lab, "gpu").await;
    let machines = lab.available("gpu", &["c1", "c2"]).await;
    for machine in &machines {
        // Each boot (the wipe's, the acceptance's) and each power-off crashed once after its
        // side effect and was repeated: still one clean, one acceptance, one pass in the ledger.
        // One acceptance run (a repeated boot issues it new tokens; the first report decides).
        assert_eq!(runs(&lab, machine, "acceptance").await.0, 1);
        let (entries, verified) = custody(&lab, machine).await;
        assert!(verified);
        let passes = entries.iter().filter(|e| e["reason"] == "acceptance passed").count();
        let starts = entries.iter().filter(|e| e["reason"].as_str().is_some_and(|r| r.contains("acceptance started")));
        assert_eq!((passes, starts.count()), (1, 1), "{entries:?}");
    }
    assert_eq!(lab.scalar("select count(*) from machine_cleans").await, 2);
    let crashed = crashes.keys();
    for machine in &machines {
        assert!(crashed.contains(&format!("boot:{machine}:{IMAGE_URL}")), "{crashed:?}");
    }
}

#[tokio::test]
async fn acceptance_settings_that_cannot_work_are_refused() {
    let lab = Lab::new().await;
    let class = |acceptance: Value| json!({ "name": "gpu", "cpu_cores": 8, "memory_gib": 32, "gpu_count": 0, "acceptance": acceptance });
    let good = json!({ "image_url": IMAGE_URL, "image_sha256": IMAGE_SHA256 });
    let wipe_image = paddock_domain::agent::SIMULATED_WIPE_IMAGE_SHA256;
    for (acceptance, field) in [
        (json!({ "image_url": "http://images.invalid/a.iso", "image_sha256": IMAGE_SHA256 }), "acceptance.image_url"),
        (json!({ "image_url": "not a url", "image_sha256": IMAGE_SHA256 }), "acceptance.image_url"),
        (json!({ "image_url": IMAGE_URL, "image_sha256": "XYZ" }), "acceptance.image_sha256"),
        (json!({ "image_url": IMAGE_URL, "image_sha256": IMAGE_SHA256.to_uppercase() }), "acceptance.image_sha256"),
        (
            json!({ "image_url": IMAGE_URL, "image_sha256": IMAGE_SHA256, "timeout_seconds": 5 }),
            "acceptance.timeout_seconds",
        ),
        (json!({ "image_url": IMAGE_URL, "image_sha256": wipe_image }), "acceptance.image_sha256"),
    ] {
        let problem = lab
            .app
            .post("/v1/machine-classes")
            .token(&admin())
            .json(&class(acceptance.clone()))
            .send()
            .await
            .problem(422, "validation_failed");
        assert_eq!(problem["errors"][0]["field"], field, "{acceptance}: {problem}");
    }
    assert_eq!(lab.scalar("select count(*) from machine_classes").await, 0, "nothing half-written");
    // An unknown field in the acceptance is a malformed body.
    let mut extra = good.clone();
    extra["script"] = json!("rm -rf /");
    let status = lab.app.post("/v1/machine-classes").token(&admin()).json(&class(extra)).send().await.status;
    assert!(status == 400 || status == 422, "{status}");

    // Created with the default timeout; a merge patch changes it and null removes it.
    let created =
        lab.app.post("/v1/machine-classes").token(&admin()).json(&class(good)).send().await.expect(201).json();
    assert_eq!(created["acceptance"]["timeout_seconds"], 3600);
    let patched = lab
        .app
        .patch("/v1/machine-classes/gpu")
        .token(&admin())
        .json(&json!({ "acceptance": { "timeout_seconds": 7200 } }))
        .send()
        .await
        .expect(200)
        .json();
    assert_eq!(patched["acceptance"]["timeout_seconds"], 7200);
    assert_eq!(patched["acceptance"]["image_sha256"], IMAGE_SHA256);
    lab.app
        .patch("/v1/machine-classes/gpu")
        .token(&admin())
        .json(&json!({ "acceptance": { "image_url": "ftp://x/y.iso" } }))
        .send()
        .await
        .problem(422, "validation_failed");
    let removed = lab
        .app
        .patch("/v1/machine-classes/gpu")
        .token(&admin())
        .json(&json!({ "acceptance": null }))
        .send()
        .await
        .expect(200)
        .json();
    assert_eq!(removed["acceptance"], Value::Null);
}
