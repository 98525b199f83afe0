//! A real `paddock` process on a test's database, for the tests of what only a process shows
//! (listeners, timeouts, metrics of every role). Each test binary that needs it includes this file.

use std::process::{Child, Command, Stdio};

/// A `paddock` process, killed when the test ends however it ends.
pub struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// Starts `paddock <role>` on `db` with the test keys, none of the environment's other
/// `PADDOCK_*` settings, and `extra`.
pub fn start(role: &str, db: &paddock_testkit::TestDb, extra: &[(&str, String)]) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_paddock"));
    cmd.arg(role);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("PADDOCK_")) {
        cmd.env_remove(k);
    }
    let secret = String::from_utf8(paddock_testkit::TEST_SECRET.to_vec()).expect("utf-8");
    cmd.env("PADDOCK_DATABASE_URL", &db.url)
        .env("PADDOCK_JWT_HS256_SECRET", secret)
        .env("PADDOCK_ENCRYPTION_KEY", paddock_domain::secret::Cipher::generate_key())
        .env("PADDOCK_LEDGER_KEY", "process-test-ledger-key-of-at-least-32-bytes")
        .env("PADDOCK_LOG", "warn")
        .envs(extra.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    Proc(cmd.spawn().unwrap_or_else(|e| panic!("starting `paddock {role}`: {e}")))
}
