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
    /// One of these etags must be current. Weak or unparseable tags never match (RFC 9110
    /// requires strong comparison), so they are kept only to fail.
    Tags(Vec<Option<i64>>),
}

impl IfMatch {
    /// Parses the header value.
    pub fn parse(header: Option<&str>) -> Self {
        let Some(header) = header else { return Self::Absent };
        if header.trim() == "*" {
            return Self::Any;
        }
        Self::Tags(
            header
                .split(',')
                .map(|tag| {
                    let tag = tag.trim();
                    tag.strip_prefix('"').and_then(|t| t.strip_suffix('"')).and_then(|t| t.parse::<i64>().ok())
                })
                .collect(),
        )
    }

    /// Checks the precondition against the current generation (412 when it fails).
    pub fn check(&self, current: i64) -> Result<(), Error> {
        match self {
            Self::Absent | Self::Any => Ok(()),
            Self::Tags(tags) if tags.contains(&Some(current)) => Ok(()),
            Self::Tags(_) => Err(Error::PreconditionFailed { current }),
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
    }
}
