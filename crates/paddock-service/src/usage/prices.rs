//! The prices a closed period pins (docs/billing.md): its signed manifest lists every list price in
//! force during the period, and a FOCUS export prices the period's rows with that list, not with
//! the price history as it is now.
//!
//! A manifest's `prices` are, per class (by name, then time), the change in force at the period's
//! start and every change within it: `{machine_class, effective_from, currency, node_hour}`, with
//! `currency` and `node_hour` null for "no price from then on". Manifests of `version` 2 carry
//! them; older ones (`"prices": []`, no `version`) pin nothing, and their periods are priced from
//! the history.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use paddock_domain::usage::{self as math, Period, Window};
use paddock_domain::{Error, Result};
use paddock_store::usage::{self as store, PriceChange, Query};
use paddock_store::Conn;
use serde_json::{json, Value};

/// The manifest version that pins prices.
pub(super) const MANIFEST_VERSION: u64 = 2;

/// The changes of `history` (by class, then time) in force at some second of `[start, end)`.
pub(super) fn in_force(history: &[PriceChange], start: DateTime<Utc>, end: DateTime<Utc>) -> Vec<&PriceChange> {
    let mut out: Vec<&PriceChange> = Vec::new();
    for (i, change) in history.iter().enumerate() {
        if change.from >= end {
            continue;
        }
        let next_same_class = history.get(i + 1).filter(|n| n.machine_class == change.machine_class);
        // Superseded at or before the start: never in force during the period.
        if next_same_class.is_some_and(|n| n.from <= start) {
            continue;
        }
        out.push(change);
    }
    out
}

/// The manifest's `prices`.
pub(super) fn manifest_prices(changes: &[&PriceChange]) -> Value {
    let list: Vec<Value> = changes
        .iter()
        .map(|c| {
            let (currency, node_hour) = match &c.price {
                Some((currency, micros)) => (json!(currency), json!(math::micros_text(*micros))),
                None => (Value::Null, Value::Null),
            };
            json!({ "machine_class": c.machine_class, "effective_from": c.from, "currency": currency,
                    "node_hour": node_hour })
        })
        .collect();
    Value::Array(list)
}

/// The prices a stored manifest pins, by class; `None` for a manifest that pins none.
fn pinned(manifest: &Value) -> Result<Option<HashMap<String, Vec<PriceChange>>>> {
    if manifest["version"].as_u64().is_none_or(|v| v < MANIFEST_VERSION) {
        return Ok(None);
    }
    let bad = || Error::internal(format!("a closed period's manifest has malformed prices: {}", manifest["prices"]));
    let mut prices: HashMap<String, Vec<PriceChange>> = HashMap::new();
    for entry in manifest["prices"].as_array().ok_or_else(bad)? {
        let class = entry["machine_class"].as_str().ok_or_else(bad)?;
        let from = entry["effective_from"].as_str().ok_or_else(bad)?;
        let from = DateTime::parse_from_rfc3339(from).map_err(|_| bad())?.with_timezone(&Utc);
        let price = match (entry["currency"].as_str(), entry["node_hour"].as_str()) {
            (Some(currency), Some(node_hour)) => {
                Some((currency.to_owned(), math::parse_micros(node_hour).ok_or_else(bad)?))
            }
            _ => None,
        };
        prices.entry(class.to_owned()).or_default().push(PriceChange { machine_class: class.to_owned(), from, price });
    }
    Ok(Some(prices))
}

/// The prices pinned by the closed periods the query's range meets: each period's `[start, end)`
/// and its classes' changes. Only periods closed at or below the query's `as_of` count, so an
/// export at one `as_of` keeps its bytes.
pub(super) async fn closed(conn: &mut Conn, q: &Query) -> Result<Vec<Pinned>> {
    let mut out = Vec::new();
    let mut start = Window::Month.floor(q.from);
    while start < q.to {
        let period = Period { start, end: Window::Month.next(start) };
        if let Some(stored) = store::period_get(conn, &period.name()).await? {
            let manifest: Value = serde_json::from_str(&stored.manifest).map_err(Error::internal)?;
            if let Some(prices) = pinned(&manifest)?.filter(|_| stored.as_of <= q.as_of) {
                out.push(Pinned { start: period.start, end: period.end, prices });
            }
        }
        start = period.end;
    }
    Ok(out)
}

/// A closed period's pinned prices.
#[derive(Debug, Clone)]
pub(super) struct Pinned {
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    prices: HashMap<String, Vec<PriceChange>>,
}

impl Pinned {
    /// `Some(price)` when `at` is in this period (the price of `class` then, if any).
    pub(super) fn price_at(&self, class: &str, at: DateTime<Utc>) -> Option<Option<&(String, i64)>> {
        if at < self.start || at >= self.end {
            return None;
        }
        Some(price_at(self.prices.get(class).map(Vec::as_slice).unwrap_or_default(), at))
    }
}

/// The price in force at `at` among `changes` (in time order).
pub(super) fn price_at(changes: &[PriceChange], at: DateTime<Utc>) -> Option<&(String, i64)> {
    let index = changes.partition_point(|c| c.from <= at);
    changes.get(index.checked_sub(1)?)?.price.as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).map(|d| d.with_timezone(&Utc)).expect("timestamp")
    }

    fn change(class: &str, from: &str, price: Option<i64>) -> PriceChange {
        PriceChange { machine_class: class.into(), from: t(from), price: price.map(|p| ("USD".into(), p)) }
    }

    #[test]
    fn the_prices_in_force_are_the_one_at_the_start_and_those_within() {
        let history = [
            change("a", "2026-09-01T00:00:00Z", Some(1)),
            change("a", "2026-09-20T00:00:00Z", Some(2)),
            change("a", "2026-10-10T00:00:00Z", Some(3)),
            change("a", "2026-11-01T00:00:00Z", Some(4)),
            change("b", "2026-10-01T00:00:00Z", None),
        ];
        let got = in_force(&history, t("2026-10-01T00:00:00Z"), t("2026-11-01T00:00:00Z"));
        let got: Vec<_> = got.iter().map(|c| (c.machine_class.as_str(), c.from)).collect();
        assert_eq!(
            got,
            [("a", t("2026-09-20T00:00:00Z")), ("a", t("2026-10-10T00:00:00Z")), ("b", t("2026-10-01T00:00:00Z"))]
        );
    }

    #[test]
    fn a_manifest_pins_what_it_lists_and_an_old_one_nothing() {
        let history = [change("a", "2026-09-20T00:00:00Z", Some(2_500_000)), change("a", "2026-10-10T00:00:00Z", None)];
        let refs: Vec<&PriceChange> = history.iter().collect();
        let manifest = json!({ "version": MANIFEST_VERSION, "prices": manifest_prices(&refs) });
        let prices = pinned(&manifest).expect("parses").expect("pins");
        assert_eq!(prices["a"], history);
        assert!(pinned(&json!({ "prices": [] })).expect("parses").is_none());
    }
}
