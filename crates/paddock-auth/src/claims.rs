//! [`Claims`] and their validation. Validation runs only after the signature has been verified.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::AuthError;

/// The validated claims of a paddock token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Claims {
    /// Subject: who the token speaks for. Never empty after verification.
    pub sub: String,
    /// Roles such as `provider:admin` or `tenant:member`; empty when the token has none.
    #[serde(default)]
    pub roles: Vec<String>,
    /// The tenant, for tenant roles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<uuid::Uuid>,
    /// Expiry, seconds since the Unix epoch.
    pub exp: i64,
    /// Not-before, seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
    /// Issued-at, seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<i64>,
    /// Issuer.
    pub iss: String,
    /// Audience: a string or an array of strings, as in the token.
    pub aud: Value,
}

/// The claims of a payload that [`Claims`] reads, as sent; any other claim is skipped unread (no
/// map of owned names to build and search). Each is a JSON value: an explicit `null` reads as
/// absent, and a claim of the wrong type is refused naming it, not as a parse error. A claim
/// given twice fails the parse (RFC 7519 section 4 lets a parser refuse duplicate names).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Payload {
    exp: Option<Value>,
    nbf: Option<Value>,
    iat: Option<Value>,
    iss: Option<Value>,
    aud: Option<Value>,
    sub: Option<Value>,
    roles: Option<Value>,
    tenant_id: Option<Value>,
}

/// What a token's claims are checked against.
pub(crate) struct Expectations<'a> {
    pub(crate) issuer: &'a str,
    pub(crate) audience: &'a str,
    pub(crate) leeway: i64,
    pub(crate) now: i64,
    /// Longest `exp - iat` accepted (`PADDOCK_TOKEN_MAX_LIFETIME`).
    pub(crate) max_lifetime: i64,
}

impl Claims {
    /// Validates a (signature-verified) payload and builds the claims.
    pub(crate) fn from_payload(payload: Payload, expect: &Expectations<'_>) -> Result<Self, AuthError> {
        // Time first: an expired token is reported as expired whatever else is wrong with it,
        // which tells a client the one useful thing (get a new token).
        let exp = numeric_date(payload.exp, "exp")?.ok_or(AuthError::MissingClaim("exp"))?;
        if expect.now >= exp.saturating_add(expect.leeway) {
            return Err(AuthError::Expired);
        }
        let nbf = numeric_date(payload.nbf, "nbf")?;
        if nbf.is_some_and(|nbf| nbf > expect.now.saturating_add(expect.leeway)) {
            return Err(AuthError::NotYetValid);
        }
        // A token must say when it was issued, not in the future, and must not live longer than
        // the configured maximum: a token minted for a year is refused even while unexpired.
        let iat = numeric_date(payload.iat, "iat")?.ok_or(AuthError::MissingClaim("iat"))?;
        if iat > expect.now.saturating_add(expect.leeway) {
            return Err(AuthError::InvalidClaim("iat"));
        }
        if exp.saturating_sub(iat) > expect.max_lifetime {
            return Err(AuthError::LifetimeTooLong { max_secs: expect.max_lifetime });
        }
        let iat = Some(iat);

        let iss = required_string(payload.iss, "iss")?;
        if iss != expect.issuer {
            return Err(AuthError::WrongIssuer);
        }
        let aud = payload.aud.ok_or(AuthError::MissingClaim("aud"))?;
        if !audience_contains(&aud, expect.audience)? {
            return Err(AuthError::WrongAudience);
        }

        let sub = required_string(payload.sub, "sub")?;
        if sub.is_empty() {
            return Err(AuthError::MissingClaim("sub"));
        }
        let roles = match payload.roles {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|item| match item {
                    Value::String(role) => Ok(role),
                    _ => Err(AuthError::InvalidClaim("roles")),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(AuthError::InvalidClaim("roles")),
        };
        let tenant_id = match payload.tenant_id {
            None => None,
            Some(Value::String(id)) => {
                Some(uuid::Uuid::parse_str(&id).map_err(|_| AuthError::InvalidClaim("tenant_id"))?)
            }
            Some(_) => return Err(AuthError::InvalidClaim("tenant_id")),
        };

        Ok(Self { sub, roles, tenant_id, exp, nbf, iat, iss, aud })
    }
}

fn required_string(value: Option<Value>, name: &'static str) -> Result<String, AuthError> {
    match value {
        None => Err(AuthError::MissingClaim(name)),
        Some(Value::String(text)) => Ok(text),
        Some(_) => Err(AuthError::InvalidClaim(name)),
    }
}

/// Reads a NumericDate (RFC 7519: seconds, possibly fractional).
fn numeric_date(value: Option<Value>, name: &'static str) -> Result<Option<i64>, AuthError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let Value::Number(number) = value else {
        return Err(AuthError::InvalidClaim(name));
    };
    if let Some(seconds) = number.as_i64() {
        return Ok(Some(seconds));
    }
    match number.as_f64() {
        // Truncate fractions toward the past; the range check keeps the cast exact enough.
        Some(seconds) if seconds.is_finite() && seconds.abs() < 1e15 => Ok(Some(seconds.floor() as i64)),
        _ => Err(AuthError::InvalidClaim(name)),
    }
}

/// `aud` is a string or an array of strings (RFC 7519 §4.1.3).
fn audience_contains(aud: &Value, audience: &str) -> Result<bool, AuthError> {
    match aud {
        Value::String(single) => Ok(single == audience),
        Value::Array(items) => {
            let mut found = false;
            for item in items {
                match item {
                    Value::String(candidate) => found |= candidate == audience,
                    _ => return Err(AuthError::InvalidClaim("aud")),
                }
            }
            Ok(found)
        }
        _ => Err(AuthError::InvalidClaim("aud")),
    }
}
