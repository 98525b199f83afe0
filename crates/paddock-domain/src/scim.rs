//! SCIM 2.0 (RFC 7643 and 7644): how a tenant's identity provider pushes its users and groups.
//! Here the pure parts: the schema URNs, the filter language (`filter`), PATCH (`patch`), reading
//! and rendering users and groups (`resource`), the discovery documents (`discovery`), the POSIX
//! id range, and the SCIM bearer tokens. SCIM's failures are [`Error::BadRequest`] and
//! [`Error::Conflict`] with the codes of [`scim_type`], which the API answers as SCIM error bodies.

pub mod discovery;
pub mod filter;
pub mod patch;
pub mod resource;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::Error;

/// The core User schema.
pub const USER_SCHEMA: &str = "urn:ietf:params:scim:schemas:core:2.0:User";
/// The core Group schema.
pub const GROUP_SCHEMA: &str = "urn:ietf:params:scim:schemas:core:2.0:Group";
/// paddock's extension of a user: `uidNumber`, `gidNumber`, `loginShell`, `sshPublicKeys`.
pub const POSIX_USER_SCHEMA: &str = "urn:paddock:params:scim:schemas:extension:posix:2.0:User";
/// paddock's extension of a group: `gidNumber`.
pub const POSIX_GROUP_SCHEMA: &str = "urn:paddock:params:scim:schemas:extension:posix:2.0:Group";
/// A list's body.
pub const LIST_RESPONSE: &str = "urn:ietf:params:scim:api:messages:2.0:ListResponse";
/// A PATCH request's body.
pub const PATCH_OP: &str = "urn:ietf:params:scim:api:messages:2.0:PatchOp";
/// An error's body.
pub const ERROR_SCHEMA: &str = "urn:ietf:params:scim:api:messages:2.0:Error";

/// The prefix of a SCIM bearer token.
pub const TOKEN_PREFIX: &str = "pdk_scim_";

/// The most results one list answers (`ServiceProviderConfig.filter.maxResults`).
pub const MAX_RESULTS: usize = 1000;

/// A fresh SCIM bearer token: the prefix and the base64url of 32 random bytes.
pub fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// What is stored of a token: its SHA-256.
pub fn token_hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// The SCIM `scimType` of an error's code, for the codes SCIM defines (RFC 7644, section 3.12).
pub fn scim_type(code: &str) -> Option<&'static str> {
    Some(match code {
        "invalid_filter" => "invalidFilter",
        "too_many" => "tooMany",
        "uniqueness" => "uniqueness",
        "mutability" => "mutability",
        "invalid_syntax" | "malformed_body" => "invalidSyntax",
        "invalid_path" => "invalidPath",
        "no_target" => "noTarget",
        "invalid_value" | "validation_failed" => "invalidValue",
        _ => return None,
    })
}

/// 400 `invalidFilter`.
pub fn invalid_filter(message: impl Into<String>) -> Error {
    Error::BadRequest { code: "invalid_filter", message: message.into() }
}

/// 400 `invalidValue`.
pub fn invalid_value(message: impl Into<String>) -> Error {
    Error::BadRequest { code: "invalid_value", message: message.into() }
}

/// 400 `invalidSyntax`.
pub fn invalid_syntax(message: impl Into<String>) -> Error {
    Error::BadRequest { code: "invalid_syntax", message: message.into() }
}

/// 400 `invalidPath`.
pub fn invalid_path(message: impl Into<String>) -> Error {
    Error::BadRequest { code: "invalid_path", message: message.into() }
}

/// 400 `noTarget`.
pub fn no_target(message: impl Into<String>) -> Error {
    Error::BadRequest { code: "no_target", message: message.into() }
}

/// 409 `uniqueness`.
pub fn uniqueness(message: impl Into<String>) -> Error {
    Error::Conflict { code: "uniqueness", message: message.into() }
}

/// The value of `key` in `object`, its name compared without case (SCIM attribute names are
/// case-insensitive, RFC 7643 section 2.1).
pub fn get_ci<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    object.get(key).or_else(|| object.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v))
}

/// The name `key` has in `object` (compared without case), if it is there.
pub fn key_ci(object: &Map<String, Value>, key: &str) -> Option<String> {
    object.keys().find(|k| k.eq_ignore_ascii_case(key)).cloned()
}

/// The numbers paddock gives users and groups as `uidNumber` and `gidNumber`
/// (`PADDOCK_IDENTITY_ID_RANGE`, `first-last`): above the system ids (below 1000, the images'
/// `slurm` user 401 among them), never 65534 (`nobody`) or 65535, and within a signed 32-bit
/// integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    /// The first number.
    pub first: u32,
    /// The last number.
    pub last: u32,
}

impl Default for IdRange {
    fn default() -> Self {
        Self { first: 10_000, last: 59_999 }
    }
}

/// Numbers no range may hand out: `nobody` and the 16-bit -1.
const RESERVED: [u32; 2] = [65_534, 65_535];

/// The lowest id a range may start at: the system ids end below it.
pub const MIN_ID: u32 = 1000;

impl std::str::FromStr for IdRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (first, last) = s.trim().split_once('-').ok_or_else(|| format!("{s:?} is not `first-last`"))?;
        let parse = |n: &str| n.trim().parse::<u32>().map_err(|_| format!("{n:?} is not a number"));
        let range = Self { first: parse(first)?, last: parse(last)? };
        if range.first < MIN_ID {
            return Err(format!("the range must start at {MIN_ID} or above, past the system ids"));
        }
        if range.last > i32::MAX as u32 {
            return Err(format!("the range must end at {} or below", i32::MAX));
        }
        if range.first > range.last {
            return Err("the first number is above the last".to_owned());
        }
        Ok(range)
    }
}

impl std::fmt::Display for IdRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl IdRange {
    /// Whether `n` may be a user's or group's id.
    pub fn contains(&self, n: i64) -> bool {
        n >= i64::from(self.first) && n <= i64::from(self.last) && !RESERVED.iter().any(|r| i64::from(*r) == n)
    }

    /// The reserved numbers inside the range, which allocation skips.
    pub fn reserved(&self) -> Vec<i32> {
        RESERVED.iter().filter(|r| **r >= self.first && **r <= self.last).map(|r| *r as i32).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_excludes_system_ids_and_nobody() {
        assert_eq!("10000-59999".parse::<IdRange>(), Ok(IdRange::default()));
        assert!("401-2000".parse::<IdRange>().is_err(), "the slurm user's 401 is a system id");
        assert!("999-2000".parse::<IdRange>().is_err());
        assert!("2000-1000".parse::<IdRange>().is_err());
        assert!("1000-3000000000".parse::<IdRange>().is_err());
        assert!("10000".parse::<IdRange>().is_err());
        let wide: IdRange = "60000-70000".parse().expect("a range");
        assert!(wide.contains(60_000) && wide.contains(70_000) && !wide.contains(70_001));
        assert!(!wide.contains(65_534) && !wide.contains(65_535));
        assert_eq!(wide.reserved(), vec![65_534, 65_535]);
        assert!(!IdRange::default().contains(401));
    }

    #[test]
    fn tokens_are_prefixed_and_hashed() {
        let token = new_token();
        assert!(token.starts_with(TOKEN_PREFIX));
        assert_eq!(token.len(), TOKEN_PREFIX.len() + 43);
        assert_eq!(token_hash(&token).len(), 32);
        assert_ne!(new_token(), token);
    }
}
