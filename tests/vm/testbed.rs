//! The VM testbed `scripts/vm-start` started (`PADDOCK_TEST_VM_*`): its domains, their disk files,
//! libvirt (through `virsh`, as an operator would change a machine), and paddock (API and worker
//! with the Redfish driver; for clusters, tests/vm/node.rs adds the real Kubernetes drivers) whose agent URL the
//! guests reach through QEMU's user-mode networking.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use paddock_redfish::{BmcLimiter, RedfishBmc};
use paddock_service::agent::AgentSettings;
use paddock_testkit::TestApp;
use paddock_worker::reconcile::{Drivers, MachineReconciler, Settings};
use paddock_worker::{JobHandler, Worker, WorkerConfig};
use serde_json::{json, Value};

#[derive(Clone, Debug)]
pub struct Disk {
    pub name: String,
    pub path: PathBuf,
    pub serial: String,
    pub size_bytes: u64,
}

#[derive(Clone, Debug)]
pub struct Vm {
    pub name: String,
    pub uuid: String,
    pub console: PathBuf,
    /// The domain's definition as the testbed defined it.
    pub definition: PathBuf,
    pub disks: Vec<Disk>,
    /// A node-sized domain's network: the host ports behind its doors (scripts/lib/vm-domains.py).
    pub node: Option<NodePorts>,
}

/// The host's loopback ports a node-sized domain's network leads to: `api` and `agent` are where
/// its guest's 10.0.2.100:6443 and 10.0.2.100:8080 arrive (the test relays them), `kubelet` is
/// forwarded to the guest's port 10250; its tenant network link's frames arrive (UDP) at
/// `tenant_net` and are sent to QEMU at `tenant_net_qemu` (tests/vm/tenantnet.rs); `number` is the
/// node's number there (its address is 10.70.0.`number`).
#[derive(Clone, Copy, Debug)]
pub struct NodePorts {
    pub number: u8,
    pub api: u16,
    pub agent: u16,
    pub kubelet: u16,
    pub tenant_net: u16,
    pub tenant_net_qemu: u16,
}

/// The domains of machines.json (`{machines: [{name, uuid, console, disks: [{name, path, serial, size_bytes}]}]}`).
fn machines(json: &Value) -> Vec<Vm> {
    let s = |v: &Value, k: &str| v[k].as_str().unwrap_or_else(|| panic!("{k} in machines.json")).to_owned();
    let list = |v: &Value, k: &str| v[k].as_array().unwrap_or_else(|| panic!("{k} in machines.json")).clone();
    list(json, "machines")
        .iter()
        .map(|m| Vm {
            name: s(m, "name"),
            uuid: s(m, "uuid"),
            console: PathBuf::from(s(m, "console")),
            definition: PathBuf::from(s(m, "definition")),
            disks: list(m, "disks")
                .iter()
                .map(|d| Disk {
                    name: s(d, "name"),
                    path: PathBuf::from(s(d, "path")),
                    serial: s(d, "serial"),
                    size_bytes: d["size_bytes"].as_u64().expect("size_bytes"),
                })
                .collect(),
            node: m.get("node").map(|n| {
                let port = |k: &str| u16::try_from(n["ports"][k].as_u64().expect("port")).expect("port");
                let mac = n["tenant_mac"].as_str().expect("tenant_mac");
                NodePorts {
                    number: mac.rsplit(':').next().and_then(|n| n.parse().ok()).expect("the node's number"),
                    api: port("api"),
                    agent: port("agent"),
                    kubelet: port("kubelet"),
                    tenant_net: port("tenant_net"),
                    tenant_net_qemu: port("tenant_net_qemu"),
                }
            }),
        })
        .collect()
}

pub struct Testbed {
    pub dir: PathBuf,
    /// The small domains (what [`Testbed::lease`] hands out).
    pub vms: Vec<Vm>,
    /// The node-sized domains (`scripts/vm-start N M`), for a real node OS.
    pub nodes: Vec<Vm>,
    /// The real node OS image (scripts/node-image): its URL and SHA-256, when the testbed serves it.
    pub node_image: Option<(String, String)>,
    pub redfish_url: String,
    pub redfish_tls_url: String,
    pub user: String,
    pub password: String,
    pub ca_cert: String,
    pub image_url: String,
    /// The node OS image (`PADDOCK_OS_IMAGE_URL`): the wipe image with one unused byte range of
    /// its ISO volume descriptor changed, so the same agent boots (and reports a provisioning
    /// boot's first boot) from an image with its own digest.
    pub os_image_url: String,
    /// The wipe image's SHA-256 (`PADDOCK_WIPE_IMAGE_SHA256`).
    pub image_sha256: String,
    /// The node OS image's SHA-256 (`PADDOCK_OS_IMAGE_SHA256`), never the wipe image's.
    pub os_image_sha256: String,
    /// An acceptance image a machine class can name (docs/acceptance.md): another copy of the
    /// wipe image with another unused byte range changed, so the same agent boots (and runs the
    /// acceptance its run's config asks for) from an image with a third digest.
    pub accept_image_url: String,
    /// The acceptance image's SHA-256, neither the wipe image's nor the node OS image's.
    pub accept_image_sha256: String,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl Testbed {
    /// The testbed, or `None` (skipped with a notice) outside CI when it is not running.
    pub fn from_env() -> Option<Testbed> {
        let dir =
            paddock_testkit::skip::env("PADDOCK_TEST_VM_DIR", "scripts/test starts the VM testbed: scripts/vm-start")?;
        let need = |name: &str| var(name).unwrap_or_else(|| panic!("{name} is not set (scripts/vm-start prints it)"));
        let raw = std::fs::read(need("PADDOCK_TEST_VM_MACHINES")).expect("machines.json");
        let (nodes, vms) = machines(&serde_json::from_slice(&raw).expect("machines.json as vm-start writes it"))
            .into_iter()
            .partition(|vm| vm.node.is_some());
        Some(Testbed {
            dir: PathBuf::from(dir),
            vms,
            nodes,
            node_image: var("PADDOCK_TEST_VM_NODE_IMAGE_URL").zip(var("PADDOCK_TEST_VM_NODE_IMAGE_SHA256")),
            redfish_url: need("PADDOCK_TEST_VM_REDFISH_URL"),
            redfish_tls_url: need("PADDOCK_TEST_VM_REDFISH_TLS_URL"),
            user: need("PADDOCK_TEST_VM_REDFISH_USER"),
            password: need("PADDOCK_TEST_VM_REDFISH_PASSWORD"),
            ca_cert: std::fs::read_to_string(need("PADDOCK_TEST_VM_CA_CERT")).expect("the testbed's CA"),
            image_url: need("PADDOCK_TEST_VM_IMAGE_URL"),
            os_image_url: need("PADDOCK_TEST_VM_OS_IMAGE_URL"),
            image_sha256: need("PADDOCK_TEST_VM_IMAGE_SHA256"),
            os_image_sha256: need("PADDOCK_TEST_VM_OS_IMAGE_SHA256"),
            accept_image_url: need("PADDOCK_TEST_VM_ACCEPT_IMAGE_URL"),
            accept_image_sha256: need("PADDOCK_TEST_VM_ACCEPT_IMAGE_SHA256"),
        })
    }

    /// The enrollment's BMC part for `vm`: over https (the testbed's CA) or plain http.
    pub fn bmc(&self, vm: &Vm, tls: bool) -> Value {
        let mut bmc = json!({ "system_id": vm.uuid, "username": self.user, "password": self.password });
        if tls {
            bmc["url"] = json!(self.redfish_tls_url);
            bmc["ca_cert"] = json!(self.ca_cert);
        } else {
            bmc["url"] = json!(self.redfish_url);
            bmc["allow_insecure_http"] = json!(true);
        }
        bmc
    }
}

/// `virsh -c qemu:///system ARGS`: its stdout; fails the test on an error.
pub fn virsh(args: &[&str]) -> String {
    let out = Command::new("virsh").arg("-q").args(["-c", "qemu:///system"]).args(args).output().expect("virsh");
    assert!(out.status.success(), "virsh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Powers `vm` off (if on), defines it again as the testbed defined it (no media, no disk a
/// test attached) and clears its console log: a machine at rest before a test.
pub fn reset(vm: &Vm) {
    if virsh(&["domstate", &vm.name]) != "shut off" {
        virsh(&["destroy", &vm.name]);
    }
    virsh(&["define", vm.definition.to_str().expect("utf-8 path")]);
    let _ = std::fs::write(&vm.console, b"");
}

/// The main BMC emulator stopped (`scripts/vm-bmc`) until this is dropped, when it starts again.
/// The BMC emulators are shared by every leased test ([`Lease`]), so an outage is had only with
/// them to oneself: under the test's exclusive lease, or, for a test that leases no VM, by waiting
/// until no leased test runs and holding off new ones until the outage ends.
pub enum BmcOutage<'a> {
    /// Under a test's exclusive lease, which must outlive the outage.
    Leased(#[expect(dead_code, reason = "borrowed for the outage's length")] &'a Lease),
    /// The BMCs held by the outage itself.
    Unleased(#[expect(dead_code, reason = "held for the outage's length")] tokio::sync::RwLockWriteGuard<'static, ()>),
}

impl<'a> BmcOutage<'a> {
    /// An outage under `lease`, which must hold the BMCs exclusively.
    pub fn begin(lease: &'a Lease) -> BmcOutage<'a> {
        assert!(matches!(lease._bmcs, Bmcs::Exclusive(_)), "a BMC outage needs an exclusive lease");
        vm_bmc("stop");
        BmcOutage::Leased(lease)
    }

    /// An outage for a test that leases no VM.
    pub async fn unleased() -> BmcOutage<'static> {
        let held = BMCS.write().await;
        vm_bmc("stop");
        BmcOutage::Unleased(held)
    }
}

impl Drop for BmcOutage<'_> {
    fn drop(&mut self) {
        vm_bmc("start");
    }
}

/// `scripts/vm-bmc <action> main`.
fn vm_bmc(action: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/vm-bmc");
    let status = Command::new(script).args([action, "main"]).status().expect("scripts/vm-bmc");
    assert!(status.success(), "scripts/vm-bmc {action} main");
}

/// What one poll of [`until`] answers: what it waited for, or not yet (`Err` with what it saw).
pub trait Answer<T> {
    fn found(self) -> Result<T, String>;
}

impl<T> Answer<T> for Option<T> {
    fn found(self) -> Result<T, String> {
        self.ok_or_else(|| "not yet".to_owned())
    }
}

impl<T> Answer<T> for Result<T, String> {
    fn found(self) -> Result<T, String> {
        self
    }
}

/// Polls `what` every 2 s until it finds what it waits for, within `within`; fails with `why`,
/// what the last poll saw and what `context` gathers then (consoles, pods).
pub async fn until<T, A, F, C>(why: &str, within: Duration, what: impl Fn() -> F, context: impl FnOnce() -> C) -> T
where
    A: Answer<T>,
    F: std::future::Future<Output = A>,
    C: std::future::Future<Output = String>,
{
    let deadline = std::time::Instant::now() + within;
    loop {
        let last = match what().await.found() {
            Ok(found) => return found,
            Err(last) => last,
        };
        if std::time::Instant::now() >= deadline {
            panic!("{why} within {within:?}; last seen: {last}\n{}", context().await);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The last `lines` of `vm`'s serial console, for failure messages.
pub fn console_tail(vm: &Vm, lines: usize) -> String {
    let text = std::fs::read_to_string(&vm.console).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The byte at `offset` of the pattern of `disk` (xorshift64*, seeded by the disk's serial): a
/// known pseudo-random pattern, different on every disk, without zero runs worth mentioning.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The seed of the disk's pattern (FNV-1a of its serial).
fn pattern_seed(disk: &Disk) -> u64 {
    disk.serial.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// Fills the disk file with its pattern, in place (never shorter meanwhile: a running machine may
/// have it open, as a tenant's node has).
pub fn fill(disk: &Disk) {
    use std::io::Write;
    let seed = pattern_seed(disk);
    let size = usize::try_from(disk.size_bytes).expect("size");
    let written =
        std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(&disk.path).and_then(|mut f| {
            f.write_all(&pattern(seed, size)).and_then(|()| f.set_len(disk.size_bytes)).and_then(|()| f.sync_all())
        });
    written.unwrap_or_else(|e| panic!("filling {}: {e}", disk.path.display()));
}

/// Where the disk file is not zero: `None` when every byte is, else the first offset and how many
/// bytes are not.
pub fn not_erased(path: &Path) -> Option<(usize, usize)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let first = bytes.iter().position(|b| *b != 0)?;
    Some((first, bytes.iter().filter(|b| **b != 0).count()))
}

/// paddock as `serve` runs it, in this process: the API served on a loopback port (the guests'
/// 10.0.2.2) and a worker whose machine reconciler has the real Redfish driver (as `paddock
/// serve` runs it with `PADDOCK_BMC_DRIVER=redfish PADDOCK_KUBE_DRIVER=none`; tests/vm/node.rs
/// starts one with the Kubernetes drivers too). Stopped on drop.
pub struct Paddock {
    pub app: TestApp,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Drop for Paddock {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

impl Paddock {
    /// An app and worker started elsewhere (the worker stops when `stop` sends).
    pub fn new(app: TestApp, stop: tokio::sync::watch::Sender<bool>) -> Paddock {
        Paddock { app, stop }
    }

    /// `agent_port` overrides the port the seeds name for the agent (a port nothing listens on:
    /// machines that never report). Tokens live `token_ttl`.
    pub async fn start(bed: &Testbed, token_ttl: Duration, agent_port: Option<u16>) -> Paddock {
        let (wipe, os) = (bed.image_sha256.clone(), bed.os_image_sha256.clone());
        let app = TestApp::served_with(move |a| {
            let port = a.base_url.rsplit(':').next().expect("port").parse::<u16>().expect("port");
            AgentSettings {
                base_url: format!("http://10.0.2.2:{}", agent_port.unwrap_or(port)),
                wipe_image_sha256: wipe,
                os_image_sha256: os,
                ..a
            }
        })
        .await;
        let settings = Settings {
            wipe_image_url: Some(bed.image_url.clone()),
            os_image_url: Some(bed.os_image_url.clone()),
            agent_token_ttl: token_ttl,
            report_wait: Duration::from_secs(5),
            ..Settings::default()
        };
        let drivers = Drivers { bmc: Some(Arc::new(RedfishBmc::new(BmcLimiter::new(4)))), kube: None };
        let handlers: Vec<Arc<dyn JobHandler>> =
            vec![Arc::new(MachineReconciler::new(app.services.clone(), drivers, settings))];
        let stop = spawn_worker(&app, "vm-worker", handlers);
        Paddock { app, stop }
    }

    /// An admin request: (status, body).
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_as(&paddock_testkit::admin(), method, path, body).await
    }

    /// A request with `token`: (status, body).
    pub async fn call_as(&self, token: &str, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let base = self.app.base_url.as_deref().expect("served");
        let mut req = client().request(method, format!("{base}{path}")).bearer_auth(token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let rsp = req.send().await.unwrap_or_else(|e| panic!("{path}: {e}"));
        let status = rsp.status().as_u16();
        let text = rsp.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    pub async fn get(&self, path: &str) -> Value {
        let (status, body) = self.call(reqwest::Method::GET, path, None).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }
}

/// Runs a worker with `handlers` on `app`'s database (polling quickly, retrying for as long as a
/// test lasts); it stops when the returned sender sends.
pub fn spawn_worker(app: &TestApp, name: &str, handlers: Vec<Arc<dyn JobHandler>>) -> tokio::sync::watch::Sender<bool> {
    let store = paddock_store::Store::from_pool(app.db.pool.clone());
    let config = WorkerConfig {
        poll_interval: Duration::from_millis(200),
        backoff_base: Duration::from_millis(200),
        backoff_cap: Duration::from_secs(5),
        max_attempts: 1000,
        ..WorkerConfig::default()
    };
    let worker = Worker::new(store, name, handlers, config).expect("worker");
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        worker
            .run(async move {
                let _ = stopped.changed().await;
            })
            .await
    });
    stop
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client")
}

/// The testbed's VMs as a pool: a test leases the VMs it needs, other tests run beside it on
/// others; the BMC emulators are shared, so a test that stops one leases them exclusively.
pub struct Lease {
    pub vms: Vec<Vm>,
    taken: Vec<usize>,
    _permits: tokio::sync::OwnedSemaphorePermit,
    _bmcs: Bmcs,
}

enum Bmcs {
    Shared(#[expect(dead_code, reason = "held for its drop")] tokio::sync::RwLockReadGuard<'static, ()>),
    Exclusive(#[expect(dead_code, reason = "held for its drop")] tokio::sync::RwLockWriteGuard<'static, ()>),
}

struct Pool {
    slots: Arc<tokio::sync::Semaphore>,
    free: std::sync::Mutex<Vec<usize>>,
}

static POOL: std::sync::OnceLock<Pool> = std::sync::OnceLock::new();
static BMCS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(pool) = POOL.get() {
            pool.free.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(&self.taken);
        }
    }
}

impl Testbed {
    /// Leases `n` VMs (waiting for them), powered off and with their disks filled with their
    /// patterns; with `exclusive_bmcs`, also the BMC emulators for this test alone.
    pub async fn lease(&self, n: usize, exclusive_bmcs: bool) -> Lease {
        assert!(n <= self.vms.len(), "the testbed has {} VMs, a test wants {n}", self.vms.len());
        let pool = POOL.get_or_init(|| Pool {
            slots: Arc::new(tokio::sync::Semaphore::new(self.vms.len())),
            free: std::sync::Mutex::new((0..self.vms.len()).collect()),
        });
        let bmcs = if exclusive_bmcs { Bmcs::Exclusive(BMCS.write().await) } else { Bmcs::Shared(BMCS.read().await) };
        let permits = pool.slots.clone().acquire_many_owned(u32::try_from(n).expect("n")).await.expect("pool");
        let taken: Vec<usize> = {
            let mut free = pool.free.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let at = free.len() - n;
            free.split_off(at)
        };
        let vms: Vec<Vm> = taken.iter().map(|i| self.vms[*i].clone()).collect();
        for vm in &vms {
            reset(vm);
            vm.disks.iter().for_each(fill);
        }
        Lease { vms, taken, _permits: permits, _bmcs: bmcs }
    }
}
