//! The README's five-minute tour, run as written against `paddock dev`: the `sh` block under
//! "The API in five minutes" is taken from README.md, run by bash with the four variables the
//! banner exports (read from the banner itself), and every `curl` in it must get a success (a
//! 4xx or 5xx fails the run, through `curl --fail-with-body`), every `jq` must parse what it got,
//! every `until` loop must end. So the README cannot rot.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The tour's block: the first ```sh fence after its heading, without the fences.
fn tour() -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
        .expect("reading README.md");
    let section = readme.split_once("## The API in five minutes").expect("the tour's heading").1;
    let block = section.split_once("```sh\n").expect("the tour's sh block").1;
    block.split_once("\n```").expect("the block's end").0.to_owned()
}

/// The `export NAME=value` lines of the banner, until all four were seen.
fn banner_exports(stdout: impl std::io::Read + Send + 'static) -> Vec<(String, String)> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some((name, value)) = line.trim().strip_prefix("export ").and_then(|l| l.split_once('=')) {
                let _ = tx.send((name.to_owned(), value.to_owned()));
            }
        }
    });
    let mut exports = Vec::new();
    while exports.len() < 4 {
        let export = rx.recv_timeout(Duration::from_secs(120)).expect("paddock dev prints four export lines");
        exports.push(export);
    }
    exports
}

#[test]
fn the_readme_tour_runs_as_written_against_paddock_dev() {
    let dir = std::env::temp_dir().join(format!("paddock-readme-test-{}", uuid::Uuid::new_v4().simple()));
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let mut dev = Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args(["dev", "--data-dir"])
        .arg(&dir)
        .env("PADDOCK_LISTEN", format!("127.0.0.1:{port}"))
        .env("PADDOCK_LOG", "warn")
        .env_remove("PADDOCK_DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("paddock dev starts");
    let exports = banner_exports(dev.stdout.take().expect("stdout"));
    let names: Vec<&str> = exports.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["B", "TOKEN", "TENANT_TOKEN", "TID"], "the banner's exports");

    // Each command echoed (-x) so a failure shows where; `curl` fails on any error status, and
    // the whole tour has five minutes.
    let script = format!(
        "set -euo pipefail -x\ncurl() {{ command curl --fail-with-body --max-time 30 \"$@\"; }}\n\
         until curl -s \"$B/readyz\" >/dev/null 2>&1; do sleep 0.2; done\n{}\n",
        tour()
    );
    let work = dir.join("tour");
    std::fs::create_dir_all(&work).expect("the tour's directory");
    let out = Command::new("timeout")
        .args(["300", "bash", "-c", &script])
        .current_dir(&work)
        .envs(exports.iter().map(|(n, v)| (n.as_str(), v.as_str())))
        .output()
        .expect("running bash (and curl, jq)");
    let _ = Command::new("kill").args(["-INT", &dev.id().to_string()]).status();
    let _ = dev.wait();
    let said = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
    println!("{said}");
    assert!(out.status.success(), "the README's tour failed ({}):\n{said}", out.status);
    assert!(said.contains("not_found"), "the tour shows a problem's code:\n{said}");
}
