//! `paddock dev` as the README starts it, for the tests that drive it as a user would (the
//! README's tour, the generated clients): on a free port and its own data directory, with the
//! four variables its banner exports. Stopped (SIGINT, as Ctrl-C) and cleaned up on drop.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

pub struct Dev {
    child: Child,
    /// How it ended, once stopped.
    stopped: Option<ExitStatus>,
    /// The data directory; the tests may use it for their own files too.
    pub dir: PathBuf,
    /// The banner's `export NAME=value` lines: B, TOKEN, TENANT_TOKEN, TID.
    pub exports: Vec<(String, String)>,
    /// The whole banner, line by line.
    #[allow(dead_code, reason = "read by the dev tests, not by every binary including this file")]
    pub banner: Vec<String>,
}

impl Dev {
    #[allow(dead_code, reason = "the console's test starts it with settings of its own")]
    pub fn start() -> Dev {
        Dev::start_with(&[])
    }

    /// With more settings in its environment (they win over the defaults above, `PADDOCK_LISTEN`
    /// included).
    pub fn start_with(env: &[(&str, String)]) -> Dev {
        let dir = std::env::temp_dir().join(format!("paddock-dev-test-{}", uuid::Uuid::new_v4().simple()));
        let mut child = Command::new(env!("CARGO_BIN_EXE_paddock"))
            .args(["dev", "--data-dir"])
            .arg(&dir)
            // Any free port, chosen by paddock as it binds (its banner names it): a port picked
            // here and released could be taken by another test before paddock binds it.
            .env("PADDOCK_LISTEN", "127.0.0.1:0")
            .env("PADDOCK_LOG", "warn")
            .env_remove("PADDOCK_DATABASE_URL")
            .envs(env.iter().map(|(name, value)| (name, value)))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("paddock dev starts");
        let banner = banner(child.stdout.take().expect("stdout"));
        let exports: Vec<(String, String)> = banner
            .iter()
            .filter_map(|line| line.trim().strip_prefix("export ").and_then(|l| l.split_once('=')))
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect();
        let names: Vec<&str> = exports.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["B", "TOKEN", "TENANT_TOKEN", "TID"], "the banner's exports");
        Dev { child, stopped: None, dir, exports, banner }
    }

    /// A banner variable's value (`B`, `TOKEN`, `TENANT_TOKEN`, `TID`).
    pub fn var(&self, name: &str) -> &str {
        self.exports.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str()).expect("a banner variable")
    }

    /// Ctrl-C (SIGINT), as a user stops it; returns how it exited.
    pub fn stop(&mut self) -> ExitStatus {
        if let Some(status) = self.stopped {
            return status;
        }
        let _ = Command::new("kill").args(["-INT", &self.child.id().to_string()]).status();
        let status = self.child.wait().expect("waiting for paddock dev");
        *self.stopped.insert(status)
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The banner's lines, up to its last (the tenant token's command); its reader keeps draining
/// stdout after it, so paddock never writes into a closed pipe.
fn banner(stdout: impl std::io::Read + Send + 'static) -> Vec<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut banner = Vec::new();
    loop {
        let line = rx.recv_timeout(Duration::from_secs(120)).expect("paddock dev prints its banner");
        let last = line.contains(" token --role tenant:member ");
        banner.push(line);
        if last {
            return banner;
        }
    }
}

/// Waits until the API answers `/readyz` (two minutes at most).
pub fn wait_ready(dev: &Dev) {
    let base = dev.var("B");
    let status = Command::new("timeout")
        .args(["120", "bash", "-c", &format!("until curl -sf '{base}/readyz' >/dev/null; do sleep 0.2; done")])
        .status()
        .expect("running bash and curl");
    assert!(status.success(), "paddock dev was not ready after two minutes");
}
