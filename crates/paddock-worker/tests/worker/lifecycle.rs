//! The whole machine lifecycle of docs/architecture.md through the `MachineReconciler` with the REAL
//! Redfish driver against the REAL Redfish emulator (sushy-tools, started by `scripts/test`,
//! `PADDOCK_TEST_REDFISH_*`) and the real agent endpoints served on a loopback port:
//!
//! enroll -> inspect -> clean (wipe) -> available -> allocate -> provision -> active -> release ->
//! cleaning -> wipe again -> available; a failed drive -> `clean_failed`; used (409) and expired
//! (410) tokens.
//!
//! The test plays everything outside paddock: the wipe and first-boot agents (it reads the seed
//! URL, token and all, back from the emulator's virtual media, as a booted machine would find it),
//! and the tenant cluster's kubelet (`TenantStandIn`, a TEST STAND-IN for the tenant cluster's
//! API: this test is about the BMC side). The emulator downloads every inserted image, so a tiny
//! HTTP server serves the wipe and OS images, and the seed is downloaded from paddock's API.
//!
//! Systems of the main emulator owned here (see the table in paddock-redfish's tests): `node-011`
//! (the full lifecycle), `node-012` (the failed wipe) and `node-009` (the two out-of-band erase
//! tests, one after the other, through paddock-redfish's test proxy). They end Off, ejected,
//! booting from disk, as the emulator starts them. Without the emulator these tests skip with a notice, except under
//! `CI=true`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use paddock_domain::bmc::{AfterBoot, BmcAccess, BmcDriver, BmcError, BootMedia, BoxFuture, Inventory, OutOfBandErase};
use paddock_domain::driver::{
    ClusterRef, ControlPlaneBackend, ControlPlaneSpec, ControlPlaneStatus, Drain, DriverError, Isolation, JoinConfig,
    KubeDrivers, NodeRef, NodeStatus, PlatformDriver, RayDesired, RayDriver, RayStatus, RegisteredNode, Removal,
    SlurmDesired, SlurmDrain, SlurmDriver, SlurmStatus, SlurmVersion, StackStatus, TenantAccess, TenantCredentials,
    TenantNodes, TenantStack,
};
use paddock_domain::job_kind::MACHINE_RECONCILE;
use paddock_domain::model::Machine;
use paddock_domain::secret::Binding;
use paddock_redfish::{BmcLimiter, PowerState, RedfishBmc, SystemUuid};
use paddock_service::agent::AgentSettings;
use paddock_store::allocation::{self, Allocation, Need};
use paddock_store::lifecycle;
use paddock_store::{cluster, machine, run, Store};
use paddock_testkit::{admin, eventually, TestApp};
use paddock_types::cluster::ClusterKind;
use paddock_types::machine::MachineState;
use paddock_types::{ClusterId, MachineClassId, MachineId, NodePoolId, TenantId};
use paddock_worker::reconcile::{Drivers, MachineReconciler, Settings};
use paddock_worker::{JobHandler, Outcome};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uuid::Uuid;

use crate::emulator::{assert_booted, assert_finished, emulator, token_of, Emulator, Seen};
use crate::support::{enqueue, get, init_tracing, new_job};

/// The allocation head timeout (`PADDOCK_ALLOCATION_HEAD_TIMEOUT`) at its default.
const HEAD: std::time::Duration = std::time::Duration::from_secs(600);

// ---------------------------------------------------------------------------------------------
// The emulator.

impl Emulator {
    /// Reads the system's state (read-only calls).
    async fn seen(&self, uuid: &str) -> Seen {
        Seen::read(&self.client(uuid)).await
    }

    /// Puts the system back the way the emulator starts it (Off, ejected, booting from disk).
    async fn tidy(&self, uuid: &str) {
        let _ = self.client(uuid).finish_boot(&SystemUuid::new(uuid), AfterBoot::PowerOff).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The image server the emulator downloads the wipe and OS images from.

/// Serves 64 KiB for `GET /images/<name>.iso`, 404 otherwise; counts downloads per path.
struct Images {
    base: String,
    downloads: Arc<Mutex<HashMap<String, usize>>>,
}

impl Images {
    async fn start() -> Images {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind image server");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let downloads: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let counts = downloads.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else { return };
                let counts = counts.clone();
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
                    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or("").to_owned());
                    let found = path.starts_with("/images/") && path.ends_with(".iso");
                    let body = if found { crate::agent::served_image() } else { Vec::new() };
                    if found && method == "GET" {
                        *counts.lock().expect("lock").entry(path).or_default() += 1;
                    }
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
        Images { base, downloads }
    }

    fn url(&self, name: &str) -> String {
        format!("{}/images/{name}", self.base)
    }

    fn downloads(&self, name: &str) -> usize {
        self.downloads.lock().expect("lock").get(&format!("/images/{name}")).copied().unwrap_or(0)
    }
}

// ---------------------------------------------------------------------------------------------
// A TEST STAND-IN for the tenant cluster (its API server and the kubelet of the machine): hands
// out a join configuration and reports a node Ready once the test "registers" it. Only
// `TenantNodes` is used by the machine reconciler for a Kubernetes cluster; the other drivers
// refuse, so a call to them fails the test visibly.

#[derive(Default)]
struct TenantStandIn {
    /// System UUID -> registered node name.
    nodes: Mutex<HashMap<String, String>>,
    /// Join configurations handed out.
    joins: AtomicUsize,
    /// Node names removed.
    removed: Mutex<Vec<String>>,
}

impl TenantStandIn {
    /// The kubelet of the machine registers `name` with `system_uuid`, and it is Ready.
    fn register(&self, system_uuid: &str, name: &str) {
        self.nodes.lock().expect("lock").insert(system_uuid.to_ascii_lowercase(), name.to_owned());
    }

    fn has(&self, system_uuid: &str) -> bool {
        self.nodes.lock().expect("lock").contains_key(&system_uuid.to_ascii_lowercase())
    }
}

fn not_here<T>(what: &str) -> Result<T, DriverError> {
    Err(DriverError::permanent("not_in_this_test", format!("{what} is not part of the machine lifecycle test")))
}

impl TenantNodes for TenantStandIn {
    fn join_config<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
        ttl_seconds: u64,
    ) -> BoxFuture<'a, Result<JoinConfig, DriverError>> {
        Box::pin(async move {
            self.joins.fetch_add(1, Ordering::SeqCst);
            Ok(JoinConfig(json!({
                "api_endpoint": tenant.endpoint,
                "ca_cert": "-----BEGIN CERTIFICATE-----\nc3RhbmQtaW4=\n-----END CERTIFICATE-----\n",
                "ca_cert_hash": "sha256:0000000000000000000000000000000000000000000000000000000000000000",
                "api_server": tenant.endpoint,
                "bootstrap_token": "abcdef.0123456789abcdef",
                "ca_cert_hashes": ["sha256:0000000000000000000000000000000000000000000000000000000000000000"],
                "node_name": node.node_name,
                "ttl_seconds": ttl_seconds,
            })))
        })
    }

    fn node<'a>(
        &'a self,
        _tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Option<NodeStatus>, DriverError>> {
        Box::pin(async move {
            let nodes = self.nodes.lock().expect("lock");
            Ok(nodes
                .get(&node.system_uuid.to_ascii_lowercase())
                .map(|name| NodeStatus { name: name.clone(), ready: true }))
        })
    }

    fn registered_nodes<'a>(&'a self, _: &'a TenantAccess) -> BoxFuture<'a, Result<Vec<RegisteredNode>, DriverError>> {
        Box::pin(async move {
            let nodes = self.nodes.lock().expect("lock");
            let node = |(uuid, name): (&String, &String)| RegisteredNode {
                name: name.clone(),
                system_uuid: uuid.clone(),
                ready: true,
                not_ready_since: None,
            };
            Ok(nodes.iter().map(node).collect())
        })
    }

    /// The stand-in's Nodes run no pods.
    fn drain_node<'a>(&'a self, _: &'a TenantAccess, _: &'a NodeRef) -> BoxFuture<'a, Result<Drain, DriverError>> {
        Box::pin(async { Ok(Drain::Drained) })
    }

    /// Nodes are keyed by system UUID here: none can hold another machine's name.
    fn foreign_node<'a>(
        &'a self,
        _: &'a TenantAccess,
        _: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Option<String>, DriverError>> {
        Box::pin(async { Ok(None) })
    }

    fn remove_node<'a>(
        &'a self,
        _tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Removal, DriverError>> {
        Box::pin(async move {
            if let Some(name) = self.nodes.lock().expect("lock").remove(&node.system_uuid.to_ascii_lowercase()) {
                self.removed.lock().expect("lock").push(name);
            }
            Ok(Removal::Gone)
        })
    }

    fn delete_join_tokens<'a>(
        &'a self,
        _tenant: &'a TenantAccess,
        _node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async { Ok(()) })
    }

    fn abandon_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move { self.remove_node(tenant, node).await.map(|_| ()) })
    }
}

impl PlatformDriver for TenantStandIn {
    fn ensure_isolation<'a>(&'a self, _: &'a ClusterRef) -> BoxFuture<'a, Result<Isolation, DriverError>> {
        Box::pin(async { not_here("ensure_isolation") })
    }

    fn remove_isolation<'a>(&'a self, _: &'a ClusterRef) -> BoxFuture<'a, Result<Removal, DriverError>> {
        Box::pin(async { not_here("remove_isolation") })
    }
}

impl ControlPlaneBackend for TenantStandIn {
    fn ensure_control_plane<'a>(
        &'a self,
        _: &'a ControlPlaneSpec,
    ) -> BoxFuture<'a, Result<ControlPlaneStatus, DriverError>> {
        Box::pin(async { not_here("ensure_control_plane") })
    }

    fn delete_control_plane<'a>(&'a self, _: &'a ClusterRef) -> BoxFuture<'a, Result<Removal, DriverError>> {
        Box::pin(async { not_here("delete_control_plane") })
    }
}

impl TenantStack for TenantStandIn {
    fn ensure_stack<'a>(
        &'a self,
        _: &'a TenantAccess,
        _: &'a str,
        _: ClusterKind,
    ) -> BoxFuture<'a, Result<StackStatus, DriverError>> {
        Box::pin(async { not_here("ensure_stack") })
    }
}

impl TenantCredentials for TenantStandIn {
    fn tenant_kubeconfig<'a>(
        &'a self,
        _: &'a TenantAccess,
        _: u64,
    ) -> BoxFuture<'a, Result<paddock_domain::secret::SecretString, DriverError>> {
        Box::pin(async { not_here("tenant_kubeconfig") })
    }
}

impl SlurmDriver for TenantStandIn {
    fn ensure_slurm<'a>(
        &'a self,
        _: &'a TenantAccess,
        _: &'a SlurmDesired,
    ) -> BoxFuture<'a, Result<SlurmStatus, DriverError>> {
        Box::pin(async { not_here("ensure_slurm") })
    }

    fn drain_node<'a>(
        &'a self,
        _: &'a TenantAccess,
        _: &'a SlurmVersion,
        _: &'a str,
    ) -> BoxFuture<'a, Result<SlurmDrain, DriverError>> {
        Box::pin(async { not_here("drain_node") })
    }

    fn remove_slurm<'a>(&'a self, _: &'a TenantAccess) -> BoxFuture<'a, Result<Removal, DriverError>> {
        Box::pin(async { not_here("remove_slurm") })
    }
}

impl RayDriver for TenantStandIn {
    fn ensure_ray<'a>(
        &'a self,
        _: &'a TenantAccess,
        _: &'a RayDesired,
    ) -> BoxFuture<'a, Result<RayStatus, DriverError>> {
        Box::pin(async { not_here("ensure_ray") })
    }

    fn remove_ray<'a>(&'a self, _: &'a TenantAccess) -> BoxFuture<'a, Result<Removal, DriverError>> {
        Box::pin(async { not_here("remove_ray") })
    }
}

// ---------------------------------------------------------------------------------------------
// The BMC driver under test, with a log of its calls and what the emulator showed right after
// each one (so that states a single reconciler run passes through can be asserted).

struct Recording {
    inner: RedfishBmc,
    emu: Emulator,
    log: Mutex<Vec<(String, Option<Seen>)>>,
    /// Every seed URL the driver was given (the test scans for their tokens).
    seeds: Mutex<Vec<String>>,
}

impl Recording {
    fn new(emu: &Emulator) -> Arc<Recording> {
        let inner = RedfishBmc::new(BmcLimiter::new(4)).with_tuning(|c| {
            c.connect_timeout = Duration::from_secs(2);
            c.request_timeout = Duration::from_secs(10);
            c.retries = 1;
        });
        Arc::new(Recording { inner, emu: emu.clone(), log: Mutex::default(), seeds: Mutex::default() })
    }

    async fn record(&self, call: String, access: &BmcAccess, ok: bool) {
        let seen = match (&access.system_uuid, ok) {
            (Some(uuid), true) => Some(self.emu.seen(uuid).await),
            _ => None,
        };
        self.log.lock().expect("lock").push((call, seen));
    }

    /// The calls so far (names only), and clears the log.
    fn take(&self) -> Vec<(String, Option<Seen>)> {
        std::mem::take(&mut *self.log.lock().expect("lock"))
    }
}

impl BmcDriver for Recording {
    fn inspect<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<Inventory, BmcError>> {
        Box::pin(async move {
            let r = self.inner.inspect(access).await;
            self.log.lock().expect("lock").push(("inspect".to_owned(), None));
            r
        })
    }

    fn boot_from_media<'a>(
        &'a self,
        access: &'a BmcAccess,
        media: &'a BootMedia,
    ) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            self.seeds.lock().expect("lock").push(media.seed_url.expose().to_owned());
            let r = self.inner.boot_from_media(access, media).await;
            self.record("boot_from_media".to_owned(), access, r.is_ok()).await;
            r
        })
    }

    fn finish_boot<'a>(&'a self, access: &'a BmcAccess, after: AfterBoot) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            let r = self.inner.finish_boot(access, after).await;
            self.record(format!("finish_boot({after:?})"), access, r.is_ok()).await;
            r
        })
    }

    fn power_off<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            let r = self.inner.power_off(access).await;
            self.record("power_off".to_owned(), access, r.is_ok()).await;
            r
        })
    }

    /// Passed through unlogged: the emulator advertises no erase, so it changes nothing there
    /// (the clean's evidence shows that it was asked).
    fn erase_out_of_band<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<Vec<OutOfBandErase>, BmcError>> {
        self.inner.erase_out_of_band(access)
    }
}

fn calls(log: &[(String, Option<Seen>)]) -> Vec<&str> {
    log.iter().map(|(c, _)| c.as_str()).collect()
}

// ---------------------------------------------------------------------------------------------
// The bench: the API served on a port (its services carry the agent base URL), images, drivers.

struct Bench {
    app: TestApp,
    store: Store,
    emu: Emulator,
    images: Images,
    bmc: Arc<Recording>,
    tenant_side: Arc<TenantStandIn>,
}

impl Bench {
    async fn new(emu: Emulator) -> Bench {
        init_tracing();
        let digest = crate::agent::image_sha256();
        let app = TestApp::served_with(|a| AgentSettings {
            wipe_image_sha256: digest.clone(),
            os_image_sha256: digest.clone(),
            ..a
        })
        .await;
        let store = Store::from_pool(app.db.pool.clone());
        let images = Images::start().await;
        let bmc = Recording::new(&emu);
        Bench { app, store, emu, images, bmc, tenant_side: Arc::default() }
    }

    fn base_url(&self) -> &str {
        self.app.base_url.as_deref().expect("served")
    }

    fn settings(&self, token_ttl: Duration) -> Settings {
        Settings {
            wipe_image_url: Some(self.images.url("wipe.iso")),
            os_image_url: Some(self.images.url("node-os.iso")),
            agent_token_ttl: token_ttl,
            node_join_timeout: Duration::from_secs(600),
            poll: Duration::from_millis(200),
            report_wait: Duration::from_millis(500),
            ..Settings::default()
        }
    }

    fn reconciler(&self, token_ttl: Duration) -> MachineReconciler {
        let s = self.tenant_side.clone();
        let kube = KubeDrivers {
            platform: s.clone(),
            control_plane: s.clone(),
            nodes: s.clone(),
            stack: s.clone(),
            slurm: s.clone(),
            ray: s.clone(),
            credentials: s,
        };
        let drivers = Drivers { bmc: Some(self.bmc.clone()), kube: Some(kube) };
        MachineReconciler::new(self.app.services.clone(), drivers, self.settings(token_ttl))
    }

    /// A class the emulator cannot contradict (it reports neither CPU nor memory).
    async fn class(&self) -> MachineClassId {
        let body = json!({ "name": "metal", "cpu_cores": 64, "memory_gib": 512, "gpu_count": 0 });
        let class = self.app.post("/v1/machine-classes").token(&admin()).json(&body).send().await.expect(201).json();
        MachineClassId(uuid_in(&class["id"]))
    }

    /// Enrolls the emulator's system `uuid` through the API.
    async fn enroll(&self, name: &str, uuid: &str) -> MachineId {
        self.enroll_at(name, uuid, &self.emu.url).await
    }

    /// Enrolls the emulator's system `uuid`, its BMC reached at `url` (the emulator or a proxy).
    async fn enroll_at(&self, name: &str, uuid: &str, url: &str) -> MachineId {
        let body = json!({
            "name": name,
            "machine_class": "metal",
            "bmc": { "url": url, "system_id": uuid, "username": self.emu.user, "password": self.emu.password,
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
    async fn run(&self, r: &MachineReconciler, id: MachineId) -> Outcome {
        let job_id = enqueue(&self.store, &new_job(MACHINE_RECONCILE, id.uuid())).await;
        let job = get(&self.store, job_id).await;
        tokio::time::timeout(Duration::from_secs(90), r.run(&job)).await.expect("the run ends")
    }

    /// The evidence of machine `id`'s first custody entry into `available`.
    async fn available_evidence(&self, id: MachineId) -> Value {
        sqlx::query_scalar(
            "select evidence from custody_entries where machine_id = $1 and to_state = 'available' order by seq limit 1",
        )
        .bind(id.uuid())
        .fetch_one(self.store.pool())
        .await
        .expect("custody entry")
    }

    /// The booted wipe agent of `uuid` reports every drive wiped; the handler runs until `id` is
    /// `available`.
    async fn verified_wipe_to_available(&self, r: &MachineReconciler, id: MachineId, uuid: &str) {
        let token = self.booted_token(uuid).await;
        let drives = drive_ids(&self.agent_config(&token).await);
        assert_eq!(self.report(&token, "success", wiped(&drives)).await, 204);
        self.drive(r, id, MachineState::Available, None).await;
    }

    /// Runs the handler until the machine is in `want` and the run stops with `code` (`None` =
    /// `Done`), with a bounded number of runs and a deadline.
    async fn drive(&self, r: &MachineReconciler, id: MachineId, want: MachineState, code: Option<&str>) -> Machine {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut history = Vec::new();
        for _ in 0..30 {
            let outcome = self.run(r, id).await;
            let m = self.load(id).await;
            let stopped = match (&outcome, code) {
                (Outcome::Done, None) => true,
                // An enrollment that ends quarantined fails its operation, with the machine's error.
                (Outcome::Fail { problem }, None) => {
                    want == MachineState::CleanFailed && Some(&problem.code) == m.last_error.as_ref().map(|e| &e.code)
                }
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

    /// The seed tokens of every boot so far.
    async fn seeds_issued(&self) -> Vec<String> {
        self.bmc.seeds.lock().expect("lock").iter().map(|s| token_of(s)).collect()
    }

    /// Takes a quarantined machine through maintenance back into a wipe boot; that boot's agent
    /// token.
    async fn rewipe(&self, r: &MachineReconciler, id: MachineId, uuid: &str) -> String {
        let body = json!({ "reason": "drives checked" });
        let resp = self.app.post(format!("/v1/machines/{id}/maintenance")).token(&admin()).json(&body).send().await;
        assert!(resp.status.is_success(), "{resp:?}");
        self.drive(r, id, MachineState::Maintenance, None).await;
        let resp = self.app.delete(format!("/v1/machines/{id}/maintenance")).token(&admin()).send().await;
        assert!(resp.status.is_success(), "{resp:?}");
        self.drive(r, id, MachineState::Cleaning, Some("waiting_for_agent")).await;
        self.bmc.take();
        self.booted_token(uuid).await
    }

    /// The path of the seed the machine's current boot carries (the seed token in it), read from
    /// the emulator's second device, whose URL the emulator fetched it from.
    async fn booted_seed(&self, uuid: &str) -> String {
        let seen = self.emu.seen(uuid).await;
        let seed = seen.seed().unwrap_or_else(|| panic!("no seed inserted: {seen:?}"));
        assert!(seed.starts_with(self.base_url()), "the seed comes from paddock's API: {seed}");
        format!("/v1/agent/seed/{}.iso", token_of(seed))
    }

    /// The agent token the machine's current boot carries: in `paddock/agent.json` of its seed,
    /// read with the independent ISO reader; the seed names this API, the machine and a run.
    /// How long until the machine's run has timed out for a reconciler with `ttl`: its latest
    /// agent token expired and the run booted `ttl` ago, as the database has them.
    async fn run_left(&self, id: MachineId, ttl: Duration) -> Duration {
        let (left,): (f64,) = sqlx::query_as(
            "select greatest(extract(epoch from greatest(t.expires_at, m.run_booted_at + $2 * interval '1 millisecond') \
                 - now()), 0)::float8 \
             from machines m, lateral (select expires_at from agent_tokens where machine_id = m.id \
                 order by created_at desc limit 1) t \
             where m.id = $1",
        )
        .bind(id.uuid())
        .bind(i64::try_from(ttl.as_millis()).expect("ttl"))
        .fetch_one(self.store.pool())
        .await
        .expect("the run's deadline");
        Duration::from_secs_f64(left)
    }

    async fn booted_token(&self, uuid: &str) -> String {
        let found = crate::agent::seed(&self.app, &self.booted_seed(uuid).await).await;
        assert_eq!(found.agent_url, self.base_url());
        assert_eq!(found.ca_cert, None);
        assert_eq!(self.load(found.machine_id).await.system_uuid.as_deref(), Some(uuid));
        found.agent_token
    }

    /// A tenant with a Kubernetes cluster and one pool of `metal` wanting `count`, its control
    /// plane published (endpoint and a sealed admin kubeconfig), as the cluster reconciler leaves it.
    async fn cluster(&self, name: &str, count: u32) -> (TenantId, ClusterId, NodePoolId) {
        let t = self.app.post("/v1/tenants").token(&admin()).json(&json!({ "name": name })).send().await.expect(201);
        let tenant = uuid_in(&t.json()["id"]);
        let body = json!({
            "name": name, "kind": "kubernetes", "isolation": "private-nodes",
            "node_pools": [{ "name": "p", "machine_class": "metal", "count": count }],
        });
        self.app.post(format!("/v1/tenants/{tenant}/clusters")).token(&admin()).json(&body).send().await.expect(202);
        let (cluster, pool): (Uuid, Uuid) = sqlx::query_as(
            "select c.id, p.id from clusters c join node_pools p on p.cluster_id = c.id \
             where c.tenant_id = $1 and c.name = $2",
        )
        .bind(tenant)
        .bind(name)
        .fetch_one(self.store.pool())
        .await
        .expect("cluster and pool");
        sqlx::query("update clusters set endpoints = $2 where id = $1")
            .bind(cluster)
            .bind(json!({ "kubernetes_api": "https://10.0.0.1:6443", "slurm_rest_api": null, "login_ssh": null }))
            .execute(self.store.pool())
            .await
            .expect("endpoints");
        let binding = Binding { table: "clusters", column: "admin_kubeconfig_enc", row: cluster };
        let sealed = self.app.cipher.seal(b"apiVersion: v1\nkind: Config\n", binding).expect("seal");
        let mut conn = self.store.conn().await.expect("conn");
        cluster::set_admin_kubeconfig(&mut conn, TenantId(tenant), ClusterId(cluster), Some(&sealed))
            .await
            .expect("kubeconfig");
        (TenantId(tenant), ClusterId(cluster), NodePoolId(pool))
    }

    async fn allocate(&self, tenant: TenantId, cluster: ClusterId, need: Need) -> Allocation {
        let mut tx = self.store.begin().await.expect("begin");
        let outcome = allocation::allocate(
            &mut tx,
            &paddock_testkit::ledger_key(),
            tenant,
            cluster,
            std::slice::from_ref(&need),
            HEAD,
        )
        .await
        .expect("allocate");
        tx.commit().await.expect("commit");
        // As the cluster reconciler does once the allocation is in.
        if let Allocation::Allocated(machines) = &outcome {
            let mut tx = self.store.begin().await.expect("begin");
            allocation::hand_over(&mut tx, machines, &[need]).await.expect("hand over");
            tx.commit().await.expect("commit");
        }
        outcome
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

    /// The agent: fetches the run's configuration like a booted machine, with the agent token
    /// of its seed.
    async fn agent_config(&self, token: &str) -> Value {
        let config = crate::agent::config(&self.app, token).await;
        assert!(config["nonce"].is_string(), "{config}");
        config
    }

    /// The agent's report: every drive with its result, naming the served image.
    async fn report(&self, token: &str, result: &str, drives: Value) -> u16 {
        crate::agent::report(&self.app, token, &crate::agent::report_body(result, drives)).await
    }
}

fn uuid_in(v: &Value) -> Uuid {
    Uuid::parse_str(v.as_str().unwrap_or_else(|| panic!("not an id: {v}"))).expect("uuid")
}

fn drive_ids(config: &Value) -> Vec<String> {
    config["config"]["drives"]
        .as_array()
        .expect("drives")
        .iter()
        .map(|d| d["id"].as_str().expect("id").to_owned())
        .collect()
}

fn wiped(ids: &[String]) -> Value {
    crate::agent::wiped(ids)
}

// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_machine_goes_through_its_whole_lifecycle_on_the_emulator() {
    let emu = require!(emulator("lifecycle tests"));
    let b = Bench::new(emu.clone()).await;
    let class = b.class().await;
    let uuid = emu.uuid_of("node-011").await;
    let id = b.enroll("lc-1", &uuid).await;
    let r = b.reconciler(Duration::from_secs(600));

    // Enroll -> inspect -> cleaning: the wipe boots.
    let m = b.drive(&r, id, MachineState::Cleaning, Some("waiting_for_agent")).await;
    assert_eq!(m.system_uuid.as_deref(), Some(uuid.as_str()));
    let inspected: Vec<&str> =
        m.inventory["drives"].as_array().expect("drives").iter().map(|d| d["id"].as_str().expect("id")).collect();
    assert_eq!(inspected, ["nvme0", "nvme1"]);
    let log = b.bmc.take();
    assert_eq!(calls(&log), ["inspect", "boot_from_media"]);
    let seen = b.emu.seen(&uuid).await;
    assert_booted(&seen, &b.images.url("wipe.iso"));
    assert_eq!(b.images.downloads("wipe.iso"), 1, "the emulator fetched the wipe image");
    let run1 = run::run_of(&mut b.store.conn().await.expect("conn"), id).await.expect("run").expect("a run");
    assert_eq!(run1.run_purpose, "wipe");
    assert!(run1.run_booted_at.is_some() && run1.run_finished_at.is_none());

    // Waiting for the agent: another run changes nothing and boots nothing.
    let token1 = b.booted_token(&uuid).await;
    let seed1 = b.booted_seed(&uuid).await;
    let mut problems = Vec::new();
    let version = b.load(id).await.status_version;
    b.drive(&r, id, MachineState::Cleaning, Some("waiting_for_agent")).await;
    assert!(b.bmc.take().is_empty(), "no BMC call while the agent works");
    assert_eq!(b.load(id).await.status_version, version);
    assert_eq!(b.booted_token(&uuid).await, token1);

    // The wipe agent: config, seed, report of every listed drive.
    let config = b.agent_config(&token1).await;
    assert_eq!(config["purpose"], "wipe");
    assert_eq!(config["machine"]["id"], id.to_string());
    let drives = drive_ids(&config);
    assert_eq!(drives, ["nvme0", "nvme1"]);
    assert_eq!(b.report(&token1, "success", wiped(&drives)).await, 204);

    // -> available, with the clean recorded: off, ejected, booting from disk.
    let m = b.drive(&r, id, MachineState::Available, None).await;
    assert_eq!(calls(&b.bmc.take()), ["finish_boot(PowerOff)"]);
    assert_finished(&b.emu.seen(&uuid).await, PowerState::Off);
    let cleans = b.cleans(id).await;
    assert_eq!(cleans.len(), 1);
    // The custody entry of the verified wipe carries the evidence per drive and the image digest.
    let custody = b.available_evidence(id).await;
    assert_eq!(custody["image_sha256"], crate::agent::image_sha256());
    let evidence_drives = custody["drives"].as_array().expect("drives");
    assert_eq!(evidence_drives.len(), 2);
    assert!(evidence_drives.iter().all(|d| d["verification"]["ranges"] == 66 && d["method"].is_string()), "{custody}");
    // The BMC was asked for its out-of-band erase too: sushy-tools advertises none.
    assert_eq!(custody["out_of_band_erase"], json!({ "erases": [] }), "{custody}");
    let (clean_id, clean_run, method, evidence) = &cleans[0];
    assert_eq!(*clean_run, run1.run_id);
    assert_eq!(method, "agent");
    assert_eq!(evidence["run_id"], run1.run_id.to_string());
    assert_eq!(evidence["report"]["drives"].as_array().expect("drives").len(), 2);
    assert_eq!(m.last_error, None);
    let machine_clean: Option<Uuid> = sqlx::query_scalar("select clean_id from machines where id = $1")
        .bind(id.uuid())
        .fetch_one(b.store.pool())
        .await
        .expect("clean_id");
    assert_eq!(machine_clean, Some(*clean_id), "the available machine carries its unused clean");

    // The token is used up: 409 at every endpoint.
    problems.push(b.app.get("/v1/agent/config").token(&token1).send().await.problem(409, "agent_token_used"));
    problems.push(b.app.get(&seed1).send().await.problem(409, "agent_token_used"));
    assert_eq!(b.report(&token1, "success", wiped(&drives)).await, 409);
    // Neither token stands in for the other, nor for a JWT.
    problems.push(b.app.get("/v1/agent/config").token(&token_of(&seed1)).send().await.problem(404, "not_found"));
    problems.push(b.app.get(format!("/v1/agent/seed/{token1}.iso")).send().await.problem(404, "not_found"));
    assert_eq!(b.app.get("/v1/machines").token(&token1).send().await.status.as_u16(), 401);

    // Allocate (all or nothing, in one transaction) to a cluster whose control plane is up.
    let (tenant, cluster_id, pool) = b.cluster("acme", 1).await;
    let need = Need { node_pool_id: pool, machine_class_id: class, gpu_count: 0, count: 1 };
    assert_eq!(b.allocate(tenant, cluster_id, need.clone()).await, Allocation::Allocated(vec![id]));
    let m = b.load(id).await;
    assert_eq!(m.state, MachineState::Allocated);
    assert_eq!((m.tenant_id, m.cluster_id, m.node_pool_id), (Some(tenant), Some(cluster_id), Some(pool)));

    // Provisioning: a join configuration, the OS image with the run's seed, power on.
    let m = b.drive(&r, id, MachineState::Provisioning, Some("waiting_for_agent")).await;
    assert_eq!(calls(&b.bmc.take()), ["boot_from_media"]);
    assert_eq!(b.tenant_side.joins.load(Ordering::SeqCst), 1);
    assert_booted(&b.emu.seen(&uuid).await, &b.images.url("node-os.iso"));
    let token2 = b.booted_token(&uuid).await;
    assert_ne!(token2, token1, "every boot has its own token");
    let config = b.agent_config(&token2).await;
    assert_eq!(config["purpose"], "provision");
    assert_eq!(config["config"]["join"]["api_server"], "10.0.0.1:6443");
    // The join configuration the contract names, at the top of `config`: the endpoint as a URL,
    // and the node OS image's digest the installer checks its boot medium against.
    assert_eq!(config["config"]["api_endpoint"], "https://10.0.0.1:6443");
    assert_eq!(config["config"]["os_image_sha256"], crate::agent::image_sha256());
    assert_eq!(config["config"]["node_taints"], json!([]));
    assert_eq!(config["config"]["bootstrap_token"], "abcdef.0123456789abcdef");
    assert!(config["config"]["ca_cert"].as_str().is_some_and(|c| c.starts_with("-----BEGIN CERTIFICATE-----")));
    assert!(config["config"]["ca_cert_hash"].as_str().is_some_and(|h| h.starts_with("sha256:")));
    let node_name = config["config"]["node_name"].as_str().expect("node name").to_owned();
    assert_eq!(node_name, paddock_domain::driver::node_name(id));
    assert!(m.node_name.is_none());

    // The first-boot report: eject, boot from disk; then the node must show up Ready.
    assert_eq!(b.report(&token2, "success", json!([])).await, 204);
    b.drive(&r, id, MachineState::Provisioning, Some("waiting_for_node")).await;
    let log = b.bmc.take();
    assert_eq!(calls(&log), ["finish_boot(BootFromDisk)"]);
    assert_finished(&b.emu.seen(&uuid).await, PowerState::On);
    problems.push(b.app.get("/v1/agent/config").token(&token2).send().await.problem(409, "agent_token_used"));

    // The kubelet registers the node: active.
    b.tenant_side.register(&uuid, &node_name);
    let m = b.drive(&r, id, MachineState::Active, None).await;
    assert_eq!(m.node_name.as_deref(), Some(node_name.as_str()));
    assert!(b.bmc.take().is_empty(), "activation needs no BMC call");

    // Release: releasing -> (node removed, powered off, tenancy ended) cleaning -> wipe again.
    let mut tx = b.store.begin().await.expect("begin");
    assert!(lifecycle::begin_release(
        &mut tx,
        &paddock_testkit::ledger_key(),
        id,
        MachineState::Active,
        m.status_version
    )
    .await
    .expect("release"));
    tx.commit().await.expect("commit");
    assert_eq!(b.load(id).await.state, MachineState::Releasing);
    let m = b.drive(&r, id, MachineState::Cleaning, Some("waiting_for_agent")).await;
    assert_eq!((m.tenant_id, m.cluster_id, m.node_pool_id, m.node_name.as_deref()), (None, None, None, None));
    assert!(!b.tenant_side.has(&uuid));
    assert_eq!(b.tenant_side.removed.lock().expect("lock").as_slice(), std::slice::from_ref(&node_name));
    let log = b.bmc.take();
    assert_eq!(calls(&log), ["power_off", "boot_from_media"], "powered off before the tenancy ends, then wiped");
    let after_off = log[0].1.as_ref().expect("seen after power off");
    assert_eq!(after_off.power, Some(PowerState::Off), "{after_off:?}");
    let (released_at, release_started_at): (
        Option<chrono::DateTime<chrono::Utc>>,
        Option<chrono::DateTime<chrono::Utc>>,
    ) = sqlx::query_as("select released_at, release_started_at from machine_allocations where machine_id = $1")
        .bind(id.uuid())
        .fetch_one(b.store.pool())
        .await
        .expect("allocation");
    assert!(released_at.is_some() && release_started_at.is_some());
    assert!(released_at >= release_started_at);

    // The wipe again, a new run with a new token.
    assert_booted(&b.emu.seen(&uuid).await, &b.images.url("wipe.iso"));
    let token3 = b.booted_token(&uuid).await;
    assert!(token3 != token1 && token3 != token2);
    let config = b.agent_config(&token3).await;
    assert_eq!(config["purpose"], "wipe");
    assert_ne!(config["run_id"], run1.run_id.to_string(), "each token is its own run's");
    problems.push(b.app.get("/v1/agent/config").token(&token1).send().await.problem(409, "agent_token_used"));
    let drives = drive_ids(&config);
    assert_eq!(b.report(&token3, "success", wiped(&drives)).await, 204);
    b.drive(&r, id, MachineState::Available, None).await;
    assert_eq!(calls(&b.bmc.take()), ["finish_boot(PowerOff)"]);
    assert_finished(&b.emu.seen(&uuid).await, PowerState::Off);
    let cleans = b.cleans(id).await;
    assert_eq!(cleans.len(), 2, "a second verified clean");
    assert_ne!(cleans[1].1, run1.run_id);

    // The machine can be allocated again (its new clean is unused), to anyone.
    let (tenant2, cluster2, pool2) = b.cluster("beta", 1).await;
    let need = Need { node_pool_id: pool2, machine_class_id: class, gpu_count: 0, count: 1 };
    assert_eq!(b.allocate(tenant2, cluster2, need).await, Allocation::Allocated(vec![id]));
    // Back where the emulator started it, for whoever uses node-011 next.
    emu.tidy(&uuid).await;

    // After the whole run, no token shows anywhere it could leak: the logs, the metric labels,
    // the audit trail, the problems the agents got.
    let seeds = b.seeds_issued().await;
    let tokens = [token1, token2, token3];
    let metrics = String::from_utf8(b.app.get("/metrics").send().await.expect(200).body.to_vec()).expect("utf8");
    let audit = b.app.get("/v1/audit-events?limit=1000").token(&admin()).send().await.expect(200).json().to_string();
    assert!(audit.contains("agent.report"), "the reports are audited: {audit}");
    let problems = serde_json::to_string(&problems).expect("json");
    let logs = crate::support::logged();
    assert!(logs.contains("seed") || logs.contains("boot"), "the logs captured the run");
    for secret in seeds.iter().chain(&tokens) {
        assert_eq!(secret.len(), 43, "a token");
        for (what, text) in [("logs", &logs), ("metrics", &metrics), ("audit", &audit), ("problems", &problems)] {
            assert!(!text.contains(secret.as_str()), "a token shows in the {what}");
        }
    }
}

#[tokio::test]
async fn a_failed_drive_quarantines_the_machine_and_an_expired_token_is_refused() {
    let emu = require!(emulator("lifecycle tests"));
    let b = Bench::new(emu.clone()).await;
    let class = b.class().await;
    let uuid = emu.uuid_of("node-012").await;
    let id = b.enroll("lc-2", &uuid).await;
    let r = b.reconciler(Duration::from_secs(600));

    b.drive(&r, id, MachineState::Cleaning, Some("waiting_for_agent")).await;
    assert_booted(&b.emu.seen(&uuid).await, &b.images.url("wipe.iso"));
    b.bmc.take();
    let token1 = b.booted_token(&uuid).await;
    let config = b.agent_config(&token1).await;
    let drives = drive_ids(&config);
    assert_eq!(drives, ["nvme0", "nvme1"]);
    let report = json!([
        crate::agent::drive("nvme0", "success", None),
        crate::agent::drive("nvme1", "failure", Some("format failed: I/O error")),
    ]);
    assert_eq!(b.report(&token1, "failure", report).await, 204);

    // clean_failed: quarantined, powered off and ejected, no clean recorded, nothing to allocate.
    let m = b.drive(&r, id, MachineState::CleanFailed, None).await;
    let error = m.last_error.expect("last error");
    assert_eq!(error.code, "wipe_failed");
    assert!(error.message.contains("nvme1") && !error.message.contains("nvme0"), "{}", error.message);
    assert_eq!(calls(&b.bmc.take()), ["finish_boot(PowerOff)"]);
    assert_finished(&b.emu.seen(&uuid).await, PowerState::Off);
    assert!(b.cleans(id).await.is_empty(), "a failed wipe records no clean");
    assert_eq!(b.report(&token1, "success", wiped(&drives)).await, 409, "a used token cannot report again");
    // It stays quarantined: another run changes nothing.
    let version = m.status_version;
    b.drive(&r, id, MachineState::CleanFailed, None).await;
    assert_eq!(b.load(id).await.status_version, version);
    let (tenant, cluster_id, pool) = b.cluster("acme", 1).await;
    let need = Need { node_pool_id: pool, machine_class_id: class, gpu_count: 0, count: 1 };
    match b.allocate(tenant, cluster_id, need).await {
        Allocation::Short { needed: 1, available: 0, .. } => {}
        other => panic!("a clean_failed machine must not be allocated: {other:?}"),
    }

    // Out only through maintenance: enter, leave -> cleaning, a new wipe boot (short token TTL:
    // long enough for a loaded machine to read the config in time; the test then waits until the
    // token and the run have expired as the database has them, not for a guessed time).
    let body = json!({ "reason": "drive nvme1 replaced" });
    let resp = b.app.post(format!("/v1/machines/{id}/maintenance")).token(&admin()).json(&body).send().await;
    assert!(resp.status.is_success(), "{resp:?}");
    b.drive(&r, id, MachineState::Maintenance, None).await;
    let resp = b.app.delete(format!("/v1/machines/{id}/maintenance")).token(&admin()).send().await;
    assert!(resp.status.is_success(), "{resp:?}");
    let ttl = Duration::from_secs(8);
    let short = b.reconciler(ttl);
    b.drive(&short, id, MachineState::Cleaning, Some("waiting_for_agent")).await;
    assert_booted(&b.emu.seen(&uuid).await, &b.images.url("wipe.iso"));
    b.bmc.take();
    let token2 = b.booted_token(&uuid).await;
    let seed2 = b.booted_seed(&uuid).await;
    assert_ne!(token2, token1);
    b.app.get("/v1/agent/config").token(&token2).send().await.expect(200);

    // The agent never reports in time: its token expires (410 everywhere) and the wipe times out.
    eventually(ttl * 4, || async { b.run_left(id, ttl).await.is_zero().then_some(()) }).await;
    b.app.get("/v1/agent/config").token(&token2).send().await.problem(410, "agent_token_expired");
    b.app.get(&seed2).send().await.problem(410, "agent_token_expired");
    assert_eq!(b.report(&token2, "success", wiped(&drives)).await, 410);
    let m = b.drive(&short, id, MachineState::CleanFailed, None).await;
    assert_eq!(m.last_error.map(|e| e.code), Some("wipe_timed_out".to_owned()));
    assert!(b.cleans(id).await.is_empty(), "nothing reached available");
    let state: (i64,) = sqlx::query_as("select count(*) from machine_allocations where machine_id = $1")
        .bind(id.uuid())
        .fetch_one(b.store.pool())
        .await
        .expect("allocations");
    assert_eq!(state.0, 0);
    // What the BMC shows after a timed-out wipe (see the report: the reconciler sends nothing).
    let log = b.bmc.take();
    let seen = b.emu.seen(&uuid).await;
    eprintln!("after wipe_timed_out: BMC calls {:?}, emulator {seen:?}", calls(&log));

    // A report whose evidence falls short quarantines the machine with the reason, each time.
    let r = b.reconciler(Duration::from_secs(600));
    let ok = crate::agent::drive("nvme0", "success", None);
    let mut unverified = crate::agent::drive("nvme1", "success", None);
    unverified["verification"] = Value::Null;
    let mut unknown = crate::agent::drive("nvme1", "success", None);
    unknown["method"] = json!("nvme-format");
    let mut other_image = crate::agent::report_body("success", wiped(&drives));
    other_image["image_sha256"] = json!("c".repeat(64));
    for (body, reason) in [
        (crate::agent::report_body("success", json!([ok.clone(), unverified])), "drive nvme1: verification missing"),
        (
            crate::agent::report_body("success", json!([ok.clone(), unknown])),
            "drive nvme1: unknown method \"nvme-format\"",
        ),
        (other_image, "image: the agent booted image cccc"),
    ] {
        let token = b.rewipe(&r, id, &uuid).await;
        assert_eq!(crate::agent::report(&b.app, &token, &body).await, 204);
        let m = b.drive(&r, id, MachineState::CleanFailed, None).await;
        let error = m.last_error.expect("last error");
        assert_eq!(error.code, "wipe_failed");
        assert!(error.message.contains(reason), "{} should name {reason}", error.message);
        assert!(b.cleans(id).await.is_empty(), "nothing reached available");
    }
    let available: i64 =
        sqlx::query_scalar("select count(*) from custody_entries where machine_id = $1 and to_state = 'available'")
            .bind(id.uuid())
            .fetch_one(b.store.pool())
            .await
            .expect("custody");
    assert_eq!(available, 0, "the machine never became available");
    emu.tidy(&uuid).await;
}

/// node-009 serves both out-of-band erase tests, one after the other.
static NODE_009: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Out-of-band erase in the cleaning step (docs/security.md). sushy-tools has no `Drive.SecureErase`,
/// so node-009 is reached through paddock-redfish's labelled TEST PROXY
/// (`crates/paddock-redfish/tests/support/proxy.rs`), which adds the action to drive `nvme0`
/// (rewriting its GET) and answers the POST to it with 204, as a BMC that accepted the erase, and
/// records it; everything else is the real emulator's. The reconciler asks for the erase only once
/// the agent's report is verified, in addition to the in-band wipe, and the custody entry of the
/// verified wipe records the BMC's answer. No erase is performed: what this proves is when the
/// request is made, how often, and that the BMC's acceptance is what the ledger records.
#[tokio::test]
async fn the_bmcs_secure_erase_is_requested_once_after_the_verified_wipe_and_its_answer_recorded() {
    use crate::proxy::{Fault, FaultProxy, Rule};
    let emu = require!(emulator("lifecycle tests"));
    let _node = NODE_009.lock().await;
    let b = Bench::new(emu.clone()).await;
    b.class().await;
    let uuid = emu.uuid_of("node-009").await;
    let proxy = FaultProxy::start(&paddock_redfish::Url::parse(&emu.url).expect("emulator URL")).await;
    proxy.rule(Rule::containing(
        Some(reqwest::Method::GET),
        "/Storage/1/Drives/nvme0",
        Fault::Rewrite(Arc::new(|v: &mut Value| {
            let target = format!("{}/Actions/Drive.SecureErase", v["@odata.id"].as_str().unwrap_or_default());
            v["Actions"]["#Drive.SecureErase"] = json!({ "target": target });
        })),
    ));
    proxy.rule(Rule::containing(Some(reqwest::Method::POST), "/Actions/Drive.SecureErase", Fault::Drop));
    let erases = || proxy.count(&reqwest::Method::POST, "/Actions/Drive.SecureErase");
    let id = b.enroll_at("lc-erase", &uuid, proxy.url.as_str()).await;
    let r = b.reconciler(Duration::from_secs(600));

    b.drive(&r, id, MachineState::Cleaning, Some("waiting_for_agent")).await;
    assert_eq!(erases(), 0, "no out-of-band erase before the in-band wipe is verified");
    b.verified_wipe_to_available(&r, id, &uuid).await;
    assert_eq!(erases(), 1, "one erase, of the one drive that advertises it");

    let custody = b.available_evidence(id).await;
    let expected = json!({ "erases": [
        { "scope": "drive", "id": "nvme0", "action": "Drive.SecureErase", "result": "success", "detail": null },
    ] });
    assert_eq!(custody["out_of_band_erase"], expected, "{custody}");
    assert_eq!(custody["drives"].as_array().map(Vec::len), Some(2), "the in-band evidence stays: {custody}");
    emu.tidy(&uuid).await;
}

/// A real BMC's secure erase in the cleaning step (docs/security.md). The emulator cannot run one
/// (sushy-tools has no `Drive.SecureErase`), so node-009's drive `nvme0` answers through the test
/// proxy with bmcweb's flow REPLAYED from its public source, NOT a live BMC
/// (`crates/paddock-redfish/tests/support/recorded.rs` says where each answer comes from): the
/// action with its ActionInfo, `202 Accepted` with a task monitor, `Running` once, the monitor's
/// `204`, and the Task `Completed` with `TaskCompletedOK`. After the verified wipe paddock sends
/// the strongest `SanitizationType` the ActionInfo allows, follows the task to its end, reads the
/// Task for how it ended, and only then records the erase's success. No erase is performed: what
/// this proves is what paddock sends and what it waits for before the ledger says `success`.
#[tokio::test]
async fn a_real_bmcs_asynchronous_secure_erase_is_followed_to_its_task_s_end_before_it_is_recorded() {
    use crate::proxy::FaultProxy;
    use crate::recorded::{replay_secure_erase, Ending, MONITOR, TASK};
    let emu = require!(emulator("lifecycle tests"));
    let _node = NODE_009.lock().await;
    let b = Bench::new(emu.clone()).await;
    b.class().await;
    let uuid = emu.uuid_of("node-009").await;
    let proxy = FaultProxy::start(&paddock_redfish::Url::parse(&emu.url).expect("emulator URL")).await;
    replay_secure_erase(&proxy, "/Storage/1/Drives/nvme0", 1, Ending::Completed);
    let erases = || proxy.changes().into_iter().filter(|s| s.path.ends_with("/Actions/Drive.SecureErase")).collect();
    let id = b.enroll_at("lc-erase-task", &uuid, proxy.url.as_str()).await;
    let r = b.reconciler(Duration::from_secs(600));

    b.drive(&r, id, MachineState::Cleaning, Some("waiting_for_agent")).await;
    let none: Vec<crate::proxy::Seen> = erases();
    assert!(none.is_empty(), "no out-of-band erase before the in-band wipe is verified");
    b.verified_wipe_to_available(&r, id, &uuid).await;
    let posted: Vec<Option<Value>> = erases().into_iter().map(|s: crate::proxy::Seen| s.body).collect();
    assert_eq!(posted, [Some(json!({ "SanitizationType": "CryptographicErase" }))], "as the ActionInfo allows");
    assert_eq!(proxy.count(&reqwest::Method::GET, MONITOR), 2, "the monitor, followed until its 204");
    assert_eq!(proxy.count(&reqwest::Method::GET, TASK) - 2, 1, "then the Task, for how it ended");

    let custody = b.available_evidence(id).await;
    let expected = json!({ "erases": [
        { "scope": "drive", "id": "nvme0", "action": "Drive.SecureErase", "result": "success", "detail": null },
    ] });
    assert_eq!(custody["out_of_band_erase"], expected, "{custody}");
    emu.tidy(&uuid).await;
}
