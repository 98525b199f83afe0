//! The deliverer's metrics, added to the `/metrics` of every process that delivers
//! ([`DeliveryMetrics::render`]): its tries by outcome and their latency (this process's), and the
//! backlog (the whole system's, as this process last read it).

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use paddock_store::webhook::delivery::{Backlog, Recorded};

use crate::metrics::{Counters, Family, Histogram};

/// The outcomes of a try: `delivered` (2xx), `retried` (failed, tried again later), `disabled`
/// (failed and given up: a 410 or 3 days of failures; the subscription is disabled), `lease_lost`
/// (the claim expired before the answer; another worker tries again).
pub const OUTCOMES: [&str; 4] = ["delivered", "retried", "disabled", "lease_lost"];

/// Upper bounds of the latency histogram, in seconds: up to the 15 s a try may take.
const LATENCY_BUCKETS: [f64; 10] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0];

/// The metrics of one deliverer.
#[derive(Debug)]
pub struct DeliveryMetrics {
    attempts: Counters,
    latency: Histogram,
    unfanned: AtomicI64,
    pending: AtomicI64,
    /// The oldest pending delivery's age in milliseconds.
    oldest_ms: AtomicU64,
}

impl Default for DeliveryMetrics {
    fn default() -> Self {
        Self {
            attempts: Counters {
                name: "paddock_webhook_attempts_total",
                help: "Webhook delivery tries of this process, by outcome: delivered, retried, disabled (given up, \
                       the subscription disabled), lease_lost.",
                family: Family::seeded(&["outcome"], &OUTCOMES),
            },
            latency: Histogram {
                name: "paddock_webhook_attempt_duration_seconds",
                help: "How long this process's webhook delivery tries took, from connect to the receiver's answer \
                       (or the failure).",
                bounds: &LATENCY_BUCKETS,
                family: Family::new(&[], 0),
            },
            unfanned: AtomicI64::new(0),
            pending: AtomicI64::new(0),
            oldest_ms: AtomicU64::new(0),
        }
    }
}

impl DeliveryMetrics {
    /// Records one try: how it ended and how long it took.
    pub(crate) fn attempt(&self, recorded: Recorded, took: Duration) {
        let outcome = match recorded {
            Recorded::Delivered => "delivered",
            Recorded::Retry => "retried",
            Recorded::Disabled => "disabled",
            Recorded::LeaseLost => "lease_lost",
        };
        self.attempts.add(&[outcome]);
        self.latency.observe(&[], took);
    }

    /// Keeps the backlog last read.
    pub(crate) fn backlog(&self, backlog: &Backlog) {
        self.unfanned.store(backlog.unfanned_events, Ordering::Relaxed);
        self.pending.store(backlog.pending_deliveries, Ordering::Relaxed);
        let oldest = u64::try_from(backlog.oldest_pending.as_millis()).unwrap_or(u64::MAX);
        self.oldest_ms.store(oldest, Ordering::Relaxed);
    }

    /// The count of tries that ended with `outcome` (one of [`OUTCOMES`]).
    pub fn attempts(&self, outcome: &str) -> u64 {
        self.attempts.family.rows().into_iter().find(|(l, _)| *l == format!("outcome=\"{outcome}\"")).map_or(0, |r| r.1)
    }

    /// Appends the metrics in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        self.attempts.render(out);
        self.latency.render(out);
        let gauge = |out: &mut String, name: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
        };
        gauge(
            out,
            "paddock_webhook_backlog",
            "Webhook work not done yet, as this process's deliverer last read it (every few seconds): events \
             not yet fanned out (stage=fan_out) and deliveries to enabled subscriptions not yet delivered \
             (stage=delivery).",
        );
        let _ = writeln!(out, "paddock_webhook_backlog{{stage=\"fan_out\"}} {}", self.unfanned.load(Ordering::Relaxed));
        let _ = writeln!(out, "paddock_webhook_backlog{{stage=\"delivery\"}} {}", self.pending.load(Ordering::Relaxed));
        gauge(
            out,
            "paddock_webhook_oldest_pending_seconds",
            "Age of the oldest delivery to an enabled subscription not yet delivered (0: none), as last read.",
        );
        let oldest = self.oldest_ms.load(Ordering::Relaxed) as f64 / 1000.0;
        let _ = writeln!(out, "paddock_webhook_oldest_pending_seconds {oldest}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_is_rendered_from_the_start_and_counted() {
        let m = DeliveryMetrics::default();
        m.attempt(Recorded::Delivered, Duration::from_millis(30));
        m.attempt(Recorded::Disabled, Duration::from_secs(20));
        m.backlog(&Backlog { unfanned_events: 3, pending_deliveries: 7, oldest_pending: Duration::from_millis(1500) });
        let mut out = String::new();
        m.render(&mut out);
        for line in [
            "paddock_webhook_attempts_total{outcome=\"delivered\"} 1\n",
            "paddock_webhook_attempts_total{outcome=\"disabled\"} 1\n",
            "paddock_webhook_attempts_total{outcome=\"retried\"} 0\n",
            "paddock_webhook_attempts_total{outcome=\"lease_lost\"} 0\n",
            "paddock_webhook_attempt_duration_seconds_bucket{le=\"0.05\"} 1\n",
            "paddock_webhook_attempt_duration_seconds_bucket{le=\"+Inf\"} 2\n",
            "paddock_webhook_attempt_duration_seconds_count 2\n",
            "paddock_webhook_backlog{stage=\"fan_out\"} 3\n",
            "paddock_webhook_backlog{stage=\"delivery\"} 7\n",
            "paddock_webhook_oldest_pending_seconds 1.5\n",
        ] {
            assert!(out.contains(line), "{line} missing in\n{out}");
        }
        assert_eq!(m.attempts("disabled"), 1);
    }
}
