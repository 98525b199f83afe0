//! A minimal DER reader: just enough to classify a SubjectPublicKeyInfo (RFC 5280) or a PKCS#1
//! `RSAPublicKey` and extract the bytes `ring` verifies with.
//!
//! We classify keys ourselves, rather than letting jsonwebtoken guess from the first bit string,
//! so that an unsupported key (RSA below 2048 bits, P-384, Ed448, ...) is refused at start-up
//! with a clear message instead of silently failing every verification later.

const TAG_INTEGER: u8 = 0x02;
const TAG_BIT_STRING: u8 = 0x03;
const TAG_NULL: u8 = 0x05;
const TAG_OID: u8 = 0x06;
const TAG_SEQUENCE: u8 = 0x30;

/// 1.2.840.113549.1.1.1 rsaEncryption
const OID_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
/// 1.2.840.10045.2.1 id-ecPublicKey
const OID_EC: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
/// 1.2.840.10045.3.1.7 prime256v1 (P-256)
const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
/// 1.3.101.112 Ed25519
const OID_ED25519: &[u8] = &[0x2b, 0x65, 0x70];

/// The RSA sizes `ring` verifies (`RSA_PKCS1_2048_8192_SHA256`).
pub(crate) const RSA_MIN_BITS: usize = 2048;
/// See [`RSA_MIN_BITS`].
pub(crate) const RSA_MAX_BITS: usize = 8192;

/// A classified public key, in the form `ring` expects.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PublicKey {
    /// PKCS#1 `RSAPublicKey` DER.
    Rsa(Vec<u8>),
    /// Uncompressed SEC1 point (`04 || x || y`) on P-256.
    EcP256(Vec<u8>),
    /// The 32-byte Ed25519 public key.
    Ed25519(Vec<u8>),
}

/// Why a key could not be used.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// Not valid DER of the expected shape.
    Malformed(&'static str),
    /// Well-formed, but of a type or size we do not accept.
    Unsupported(String),
}

/// Reads one TLV at the start of `input`: returns (tag, contents, rest).
fn read_tlv(input: &[u8]) -> Result<(u8, &[u8], &[u8]), KeyError> {
    let (&tag, rest) = input.split_first().ok_or(KeyError::Malformed("truncated DER"))?;
    let (&first, mut rest) = rest.split_first().ok_or(KeyError::Malformed("truncated DER"))?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        // Long form: the low bits say how many length bytes follow. 0x80 (indefinite) is BER, not DER.
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return Err(KeyError::Malformed("bad DER length"));
        }
        let (len_bytes, after) = rest.split_at(count);
        rest = after;
        len_bytes.iter().fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
    };
    if rest.len() < len {
        return Err(KeyError::Malformed("truncated DER"));
    }
    let (contents, rest) = rest.split_at(len);
    Ok((tag, contents, rest))
}

/// Reads one TLV that must have `tag`.
fn expect<'a>(input: &'a [u8], tag: u8, what: &'static str) -> Result<(&'a [u8], &'a [u8]), KeyError> {
    let (found, contents, rest) = read_tlv(input)?;
    if found != tag {
        return Err(KeyError::Malformed(what));
    }
    Ok((contents, rest))
}

/// Formats an OID's contents as dotted decimal, for error messages.
fn oid_to_string(oid: &[u8]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut value: u64 = 0;
    for (i, &b) in oid.iter().enumerate() {
        value = (value << 7) | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            if parts.is_empty() {
                // The first sub-identifier packs the first two arcs.
                let first = (value / 40).min(2);
                parts.push(first.to_string());
                parts.push((value - first * 40).to_string());
            } else {
                parts.push(value.to_string());
            }
            value = 0;
        } else if i + 1 == oid.len() {
            return "(malformed OID)".to_owned();
        }
    }
    parts.join(".")
}

/// Parses a DER `SubjectPublicKeyInfo` (the body of a `PUBLIC KEY` PEM block).
pub(crate) fn parse_spki(der: &[u8]) -> Result<PublicKey, KeyError> {
    let (spki, trailing) = expect(der, TAG_SEQUENCE, "not a SubjectPublicKeyInfo")?;
    if !trailing.is_empty() {
        return Err(KeyError::Malformed("trailing data after the key"));
    }
    let (alg_id, rest) = expect(spki, TAG_SEQUENCE, "not a SubjectPublicKeyInfo")?;
    let (bits, rest) = expect(rest, TAG_BIT_STRING, "missing public key bit string")?;
    if !rest.is_empty() {
        return Err(KeyError::Malformed("trailing data in SubjectPublicKeyInfo"));
    }
    // The first byte of a BIT STRING counts unused bits; keys are whole bytes.
    let key = match bits.split_first() {
        Some((0, key)) => key,
        _ => return Err(KeyError::Malformed("public key bit string is not byte-aligned")),
    };
    let (oid, params) = expect(alg_id, TAG_OID, "missing algorithm identifier")?;
    if oid == OID_RSA {
        // Parameters must be NULL or absent.
        if !params.is_empty() {
            let (tag, _, rest) = read_tlv(params)?;
            if tag != TAG_NULL || !rest.is_empty() {
                return Err(KeyError::Malformed("unexpected RSA algorithm parameters"));
            }
        }
        parse_rsa_pkcs1(key)
    } else if oid == OID_EC {
        let (curve, _) = expect(params, TAG_OID, "EC key without a named curve")?;
        if curve != OID_P256 {
            return Err(KeyError::Unsupported(format!(
                "EC key on curve {}, only P-256 is supported",
                curve_name(curve)
            )));
        }
        if key.len() != 65 || key.first() != Some(&0x04) {
            return Err(KeyError::Unsupported("EC P-256 key is not an uncompressed point".to_owned()));
        }
        Ok(PublicKey::EcP256(key.to_vec()))
    } else if oid == OID_ED25519 {
        if key.len() != 32 {
            return Err(KeyError::Malformed("Ed25519 key is not 32 bytes"));
        }
        Ok(PublicKey::Ed25519(key.to_vec()))
    } else {
        Err(KeyError::Unsupported(format!("key algorithm {}", algorithm_name(oid))))
    }
}

/// Parses a PKCS#1 `RSAPublicKey` (the body of an `RSA PUBLIC KEY` PEM block) and checks its size.
pub(crate) fn parse_rsa_pkcs1(der: &[u8]) -> Result<PublicKey, KeyError> {
    let (seq, trailing) = expect(der, TAG_SEQUENCE, "not an RSA public key")?;
    if !trailing.is_empty() {
        return Err(KeyError::Malformed("trailing data after the RSA key"));
    }
    let (n, rest) = expect(seq, TAG_INTEGER, "RSA key without a modulus")?;
    let (e, rest) = expect(rest, TAG_INTEGER, "RSA key without an exponent")?;
    if !rest.is_empty() || e.is_empty() {
        return Err(KeyError::Malformed("not an RSA public key"));
    }
    check_rsa_modulus(n)?;
    Ok(PublicKey::Rsa(der.to_vec()))
}

/// Checks that a big-endian RSA modulus has a size `ring` accepts.
pub(crate) fn check_rsa_modulus(n: &[u8]) -> Result<(), KeyError> {
    let bits = rsa_bits(n);
    if !(RSA_MIN_BITS..=RSA_MAX_BITS).contains(&bits) {
        return Err(KeyError::Unsupported(format!("RSA key of {bits} bits")));
    }
    Ok(())
}

/// Counts the significant bits of a big-endian unsigned integer.
fn rsa_bits(n: &[u8]) -> usize {
    let Some(start) = n.iter().position(|&b| b != 0) else {
        return 0;
    };
    let significant = &n[start..];
    let lead = significant.first().map_or(0, |b| b.leading_zeros() as usize);
    significant.len() * 8 - lead
}

fn curve_name(oid: &[u8]) -> String {
    match oid {
        [0x2b, 0x81, 0x04, 0x00, 0x22] => "P-384".to_owned(),
        [0x2b, 0x81, 0x04, 0x00, 0x23] => "P-521".to_owned(),
        [0x2b, 0x81, 0x04, 0x00, 0x0a] => "secp256k1".to_owned(),
        other => oid_to_string(other),
    }
}

fn algorithm_name(oid: &[u8]) -> String {
    match oid {
        [0x2b, 0x65, 0x71] => "Ed448".to_owned(),
        [0x2b, 0x65, 0x6e] => "X25519".to_owned(),
        [0x2b, 0x65, 0x6f] => "X448".to_owned(),
        [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a] => "RSASSA-PSS".to_owned(),
        [0x2a, 0x86, 0x48, 0xce, 0x38, 0x04, 0x01] => "DSA".to_owned(),
        other => oid_to_string(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oid_formats_as_dotted_decimal() {
        assert_eq!(oid_to_string(OID_RSA), "1.2.840.113549.1.1.1");
        assert_eq!(oid_to_string(OID_ED25519), "1.3.101.112");
    }

    #[test]
    fn rsa_bits_ignores_leading_zero_bytes() {
        let mut n = vec![0u8; 257];
        n[1] = 0x80;
        assert_eq!(rsa_bits(&n), 2048);
        n[1] = 0x01;
        assert_eq!(rsa_bits(&n), 2041);
        assert_eq!(rsa_bits(&[0, 0]), 0);
    }

    #[test]
    fn truncated_and_garbage_der_is_malformed() {
        assert!(matches!(parse_spki(&[]), Err(KeyError::Malformed(_))));
        assert!(matches!(parse_spki(&[0x30, 0x82, 0xff]), Err(KeyError::Malformed(_))));
        assert!(matches!(parse_spki(&[0x30, 0x80, 0x00, 0x00]), Err(KeyError::Malformed(_))));
        assert!(matches!(parse_spki(b"garbage"), Err(KeyError::Malformed(_))));
    }
}
