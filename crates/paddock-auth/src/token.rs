//! Structural parsing of a compact JWS (`header.payload.signature`), before any key is involved.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::Deserialize;

use crate::error::AuthError;

/// Longest token accepted; real tokens are a few hundred bytes to a few KiB.
const MAX_TOKEN_LEN: usize = 16 * 1024;

const THREE_SEGMENTS: AuthError = AuthError::Malformed("a token has three dot-separated segments");

/// The JOSE header fields we act on. Others (`typ`, `cty`, ...) are ignored.
#[derive(Deserialize)]
struct RawHeader {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    crit: Option<serde_json::Value>,
}

/// Parses JSON text that must be an object into `T`. serde would also read an array into a
/// struct, field by position; a JOSE header and a JWT payload are objects, so the text must start
/// as one (the parse checks the rest).
pub(crate) fn from_json_object<T: serde::de::DeserializeOwned>(json: &[u8]) -> Option<T> {
    let object = json.iter().find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r')) == Some(&b'{');
    object.then(|| serde_json::from_slice(json).ok()).flatten()
}

/// A structurally valid token: segments decoded, header understood, nothing verified yet.
pub(crate) struct ParsedToken<'a> {
    /// The header's `alg`, verbatim.
    pub(crate) alg: String,
    /// The header's `kid`.
    pub(crate) kid: Option<String>,
    /// `header.payload`, the bytes the signature covers.
    pub(crate) signing_input: &'a str,
    /// The base64url signature segment.
    pub(crate) signature: &'a str,
    /// The decoded payload (untrusted until the signature is verified).
    pub(crate) payload: Vec<u8>,
}

impl<'a> ParsedToken<'a> {
    /// Splits and decodes a token. Every failure is [`AuthError::Malformed`] with a fixed reason.
    pub(crate) fn parse(token: &'a str) -> Result<Self, AuthError> {
        if token.is_empty() {
            return Err(AuthError::Malformed("the token is empty"));
        }
        if token.len() > MAX_TOKEN_LEN {
            return Err(AuthError::Malformed("the token is too long"));
        }
        let (signing_input, signature) = token.rsplit_once('.').ok_or(THREE_SEGMENTS)?;
        let (header_b64, payload_b64) =
            signing_input.split_once('.').filter(|(_, payload)| !payload.contains('.')).ok_or(THREE_SEGMENTS)?;

        let header =
            URL_SAFE_NO_PAD.decode(header_b64).map_err(|_| AuthError::Malformed("the header is not base64url"))?;
        let header = from_json_object::<RawHeader>(&header)
            .ok_or(AuthError::Malformed("the header is not a JSON object with an `alg`"))?;
        // RFC 7515 §4.1.11: extensions listed in `crit` must be understood; we understand none.
        if header.crit.is_some() {
            return Err(AuthError::Malformed("critical header extensions are not supported"));
        }
        let payload =
            URL_SAFE_NO_PAD.decode(payload_b64).map_err(|_| AuthError::Malformed("the payload is not base64url"))?;
        if URL_SAFE_NO_PAD.decode(signature).is_err() {
            return Err(AuthError::Malformed("the signature is not base64url"));
        }
        Ok(Self { alg: header.alg, kid: header.kid, signing_input, signature, payload })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(json: &str) -> String {
        URL_SAFE_NO_PAD.encode(json)
    }

    #[test]
    fn well_formed_token_is_split() {
        let token = format!("{}.{}.c2ln", b64(r#"{"alg":"HS256","kid":"k"}"#), b64("{}"));
        let parsed = ParsedToken::parse(&token).expect("well-formed");
        assert_eq!(parsed.alg, "HS256");
        assert_eq!(parsed.kid.as_deref(), Some("k"));
        assert_eq!(parsed.signature, "c2ln");
        assert_eq!(parsed.payload, b"{}");
        assert!(token.starts_with(parsed.signing_input));
    }

    #[test]
    fn wrong_segment_counts_are_malformed() {
        let h = b64(r#"{"alg":"HS256"}"#);
        for token in [
            String::new(),
            "abc".to_owned(),
            format!("{h}.e30"),
            format!("{h}.e30.c2ln.extra"),
            format!("{h}.e30.c2ln.a.b"),
            "a".repeat(MAX_TOKEN_LEN + 1),
        ] {
            assert!(matches!(ParsedToken::parse(&token), Err(AuthError::Malformed(_))), "{token:.40}");
        }
    }

    #[test]
    fn a_header_that_is_not_an_object_is_refused() {
        for header in [r#"["HS256"]"#, r#" ["HS256", "k"]"#, r#""HS256""#] {
            let token = format!("{}.e30.c2ln", b64(header));
            assert!(matches!(ParsedToken::parse(&token), Err(AuthError::Malformed(_))), "{header}");
        }
        let spaced = format!("{}.e30.c2ln", b64(" \r\n\t{\"alg\":\"HS256\"}"));
        assert_eq!(ParsedToken::parse(&spaced).expect("an object after whitespace").alg, "HS256");
    }

    #[test]
    fn crit_header_is_refused() {
        let token = format!("{}.e30.c2ln", b64(r#"{"alg":"HS256","crit":["b64"],"b64":false}"#));
        assert!(matches!(ParsedToken::parse(&token), Err(AuthError::Malformed(_))));
    }
}
