//! Job outcome counters, by kind. Lock-free: the kinds are known when the worker is built, so
//! the map never changes and each counter is an atomic. Every process that runs a worker adds
//! them to its `/metrics` ([`JobMetrics::render`]); both label sets are fixed, so the series are
//! bounded by kinds x outcomes.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// The outcomes counted, in the order of [`JobMetrics::snapshot`].
pub(crate) const OUTCOMES: [&str; 10] = [
    "claimed",
    "reclaimed",
    "succeeded",
    "waited",
    "retried",
    "exhausted",
    "failed",
    "handed_over",
    "lease_lost",
    "released",
];

/// One counter of [`JobMetrics::snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutcomeCount {
    /// Job kind.
    pub kind: &'static str,
    /// `claimed` (runs started), `reclaimed` (taken over after a lease expired), `succeeded`,
    /// `waited`, `retried`, `exhausted` (failed after max attempts), `failed` (permanently),
    /// `handed_over` (to a follow-up job), `lease_lost` (run dropped), `released` (given back at
    /// shutdown).
    pub outcome: &'static str,
    /// Total since the worker started.
    pub count: u64,
}

/// Upper bounds of the run-duration histogram, in seconds.
const BUCKETS: [f64; 10] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0, 120.0];

/// At most this many distinct error codes get a series of their own; later ones count as
/// `other`, so a driver inventing codes cannot grow the series without bound.
const MAX_CODES: usize = 64;

/// Run durations of one kind: cumulative bucket counts, the sum in microseconds, the count.
#[derive(Debug, Default)]
struct Durations {
    buckets: [AtomicU64; BUCKETS.len()],
    sum_micros: AtomicU64,
    count: AtomicU64,
}

/// Counters of job outcomes per kind, run durations per kind, and the error codes runs ended
/// with, shared by a worker's runs.
#[derive(Debug)]
pub struct JobMetrics {
    by_kind: BTreeMap<&'static str, [AtomicU64; OUTCOMES.len()]>,
    durations: BTreeMap<&'static str, Durations>,
    errors: std::sync::Mutex<BTreeMap<(&'static str, String), u64>>,
}

impl JobMetrics {
    pub(crate) fn new(kinds: &[&'static str]) -> Self {
        Self {
            by_kind: kinds.iter().map(|k| (*k, Default::default())).collect(),
            durations: kinds.iter().map(|k| (*k, Durations::default())).collect(),
            errors: std::sync::Mutex::default(),
        }
    }

    /// Records one run of `kind`: how long it took and the error code it ended with, if any
    /// (ignored for a kind the worker does not know).
    pub(crate) fn observe(&self, kind: &str, took: std::time::Duration, code: Option<&str>) {
        let Some((&kind, d)) = self.durations.get_key_value(kind) else { return };
        let seconds = took.as_secs_f64();
        for (bound, bucket) in BUCKETS.iter().zip(&d.buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        d.sum_micros.fetch_add(u64::try_from(took.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
        d.count.fetch_add(1, Ordering::Relaxed);
        let Some(code) = code else { return };
        let mut errors = self.errors.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let known = errors.contains_key(&(kind, code.to_owned()));
        let code = if known || errors.len() < MAX_CODES { code } else { "other" };
        *errors.entry((kind, code.to_owned())).or_default() += 1;
    }

    /// Adds one to `outcome` of `kind` (ignored for a kind or outcome the worker does not know).
    pub(crate) fn add(&self, kind: &str, outcome: &str) {
        let slot = OUTCOMES.iter().position(|o| *o == outcome);
        if let (Some(counters), Some(slot)) = (self.by_kind.get(kind), slot) {
            counters[slot].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The count of one outcome of one kind.
    pub fn get(&self, kind: &str, outcome: &str) -> u64 {
        let slot = OUTCOMES.iter().position(|o| *o == outcome);
        match (self.by_kind.get(kind), slot) {
            (Some(counters), Some(slot)) => counters[slot].load(Ordering::Relaxed),
            _ => 0,
        }
    }

    /// The sum of one outcome over all kinds.
    pub fn total(&self, outcome: &str) -> u64 {
        self.by_kind.keys().map(|kind| self.get(kind, outcome)).sum()
    }

    /// Every counter, by kind then outcome.
    pub fn snapshot(&self) -> Vec<OutcomeCount> {
        self.by_kind
            .iter()
            .flat_map(|(kind, counters)| {
                OUTCOMES.iter().zip(counters).map(|(outcome, count)| OutcomeCount {
                    kind,
                    outcome,
                    count: count.load(Ordering::Relaxed),
                })
            })
            .collect()
    }

    /// Renders the metrics in the Prometheus text format: `paddock_jobs_total{kind, outcome}`,
    /// `paddock_job_duration_seconds{kind}` and `paddock_job_errors_total{kind, code}`.
    pub fn render(&self, out: &mut String) {
        out.push_str("# HELP paddock_jobs_total Job runs of this process's worker by kind and outcome.\n");
        out.push_str("# TYPE paddock_jobs_total counter\n");
        for c in self.snapshot() {
            let _ = writeln!(out, "paddock_jobs_total{{kind=\"{}\",outcome=\"{}\"}} {}", c.kind, c.outcome, c.count);
        }
        out.push_str("# HELP paddock_job_duration_seconds How long this process's job runs took, by kind.\n");
        out.push_str("# TYPE paddock_job_duration_seconds histogram\n");
        for (kind, d) in &self.durations {
            for (bound, bucket) in BUCKETS.iter().zip(&d.buckets) {
                let n = bucket.load(Ordering::Relaxed);
                let _ = writeln!(out, "paddock_job_duration_seconds_bucket{{kind=\"{kind}\",le=\"{bound}\"}} {n}");
            }
            let count = d.count.load(Ordering::Relaxed);
            let sum = d.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
            let _ = writeln!(out, "paddock_job_duration_seconds_bucket{{kind=\"{kind}\",le=\"+Inf\"}} {count}");
            let _ = writeln!(out, "paddock_job_duration_seconds_sum{{kind=\"{kind}\"}} {sum}");
            let _ = writeln!(out, "paddock_job_duration_seconds_count{{kind=\"{kind}\"}} {count}");
        }
        out.push_str(
            "# HELP paddock_job_errors_total Job runs that ended with an error, by kind and error code \
                      (a BMC's, a Kubernetes API's or the platform's; at most 64 codes, then `other`).\n",
        );
        out.push_str("# TYPE paddock_job_errors_total counter\n");
        let errors = self.errors.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for ((kind, code), n) in errors.iter() {
            let code: String = code.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            let _ = writeln!(out, "paddock_job_errors_total{{kind=\"{kind}\",code=\"{code}\"}} {n}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_kind_and_outcome() {
        let m = JobMetrics::new(&["a", "b"]);
        m.add("a", "succeeded");
        m.add("a", "succeeded");
        m.add("b", "failed");
        m.add("c", "succeeded");
        m.add("a", "no_such_outcome");
        assert_eq!(m.get("a", "succeeded"), 2);
        assert_eq!(m.get("b", "failed"), 1);
        assert_eq!(m.total("succeeded"), 2);
        assert_eq!(m.snapshot().len(), 2 * OUTCOMES.len());
    }

    #[test]
    fn durations_and_error_codes_are_bounded() {
        let m = JobMetrics::new(&["a"]);
        m.observe("a", std::time::Duration::from_millis(30), None);
        m.observe("a", std::time::Duration::from_secs(3), Some("bmc_timeout"));
        m.observe("zzz", std::time::Duration::from_secs(3), Some("bmc_timeout"));
        for i in 0..200 {
            m.observe("a", std::time::Duration::ZERO, Some(&format!("made_up_{i}")));
        }
        m.observe("a", std::time::Duration::ZERO, Some("bmc_timeout"));
        let mut out = String::new();
        m.render(&mut out);
        assert!(out.contains("paddock_job_duration_seconds_bucket{kind=\"a\",le=\"0.05\"} 202\n"), "{out}");
        assert!(out.contains("paddock_job_duration_seconds_bucket{kind=\"a\",le=\"2.5\"} 202\n"), "{out}");
        assert!(out.contains("paddock_job_duration_seconds_bucket{kind=\"a\",le=\"10\"} 203\n"), "{out}");
        assert!(out.contains("paddock_job_duration_seconds_count{kind=\"a\"} 203\n"), "{out}");
        assert!(out.contains("paddock_job_errors_total{kind=\"a\",code=\"bmc_timeout\"} 2\n"), "{out}");
        let codes = out.lines().filter(|l| l.starts_with("paddock_job_errors_total{")).count();
        assert_eq!(codes, MAX_CODES + 1, "64 codes and `other`:\n{out}");
        assert!(!out.contains("zzz"), "{out}");
    }

    #[test]
    fn renders_every_series_with_bounded_labels() {
        let m = JobMetrics::new(&["a", "b"]);
        m.add("a", "succeeded");
        m.add("a", "succeeded");
        m.add("zzz", "succeeded");
        let mut out = String::new();
        m.render(&mut out);
        assert!(out.contains("# TYPE paddock_jobs_total counter\n"), "{out}");
        assert!(out.contains("paddock_jobs_total{kind=\"a\",outcome=\"succeeded\"} 2\n"), "{out}");
        assert!(out.contains("paddock_jobs_total{kind=\"b\",outcome=\"failed\"} 0\n"), "{out}");
        let series = out.lines().filter(|l| l.starts_with("paddock_jobs_total{")).count();
        assert_eq!(series, 2 * OUTCOMES.len(), "one series per known kind and outcome, never one for an unknown kind");
    }
}
