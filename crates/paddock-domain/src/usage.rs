//! Metering math (docs/billing.md), pure: the parameters of usage reads (ranges of whole UTC
//! seconds, windows, groups, billing periods), UTC-aligned windows, clipping of half-open
//! intervals, and hours as decimal strings (6 places, half-even) derived from exact seconds.
//!
//! Seconds are the unit of truth: sums are taken over integer seconds and hours are derived once,
//! from the sum, never summed themselves.

use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Timelike, Utc};

use crate::Error;

/// Longest span of a records or export read.
pub const MAX_RECORDS_SPAN_DAYS: i64 = 31;
/// Longest span of an aggregate read.
pub const MAX_AGGREGATE_SPAN_DAYS: i64 = 400;

/// The largest magnitude of each component of an adjustment, in seconds (10^12: about 31,700
/// years of one node). Far below 64 bits, so sums of adjustments stay exact; the sums are checked
/// all the same.
pub const MAX_ADJUSTMENT_SECONDS: i64 = 1_000_000_000_000;

/// A validated half-open range `[from, to)` of whole UTC seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// Inclusive start.
    pub from: DateTime<Utc>,
    /// Exclusive end.
    pub to: DateTime<Utc>,
}

impl Range {
    /// Validates `from` and `to` (required, RFC 3339 UTC, whole seconds, `from < to`, a span of at
    /// most `max_days`): every failure is a 422 naming its field.
    pub fn parse(from: Option<&str>, to: Option<&str>, max_days: i64) -> Result<Self, Error> {
        let from = parse_instant("from", from)?;
        let to = parse_instant("to", to)?;
        if from >= to {
            return Err(Error::invalid("to", "must be after `from`"));
        }
        if to - from > Duration::days(max_days) {
            return Err(Error::invalid("to", format!("the span from `from` to `to` is at most {max_days} days")));
        }
        Ok(Self { from, to })
    }

    /// Whether `t` lies inside.
    pub fn contains(&self, t: DateTime<Utc>) -> bool {
        self.from <= t && t < self.to
    }
}

/// Parses a required RFC 3339 instant in UTC (`Z` or `+00:00`) with whole seconds.
pub fn parse_instant(field: &'static str, text: Option<&str>) -> Result<DateTime<Utc>, Error> {
    let text = text.ok_or_else(|| Error::invalid(field, "is required"))?;
    parse_optional_instant(field, text)
}

/// Parses an RFC 3339 instant in UTC with whole seconds (`as_of` and the like).
pub fn parse_optional_instant(field: &'static str, text: &str) -> Result<DateTime<Utc>, Error> {
    let bad =
        || Error::invalid(field, "must be an RFC 3339 timestamp in UTC with whole seconds, e.g. 2026-11-01T00:00:00Z");
    let parsed = DateTime::parse_from_rfc3339(text).map_err(|_| bad())?;
    if parsed.offset().local_minus_utc() != 0 || parsed.nanosecond() != 0 {
        return Err(bad());
    }
    Ok(parsed.with_timezone(&Utc))
}

/// The window of an aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// UTC hours.
    Hour,
    /// UTC days.
    Day,
    /// UTC months.
    Month,
    /// One window: the whole range.
    None,
}

impl Window {
    /// Parses `PT1H` | `P1D` | `P1M` | `none` (absent: `none`); anything else is 422.
    pub fn parse(text: Option<&str>) -> Result<Self, Error> {
        match text {
            None | Some("none") => Ok(Self::None),
            Some("PT1H") => Ok(Self::Hour),
            Some("P1D") => Ok(Self::Day),
            Some("P1M") => Ok(Self::Month),
            Some(_) => Err(Error::invalid("window", "must be one of PT1H, P1D, P1M, none")),
        }
    }

    /// The UTC-aligned start of the window holding `t` (`None`: `t` itself).
    pub fn floor(self, t: DateTime<Utc>) -> DateTime<Utc> {
        let day = |d: NaiveDate| Utc.from_utc_datetime(&d.and_time(chrono::NaiveTime::MIN));
        match self {
            Self::Hour => t - Duration::seconds(i64::from(t.minute() * 60 + t.second())) - nanos(t),
            Self::Day => day(t.date_naive()),
            Self::Month => day(t.date_naive().with_day(1).unwrap_or(t.date_naive())),
            Self::None => t,
        }
    }

    /// The start of the window after the one starting at `start` (aligned).
    pub fn next(self, start: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            Self::Hour => start + Duration::hours(1),
            Self::Day => start + Duration::days(1),
            Self::Month => {
                let d = start.date_naive();
                let (y, m) = if d.month() == 12 { (d.year() + 1, 1) } else { (d.year(), d.month() + 1) };
                let first = NaiveDate::from_ymd_opt(y, m, 1).unwrap_or(d);
                Utc.from_utc_datetime(&first.and_time(chrono::NaiveTime::MIN))
            }
            Self::None => DateTime::<Utc>::MAX_UTC,
        }
    }

    /// Whether `range` lies inside one window (always, for [`Window::None`]): its one window,
    /// clipped, is then the range itself.
    pub fn holds(self, range: Range) -> bool {
        self.next(self.floor(range.from)) >= range.to
    }

    /// The windows covering `range`, each clipped to it, in order.
    pub fn windows(self, range: Range) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
        let mut out = Vec::new();
        let mut start = self.floor(range.from);
        while start < range.to {
            let end = self.next(start);
            out.push((start.max(range.from), end.min(range.to)));
            start = end;
        }
        out
    }
}

fn nanos(t: DateTime<Utc>) -> Duration {
    Duration::nanoseconds(i64::from(t.nanosecond()))
}

/// The group-by columns of an aggregate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupBy {
    /// By tenant.
    pub tenant_id: bool,
    /// By cluster.
    pub cluster_id: bool,
    /// By node pool.
    pub node_pool_id: bool,
    /// By machine class.
    pub machine_class: bool,
}

impl GroupBy {
    /// Parses a comma-separated list of `tenant_id`, `cluster_id`, `node_pool_id`,
    /// `machine_class` (absent or empty: no grouping); an unknown name is 422.
    pub fn parse(text: Option<&str>) -> Result<Self, Error> {
        let mut group = Self::default();
        for name in text.unwrap_or("").split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "tenant_id" => group.tenant_id = true,
                "cluster_id" => group.cluster_id = true,
                "node_pool_id" => group.node_pool_id = true,
                "machine_class" => group.machine_class = true,
                _ => {
                    return Err(Error::invalid(
                        "group_by",
                        format!("unknown group {name:?}: use tenant_id, cluster_id, node_pool_id, machine_class"),
                    ))
                }
            }
        }
        Ok(group)
    }
}

/// The seconds of `[start, end)` inside `[from, to)` (0 when they do not meet).
pub fn clipped_seconds(start: DateTime<Utc>, end: DateTime<Utc>, from: DateTime<Utc>, to: DateTime<Utc>) -> i64 {
    let (s, e) = (start.max(from), end.min(to));
    if e > s {
        (e - s).num_seconds()
    } else {
        0
    }
}

/// `seconds / 3600` as a decimal string with 6 places, rounded half to even.
pub fn hours(seconds: i64) -> String {
    decimal_6(i128::from(seconds) * 1_000_000, 3600)
}

/// `numerator / denominator` (denominator > 0) with 6 decimal places, where `numerator` is
/// already scaled by 10^6; rounded half to even.
pub fn decimal_6(numerator: i128, denominator: i128) -> String {
    let negative = numerator < 0;
    let n = numerator.abs();
    let (mut q, r) = (n / denominator, n % denominator);
    // Half-even: above half rounds up, exactly half rounds to the even neighbour.
    if 2 * r > denominator || (2 * r == denominator && q % 2 == 1) {
        q += 1;
    }
    let sign = if negative && q != 0 { "-" } else { "" };
    format!("{sign}{}.{:06}", q / 1_000_000, q % 1_000_000)
}

/// A non-negative decimal string (at most 15 digits before the point and 6 after) in millionths.
pub fn parse_micros(text: &str) -> Option<i64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str, max: usize| s.len() <= max && s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole, 15) || !digits(fraction, 6) || (text.contains('.') && fraction.is_empty()) {
        return None;
    }
    let scaled = format!("{whole}{fraction:0<6}");
    scaled.parse().ok()
}

/// A price in millionths as the shortest decimal string (`2500000` is `"2.5"`, `3000000` `"3"`).
pub fn micros_text(micros: i64) -> String {
    let (whole, fraction) = (micros / 1_000_000, micros % 1_000_000);
    let fraction = format!("{fraction:06}");
    let fraction = fraction.trim_end_matches('0');
    if fraction.is_empty() {
        whole.to_string()
    } else {
        format!("{whole}.{fraction}")
    }
}

/// The cost of `seconds` at `micros` per hour: a decimal string with 6 places, half to even.
pub fn cost(seconds: i64, micros_per_hour: i64) -> String {
    decimal_6(i128::from(seconds) * i128::from(micros_per_hour), 3600)
}

/// A billing period: a UTC month, `YYYY-MM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    /// First second of the month.
    pub start: DateTime<Utc>,
    /// First second of the next month.
    pub end: DateTime<Utc>,
}

impl Period {
    /// Parses `YYYY-MM` (years 2000 to 9999); anything else is 422 on `period`.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let bad = || Error::invalid("period", "must be a UTC month as YYYY-MM, e.g. 2026-11");
        let (y, m) = text.split_once('-').ok_or_else(bad)?;
        let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(y, 4) || !digits(m, 2) {
            return Err(bad());
        }
        let (year, month): (i32, u32) = (y.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
        let first = NaiveDate::from_ymd_opt(year, month, 1).filter(|_| year >= 2000).ok_or_else(bad)?;
        let start = Utc.from_utc_datetime(&first.and_time(chrono::NaiveTime::MIN));
        Ok(Self { start, end: Window::Month.next(start) })
    }

    /// The period's name, `YYYY-MM`.
    pub fn name(&self) -> String {
        format!("{:04}-{:02}", self.start.year(), self.start.month())
    }

    /// The range of the period.
    pub fn range(&self) -> Range {
        Range { from: self.start, to: self.end }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).map(|d| d.with_timezone(&Utc)).expect("timestamp")
    }

    #[test]
    fn hours_round_half_even_to_six_places() {
        assert_eq!(hours(0), "0.000000");
        assert_eq!(hours(3600), "1.000000");
        assert_eq!(hours(5400), "1.500000");
        assert_eq!(hours(1), "0.000278");
        assert_eq!(hours(-1), "-0.000278");
        assert_eq!(decimal_6(5, 10), "0.000000");
        assert_eq!(decimal_6(15, 10), "0.000002");
        assert_eq!(decimal_6(25, 10), "0.000002");
        assert_eq!(decimal_6(-25, 10), "-0.000002");
    }

    #[test]
    fn ranges_are_whole_utc_seconds_in_order_within_the_span() {
        let ok = Range::parse(Some("2026-11-01T00:00:00Z"), Some("2026-12-01T00:00:00+00:00"), 31).expect("range");
        assert_eq!(ok.to - ok.from, Duration::days(30));
        for (from, to) in [
            (None, Some("2026-11-01T00:00:00Z")),
            (Some("2026-11-01T00:00:00.5Z"), Some("2026-11-02T00:00:00Z")),
            (Some("2026-11-01T01:00:00+01:00"), Some("2026-11-02T00:00:00Z")),
            (Some("2026-11-02T00:00:00Z"), Some("2026-11-01T00:00:00Z")),
            (Some("2026-11-01T00:00:00Z"), Some("2026-11-01T00:00:00Z")),
            (Some("2026-10-01T00:00:00Z"), Some("2026-11-02T00:00:00Z")),
            (Some("yesterday"), Some("2026-11-02T00:00:00Z")),
        ] {
            assert!(matches!(Range::parse(from, to, 31), Err(Error::Invalid(_))), "{from:?} {to:?}");
        }
    }

    #[test]
    fn windows_are_utc_aligned_and_clipped() {
        let range = Range { from: t("2026-01-31T22:30:00Z"), to: t("2026-03-01T00:00:01Z") };
        let months = Window::Month.windows(range);
        assert_eq!(months.len(), 3);
        assert_eq!(months[0], (range.from, t("2026-02-01T00:00:00Z")));
        assert_eq!(months[1], (t("2026-02-01T00:00:00Z"), t("2026-03-01T00:00:00Z")));
        assert_eq!(months[2], (t("2026-03-01T00:00:00Z"), range.to));
        assert_eq!(Window::Hour.windows(range)[0], (range.from, t("2026-01-31T23:00:00Z")));
        assert_eq!(Window::None.windows(range), vec![(range.from, range.to)]);
        assert_eq!(Window::Day.windows(range).len(), 30);
        assert!(!Window::Month.holds(range) && Window::None.holds(range));
        let june = Range { from: t("2026-06-01T00:00:00Z"), to: t("2026-07-01T00:00:00Z") };
        assert!(Window::Month.holds(june) && !Window::Day.holds(june));
        assert_eq!(Window::Month.windows(june), vec![(june.from, june.to)]);
    }

    #[test]
    fn groups_and_periods_parse_or_name_the_field() {
        let g = GroupBy::parse(Some("tenant_id,machine_class")).expect("groups");
        assert!(g.tenant_id && g.machine_class && !g.cluster_id);
        assert!(GroupBy::parse(Some("tenant_id,colour")).is_err());
        let p = Period::parse("2026-12").expect("period");
        assert_eq!((p.start, p.end), (t("2026-12-01T00:00:00Z"), t("2027-01-01T00:00:00Z")));
        assert_eq!(p.name(), "2026-12");
        for bad in ["2026-13", "2026-1", "26-01", "2026-00", "2026/01", "1999-01", "+026-01", ""] {
            assert!(Period::parse(bad).is_err(), "{bad}");
        }
    }
}

#[test]
fn prices_parse_to_millionths_and_costs_round_half_to_even() {
    assert_eq!(parse_micros("2.75"), Some(2_750_000));
    assert_eq!(parse_micros("0"), Some(0));
    assert_eq!(parse_micros("1.000001"), Some(1_000_001));
    for bad in ["", ".5", "1.", "1.0000001", "-1", "1e3", "1,5", "1234567890123456"] {
        assert_eq!(parse_micros(bad), None, "{bad}");
    }
    assert_eq!(micros_text(2_500_000), "2.5");
    assert_eq!(micros_text(3_000_000), "3");
    // One second at 0.0018/h is 0.0000005: exactly half, to the even 0.000000.
    assert_eq!(cost(1, 1_800), "0.000000");
    assert_eq!(cost(3, 1_800), "0.000002");
    assert_eq!(cost(3600, 2_750_000), "2.750000");
    assert_eq!(cost(-7200, 1_000_000), "-2.000000");
}
