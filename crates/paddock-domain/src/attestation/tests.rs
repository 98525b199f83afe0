//! Against vectors a software TPM (swtpm) produced: `vectors.json`, made by
//! `scripts/attestation-vectors` (two attestation keys, one boot's event log and PCRs, a quote by
//! each key over one nonce).

use std::collections::BTreeMap;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::*;

fn vectors() -> Value {
    serde_json::from_str(include_str!("vectors.json")).expect("vectors.json")
}

fn hex_of(v: &Value) -> Vec<u8> {
    hex::decode(v.as_str().expect("a hex string")).expect("hex")
}

/// The vectors' evidence by the key `alg` (rsa | ecc), owned so tests can tamper with it.
struct Owned {
    ak_public: Vec<u8>,
    attest: Vec<u8>,
    signature: Vec<u8>,
    pcrs: BTreeMap<u8, [u8; 32]>,
    event_log: Vec<u8>,
    nonce: Vec<u8>,
    ek_name: Vec<u8>,
    boot_application: [u8; 32],
}

impl Owned {
    fn of(alg: &str) -> Self {
        let v = vectors();
        let pcrs = v["pcrs"].as_object().expect("pcrs").iter();
        let pcrs = pcrs.map(|(k, h)| (k.parse().expect("index"), hex_of(h).try_into().expect("32 bytes"))).collect();
        Self {
            ak_public: hex_of(&v["ak_public"][alg]),
            attest: hex_of(&v["quotes"][alg]["attest"]),
            signature: hex_of(&v["quotes"][alg]["signature"]),
            pcrs,
            event_log: hex_of(&v["event_log"]),
            nonce: hex_of(&v["nonce"]),
            ek_name: hex_of(&v["ek_name"]),
            boot_application: hex_of(&v["boot_application"]).try_into().expect("32 bytes"),
        }
    }

    fn evidence(&self) -> Evidence<'_> {
        Evidence {
            ak_public: &self.ak_public,
            attest: &self.attest,
            signature: &self.signature,
            pcrs: &self.pcrs,
            event_log: &self.event_log,
        }
    }

    /// What the image's build recorded: its digest and the stub's PCRs of this boot.
    fn expected(&self) -> Expected<'_> {
        let stub_pcrs = [11, 12].into_iter().map(|p| (p, self.pcrs[&p])).collect();
        Expected { nonce: &self.nonce, ek_name: &self.ek_name, boot_application: self.boot_application, stub_pcrs }
    }

    fn verify(&self) -> Result<Verified, AttestationError> {
        verify(&self.evidence(), &self.expected())
    }
}

#[test]
fn a_genuine_boot_quoted_by_an_rsa_or_an_ecc_key_verifies() {
    for alg in ["rsa", "ecc"] {
        let owned = Owned::of(alg);
        let verified = owned.verify().unwrap_or_else(|e| panic!("{alg}: {e}"));
        assert_eq!(verified.ak_name, hex_of(&vectors()["ak_name"][alg]), "{alg}: the TPM's own name of the key");
        assert_eq!(verified.quote.nonce, owned.nonce);
        assert_eq!(verified.quote.pcrs, QUOTED_PCRS);
    }
}

#[test]
fn a_quote_replayed_into_another_run_is_refused_by_its_nonce() {
    let owned = Owned::of("ecc");
    let other_run = Sha256::digest(b"the next run's nonce").to_vec();
    let e = verify(&owned.evidence(), &Expected { nonce: &other_run, ..owned.expected() }).expect_err("replayed");
    assert_eq!(e, AttestationError::NonceMismatch);
    assert_eq!(e.code(), "attestation_failed");
}

#[test]
fn a_key_under_another_endorsement_key_is_refused_by_the_quotes_signer() {
    let owned = Owned::of("rsa");
    let other_tpm = Sha256::digest(b"another TPM's endorsement key").to_vec();
    let e = verify(&owned.evidence(), &Expected { ek_name: &other_tpm, ..owned.expected() }).expect_err("another EK");
    assert_eq!(e, AttestationError::SignerMismatch);
}

#[test]
fn a_changed_quote_or_a_quote_of_another_key_does_not_verify() {
    let mut owned = Owned::of("rsa");
    let last = owned.attest.len() - 1;
    owned.attest[last] ^= 1; // the PCR digest's last byte
    assert_eq!(owned.verify().expect_err("tampered"), AttestationError::BadSignature);

    let (rsa, ecc) = (Owned::of("rsa"), Owned::of("ecc"));
    let crossed = Owned { ak_public: ecc.ak_public.clone(), ..Owned::of("rsa") };
    assert!(matches!(crossed.verify(), Err(AttestationError::UnsupportedAlgorithm { .. })), "RSASSA with an ECC key");
    // The ECC key's signature over the RSA key's quote.
    let swapped = Owned { signature: ecc.signature.clone(), ak_public: ecc.ak_public.clone(), ..rsa };
    assert_eq!(swapped.verify().expect_err("another quote"), AttestationError::BadSignature);
}

#[test]
fn pcr_values_other_than_the_quoted_ones_are_refused() {
    let mut owned = Owned::of("ecc");
    owned.pcrs.get_mut(&0).expect("PCR 0")[0] ^= 1;
    assert_eq!(owned.verify().expect_err("changed value"), AttestationError::PcrDigestMismatch);

    let (genuine, mut owned) = (Owned::of("ecc"), Owned::of("ecc"));
    owned.pcrs.remove(&12);
    let e = verify(&owned.evidence(), &genuine.expected()).expect_err("a value missing");
    assert!(matches!(e, AttestationError::PcrSelection { .. }), "{e}");
}

#[test]
fn a_key_that_is_not_a_restricted_tpm_bound_signing_key_is_refused() {
    let mut owned = Owned::of("rsa");
    // objectAttributes (big-endian) follow the 2-byte size, type and nameAlg: bytes 6 to 9, so
    // `restricted` (bit 16) is bit 0 of byte 7.
    assert_eq!(owned.ak_public[7] & 0x01, 0x01, "the vectors' key is restricted");
    owned.ak_public[7] &= !0x01;
    assert_eq!(owned.verify().expect_err("unrestricted"), AttestationError::NotAnAttestationKey);
}

#[test]
fn an_event_log_that_does_not_replay_to_the_quoted_pcrs_is_refused() {
    // The log's last event is PCR 12's (the command line); a changed digest no longer replays.
    let mut owned = Owned::of("ecc");
    let last = EventLog::parse(&owned.event_log).expect("the vectors' log").events.pop().expect("an event");
    assert_eq!(last.pcr, 12);
    let at = owned.event_log.windows(32).rposition(|w| w == last.digest).expect("its digest in the log");
    owned.event_log[at] ^= 1;
    assert_eq!(owned.verify().expect_err("tampered log"), AttestationError::EventLogMismatch { pcr: 12 });
}

#[test]
fn a_loader_before_the_image_or_another_command_line_is_refused() {
    let owned = Owned::of("ecc");
    let genuine = EventLog::parse(&owned.event_log).expect("the vectors' log");
    assert_eq!(genuine.boot_applications(), [owned.boot_application]);

    // A previous tenant's loader that chain-loads the genuine image: two applications in PCR 4.
    let loader = Event { pcr: 4, kind: EV_EFI_BOOT_SERVICES_APPLICATION, digest: [7; 32], data: vec![] };
    let mut chained = genuine.clone();
    let at = chained.events.iter().position(|e| e.kind == EV_EFI_BOOT_SERVICES_APPLICATION).expect("the image");
    chained.events.insert(at, loader);
    let pcrs = quoted(&chained);
    let e = check_log(&chained, &pcrs, &owned.expected()).expect_err("chain-loaded");
    assert_eq!(e, AttestationError::UnexpectedBootApplications { started: 2 });

    // The genuine image with another command line: PCR 12 is not the image's.
    let mut cmdline = genuine.clone();
    cmdline.events.last_mut().expect("PCR 12's event").digest = Sha256::digest(b"init=/bin/sh").into();
    let e = check_log(&cmdline, &quoted(&cmdline), &owned.expected()).expect_err("another command line");
    assert_eq!(e, AttestationError::ImageMeasurementMismatch { pcr: 12 });
}

/// The quoted PCRs as `log` replays them.
fn quoted(log: &EventLog) -> BTreeMap<u8, [u8; 32]> {
    let replayed = log.replay();
    QUOTED_PCRS.iter().map(|&p| (p, replayed.get(&u32::from(p)).copied().unwrap_or([0; 32]))).collect()
}

#[test]
fn truncated_evidence_is_refused_without_a_panic() {
    let owned = Owned::of("rsa");
    for n in 0..owned.attest.len() {
        assert!(verify(&Evidence { attest: &owned.attest[..n], ..owned.evidence() }, &owned.expected()).is_err());
    }
    for n in 0..owned.ak_public.len() {
        assert!(AkPublic::parse(&owned.ak_public[..n]).is_err(), "ak_public cut at {n}");
    }
    for n in 0..owned.event_log.len() {
        // A log cut at an event's end is a shorter, well-formed log; the check refuses it then.
        assert!(verify(&Evidence { event_log: &owned.event_log[..n], ..owned.evidence() }, &owned.expected()).is_err());
    }
    for n in 0..owned.signature.len() {
        assert!(verify(&Evidence { signature: &owned.signature[..n], ..owned.evidence() }, &owned.expected()).is_err());
    }
}
