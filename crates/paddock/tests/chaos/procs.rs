//! The processes of the chaos test (one `paddock api`, the workers it kills) and its thin client
//! of the API.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// The processes the test started; every one is killed when the test ends, however it ends.
pub(crate) struct Procs {
    pub(crate) api: Option<Child>,
    pub(crate) workers: Vec<Option<Child>>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) logs: PathBuf,
    pub(crate) starts: usize,
}

impl Procs {
    pub(crate) fn spawn(&mut self, role: &str, log: &str) -> Child {
        self.starts += 1;
        let path = self.logs.join(log);
        let mut file = OpenOptions::new().create(true).append(true).open(&path).expect("log file");
        let _ = writeln!(file, "===== chaos: start #{} of `paddock {role}` =====", self.starts);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_paddock"));
        cmd.arg(role);
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("PADDOCK_")) {
            cmd.env_remove(k);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting `paddock {role}`: {e}"))
    }

    /// Starts worker `i` unless it runs.
    pub(crate) fn start_worker(&mut self, i: usize) {
        if self.workers[i].is_none() {
            let child = self.spawn("worker", &format!("worker-{i}.log"));
            self.workers[i] = Some(child);
        }
    }

    /// The worker whose process is `pid`.
    pub(crate) fn worker_of(&self, pid: u32) -> Option<usize> {
        self.workers.iter().position(|w| w.as_ref().is_some_and(|c| c.id() == pid))
    }

    /// SIGKILL (what `Child::kill` sends on Unix), then reap.
    pub(crate) fn kill_worker(&mut self, i: usize) -> Option<u32> {
        let mut child = self.workers[i].take()?;
        let pid = child.id();
        let _ = child.kill();
        let _ = child.wait();
        Some(pid)
    }

    /// Workers that exited by themselves (they should not).
    pub(crate) fn exited_workers(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, w) in self.workers.iter_mut().enumerate() {
            if let Some(child) = w {
                if let Ok(Some(status)) = child.try_wait() {
                    out.push(format!("worker {i} (pid {}) exited by itself: {status}", child.id()));
                    *w = None;
                }
            }
        }
        out
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for child in self.workers.iter_mut().filter_map(Option::take).chain(self.api.take()) {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A thin client of the API under test.
pub(crate) struct Api {
    pub(crate) client: reqwest::Client,
    pub(crate) base: String,
    pub(crate) token: String,
}

impl Api {
    pub(crate) async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut last = String::new();
        for _ in 0..5 {
            let mut req = self.client.request(method.clone(), format!("{}{path}", self.base)).bearer_auth(&self.token);
            if let Some(body) = &body {
                let ct =
                    if method == reqwest::Method::PATCH { "application/merge-patch+json" } else { "application/json" };
                req = req.header("content-type", ct).body(body.to_string());
            }
            match req.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let text = resp.text().await.unwrap_or_default();
                    return (status, serde_json::from_str(&text).unwrap_or(Value::String(text)));
                }
                Err(e) => {
                    last = e.to_string();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        panic!("{method} {path}: the API does not answer: {last}");
    }

    pub(crate) async fn expect(&self, method: reqwest::Method, path: &str, body: Value, want: u16) -> Value {
        let sent = (!body.is_null()).then(|| body.clone());
        let (status, answer) = self.call(method.clone(), path, sent).await;
        assert_eq!(status, want, "{method} {path} {body}: unexpected answer {status}: {answer}");
        answer
    }
}

pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Lines of every log that report errors or panics (the last few of each).
pub(crate) fn log_problems(dir: &Path) -> String {
    let mut out = String::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir).map(|d| d.filter_map(Result::ok).collect()).unwrap_or_default();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let bad: Vec<&str> =
            text.lines().filter(|l| l.contains("ERROR") || l.contains("panicked") || l.contains(" WARN ")).collect();
        out.push_str(&format!(
            "--- {} ({} error/warn lines; last 15)\n{}\n",
            entry.path().display(),
            bad.len(),
            bad[bad.len().saturating_sub(15)..].join("\n")
        ));
    }
    out
}
