//! The power sync with the REAL Redfish driver against the REAL Redfish emulator
//! (sushy-tools, started by `scripts/test`, `PADDOCK_TEST_REDFISH_*`): a machine powered on behind
//! paddock's back is powered off again; a check that finds it right resets the count; drift that
//! keeps coming back takes the machine to maintenance with reason `power_drift`, recorded (and
//! sealed) in the custody ledger.
//!
//! The test plays the person at the BMC: it powers the system on with the Redfish client between
//! the power sync's rounds. Each round runs the handler on the jobs of the queue, as a worker
//! would (claim, run, complete): first the fleet job, then the correction jobs it enqueued.
//!
//! System of the main emulator used here: `node-000`. No other test of this binary uses it (the
//! Redfish client's power test, in another test binary, owns it there; test binaries run one
//! after another); it ends Off, as the emulator starts it. Without the emulator this test skips
//! with a notice, except under `CI=true`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use paddock_domain::bmc::{
    AfterBoot, BmcAccess, BmcDriver, BmcError, BmcErrorKind, BmcHealth, BootMedia, BoxFuture, Inventory, SystemStatus,
};
use paddock_domain::job_kind::{MACHINE_RECONCILE, POWER_SYNC};
use paddock_domain::model::{Bmc, Machine};
use paddock_domain::secret::{Binding, Cipher};
use paddock_redfish::{BmcLimiter, PowerState, RedfishBmc, SystemUuid};
use paddock_store::job::{self, Job};
use paddock_store::{custody, machine, machine_class, power, Store};
use paddock_types::machine::MachineState;
use paddock_types::machine_class::MachineClassCreate;
use paddock_types::{Labels, MachineClassId, MachineId};
use paddock_worker::reconcile::{Drivers, PowerSync, PowerSyncSettings, POWER_DRIFT};
use paddock_worker::{JobHandler, Outcome};
use serde_json::json;
use uuid::Uuid;

use crate::emulator::{emulator, Emulator};
use crate::support::{claim, db, enqueue, init_tracing, new_job};

/// The allocation head timeout (`PADDOCK_ALLOCATION_HEAD_TIMEOUT`) at its default.
const HEAD: std::time::Duration = std::time::Duration::from_secs(600);

const SYSTEM: &str = "node-000";
const WORKER: &str = "power-test-worker";

impl Emulator {
    /// Sets the power behind paddock's back, and waits until the emulator shows it.
    async fn set_power(&self, uuid: &str, target: PowerState) {
        self.client(uuid).power(&SystemUuid::new(uuid), target).await.expect("power");
        assert_eq!(self.power(uuid).await, Some(target));
    }

    async fn power(&self, uuid: &str) -> Option<PowerState> {
        self.client(uuid).system().await.expect("system").power_state.and_then(|p| p.settled())
    }
}

fn redfish() -> Arc<dyn BmcDriver> {
    Arc::new(RedfishBmc::new(BmcLimiter::new(4)).with_tuning(|c| {
        c.connect_timeout = Duration::from_secs(2);
        c.request_timeout = Duration::from_secs(10);
        c.retries = 1;
    }))
}

/// An `available` machine on the emulator's system `uuid`: inserted, then moved there with a
/// clean on record (a fixture: the lifecycle that gets it there is tested elsewhere).
async fn available_machine(store: &Store, cipher: &Cipher, emu: &Emulator, uuid: &str) -> MachineId {
    let mut conn = store.conn().await.expect("conn");
    let spec = MachineClassCreate {
        name: "metal".into(),
        cpu_cores: 64,
        memory_gib: 512,
        gpu_model: String::new(),
        gpu_count: 0,
        description: String::new(),
        price: None,
        acceptance: None,
    };
    let class = MachineClassId::new();
    machine_class::insert(&mut conn, class, &spec).await.expect("class");
    let id = MachineId::new();
    let binding = Binding { table: "machines", column: "bmc_password_enc", row: id.uuid() };
    let bmc = Bmc {
        url: emu.url.clone(),
        system_id: Some(uuid.to_owned()),
        username: emu.user.clone(),
        password_enc: cipher.seal(emu.password.as_bytes(), binding).expect("seal"),
        ca_cert: None,
        insecure_tls: false,
        allow_insecure_http: true,
    };
    let labels = Labels::default();
    let new = machine::NewMachine { id, name: "pw-1", machine_class_id: class, labels: &labels, bmc: &bmc };
    machine::insert(&mut conn, &new).await.expect("insert machine");
    let clean = Uuid::new_v4();
    sqlx::query(
        "insert into machine_cleans (id, machine_id, run_id, method, evidence) values ($1, $2, $3, 'agent', '{}')",
    )
    .bind(clean)
    .bind(id.uuid())
    .bind(Uuid::new_v4())
    .execute(&mut *conn)
    .await
    .expect("clean");
    sqlx::query("update machines set state = 'available', system_uuid = $2, clean_id = $3 where id = $1")
        .bind(id.uuid())
        .bind(uuid)
        .bind(clean)
        .execute(&mut *conn)
        .await
        .expect("available");
    id
}

async fn load(store: &Store, id: MachineId) -> Machine {
    let mut conn = store.conn().await.expect("conn");
    machine::get(&mut conn, id).await.expect("get").expect("machine")
}

async fn drift_count(store: &Store, id: MachineId) -> u32 {
    let mut conn = store.conn().await.expect("conn");
    power::drift_count(&mut conn, id).await.expect("drift count")
}

/// Runs every due `power_sync` job once, as a worker would: claim, run, complete. Returns the
/// target types run with their outcomes.
async fn run_due(store: &Store, sync: &PowerSync) -> Vec<(String, Outcome)> {
    let jobs: Vec<Job> = claim(store, WORKER, &[POWER_SYNC], Duration::from_secs(60), 16).await;
    let mut ran = Vec::new();
    for job in jobs {
        let outcome = tokio::time::timeout(Duration::from_secs(60), sync.run(&job)).await.expect("the run ends");
        // Completed whatever the outcome: each round starts with a fresh fleet job.
        job::complete(store, job.id, WORKER).await.expect("complete");
        ran.push((job.target_type.clone(), outcome));
    }
    ran
}

/// One round of the power sync: the fleet job's check, then the corrections it enqueued.
/// Returns the target types of the corrections run (`machine`).
async fn round(store: &Store, sync: &PowerSync) -> Vec<String> {
    {
        let mut tx = store.begin().await.expect("begin");
        power::enqueue_fleet_job(&mut tx).await.expect("enqueue fleet job");
        tx.commit().await.expect("commit");
    }
    let scan = run_due(store, sync).await;
    assert_eq!(scan.len(), 1, "the fleet job alone: {scan:?}");
    assert_eq!(scan[0].0, "fleet");
    assert!(matches!(scan[0].1, Outcome::Wait { .. }), "the fleet job waits for the next round: {scan:?}");
    let corrections = run_due(store, sync).await;
    for (_, outcome) in &corrections {
        assert!(matches!(outcome, Outcome::Done), "{corrections:?}");
    }
    corrections.into_iter().map(|(t, _)| t).collect()
}

#[tokio::test]
async fn power_drift_is_corrected_and_repeated_drift_lands_in_maintenance() {
    let Some(emu) = emulator("power sync tests") else { return };
    init_tracing();
    let (_db, store) = db().await;
    let cipher = Arc::new(Cipher::new(&Cipher::generate_key(), &[]).expect("cipher"));
    let services = paddock_service::Services::new(store.clone(), cipher.clone(), paddock_testkit::ledger_key());
    let uuid = emu.uuid_of(SYSTEM).await;
    emu.set_power(&uuid, PowerState::Off).await;
    let id = available_machine(&store, &cipher, &emu, &uuid).await;
    // Every machine is due at every round; three corrections in a row, the fourth drift is one
    // too many.
    let settings = PowerSyncSettings { interval: Duration::ZERO, max_corrections: 3, ..PowerSyncSettings::default() };
    let sync = PowerSync::new(services, Drivers { bmc: Some(redfish()), kube: None }, settings);

    // At rest and right: a read, nothing to correct.
    assert!(round(&store, &sync).await.is_empty());
    assert_eq!(emu.power(&uuid).await, Some(PowerState::Off));
    let version = load(&store, id).await.status_version;

    // Powered on behind paddock's back: corrected, the drift counted; the status is untouched.
    emu.set_power(&uuid, PowerState::On).await;
    assert_eq!(round(&store, &sync).await, ["machine"]);
    assert_eq!(emu.power(&uuid).await, Some(PowerState::Off), "the drift is corrected");
    assert_eq!(drift_count(&store, id).await, 1);
    let m = load(&store, id).await;
    assert_eq!((m.state, m.status_version), (MachineState::Available, version), "bookkeeping only");

    // A check that finds it right resets the count.
    assert!(round(&store, &sync).await.is_empty());
    assert_eq!(drift_count(&store, id).await, 0);

    // A machine with its own job open is left to it: no check, no correction.
    let reconcile = enqueue(&store, &new_job(MACHINE_RECONCILE, id.uuid())).await;
    emu.set_power(&uuid, PowerState::On).await;
    assert!(round(&store, &sync).await.is_empty());
    assert_eq!(emu.power(&uuid).await, Some(PowerState::On), "left alone while its reconcile is open");
    sqlx::query("update jobs set state = 'cancelled', finished_at = now() where id = $1")
        .bind(reconcile.uuid())
        .execute(store.pool())
        .await
        .expect("cancel");

    // Drift that keeps coming back: corrected three times in a row...
    for n in 1..=3 {
        emu.set_power(&uuid, PowerState::On).await;
        assert_eq!(round(&store, &sync).await, ["machine"], "drift {n}");
        assert_eq!(emu.power(&uuid).await, Some(PowerState::Off), "drift {n} is corrected");
        assert_eq!(drift_count(&store, id).await, n);
        assert_eq!(load(&store, id).await.state, MachineState::Available);
    }

    // ...and the fourth time the machine goes to maintenance, with the reason and a ledger entry.
    emu.set_power(&uuid, PowerState::On).await;
    assert_eq!(round(&store, &sync).await, ["machine"]);
    let m = load(&store, id).await;
    assert_eq!(m.state, MachineState::Maintenance);
    assert_eq!(m.maintenance_reason.as_deref(), Some(POWER_DRIFT));
    assert_eq!(m.last_error.as_ref().map(|e| e.code.as_str()), Some(POWER_DRIFT));
    let entries = custody::entries(&mut store.conn().await.expect("conn"), id).await.expect("entries");
    let last = entries.last().expect("a ledger entry");
    assert_eq!((last.from.as_deref(), last.to.as_str()), (Some("available"), "maintenance"));
    assert_eq!(last.actor, custody::WORKER_ACTOR);
    assert!(last.reason.contains("powered on instead of off"), "{}", last.reason);
    assert_eq!(last.evidence["code"], json!(POWER_DRIFT));
    assert_eq!(last.evidence["drift_count"], json!(4));
    assert!(last.mac.is_some(), "the entry is sealed");

    // In maintenance, off is still expected: the next drift is corrected again, from a fresh count.
    assert_eq!(round(&store, &sync).await, ["machine"]);
    assert_eq!(emu.power(&uuid).await, Some(PowerState::Off));
    assert_eq!(drift_count(&store, id).await, 1);
    assert_eq!(load(&store, id).await.state, MachineState::Maintenance);

    emu.set_power(&uuid, PowerState::Off).await;
}

// ---------------------------------------------------------------------------------------------
// An `active` machine (should be on), with a stand-in BMC: the emulator test above covers the
// Redfish side; this one covers what the power sync does to a machine that holds a tenancy.

/// A BMC whose system's power the test sets; it counts the power sync's calls.
#[derive(Default)]
struct FakeBmc {
    on: Mutex<bool>,
    health: Mutex<Option<BmcHealth>>,
    power_ons: AtomicUsize,
}

impl FakeBmc {
    fn set(&self, on: bool) {
        *self.on.lock().expect("lock") = on;
    }

    fn is_on(&self) -> bool {
        *self.on.lock().expect("lock")
    }
}

fn not_here<T>() -> Result<T, BmcError> {
    Err(BmcError::new(BmcErrorKind::Permanent, "not_in_this_test", "the power sync does not make this call"))
}

impl BmcDriver for FakeBmc {
    fn inspect<'a>(&'a self, _: &'a BmcAccess) -> BoxFuture<'a, Result<Inventory, BmcError>> {
        Box::pin(async { not_here() })
    }

    fn boot_from_media<'a>(&'a self, _: &'a BmcAccess, _: &'a BootMedia) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async { not_here() })
    }

    fn finish_boot<'a>(&'a self, _: &'a BmcAccess, _: AfterBoot) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async { not_here() })
    }

    fn power_off<'a>(&'a self, _: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async {
            self.set(false);
            Ok(())
        })
    }

    fn power_on<'a>(&'a self, _: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async {
            self.power_ons.fetch_add(1, Ordering::SeqCst);
            self.set(true);
            Ok(())
        })
    }

    fn system_status<'a>(&'a self, _: &'a BmcAccess) -> BoxFuture<'a, Result<SystemStatus, BmcError>> {
        Box::pin(async {
            let health = self.health.lock().expect("lock").clone();
            Ok(SystemStatus { power_on: Some(self.is_on()), health })
        })
    }
}

/// An `active` machine held by a tenant's cluster (a fixture: allocated through the store, then
/// marked provisioned), with no job of its own open; and the tenant and cluster.
async fn active_machine(app: &paddock_testkit::TestApp, store: &Store) -> (MachineId, Uuid, Uuid) {
    use paddock_store::allocation::{self, Allocation, Need};
    use paddock_testkit::admin;
    use paddock_types::{ClusterId, NodePoolId, TenantId};

    let emu = Emulator { url: "https://bmc.invalid".into(), user: "u".into(), password: "p".into() };
    let system = "6f6b0c2e-4b0e-4f43-9a51-000000000001";
    let id = available_machine(store, &app.cipher, &emu, system).await;
    let class: Uuid = sqlx::query_scalar("select machine_class_id from machines where id = $1")
        .bind(id.uuid())
        .fetch_one(store.pool())
        .await
        .expect("class");

    // A tenant's cluster with one pool of `metal`; the machine is allocated to it and active.
    let t = app.post("/v1/tenants").token(&admin()).json(&json!({ "name": "acme" })).send().await.expect(201);
    let tenant = Uuid::parse_str(t.json()["id"].as_str().expect("id")).expect("uuid");
    let body = json!({
        "name": "c1", "kind": "kubernetes", "isolation": "private-nodes",
        "node_pools": [{ "name": "p", "machine_class": "metal", "count": 1 }],
    });
    app.post(format!("/v1/tenants/{tenant}/clusters")).token(&admin()).json(&body).send().await.expect(202);
    let (cluster, pool): (Uuid, Uuid) = sqlx::query_as(
        "select c.id, p.id from clusters c join node_pools p on p.cluster_id = c.id where c.tenant_id = $1",
    )
    .bind(tenant)
    .fetch_one(store.pool())
    .await
    .expect("cluster and pool");
    let need = Need { node_pool_id: NodePoolId(pool), machine_class_id: MachineClassId(class), gpu_count: 0, count: 1 };
    let mut tx = store.begin().await.expect("begin");
    let allocated = allocation::allocate(
        &mut tx,
        &paddock_testkit::ledger_key(),
        TenantId(tenant),
        ClusterId(cluster),
        &[need],
        HEAD,
    )
    .await
    .expect("allocate");
    tx.commit().await.expect("commit");
    assert_eq!(allocated, Allocation::Allocated(vec![id]));
    // Provisioned (a fixture): active, with no job of its own open.
    sqlx::query("update machines set state = 'active', node_name = 'n1' where id = $1")
        .bind(id.uuid())
        .execute(store.pool())
        .await
        .expect("active");
    sqlx::query("update jobs set state = 'cancelled', finished_at = now() where target_id = $1 and state = 'queued'")
        .bind(id.uuid())
        .execute(store.pool())
        .await
        .expect("no open job");

    (id, tenant, cluster)
}

#[tokio::test]
async fn an_active_machine_that_keeps_powering_off_is_released_into_maintenance() {
    init_tracing();
    let app = paddock_testkit::TestApp::new().await;
    let store = Store::from_pool(app.db.pool.clone());
    let (id, _, _) = active_machine(&app, &store).await;

    let bmc = Arc::new(FakeBmc::default());
    let settings = PowerSyncSettings { interval: Duration::ZERO, max_corrections: 3, ..PowerSyncSettings::default() };
    let sync = PowerSync::new(app.services.clone(), Drivers { bmc: Some(bmc.clone()), kube: None }, settings);

    // On, as an active machine should be: nothing to do.
    bmc.set(true);
    assert!(round(&store, &sync).await.is_empty());

    // Powered off behind paddock's back, three times in a row: powered on again each time.
    for n in 1..=3 {
        bmc.set(false);
        assert_eq!(round(&store, &sync).await, ["machine"], "drift {n}");
        assert!(bmc.is_on(), "drift {n} is corrected");
        assert_eq!(drift_count(&store, id).await, n);
    }
    assert_eq!(bmc.power_ons.load(Ordering::SeqCst), 3);

    // The fourth time: a tenancy ends through cleaning, so the machine gets the maintenance
    // intent and its reconcile job, which releases it; the power sync powers nothing on.
    let before = load(&store, id).await;
    bmc.set(false);
    assert_eq!(round(&store, &sync).await, ["machine"]);
    assert!(!bmc.is_on());
    assert_eq!(bmc.power_ons.load(Ordering::SeqCst), 3);
    let m = load(&store, id).await;
    assert_eq!(m.state, MachineState::Active);
    assert_eq!(m.maintenance_reason.as_deref(), Some(POWER_DRIFT));
    assert_eq!(m.last_error.as_ref().map(|e| e.code.as_str()), Some(POWER_DRIFT));
    assert_eq!(m.generation, before.generation + 1, "an intent, like an operator's");
    let queued: i64 =
        sqlx::query_scalar("select count(*) from jobs where target_id = $1 and kind = $2 and state = 'queued'")
            .bind(id.uuid())
            .bind(MACHINE_RECONCILE)
            .fetch_one(store.pool())
            .await
            .expect("jobs");
    assert_eq!(queued, 1, "the machine reconciler takes over");

    // While its reconcile is open the power sync leaves the machine alone.
    assert!(round(&store, &sync).await.is_empty());
}

/// The BMC's rating of a held machine, read by the power sync: a change is recorded as a health
/// report (source `bmc`) against the tenancy, once per change, and the tenant reads it.
#[tokio::test]
async fn a_change_in_the_bmcs_health_rating_is_recorded_once_and_shown_to_the_tenant() {
    use paddock_types::health::HealthStatus;

    init_tracing();
    let app = paddock_testkit::TestApp::new().await;
    let store = Store::from_pool(app.db.pool.clone());
    let (id, tenant, cluster) = active_machine(&app, &store).await;
    let bmc = Arc::new(FakeBmc::default());
    bmc.set(true);
    let settings = PowerSyncSettings { interval: Duration::ZERO, ..PowerSyncSettings::default() };
    let sync = PowerSync::new(app.services.clone(), Drivers { bmc: Some(bmc.clone()), kube: None }, settings);
    let rate = |status: HealthStatus, said: &str| {
        *bmc.health.lock().expect("lock") = Some(BmcHealth { status, detail: format!("Status.HealthRollup: {said}") });
    };
    let reports = || async {
        sqlx::query_as::<_, (String, String, Option<Uuid>)>(
            "select status, source, allocation_id from machine_health_reports where machine_id = $1 order by id",
        )
        .bind(id.uuid())
        .fetch_all(store.pool())
        .await
        .expect("reports")
    };
    // Healthy is presumed: an OK rating, or none, records nothing.
    assert!(round(&store, &sync).await.is_empty());
    rate(HealthStatus::Healthy, "OK");
    assert!(round(&store, &sync).await.is_empty());
    assert!(reports().await.is_empty());
    // Critical: one report, however many checks see it.
    rate(HealthStatus::Failed, "Critical");
    for _ in 0..3 {
        round(&store, &sync).await;
    }
    let seen = reports().await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!((seen[0].0.as_str(), seen[0].1.as_str()), ("failed", "bmc"));
    assert!(seen[0].2.is_some(), "recorded against the tenancy");
    // The BMC's failure starts the machine's remediation, once, with the report as its evidence.
    let started: Vec<(String, String)> =
        sqlx::query_as("select source, state from machine_remediations where machine_id = $1")
            .bind(id.uuid())
            .fetch_all(store.pool())
            .await
            .expect("remediations");
    assert_eq!(started, [("bmc".to_owned(), "awaiting_spare".to_owned())]);
    let token = paddock_testkit::token(&["tenant:admin"], Some(tenant));
    let path = format!("/v1/tenants/{tenant}/clusters/{cluster}/machines/{id}");
    let view = app.get(&path).token(&token).send().await.expect(200).json();
    assert_eq!(view["health"], "failed", "{view}");
    let listed = app.get(format!("{path}/health-reports")).token(&token).send().await.expect(200).json();
    assert_eq!(listed["items"][0]["checks"][0]["detail"], "Status.HealthRollup: Critical", "{listed}");
    // Back to OK: one healthy report, then nothing more.
    rate(HealthStatus::Healthy, "OK");
    round(&store, &sync).await;
    round(&store, &sync).await;
    let seen: Vec<String> = reports().await.into_iter().map(|r| r.0).collect();
    assert_eq!(seen, ["failed", "healthy"]);
}
