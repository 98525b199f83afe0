//! Opaque list cursors: base64url of a small JSON document. Lists are keyset-paginated on a
//! time-ordered id, so a walk stays complete and duplicate-free while rows are added.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::Error;

/// The position after which the next page starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct After {
    /// Last id of the previous page.
    pub after: Uuid,
}

/// Encodes a cursor.
pub fn encode<T: Serialize>(cursor: &T) -> String {
    // Serializing a plain struct of ids and timestamps cannot fail.
    let json = serde_json::to_vec(cursor).unwrap_or_default();
    URL_SAFE_NO_PAD.encode(json)
}

/// Decodes a cursor; anything that is not one of ours is a 400.
pub fn decode<T: DeserializeOwned>(cursor: &str) -> Result<T, Error> {
    let bad =
        || Error::BadRequest { code: "invalid_cursor", message: "the cursor is not one this list returned".to_owned() };
    let bytes = URL_SAFE_NO_PAD.decode(cursor.as_bytes()).map_err(|_| bad())?;
    serde_json::from_slice(&bytes).map_err(|_| bad())
}

/// A validated page request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRequest {
    /// Rows to return.
    pub limit: u32,
    /// Start after this id.
    pub after: Option<Uuid>,
}

impl PageRequest {
    /// Validates `limit` (1..=1000, default 100; any integer out of range is 422, something that
    /// is not an integer 400) and the cursor.
    pub fn parse(limit: Option<&str>, cursor: Option<&str>) -> Result<Self, Error> {
        let max = paddock_types::page::MAX_LIMIT;
        let limit = match limit {
            None => paddock_types::page::DEFAULT_LIMIT,
            Some(text) => {
                let digits = text.strip_prefix('-').unwrap_or(text);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(Error::BadRequest {
                        code: "invalid_parameter",
                        message: format!("limit must be an integer, not {text:?}"),
                    });
                }
                match text.parse::<u32>() {
                    Ok(n) if (1..=max).contains(&n) => n,
                    _ => return Err(Error::invalid("limit", format!("must be between 1 and {max}"))),
                }
            }
        };
        let after = cursor.map(decode::<After>).transpose()?.map(|a| a.after);
        Ok(Self { limit, after })
    }

    /// The cursor of the page after `items`, when the page was full.
    pub fn next_cursor<T>(&self, items: &[T], id: impl Fn(&T) -> Uuid) -> Option<String> {
        if items.len() < self.limit as usize {
            return None;
        }
        items.last().map(|last| encode(&After { after: id(last) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_rejects_garbage() {
        let id = Uuid::now_v7();
        let page = PageRequest::parse(Some("2"), Some(&encode(&After { after: id }))).expect("parse");
        assert_eq!(page.after, Some(id));
        assert!(matches!(PageRequest::parse(None, Some("!!")), Err(Error::BadRequest { .. })));
        assert!(matches!(PageRequest::parse(None, Some("e30")), Err(Error::BadRequest { .. })));
        for out_of_range in ["1001", "0", "-1", "99999999999999999999"] {
            assert!(matches!(PageRequest::parse(Some(out_of_range), None), Err(Error::Invalid(_))), "{out_of_range}");
        }
        for malformed in ["abc", "", "1.5", "-"] {
            assert!(matches!(PageRequest::parse(Some(malformed), None), Err(Error::BadRequest { .. })), "{malformed}");
        }
    }
}
