//! What a real `paddock` process refuses at start (SPEC sections 5 and 9): outside `paddock dev`,
//! every process that serves or works needs the custody ledger's key, and says which setting.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn serving_processes_refuse_to_start_without_the_ledger_key_and_name_it() {
    let secret = String::from_utf8(paddock_testkit::TEST_SECRET.to_vec()).expect("utf-8");
    for role in ["serve", "api", "worker"] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_paddock"));
        cmd.arg(role);
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("PADDOCK_")) {
            cmd.env_remove(k);
        }
        // Everything else a process needs; the database is never reached (connections are lazy).
        let mut child = cmd
            .env("PADDOCK_DATABASE_URL", "postgres://paddock@127.0.0.1:1/paddock")
            .env("PADDOCK_JWT_HS256_SECRET", &secret)
            .env("PADDOCK_ENCRYPTION_KEY", paddock_domain::secret::Cipher::generate_key())
            .env("PADDOCK_LISTEN", "127.0.0.1:0")
            .env("PADDOCK_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting `paddock {role}`: {e}"));
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("`paddock {role}` started without PADDOCK_LEDGER_KEY");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let output = child.wait_with_output().expect("output");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!status.success(), "`paddock {role}` exited 0: {stderr}");
        assert!(stderr.contains("PADDOCK_LEDGER_KEY"), "`paddock {role}` did not name the setting: {stderr}");
    }
}
