//! The rules of an agent's report (docs/security.md, "Wiped before anyone else"): when a wipe counts as
//! verified, and why not otherwise. Pure: the service decides with these and records the verdict.
//!
//! A wipe is verified only when the report names the configured wipe image, every drive the
//! configuration listed is reported wiped, every other drive the agent found is reported wiped
//! too, each with a method from [`WIPE_METHODS`] and a verification of at least
//! [`MIN_VERIFIED_RANGES`] ranges, and the overall result is success. Otherwise the reason names
//! each drive that falls short (`drive nvme1: verification missing`).

use paddock_types::agent::{AgentReport, AgentResult, DriveReport, WipeDrive};

/// The wipe methods an agent may report, strongest first.
pub const WIPE_METHODS: [&str; 8] = [
    "nvme-sanitize-crypto",
    "nvme-sanitize-block",
    "nvme-format-crypto",
    "nvme-format-user-data",
    "ata-secure-erase-enhanced",
    "ata-secure-erase",
    "discard-zeroes",
    "overwrite-zeroes",
];

/// The fewest ranges a verification reads back: 64 sampled over the device plus its first and
/// last MiB.
pub const MIN_VERIFIED_RANGES: u64 = 66;

/// The image digest the simulated machines report for the wipe image (the simulated BMC driver's
/// default for `PADDOCK_WIPE_IMAGE_SHA256`): SHA-256 of `paddock simulated wipe image`.
pub const SIMULATED_WIPE_IMAGE_SHA256: &str = "0fe69a4d69d37826b61d5cf3668142a99abf86c090c214078aa9042b6d24937a";

/// The image digest the simulated machines report for the node OS image: SHA-256 of
/// `paddock simulated node OS image`.
pub const SIMULATED_OS_IMAGE_SHA256: &str = "4845a81eadef3a89c98cf3cff0a421f8d321a87e5695289d47ce1cf02bc31c25";

/// Equality that takes the same time wherever the inputs differ (lengths are not secret).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether `s` is a lower-case hex SHA-256.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Judges a wipe report against the drives its run listed and the configured wipe image:
/// `Ok` when it proves the wipe, else every reason it does not, joined by `; `.
pub fn judge_wipe(listed: &[WipeDrive], report: &AgentReport, wipe_image_sha256: &str) -> Result<(), String> {
    let mut reasons = Vec::new();
    if !ct_eq(report.image_sha256.as_bytes(), wipe_image_sha256.as_bytes()) {
        reasons.push(format!(
            "image: the agent booted image {}, not the configured wipe image {wipe_image_sha256}",
            report.image_sha256
        ));
    }
    for drive in &report.drives {
        let name = drive_name(drive);
        if let Some(id) = &drive.id {
            if !listed.iter().any(|l| &l.id == id) {
                reasons.push(format!("{name}: not a drive of this run's configuration"));
                continue;
            }
        }
        if let Some(why) = evidence_gap(drive) {
            reasons.push(format!("{name}: {why}"));
        }
    }
    for l in listed {
        if !report.drives.iter().any(|d| d.id.as_deref() == Some(l.id.as_str())) {
            reasons.push(format!("drive {}: not reported (the agent did not find it)", l.id));
        }
    }
    if reasons.is_empty() && listed.is_empty() {
        reasons.push("the run listed no drive, so no wipe can be verified".to_owned());
    }
    if reasons.is_empty() && report.result != AgentResult::Success {
        reasons.push("the agent reported failure".to_owned());
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(reasons.join("; "))
    }
}

/// Judges a provisioning boot's report: success, from the configured OS image.
pub fn judge_provision(report: &AgentReport, os_image_sha256: &str) -> Result<(), String> {
    if !ct_eq(report.image_sha256.as_bytes(), os_image_sha256.as_bytes()) {
        return Err(format!(
            "image: the machine booted image {}, not the configured node OS image {os_image_sha256}",
            report.image_sha256
        ));
    }
    match report.result {
        AgentResult::Success => Ok(()),
        AgentResult::Failure => Err("the machine reported a failed first boot".to_owned()),
    }
}

/// How a reason names a drive: its configured id, else what the kernel showed of it.
fn drive_name(drive: &DriveReport) -> String {
    match (&drive.id, &drive.identity.serial) {
        (Some(id), _) => format!("drive {id}"),
        (None, Some(serial)) => format!("unlisted drive with serial {serial}"),
        (None, None) => format!("unlisted drive of {} bytes", drive.identity.size_bytes),
    }
}

/// What is missing from a drive's evidence, if anything.
fn evidence_gap(drive: &DriveReport) -> Option<String> {
    if !WIPE_METHODS.contains(&drive.method.as_str()) {
        return Some(format!("unknown method {:?}", drive.method));
    }
    if drive.result != AgentResult::Success {
        return Some(match &drive.detail {
            Some(detail) => format!("wipe failed ({detail})"),
            None => "wipe failed".to_owned(),
        });
    }
    let Some(v) = &drive.verification else {
        return Some("verification missing".to_owned());
    };
    if v.ranges < MIN_VERIFIED_RANGES {
        return Some(format!("verification read {} ranges, fewer than {MIN_VERIFIED_RANGES}", v.ranges));
    }
    if v.bytes_read == 0 {
        return Some("verification read no bytes".to_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use paddock_types::agent::{DriveIdentity, MatchBasis, Verification};

    use super::*;

    const IMAGE: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    fn listed(ids: &[&str]) -> Vec<WipeDrive> {
        ids.iter()
            .map(|id| WipeDrive { id: (*id).to_owned(), serial: None, capacity_bytes: None, protocol: None })
            .collect()
    }

    fn wiped(id: Option<&str>) -> DriveReport {
        DriveReport {
            id: id.map(str::to_owned),
            match_basis: id.map(|_| MatchBasis::Serial),
            identity: DriveIdentity {
                model: None,
                serial: Some("S1".into()),
                wwn: None,
                eui: None,
                size_bytes: 1 << 40,
                protocol: Some("nvme".into()),
            },
            method: "nvme-sanitize-crypto".into(),
            result: AgentResult::Success,
            detail: None,
            verification: Some(Verification { ranges: 66, bytes_read: 66 << 20, sha256: IMAGE.into() }),
        }
    }

    fn report(drives: Vec<DriveReport>) -> AgentReport {
        AgentReport {
            result: AgentResult::Success,
            started_at: Utc::now(),
            finished_at: Utc::now(),
            image_sha256: IMAGE.into(),
            nonce: None,
            drives,
        }
    }

    #[test]
    fn complete_evidence_of_every_drive_verifies_the_wipe() {
        let r = report(vec![wiped(Some("nvme0")), wiped(Some("nvme1")), wiped(None)]);
        assert_eq!(judge_wipe(&listed(&["nvme0", "nvme1"]), &r, IMAGE), Ok(()));
    }

    #[test]
    fn each_gap_names_its_drive() {
        let mut no_verification = wiped(Some("nvme0"));
        no_verification.verification = None;
        let mut unknown = wiped(Some("nvme1"));
        unknown.method = "sim-overwrite".into();
        let mut short = wiped(Some("nvme2"));
        short.verification = Some(Verification { ranges: 65, bytes_read: 1, sha256: IMAGE.into() });
        let mut failed = wiped(None);
        failed.result = AgentResult::Failure;
        failed.detail = Some("I/O error".into());
        let r = report(vec![no_verification, unknown, short, failed]);
        let why = judge_wipe(&listed(&["nvme0", "nvme1", "nvme2", "nvme3"]), &r, IMAGE).expect_err("not verified");
        assert_eq!(
            why,
            "drive nvme0: verification missing; drive nvme1: unknown method \"sim-overwrite\"; \
             drive nvme2: verification read 65 ranges, fewer than 66; \
             unlisted drive with serial S1: wipe failed (I/O error); \
             drive nvme3: not reported (the agent did not find it)"
        );
    }

    #[test]
    fn another_image_an_overall_failure_or_a_stranger_fails_the_wipe() {
        let other = "b".repeat(64);
        let why = judge_wipe(&listed(&["nvme0"]), &report(vec![wiped(Some("nvme0"))]), &other).expect_err("image");
        assert!(why.starts_with("image: the agent booted image aaaa"), "{why}");
        let mut r = report(vec![wiped(Some("nvme0"))]);
        r.result = AgentResult::Failure;
        assert_eq!(judge_wipe(&listed(&["nvme0"]), &r, IMAGE), Err("the agent reported failure".into()));
        let r = report(vec![wiped(Some("nvme0")), wiped(Some("sdz"))]);
        let why = judge_wipe(&listed(&["nvme0"]), &r, IMAGE).expect_err("stranger");
        assert_eq!(why, "drive sdz: not a drive of this run's configuration");
        assert!(judge_wipe(&[], &report(vec![]), IMAGE).is_err(), "nothing listed proves nothing");
    }

    #[test]
    fn provisioning_needs_success_from_the_os_image() {
        assert_eq!(judge_provision(&report(vec![]), IMAGE), Ok(()));
        assert!(judge_provision(&report(vec![]), &"c".repeat(64)).is_err());
        let mut r = report(vec![]);
        r.result = AgentResult::Failure;
        assert!(judge_provision(&r, IMAGE).is_err());
    }

    #[test]
    fn helpers() {
        assert!(ct_eq(b"abc", b"abc") && !ct_eq(b"abc", b"abd") && !ct_eq(b"abc", b"ab"));
        assert!(is_sha256_hex(IMAGE) && !is_sha256_hex(&"A".repeat(64)) && !is_sha256_hex("ab"));
        use sha2::{Digest, Sha256};
        assert_eq!(hex::encode(Sha256::digest(b"paddock simulated wipe image")), SIMULATED_WIPE_IMAGE_SHA256);
        assert_eq!(hex::encode(Sha256::digest(b"paddock simulated node OS image")), SIMULATED_OS_IMAGE_SHA256);
    }
}
