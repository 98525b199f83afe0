//! The fault "emulator stopped mid-operation": the BMC goes away while the
//! `MachineReconciler` works on a machine, and comes back with its state. Nothing is lost (the
//! agent's report stays recorded, the clean is recorded once) and nothing is reused unwiped (a
//! machine whose wipe media could not be ejected and whose power could not be confirmed off does
//! not become `available`).
//!
//! Like `lifecycle.rs`: the REAL Redfish driver against the REAL Redfish emulator (sushy-tools),
//! the real agent endpoints served on a loopback port (the test plays the wipe agent), and a tiny
//! image server the emulator downloads the wipe image from. Unlike it, each test starts its OWN
//! emulator (2 systems, no power delay, basic auth) on a free port with the shared launcher
//! (`shared/redfish-emulator/start`, or `PADDOCK_REDFISH_EMULATOR_DIR`), so that stopping it
//! disturbs no other test; it is restarted with `REDFISH_EMULATOR_KEEP_STATE=1` and stopped with
//! the launcher's `stop`. An emulator that does not start (no Python >= 3.10, no venv, no PyPI for
//! the first run) skips the test ([`skip`]: a failure under `CI=true`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use paddock_domain::bmc::{AfterBoot, BmcAccess, BmcDriver, BmcError, BootMedia, BoxFuture, Inventory, SystemStatus};
use paddock_domain::job_kind::MACHINE_RECONCILE;
use paddock_domain::model::Machine;
use paddock_redfish::{BmcLimiter, Password, PowerState, RedfishBmc, RedfishClient, RedfishConfig, Url};
use paddock_service::agent::AgentSettings;
use paddock_store::{machine, run, Store};
use paddock_testkit::{admin, skip, TestApp};
use paddock_types::machine::MachineState;
use paddock_types::{MachineClassId, MachineId};
use paddock_worker::reconcile::{Drivers, MachineReconciler, Settings};
use paddock_worker::{JobHandler, Outcome};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uuid::Uuid;

use crate::emulator::{assert_booted, assert_finished, token_of, Seen};
use crate::support::{enqueue, get, init_tracing, new_job};

// ---------------------------------------------------------------------------------------------
// A private emulator, started, stopped and restarted by the test.

/// The shared launcher: `PADDOCK_REDFISH_EMULATOR_DIR`, else `../shared/redfish-emulator` beside
/// the repository (as `scripts/redfish-start` finds it).
fn launcher() -> PathBuf {
    match std::env::var_os("PADDOCK_REDFISH_EMULATOR_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/redfish-emulator"),
    }
}

/// One private emulator: its own port and run directory (removed on drop, after a stop).
struct PrivateEmulator {
    launcher: PathBuf,
    run_dir: PathBuf,
    port: u16,
    url: String,
    user: String,
    password: String,
    /// System name (`node-000`) -> UUID, from the launcher's `systems.json`.
    systems: HashMap<String, String>,
}

impl PrivateEmulator {
    /// Starts a fresh emulator with 2 systems, or `None` (the test is skipped: [`skip`]) when it
    /// cannot be started.
    async fn start(test: &str) -> Option<PrivateEmulator> {
        let launcher = launcher();
        let run_dir = std::env::temp_dir().join(format!("paddock-outage-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&run_dir);
        let password = format!("pw-{}", Uuid::new_v4().simple());
        let mut emu = PrivateEmulator {
            launcher,
            run_dir,
            port: 0,
            url: String::new(),
            user: "paddock".to_owned(),
            password,
            systems: HashMap::new(),
        };
        let mut why = String::new();
        for _ in 0..5 {
            emu.port = free_port();
            match emu.launch(false).await {
                Ok(()) => {
                    emu.url = format!("http://127.0.0.1:{}", emu.port);
                    emu.systems = read_systems(&emu.run_dir);
                    assert_eq!(emu.systems.len(), 2, "{:?}", emu.systems);
                    return Some(emu);
                }
                // Only a port lost to another process in the meantime is worth another try.
                Err(e) if e.contains("already listens") || e.contains("Address already in use") => why = e,
                Err(e) => {
                    why = e;
                    break;
                }
            }
        }
        skip::skip(format_args!(
            "the private Redfish emulator ({}/start) did not start: {why}",
            emu.launcher.display()
        ));
        None
    }

    /// Runs the launcher's `start` on our port and run directory (blocking, off the runtime).
    async fn launch(&self, keep_state: bool) -> Result<(), String> {
        let mut cmd = Command::new(self.launcher.join("start"));
        cmd.arg("2")
            .env("REDFISH_EMULATOR_PORT", self.port.to_string())
            .env("REDFISH_EMULATOR_RUN_DIR", &self.run_dir)
            .env("REDFISH_EMULATOR_POWER_DELAY", "0")
            .env("REDFISH_EMULATOR_KEEP_STATE", if keep_state { "1" } else { "0" })
            .env("REDFISH_EMULATOR_USER", &self.user)
            .env("REDFISH_EMULATOR_PASSWORD", &self.password);
        for leak in [
            "REDFISH_EMULATOR_SYSTEMS",
            "REDFISH_EMULATOR_TLS",
            "REDFISH_EMULATOR_TLS_CERT",
            "REDFISH_EMULATOR_TLS_KEY",
            "REDFISH_EMULATOR_EXTRA_CONFIG",
            "REDFISH_EMULATOR_NAME_PREFIX",
        ] {
            cmd.env_remove(leak);
        }
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .expect("launcher task")
            .map_err(|e| format!("running the launcher: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr)))
        }
    }

    /// Stops the emulator with the launcher's `stop`; the port no longer answers afterwards.
    async fn stop(&self) {
        let out = self.stop_cmd().await;
        assert!(out.status.success(), "stop failed: {}", String::from_utf8_lossy(&out.stderr));
        let addr = format!("127.0.0.1:{}", self.port);
        assert!(tokio::net::TcpStream::connect(&addr).await.is_err(), "the stopped emulator still answers on {addr}");
    }

    async fn stop_cmd(&self) -> std::process::Output {
        let mut cmd = Command::new(self.launcher.join("stop"));
        cmd.arg(self.port.to_string()).env("REDFISH_EMULATOR_RUN_DIR", &self.run_dir);
        tokio::task::spawn_blocking(move || cmd.output()).await.expect("stop task").expect("running stop")
    }

    /// Starts it again on the same port, keeping power, boot and media state.
    async fn restart(&self) {
        if let Err(e) = self.launch(true).await {
            panic!("the emulator did not restart on port {}: {e}", self.port);
        }
    }

    fn uuid(&self, name: &str) -> String {
        self.systems.get(name).unwrap_or_else(|| panic!("no system {name}: {:?}", self.systems)).clone()
    }

    fn client(&self, system: &str) -> RedfishClient {
        let mut config = RedfishConfig::new(
            Url::parse(&self.url).expect("url"),
            self.user.clone(),
            Password::new(self.password.clone()),
        );
        config.system_id = Some(system.to_owned());
        RedfishClient::new(config).expect("client")
    }

    /// Reads the system's state (read-only calls).
    async fn seen(&self, uuid: &str) -> Seen {
        Seen::read(&self.client(uuid)).await
    }
}

impl Drop for PrivateEmulator {
    fn drop(&mut self) {
        // Best effort, also when the test failed half-way.
        let _ = Command::new(self.launcher.join("stop"))
            .arg(self.port.to_string())
            .env("REDFISH_EMULATOR_RUN_DIR", &self.run_dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

/// A port nothing listens on right now (the launcher refuses a taken one; we then retry).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

fn read_systems(run_dir: &std::path::Path) -> HashMap<String, String> {
    let path = run_dir.join("systems.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).expect("systems.json");
    v["systems"]
        .as_array()
        .expect("systems")
        .iter()
        .map(|s| (s["name"].as_str().expect("name").to_owned(), s["uuid"].as_str().expect("uuid").to_owned()))
        .collect()
}

macro_rules! require {
    ($e:expr) => {
        match $e {
            Some(v) => v,
            None => return,
        }
    };
}

// ---------------------------------------------------------------------------------------------
// The image server the emulator downloads the wipe image from: 64 KiB for `GET /images/*.iso`.

async fn image_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind image server");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&request).into_owned();
                let mut words = head.split_whitespace();
                let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                let found = path.starts_with("/images/") && path.ends_with(".iso");
                let body = if found { crate::agent::served_image() } else { Vec::new() };
                let status = if found { "200 OK" } else { "404 Not Found" };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n",
                    body.len()
                );
                let _ = socket.write_all(head.as_bytes()).await;
                if method != "HEAD" {
                    let _ = socket.write_all(&body).await;
                }
                let _ = socket.shutdown().await;
            });
        }
    });
    base
}

// ---------------------------------------------------------------------------------------------
// The real Redfish driver, with each call and its result logged.

struct Logged {
    inner: RedfishBmc,
    log: Mutex<Vec<(String, Result<(), String>)>>,
}

impl Logged {
    fn new() -> Arc<Logged> {
        let inner = RedfishBmc::new(BmcLimiter::new(4)).with_tuning(|c| {
            c.connect_timeout = Duration::from_secs(2);
            c.request_timeout = Duration::from_secs(10);
            c.retries = 1;
        });
        Arc::new(Logged { inner, log: Mutex::default() })
    }

    fn push<T>(&self, call: &str, r: &Result<T, BmcError>) {
        let r = r.as_ref().map(drop).map_err(|e| e.code.clone());
        self.log.lock().expect("lock").push((call.to_owned(), r));
    }

    /// The calls so far, and clears the log.
    fn take(&self) -> Vec<(String, Result<(), String>)> {
        std::mem::take(&mut *self.log.lock().expect("lock"))
    }
}

impl BmcDriver for Logged {
    fn inspect<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<Inventory, BmcError>> {
        Box::pin(async move {
            let r = self.inner.inspect(access).await;
            self.push("inspect", &r);
            r
        })
    }

    fn boot_from_media<'a>(
        &'a self,
        access: &'a BmcAccess,
        media: &'a BootMedia,
    ) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            let r = self.inner.boot_from_media(access, media).await;
            self.push("boot_from_media", &r);
            r
        })
    }

    fn finish_boot<'a>(&'a self, access: &'a BmcAccess, after: AfterBoot) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            let r = self.inner.finish_boot(access, after).await;
            self.push(&format!("finish_boot({after:?})"), &r);
            r
        })
    }

    fn power_off<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            let r = self.inner.power_off(access).await;
            self.push("power_off", &r);
            r
        })
    }

    fn power_on<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            let r = self.inner.power_on(access).await;
            self.push("power_on", &r);
            r
        })
    }

    fn system_status<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<SystemStatus, BmcError>> {
        Box::pin(async move {
            let r = self.inner.system_status(access).await;
            self.push("system_status", &r);
            r
        })
    }
}

fn names(log: &[(String, Result<(), String>)]) -> Vec<&str> {
    log.iter().map(|(c, _)| c.as_str()).collect()
}

// ---------------------------------------------------------------------------------------------
// The bench: the API served on a port, the image server, the reconciler.

struct Bench {
    app: TestApp,
    store: Store,
    images: String,
    bmc: Arc<Logged>,
    r: MachineReconciler,
}

impl Bench {
    async fn new() -> Bench {
        init_tracing();
        let digest = crate::agent::image_sha256();
        let app = TestApp::served_with(|a| AgentSettings {
            wipe_image_sha256: digest.clone(),
            os_image_sha256: digest.clone(),
            ..a
        })
        .await;
        let store = Store::from_pool(app.db.pool.clone());
        let images = image_server().await;
        let bmc = Logged::new();
        let settings = Settings {
            wipe_image_url: Some(format!("{images}/images/wipe.iso")),
            os_image_url: Some(format!("{images}/images/node-os.iso")),
            agent_token_ttl: Duration::from_secs(600),
            node_join_timeout: Duration::from_secs(600),
            poll: Duration::from_millis(200),
            report_wait: Duration::from_millis(500),
            ..Settings::default()
        };
        let drivers = Drivers { bmc: Some(bmc.clone()), kube: None };
        let r = MachineReconciler::new(app.services.clone(), drivers, settings);
        Bench { app, store, images, bmc, r }
    }

    fn wipe_image(&self) -> String {
        format!("{}/images/wipe.iso", self.images)
    }

    fn base_url(&self) -> &str {
        self.app.base_url.as_deref().expect("served")
    }

    /// A class the emulator cannot contradict (it reports neither CPU nor memory).
    async fn class(&self) -> MachineClassId {
        let body = json!({ "name": "metal", "cpu_cores": 64, "memory_gib": 512, "gpu_count": 0 });
        let class = self.app.post("/v1/machine-classes").token(&admin()).json(&body).send().await.expect(201).json();
        MachineClassId(uuid_in(&class["id"]))
    }

    /// Enrolls the emulator's system `uuid` through the API.
    async fn enroll(&self, emu: &PrivateEmulator, name: &str, uuid: &str) -> MachineId {
        let body = json!({
            "name": name,
            "machine_class": "metal",
            "bmc": { "url": emu.url, "system_id": uuid, "username": emu.user, "password": emu.password,
                     "allow_insecure_http": true },
        });
        let view = self.app.post("/v1/machines").token(&admin()).json(&body).send().await.expect(202).json();
        MachineId(uuid_in(&view["machine"]["id"]))
    }

    async fn load(&self, id: MachineId) -> Machine {
        let mut conn = self.store.conn().await.expect("conn");
        machine::get(&mut conn, id).await.expect("get").expect("machine")
    }

    /// Runs the handler once, as the worker would, on a job loaded from the queue.
    async fn run(&self, id: MachineId) -> Outcome {
        let job_id = enqueue(&self.store, &new_job(MACHINE_RECONCILE, id.uuid())).await;
        let job = get(&self.store, job_id).await;
        tokio::time::timeout(Duration::from_secs(90), self.r.run(&job)).await.expect("the run ends")
    }

    /// Runs the handler until the machine is in `want` and the run stops with `code` (`None` =
    /// `Done`), with a bounded number of runs and a deadline.
    async fn drive(&self, id: MachineId, want: MachineState, code: Option<&str>) -> Machine {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut history = Vec::new();
        for _ in 0..30 {
            let outcome = self.run(id).await;
            let m = self.load(id).await;
            let stopped = match (&outcome, code) {
                (Outcome::Done, None) => true,
                (Outcome::Wait { reason, .. }, Some(code)) => reason.code == code,
                _ => false,
            };
            if m.state == want && stopped {
                return m;
            }
            history.push(format!("{:?} after {outcome:?} (last_error {:?})", m.state, m.last_error));
            assert!(
                tokio::time::Instant::now() < deadline,
                "the machine did not reach {want:?}/{code:?} in time: {history:#?}"
            );
            match outcome {
                Outcome::Retry { .. } => tokio::time::sleep(Duration::from_millis(300)).await,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        panic!("the machine did not reach {want:?}/{code:?} within 30 runs: {history:#?}");
    }

    /// The agent token the machine's current boot carries: in the seed whose URL the emulator's
    /// second device holds.
    async fn booted_token(&self, emu: &PrivateEmulator, uuid: &str) -> String {
        let seen = emu.seen(uuid).await;
        let seed = seen.seed().unwrap_or_else(|| panic!("no seed inserted: {seen:?}"));
        assert!(seed.starts_with(self.base_url()), "the seed comes from paddock's API: {seed}");
        let path = format!("/v1/agent/seed/{}.iso", token_of(seed));
        crate::agent::seed(&self.app, &path).await.agent_token
    }

    async fn cleans(&self, id: MachineId) -> Vec<(Uuid, Uuid, String, Value)> {
        sqlx::query_as(
            "select id, run_id, method, evidence from machine_cleans where machine_id = $1 order by completed_at, id",
        )
        .bind(id.uuid())
        .fetch_all(self.store.pool())
        .await
        .expect("cleans")
    }

    /// The clean an available machine carries (`None` = nothing to allocate it on).
    async fn clean_id(&self, id: MachineId) -> Option<Uuid> {
        sqlx::query_scalar("select clean_id from machines where id = $1")
            .bind(id.uuid())
            .fetch_one(self.store.pool())
            .await
            .expect("clean_id")
    }

    /// The agent: fetches the run's configuration like a booted machine; the drive ids.
    async fn agent_config(&self, token: &str) -> Vec<String> {
        let config = crate::agent::config(&self.app, token).await;
        assert_eq!(config["purpose"], "wipe");
        config["config"]["drives"]
            .as_array()
            .expect("drives")
            .iter()
            .map(|d| d["id"].as_str().expect("id").to_owned())
            .collect()
    }

    /// The agent's report: every drive wiped, with complete evidence.
    async fn report_wiped(&self, token: &str, drives: &[String]) -> u16 {
        let body = crate::agent::report_body("success", crate::agent::wiped(drives));
        crate::agent::report(&self.app, token, &body).await
    }
}

fn uuid_in(v: &Value) -> Uuid {
    Uuid::parse_str(v.as_str().unwrap_or_else(|| panic!("not an id: {v}"))).expect("uuid")
}

/// A run that ended on the unreachable BMC: a transient retry naming it.
fn assert_bmc_retry(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Retry { error, .. } => {
            assert!(
                error.code == "bmc_unreachable" || error.code == "bmc_timeout",
                "a retry naming the unreachable BMC, got {error:?}"
            );
            error.code.clone()
        }
        other => panic!("an unreachable BMC is a transient retry, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_bmc_gone_after_the_wipe_report_keeps_the_machine_cleaning_until_it_is_back() {
    let emu = require!(PrivateEmulator::start("after-report").await);
    let b = Bench::new().await;
    b.class().await;
    let uuid = emu.uuid("node-000");
    let id = b.enroll(&emu, "outage-1", &uuid).await;

    // Enroll -> inspect -> cleaning: the wipe boots.
    b.drive(id, MachineState::Cleaning, Some("waiting_for_agent")).await;
    assert_eq!(names(&b.bmc.take()), ["inspect", "boot_from_media"]);
    assert_booted(&emu.seen(&uuid).await, &b.wipe_image());
    let mut conn = b.store.conn().await.expect("conn");
    let run = run::run_of(&mut conn, id).await.expect("run").expect("a run");
    drop(conn);
    assert!(run.run_booted_at.is_some() && run.run_finished_at.is_none(), "booted into the wipe");
    let token = b.booted_token(&emu, &uuid).await;
    let drives = b.agent_config(&token).await;
    assert_eq!(drives, ["nvme0", "nvme1"]);

    // The BMC goes away while the agent wipes; the agent reports (the API is up).
    emu.stop().await;
    assert_eq!(b.report_wiped(&token, &drives).await, 204, "the report is accepted while the BMC is down");

    // The finish step (power off, eject, boot from disk) cannot be done: a transient retry, the
    // machine stays cleaning, nothing recorded as clean, nothing to allocate.
    let before = b.load(id).await;
    let mut codes = Vec::new();
    for attempt in 0..2 {
        let outcome = b.run(id).await;
        let code = assert_bmc_retry(&outcome);
        let log = b.bmc.take();
        assert_eq!(names(&log), ["finish_boot(PowerOff)"], "one finish attempt per run (attempt {attempt})");
        assert_eq!(log[0].1, Err(code.clone()));
        let m = b.load(id).await;
        assert_eq!(m.state, MachineState::Cleaning, "not available: media in, power not confirmed off");
        assert_eq!(m.last_error.as_ref().map(|e| e.code.as_str()), Some(code.as_str()), "{:?}", m.last_error);
        assert!(b.cleans(id).await.is_empty(), "no clean before the machine is off and ejected");
        assert_eq!(b.clean_id(id).await, None);
        let mut conn = b.store.conn().await.expect("conn");
        let now = run::run_of(&mut conn, id).await.expect("run").expect("the run is kept");
        assert_eq!(now.run_id, run.run_id, "the same run");
        assert!(now.run_booted_at.is_some() && now.run_finished_at.is_none(), "not finished");
        codes.push(code);
    }
    assert_eq!(before.state, MachineState::Cleaning);
    // The report is kept (used up), not lost: a second report is refused.
    assert_eq!(b.report_wiped(&token, &drives).await, 409);

    // The BMC comes back with its state: still on, the wipe media still in.
    emu.restart().await;
    assert_booted(&emu.seen(&uuid).await, &b.wipe_image());

    // Power off, eject, boot from disk; available with exactly one clean of that run.
    let m = b.drive(id, MachineState::Available, None).await;
    assert_eq!(names(&b.bmc.take()), ["finish_boot(PowerOff)"]);
    assert_finished(&emu.seen(&uuid).await, PowerState::Off);
    assert_eq!(m.last_error, None, "the outage's error is cleared once it converged");
    let cleans = b.cleans(id).await;
    assert_eq!(cleans.len(), 1, "{cleans:?}");
    let (clean_id, clean_run, method, evidence) = &cleans[0];
    assert_eq!(*clean_run, run.run_id);
    assert_eq!(method, "agent");
    assert_eq!(evidence["report"]["drives"].as_array().expect("drives").len(), 2);
    assert_eq!(b.clean_id(id).await, Some(*clean_id));

    // Another run changes nothing: no second clean, no BMC call.
    let version = m.status_version;
    b.drive(id, MachineState::Available, None).await;
    assert!(b.bmc.take().is_empty());
    assert_eq!(b.load(id).await.status_version, version);
    assert_eq!(b.cleans(id).await.len(), 1);
    eprintln!("outage after the report: retries {codes:?}, then available");
}

#[tokio::test]
async fn the_bmc_gone_while_enrolling_makes_one_call_per_run_and_converges_when_back() {
    let emu = require!(PrivateEmulator::start("enrolling").await);
    let b = Bench::new().await;
    b.class().await;
    let uuid = emu.uuid("node-001");
    let id = b.enroll(&emu, "outage-2", &uuid).await;
    let enrolled = b.load(id).await;
    assert_eq!(enrolled.state, MachineState::Enrolling);

    emu.stop().await;
    // Each run (called directly here, not through the worker loop, whose backoff the queue tests
    // cover) makes one BMC call and answers a transient retry; the state does not move.
    for attempt in 0..3 {
        let started = tokio::time::Instant::now();
        let outcome = b.run(id).await;
        let took = started.elapsed();
        let code = assert_bmc_retry(&outcome);
        let log = b.bmc.take();
        assert_eq!(names(&log), ["inspect"], "one BMC call per run (attempt {attempt})");
        assert_eq!(log[0].1, Err(code.clone()));
        assert!(took < Duration::from_secs(30), "the run gives up in bounded time: {took:?}");
        let m = b.load(id).await;
        assert_eq!(m.state, MachineState::Enrolling);
        assert_eq!(m.system_uuid, None, "nothing read, nothing recorded");
        assert_eq!(m.last_error.as_ref().map(|e| e.code.as_str()), Some(code.as_str()));
        if attempt > 0 {
            // The same error again is not another write.
            assert_eq!(m.status_version, enrolled.status_version + 1, "{attempt}");
        }
    }

    // Back (nothing changed meanwhile): inspect, wipe, available.
    emu.restart().await;
    b.drive(id, MachineState::Cleaning, Some("waiting_for_agent")).await;
    assert_eq!(names(&b.bmc.take()), ["inspect", "boot_from_media"]);
    assert_booted(&emu.seen(&uuid).await, &b.wipe_image());
    let token = b.booted_token(&emu, &uuid).await;
    let drives = b.agent_config(&token).await;
    assert_eq!(b.report_wiped(&token, &drives).await, 204);
    let m = b.drive(id, MachineState::Available, None).await;
    assert_eq!(names(&b.bmc.take()), ["finish_boot(PowerOff)"]);
    assert_eq!(m.system_uuid.as_deref(), Some(uuid.as_str()));
    assert_eq!(m.last_error, None);
    assert_finished(&emu.seen(&uuid).await, PowerState::Off);
    assert_eq!(b.cleans(id).await.len(), 1);
}
