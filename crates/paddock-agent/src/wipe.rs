//! Wiping one disk: the methods it supports tried strongest first, each erase verified by the
//! agent's own reads; the first verified one is the evidence. Several disks are wiped in parallel.

use std::thread;

use paddock_types::agent::{AgentResult, DriveReport, Verification};

use crate::device::{read_attr, Disk, Roots};
use crate::erase;
use crate::method::{self, Method};
use crate::verify;

/// Longest `detail` the report carries, in characters.
pub const MAX_DETAIL: usize = 4096;

/// Which method to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The strongest the device supports, falling back to weaker ones.
    Auto,
    /// Exactly this one, without fallback.
    Only(Method),
}

/// Success or failure, as the report spells it.
pub type Outcome = AgentResult;

/// Wipes every disk, one thread each, and returns their evidence in the order given (a report
/// names no device node: the caller knows each one's disk by its place).
pub fn wipe_all(roots: &Roots, disks: &[Disk], choice: Choice) -> Vec<DriveReport> {
    thread::scope(|s| {
        let handles: Vec<_> = disks.iter().map(|d| s.spawn(move || wipe_disk(roots, d, choice))).collect();
        handles
            .into_iter()
            .zip(disks)
            .map(|(h, d)| {
                h.join().unwrap_or_else(|_| failed(d, Method::OverwriteZeroes, vec!["the wipe thread panicked".into()]))
            })
            .collect()
    })
}

/// Wipes one disk with the methods `choice` allows, strongest first, until one verifies.
pub fn wipe_disk(roots: &Roots, disk: &Disk, choice: Choice) -> DriveReport {
    let (caps, mut notes) = erase::probe(roots, disk);
    let supported = method::candidates(&caps);
    let methods = match choice {
        Choice::Auto => supported,
        Choice::Only(m) => {
            if !supported.contains(&m) {
                notes.push(format!("{m} is not advertised by the device; tried as asked"));
            }
            vec![m]
        }
    };
    if let Err(e) = precheck(roots, disk) {
        notes.push(format!("{e:#}"));
        return failed(disk, methods[0], notes);
    }
    let size = disk.identity.size_bytes;
    for &m in &methods {
        eprintln!("paddock-agent: {}: erasing with {m}", disk.path.display());
        if let Err(e) = erase::erase(roots, disk, m, size) {
            notes.push(format!("{m} failed: {e:#}"));
            continue;
        }
        let (flushed, verified) = thread::scope(|s| {
            let flush = s.spawn(|| erase::flush(&disk.path));
            let verified = verify::verify(&disk.path, size);
            (flush.join().unwrap_or_else(|_| Err(anyhow::anyhow!("the flush thread panicked"))), verified)
        });
        match (flushed, verified) {
            (Ok(()), Ok(v)) => return report(disk, m, Outcome::Success, notes, Some(v)),
            (Err(e), _) => notes.push(format!("{m} completed but {e:#}")),
            (_, Err(e)) => notes.push(format!("{m} completed but {e:#}")),
        }
    }
    let last = *methods.last().unwrap_or(&Method::OverwriteZeroes);
    failed(disk, last, notes)
}

/// Refuses a read-only disk and one in use.
fn precheck(roots: &Roots, disk: &Disk) -> anyhow::Result<()> {
    if read_attr(&roots.sys.join("block").join(&disk.name).join("ro")).as_deref() == Some("1") {
        anyhow::bail!("{} is read-only", disk.path.display());
    }
    erase::open_for_erase(&disk.path).map(drop)
}

fn failed(disk: &Disk, method: Method, notes: Vec<String>) -> DriveReport {
    report(disk, method, Outcome::Failure, notes, None)
}

fn report(
    disk: &Disk,
    method: Method,
    result: Outcome,
    notes: Vec<String>,
    verification: Option<Verification>,
) -> DriveReport {
    DriveReport {
        id: None,
        match_basis: None,
        identity: disk.identity.clone(),
        method: method.to_string(),
        result,
        detail: detail(&notes),
        verification,
    }
}

/// The notes joined, cut to [`MAX_DETAIL`] characters; `None` when there are none.
fn detail(notes: &[String]) -> Option<String> {
    if notes.is_empty() {
        return None;
    }
    let all = notes.join("; ");
    Some(match all.char_indices().nth(MAX_DETAIL) {
        Some((cut, _)) => all[..cut].to_owned(),
        None => all,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detail_is_cut_to_the_limit() {
        assert_eq!(detail(&[]), None);
        assert_eq!(detail(&["a".into(), "b".into()]).as_deref(), Some("a; b"));
        let long = "é".repeat(MAX_DETAIL + 10);
        assert_eq!(detail(&[long]).map(|d| d.chars().count()), Some(MAX_DETAIL));
    }
}
