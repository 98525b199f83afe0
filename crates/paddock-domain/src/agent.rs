//! The rules of an agent's report (docs/security.md, "Wiped before anyone else"): when a wipe counts as
//! verified, and why not otherwise. Pure: the service decides with these and records the verdict.
//!
//! A wipe is verified only when the report echoes the run's nonce, its times fall within the run,
//! it names the configured wipe image, every block device the agent saw is accounted for and no
//! disk of the machine was left unwiped, every drive the configuration listed is reported wiped
//! with an identity that agrees with the inventory (its serial where the inventory's is unique,
//! else its protocol, and its capacity), every other drive the agent found is reported wiped too,
//! each with a method from [`WIPE_METHODS`] and a verification of exactly the contract's ranges
//! ([`VERIFIED_RANGES`]), as many bytes as those ranges hold on a drive of its size
//! ([`verified_bytes`]) and the digest of that many zero bytes, and the overall result is success.
//! Otherwise the reason names each check that fails (`drive nvme1: verification missing`).

use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use paddock_types::agent::{
    AgentReport, AgentResult, BlockDeviceAction, BlockDeviceKind, DriveReport, MatchBasis, WipeDrive,
};
use paddock_types::health::HealthStatus;
use sha2::{Digest, Sha256};

/// The wipe methods an agent may report, strongest first. Every one is checked as zeroing: the
/// agent accepts a method only when every range it reads back afterwards is zeroes.
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

/// The ranges a verification reads back: the first MiB, 64 sampled over the device, the last MiB.
pub const VERIFIED_RANGES: u64 = 66;
/// Length of the first and the last range.
const END_BYTES: u64 = 1 << 20;
/// Ranges sampled between them, and the length of each.
const SAMPLES: u64 = 64;
const SAMPLE_BYTES: u64 = 64 << 10;

/// How far the machine's clock may be from paddock's when the report's times are checked.
pub const CLOCK_SKEW: chrono::Duration = chrono::Duration::minutes(5);

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

/// The bytes the contract's [`VERIFIED_RANGES`] ranges hold on a drive of `size` bytes (each
/// range cut to the size): 6 MiB on any drive of at least 1 MiB.
pub fn verified_bytes(size: u64) -> u64 {
    2 * END_BYTES.min(size) + SAMPLES * SAMPLE_BYTES.min(size)
}

/// The SHA-256 (hex) of `len` zero bytes: what a verification of that many bytes digests.
pub fn zeros_sha256(len: u64) -> String {
    static COMMON: OnceLock<String> = OnceLock::new();
    let common = verified_bytes(u64::MAX);
    if len == common {
        return COMMON.get_or_init(|| digest_zeros(common)).clone();
    }
    digest_zeros(len)
}

fn digest_zeros(len: u64) -> String {
    let chunk = [0u8; 64 << 10];
    let mut hasher = Sha256::new();
    let mut left = len;
    while left > 0 {
        let n = left.min(chunk.len() as u64);
        hasher.update(&chunk[..n as usize]);
        left -= n;
    }
    hex::encode(hasher.finalize())
}

/// What a report is judged against: the run as paddock issued it (the nonce it echoes is checked
/// as the report is decoded: another run's is refused outright).
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// When its tokens were issued (nothing of the run happened before).
    pub issued_at: DateTime<Utc>,
    /// When the report arrived (nothing of the run happened after).
    pub received_at: DateTime<Utc>,
}

/// The checks every report passes, whatever the run's purpose: the nonce and the times.
fn run_gaps(run: &Run, report: &AgentReport, reasons: &mut Vec<String>) {
    if report.nonce.is_none() {
        reasons.push("nonce: missing (a report echoes its run's nonce)".to_owned());
    }
    if report.started_at < run.issued_at - CLOCK_SKEW {
        reasons
            .push(format!("times: started_at {} is before the run was issued ({})", report.started_at, run.issued_at));
    }
    if report.finished_at > run.received_at + CLOCK_SKEW {
        reasons.push(format!(
            "times: finished_at {} is after the report arrived ({})",
            report.finished_at, run.received_at
        ));
    }
}

fn verdict(reasons: Vec<String>) -> Result<(), String> {
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(reasons.join("; "))
    }
}

/// Judges a wipe report against its run, the drives the run listed and the configured wipe image:
/// `Ok` when it proves the wipe, else every reason it does not, joined by `; `.
pub fn judge_wipe(
    run: &Run,
    listed: &[WipeDrive],
    report: &AgentReport,
    wipe_image_sha256: &str,
) -> Result<(), String> {
    let mut reasons = Vec::new();
    run_gaps(run, report, &mut reasons);
    if !ct_eq(report.image_sha256.as_bytes(), wipe_image_sha256.as_bytes()) {
        reasons.push(format!(
            "image: the agent booted image {}, not the configured wipe image {wipe_image_sha256}",
            report.image_sha256
        ));
    }
    device_gaps(report, &mut reasons);
    for drive in &report.drives {
        let name = drive_name(drive);
        let gap = match &drive.id {
            Some(id) => match listed.iter().find(|l| &l.id == id) {
                Some(l) => identity_gap(listed, l, drive).or_else(|| evidence_gap(drive)),
                None => Some("not a drive of this run's configuration".to_owned()),
            },
            None => evidence_gap(drive),
        };
        if let Some(why) = gap {
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
    verdict(reasons)
}

/// Every block device must be accounted for, and a disk of the machine must have been wiped.
fn device_gaps(report: &AgentReport, reasons: &mut Vec<String>) {
    if report.devices.is_empty() {
        reasons.push("devices: the report lists no block device the agent saw".to_owned());
    }
    for d in &report.devices {
        if d.kind == BlockDeviceKind::Disk && d.action != BlockDeviceAction::Wiped {
            reasons.push(format!("device {}: a disk of the machine was not wiped ({})", d.name, d.reason));
        }
    }
    let wiped = report.devices.iter().filter(|d| d.kind == BlockDeviceKind::Disk).count();
    if !report.devices.is_empty() && wiped != report.drives.len() {
        reasons.push(format!(
            "devices: {wiped} disks listed among the devices, but {} drives reported",
            report.drives.len()
        ));
    }
}

/// Where a listed drive's reported identity contradicts the inventory: by serial where the
/// inventory's serial is unique among the listed drives, else by protocol and capacity; the
/// capacity wherever the inventory has one; and the match basis must say which.
fn identity_gap(listed: &[WipeDrive], l: &WipeDrive, drive: &DriveReport) -> Option<String> {
    let norm = |s: &Option<String>| s.as_deref().map(str::trim).filter(|s| !s.is_empty()).map(str::to_ascii_lowercase);
    let serial = norm(&l.serial).filter(|s| listed.iter().filter(|o| norm(&o.serial).as_ref() == Some(s)).count() == 1);
    let (basis, found) = (drive.match_basis, &drive.identity);
    let want = if serial.is_some() { MatchBasis::Serial } else { MatchBasis::ProtocolCapacity };
    if basis != Some(want) {
        return Some(format!("matched by {basis:?}, but the inventory calls for {want:?}"));
    }
    if serial.is_some() && norm(&found.serial) != serial {
        return Some(format!("serial {:?} is not the inventory's {:?}", found.serial, l.serial));
    }
    if serial.is_none() {
        let (want, got) = (norm(&l.protocol), norm(&found.protocol));
        if want.is_none() || l.capacity_bytes.is_none() || want != got {
            return Some(format!("protocol {:?} is not the inventory's {:?}", found.protocol, l.protocol));
        }
    }
    match l.capacity_bytes {
        Some(capacity) if capacity != found.size_bytes => {
            Some(format!("size {} bytes is not the inventory's {capacity}", found.size_bytes))
        }
        _ => None,
    }
}

/// Judges a provisioning boot's report against its run: success, from the configured OS image.
pub fn judge_provision(run: &Run, report: &AgentReport, os_image_sha256: &str) -> Result<(), String> {
    let mut reasons = Vec::new();
    // The installer's own reason first: the machine's state names why it refused.
    if let Some(failure) = &report.failure {
        reasons.push(format!("the installer failed: {}: {}", failure.code, failure.message));
    }
    run_gaps(run, report, &mut reasons);
    if !ct_eq(report.image_sha256.as_bytes(), os_image_sha256.as_bytes()) {
        reasons.push(format!(
            "image: the machine booted image {}, not the configured node OS image {os_image_sha256}",
            report.image_sha256
        ));
    } else if reasons.is_empty() && report.result == AgentResult::Failure {
        reasons.push("the machine reported a failed first boot".to_owned());
    } else if report.result == AgentResult::Success && report.failure.is_some() {
        reasons.push("the report is a success but names a failure".to_owned());
    }
    verdict(reasons)
}

/// Judges an acceptance image's report against its run: its nonce and times, the class's
/// acceptance image (`image_sha256`), a success with at least one check and every check
/// `healthy`. `Err` names each reason, failed checks first (`drives: failed (nvme1 missing)`).
pub fn judge_acceptance(run: &Run, report: &AgentReport, image_sha256: &str) -> Result<(), String> {
    let mut reasons: Vec<String> = report
        .checks
        .iter()
        .filter(|c| c.status != HealthStatus::Healthy)
        .map(|c| {
            let status = c.status.as_str();
            if c.detail.is_empty() {
                format!("{}: {status}", c.name)
            } else {
                format!("{}: {status} ({})", c.name, c.detail)
            }
        })
        .collect();
    if let Some(failure) = &report.failure {
        reasons.push(format!("the acceptance image failed: {}: {}", failure.code, failure.message));
    }
    run_gaps(run, report, &mut reasons);
    if !ct_eq(report.image_sha256.as_bytes(), image_sha256.as_bytes()) {
        reasons.push(format!(
            "image: the machine booted image {}, not the class's acceptance image {image_sha256}",
            report.image_sha256
        ));
    }
    if report.checks.is_empty() {
        reasons.push("the report names no checks".to_owned());
    }
    if reasons.is_empty() && report.result == AgentResult::Failure {
        reasons.push("the acceptance image reported a failure".to_owned());
    }
    verdict(reasons)
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
    if v.ranges != VERIFIED_RANGES {
        return Some(format!("verification read {} ranges, not the contract's {VERIFIED_RANGES}", v.ranges));
    }
    let size = drive.identity.size_bytes;
    if size == 0 {
        return Some("a drive of 0 bytes cannot be verified".to_owned());
    }
    let bytes = verified_bytes(size);
    if v.bytes_read != bytes {
        return Some(format!(
            "verification read {} bytes, but its ranges hold {bytes} on a drive of {size} bytes",
            v.bytes_read
        ));
    }
    if !ct_eq(v.sha256.as_bytes(), zeros_sha256(bytes).as_bytes()) {
        return Some(format!("verification digest {} is not that of {bytes} zero bytes", v.sha256));
    }
    None
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use paddock_types::agent::{AgentFailure, BlockDevice, DriveIdentity, MatchBasis, Verification};
    use paddock_types::health::HealthCheck;

    use super::*;

    const IMAGE: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const NONCE: &str = "the-nonce";
    const TB: u64 = 3_840_755_982_336;

    fn run() -> Run {
        Run { issued_at: Utc::now() - chrono::Duration::hours(1), received_at: Utc::now() }
    }

    /// Drives with unique serials `S<id>` of 3.84 TB over NVMe, as the BMC listed them.
    fn listed(ids: &[&str]) -> Vec<WipeDrive> {
        ids.iter()
            .map(|id| WipeDrive {
                id: (*id).to_owned(),
                serial: Some(format!("S{id}")),
                capacity_bytes: Some(TB),
                protocol: Some("NVMe".into()),
            })
            .collect()
    }

    fn wiped(id: Option<&str>) -> DriveReport {
        let bytes = verified_bytes(TB);
        DriveReport {
            id: id.map(str::to_owned),
            match_basis: id.map(|_| MatchBasis::Serial),
            identity: DriveIdentity {
                model: None,
                serial: Some(format!("S{}", id.unwrap_or("stranger"))),
                wwn: None,
                eui: None,
                size_bytes: TB,
                protocol: Some("nvme".into()),
            },
            method: "nvme-sanitize-crypto".into(),
            result: AgentResult::Success,
            detail: None,
            verification: Some(Verification { ranges: 66, bytes_read: bytes, sha256: zeros_sha256(bytes) }),
        }
    }

    fn disk(name: &str) -> BlockDevice {
        BlockDevice {
            name: name.into(),
            kind: BlockDeviceKind::Disk,
            action: BlockDeviceAction::Wiped,
            reason: "a disk of the machine".into(),
        }
    }

    fn report(drives: Vec<DriveReport>) -> AgentReport {
        let devices = (0..drives.len()).map(|i| disk(&format!("nvme{i}n1"))).collect();
        AgentReport {
            result: AgentResult::Success,
            started_at: Utc::now() - chrono::Duration::minutes(5),
            finished_at: Utc::now(),
            image_sha256: IMAGE.into(),
            nonce: Some(NONCE.into()),
            drives,
            devices,
            failure: None,
            checks: Vec::new(),
        }
    }

    fn check(name: &str, status: HealthStatus) -> HealthCheck {
        HealthCheck { name: name.into(), status, detail: format!("{name} seen") }
    }

    #[test]
    fn an_acceptance_passes_only_with_every_check_healthy_from_its_image() {
        let passed = AgentReport { checks: vec![check("memory", HealthStatus::Healthy)], ..report(Vec::new()) };
        assert_eq!(judge_acceptance(&run(), &passed, IMAGE), Ok(()));

        let failed = AgentReport {
            result: AgentResult::Failure,
            checks: vec![check("memory", HealthStatus::Healthy), check("drives", HealthStatus::Failed)],
            ..report(Vec::new())
        };
        let why = judge_acceptance(&run(), &failed, IMAGE).expect_err("a failed check");
        assert!(why.contains("drives: failed (drives seen)") && !why.contains("memory"), "{why}");

        let degraded = AgentReport { checks: vec![check("gpu.ecc", HealthStatus::Degraded)], ..report(Vec::new()) };
        assert!(judge_acceptance(&run(), &degraded, IMAGE).expect_err("degraded").contains("gpu.ecc: degraded"));

        let silent = report(Vec::new());
        assert!(judge_acceptance(&run(), &silent, IMAGE).expect_err("no checks").contains("no checks"));

        let other = "0".repeat(64);
        let elsewhere = AgentReport { checks: passed.checks.clone(), ..report(Vec::new()) };
        let why = judge_acceptance(&run(), &elsewhere, &other).expect_err("another image");
        assert!(why.contains("not the class's acceptance image"), "{why}");

        let no_nonce = AgentReport { nonce: None, ..passed.clone() };
        assert!(judge_acceptance(&run(), &no_nonce, IMAGE).expect_err("no nonce").contains("nonce"));
    }

    #[test]
    fn complete_evidence_of_every_drive_verifies_the_wipe() {
        let r = report(vec![wiped(Some("nvme0")), wiped(Some("nvme1")), wiped(None)]);
        assert_eq!(judge_wipe(&run(), &listed(&["nvme0", "nvme1"]), &r, IMAGE), Ok(()));
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
        let why =
            judge_wipe(&run(), &listed(&["nvme0", "nvme1", "nvme2", "nvme3"]), &r, IMAGE).expect_err("not verified");
        assert_eq!(
            why,
            "drive nvme0: verification missing; drive nvme1: unknown method \"sim-overwrite\"; \
             drive nvme2: verification read 65 ranges, not the contract's 66; \
             unlisted drive with serial Sstranger: wipe failed (I/O error); \
             drive nvme3: not reported (the agent did not find it)"
        );
    }

    /// The evidence the security review found accepted: serials not the BMC's, a 1-byte size
    /// for a 3.8 TB drive, one byte read for 66 ranges, an all-zero digest, no nonce.
    type Edit = dyn Fn(&mut AgentReport);

    fn d(r: &mut AgentReport) -> &mut DriveReport {
        &mut r.drives[0]
    }

    #[test]
    fn evidence_that_contradicts_the_inventory_or_itself_fails_naming_the_check() {
        let listed = listed(&["nvme0"]);
        let judge = |edit: &dyn Fn(&mut AgentReport)| {
            let mut r = report(vec![wiped(Some("nvme0"))]);
            edit(&mut r);
            judge_wipe(&run(), &listed, &r, IMAGE).expect_err("refused")
        };
        let cases: [(&Edit, &str); 9] = [
            (
                &|r| d(r).identity.serial = Some("NOT-THE-BMCS".into()),
                "drive nvme0: serial Some(\"NOT-THE-BMCS\") is not",
            ),
            (
                &|r| d(r).match_basis = Some(MatchBasis::ProtocolCapacity),
                "drive nvme0: matched by Some(ProtocolCapacity), but",
            ),
            (&|r| d(r).identity.size_bytes = 1, "drive nvme0: size 1 bytes is not the inventory's 3840755982336"),
            (&|r| d(r).verification.as_mut().expect("v").bytes_read = 1, "drive nvme0: verification read 1 bytes, but"),
            (
                &|r| d(r).verification.as_mut().expect("v").sha256 = "0".repeat(64),
                "drive nvme0: verification digest 0000",
            ),
            (&|r| r.nonce = None, "nonce: missing"),
            (&|r| r.started_at = Utc::now() - chrono::Duration::days(2), "times: started_at"),
            (&|r| r.finished_at = Utc::now() + chrono::Duration::days(2), "times: finished_at"),
            (&|r| r.devices[0].action = BlockDeviceAction::Left, "device nvme0n1: a disk of the machine was not wiped"),
        ];
        for (edit, why) in cases {
            let got = judge(edit);
            assert!(got.starts_with(why), "{got:?} should start with {why:?}");
        }
        let got = judge(&|r| r.devices.clear());
        assert!(got.starts_with("devices: the report lists no block device"), "{got}");
    }

    #[test]
    fn shared_serials_match_by_protocol_and_capacity() {
        let mut listed = listed(&["a", "b"]);
        listed[1].serial = listed[0].serial.clone();
        let mut drives = vec![wiped(Some("a")), wiped(Some("b"))];
        for d in &mut drives {
            d.match_basis = Some(MatchBasis::ProtocolCapacity);
        }
        assert_eq!(judge_wipe(&run(), &listed, &report(drives.clone()), IMAGE), Ok(()));
        drives[1].identity.protocol = Some("sata".into());
        let why = judge_wipe(&run(), &listed, &report(drives), IMAGE).expect_err("protocol");
        assert!(why.starts_with("drive b: protocol Some(\"sata\") is not the inventory's"), "{why}");
    }

    #[test]
    fn verified_bytes_follow_the_contracts_ranges() {
        assert_eq!(verified_bytes(TB), 6 << 20);
        assert_eq!(verified_bytes(1), 66);
        assert_eq!(verified_bytes(8192), 66 * 8192);
        assert_eq!(zeros_sha256(6 << 20), "b69dae56a14d1a8314ed40664c4033ea0a550eea2673e04df42a66ac6b9faf2c");
        assert_eq!(zeros_sha256(66), hex::encode(Sha256::digest([0u8; 66])));
    }

    #[test]
    fn another_image_an_overall_failure_or_a_stranger_fails_the_wipe() {
        let other = "b".repeat(64);
        let one = || report(vec![wiped(Some("nvme0"))]);
        let why = judge_wipe(&run(), &listed(&["nvme0"]), &one(), &other).expect_err("image");
        assert!(why.starts_with("image: the agent booted image aaaa"), "{why}");
        let mut r = one();
        r.result = AgentResult::Failure;
        assert_eq!(judge_wipe(&run(), &listed(&["nvme0"]), &r, IMAGE), Err("the agent reported failure".into()));
        let r = report(vec![wiped(Some("nvme0")), wiped(Some("sdz"))]);
        let why = judge_wipe(&run(), &listed(&["nvme0"]), &r, IMAGE).expect_err("stranger");
        assert_eq!(why, "drive sdz: not a drive of this run's configuration");
        assert!(judge_wipe(&run(), &[], &report(vec![wiped(None)]), IMAGE).is_err(), "nothing listed proves nothing");
    }

    #[test]
    fn a_provisioning_failure_is_judged_by_the_installers_reason() {
        let mut r = report(vec![]);
        r.result = AgentResult::Failure;
        r.failure = Some(AgentFailure { code: "ca_pin_mismatch".into(), message: "the CA is not pinned".into() });
        assert_eq!(
            judge_provision(&run(), &r, IMAGE),
            Err("the installer failed: ca_pin_mismatch: the CA is not pinned".into())
        );
        r.result = AgentResult::Success;
        assert!(judge_provision(&run(), &r, IMAGE).is_err(), "a success naming a failure proves nothing");
    }

    #[test]
    fn provisioning_needs_success_from_the_os_image() {
        assert_eq!(judge_provision(&run(), &report(vec![]), IMAGE), Ok(()));
        assert!(judge_provision(&run(), &report(vec![]), &"c".repeat(64)).is_err());
        let mut r = report(vec![]);
        r.result = AgentResult::Failure;
        assert!(judge_provision(&run(), &r, IMAGE).is_err());
        r.result = AgentResult::Success;
        r.nonce = None;
        assert_eq!(judge_provision(&run(), &r, IMAGE), Err("nonce: missing (a report echoes its run's nonce)".into()));
    }

    #[test]
    fn helpers() {
        assert!(ct_eq(b"abc", b"abc") && !ct_eq(b"abc", b"abd") && !ct_eq(b"abc", b"ab"));
        assert!(is_sha256_hex(IMAGE) && !is_sha256_hex(&"A".repeat(64)) && !is_sha256_hex("ab"));
        assert_eq!(hex::encode(Sha256::digest(b"paddock simulated wipe image")), SIMULATED_WIPE_IMAGE_SHA256);
        assert_eq!(hex::encode(Sha256::digest(b"paddock simulated node OS image")), SIMULATED_OS_IMAGE_SHA256);
    }
}
