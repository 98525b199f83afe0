//! SCIM filters (RFC 7644, section 3.4.2.2): `userName eq "bjensen"`, `emails[type eq "work"]`,
//! `not (active eq false) and meta.lastModified gt "2026-01-01T00:00:00Z"`. Parsed into a tree
//! (a malformed filter is 400 `invalidFilter`) and evaluated on a rendered resource. Attribute
//! names and operators are case-insensitive; string values too, except for the attributes SCIM
//! defines as case-exact (`id`, `externalId`, member ids) and SSH keys.

use std::cmp::Ordering;

use serde_json::{Map, Value};

use super::{get_ci, invalid_filter, GROUP_SCHEMA, USER_SCHEMA};
use crate::Result;

/// The longest filter accepted.
const MAX_LEN: usize = 4096;
/// The deepest nesting accepted (parentheses, `not`, value paths).
const MAX_DEPTH: usize = 32;

/// An attribute's path: `[urn:]attr[.sub]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttrPath {
    /// The schema URN, when written (`urn:...:User:userName`).
    pub urn: Option<String>,
    /// The attribute.
    pub attr: String,
    /// The sub-attribute.
    pub sub: Option<String>,
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    /// Equal.
    Eq,
    /// Not equal.
    Ne,
    /// Contains.
    Co,
    /// Starts with.
    Sw,
    /// Ends with.
    Ew,
    /// Greater than.
    Gt,
    /// Greater than or equal.
    Ge,
    /// Less than.
    Lt,
    /// Less than or equal.
    Le,
}

impl CompareOp {
    fn parse(word: &str) -> Option<Self> {
        Some(match word.to_ascii_lowercase().as_str() {
            "eq" => Self::Eq,
            "ne" => Self::Ne,
            "co" => Self::Co,
            "sw" => Self::Sw,
            "ew" => Self::Ew,
            "gt" => Self::Gt,
            "ge" => Self::Ge,
            "lt" => Self::Lt,
            "le" => Self::Le,
            _ => return None,
        })
    }
}

/// A parsed filter.
#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    /// `attr op value`.
    Compare {
        /// The attribute.
        path: AttrPath,
        /// The operator.
        op: CompareOp,
        /// The value (a string, number, boolean or null).
        value: Value,
    },
    /// `attr pr`.
    Present(AttrPath),
    /// Both.
    And(Box<Filter>, Box<Filter>),
    /// Either.
    Or(Box<Filter>, Box<Filter>),
    /// Not.
    Not(Box<Filter>),
    /// `attr[filter]`: some value of a multi-valued attribute matches.
    ValuePath {
        /// The multi-valued attribute.
        path: AttrPath,
        /// What one of its values must match.
        filter: Box<Filter>,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Open,
    Close,
    OpenBracket,
    CloseBracket,
    Word(String),
    Str(String),
}

fn tokenize(text: &str) -> Result<Vec<Token>> {
    let mut tokens = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some(&(at, c)) = chars.peek() {
        match c {
            ' ' | '\t' | '\n' | '\r' => {
                chars.next();
            }
            '(' | ')' | '[' | ']' => {
                chars.next();
                tokens.push(match c {
                    '(' => Token::Open,
                    ')' => Token::Close,
                    '[' => Token::OpenBracket,
                    _ => Token::CloseBracket,
                });
            }
            '"' => {
                // A JSON string: find its closing quote, then let JSON decode the escapes.
                chars.next();
                let mut escaped = false;
                let mut end = None;
                for (i, c) in chars.by_ref() {
                    match (escaped, c) {
                        (true, _) => escaped = false,
                        (false, '\\') => escaped = true,
                        (false, '"') => {
                            end = Some(i);
                            break;
                        }
                        _ => {}
                    }
                }
                let end = end.ok_or_else(|| invalid_filter("a string is not closed"))?;
                let s: String = serde_json::from_str(&text[at..=end])
                    .map_err(|_| invalid_filter("a string has an invalid escape"))?;
                tokens.push(Token::Str(s));
            }
            _ => {
                let mut word = String::new();
                while let Some(&(_, c)) = chars.peek() {
                    if c.is_whitespace() || "()[]\"".contains(c) {
                        break;
                    }
                    word.push(c);
                    chars.next();
                }
                tokens.push(Token::Word(word));
            }
        }
    }
    Ok(tokens)
}

/// Parses an attribute path (`[urn:]attr[.sub]`).
pub fn parse_attr_path(word: &str) -> Result<AttrPath> {
    let bad = || invalid_filter(format!("{:?} is not an attribute path", truncate(word)));
    let (urn, rest) = match word.rfind(':') {
        Some(i) => (Some(word[..i].to_owned()), &word[i + 1..]),
        None => (None, word),
    };
    let mut parts = rest.split('.');
    let attr = parts.next().filter(|a| is_attr_name(a)).ok_or_else(bad)?.to_owned();
    let sub = match parts.next() {
        None => None,
        Some(s) if is_attr_name(s) => Some(s.to_owned()),
        Some(_) => return Err(bad()),
    };
    if parts.next().is_some() || urn.as_deref().is_some_and(|u| !u.to_ascii_lowercase().starts_with("urn:")) {
        return Err(bad());
    }
    Ok(AttrPath { urn, attr, sub })
}

/// An attribute name: a letter, then letters, digits, `-` or `_` (or `$ref`).
fn is_attr_name(s: &str) -> bool {
    s == "$ref"
        || s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    fn keyword(&self, word: &str) -> bool {
        matches!(self.peek(), Some(Token::Word(w)) if w.eq_ignore_ascii_case(word))
    }

    fn deeper(&mut self) -> Result<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(invalid_filter("the filter is nested too deeply"));
        }
        Ok(())
    }

    fn or(&mut self) -> Result<Filter> {
        let mut left = self.and()?;
        while self.keyword("or") {
            self.next();
            left = Filter::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Filter> {
        let mut left = self.unary()?;
        while self.keyword("and") {
            self.next();
            left = Filter::And(Box::new(left), Box::new(self.unary()?));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Filter> {
        self.deeper()?;
        let filter = if self.keyword("not") {
            self.next();
            self.expect(&Token::Open, "`not` must be followed by `(`")?;
            let inner = self.or()?;
            self.expect(&Token::Close, "a `(` is not closed")?;
            Filter::Not(Box::new(inner))
        } else if self.peek() == Some(&Token::Open) {
            self.next();
            let inner = self.or()?;
            self.expect(&Token::Close, "a `(` is not closed")?;
            inner
        } else {
            self.attr_expr()?
        };
        self.depth -= 1;
        Ok(filter)
    }

    fn expect(&mut self, token: &Token, message: &str) -> Result<()> {
        if self.next().as_ref() == Some(token) {
            Ok(())
        } else {
            Err(invalid_filter(message))
        }
    }

    fn attr_expr(&mut self) -> Result<Filter> {
        let Some(Token::Word(word)) = self.next() else {
            return Err(invalid_filter("an attribute was expected"));
        };
        let path = parse_attr_path(&word)?;
        if self.peek() == Some(&Token::OpenBracket) {
            self.next();
            let inner = self.or()?;
            self.expect(&Token::CloseBracket, "a `[` is not closed")?;
            return Ok(Filter::ValuePath { path, filter: Box::new(inner) });
        }
        let Some(Token::Word(op)) = self.next() else {
            return Err(invalid_filter(format!("an operator was expected after {}", truncate(&word))));
        };
        if op.eq_ignore_ascii_case("pr") {
            return Ok(Filter::Present(path));
        }
        let op = CompareOp::parse(&op)
            .ok_or_else(|| invalid_filter(format!("{:?} is not a comparison operator", truncate(&op))))?;
        let value = match self.next() {
            Some(Token::Str(s)) => Value::String(s),
            Some(Token::Word(w)) => literal(&w)?,
            _ => return Err(invalid_filter("a value was expected")),
        };
        let fits = match op {
            CompareOp::Eq | CompareOp::Ne => true,
            CompareOp::Co | CompareOp::Sw | CompareOp::Ew => value.is_string(),
            _ => value.is_string() || value.is_number(),
        };
        if !fits {
            return Err(invalid_filter(format!("{value} cannot be compared with {op:?}")));
        }
        Ok(Filter::Compare { path, op, value })
    }
}

fn literal(word: &str) -> Result<Value> {
    match word.to_ascii_lowercase().as_str() {
        "true" => Ok(Value::Bool(true)),
        "false" => Ok(Value::Bool(false)),
        "null" => Ok(Value::Null),
        _ => serde_json::from_str::<serde_json::Number>(word)
            .map(Value::Number)
            .map_err(|_| invalid_filter(format!("{:?} is not a value (strings are quoted)", truncate(word)))),
    }
}

impl Filter {
    /// Parses a filter; 400 `invalidFilter` when it is malformed.
    pub fn parse(text: &str) -> Result<Self> {
        if text.len() > MAX_LEN {
            return Err(invalid_filter(format!("the filter is longer than {MAX_LEN} bytes")));
        }
        let mut parser = Parser { tokens: tokenize(text)?, at: 0, depth: 0 };
        if parser.tokens.is_empty() {
            return Err(invalid_filter("the filter is empty"));
        }
        let filter = parser.or()?;
        if parser.at != parser.tokens.len() {
            return Err(invalid_filter("the filter goes on after its end"));
        }
        Ok(filter)
    }

    /// The `attr eq "value"` of a filter that is only that (for a lookup by index).
    pub fn simple_eq(&self) -> Option<(&str, &str)> {
        match self {
            Filter::Compare { path, op: CompareOp::Eq, value: Value::String(v) }
                if path.sub.is_none() && path.urn.as_deref().is_none_or(is_core) =>
            {
                Some((path.attr.as_str(), v.as_str()))
            }
            _ => None,
        }
    }

    /// Whether `resource` (a rendered SCIM resource, or one value of a multi-valued attribute)
    /// matches.
    pub fn matches(&self, resource: &Value) -> bool {
        match self {
            Filter::And(a, b) => a.matches(resource) && b.matches(resource),
            Filter::Or(a, b) => a.matches(resource) || b.matches(resource),
            Filter::Not(a) => !a.matches(resource),
            Filter::Present(path) => values(resource, path).iter().any(|v| present(v)),
            Filter::Compare { path, op: CompareOp::Ne, value } => !compare_any(resource, path, CompareOp::Eq, value),
            Filter::Compare { path, op, value } => compare_any(resource, path, *op, value),
            Filter::ValuePath { path, filter } => {
                let Some(container) = container(resource, path) else { return false };
                match get_ci(container, &path.attr) {
                    Some(Value::Array(items)) => items.iter().any(|item| filter.matches(item)),
                    Some(item @ Value::Object(_)) => filter.matches(item),
                    _ => false,
                }
            }
        }
    }
}

fn is_core(urn: &str) -> bool {
    urn.eq_ignore_ascii_case(USER_SCHEMA) || urn.eq_ignore_ascii_case(GROUP_SCHEMA)
}

/// The object an attribute path's attribute lives in: the resource, or its extension's object.
pub fn container<'a>(resource: &'a Value, path: &AttrPath) -> Option<&'a Map<String, Value>> {
    let object = resource.as_object()?;
    match &path.urn {
        Some(urn) if !is_core(urn) => get_ci(object, urn)?.as_object(),
        _ => Some(object),
    }
}

/// The values a path names, multi-valued attributes flattened (a complex value stands for its
/// `value` sub-attribute when no sub-attribute is named).
fn values<'a>(resource: &'a Value, path: &AttrPath) -> Vec<&'a Value> {
    let Some(found) = container(resource, path).and_then(|c| get_ci(c, &path.attr)) else { return Vec::new() };
    let items: Vec<&Value> = match found {
        Value::Array(items) => items.iter().collect(),
        one => vec![one],
    };
    items
        .into_iter()
        .filter_map(|item| match (&path.sub, item) {
            (Some(sub), Value::Object(o)) => get_ci(o, sub),
            (Some(_), _) => None,
            (None, Value::Object(o)) => get_ci(o, "value").or(Some(item)),
            (None, _) => Some(item),
        })
        .collect()
}

fn present(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        _ => true,
    }
}

/// Whether string comparisons on `path` respect case.
fn case_exact(path: &AttrPath) -> bool {
    let attr = path.attr.to_ascii_lowercase();
    matches!(attr.as_str(), "id" | "externalid" | "sshpublickeys")
        || (matches!(attr.as_str(), "members" | "groups")
            && path.sub.as_deref().is_none_or(|s| s.eq_ignore_ascii_case("value")))
}

fn compare_any(resource: &Value, path: &AttrPath, op: CompareOp, target: &Value) -> bool {
    let exact = case_exact(path);
    let found = values(resource, path);
    if found.is_empty() {
        return op == CompareOp::Eq && target.is_null();
    }
    found.into_iter().any(|v| compare(v, op, target, exact))
}

fn compare(v: &Value, op: CompareOp, target: &Value, exact: bool) -> bool {
    match (v, target) {
        (Value::String(a), Value::String(b)) => {
            let (a, b) = if exact { (a.clone(), b.clone()) } else { (a.to_lowercase(), b.to_lowercase()) };
            match op {
                CompareOp::Eq => a == b,
                CompareOp::Ne => a != b,
                CompareOp::Co => a.contains(&b),
                CompareOp::Sw => a.starts_with(&b),
                CompareOp::Ew => a.ends_with(&b),
                _ => ordered(a.cmp(&b), op),
            }
        }
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (a.as_f64().unwrap_or(f64::NAN), b.as_f64().unwrap_or(f64::NAN));
            match op {
                CompareOp::Eq => a == b,
                CompareOp::Ne => a != b,
                _ => a.partial_cmp(&b).is_some_and(|o| ordered(o, op)),
            }
        }
        (Value::Bool(a), Value::Bool(b)) => match op {
            CompareOp::Eq => a == b,
            CompareOp::Ne => a != b,
            _ => false,
        },
        (Value::Null, Value::Null) => op == CompareOp::Eq,
        _ => op == CompareOp::Ne,
    }
}

fn ordered(o: Ordering, op: CompareOp) -> bool {
    match op {
        CompareOp::Gt => o == Ordering::Greater,
        CompareOp::Ge => o != Ordering::Less,
        CompareOp::Lt => o == Ordering::Less,
        CompareOp::Le => o != Ordering::Greater,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn user() -> Value {
        json!({
            "schemas": [USER_SCHEMA],
            "id": "2819c223-7f76-453a-919d-413861904646",
            "externalId": "bjensen",
            "userName": "bjensen@example.com",
            "name": { "familyName": "Jensen", "givenName": "Barbara" },
            "emails": [
                { "value": "bjensen@example.com", "type": "work", "primary": true },
                { "value": "babs@jensen.org", "type": "home" }
            ],
            "active": true,
            "meta": { "resourceType": "User", "lastModified": "2011-05-13T04:42:34Z" },
            "urn:paddock:params:scim:schemas:extension:posix:2.0:User": { "uidNumber": 10001 }
        })
    }

    fn m(filter: &str) -> bool {
        Filter::parse(filter).unwrap_or_else(|e| panic!("{filter}: {e}")).matches(&user())
    }

    #[test]
    fn the_rfc_examples_parse_and_match() {
        // RFC 7644, section 3.4.2.2.
        assert!(m(r#"userName Eq "BJensen@example.com""#));
        assert!(m(r#"name.familyName co "ens""#));
        assert!(m(r#"userName sw "B""#));
        assert!(!m("title pr"));
        assert!(!m(r#"meta.lastModified gt "2011-05-13T04:42:34Z""#));
        assert!(m(r#"meta.lastModified ge "2011-05-13T04:42:34Z""#));
        assert!(m(r#"meta.lastModified lt "2011-05-14T04:42:34Z""#));
        assert!(!m(r#"title pr and userType eq "Employee""#));
        assert!(m(r#"title pr or emails.type eq "home""#));
        assert!(m(r#"emails[type eq "work" and value co "@example.com"]"#));
        assert!(!m(r#"userType eq "Employee" and (emails co "example.com" or emails.value co "example.org")"#));
        assert!(m(r#"not (userName eq "other") and active eq true"#));
        assert!(m(r#"urn:ietf:params:scim:schemas:core:2.0:User:userName sw "bj""#));
        assert!(m("urn:paddock:params:scim:schemas:extension:posix:2.0:User:uidNumber ge 10000"));
        assert!(m(r#"externalId eq "bjensen""#));
        assert!(!m(r#"externalId eq "BJENSEN""#), "externalId is case-exact");
    }

    #[test]
    fn malformed_filters_are_invalid_filter() {
        for bad in [
            "",
            "userName",
            r#"userName eq"#,
            r#"userName xx "a""#,
            r#"userName eq "a"#,
            r#"userName eq bjensen"#,
            r#"(userName eq "a""#,
            r#"userName eq "a" and"#,
            r#"emails[type eq "work""#,
            r#"active gt true"#,
            r#"name..familyName eq "a""#,
            r#"userName eq "a" )"#,
            r#"1abc eq "a""#,
        ] {
            let err = Filter::parse(bad).expect_err(bad);
            assert_eq!(err.code(), "invalid_filter", "{bad}");
        }
        let deep = format!("{}userName pr{}", "(".repeat(100), ")".repeat(100));
        assert_eq!(Filter::parse(&deep).expect_err("too deep").code(), "invalid_filter");
    }

    #[test]
    fn a_lone_eq_is_a_lookup() {
        let f = Filter::parse(r#"userName eq "alice""#).expect("filter");
        assert_eq!(f.simple_eq(), Some(("userName", "alice")));
        assert_eq!(Filter::parse(r#"userName co "a""#).expect("filter").simple_eq(), None);
    }
}
