//! Faults of the environment, with real `paddock` processes:
//! - PostgreSQL restarted under load: while it is down requests fail fast with 503 and
//!   `Retry-After`, the process recovers by itself, and every acknowledged write is there (counted);
//!   this test starts a PostgreSQL of its own (scripts/pg-start in a directory of its own) so that it
//!   can stop and start it;
//! - a slow database (a table locked by another session): `PADDOCK_DATABASE_STATEMENT_TIMEOUT`
//!   turns the stuck requests into 503s, and requests that do not touch the table are served;
//! - SIGTERM: the request in flight is finished, the running job is given back to the queue within
//!   `PADDOCK_SHUTDOWN_GRACE`, and the process exits 0 within its grace period.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sqlx::PgPool;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// A `paddock` process, killed when the test ends however it ends.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    fn sigterm(&self) {
        let status = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status().expect("kill");
        assert!(status.success(), "kill -TERM");
    }

    /// Waits for the exit, failing the test after `within`.
    async fn exit_within(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.0.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "paddock did not exit within {within:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn running(&mut self) -> bool {
        self.0.try_wait().expect("wait").is_none()
    }
}

/// `paddock <role>` on `database_url`, no drivers unless `extra` chooses some.
fn start(role: &str, database_url: &str, port: u16, log: &Path, extra: &[(&str, &str)]) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_paddock"));
    cmd.arg(role);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("PADDOCK_")) {
        cmd.env_remove(k);
    }
    let secret = String::from_utf8(paddock_testkit::TEST_SECRET.to_vec()).expect("utf-8");
    let file = std::fs::File::create(log).expect("log file");
    cmd.env("PADDOCK_DATABASE_URL", database_url)
        .env("PADDOCK_LISTEN", format!("127.0.0.1:{port}"))
        .env("PADDOCK_JWT_HS256_SECRET", secret)
        .env("PADDOCK_ENCRYPTION_KEY", paddock_domain::secret::Cipher::generate_key())
        .env("PADDOCK_LEDGER_KEY", "faults-test-ledger-key-of-at-least-32-bytes")
        .env("PADDOCK_LOG", "info,sqlx=warn")
        .env("NO_COLOR", "1")
        .envs(extra.iter().copied())
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log"))
        .stderr(file);
    Proc(cmd.spawn().unwrap_or_else(|e| panic!("starting `paddock {role}`: {e}")))
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("client")
}

async fn wait_ready(base: &str, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !client().get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
        let log = std::fs::read_to_string(log).unwrap_or_default();
        assert!(Instant::now() < deadline, "paddock did not become ready:\n{log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One request's answer: status, `Retry-After`, body, how long it took.
struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: Value,
    took: Duration,
}

async fn send(method: reqwest::Method, url: &str, body: Option<Value>) -> Answer {
    let t0 = Instant::now();
    let mut req = client().request(method, url).bearer_auth(paddock_testkit::admin());
    if let Some(body) = body {
        req = req.header("content-type", "application/json").body(body.to_string());
    }
    let rsp = req.send().await.unwrap_or_else(|e| panic!("{url}: no answer: {e}"));
    let status = rsp.status().as_u16();
    let retry_after = rsp.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let text = rsp.text().await.expect("body");
    Answer { status, retry_after, body: serde_json::from_str(&text).unwrap_or(Value::String(text)), took: t0.elapsed() }
}

async fn create_tenant(base: &str, name: &str) -> Answer {
    let body = json!({ "name": name, "display_name": name });
    send(reqwest::Method::POST, &format!("{base}/v1/tenants"), Some(body)).await
}

/// A PostgreSQL of this test's own (scripts/pg-start), stopped and removed when dropped.
struct OwnPostgres {
    url: String,
    data: PathBuf,
    base: PathBuf,
    port: String,
    bin: PathBuf,
}

impl OwnPostgres {
    fn start() -> Self {
        let base = PathBuf::from(format!("/var/tmp/paddock-faults-pg-{}", std::process::id()));
        let out = Command::new(repo().join("scripts/pg-start"))
            .env("PADDOCK_TEST_PG_DIR", &base)
            .env_remove("PADDOCK_TEST_PG_PORT")
            .stderr(Stdio::inherit())
            .output()
            .expect("scripts/pg-start");
        assert!(out.status.success(), "scripts/pg-start failed");
        let vars = String::from_utf8(out.stdout).expect("utf-8");
        let var = |name: &str| {
            vars.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("{name} in pg-start's output: {vars}"))
                .to_owned()
        };
        let (url, data) = (var("PADDOCK_TEST_DATABASE_URL"), PathBuf::from(var("PADDOCK_TEST_PG_DATA")));
        let port = url.rsplit(':').next().and_then(|p| p.split('/').next()).expect("port").to_owned();
        // postmaster.opts names the server binary: pg_ctl is beside it.
        let opts = std::fs::read_to_string(data.join("postmaster.opts")).expect("postmaster.opts");
        let postgres = opts.split_whitespace().next().expect("the server's path").trim_matches('"');
        let bin = Path::new(postgres).parent().expect("bin dir").to_owned();
        Self { url, data, base, port, bin }
    }

    /// `pg_ctl` as the server's user (`postgres` when we are root, as scripts/pg-start runs it).
    fn pg_ctl(&self, args: &[&str]) {
        let pg_ctl = self.bin.join("pg_ctl");
        let root = std::fs::read_to_string("/proc/self/status")
            .expect("status")
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
        let mut cmd = if root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(pg_ctl);
            c
        } else {
            Command::new(pg_ctl)
        };
        let status = cmd.args(args).arg("-D").arg(&self.data).stdout(Stdio::null()).status().expect("pg_ctl");
        assert!(status.success(), "pg_ctl {args:?}");
    }

    fn stop(&self) {
        self.pg_ctl(&["stop", "-m", "fast", "-w", "-t", "60"]);
    }

    fn start_again(&self) {
        let log = self.base.join("postgres.log").display().to_string();
        self.pg_ctl(&["start", "-w", "-t", "60", "-l", &log, "-o", &format!("-p {}", self.port)]);
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("scripts/pg-stop")).env("PADDOCK_TEST_PG_DATA", &self.data).status();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// How long PostgreSQL stays down.
const OUTAGE: Duration = Duration::from_secs(12);

/// What the load saw: acknowledged tenant names, 503s (with their Retry-After and latency).
#[derive(Default)]
struct Tally {
    acknowledged: Vec<String>,
    unavailable: usize,
    slowest_503: Duration,
    slowest: Duration,
    other: Vec<String>,
}

#[tokio::test]
async fn postgres_restarted_under_load_gives_fast_503s_and_loses_no_acknowledged_write() {
    let pg = OwnPostgres::start();
    let logs = std::env::temp_dir().join(format!("paddock-faults-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&logs).expect("logs");
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let log = logs.join("serve.log");
    let mut proc = start("serve", &pg.url, port, &log, &[]);
    wait_ready(&base, &log).await;

    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..6)
        .map(|w| {
            let (base, tally, stop) = (base.clone(), tally.clone(), stop.clone());
            tokio::spawn(async move {
                // Bounded: at most 5000 requests per task.
                for i in 0..5000 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let name = format!("load-{w}-{i}");
                    let a = create_tenant(&base, &name).await;
                    let unavailable = a.status == 503;
                    {
                        let mut t = tally.lock().expect("tally");
                        t.slowest = t.slowest.max(a.took);
                        match (a.status, a.retry_after) {
                            (201, _) => t.acknowledged.push(name),
                            (503, Some(_)) => {
                                t.unavailable += 1;
                                t.slowest_503 = t.slowest_503.max(a.took);
                            }
                            (status, retry_after) => t.other.push(format!("{status} {retry_after:?} {}", a.body)),
                        }
                    }
                    if unavailable {
                        // What a client honouring Retry-After would do, shortened.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = tally.lock().expect("tally").acknowledged.len();
    pg.stop();
    // Well over the pool's acquire timeout (5 s), which bounds how long a request waits.
    tokio::time::sleep(OUTAGE).await;
    let while_down = tally.lock().expect("tally").unavailable;
    pg.start_again();
    let restarted = Instant::now();
    // Recovery: writes are acknowledged again, by the same process.
    let acknowledged_after_restart = loop {
        let n = tally.lock().expect("tally").acknowledged.len();
        if n > before + 50 {
            break n;
        }
        assert!(restarted.elapsed() < Duration::from_secs(60), "no recovery after the restart");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stop.store(true, Ordering::SeqCst);
    for task in load {
        task.await.expect("load task");
    }
    assert!(proc.running(), "paddock serve exited during the outage");

    let t = std::mem::take(&mut *tally.lock().expect("tally"));
    assert!(t.other.is_empty(), "answers other than 201 or 503 with Retry-After: {:?}", t.other);
    assert!(while_down > 0, "no 503 while PostgreSQL was down");
    // Fast: bounded by the pool's acquire timeout (5 s, with slack for a loaded machine), not by
    // the outage.
    assert!(t.slowest < OUTAGE - Duration::from_secs(2), "an answer took {:?} during the outage", t.slowest);
    let pool = PgPool::connect(&pg.url).await.expect("connect");
    let stored: Vec<String> = sqlx::query_scalar("select name from tenants where name like 'load-%'")
        .fetch_all(&pool)
        .await
        .expect("tenants");
    let missing: Vec<&String> = t.acknowledged.iter().filter(|n| !stored.contains(n)).collect();
    println!(
        "faults: {} writes acknowledged ({before} before the stop, {acknowledged_after_restart} when recovered), \
         {} answered 503 (slowest {:?}; slowest answer {:?}), {} stored, {} missing",
        t.acknowledged.len(),
        t.unavailable,
        t.slowest_503,
        t.slowest,
        stored.len(),
        missing.len()
    );
    assert!(missing.is_empty(), "acknowledged writes lost: {missing:?}");
    pool.close().await;
    drop(proc);
    std::fs::remove_dir_all(&logs).expect("remove logs");
}

/// Holds an exclusive lock on `tenants` in an open transaction until the returned sender fires.
async fn lock_tenants(pool: &PgPool) -> tokio::sync::oneshot::Sender<()> {
    let (locked_tx, locked_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let pool = pool.clone();
    tokio::spawn(async move {
        let mut tx = pool.begin().await.expect("begin");
        sqlx::query("lock table tenants in access exclusive mode").execute(&mut *tx).await.expect("lock");
        let _ = locked_tx.send(());
        let _ = release_rx.await;
        tx.commit().await.expect("commit");
    });
    locked_rx.await.expect("the lock is taken");
    release_tx
}

#[tokio::test]
async fn a_slow_database_times_statements_out_without_starving_other_requests() {
    let db = paddock_testkit::TestDb::new().await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let log = std::env::temp_dir().join(format!("paddock-faults-slow-{}.log", uuid::Uuid::new_v4().simple()));
    let _proc = start("api", &db.url, port, &log, &[("PADDOCK_DATABASE_STATEMENT_TIMEOUT", "1")]);
    wait_ready(&base, &log).await;

    let release = lock_tenants(&db.pool).await;
    // More stuck writes than the pool has connections (16), with reads of another table among them.
    let writes: Vec<_> = (0..24)
        .map(|i| {
            let base = base.clone();
            tokio::spawn(async move { create_tenant(&base, &format!("slow-{i}")).await })
        })
        .collect();
    let reads: Vec<_> = (0..8)
        .map(|_| {
            let url = format!("{base}/v1/machine-classes");
            tokio::spawn(async move { send(reqwest::Method::GET, &url, None).await })
        })
        .collect();
    for write in writes {
        let a = write.await.expect("write task");
        assert_eq!(a.status, 503, "a write stuck behind the lock: {}", a.body);
        assert!(a.retry_after.is_some(), "503 without Retry-After");
        // The lock is held until every answer is in: these came from the timeout, not the lock.
        assert!(a.took < Duration::from_secs(20), "a stuck write took {:?}", a.took);
    }
    for read in reads {
        let a = read.await.expect("read task");
        assert_eq!(a.status, 200, "a read of another table: {}", a.body);
    }
    let _ = release.send(());
    // Once the database is fast again, the same write goes through.
    let a = create_tenant(&base, "slow-after").await;
    assert_eq!(a.status, 201, "{}", a.body);
    let _ = std::fs::remove_file(&log);
}

#[tokio::test]
async fn sigterm_finishes_the_request_in_flight_gives_back_the_running_job_and_exits_in_time() {
    let db = paddock_testkit::TestDb::new().await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let log = std::env::temp_dir().join(format!("paddock-faults-term-{}.log", uuid::Uuid::new_v4().simple()));
    // Slow simulated machines (a machine's enrollment runs for a while), a grace of 3 s.
    let env = [
        ("PADDOCK_KUBE_DRIVER", "simulated"),
        ("PADDOCK_BMC_DRIVER", "simulated"),
        ("PADDOCK_WIPE_IMAGE_URL", "http://images.faults.invalid/wipe.iso"),
        ("PADDOCK_OS_IMAGE_URL", "http://images.faults.invalid/os.img"),
        ("PADDOCK_AGENT_INSECURE_HTTP", "true"),
        ("PADDOCK_SIM_LATENCY_SCALE", "50"),
        ("PADDOCK_SHUTDOWN_GRACE", "3"),
        ("PADDOCK_DATABASE_STATEMENT_TIMEOUT", "20"),
    ];
    let mut proc = start("serve", &db.url, port, &log, &env);
    wait_ready(&base, &log).await;
    let class = json!({"name": "small", "cpu_cores": 8, "memory_gib": 32, "gpu_count": 0});
    let a = send(reqwest::Method::POST, &format!("{base}/v1/machine-classes"), Some(class)).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let machine = json!({"name": "m-0", "machine_class": "small",
                         "bmc": {"url": "sim://m-0", "username": "a", "password": "b"}});
    let a = send(reqwest::Method::POST, &format!("{base}/v1/machines"), Some(machine)).await;
    assert!(a.status == 201 || a.status == 202, "{}", a.body);
    let machine_id = a.body["machine"]["id"].as_str().expect("machine id").to_owned();
    let running = "select count(*) from jobs where state = 'running' and target_id = $1::uuid";
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n: i64 = sqlx::query_scalar(running).bind(&machine_id).fetch_one(&db.pool).await.expect("count");
        if n == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the machine's job never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A request in flight when SIGTERM arrives: stuck behind a lock, released after the signal.
    let release = lock_tenants(&db.pool).await;
    let in_flight = {
        let base = base.clone();
        tokio::spawn(async move { create_tenant(&base, "in-flight").await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let signalled = Instant::now();
    proc.sigterm();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = release.send(());
    let a = in_flight.await.expect("in-flight task");
    assert_eq!(a.status, 201, "the request in flight was not finished: {}", a.body);

    let status = proc.exit_within(Duration::from_secs(3 + 5)).await;
    println!("faults: exited {status} {:?} after SIGTERM", signalled.elapsed());
    assert!(status.success(), "exit status {status}");
    // The job is no longer held by the stopped process: given back (or done), never left leased.
    let (state, code): (String, Option<String>) = sqlx::query_as(
        "select state, last_error->>'code' from jobs where target_id = $1::uuid order by created_at limit 1",
    )
    .bind(&machine_id)
    .fetch_one(&db.pool)
    .await
    .expect("the job");
    assert!(
        (state == "queued" && code.as_deref() == Some("worker_stopped")) || state == "succeeded",
        "the machine's job after the stop: {state} {code:?}"
    );
    let _ = std::fs::remove_file(&log);
}
