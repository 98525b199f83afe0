//! The TPM 2.0 structures a quote is made of (TPM 2.0 Library, Part 2), read from their
//! big-endian marshalled form: an attestation key's `TPM2B_PUBLIC`, a quote's `TPMS_ATTEST` and
//! its `TPMT_SIGNATURE`. Only what a quote by an RSA (RSASSA) or ECC P-256 (ECDSA) attestation key
//! with SHA-256 needs; anything else is refused by name.

use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use sha2::{Digest, Sha256};

use super::AttestationError;

pub(super) const TPM_ALG_RSA: u16 = 0x0001;
pub(super) const TPM_ALG_SHA256: u16 = 0x000B;
const TPM_ALG_NULL: u16 = 0x0010;
const TPM_ALG_RSASSA: u16 = 0x0014;
const TPM_ALG_ECDSA: u16 = 0x0018;
pub(super) const TPM_ALG_ECC: u16 = 0x0023;
const TPM_ECC_NIST_P256: u16 = 0x0003;
/// `TPM_GENERATED_VALUE`: every structure the TPM itself made and signs starts with it.
const TPM_GENERATED: u32 = 0xff54_4347;
const TPM_ST_ATTEST_QUOTE: u16 = 0x8018;

/// `TPMA_OBJECT` bits an attestation key must have: its private part never leaves the TPM
/// (`fixedTPM`, `sensitiveDataOrigin`), and it signs only what the TPM made (`restricted`, `sign`),
/// so a signature over a `TPMS_ATTEST` cannot have been asked for with forged contents.
const FIXED_TPM: u32 = 1 << 1;
const SENSITIVE_DATA_ORIGIN: u32 = 1 << 5;
const RESTRICTED: u32 = 1 << 16;
const SIGN: u32 = 1 << 18;

/// A big-endian reader over a marshalled structure; every read names what it reads.
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    pub(super) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], AttestationError> {
        if self.bytes.len() < n {
            return Err(AttestationError::Malformed { what });
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    pub(super) fn u8(&mut self, what: &'static str) -> Result<u8, AttestationError> {
        Ok(self.take(1, what)?[0])
    }

    pub(super) fn u16(&mut self, what: &'static str) -> Result<u16, AttestationError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(super) fn u32(&mut self, what: &'static str) -> Result<u32, AttestationError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A `TPM2B_*`: a 16-bit size, then that many bytes.
    pub(super) fn sized(&mut self, what: &'static str) -> Result<&'a [u8], AttestationError> {
        let n = self.u16(what)?;
        self.take(usize::from(n), what)
    }

    /// Fails unless every byte was read.
    pub(super) fn end(&self, what: &'static str) -> Result<(), AttestationError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(AttestationError::Malformed { what })
        }
    }
}

/// The public part of an attestation key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AkPublic {
    key: Key,
    /// The key's TPM name: its name algorithm (SHA-256) and the SHA-256 of its `TPMT_PUBLIC`.
    name: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    Rsa { modulus: Vec<u8>, exponent: Vec<u8> },
    /// ECDSA on NIST P-256 with SHA-256: the point, uncompressed (`04 || x || y`).
    EccP256 { point: Vec<u8> },
}

impl AkPublic {
    /// Reads a `TPM2B_PUBLIC` and checks that it describes an attestation key (see [`SIGN`]).
    pub fn parse(tpm2b_public: &[u8]) -> Result<Self, AttestationError> {
        let mut outer = Reader::new(tpm2b_public);
        let public = outer.sized("TPM2B_PUBLIC")?;
        outer.end("TPM2B_PUBLIC")?;
        let mut r = Reader::new(public);
        let kind = r.u16("TPMT_PUBLIC.type")?;
        let name_alg = r.u16("TPMT_PUBLIC.nameAlg")?;
        let attributes = r.u32("TPMT_PUBLIC.objectAttributes")?;
        r.sized("TPMT_PUBLIC.authPolicy")?;
        let wanted = FIXED_TPM | SENSITIVE_DATA_ORIGIN | RESTRICTED | SIGN;
        if name_alg != TPM_ALG_SHA256 || attributes & wanted != wanted {
            return Err(AttestationError::NotAnAttestationKey);
        }
        symmetric_null(&mut r)?;
        let key = match kind {
            TPM_ALG_RSA => rsa_key(&mut r)?,
            TPM_ALG_ECC => ecc_key(&mut r)?,
            other => return Err(AttestationError::UnsupportedAlgorithm { what: "key type", id: other }),
        };
        r.end("TPMT_PUBLIC")?;
        let mut name = TPM_ALG_SHA256.to_be_bytes().to_vec();
        name.extend_from_slice(&Sha256::digest(public));
        Ok(Self { key, name })
    }

    /// The key's TPM name (what a quote names as its signer).
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// Checks a `TPMT_SIGNATURE` by this key over `message` (SHA-256 of it, as the TPM signed).
    pub(super) fn verify(&self, message: &[u8], tpmt_signature: &[u8]) -> Result<(), AttestationError> {
        let mut r = Reader::new(tpmt_signature);
        let alg = r.u16("TPMT_SIGNATURE.sigAlg")?;
        let hash = r.u16("TPMT_SIGNATURE.hash")?;
        if hash != TPM_ALG_SHA256 {
            return Err(AttestationError::UnsupportedAlgorithm { what: "signature hash", id: hash });
        }
        let verified = match (&self.key, alg) {
            (Key::Rsa { modulus, exponent }, TPM_ALG_RSASSA) => {
                let sig = r.sized("TPMS_SIGNATURE_RSA.sig")?;
                r.end("TPMT_SIGNATURE")?;
                let key = RsaPublicKeyComponents { n: modulus, e: exponent };
                key.verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, sig)
            }
            (Key::EccP256 { point }, TPM_ALG_ECDSA) => {
                let (sig_r, sig_s) = (r.sized("TPMS_SIGNATURE_ECC.r")?, r.sized("TPMS_SIGNATURE_ECC.s")?);
                r.end("TPMT_SIGNATURE")?;
                let fixed = [left_pad(sig_r, 32)?, left_pad(sig_s, 32)?].concat();
                UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point).verify(message, &fixed)
            }
            (_, other) => return Err(AttestationError::UnsupportedAlgorithm { what: "signature scheme", id: other }),
        };
        verified.map_err(|_| AttestationError::BadSignature)
    }
}

/// A restricted signing key has no symmetric algorithm (`TPMT_SYM_DEF_OBJECT` is `TPM_ALG_NULL`).
fn symmetric_null(r: &mut Reader<'_>) -> Result<(), AttestationError> {
    match r.u16("TPMT_SYM_DEF_OBJECT")? {
        TPM_ALG_NULL => Ok(()),
        _ => Err(AttestationError::NotAnAttestationKey),
    }
}

/// The scheme of a signing key's parameters: RSASSA or ECDSA with SHA-256 (a restricted key
/// names its scheme).
fn scheme(r: &mut Reader<'_>, expected: u16) -> Result<(), AttestationError> {
    let alg = r.u16("scheme")?;
    if alg != expected {
        return Err(AttestationError::UnsupportedAlgorithm { what: "key scheme", id: alg });
    }
    match r.u16("scheme.hashAlg")? {
        TPM_ALG_SHA256 => Ok(()),
        other => Err(AttestationError::UnsupportedAlgorithm { what: "key scheme hash", id: other }),
    }
}

/// `TPMS_RSA_PARMS` (after the symmetric part) and the modulus.
fn rsa_key(r: &mut Reader<'_>) -> Result<Key, AttestationError> {
    scheme(r, TPM_ALG_RSASSA)?;
    let _bits = r.u16("TPMS_RSA_PARMS.keyBits")?;
    let exponent = match r.u32("TPMS_RSA_PARMS.exponent")? {
        0 => 65_537, // the TPM's way of saying the default
        e => e,
    };
    let modulus = r.sized("TPM2B_PUBLIC_KEY_RSA")?.to_vec();
    let exponent = exponent.to_be_bytes().iter().copied().skip_while(|&b| b == 0).collect();
    Ok(Key::Rsa { modulus, exponent })
}

/// `TPMS_ECC_PARMS` (after the symmetric part) and the point.
fn ecc_key(r: &mut Reader<'_>) -> Result<Key, AttestationError> {
    scheme(r, TPM_ALG_ECDSA)?;
    match r.u16("TPMS_ECC_PARMS.curveID")? {
        TPM_ECC_NIST_P256 => {}
        other => return Err(AttestationError::UnsupportedAlgorithm { what: "curve", id: other }),
    }
    if r.u16("TPMS_ECC_PARMS.kdf")? != TPM_ALG_NULL {
        return Err(AttestationError::NotAnAttestationKey);
    }
    let (x, y) = (r.sized("TPMS_ECC_POINT.x")?, r.sized("TPMS_ECC_POINT.y")?);
    let point = [&[0x04][..], &left_pad(x, 32)?, &left_pad(y, 32)?].concat();
    Ok(Key::EccP256 { point })
}

/// `bytes` as a big-endian number of exactly `len` bytes.
fn left_pad(bytes: &[u8], len: usize) -> Result<Vec<u8>, AttestationError> {
    let bytes = &bytes[bytes.iter().take_while(|&&b| b == 0).count()..];
    if bytes.len() > len {
        return Err(AttestationError::Malformed { what: "an ECC coordinate longer than the curve's" });
    }
    let mut out = vec![0; len - bytes.len()];
    out.extend_from_slice(bytes);
    Ok(out)
}

/// What a quote's `TPMS_ATTEST` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuoteInfo {
    /// The name of the key that signed it.
    pub signer: Vec<u8>,
    /// `extraData`: the nonce the verifier gave.
    pub nonce: Vec<u8>,
    /// The TPM's reset and restart counts (a reboot in between shows).
    pub reset_count: u32,
    pub restart_count: u32,
    /// The SHA-256 PCRs the quote covers, ascending.
    pub pcrs: Vec<u8>,
    /// The digest of those PCRs' values, concatenated in that order.
    pub pcr_digest: Vec<u8>,
}

/// Reads a quote's `TPMS_ATTEST` (the bytes the TPM signed).
pub(super) fn parse_quote(attest: &[u8]) -> Result<QuoteInfo, AttestationError> {
    let mut r = Reader::new(attest);
    if r.u32("TPMS_ATTEST.magic")? != TPM_GENERATED || r.u16("TPMS_ATTEST.type")? != TPM_ST_ATTEST_QUOTE {
        return Err(AttestationError::NotAQuote);
    }
    let signer = r.sized("TPMS_ATTEST.qualifiedSigner")?.to_vec();
    let nonce = r.sized("TPMS_ATTEST.extraData")?.to_vec();
    r.take(8, "TPMS_CLOCK_INFO.clock")?;
    let reset_count = r.u32("TPMS_CLOCK_INFO.resetCount")?;
    let restart_count = r.u32("TPMS_CLOCK_INFO.restartCount")?;
    r.u8("TPMS_CLOCK_INFO.safe")?;
    r.take(8, "TPMS_ATTEST.firmwareVersion")?;
    let mut pcrs = Vec::new();
    for _ in 0..r.u32("TPML_PCR_SELECTION.count")? {
        let hash = r.u16("TPMS_PCR_SELECTION.hash")?;
        let size = r.u8("TPMS_PCR_SELECTION.sizeofSelect")?;
        let select = r.take(usize::from(size), "TPMS_PCR_SELECTION.pcrSelect")?;
        let selected = (0..select.len() * 8).filter(|i| select[i / 8] & (1 << (i % 8)) != 0);
        if hash != TPM_ALG_SHA256 {
            if selected.count() > 0 {
                return Err(AttestationError::UnsupportedAlgorithm { what: "PCR bank", id: hash });
            }
            continue;
        }
        pcrs.extend(selected.map(|i| u8::try_from(i).expect("a PCR index fits a byte")));
    }
    let pcr_digest = r.sized("TPMS_QUOTE_INFO.pcrDigest")?.to_vec();
    r.end("TPMS_ATTEST")?;
    pcrs.sort_unstable();
    Ok(QuoteInfo { signer, nonce, reset_count, restart_count, pcrs, pcr_digest })
}
