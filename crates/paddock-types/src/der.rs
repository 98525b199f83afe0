//! Just enough DER (X.690) to find an X.509 certificate's SubjectPublicKeyInfo (RFC 5280 4.1),
//! whose SHA-256 is kubeadm's CA pin (`--discovery-token-ca-cert-hash sha256:<hex>`): paddock
//! computes the pin it hands a machine with it, and the machine's installer checks the API
//! server's CA against that pin with it (no X.509 crate in the agent's initramfs binary).
//!
//! ```text
//! Certificate ::= SEQUENCE { tbsCertificate TBSCertificate, signatureAlgorithm, signatureValue }
//! TBSCertificate ::= SEQUENCE { version [0] EXPLICIT OPTIONAL, serialNumber INTEGER,
//!     signature SEQUENCE, issuer SEQUENCE, validity SEQUENCE, subject SEQUENCE,
//!     subjectPublicKeyInfo SEQUENCE, ... }
//! ```

const TAG_INTEGER: u8 = 0x02;
const TAG_SEQUENCE: u8 = 0x30;
/// `[0]`, constructed, context-specific: the explicit version.
const TAG_VERSION: u8 = 0xa0;

/// One TLV: its tag, its contents, the whole encoding (tag and length included) and what follows.
struct Tlv<'a> {
    tag: u8,
    contents: &'a [u8],
    whole: &'a [u8],
    rest: &'a [u8],
}

fn read_tlv(input: &[u8]) -> Result<Tlv<'_>, &'static str> {
    let (&tag, after_tag) = input.split_first().ok_or("truncated DER")?;
    let (&first, mut rest) = after_tag.split_first().ok_or("truncated DER")?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        // Long form: the low bits count the length bytes. 0x80 (indefinite length) is BER only.
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return Err("bad DER length");
        }
        let (len_bytes, after) = rest.split_at(count);
        rest = after;
        len_bytes.iter().fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
    };
    if rest.len() < len {
        return Err("truncated DER");
    }
    let header = input.len() - rest.len();
    let (contents, rest) = rest.split_at(len);
    Ok(Tlv { tag, contents, whole: &input[..header + len], rest })
}

fn expect<'a>(input: &'a [u8], tag: u8, what: &'static str) -> Result<Tlv<'a>, &'static str> {
    let tlv = read_tlv(input)?;
    if tlv.tag == tag {
        Ok(tlv)
    } else {
        Err(what)
    }
}

/// The DER of the certificate's SubjectPublicKeyInfo (the whole SEQUENCE, as kubeadm hashes it).
pub fn subject_public_key_info(cert: &[u8]) -> Result<&[u8], &'static str> {
    let certificate = expect(cert, TAG_SEQUENCE, "not a certificate (no outer SEQUENCE)")?;
    let tbs = expect(certificate.contents, TAG_SEQUENCE, "not a certificate (no TBSCertificate)")?;
    let mut fields = tbs.contents;
    if fields.first() == Some(&TAG_VERSION) {
        fields = read_tlv(fields)?.rest;
    }
    fields = expect(fields, TAG_INTEGER, "malformed certificate (serial number)")?.rest;
    for what in ["signature algorithm", "issuer", "validity", "subject"] {
        fields = expect(fields, TAG_SEQUENCE, what).map_err(|_| "malformed certificate (before the public key)")?.rest;
    }
    Ok(expect(fields, TAG_SEQUENCE, "malformed certificate (subject public key info)")?.whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_lengths() {
        let short = [0x30, 0x02, 0x05, 0x00, 0xff];
        let tlv = read_tlv(&short).expect("short form");
        assert_eq!((tlv.tag, tlv.contents, tlv.whole, tlv.rest), (0x30, &[0x05, 0x00][..], &short[..4], &[0xff][..]));
        let mut long = vec![0x04, 0x81, 0x80];
        long.extend([7u8; 0x80]);
        let tlv = read_tlv(&long).expect("long form");
        assert_eq!((tlv.contents.len(), tlv.whole.len()), (0x80, 0x83));
    }

    #[test]
    fn malformed_input_is_refused() {
        assert!(read_tlv(&[0x30]).is_err());
        assert!(read_tlv(&[0x30, 0x05, 0x00]).is_err(), "contents shorter than the length");
        assert!(read_tlv(&[0x30, 0x80]).is_err(), "indefinite length");
        assert!(subject_public_key_info(&[0x02, 0x01, 0x00]).is_err());
        assert!(subject_public_key_info(&[0x30, 0x03, 0x30, 0x01, 0x00]).is_err());
    }
}
