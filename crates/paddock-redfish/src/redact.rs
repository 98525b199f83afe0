//! Keeping a secret URL (the run's seed, `/v1/agent/seed/{seed_token}.iso`) out of logs and errors.
//!
//! The URL must travel to the BMC in the `InsertMedia` body, and a BMC may echo it back in an
//! error message (sushy-tools, for one, names the image it could not fetch). [`Redactor`] scrubs
//! every secret part of the URL from such texts; [`mask_url`] is the URL as it may be shown.

/// What replaces a secret.
pub(crate) const REDACTED: &str = "[redacted]";

/// The shortest URL part treated as a secret: shorter ones (`v1`, `seed.iso`) are not, and
/// replacing them would garble unrelated text.
const MIN_SECRET_LEN: usize = 8;

/// `url` with its secret parts masked: user info, query, fragment, and the token segment (the one
/// after `agent/seed`, else the one after `agent`, or, in a URL without one, every path segment
/// but the file name).
pub fn mask_url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return REDACTED.to_owned();
    };
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    if parsed.query().is_some() {
        parsed.set_query(Some(REDACTED));
    }
    if parsed.fragment().is_some() {
        parsed.set_fragment(None);
    }
    let segments: Vec<String> = parsed.path_segments().map(|s| s.map(str::to_owned).collect()).unwrap_or_default();
    let masked = secret_segments(&segments);
    if !masked.is_empty() {
        let path: Vec<&str> =
            segments.iter().enumerate().map(|(i, s)| if masked.contains(&i) { REDACTED } else { s.as_str() }).collect();
        parsed.set_path(&path.join("/"));
    }
    // `set_path` percent-encodes the brackets; the mask reads better as written.
    parsed.as_str().replace("%5Bredacted%5D", REDACTED)
}

/// Indexes of the segments that carry a secret.
fn secret_segments(segments: &[String]) -> Vec<usize> {
    if let Some(agent) = segments.iter().position(|s| s == "agent") {
        // `agent/seed/{seed_token}.iso` (the agent contract's revision 2), else `agent/{token}/...`.
        let at = if segments.get(agent + 1).is_some_and(|s| s == "seed") { agent + 2 } else { agent + 1 };
        return if at < segments.len() { vec![at] } else { Vec::new() };
    }
    // Unknown layout: only the file name is shown.
    (0..segments.len().saturating_sub(1)).filter(|&i| !segments[i].is_empty()).collect()
}

/// Scrubs the secret parts of one URL from texts.
#[derive(Clone)]
pub(crate) struct Redactor {
    /// Longest first, so that the whole URL is replaced before its parts.
    secrets: Vec<String>,
    shown: String,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor").field("shown", &self.shown).finish_non_exhaustive()
    }
}

impl Redactor {
    /// A redactor for `url`.
    pub(crate) fn for_url(url: &str) -> Self {
        let mut secrets = vec![url.to_owned()];
        if let Ok(parsed) = url::Url::parse(url) {
            secrets.push(parsed.as_str().to_owned());
            let segments: Vec<String> =
                parsed.path_segments().map(|s| s.map(str::to_owned).collect()).unwrap_or_default();
            for i in secret_segments(&segments) {
                secrets.push(segments[i].clone());
                // The seed token without its `.iso`, as a BMC may print it.
                secrets.extend(segments[i].strip_suffix(".iso").map(str::to_owned));
                // A BMC may print the segment decoded.
                if let Ok(decoded) = percent_decode(&segments[i]) {
                    secrets.push(decoded);
                }
            }
            secrets.extend(parsed.query().map(str::to_owned));
            secrets.extend(parsed.password().map(str::to_owned));
        }
        secrets.retain(|s| s.len() >= MIN_SECRET_LEN);
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Self { secrets, shown: mask_url(url) }
    }

    /// `text` without the secret: the whole URL becomes the masked one, a bare token `[redacted]`.
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (i, secret) in self.secrets.iter().enumerate() {
            let replacement = if i == 0 && secret.contains("://") { self.shown.as_str() } else { REDACTED };
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), replacement);
            }
        }
        out
    }
}

/// `%XX` decoding of one path segment.
fn percent_decode(segment: &str) -> Result<String, ()> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = segment.get(i + 1..i + 3).ok_or(())?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| ())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = "http://10.0.0.1:8080/v1/agent/Zm9vYmFyYmF6cXV4LXRva2VuLTEyMzQ1Njc4OTA/seed.iso";

    #[test]
    fn the_token_segment_is_masked() {
        assert_eq!(mask_url(SEED), "http://10.0.0.1:8080/v1/agent/[redacted]/seed.iso");
        assert_eq!(
            mask_url("https://u:pw@h/a/secretsecret/x.iso?t=abc"),
            "https://h/[redacted]/[redacted]/x.iso?[redacted]"
        );
        assert_eq!(mask_url("not a url"), "[redacted]");
    }

    #[test]
    fn the_seed_token_of_a_seed_url_is_masked_and_scrubbed() {
        const URL: &str = "http://10.0.0.1:8080/v1/agent/seed/Zm9vYmFyYmF6cXV4LXRva2VuLTEyMzQ1Njc4OTA.iso";
        assert_eq!(mask_url(URL), "http://10.0.0.1:8080/v1/agent/seed/[redacted]");
        let r = Redactor::for_url(URL);
        let text = format!("cannot fetch {URL}: 404; token Zm9vYmFyYmF6cXV4LXRva2VuLTEyMzQ1Njc4OTA unknown");
        let scrubbed = r.scrub(&text);
        assert!(!scrubbed.contains("Zm9vYmFy"), "{scrubbed}");
        assert!(scrubbed.contains("http://10.0.0.1:8080/v1/agent/seed/[redacted]"), "{scrubbed}");
    }

    #[test]
    fn texts_lose_the_url_and_the_bare_token() {
        let r = Redactor::for_url(SEED);
        let text = format!("cannot fetch {SEED}: 404; token Zm9vYmFyYmF6cXV4LXRva2VuLTEyMzQ1Njc4OTA unknown");
        let scrubbed = r.scrub(&text);
        assert!(!scrubbed.contains("Zm9vYmFy"), "{scrubbed}");
        assert!(scrubbed.contains("http://10.0.0.1:8080/v1/agent/[redacted]/seed.iso"), "{scrubbed}");
        assert_eq!(r.scrub("seed.iso v1 agent"), "seed.iso v1 agent");
        assert!(!format!("{r:?}").contains("Zm9vYmFy"));
    }
}
