//! Test support: the emulators started by `scripts/test` (through `scripts/redfish-start`), raw
//! access to them for assertions that must not go through the client under test, a tiny image
//! server the emulator downloads virtual media from, and the fault-injecting proxy.
//!
//! TEST-ONLY code. Nothing here replaces the BMC: the proxy forwards to the real emulator, but
//! for the one flow the emulator cannot do at all, a real BMC's secure erase, which `recorded`
//! replays (and says where its answers come from).

pub mod images;
pub mod logs;
pub mod proxy;
// The worker's lifecycle tests use what this binary's tests do not.
#[allow(dead_code)]
pub mod recorded;

use std::sync::OnceLock;
use std::time::Duration;

use paddock_redfish::{Backoff, Password, PowerPolicy, RedfishConfig, SystemUuid, TaskPolicy, Url};
use paddock_testkit::skip;
use serde_json::Value;

/// The emulators this run talks to.
#[derive(Debug)]
pub struct Emulators {
    /// The main emulator: HTTP, basic auth, 18 systems `node-000`..`node-017`, no power delay.
    pub url: Url,
    pub user: String,
    pub password: String,
    /// The TLS emulator: HTTPS, one system, no auth, 2 s power delay.
    pub tls: Option<TlsEmulator>,
}

/// The HTTPS emulator and the CAs for it.
#[derive(Debug)]
pub struct TlsEmulator {
    pub url: Url,
    /// The CA that signed its certificate (PEM).
    pub ca_pem: String,
    /// A CA that signed nothing (PEM).
    pub other_ca_pem: String,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn load() -> Result<Emulators, String> {
    let url = var("PADDOCK_TEST_REDFISH_URL").ok_or("PADDOCK_TEST_REDFISH_URL is not set")?;
    let url = Url::parse(&url).map_err(|e| format!("PADDOCK_TEST_REDFISH_URL: {e}"))?;
    let user = var("PADDOCK_TEST_REDFISH_USER").unwrap_or_default();
    let password = var("PADDOCK_TEST_REDFISH_PASSWORD").unwrap_or_default();
    let tls = match (var("PADDOCK_TEST_REDFISH_TLS_URL"), var("PADDOCK_TEST_REDFISH_TLS_CA_CERT")) {
        (Some(tls_url), Some(ca)) => {
            let read = |p: &str| std::fs::read_to_string(p).map_err(|e| format!("reading {p}: {e}"));
            Some(TlsEmulator {
                url: Url::parse(&tls_url).map_err(|e| format!("PADDOCK_TEST_REDFISH_TLS_URL: {e}"))?,
                ca_pem: read(&ca)?,
                other_ca_pem: match var("PADDOCK_TEST_REDFISH_TLS_OTHER_CA_CERT") {
                    Some(p) => read(&p)?,
                    None => String::new(),
                },
            })
        }
        _ => None,
    };
    Ok(Emulators { url, user, password, tls })
}

/// A missing emulator skips the test ([`skip`]: a failure under `CI=true`).
fn absent(what: &str) {
    skip::skip(format_args!(
        "{what}: the Redfish emulator is not configured. Run the tests with `scripts/test -p paddock-redfish`, \
         which starts it with scripts/redfish-start and exports PADDOCK_TEST_REDFISH_*"
    ));
}

/// The emulators, or `None` (the test is skipped) when they are not configured.
pub fn emulators() -> Option<&'static Emulators> {
    static EMULATORS: OnceLock<Result<Emulators, String>> = OnceLock::new();
    match EMULATORS.get_or_init(load) {
        Ok(e) => Some(e),
        Err(why) => {
            absent(why);
            None
        }
    }
}

/// The TLS emulator, or `None` (the test is skipped) when it is not configured.
pub fn tls_emulator() -> Option<&'static TlsEmulator> {
    let emulators = emulators()?;
    if emulators.tls.is_none() {
        absent("PADDOCK_TEST_REDFISH_TLS_URL / PADDOCK_TEST_REDFISH_TLS_CA_CERT are not set");
    }
    emulators.tls.as_ref()
}

/// Reads the power change sushy-tools' fake driver still has pending for a system: the driver
/// keeps it in its state database until a read after its time applies it.
const PENDING_POWER: &str = r#"
import pickle, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
for key, value in db.execute("select key, value from cache"):
    if pickle.loads(key) == sys.argv[2]:
        pending = pickle.loads(value).get("pending_power")
        print(pending["power_state"] if pending else "")
        break
else:
    sys.exit("no system " + sys.argv[2] + " in " + sys.argv[1])
"#;

/// The power change (`On`, `Off`, a restart) the TLS emulator has accepted for the system `uuid`
/// but not applied yet, read from its state (`$PADDOCK_TEST_REDFISH_DIR/tls/state`): what a BMC
/// would still do by itself. `Err` (the test is skipped) without the emulator's run directory.
pub fn tls_pending_power(uuid: &str) -> Result<Option<String>, ()> {
    let Some(dir) = skip::env("PADDOCK_TEST_REDFISH_DIR", "the emulators' run directory, for their state") else {
        return Err(());
    };
    let db = std::path::Path::new(&dir).join("tls/state/fakedriver.sqlite");
    let out = std::process::Command::new("python3")
        .args(["-c", PENDING_POWER])
        .arg(&db)
        .arg(uuid)
        .output()
        .expect("running python3 (the emulator's own interpreter is one)");
    assert!(out.status.success(), "reading {}: {}", db.display(), String::from_utf8_lossy(&out.stderr));
    let pending = String::from_utf8(out.stdout).expect("utf-8").trim().to_owned();
    Ok(Some(pending).filter(|p| !p.is_empty()))
}

/// The TLS emulator has a single system: tests that change it take this lock, so that they do
/// not interleave.
pub async fn tls_system_lock() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// `let emu = require!(emulators());`: returns from the test when skipped.
#[macro_export]
macro_rules! require {
    ($e:expr) => {
        match $e {
            Some(v) => v,
            None => return,
        }
    };
}

/// Short timeouts and polls, so that the suite stays fast.
pub fn fast(mut config: RedfishConfig) -> RedfishConfig {
    config.connect_timeout = Duration::from_secs(2);
    config.request_timeout = Duration::from_secs(5);
    config.retries = 2;
    config.backoff = Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(200),
        max_retry_after: Duration::from_secs(5),
    };
    config.power = PowerPolicy {
        timeout: Duration::from_secs(20),
        poll_interval: Duration::from_millis(100),
        reissue_after: Duration::from_secs(5),
    };
    config.task = TaskPolicy { timeout: Duration::from_secs(10), poll_interval: Duration::from_millis(50) };
    config
}

impl Emulators {
    /// A fast config for `url` (the emulator itself or a proxy in front of it) with our credentials.
    pub fn config_at(&self, url: &Url, system_id: Option<&str>) -> RedfishConfig {
        let mut config = fast(RedfishConfig::new(url.clone(), self.user.clone(), Password::new(self.password.clone())));
        config.system_id = system_id.map(str::to_owned);
        config
    }

    /// A fast config for the main emulator.
    pub fn config(&self, system_id: Option<&str>) -> RedfishConfig {
        self.config_at(&self.url, system_id)
    }

    /// Raw access to the main emulator (not through the client under test).
    pub fn raw(&self) -> Raw {
        Raw {
            base: self.url.clone(),
            user: self.user.clone(),
            password: self.password.clone(),
            http: reqwest::Client::new(),
        }
    }
}

/// Plain HTTP to the emulator, for fixtures and assertions on its state.
pub struct Raw {
    base: Url,
    user: String,
    password: String,
    http: reqwest::Client,
}

/// A fake system, as the emulator names it.
#[derive(Debug, Clone)]
pub struct Node {
    pub uuid: String,
    pub path: String,
}

impl Node {
    pub fn system_uuid(&self) -> SystemUuid {
        SystemUuid::new(&self.uuid)
    }
}

impl Raw {
    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let url = self.base.join(path).expect("path");
        let req = self.http.request(method, url);
        if self.user.is_empty() {
            req
        } else {
            req.basic_auth(&self.user, Some(&self.password))
        }
    }

    /// GET as JSON (follows the emulator's by-name redirect).
    pub async fn get(&self, path: &str) -> Value {
        let rsp = self.req(reqwest::Method::GET, path).send().await.expect("raw GET");
        assert!(rsp.status().is_success(), "raw GET {path}: {}", rsp.status());
        rsp.json().await.expect("raw GET json")
    }

    /// POST a JSON body; returns the status.
    pub async fn post(&self, path: &str, body: Value) -> u16 {
        self.req(reqwest::Method::POST, path).json(&body).send().await.expect("raw POST").status().as_u16()
    }

    /// A system by its emulator name (`node-003`).
    pub async fn node(&self, name: &str) -> Node {
        let sys = self.get(&format!("/redfish/v1/Systems/{name}")).await;
        let path = sys["@odata.id"].as_str().expect("@odata.id").to_owned();
        Node { uuid: sys["UUID"].as_str().expect("UUID").to_owned(), path }
    }

    /// The system resource.
    pub async fn system(&self, node: &Node) -> Value {
        self.get(&node.path).await
    }

    /// The CD device resource.
    pub async fn cd(&self, node: &Node) -> Value {
        self.get(&format!("{}/VirtualMedia/Cd", node.path)).await
    }

    /// Sets the power state directly and waits for it (fixture: a known starting point).
    pub async fn force_power(&self, node: &Node, on: bool) {
        let reset = if on { "On" } else { "ForceOff" };
        let status = self
            .post(&format!("{}/Actions/ComputerSystem.Reset", node.path), serde_json::json!({"ResetType": reset}))
            .await;
        assert_eq!(status, 204, "raw Reset {reset}");
        let want = if on { "On" } else { "Off" };
        eventually(Duration::from_secs(15), || async { self.system(node).await["PowerState"] == want }).await;
    }
}

/// Polls `check` every 50 ms until it holds; panics at the deadline.
pub async fn eventually<F, Fut>(deadline: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + deadline;
    loop {
        if check().await {
            return;
        }
        assert!(tokio::time::Instant::now() < end, "condition not met within {deadline:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
