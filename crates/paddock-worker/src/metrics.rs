//! The worker's metrics: job outcomes, run durations and error codes by kind, and what the
//! reconcilers observe on the way (wipe and provisioning durations, allocation waits, failed
//! wipes, failed driver calls). Every process that runs a worker adds them to its `/metrics`
//! ([`WorkerMetrics::render`]).
//!
//! Every label is bounded. Kinds and outcomes are fixed when the worker is built; the open values
//! (error codes, machine classes) get at most [`MAX_SERIES`] series per family, one
//! [`Family`] mechanism for all of them, and count as `other` after that.
//!
//! The reconcilers reach the metrics of the worker that runs their job through [`observe`]: the
//! worker sets them around every run (a task-local, like the run's tracing span), so a handler
//! needs no handle of its own, and outside a worker's run (a test calling a handler) nothing is
//! recorded.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use paddock_service::label_value;

/// The outcomes counted, in the order of [`WorkerMetrics::snapshot`].
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

/// One counter of [`WorkerMetrics::snapshot`].
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
const RUN_BUCKETS: [f64; 10] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0, 120.0];

/// Upper bounds of the lifecycle histograms (wipes, provisioning, allocation waits), in seconds:
/// 1 s to 4 h. A wipe takes minutes to hours with the size of the drives, and so may a wait for
/// machines.
const LIFECYCLE_BUCKETS: [f64; 12] =
    [1.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0];

/// At most this many series per family with open label values; values first seen after that
/// count as `other`, so a driver inventing codes cannot grow the series without bound.
pub(crate) const MAX_SERIES: usize = 64;

/// The label value the open labels get once their family is full.
const OTHER: &str = "other";

/// Which driver a failed call went to: the `driver` label of `paddock_driver_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Driver {
    /// The BMC driver (`PADDOCK_BMC_DRIVER`): codes `bmc_*`.
    Bmc,
    /// The Kubernetes drivers (`PADDOCK_KUBE_DRIVER`): the platform cluster, the tenant control
    /// planes, their nodes, stacks and Slurm.
    Kube,
}

impl Driver {
    fn as_str(self) -> &'static str {
        match self {
            Driver::Bmc => "bmc",
            Driver::Kube => "kube",
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The series of one metric family by label values, at most [`MAX_SERIES`] of them: once it is
/// full, a new combination counts under `other` in its open labels (those after the `fixed`
/// leading ones, whose values come from a set fixed in the code: a job kind, a driver).
#[derive(Debug)]
pub(crate) struct Family<V> {
    labels: &'static [&'static str],
    fixed: usize,
    series: Mutex<BTreeMap<Vec<String>, V>>,
}

impl<V: Default + Clone> Family<V> {
    pub(crate) fn new(labels: &'static [&'static str], fixed: usize) -> Self {
        Self { labels, fixed, series: Mutex::default() }
    }

    /// A family whose series start with one per value of its single label (rendered from the
    /// start, at zero).
    pub(crate) fn seeded(label: &'static [&'static str], values: &[&'static str]) -> Self {
        let family = Self::new(label, label.len());
        lock(&family.series).extend(values.iter().map(|v| (vec![(*v).to_owned()], V::default())));
        family
    }

    /// Applies `f` to the series of `values` (one per label), made if new.
    fn update(&self, values: &[&str], f: impl FnOnce(&mut V)) {
        debug_assert_eq!(values.len(), self.labels.len());
        let mut series = lock(&self.series);
        let key: Vec<String> = values.iter().map(|v| (*v).to_owned()).collect();
        let key = if series.contains_key(&key) || series.len() < MAX_SERIES {
            key
        } else {
            key.into_iter().enumerate().map(|(i, v)| if i < self.fixed { v } else { OTHER.to_owned() }).collect()
        };
        f(series.entry(key).or_default());
    }

    /// Every series: its labels as `a="x",b="y"` (escaped), and its value.
    pub(crate) fn rows(&self) -> Vec<(String, V)> {
        let series = lock(&self.series);
        series
            .iter()
            .map(|(values, v)| {
                let labels: Vec<String> =
                    self.labels.iter().zip(values).map(|(l, v)| format!("{l}=\"{}\"", label_value(v))).collect();
                (labels.join(","), v.clone())
            })
            .collect()
    }
}

/// Counters by label values.
#[derive(Debug)]
pub(crate) struct Counters {
    pub(crate) name: &'static str,
    pub(crate) help: &'static str,
    pub(crate) family: Family<u64>,
}

impl Counters {
    pub(crate) fn add(&self, values: &[&str]) {
        self.family.update(values, |n| *n += 1);
    }

    pub(crate) fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} counter", self.name);
        for (labels, n) in self.family.rows() {
            let _ = writeln!(out, "{}{{{labels}}} {n}", self.name);
        }
    }
}

/// One histogram series: the count per bucket (not cumulative), the sum, the count.
#[derive(Debug, Default, Clone)]
pub(crate) struct Series {
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

/// A histogram by label values (none: a single series).
#[derive(Debug)]
pub(crate) struct Histogram {
    pub(crate) name: &'static str,
    pub(crate) help: &'static str,
    pub(crate) bounds: &'static [f64],
    pub(crate) family: Family<Series>,
}

impl Histogram {
    pub(crate) fn observe(&self, values: &[&str], took: Duration) {
        let seconds = took.as_secs_f64();
        let bucket = self.bounds.iter().position(|b| seconds <= *b);
        self.family.update(values, |s| {
            s.buckets.resize(self.bounds.len(), 0);
            if let Some(i) = bucket {
                s.buckets[i] += 1;
            }
            s.sum += seconds;
            s.count += 1;
        });
    }

    pub(crate) fn render(&self, out: &mut String) {
        let name = self.name;
        let _ = writeln!(out, "# HELP {name} {}", self.help);
        let _ = writeln!(out, "# TYPE {name} histogram");
        let rows = self.family.rows();
        // A family without labels has its one series from the start.
        let rows = if rows.is_empty() && self.family.labels.is_empty() {
            vec![(String::new(), Series::default())]
        } else {
            rows
        };
        for (labels, s) in rows {
            let sep = if labels.is_empty() { "" } else { "," };
            let mut cumulative = 0;
            for (i, bound) in self.bounds.iter().enumerate() {
                cumulative += s.buckets.get(i).copied().unwrap_or(0);
                let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}");
            }
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", s.count);
            let braced = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
            let _ = writeln!(out, "{name}_sum{braced} {}", s.sum);
            let _ = writeln!(out, "{name}_count{braced} {}", s.count);
        }
    }
}

/// The metrics of one worker, shared by its runs.
#[derive(Debug)]
pub struct WorkerMetrics {
    /// Outcomes per kind: lock-free, the kinds are known when the worker is built.
    by_kind: BTreeMap<&'static str, [AtomicU64; OUTCOMES.len()]>,
    job_durations: Histogram,
    job_errors: Counters,
    wipes: Histogram,
    wipe_failures: Counters,
    provisioning: Histogram,
    allocation_wait: Histogram,
    driver_errors: Counters,
}

impl WorkerMetrics {
    pub(crate) fn new(kinds: &[&'static str]) -> Self {
        let histogram = |name, help, labels: &'static [&'static str]| Histogram {
            name,
            help,
            bounds: &LIFECYCLE_BUCKETS,
            family: Family::new(labels, 0),
        };
        Self {
            by_kind: kinds.iter().map(|k| (*k, Default::default())).collect(),
            job_durations: Histogram {
                name: "paddock_job_duration_seconds",
                help: "How long this process's job runs took, by kind.",
                bounds: &RUN_BUCKETS,
                family: Family::seeded(&["kind"], kinds),
            },
            job_errors: Counters {
                name: "paddock_job_errors_total",
                help: "Job runs that ended with an error, by kind and error code (a BMC's, a Kubernetes API's or \
                       the platform's; at most 64 codes, then `other`).",
                family: Family::new(&["kind", "code"], 1),
            },
            wipes: histogram(
                "paddock_wipe_duration_seconds",
                "Verified wipes this process completed, by machine class: how long the machine was in cleaning, \
                 from entering it (its custody entry) to becoming available.",
                &["machine_class"],
            ),
            wipe_failures: Counters {
                name: "paddock_wipe_failures_total",
                help: "Wipes this process ended in clean_failed (quarantine), by machine class and code.",
                family: Family::new(&["machine_class", "code"], 0),
            },
            provisioning: histogram(
                "paddock_provisioning_duration_seconds",
                "Machines this process made active, by machine class: from their allocation to a cluster to \
                 their node being Ready (a new cluster's control plane coming up included).",
                &["machine_class"],
            ),
            allocation_wait: histogram(
                "paddock_allocation_wait_seconds",
                "Allocations this process made: how long the cluster had waited in line for machines (0 when \
                 they were there at its first try; a wait over its tenant's quota is not counted).",
                &[],
            ),
            driver_errors: Counters {
                name: "paddock_driver_errors_total",
                help: "Failed calls of this process's reconcilers to a driver (bmc or kube), by code, including \
                       those retried within a run or ignored as best effort (at most 64 codes, then `other`).",
                family: Family::new(&["driver", "code"], 1),
            },
        }
    }

    /// Records one run of `kind`: how long it took and the error code it ended with, if any
    /// (ignored for a kind the worker does not know).
    pub(crate) fn observe(&self, kind: &str, took: Duration, code: Option<&str>) {
        if !self.by_kind.contains_key(kind) {
            return;
        }
        self.job_durations.observe(&[kind], took);
        if let Some(code) = code {
            self.job_errors.add(&[kind, code]);
        }
    }

    /// Records a verified wipe of a machine of `class` that was in cleaning for `took`.
    pub(crate) fn wipe_completed(&self, class: &str, took: Duration) {
        self.wipes.observe(&[class], took);
    }

    /// Records a wipe of a machine of `class` that ended in `clean_failed` with `code`.
    pub(crate) fn wipe_failed(&self, class: &str, code: &str) {
        self.wipe_failures.add(&[class, code]);
    }

    /// Records a machine of `class` made active `took` after its allocation.
    pub(crate) fn provisioned(&self, class: &str, took: Duration) {
        self.provisioning.observe(&[class], took);
    }

    /// Records an allocation that had waited `waited` in line.
    pub(crate) fn allocated(&self, waited: Duration) {
        self.allocation_wait.observe(&[], waited);
    }

    /// Records a failed call to `driver` with the error's `code`.
    pub(crate) fn driver_failed(&self, driver: Driver, code: &str) {
        self.driver_errors.add(&[driver.as_str(), code]);
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
    /// `paddock_job_duration_seconds{kind}`, `paddock_job_errors_total{kind, code}`,
    /// `paddock_wipe_duration_seconds{machine_class}`, `paddock_wipe_failures_total{machine_class,
    /// code}`, `paddock_provisioning_duration_seconds{machine_class}`,
    /// `paddock_allocation_wait_seconds` and `paddock_driver_errors_total{driver, code}`.
    pub fn render(&self, out: &mut String) {
        out.push_str("# HELP paddock_jobs_total Job runs of this process's worker by kind and outcome.\n");
        out.push_str("# TYPE paddock_jobs_total counter\n");
        for c in self.snapshot() {
            let _ = writeln!(out, "paddock_jobs_total{{kind=\"{}\",outcome=\"{}\"}} {}", c.kind, c.outcome, c.count);
        }
        self.job_durations.render(out);
        self.job_errors.render(out);
        self.wipes.render(out);
        self.wipe_failures.render(out);
        self.provisioning.render(out);
        self.allocation_wait.render(out);
        self.driver_errors.render(out);
    }
}

tokio::task_local! {
    /// The metrics of the worker running the current job.
    static CURRENT: Arc<WorkerMetrics>;
}

/// Runs `run` (a job's run) with `metrics` as the ones [`observe`] records into.
pub(crate) fn scope<F: Future>(metrics: Arc<WorkerMetrics>, run: F) -> impl Future<Output = F::Output> {
    CURRENT.scope(metrics, run)
}

/// Records into the metrics of the worker running the current job; nothing outside a run.
pub(crate) fn observe(record: impl FnOnce(&WorkerMetrics)) {
    let _ = CURRENT.try_with(|m| record(m));
}

/// Records a failed call to `driver` with the error's `code` (see [`observe`]).
pub(crate) fn driver_failed(driver: Driver, code: &str) {
    observe(|m| m.driver_failed(driver, code));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_kind_and_outcome() {
        let m = WorkerMetrics::new(&["a", "b"]);
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
        let m = WorkerMetrics::new(&["a"]);
        m.observe("a", Duration::from_millis(30), None);
        m.observe("a", Duration::from_secs(3), Some("bmc_timeout"));
        m.observe("zzz", Duration::from_secs(3), Some("bmc_timeout"));
        for i in 0..200 {
            m.observe("a", Duration::ZERO, Some(&format!("made_up_{i}")));
        }
        m.observe("a", Duration::ZERO, Some("bmc_timeout"));
        let mut out = String::new();
        m.render(&mut out);
        assert!(out.contains("paddock_job_duration_seconds_bucket{kind=\"a\",le=\"0.05\"} 202\n"), "{out}");
        assert!(out.contains("paddock_job_duration_seconds_bucket{kind=\"a\",le=\"2.5\"} 202\n"), "{out}");
        assert!(out.contains("paddock_job_duration_seconds_bucket{kind=\"a\",le=\"10\"} 203\n"), "{out}");
        assert!(out.contains("paddock_job_duration_seconds_count{kind=\"a\"} 203\n"), "{out}");
        assert!(out.contains("paddock_job_errors_total{kind=\"a\",code=\"bmc_timeout\"} 2\n"), "{out}");
        let codes = out.lines().filter(|l| l.starts_with("paddock_job_errors_total{")).count();
        assert_eq!(codes, MAX_SERIES + 1, "64 codes and `other`:\n{out}");
        assert!(out.contains("paddock_job_errors_total{kind=\"a\",code=\"other\"} "), "{out}");
        assert!(!out.contains("zzz"), "{out}");
    }

    #[test]
    fn renders_every_series_with_bounded_labels() {
        let m = WorkerMetrics::new(&["a", "b"]);
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
        // Every run-duration series from the start, at zero.
        assert!(out.contains("paddock_job_duration_seconds_count{kind=\"b\"} 0\n"), "{out}");
    }

    #[test]
    fn lifecycle_histograms_bucket_minutes_and_hours_by_class() {
        let m = WorkerMetrics::new(&[]);
        m.wipe_completed("gpu-h100x8", Duration::from_secs(45));
        m.wipe_completed("gpu-h100x8", Duration::from_secs(5 * 3600));
        m.wipe_completed("cpu \"big\"", Duration::from_millis(500));
        m.provisioned("gpu-h100x8", Duration::from_secs(700));
        let mut out = String::new();
        m.render(&mut out);
        let wipes = "paddock_wipe_duration_seconds";
        assert!(out.contains(&format!("# TYPE {wipes} histogram\n")), "{out}");
        assert!(out.contains(&format!("{wipes}_bucket{{machine_class=\"gpu-h100x8\",le=\"30\"}} 0\n")), "{out}");
        assert!(out.contains(&format!("{wipes}_bucket{{machine_class=\"gpu-h100x8\",le=\"60\"}} 1\n")), "{out}");
        assert!(out.contains(&format!("{wipes}_bucket{{machine_class=\"gpu-h100x8\",le=\"14400\"}} 1\n")), "{out}");
        assert!(out.contains(&format!("{wipes}_bucket{{machine_class=\"gpu-h100x8\",le=\"+Inf\"}} 2\n")), "{out}");
        assert!(out.contains(&format!("{wipes}_sum{{machine_class=\"gpu-h100x8\"}} 18045\n")), "{out}");
        assert!(out.contains(&format!("{wipes}_count{{machine_class=\"gpu-h100x8\"}} 2\n")), "{out}");
        // A class name is escaped, never dropped or mangled.
        assert!(out.contains(&format!("{wipes}_bucket{{machine_class=\"cpu \\\"big\\\"\",le=\"1\"}} 1\n")), "{out}");
        let provisioning = "paddock_provisioning_duration_seconds";
        assert!(
            out.contains(&format!("{provisioning}_bucket{{machine_class=\"gpu-h100x8\",le=\"600\"}} 0\n")),
            "{out}"
        );
        assert!(
            out.contains(&format!("{provisioning}_bucket{{machine_class=\"gpu-h100x8\",le=\"900\"}} 1\n")),
            "{out}"
        );
        // A class seen only in wipes has no provisioning series.
        assert!(!out.contains(&format!("{provisioning}_count{{machine_class=\"cpu")), "{out}");
    }

    #[test]
    fn the_allocation_wait_is_one_series_from_the_start() {
        let m = WorkerMetrics::new(&[]);
        let mut out = String::new();
        m.render(&mut out);
        assert!(out.contains("paddock_allocation_wait_seconds_bucket{le=\"1\"} 0\n"), "{out}");
        assert!(out.contains("paddock_allocation_wait_seconds_count 0\n"), "{out}");
        m.allocated(Duration::ZERO);
        m.allocated(Duration::from_secs(90));
        let mut out = String::new();
        m.render(&mut out);
        assert!(out.contains("paddock_allocation_wait_seconds_bucket{le=\"1\"} 1\n"), "{out}");
        assert!(out.contains("paddock_allocation_wait_seconds_bucket{le=\"60\"} 1\n"), "{out}");
        assert!(out.contains("paddock_allocation_wait_seconds_bucket{le=\"120\"} 2\n"), "{out}");
        assert!(out.contains("paddock_allocation_wait_seconds_sum 90\n"), "{out}");
        assert!(out.contains("paddock_allocation_wait_seconds_count 2\n"), "{out}");
    }

    #[test]
    fn open_labels_fall_back_to_other_once_a_family_is_full() {
        let m = WorkerMetrics::new(&[]);
        for i in 0..100 {
            m.wipe_completed(&format!("class-{i}"), Duration::from_secs(60));
            m.wipe_failed(&format!("class-{i}"), "wipe_failed");
            m.driver_failed(Driver::Bmc, &format!("bmc_made_up_{i}"));
        }
        m.driver_failed(Driver::Kube, "kube_api_error");
        m.driver_failed(Driver::Bmc, "bmc_made_up_0");
        let mut out = String::new();
        m.render(&mut out);
        let count = |prefix: &str| out.lines().filter(|l| l.starts_with(prefix)).count();
        assert_eq!(count("paddock_wipe_duration_seconds_count{"), MAX_SERIES + 1, "{out}");
        assert!(out.contains("paddock_wipe_duration_seconds_count{machine_class=\"other\"} 36\n"), "{out}");
        assert_eq!(count("paddock_wipe_failures_total{"), MAX_SERIES + 1, "{out}");
        assert!(out.contains("paddock_wipe_failures_total{machine_class=\"other\",code=\"other\"} 36\n"), "{out}");
        // The driver is a fixed label: it stays when the codes overflow.
        assert_eq!(count("paddock_driver_errors_total{"), MAX_SERIES + 2, "{out}");
        assert!(out.contains("paddock_driver_errors_total{driver=\"bmc\",code=\"bmc_made_up_0\"} 2\n"), "{out}");
        assert!(out.contains("paddock_driver_errors_total{driver=\"bmc\",code=\"other\"} 36\n"), "{out}");
        assert!(out.contains("paddock_driver_errors_total{driver=\"kube\",code=\"other\"} 1\n"), "{out}");
    }

    #[tokio::test]
    async fn observations_go_to_the_worker_running_the_job_and_nowhere_outside_a_run() {
        let worker = Arc::new(WorkerMetrics::new(&[]));
        observe(|m| m.allocated(Duration::ZERO));
        scope(worker.clone(), async { observe(|m| m.allocated(Duration::from_secs(2))) }).await;
        let mut out = String::new();
        worker.render(&mut out);
        assert!(out.contains("paddock_allocation_wait_seconds_count 1\n"), "{out}");
        assert!(out.contains("paddock_allocation_wait_seconds_sum 2\n"), "{out}");
    }
}
