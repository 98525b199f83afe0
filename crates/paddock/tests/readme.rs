//! The README's five-minute tour, run as written against `paddock dev`: the `sh` block under
//! "The API in five minutes" is taken from README.md, run by bash with the four variables the
//! banner exports (read from the banner itself), and every `curl` in it must get a success (a
//! 4xx or 5xx fails the run, through `curl --fail-with-body`), every `jq` must parse what it got,
//! every `until` loop must end. So the README cannot rot.

mod support;

use std::path::Path;
use std::process::Command;

/// The tour's block: the first ```sh fence after its heading, without the fences.
fn tour() -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
        .expect("reading README.md");
    let section = readme.split_once("## The API in five minutes").expect("the tour's heading").1;
    let block = section.split_once("```sh\n").expect("the tour's sh block").1;
    block.split_once("\n```").expect("the block's end").0.to_owned()
}

#[test]
fn the_readme_tour_runs_as_written_against_paddock_dev() {
    let dev = support::Dev::start();
    support::wait_ready(&dev);

    // Each command echoed (-x) so a failure shows where; `curl` fails on any error status, and
    // the whole tour has five minutes.
    let script =
        format!("set -euo pipefail -x\ncurl() {{ command curl --fail-with-body --max-time 30 \"$@\"; }}\n{}\n", tour());
    let work = dev.dir.join("tour");
    std::fs::create_dir_all(&work).expect("the tour's directory");
    let out = Command::new("timeout")
        .args(["300", "bash", "-c", &script])
        .current_dir(&work)
        .envs(dev.exports.iter().map(|(n, v)| (n.as_str(), v.as_str())))
        .output()
        .expect("running bash (and curl, jq)");
    drop(dev);
    let said = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{said}");
    assert!(out.status.success(), "the README's tour failed ({}):\n{said}", out.status);
    assert!(said.contains("not_found"), "the tour shows a problem's code:\n{said}");
}
