//! `paddock-agent run` end to end against a local paddock: the real API served on a loopback port,
//! the worker's machine reconciler in-process on the SIMULATED BMC (paddock-sim, its world in this
//! test's database), and the real agent binary wiping real loop devices.
//!
//! The simulated BMC only keeps what was inserted; nothing plays the machine's agent here (the
//! simulated agent, `SimAgent`, is not run). The test does what the machine would: it fetches the
//! run's seed through the seed URL the BMC holds (`GET /v1/agent/seed/{seed_token}.iso`), puts it
//! on a loop device, and runs `paddock-agent run` with two more loop devices, filled with a
//! random pattern, as the machine's disks. The BMC's inventory lists those two disks (what the
//! agent matches them by: a loop device has no serial, so protocol and capacity).

use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use paddock_domain::bmc::InventoryDrive;
use paddock_service::agent::AgentSettings;
use paddock_sim::{SimConfig, SimWorld};
use paddock_store::Store;
use paddock_testkit::{admin, eventually, TestApp};
use paddock_worker::reconcile::{Drivers, MachineReconciler, Settings};
use paddock_worker::{JobHandler, Worker, WorkerConfig};
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::harness::{path, sha256_hex, Loop};

const MIB: usize = 1 << 20;
const WAIT: Duration = Duration::from_secs(60);

/// The digest the server expects of the wipe image (`PADDOCK_WIPE_IMAGE_SHA256`), and what the
/// agent is told it runs in.
fn image_sha256() -> String {
    sha256_hex(b"paddock-agent end-to-end test image")
}

/// The API on a port and a worker with the machine reconciler on the simulated BMC.
struct Lab {
    app: TestApp,
    world: SimWorld,
    stop: watch::Sender<bool>,
}

impl Lab {
    async fn new() -> Lab {
        let app = TestApp::served_with(|a| AgentSettings { wipe_image_sha256: image_sha256(), ..a }).await;
        let store = Store::from_pool(app.db.pool.clone());
        let world = SimWorld::new(store.clone(), SimConfig::zero());
        let drivers = Drivers { bmc: Some(world.bmc()), kube: None };
        let settings = Settings {
            wipe_image_url: Some("http://images.invalid/wipe.iso".into()),
            poll: Duration::from_millis(50),
            report_wait: Duration::from_secs(2),
            ..Settings::default()
        };
        let handlers: Vec<Arc<dyn JobHandler>> =
            vec![Arc::new(MachineReconciler::new(app.services.clone(), drivers, settings))];
        let config = WorkerConfig {
            poll_interval: Duration::from_millis(50),
            backoff_base: Duration::from_millis(10),
            backoff_cap: Duration::from_millis(200),
            max_attempts: 100,
            ..WorkerConfig::default()
        };
        let worker = Worker::new(store, "agent-run-worker", handlers, config).expect("worker");
        let (stop, mut stopped) = watch::channel(false);
        tokio::spawn(async move {
            worker
                .run(async move {
                    let _ = stopped.changed().await;
                })
                .await
        });
        Lab { app, world, stop }
    }

    /// Enrolls `sim://<name>`, whose BMC reports `disks` as its drives (`disk0`, `disk1`, ...);
    /// returns its id.
    async fn enroll(&self, name: &str, disks: &[&Loop]) -> String {
        let drives: Vec<InventoryDrive> = disks
            .iter()
            .enumerate()
            .map(|(i, d)| InventoryDrive {
                id: format!("disk{i}"),
                capacity_bytes: Some(d.size() as u64),
                model: Some("loop device".to_owned()),
                serial: None,
                protocol: Some("loop".to_owned()),
            })
            .collect();
        self.world.set_machine_drives(name, &drives).await.expect("the simulated machine's drives");
        let class = json!({"name": format!("class-{name}"), "cpu_cores": 64, "memory_gib": 512, "gpu_count": 0});
        self.app.post("/v1/machine-classes").token(&admin()).json(&class).send().await.expect(201);
        let body = json!({
            "name": name, "machine_class": format!("class-{name}"),
            "bmc": { "url": format!("sim://{name}"), "username": "admin", "password": "simulated" }
        });
        let created = self.app.post("/v1/machines").token(&admin()).json(&body).send().await.expect(202).json();
        created["machine"]["id"].as_str().expect("id").to_owned()
    }

    /// The seed of the wipe run the worker booted `name` into, fetched like the BMC fetches it:
    /// from the seed URL inserted as virtual media.
    async fn seed(&self, machine: &str, name: &str) -> Vec<u8> {
        let url: String = eventually(WAIT, || async {
            let m = self.machine(machine).await;
            if m["state"] != "cleaning" {
                return None;
            }
            sqlx::query_scalar("select seed_url from paddock_sim.machines where name = $1")
                .bind(name)
                .fetch_one(&self.app.db.pool)
                .await
                .expect("seed url")
        })
        .await;
        let base = self.app.base_url.as_deref().expect("served");
        assert!(url.starts_with(&format!("{base}/v1/agent/seed/")) && url.ends_with(".iso"), "a seed URL: {url}");
        let resp = reqwest::get(&url).await.expect("fetching the seed");
        assert_eq!(resp.status(), 200);
        resp.bytes().await.expect("the seed's bytes").to_vec()
    }

    async fn machine(&self, id: &str) -> Value {
        self.app.get(format!("/v1/machines/{id}")).token(&admin()).send().await.expect(200).json()
    }

    async fn machine_in(&self, id: &str, state: &str) -> Value {
        eventually(WAIT, || async {
            let m = self.machine(id).await;
            (m["state"] == state).then_some(m)
        })
        .await
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Runs `paddock-agent run` on `seed` and `disks` (off the runtime: the API answers meanwhile).
async fn run_agent(seed: &Path, disks: &[&Loop]) -> Output {
    let mut args = vec!["run".to_owned(), "--seed-device".to_owned(), path(seed).to_owned()];
    for d in disks {
        args.extend(["--device".to_owned(), path(&d.dev).to_owned()]);
    }
    args.extend(["--no-poweroff".to_owned(), "--image-sha256".to_owned(), image_sha256()]);
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        crate::harness::agent(&args)
    })
    .await
    .expect("the agent's thread")
}

/// The custody entry that made the machine available (the verified wipe).
async fn verified_wipe(app: &TestApp, machine: &str) -> Value {
    let custody = app.get(format!("/v1/machines/{machine}/custody")).token(&admin()).send().await.expect(200).json();
    let items = custody["items"].as_array().expect("items");
    items.iter().rev().find(|e| e["from"] == "cleaning" && e["to"] == "available").expect("a verified wipe").clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_wipes_the_machines_disks_and_paddock_makes_it_available_with_the_evidence() {
    let lab = Lab::new().await;
    let disks = [Loop::random(8 * MIB, 21), Loop::random(12 * MIB, 22)];
    let machine = lab.enroll("agent-e2e", &[&disks[0], &disks[1]]).await;
    let seed = Loop::with_contents(&lab.seed(&machine, "agent-e2e").await, true);

    let out = run_agent(&seed.dev, &[&disks[0], &disks[1]]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "the agent succeeds: {stderr}");
    for d in &disks {
        assert!(d.contents().iter().all(|&b| b == 0), "{} is entirely zero", d.dev.display());
    }
    let m = lab.machine_in(&machine, "available").await;
    assert_eq!(m["last_error"], Value::Null, "{m}");

    let entry = verified_wipe(&lab.app, &machine).await;
    let evidence = &entry["evidence"];
    assert_eq!(evidence["image_sha256"], image_sha256(), "{entry}");
    let drives = evidence["drives"].as_array().expect("per-drive evidence");
    assert_eq!(drives.len(), 2, "{entry}");
    for (i, d) in disks.iter().enumerate() {
        let id = format!("disk{i}");
        let e = drives.iter().find(|e| e["id"] == id.as_str()).unwrap_or_else(|| panic!("{id} in {entry}"));
        assert_eq!(e["result"], "success", "{e}");
        assert_eq!(e["method"], "overwrite-zeroes", "{e}");
        assert_eq!(e["match_basis"], "protocol_capacity", "a loop device has no serial: {e}");
        assert_eq!(e["identity"]["size_bytes"], d.size() as u64, "{e}");
        assert_eq!(e["identity"]["protocol"], "loop", "{e}");
        let read = 2 * MIB + 64 * (64 << 10);
        assert_eq!(e["verification"]["ranges"], 66, "{e}");
        assert_eq!(e["verification"]["bytes_read"], read as u64, "{e}");
        assert_eq!(e["verification"]["sha256"], sha256_hex(&vec![0u8; read]), "{e}");
    }
    assert_eq!(evidence["report"]["result"], "success", "the whole report is kept: {entry}");
    let devices = evidence["report"]["devices"].as_array().expect("every device seen is reported");
    for d in &disks {
        let name = d.dev.file_name().and_then(|n| n.to_str()).expect("name");
        let seen = devices.iter().find(|s| s["name"] == name).unwrap_or_else(|| panic!("{name} in {entry}"));
        assert_eq!((&seen["kind"], &seen["action"]), (&json!("disk"), &json!("wiped")), "{seen}");
    }
    assert_eq!(evidence["out_of_band_erase"], json!({ "erases": [] }), "the simulated BMC advertises no erase");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_disk_fails_the_wipe_and_the_machine_is_quarantined_naming_it() {
    let lab = Lab::new().await;
    let rw = Loop::random(8 * MIB, 23);
    let ro = Loop::with_contents(&crate::harness::pattern(12 * MIB, 24), true);
    let machine = lab.enroll("agent-e2e-ro", &[&rw, &ro]).await;
    let seed = Loop::with_contents(&lab.seed(&machine, "agent-e2e-ro").await, true);
    let before = ro.contents();

    let out = run_agent(&seed.dev, &[&rw, &ro]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "a failed drive fails the run: {stderr}");
    assert!(stderr.contains("report delivered"), "the failure is reported: {stderr}");
    assert!(rw.contents().iter().all(|&b| b == 0), "the writable disk is still wiped");
    assert_eq!(ro.contents(), before, "the read-only disk is untouched");

    let m = lab.machine_in(&machine, "clean_failed").await;
    assert_eq!(m["last_error"]["code"], "wipe_failed", "{m}");
    let message = m["last_error"]["message"].as_str().expect("message");
    assert!(message.contains("drive disk1") && message.contains("read-only"), "the read-only drive is named: {m}");
    assert!(!message.contains("drive disk0"), "the wiped drive is not blamed: {m}");
}
