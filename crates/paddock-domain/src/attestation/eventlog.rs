//! A boot's event log in the TCG PC Client "crypto agile" format (TCG PC Client Platform Firmware
//! Profile, section 10): what UEFI firmware and the boot stub measured into which PCR. Replaying
//! its SHA-256 digests gives the PCR values a quote must carry; its events say what was measured.
//! Little-endian, unlike the TPM's own structures.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::tpm::TPM_ALG_SHA256;
use super::AttestationError;

/// An event that records but extends nothing.
pub const EV_NO_ACTION: u32 = 0x03;
/// A UEFI application the firmware loaded and started (a boot loader, a unified kernel image):
/// its digest is the PE image's Authenticode hash.
pub const EV_EFI_BOOT_SERVICES_APPLICATION: u32 = 0x8000_0003;

/// One measurement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub pcr: u32,
    pub kind: u32,
    /// Its SHA-256 digest (what was extended into `pcr`).
    pub digest: [u8; 32],
    pub data: Vec<u8>,
}

/// The events of a log, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventLog {
    pub events: Vec<Event>,
}

/// A little-endian reader over the log.
struct Le<'a>(&'a [u8]);

impl<'a> Le<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], AttestationError> {
        if self.0.len() < n {
            return Err(AttestationError::Malformed { what });
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, AttestationError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, AttestationError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// The digest sizes the log's Spec ID event declares, by algorithm.
fn spec_id(data: &[u8]) -> Result<BTreeMap<u16, usize>, AttestationError> {
    let mut r = Le(data);
    if r.take(16, "Spec ID signature")? != b"Spec ID Event03\0" {
        return Err(AttestationError::Malformed { what: "an event log that is not crypto agile (no Spec ID Event03)" });
    }
    r.take(8, "Spec ID platform class and versions")?;
    let mut sizes = BTreeMap::new();
    for _ in 0..r.u32("Spec ID numberOfAlgorithms")? {
        let alg = r.u16("Spec ID algorithmId")?;
        sizes.insert(alg, usize::from(r.u16("Spec ID digestSize")?));
    }
    if !sizes.contains_key(&TPM_ALG_SHA256) {
        return Err(AttestationError::Malformed { what: "an event log without SHA-256 digests" });
    }
    Ok(sizes)
}

impl EventLog {
    /// Reads a log: its first entry (SHA-1 format) must be the Spec ID event, every later one a
    /// `TCG_PCR_EVENT2` with a SHA-256 digest among its digests.
    pub fn parse(bytes: &[u8]) -> Result<Self, AttestationError> {
        let mut r = Le(bytes);
        r.u32("first event's PCR")?;
        if r.u32("first event's type")? != EV_NO_ACTION {
            return Err(AttestationError::Malformed { what: "an event log whose first event is not its Spec ID" });
        }
        r.take(20, "first event's digest")?;
        let len = r.u32("first event's size")?;
        let sizes = spec_id(r.take(len as usize, "first event's data")?)?;
        let mut events = Vec::new();
        while !r.0.is_empty() {
            let pcr = r.u32("event PCR")?;
            let kind = r.u32("event type")?;
            let mut sha256 = None;
            for _ in 0..r.u32("event digest count")? {
                let alg = r.u16("event digest algorithm")?;
                let size = *sizes
                    .get(&alg)
                    .ok_or(AttestationError::Malformed { what: "an event digest of an undeclared algorithm" })?;
                let digest = r.take(size, "event digest")?;
                if alg == TPM_ALG_SHA256 {
                    sha256 = Some(
                        <[u8; 32]>::try_from(digest)
                            .map_err(|_| AttestationError::Malformed { what: "SHA-256 digest size" })?,
                    );
                }
            }
            let len = r.u32("event size")?;
            let data = r.take(len as usize, "event data")?.to_vec();
            let digest = sha256.ok_or(AttestationError::Malformed { what: "an event without a SHA-256 digest" })?;
            events.push(Event { pcr, kind, digest, data });
        }
        Ok(Self { events })
    }

    /// The SHA-256 PCR values the log's events give, from all-zero PCRs: each event's digest
    /// extended into its PCR (`PCR = SHA-256(PCR || digest)`), `EV_NO_ACTION` events left out.
    pub fn replay(&self) -> BTreeMap<u32, [u8; 32]> {
        let mut pcrs: BTreeMap<u32, [u8; 32]> = BTreeMap::new();
        for event in self.events.iter().filter(|e| e.kind != EV_NO_ACTION) {
            let pcr = pcrs.entry(event.pcr).or_insert([0; 32]);
            let mut h = Sha256::new();
            h.update(*pcr);
            h.update(event.digest);
            *pcr = h.finalize().into();
        }
        pcrs
    }

    /// The digests of the UEFI applications the firmware started, in order (PCR 4).
    pub fn boot_applications(&self) -> Vec<[u8; 32]> {
        let apps = self.events.iter().filter(|e| e.pcr == 4 && e.kind == EV_EFI_BOOT_SERVICES_APPLICATION);
        apps.map(|e| e.digest).collect()
    }
}
