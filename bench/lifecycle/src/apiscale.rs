//! `lifecycle-bench api-scale` (run by `bench/scale-out/run`): one and two `paddock api`
//! processes (the release binary) on one PostgreSQL, each behind HAProxy (Debian's `haproxy`,
//! round robin, HTTP keep-alive), under wrk's load of `GET /v1/tenants/{id}` and
//! `POST /v1/tenants` (bench/wrk/post-tenants.lua). HAProxy has two frontends, one routing to the
//! first process alone and one to both, so both configurations pay for the same proxy; the
//! measured windows alternate between them (one, two, two, one, ...), so the machine's slow swings
//! fall on both alike. Reports requests/s, the ratio of two to one, and the CPU of each party.

use super::*;

/// One configuration's totals over its windows.
#[derive(Default)]
struct Tally {
    requests: f64,
    secs: f64,
    postgres: f64,
    paddock: f64,
    commits: i64,
}

pub(super) async fn api_scale(admin_url: &str, args: &Args) -> anyhow::Result<()> {
    let bin = PathBuf::from(args.str("paddock", "target/release/paddock"));
    let wrk = args.str("wrk", "wrk");
    let haproxy = args.str("haproxy", "haproxy");
    let lua = args.str("post-script", "bench/wrk/post-tenants.lua");
    let window: u64 = args.get("window-s", 6)?;
    let rounds: usize = args.get("rounds", 8)?;
    let connections = args.str("connections", "64");
    let log_dir = args.str("log-dir", "/tmp");
    let admin = PgPoolOptions::new().max_connections(2).connect(admin_url).await?;
    let name = "scale_out_api";
    let url = fresh_database(&admin, admin_url, name).await?;

    let apis = [Api1::start(&bin, &url, &log_dir, 0).await?, Api1::start(&bin, &url, &log_dir, 1).await?];
    let (one, two) = (free_port()?, free_port()?);
    let proxy = start_haproxy(&haproxy, &log_dir, one, two, &apis).await?;
    let api = Api::new(&format!("http://127.0.0.1:{one}"))?;
    let tenant = api.post("/v1/tenants", &json!({"name": "bench-get"})).await?;
    let id = tenant["id"].as_str().context("tenant id")?.to_owned();
    let auth = format!("Authorization: Bearer {}", api.token);
    println!("\napi-scale: 1 and 2 `paddock api` behind haproxy; wrk -t2 -c{connections}, {rounds} windows of {window} s each");

    for (test, path, script) in
        [("GET", format!("/v1/tenants/{id}"), None), ("POST", "/v1/tenants".to_owned(), Some(&lua))]
    {
        let mut tallies = [Tally::default(), Tally::default()];
        for round in 0..rounds {
            // one, two, two, one, one, two, ...
            let which = usize::from((round % 4 == 1) || (round % 4 == 2));
            let port = [one, two][which];
            let mut cmd = tokio::process::Command::new(&wrk);
            cmd.args(["-t2", "-c", &connections, "-d", &format!("{window}s"), "-H", &auth]);
            if let Some(script) = script {
                cmd.args(["-H", "Content-Type: application/json", "-s", script]);
            }
            cmd.arg(format!("http://127.0.0.1:{port}{path}"));
            if script.is_some() {
                cmd.args(["--", &format!("w{which}r{round}-")]);
            }
            let cpu0 = apis.iter().map(Api1::cpu).sum::<f64>();
            let a = snap(&admin, name, None).await?;
            let out = cmd.output().await.context("running wrk")?;
            let b = snap(&admin, name, None).await?;
            let cpu1 = apis.iter().map(Api1::cpu).sum::<f64>();
            let text = String::from_utf8_lossy(&out.stdout);
            let requests = wrk_requests(&text)?;
            let d = delta(&a, &b);
            let t = &mut tallies[which];
            t.requests += requests;
            t.secs += d.secs;
            t.postgres += d.postgres;
            t.paddock += cpu1 - cpu0;
            t.commits += d.commits;
        }
        for (n, t) in tallies.iter().enumerate() {
            println!(
                "api_{test}_{}: {:.0} req/s; cores: paddock {:.2}, postgres {:.2}; {:.2} commits and postgres {:.0} us, \
                 paddock {:.0} us CPU per request",
                n + 1,
                t.requests / t.secs,
                t.paddock / t.secs,
                t.postgres / t.secs,
                t.commits as f64 / t.requests.max(1.0),
                t.postgres * 1e6 / t.requests.max(1.0),
                t.paddock * 1e6 / t.requests.max(1.0),
            );
        }
        let r = |t: &Tally| t.requests / t.secs.max(1e-9);
        println!("api_{test}_ratio: {:.2} (two processes / one)", r(&tallies[1]) / r(&tallies[0]));
    }
    drop(proxy);
    for api in apis {
        api.stop().await;
    }
    Ok(())
}

/// wrk's request count (`N requests in ...`); an invalid run (socket errors, non-2xx) is an error.
fn wrk_requests(text: &str) -> anyhow::Result<f64> {
    if text.contains("Non-2xx")
        || text.contains("Socket errors")
        || text.contains("non201=") && !text.contains("non201=0")
    {
        bail!("wrk saw errors: {text}");
    }
    text.lines()
        .find_map(|l| l.trim().split_once(" requests in ").map(|(n, _)| n.trim().to_owned()))
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no request count in wrk's output: {text}"))
}

async fn start_haproxy(
    haproxy: &str,
    log_dir: &str,
    one: u16,
    two: u16,
    apis: &[Api1; 2],
) -> anyhow::Result<tokio::process::Child> {
    let config = format!(
        "global\n  maxconn 4096\ndefaults\n  mode http\n  option http-keep-alive\n  timeout connect 5s\n  \
         timeout client 60s\n  timeout server 60s\n\
         frontend one\n  bind 127.0.0.1:{one}\n  default_backend one\n\
         frontend two\n  bind 127.0.0.1:{two}\n  default_backend two\n\
         backend one\n  balance roundrobin\n  server a {a}\n\
         backend two\n  balance roundrobin\n  server a {a}\n  server b {b}\n",
        a = apis[0].listen,
        b = apis[1].listen
    );
    let path = format!("{log_dir}/scale-out-haproxy.cfg");
    std::fs::write(&path, config)?;
    let child = tokio::process::Command::new(haproxy)
        .args(["-db", "-f", &path])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting haproxy")?;
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while http.get(format!("http://127.0.0.1:{two}/v1/machine-classes")).send().await.is_err() {
        if Instant::now() > deadline {
            bail!("haproxy did not start listening on {two}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(child)
}

/// One `paddock api` process (no drivers: the API's own routes only).
struct Api1 {
    child: tokio::process::Child,
    pid: u32,
    listen: String,
}

impl Api1 {
    async fn start(bin: &Path, url: &str, log_dir: &str, n: usize) -> anyhow::Result<Self> {
        let listen = format!("127.0.0.1:{}", free_port()?);
        let log = std::fs::File::create(format!("{log_dir}/scale-out-api-{n}.log"))?;
        let child = tokio::process::Command::new(bin)
            .arg("api")
            .env("PADDOCK_DATABASE_URL", url)
            .env("PADDOCK_LISTEN", &listen)
            .env("PADDOCK_JWT_HS256_SECRET", SECRET)
            .env("PADDOCK_ENCRYPTION_KEY", bench_key())
            .env("PADDOCK_LEDGER_KEY", "bench-ledger-key-of-at-least-32-bytes")
            .env("PADDOCK_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} api", bin.display()))?;
        let pid = child.id().context("child pid")?;
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while http.get(format!("http://{listen}/v1/machine-classes")).send().await.is_err() {
            if Instant::now() > deadline {
                bail!("`paddock api` did not start listening on {listen}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Self { child, pid, listen })
    }

    fn cpu(&self) -> f64 {
        proc_cpu(self.pid, false).unwrap_or(0.0)
    }

    async fn stop(mut self) {
        let _ = std::process::Command::new("kill").arg("-TERM").arg(self.pid.to_string()).status();
        if tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await.is_err() {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
    }
}
