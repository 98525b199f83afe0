//! `If-Match` preconditions on a generation etag (`"<generation>"`).

use crate::Error;

/// What an `If-Match` header asks for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum IfMatch {
    /// No header: no precondition.
    #[default]
    Absent,
    /// `*`: the object must exist.
    Any,
    /// One of these etags must be current.
    Tags(Vec<Tag>),
}

/// One entity tag of an `If-Match` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    /// `"<generation>"`: the only form that can match (RFC 9110 requires strong comparison).
    Strong(i64),
    /// `W/"<generation>"` or a bare `<generation>`: never matches, but when it names the current
    /// generation the refusal says how to write it rather than that the object changed.
    Misquoted(i64),
    /// Anything else.
    Other,
}

impl Tag {
    fn parse(tag: &str) -> Self {
        let quoted = |t: &str| t.strip_prefix('"').and_then(|t| t.strip_suffix('"')).map(str::to_owned);
        if let Some(generation) = quoted(tag).and_then(|t| t.parse().ok()) {
            return Self::Strong(generation);
        }
        let weak = tag.strip_prefix("W/").and_then(quoted);
        match weak.as_deref().unwrap_or(tag).parse() {
            Ok(generation) => Self::Misquoted(generation),
            Err(_) => Self::Other,
        }
    }
}

impl IfMatch {
    /// Parses the header value.
    pub fn parse(header: Option<&str>) -> Self {
        let Some(header) = header else { return Self::Absent };
        if header.trim() == "*" {
            return Self::Any;
        }
        Self::Tags(header.split(',').map(|tag| Tag::parse(tag.trim())).collect())
    }

    /// Checks the precondition against the current generation (412 when it fails).
    pub fn check(&self, current: i64) -> Result<(), Error> {
        match self {
            Self::Absent | Self::Any => Ok(()),
            Self::Tags(tags) if tags.contains(&Tag::Strong(current)) => Ok(()),
            Self::Tags(tags) => {
                let misquoted = tags.contains(&Tag::Misquoted(current));
                Err(Error::PreconditionFailed { current, misquoted })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_match_compares_strong_etags() {
        assert!(IfMatch::parse(None).check(3).is_ok());
        assert!(IfMatch::parse(Some("*")).check(3).is_ok());
        assert!(IfMatch::parse(Some("\"3\"")).check(3).is_ok());
        assert!(IfMatch::parse(Some("\"2\", \"3\"")).check(3).is_ok());
        assert!(IfMatch::parse(Some("\"2\"")).check(3).is_err());
        assert!(IfMatch::parse(Some("W/\"3\"")).check(3).is_err());
        assert!(IfMatch::parse(Some("3")).check(3).is_err());
        assert!(IfMatch::parse(Some("\"x\", 3")).check(3).is_err());
    }

    #[test]
    fn a_misquoted_current_etag_says_how_to_write_it() {
        for header in ["3", "W/\"3\"", "\"2\", W/\"3\""] {
            let err = IfMatch::parse(Some(header)).check(3).expect_err(header);
            assert!(matches!(err, Error::PreconditionFailed { current: 3, misquoted: true }), "{header}");
            assert!(err.to_string().contains("has not changed") && err.to_string().contains("\"3\""), "{err}");
        }
        let changed = IfMatch::parse(Some("W/\"2\"")).check(3).expect_err("changed");
        assert!(matches!(changed, Error::PreconditionFailed { current: 3, misquoted: false }), "{changed}");
        assert!(changed.to_string().contains("changed"), "{changed}");
    }
}
