//! The FOCUS export (docs/billing.md): a CSV in the FinOps FOCUS 1.2 layout, one row per record
//! per UTC day, priced with each class's list price in force at the row's `ChargePeriodStart`.
//!
//! Columns: every column FOCUS 1.2 makes mandatory, the conditional ones this product has
//! (sub accounts = clusters, resources = machines or control planes, SKUs = machine classes,
//! measured usage), and `x_NodePoolId` / `x_GpuHours`. There are no discounts or commitments, so
//! the list, contracted, effective and billed costs are one number; unit prices are left out
//! (hours and costs are rounded separately, so their product would not match to the last place).
//! Control-plane rows cost 0 (SKU `control-plane`, quantity: control-plane hours) in the currency
//! of the newest price in force at `as_of`. An adjustment is one row at the second it was recorded
//! (`[recorded_at, recorded_at + 1 s)`), `ChargeClass=Correction` when it corrects a period that
//! was already closed when it was recorded. Rows in a closed period are priced with the prices its
//! signed manifest pins (`prices`), not with the history as it is now.

use std::collections::HashMap;
use std::io::Write as _;

use chrono::{DateTime, Datelike, Duration, NaiveTime, TimeZone, Utc};
use paddock_domain::usage as math;
use paddock_domain::{Error, Result};
use paddock_store::usage::{self as store, FocusRecord, PriceChange, PriceGap, Query};
use paddock_store::{Store, StoreError};
use paddock_types::usage::{AdjustmentCategory, UsageKind};

use super::prices;

/// The header row: the column names, in order.
pub const COLUMNS: [&str; 30] = [
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "ResourceId",
    "ServiceCategory",
    "ServiceName",
    "SkuId",
    "SubAccountId",
    "SubAccountName",
    "x_NodePoolId",
    "x_GpuHours",
];

/// The SKU of control-plane rows.
const CONTROL_PLANE_SKU: &str = "control-plane";

/// What a FOCUS export needs besides its records: the provider's name and the prices.
#[derive(Debug, Clone)]
pub struct Focus {
    provider: String,
    prices: HashMap<String, Vec<PriceChange>>,
    pinned: Vec<prices::Pinned>,
    control_plane_currency: String,
}

impl Focus {
    /// Checks that the export can be priced, before anything is streamed: 409 naming
    /// `PADDOCK_BILLING_PROVIDER_NAME` without it, 409 `price_missing` naming the first class
    /// that has a row where it has no price.
    pub async fn prepare(store: &Store, provider: Option<&str>, q: &Query) -> Result<Self> {
        let provider = provider.ok_or_else(|| {
            Error::conflict(
                "billing_provider_name_missing",
                "the FOCUS export needs the provider's name: set PADDOCK_BILLING_PROVIDER_NAME",
            )
        })?;
        let mut tx = store.begin().await?;
        store::utc(&mut tx).await?;
        let history = store::price_history(&mut tx, q.as_of).await?;
        let mut prices: HashMap<String, Vec<PriceChange>> = HashMap::new();
        for change in history {
            prices.entry(change.machine_class.clone()).or_default().push(change);
        }
        let mut priced: Vec<String> = prices.keys().cloned().collect();
        priced.sort();
        let gaps: Vec<PriceGap> = priced.iter().flat_map(|class| gaps(class, &prices[class])).collect();
        if let Some(class) = store::first_unpriced(&mut tx, q, &gaps, &priced).await? {
            return Err(price_missing(&class));
        }
        let newest = prices
            .values()
            .filter_map(|changes| changes.last())
            .filter_map(|c| c.price.as_ref().map(|(currency, _)| (c.from, &c.machine_class, currency)))
            .max();
        let control_plane_currency = match newest {
            Some((_, _, currency)) => currency.clone(),
            None if store::has_control_plane(&mut tx, q).await? => return Err(price_missing(CONTROL_PLANE_SKU)),
            None => String::new(),
        };
        let pinned = prices::closed(&mut tx, q).await?;
        tx.commit().await.map_err(StoreError::from)?;
        Ok(Self { provider: provider.to_owned(), prices, pinned, control_plane_currency })
    }

    /// The price of `class` in force at `at`: the one a closed period pinned, else the history's.
    fn price_at(&self, class: &str, at: DateTime<Utc>) -> Option<&(String, i64)> {
        if let Some(pinned) = self.pinned.iter().find_map(|p| p.price_at(class, at)) {
            return pinned;
        }
        prices::price_at(self.prices.get(class)?, at)
    }

    /// Appends the header row.
    pub fn header(out: &mut Vec<u8>) {
        out.extend_from_slice(COLUMNS.join(",").as_bytes());
        out.push(b'\n');
    }

    /// Appends the rows of one record: one per UTC day it covers. Fails only on a row without a
    /// price, which [`Focus::prepare`] rules out.
    pub fn rows(&self, r: &FocusRecord, out: &mut Vec<u8>) -> std::result::Result<(), StoreError> {
        let rec = &r.record;
        if rec.start == rec.end {
            return self.row(r, rec.start, rec.start + Duration::seconds(1), out);
        }
        let mut start = rec.start;
        while start < rec.end {
            let end = next_midnight(start).min(rec.end);
            self.row(r, start, end, out)?;
            start = end;
        }
        Ok(())
    }

    fn row(
        &self,
        r: &FocusRecord,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
        out: &mut Vec<u8>,
    ) -> std::result::Result<(), StoreError> {
        let rec = &r.record;
        let seconds = (end - start).num_seconds();
        let (node, gpu, quantity) = match rec.kind {
            UsageKind::Machine => (seconds, seconds * i64::from(rec.gpu_count), seconds),
            UsageKind::ControlPlane => (0, 0, seconds),
            UsageKind::Adjustment => (rec.node_seconds, rec.gpu_seconds, rec.node_seconds),
        };
        let class = rec.machine_class.as_deref().filter(|_| rec.kind != UsageKind::ControlPlane);
        let (currency, cost) = match class {
            None => (self.control_plane_currency.as_str(), math::cost(0, 0)),
            Some(class) => {
                let (currency, micros) = self.price_at(class, start).ok_or_else(|| {
                    StoreError::Corrupt(format!("machine class {class} has no price at {start} in the FOCUS export"))
                })?;
                (currency.as_str(), math::cost(node, *micros))
            }
        };
        let (period_start, period_end) = month_of(start);
        let correction = r.correction;
        let credit = rec.category == Some(AdjustmentCategory::Credit);
        let description = match (rec.kind, &r.corrects_period) {
            (UsageKind::Machine, _) => format!("{} node hours", class.unwrap_or_default()),
            (UsageKind::ControlPlane, _) => "control plane hours".to_owned(),
            (UsageKind::Adjustment, _) if credit => format!("credit ({})", class.unwrap_or_default()),
            (UsageKind::Adjustment, Some(period)) => format!("correction of {period} ({})", class.unwrap_or_default()),
            (UsageKind::Adjustment, None) => format!("adjustment ({})", class.unwrap_or_default()),
        };
        let resource = match rec.kind {
            UsageKind::Machine | UsageKind::Adjustment => rec.machine_id.map(|m| m.to_string()),
            UsageKind::ControlPlane => rec.cluster_id.map(|c| c.to_string()),
        };
        let hours = math::hours(quantity);
        // A credit is no consumption: FOCUS wants its consumed quantity and unit null, and a
        // one-time charge.
        let (category, frequency, consumed, consumed_unit) =
            if credit { ("Credit", "One-Time", "", "") } else { ("Usage", "Usage-Based", hours.as_str(), "Hours") };
        let fields: [&str; 30] = [
            &cost,
            &rec.tenant_id.to_string(),
            &r.tenant_name,
            currency,
            &stamp(period_end),
            &stamp(period_start),
            category,
            if correction { "Correction" } else { "" },
            &description,
            frequency,
            &stamp(end),
            &stamp(start),
            consumed,
            consumed_unit,
            &cost,
            &cost,
            &self.provider,
            &cost,
            &hours,
            "Hours",
            &self.provider,
            &self.provider,
            resource.as_deref().unwrap_or(""),
            "Compute",
            "Managed clusters",
            class.unwrap_or(CONTROL_PLANE_SKU),
            &rec.cluster_id.map(|c| c.to_string()).unwrap_or_default(),
            r.cluster_name.as_deref().unwrap_or(""),
            &rec.node_pool_id.map(|p| p.to_string()).unwrap_or_default(),
            &math::hours(gpu),
        ];
        for (i, field) in fields.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            csv_field(field, out);
        }
        out.push(b'\n');
        Ok(())
    }
}

fn price_missing(class: &str) -> Error {
    Error::conflict(
        "price_missing",
        format!("machine class {class} has no price for some of the exported usage: set its price first"),
    )
}

/// The stretches of time without a price of one class, from its changes (in time order).
fn gaps(class: &str, changes: &[PriceChange]) -> Vec<PriceGap> {
    let mut gaps = Vec::new();
    let mut open: Option<Option<DateTime<Utc>>> = Some(None);
    for change in changes {
        match (&change.price, open) {
            (Some(_), Some(from)) => {
                gaps.push(PriceGap { machine_class: class.to_owned(), from, to: Some(change.from) });
                open = None;
            }
            (None, None) => open = Some(Some(change.from)),
            _ => {}
        }
    }
    if let Some(from) = open {
        gaps.push(PriceGap { machine_class: class.to_owned(), from, to: None });
    }
    gaps
}

fn next_midnight(at: DateTime<Utc>) -> DateTime<Utc> {
    (at.date_naive() + Duration::days(1)).and_time(NaiveTime::MIN).and_utc()
}

/// The UTC month holding `at`: `[start, end)`.
fn month_of(at: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
    let start = Utc.with_ymd_and_hms(at.year(), at.month(), 1, 0, 0, 0).single().unwrap_or(at);
    let (year, month) = if at.month() == 12 { (at.year() + 1, 1) } else { (at.year(), at.month() + 1) };
    let end = Utc.with_ymd_and_hms(year, month, 1, 0, 0, 0).single().unwrap_or(at);
    (start, end)
}

fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// One CSV field, quoted (RFC 4180) when it holds a comma, quote or line break; empty is null.
fn csv_field(text: &str, out: &mut Vec<u8>) {
    if text.bytes().any(|b| matches!(b, b',' | b'"' | b'\n' | b'\r')) {
        out.push(b'"');
        let _ = out.write_all(text.replace('"', "\"\"").as_bytes());
        out.push(b'"');
    } else {
        out.extend_from_slice(text.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).map(|d| d.with_timezone(&Utc)).expect("timestamp")
    }

    fn change(from: &str, price: Option<i64>) -> PriceChange {
        PriceChange { machine_class: "c".into(), from: t(from), price: price.map(|p| ("USD".into(), p)) }
    }

    #[test]
    fn gaps_are_the_stretches_without_a_price() {
        let changes = [
            change("2026-01-01T00:00:00Z", Some(1)),
            change("2026-02-01T00:00:00Z", None),
            change("2026-03-01T00:00:00Z", Some(2)),
            change("2026-04-01T00:00:00Z", None),
        ];
        let got: Vec<_> = gaps("c", &changes).into_iter().map(|g| (g.from, g.to)).collect();
        assert_eq!(
            got,
            [
                (None, Some(t("2026-01-01T00:00:00Z"))),
                (Some(t("2026-02-01T00:00:00Z")), Some(t("2026-03-01T00:00:00Z"))),
                (Some(t("2026-04-01T00:00:00Z")), None),
            ]
        );
    }

    #[test]
    fn months_and_midnights_are_utc() {
        assert_eq!(month_of(t("2026-12-31T23:59:59Z")), (t("2026-12-01T00:00:00Z"), t("2027-01-01T00:00:00Z")));
        assert_eq!(next_midnight(t("2026-02-28T00:00:00Z")), t("2026-03-01T00:00:00Z"));
        let mut out = Vec::new();
        csv_field("a, \"b\"", &mut out);
        assert_eq!(out, b"\"a, \"\"b\"\"\"");
    }
}
