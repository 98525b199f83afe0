//! Enrollment and inspection of machines (docs/architecture.md) through the `MachineReconciler` with the
//! Redfish driver, against the REAL Redfish emulator that `scripts/test` starts (sushy-tools,
//! `PADDOCK_TEST_REDFISH_*`). Without the emulator (or, for the wrong password, without its
//! authentication) these tests skip ([`skip`]: a notice, or a failure under `CI=true`). One test uses a fake driver: the emulator
//! reports no CPU or memory, so it cannot contradict a class.

use std::sync::Arc;
use std::time::Duration;

use paddock_domain::bmc::{
    AfterBoot, BmcAccess, BmcDriver, BmcError, BmcErrorKind, BootMedia, BoxFuture, Inventory, InventoryDrive,
    OutOfBandErase, PowerProgress,
};
use paddock_domain::job_kind::MACHINE_RECONCILE;
use paddock_domain::model::{Bmc, Machine};
use paddock_domain::secret::{Binding, Cipher};
use paddock_redfish::{BmcLimiter, RedfishBmc};
use paddock_store::{machine, machine_class, Store};
use paddock_testkit::skip;
use paddock_types::machine::MachineState;
use paddock_types::machine_class::MachineClassCreate;
use paddock_types::{Labels, MachineClassId, MachineId};
use paddock_worker::reconcile::{Drivers, MachineReconciler, Settings, BMC_FIX_WAIT};
use paddock_worker::{JobHandler, Outcome};

use crate::emulator::{emulator, Emulator};
use crate::support::*;

impl Emulator {
    /// The UUID of the emulator's `n`-th system (sorted by `Id`), read through the client: the
    /// emulator's fake systems are named by UUID, and asking without a system id lists them.
    async fn uuid_at(&self, n: usize) -> String {
        let mut ids = self.system_ids().await;
        ids.sort();
        let id = ids.get(n).expect("enough systems").clone();
        let inv = self.client(&id).system().await.expect("system");
        inv.uuid.expect("the emulator reports UUIDs").as_str().to_owned()
    }
}

/// The machine reconciler with `bmc` as its only driver and no wipe image configured: inspected
/// machines stop in cleaning with `wipe_image_not_configured`.
fn reconciler(store: &Store, cipher: &Arc<Cipher>, bmc: Arc<dyn BmcDriver>) -> MachineReconciler {
    let services = paddock_service::Services::new(store.clone(), cipher.clone(), paddock_testkit::ledger_key());
    MachineReconciler::new(services, Drivers { bmc: Some(bmc), kube: None }, Settings::default())
}

fn cipher() -> Arc<Cipher> {
    Arc::new(Cipher::new(&Cipher::generate_key(), &[]).expect("cipher"))
}

/// A class the emulator cannot contradict (it reports neither CPU nor memory).
async fn class(store: &Store, cpu: u32, memory: u32) {
    let mut conn = store.conn().await.expect("conn");
    let spec = MachineClassCreate {
        name: "metal".into(),
        cpu_cores: cpu,
        memory_gib: memory,
        gpu_model: String::new(),
        gpu_count: 0,
        description: String::new(),
        price: None,
        acceptance: None,
    };
    machine_class::insert(&mut conn, MachineClassId::new(), &spec).await.expect("class");
}

/// Enrolls a machine `m1` of class `metal` (inserted in `enrolling`), its password sealed by
/// `cipher`.
async fn enroll(
    store: &Store,
    cipher: &Cipher,
    url: &str,
    system_id: Option<&str>,
    user: &str,
    password: &str,
) -> MachineId {
    enroll_as(store, cipher, "m1", url, system_id, user, password).await
}

/// [`enroll`] under `name`.
async fn enroll_as(
    store: &Store,
    cipher: &Cipher,
    name: &str,
    url: &str,
    system_id: Option<&str>,
    user: &str,
    password: &str,
) -> MachineId {
    let mut conn = store.conn().await.expect("conn");
    let class = machine_class::get_by_name(&mut conn, "metal").await.expect("get").expect("class");
    let id = MachineId::new();
    let binding = Binding { table: "machines", column: "bmc_password_enc", row: id.uuid() };
    let bmc = Bmc {
        url: url.to_owned(),
        system_id: system_id.map(str::to_owned),
        username: user.to_owned(),
        password_enc: cipher.seal(password.as_bytes(), binding).expect("seal"),
        ca_cert: None,
        insecure_tls: false,
        allow_insecure_http: true,
    };
    let labels = Labels::default();
    let new = machine::NewMachine { id, name, machine_class_id: class.id, labels: &labels, bmc: &bmc };
    machine::insert(&mut conn, &new).await.expect("insert machine");
    id
}

async fn load(store: &Store, id: MachineId) -> Machine {
    let mut conn = store.conn().await.expect("conn");
    machine::get(&mut conn, id).await.expect("get").expect("machine")
}

/// Runs the handler once on a job loaded from the queue.
async fn run(reconciler: &MachineReconciler, store: &Store, id: MachineId) -> Outcome {
    let job_id = enqueue(store, &new_job(MACHINE_RECONCILE, id.uuid())).await;
    let job = get(store, job_id).await;
    tokio::time::timeout(Duration::from_secs(60), reconciler.run(&job)).await.expect("the run ends")
}

fn redfish() -> Arc<dyn BmcDriver> {
    Arc::new(RedfishBmc::new(BmcLimiter::new(4)).with_tuning(|c| {
        c.connect_timeout = Duration::from_secs(2);
        c.request_timeout = Duration::from_secs(5);
        c.retries = 1;
    }))
}

fn wait_code(outcome: &Outcome) -> (Duration, String) {
    match outcome {
        Outcome::Wait { after, reason, .. } => (*after, reason.code.clone()),
        other => panic!("expected a wait, got {other:?}"),
    }
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array().expect("array").iter().map(|s| s.as_str().expect("string").to_owned()).collect()
}

#[tokio::test]
async fn enrolling_machine_is_inspected_and_waits_in_cleaning() {
    let emu = require!(emulator("inspection tests"));
    let (_db, store) = db().await;
    let cipher = cipher();
    class(&store, 64, 512).await;
    let uuid = emu.uuid_at(13).await;
    let id = enroll(&store, &cipher, &emu.url, Some(&uuid.to_uppercase()), &emu.user, &emu.password).await;
    let reconciler = reconciler(&store, &cipher, redfish());

    let outcome = run(&reconciler, &store, id).await;
    assert_eq!(wait_code(&outcome).1, "wipe_image_not_configured");
    let m = load(&store, id).await;
    assert_eq!(m.state, MachineState::Cleaning);
    assert_eq!(m.system_uuid.as_deref(), Some(uuid.as_str()));
    assert_eq!(m.last_error.as_ref().map(|e| e.code.as_str()), Some("wipe_image_not_configured"));
    assert_eq!(m.inventory["system_uuid"], uuid.as_str());
    let drives: Vec<&str> =
        m.inventory["drives"].as_array().expect("drives").iter().map(|d| d["id"].as_str().expect("id")).collect();
    assert_eq!(drives, ["nvme0", "nvme1"]);
    let verified = strings(&m.inventory["verification"]["verified"]);
    let unverified = strings(&m.inventory["verification"]["unverified"]);
    assert!(verified.contains(&"drives".to_owned()), "{verified:?}");
    for f in ["cpu_cores", "memory_gib", "gpu"] {
        assert!(unverified.contains(&f.to_owned()), "{f} in {unverified:?}");
    }
    assert!(strings(&m.inventory["verification"]["mismatches"]).is_empty());
    // enrolling -> (inventory) -> inspecting -> cleaning, the wipe run, the missing image: five
    // guarded status writes.
    assert_eq!(m.status_version, 6);
    assert_eq!(m.generation, 1, "status writes never bump the generation");

    // Again, from the top: nothing changes, and the job waits again.
    let outcome = run(&reconciler, &store, id).await;
    assert_eq!(wait_code(&outcome).1, "wipe_image_not_configured");
    let again = load(&store, id).await;
    assert_eq!(again.state, MachineState::Cleaning);
    assert_eq!(again.status_version, m.status_version);
    assert_eq!(again.inventory, m.inventory);
}

#[tokio::test]
async fn a_crash_after_inspecting_resumes() {
    let emu = require!(emulator("inspection tests"));
    let (_db, store) = db().await;
    let cipher = cipher();
    class(&store, 64, 512).await;
    let uuid = emu.uuid_at(14).await;
    let id = enroll(&store, &cipher, &emu.url, Some(&uuid), &emu.user, &emu.password).await;
    // As if an earlier run moved it to inspecting and died before recording anything else.
    let m = load(&store, id).await;
    let mut conn = store.conn().await.expect("conn");
    assert!(machine::transition(
        &mut conn,
        &paddock_testkit::ledger_key(),
        id,
        MachineState::Enrolling,
        m.status_version,
        MachineState::Inspecting
    )
    .await
    .expect("transition"));
    drop(conn);
    let reconciler = reconciler(&store, &cipher, redfish());
    let outcome = run(&reconciler, &store, id).await;
    assert_eq!(wait_code(&outcome).1, "wipe_image_not_configured");
    let m = load(&store, id).await;
    assert_eq!(m.state, MachineState::Cleaning);
    assert_eq!(m.system_uuid.as_deref(), Some(uuid.as_str()));
}

#[tokio::test]
async fn wrong_password_keeps_the_machine_enrolling_without_a_retry_storm() {
    let emu = require!(emulator("inspection tests"));
    if emu.user.is_empty() {
        skip::skip("the emulator runs without authentication (PADDOCK_TEST_REDFISH_USER is empty)");
        return;
    }
    let (_db, store) = db().await;
    let cipher = cipher();
    class(&store, 64, 512).await;
    let uuid = emu.uuid_at(13).await;
    let id = enroll(&store, &cipher, &emu.url, Some(&uuid), &emu.user, "not-the-password").await;
    let reconciler = reconciler(&store, &cipher, redfish());

    let outcome = run(&reconciler, &store, id).await;
    let (after, code) = wait_code(&outcome);
    assert_eq!(code, "bmc_auth_failed");
    assert!(after >= Duration::from_secs(3600) && after == BMC_FIX_WAIT, "{after:?}");
    let m = load(&store, id).await;
    assert_eq!(m.state, MachineState::Enrolling);
    assert_eq!(m.last_error.as_ref().map(|e| e.code.as_str()), Some("bmc_auth_failed"));
    assert_eq!(m.system_uuid, None);

    // Running again records nothing new (same code and message: no churn).
    let outcome = run(&reconciler, &store, id).await;
    assert_eq!(wait_code(&outcome).1, "bmc_auth_failed");
    assert_eq!(load(&store, id).await.status_version, m.status_version);
}

#[tokio::test]
async fn several_systems_without_system_id_is_ambiguous() {
    let emu = require!(emulator("inspection tests"));
    let (_db, store) = db().await;
    let cipher = cipher();
    class(&store, 64, 512).await;
    let id = enroll(&store, &cipher, &emu.url, None, &emu.user, &emu.password).await;
    let reconciler = reconciler(&store, &cipher, redfish());

    let outcome = run(&reconciler, &store, id).await;
    let (after, code) = wait_code(&outcome);
    assert_eq!(code, "bmc_system_ambiguous");
    assert_eq!(after, BMC_FIX_WAIT);
    let m = load(&store, id).await;
    assert_eq!(m.state, MachineState::Enrolling);
    assert_eq!(m.last_error.as_ref().map(|e| e.code.as_str()), Some("bmc_system_ambiguous"));
}

/// A driver that reports fixed hardware (the emulator reports no CPU or memory).
struct Fixed(Inventory);

impl BmcDriver for Fixed {
    fn inspect<'a>(&'a self, _: &'a BmcAccess) -> BoxFuture<'a, Result<Inventory, BmcError>> {
        Box::pin(async move { Ok(self.0.clone()) })
    }

    fn boot_from_media<'a>(&'a self, _: &'a BmcAccess, _: &'a BootMedia) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async { Err(BmcError::new(BmcErrorKind::Permanent, "not_in_this_test", "inspection only")) })
    }

    fn finish_boot<'a>(&'a self, _: &'a BmcAccess, _: AfterBoot) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async { Err(BmcError::new(BmcErrorKind::Permanent, "not_in_this_test", "inspection only")) })
    }

    fn power_off<'a>(&'a self, _: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async { Err(BmcError::new(BmcErrorKind::Permanent, "not_in_this_test", "inspection only")) })
    }
}

#[tokio::test]
async fn inventory_contradicting_the_class_goes_to_maintenance() {
    let (_db, store) = db().await;
    let cipher = cipher();
    class(&store, 64, 512).await;
    let id = enroll(&store, &cipher, "http://127.0.0.1:9", Some("x"), "u", "p").await;
    let inventory = Inventory {
        system_uuid: "0b1e4a3c-0000-4000-8000-000000000001".into(),
        serial: Some("S1".into()),
        model: None,
        manufacturer: None,
        power_on: Some(false),
        cpu_cores: Some(32),
        memory_gib: Some(512),
        drives: Some(vec![InventoryDrive {
            id: "d0".into(),
            capacity_bytes: Some(1),
            model: None,
            serial: None,
            protocol: None,
        }]),
    };
    let reconciler = reconciler(&store, &cipher, Arc::new(Fixed(inventory)));
    let outcome = run(&reconciler, &store, id).await;
    assert!(matches!(outcome, Outcome::Done), "{outcome:?}");
    let m = load(&store, id).await;
    assert_eq!(m.state, MachineState::Maintenance);
    let reason = m.maintenance_reason.expect("reason");
    assert!(reason.contains("cpu_cores: the class requires 64, the BMC reports 32"), "{reason}");
    assert!(strings(&m.inventory["verification"]["verified"]).contains(&"memory_gib".to_owned()));
    // Again: it stays where it is.
    let version = m.status_version;
    assert!(matches!(run(&reconciler, &store, id).await, Outcome::Done));
    assert_eq!(load(&store, id).await.status_version, version);
}

#[tokio::test]
async fn an_unreachable_bmc_is_transient_and_retried() {
    let (_db, store) = db().await;
    let cipher = cipher();
    class(&store, 64, 512).await;
    // Nothing listens on the discard port of the loopback address: connection refused.
    let id = enroll(&store, &cipher, "http://127.0.0.1:9", None, "u", "p").await;
    let reconciler = reconciler(&store, &cipher, redfish());
    match run(&reconciler, &store, id).await {
        Outcome::Retry { error, .. } => assert_eq!(error.code, "bmc_unreachable"),
        other => panic!("expected a retry, got {other:?}"),
    }
    let m = load(&store, id).await;
    assert_eq!(m.state, MachineState::Enrolling);
    assert_eq!(m.last_error.as_ref().map(|e| e.code.as_str()), Some("bmc_unreachable"));
}

/// A driver that reads through `inner` and refuses (and notes) every call that would act on the
/// server: power, boot, media, erase.
struct ReadOnly {
    inner: Arc<dyn BmcDriver>,
    acted: std::sync::Mutex<Vec<&'static str>>,
}

impl ReadOnly {
    fn refuse(&self, call: &'static str) -> BmcError {
        self.acted.lock().expect("lock").push(call);
        BmcError::new(BmcErrorKind::Permanent, "not_in_this_test", "this test allows no action on the server")
    }

    fn acted(&self) -> Vec<&'static str> {
        self.acted.lock().expect("lock").clone()
    }
}

impl BmcDriver for ReadOnly {
    fn inspect<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<Inventory, BmcError>> {
        self.inner.inspect(access)
    }

    fn boot_from_media<'a>(&'a self, _: &'a BmcAccess, _: &'a BootMedia) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async { Err(self.refuse("boot_from_media")) })
    }

    fn finish_boot<'a>(&'a self, _: &'a BmcAccess, _: AfterBoot) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async { Err(self.refuse("finish_boot")) })
    }

    fn start_boot_from_media<'a>(
        &'a self,
        _: &'a BmcAccess,
        _: &'a BootMedia,
    ) -> BoxFuture<'a, Result<PowerProgress, BmcError>> {
        Box::pin(async { Err(self.refuse("start_boot_from_media")) })
    }

    fn start_finish_boot<'a>(
        &'a self,
        _: &'a BmcAccess,
        _: AfterBoot,
    ) -> BoxFuture<'a, Result<PowerProgress, BmcError>> {
        Box::pin(async { Err(self.refuse("start_finish_boot")) })
    }

    fn power_off<'a>(&'a self, _: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async { Err(self.refuse("power_off")) })
    }

    fn power_on<'a>(&'a self, _: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async { Err(self.refuse("power_on")) })
    }

    fn erase_out_of_band<'a>(&'a self, _: &'a BmcAccess) -> BoxFuture<'a, Result<Vec<OutOfBandErase>, BmcError>> {
        Box::pin(async { Err(self.refuse("erase_out_of_band")) })
    }
}

/// The same server enrolled twice, under another spelling of its BMC's address (which the
/// enrollment check cannot see through): the record inspected second finds the UUID held, stops
/// in `inspecting` with `duplicate_system` before any action on the server (a wipe would power
/// off the first record's machine, perhaps serving a tenant), and can only be retired.
#[tokio::test]
async fn a_server_enrolled_twice_is_stopped_before_any_power_action_and_can_only_be_retired() {
    let emu = require!(emulator("inspection tests"));
    let (_db, store) = db().await;
    let cipher = cipher();
    class(&store, 64, 512).await;
    let uuid = emu.uuid_at(13).await;
    let url = paddock_redfish::Url::parse(&emu.url).expect("emulator url");
    let host = url.host_str().expect("host");
    let other = if host == "localhost" { "127.0.0.1" } else { "localhost" };
    let other_url = emu.url.replacen(host, other, 1);
    let first = enroll_as(&store, &cipher, "first", &emu.url, Some(&uuid), &emu.user, &emu.password).await;
    let second = enroll_as(&store, &cipher, "second", &other_url, Some(&uuid), &emu.user, &emu.password).await;

    // The first record is inspected as usual (it waits in cleaning for the missing wipe image).
    let outcome = run(&reconciler(&store, &cipher, redfish()), &store, first).await;
    assert_eq!(wait_code(&outcome).1, "wipe_image_not_configured");
    let held = load(&store, first).await;
    assert_eq!(held.system_uuid.as_deref(), Some(uuid.as_str()));

    // The second, with a wipe image configured: it would boot the wipe at once if it got there.
    let watched = Arc::new(ReadOnly { inner: redfish(), acted: std::sync::Mutex::default() });
    let services = paddock_service::Services::new(store.clone(), cipher.clone(), paddock_testkit::ledger_key());
    let settings = Settings { wipe_image_url: Some("http://127.0.0.1:9/wipe.iso".into()), ..Settings::default() };
    let drivers = Drivers { bmc: Some(watched.clone()), kube: None };
    let strict = MachineReconciler::new(services, drivers, settings);
    let outcome = run(&strict, &store, second).await;
    assert!(matches!(outcome, Outcome::Done), "{outcome:?}");
    let m = load(&store, second).await;
    assert_eq!(m.state, MachineState::Inspecting);
    assert_eq!(m.duplicate_of, Some(first));
    let error = m.last_error.as_ref().expect("an error");
    assert_eq!(error.code, "duplicate_system");
    assert!(error.message.contains(&uuid) && error.message.contains("first"), "{}", error.message);
    assert_eq!(m.system_uuid, None, "the UUID stays with the record that holds it");
    assert_eq!(watched.acted(), Vec::<&str>::new(), "nothing may act on the server");

    // Again: it stays where it is, and still nothing acts on the server.
    assert!(matches!(run(&strict, &store, second).await, Outcome::Done));
    assert_eq!(load(&store, second).await.status_version, m.status_version);
    assert_eq!(watched.acted(), Vec::<&str>::new());

    // The finding is on the record's ledger.
    let mut conn = store.conn().await.expect("conn");
    let entries = paddock_store::custody::entries(&mut conn, second).await.expect("entries");
    let last = entries.last().expect("an entry");
    assert_eq!(last.evidence["code"], "duplicate_system");
    assert_eq!(last.evidence["system_uuid"], uuid.as_str());

    // Retirement is what it takes, from where it stopped; the first record is untouched.
    machine::set_retire_intent(&mut conn, second).await.expect("retire intent");
    drop(conn);
    assert!(matches!(run(&strict, &store, second).await, Outcome::Done));
    assert_eq!(load(&store, second).await.state, MachineState::Retired);
    assert_eq!(watched.acted(), Vec::<&str>::new());
    let first_now = load(&store, first).await;
    assert_eq!((first_now.state, first_now.status_version), (held.state, held.status_version));
}
