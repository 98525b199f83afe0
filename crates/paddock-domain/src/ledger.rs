//! The custody ledger's cryptography (docs/security.md): canonical JSON (RFC 8785, the JSON
//! Canonicalization Scheme), the HMAC-SHA256 chain of a machine's entries, and its verification.
//!
//! An entry's MAC is `HMAC-SHA256(key, JCS({v, id, machine_id, seq, at, actor, from, to, reason,
//! evidence, prev_mac}))` where `prev_mac` is the hex MAC of the machine's previous entry (null for
//! the first). Chaining makes every edit visible: a changed field breaks its own MAC, a deleted or
//! reordered entry breaks the sequence and the next entry's `prev_mac`. The key never reaches the
//! database, so someone with database access alone cannot seal an entry: the writer computes the
//! MAC before it inserts the entry, in the transaction of the transition, and nothing ever seals
//! an entry later, so an entry inserted by anyone else (without a MAC, or with a made-up one) is a
//! break at its position. Consecutive entries must chain states (`from` of one is `to` of the one
//! before). Removing the newest entries leaves a valid shorter chain; [`verify`] catches that when
//! the last entry no longer leads to the machine's current state, and [`reaches`] always, against
//! a signed checkpoint of the chain's head kept outside the database.
//!
//! The fields are MAC-ed as the database returns them (timestamps at microsecond precision, JSON
//! evidence as `jsonb` normalises it), so sealing and verifying read the same values.

use chrono::{DateTime, SecondsFormat, Utc};
use hmac::{Hmac, Mac};
use paddock_types::{CustodyEntryId, MachineId};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// Version of the MAC-ed document's layout; part of the document, so a future layout can coexist.
const LAYOUT: u32 = 1;

/// The ledger's HMAC key (`PADDOCK_LEDGER_KEY`, its UTF-8 bytes). Never printed.
#[derive(Clone)]
pub struct LedgerKey(Vec<u8>);

impl LedgerKey {
    /// A key of these bytes (the configuration checks the length: at least 32 characters).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes keys of any length (longer ones are hashed first): this cannot fail.
        HmacSha256::new_from_slice(&self.0).expect("HMAC accepts keys of every length")
    }

    /// The MAC of `entry` chained after `prev_mac`.
    pub fn seal(&self, entry: &Entry, prev_mac: Option<&[u8]>) -> Vec<u8> {
        let mut mac = self.mac();
        mac.update(signed_document(entry, prev_mac).as_bytes());
        mac.finalize().into_bytes().to_vec()
    }

    /// Whether `mac` is the MAC of `entry` after `prev_mac` (compared in constant time).
    pub fn check(&self, entry: &Entry, prev_mac: Option<&[u8]>, mac: &[u8]) -> bool {
        let mut m = self.mac();
        m.update(signed_document(entry, prev_mac).as_bytes());
        m.verify_slice(mac).is_ok()
    }
}

impl std::fmt::Debug for LedgerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LedgerKey([redacted])")
    }
}

/// One entry of a machine's custody chain, as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Id.
    pub id: CustodyEntryId,
    /// The machine.
    pub machine_id: MachineId,
    /// Position in the machine's chain: 1, 2, 3, ...
    pub seq: i64,
    /// When the transition happened.
    pub at: DateTime<Utc>,
    /// Who made it: a token subject, or `paddock-worker`.
    pub actor: String,
    /// The state left (`None` for enrollment).
    pub from: Option<String>,
    /// The state entered.
    pub to: String,
    /// Why, readable.
    pub reason: String,
    /// What proves it (the wipe report, the allocation, the node, the error).
    pub evidence: Value,
    /// The previous entry's MAC as stored (`None` for the first entry).
    pub prev_mac: Option<Vec<u8>>,
    /// This entry's MAC (`None` only for a row paddock did not write).
    pub mac: Option<Vec<u8>>,
}

/// The canonical document an entry's MAC covers.
pub fn signed_document(entry: &Entry, prev_mac: Option<&[u8]>) -> String {
    canonical_json(&json!({
        "v": LAYOUT,
        "id": entry.id,
        "machine_id": entry.machine_id,
        "seq": entry.seq,
        "at": timestamp(entry.at),
        "actor": entry.actor,
        "from": entry.from,
        "to": entry.to,
        "reason": entry.reason,
        "evidence": entry.evidence,
        "prev_mac": prev_mac.map(hex::encode),
    }))
}

/// A timestamp as MAC-ed and shown: RFC 3339, UTC, microseconds (PostgreSQL's precision).
pub fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// The outcome of checking a machine's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    /// Every entry carries a MAC that checks, the sequence has no gap, each entry starts in the
    /// state the one before it left the machine in, and the last entry leads to the machine's
    /// current state.
    pub verified: bool,
    /// The first entry that fails (no MAC or a wrong one, a gap or swap in the sequence, a broken
    /// link, a state that does not follow on).
    pub first_bad_entry: Option<CustodyEntryId>,
    /// Entries without a MAC: paddock writes every entry with its MAC, so each one is a break.
    pub unsealed: usize,
    /// What is wrong, readable; `None` when verified.
    pub finding: Option<String>,
}

impl Verification {
    fn ok(unsealed: usize) -> Self {
        Self { verified: true, first_bad_entry: None, unsealed, finding: None }
    }

    fn fail(mut self, entry: Option<CustodyEntryId>, finding: String) -> Self {
        self.verified = false;
        self.first_bad_entry = entry;
        self.finding = Some(finding);
        self
    }
}

/// Checks a machine's entries, given in stored `seq` order, against `key`; `current_state` is
/// the machine's state now (the last entry must lead to it: a removed tail shows there, unless the
/// tail removed ends where the machine is; a checkpoint finds that, see [`reaches`]).
pub fn verify(key: &LedgerKey, machine: MachineId, entries: &[Entry], current_state: Option<&str>) -> Verification {
    let outcome = Verification::ok(entries.iter().filter(|e| e.mac.is_none()).count());
    let mut prev: Option<&Entry> = None;
    for (i, entry) in entries.iter().enumerate() {
        if let Some(finding) = entry_finding(key, machine, i, entry, prev) {
            return outcome.fail(Some(entry.id), finding);
        }
        prev = Some(entry);
    }
    match (entries.last(), current_state) {
        (Some(last), Some(state)) if last.to != state => outcome.fail(
            None,
            format!("the last entry leads to {} but the machine is {state}: entries are missing at the end", last.to),
        ),
        (None, Some(_)) => outcome.fail(None, "the machine has no custody entries".to_owned()),
        _ => outcome,
    }
}

/// What is wrong with the entry at position `i` (0-based) after `prev`, if anything.
fn entry_finding(key: &LedgerKey, machine: MachineId, i: usize, entry: &Entry, prev: Option<&Entry>) -> Option<String> {
    let expected_seq = i64::try_from(i).unwrap_or(i64::MAX).saturating_add(1);
    let id = entry.id;
    if entry.machine_id != machine {
        return Some(format!("entry {id} belongs to another machine"));
    }
    if entry.seq != expected_seq {
        return Some(format!(
            "entry {id} has sequence number {}, expected {expected_seq}: entries are missing or reordered",
            entry.seq
        ));
    }
    // paddock computes every MAC before it inserts the entry: one without a MAC was not written
    // by paddock, and is never sealed later.
    let Some(mac) = &entry.mac else {
        return Some(format!("entry {id} has no MAC: paddock did not write it"));
    };
    let prev_mac = prev.and_then(|p| p.mac.as_deref());
    if entry.prev_mac.as_deref() != prev_mac {
        return Some(format!("entry {id} does not link to the entry before it"));
    }
    if !key.check(entry, prev_mac, mac) {
        return Some(format!("entry {id} does not match its MAC: it was changed, or paddock did not write it"));
    }
    match prev {
        Some(p) if entry.from.as_deref() != Some(p.to.as_str()) => Some(format!(
            "entry {id} leaves {} but the entry before it left the machine {}: a transition is missing",
            entry.from.as_deref().unwrap_or("nothing"),
            p.to
        )),
        _ => None,
    }
}

/// Whether a machine's chain (in stored `seq` order) still reaches a checkpointed head: an entry
/// at `seq` whose MAC is `mac`. `Err` says why not (a removed tail, an older copy restored, or a
/// rewritten history). With [`verify`] this proves the chain both intact and not cut short.
pub fn reaches(entries: &[Entry], seq: i64, mac: &[u8]) -> Result<(), String> {
    let at = usize::try_from(seq.saturating_sub(1)).ok().and_then(|i| entries.get(i));
    match at {
        Some(e) if e.seq == seq && e.mac.as_deref() == Some(mac) => Ok(()),
        Some(e) if e.seq == seq => {
            Err(format!("entry {} at sequence number {seq} is not the one checkpointed: the history was rewritten", e.id))
        }
        _ => Err(format!(
            "the chain has {} entries but the checkpoint's head is entry {seq}: entries were removed, or an older copy was restored",
            entries.len()
        )),
    }
}

/// SHA-256 (hex) of a value's canonical JSON: the digest of a report.
pub fn digest(value: &Value) -> String {
    hex::encode(Sha256::digest(canonical_json(value).as_bytes()))
}

/// A value's canonical JSON (RFC 8785): object members sorted by their names' UTF-16 code units,
/// no insignificant whitespace, strings escaped as ECMAScript's `JSON.stringify` does, numbers
/// in ECMAScript's shortest form.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
            sorted.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (name, item)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, name);
                out.push(':');
                write_value(out, item);
            }
            out.push('}');
        }
    }
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Integers exactly representable as IEEE 754 doubles print as integers.
const MAX_SAFE: u64 = 1 << 53;

fn write_number(out: &mut String, n: &serde_json::Number) {
    if let Some(u) = n.as_u64().filter(|u| *u <= MAX_SAFE) {
        out.push_str(&u.to_string());
    } else if let Some(i) = n.as_i64().filter(|i| i.unsigned_abs() <= MAX_SAFE) {
        out.push_str(&i.to_string());
    } else {
        // JCS numbers are doubles: larger integers and fractions take ECMAScript's form.
        out.push_str(&es_number(n.as_f64().unwrap_or(0.0)));
    }
}

/// ECMAScript's `Number.prototype.toString` of a finite double (JSON has no NaN or infinities).
fn es_number(v: f64) -> String {
    if v == 0.0 {
        return "0".to_owned(); // -0 too
    }
    if !v.is_finite() {
        return "null".to_owned();
    }
    let sign = if v < 0.0 { "-" } else { "" };
    // Rust's `{:e}` gives the shortest digits that round-trip, as ECMAScript requires.
    let sci = format!("{:e}", v.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let k = i64::try_from(digits.len()).unwrap_or(i64::MAX);
    let n = exp.parse::<i64>().unwrap_or(0) + 1; // the decimal point's position
    let body = if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat(usize::try_from(n - k).unwrap_or(0)))
    } else if 0 < n && n <= 21 {
        let (int, frac) = digits.split_at(usize::try_from(n).unwrap_or(0));
        format!("{int}.{frac}")
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat(usize::try_from(-n).unwrap_or(0)))
    } else {
        let e = n - 1;
        let e = if e >= 0 { format!("+{e}") } else { e.to_string() };
        match digits.split_at(1) {
            (d, "") => format!("{d}e{e}"),
            (d, rest) => format!("{d}.{rest}e{e}"),
        }
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn canonical_json_sorts_members_and_drops_whitespace() {
        let v: Value =
            serde_json::from_str(r#"{ "b": [1, {"z": null, "a": true}], "a": "x\ny\u0001\"" }"#).expect("test value");
        assert_eq!(canonical_json(&v), r#"{"a":"x\ny\u0001\"","b":[1,{"a":true,"z":null}]}"#);
    }

    #[test]
    fn canonical_json_sorts_by_utf16_code_units() {
        // RFC 8785 section 3.2.3: U+1F600 (surrogates D83D DE00) sorts before U+FB33 in UTF-16.
        let v: Value = serde_json::from_str("{\"\u{fb33}\":1,\"\u{1f600}\":2,\"\\r\":3}").expect("test value");
        assert_eq!(canonical_json(&v), "{\"\\r\":3,\"\u{1f600}\":2,\"\u{fb33}\":1}");
    }

    #[test]
    fn numbers_take_the_ecmascript_form() {
        // Examples from RFC 8785 appendix B.
        for (input, expected) in [
            ("0", "0"),
            ("-0.0", "0"),
            ("1.0", "1"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("0.000001", "0.000001"),
            ("1e-7", "1e-7"),
            ("4.5", "4.5"),
            ("-1.5e-10", "-1.5e-10"),
            ("9007199254740993", "9007199254740992"),
            ("333333333.3333333", "333333333.3333333"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("5e-324", "5e-324"),
            ("123456789012", "123456789012"),
        ] {
            let v: Value = serde_json::from_str(input).expect("test value");
            assert_eq!(canonical_json(&v), expected, "{input}");
        }
    }

    fn chain(key: &LedgerKey, machine: MachineId, n: usize) -> Vec<Entry> {
        let mut entries: Vec<Entry> = Vec::with_capacity(n);
        for i in 0..n {
            let mut entry = Entry {
                id: CustodyEntryId(Uuid::now_v7()),
                machine_id: machine,
                seq: i64::try_from(i).expect("test value") + 1,
                at: DateTime::from_timestamp(1_800_000_000 + i64::try_from(i).expect("test value"), 123_000)
                    .expect("test value"),
                actor: "paddock-worker".into(),
                from: (i > 0).then(|| format!("s{i}")),
                to: format!("s{}", i + 1),
                reason: "because".into(),
                evidence: json!({ "i": i }),
                prev_mac: entries.last().and_then(|e: &Entry| e.mac.clone()),
                mac: None,
            };
            entry.mac = Some(key.seal(&entry, entry.prev_mac.as_deref()));
            entries.push(entry);
        }
        entries
    }

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn an_untouched_chain_verifies_and_edits_fail_at_their_entry() {
        let key = LedgerKey::new(KEY.to_vec());
        let machine = MachineId::new();
        let entries = chain(&key, machine, 4);
        assert!(verify(&key, machine, &entries, Some("s4")).verified);

        let mut edited = entries.clone();
        edited[2].reason = "something else".into();
        assert_eq!(verify(&key, machine, &edited, Some("s4")).first_bad_entry, Some(entries[2].id));

        let mut gap = entries.clone();
        gap.remove(1);
        assert_eq!(verify(&key, machine, &gap, Some("s4")).first_bad_entry, Some(entries[2].id));

        let mut swapped = entries.clone();
        swapped.swap(1, 2);
        (swapped[1].seq, swapped[2].seq) = (2, 3);
        assert_eq!(verify(&key, machine, &swapped, Some("s4")).first_bad_entry, Some(entries[2].id));

        let truncated = &entries[..3];
        let v = verify(&key, machine, truncated, Some("s4"));
        assert!(!v.verified && v.first_bad_entry.is_none());

        let other = LedgerKey::new(b"another key, just as long as the first".to_vec());
        assert_eq!(verify(&other, machine, &entries, Some("s4")).first_bad_entry, Some(entries[0].id));
    }

    #[test]
    fn an_entry_without_a_mac_is_a_break_at_its_position() {
        let key = LedgerKey::new(KEY.to_vec());
        let machine = MachineId::new();
        let mut entries = chain(&key, machine, 3);
        entries[1].mac = None;
        let v = verify(&key, machine, &entries, Some("s3"));
        assert_eq!((v.verified, v.first_bad_entry, v.unsealed), (false, Some(entries[1].id), 1));
    }

    #[test]
    fn a_sealed_entry_that_does_not_follow_the_state_before_it_is_a_break() {
        let key = LedgerKey::new(KEY.to_vec());
        let machine = MachineId::new();
        let mut entries = chain(&key, machine, 3);
        // Correctly MAC-ed by a holder of the key, but the machine went from s2 to s9 unrecorded.
        entries[2].from = Some("s9".into());
        entries[2].mac = Some(key.seal(&entries[2], entries[2].prev_mac.as_deref()));
        let v = verify(&key, machine, &entries, Some("s3"));
        assert_eq!((v.verified, v.first_bad_entry), (false, Some(entries[2].id)));
        assert!(v.finding.is_some_and(|f| f.contains("a transition is missing")));
    }

    #[test]
    fn a_chain_reaches_its_checkpointed_head_until_it_is_cut_short_or_replaced() {
        let key = LedgerKey::new(KEY.to_vec());
        let machine = MachineId::new();
        let entries = chain(&key, machine, 4);
        let head = entries[2].mac.clone().expect("sealed");
        assert_eq!(reaches(&entries, 3, &head), Ok(()));
        assert_eq!(reaches(&entries[..3], 3, &head), Ok(()));
        assert!(reaches(&entries[..2], 3, &head).is_err_and(|f| f.contains("entries were removed")));
        let other = chain(&key, machine, 4);
        assert!(reaches(&other, 3, &head).is_err_and(|f| f.contains("rewritten")));
    }
}
