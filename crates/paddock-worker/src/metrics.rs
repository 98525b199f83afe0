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

/// Counters of job outcomes per kind, shared by a worker's runs.
#[derive(Debug)]
pub struct JobMetrics {
    by_kind: BTreeMap<&'static str, [AtomicU64; OUTCOMES.len()]>,
}

impl JobMetrics {
    pub(crate) fn new(kinds: &[&'static str]) -> Self {
        Self { by_kind: kinds.iter().map(|k| (*k, Default::default())).collect() }
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

    /// Renders the counters in the Prometheus text format: `paddock_jobs_total{kind, outcome}`.
    pub fn render(&self, out: &mut String) {
        out.push_str("# HELP paddock_jobs_total Job runs of this process's worker by kind and outcome.\n");
        out.push_str("# TYPE paddock_jobs_total counter\n");
        for c in self.snapshot() {
            let _ = writeln!(out, "paddock_jobs_total{{kind=\"{}\",outcome=\"{}\"}} {}", c.kind, c.outcome, c.count);
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
