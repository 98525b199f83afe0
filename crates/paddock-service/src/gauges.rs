//! Gauges for `/metrics`, read from the database, at most once per [`GaugeCache`] age: scrapes
//! are unauthenticated, so a flood of them must not become a flood of aggregate queries that
//! takes the pool from every other request. One read is in flight at a time; scrapes that arrive
//! meanwhile wait for it and share its result.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use paddock_store::job::Depth;
use paddock_store::metrics::Count;
use paddock_store::{job, metrics};
use paddock_types::cluster::{ClusterKind, ClusterPhase};
use paddock_types::machine::MachineState;

use crate::Services;

/// How long one read of the gauges serves scrapes, by default.
pub const GAUGE_MAX_AGE: Duration = Duration::from_secs(5);

/// One read, `None` when the database did not answer.
type Reading = Option<Gauges>;

/// What one read of the database gives.
#[derive(Debug, Clone)]
struct Gauges {
    /// Machines by state and class.
    machines: Vec<Count>,
    /// Every class's name.
    classes: Vec<String>,
    /// Clusters by phase and kind.
    clusters: Vec<Count>,
    /// Clusters waiting for machines, and the longest wait in seconds.
    waiting: (i64, f64),
    /// The queue's depth.
    jobs: Vec<Depth>,
}

/// The last read and when it was made; the lock is held while reading, so there is one read at
/// a time.
#[derive(Debug)]
pub struct GaugeCache {
    max_age: Duration,
    last: tokio::sync::Mutex<Option<(Instant, Reading)>>,
    reads: AtomicU64,
}

impl GaugeCache {
    /// A cache whose reads serve scrapes for `max_age` (zero: every scrape that did not arrive
    /// during a read reads anew).
    pub fn new(max_age: Duration) -> Self {
        Self { max_age, last: tokio::sync::Mutex::new(None), reads: AtomicU64::new(0) }
    }
}

impl Default for GaugeCache {
    fn default() -> Self {
        Self::new(GAUGE_MAX_AGE)
    }
}

impl Services {
    /// Sets how long one read of the gauges serves scrapes.
    pub fn with_gauge_max_age(mut self, max_age: Duration) -> Self {
        self.gauges = std::sync::Arc::new(GaugeCache::new(max_age));
        self
    }

    /// The gauges: the last read if it is recent enough, or if it began after this scrape
    /// arrived (it waited for a read in flight); else a new read.
    async fn reading(&self) -> Reading {
        let arrived = Instant::now();
        let mut last = self.gauges.last.lock().await;
        if let Some((at, reading)) = last.as_ref() {
            if *at >= arrived || at.elapsed() < self.gauges.max_age {
                return reading.clone();
            }
        }
        let started = Instant::now();
        self.gauges.reads.fetch_add(1, Ordering::Relaxed);
        let read = async {
            let mut conn = self.store.conn().await?;
            let machines = metrics::machines_by_state_and_class(&mut conn).await?;
            let classes = metrics::class_names(&mut conn).await?;
            let clusters = metrics::clusters_by_phase_and_kind(&mut conn).await?;
            let waiting = metrics::waiting_for_machines(&mut conn).await?;
            let jobs = job::depth(&mut conn).await?;
            Ok::<_, paddock_store::StoreError>(Gauges { machines, classes, clusters, waiting, jobs })
        };
        let reading = read.await.ok();
        *last = Some((started, reading.clone()));
        reading
    }

    /// Appends the database gauges in the Prometheus text format; a database that does not
    /// answer is reported as `paddock_database_up 0` rather than failing the scrape.
    pub async fn render_gauges(&self, out: &mut String) {
        let reading = self.reading().await;
        out.push_str("# HELP paddock_gauge_reads_total Reads of the database gauges (cached between scrapes).\n");
        out.push_str("# TYPE paddock_gauge_reads_total counter\n");
        let _ = writeln!(out, "paddock_gauge_reads_total {}", self.gauges.reads.load(Ordering::Relaxed));
        out.push_str(
            "# HELP paddock_custody_chain_verifications_total Custody chains the isolation report verified in full \
             (a chain unchanged since its last verification is not verified again).\n",
        );
        out.push_str("# TYPE paddock_custody_chain_verifications_total counter\n");
        let _ = writeln!(out, "paddock_custody_chain_verifications_total {}", self.chains.verifications());
        out.push_str("# HELP paddock_database_up Whether the database answered the last read of the gauges.\n");
        out.push_str("# TYPE paddock_database_up gauge\n");
        let Some(Gauges { machines, classes, clusters, waiting, jobs }) = reading else {
            out.push_str("paddock_database_up 0\n");
            return;
        };
        out.push_str("paddock_database_up 1\n");
        out.push_str("# HELP paddock_machines Machines by lifecycle state and machine class.\n");
        out.push_str("# TYPE paddock_machines gauge\n");
        for state in MachineState::ALL.map(MachineState::as_str) {
            for class in &classes {
                let n = count(&machines, state, class);
                let _ =
                    writeln!(out, "paddock_machines{{state=\"{state}\",machine_class=\"{}\"}} {n}", label_value(class));
            }
        }
        out.push_str("# HELP paddock_clusters Clusters not yet deleted, by phase and kind.\n");
        out.push_str("# TYPE paddock_clusters gauge\n");
        for phase in ClusterPhase::ALL.map(ClusterPhase::as_str) {
            for kind in [ClusterKind::Slurm, ClusterKind::Kubernetes, ClusterKind::Ray].map(ClusterKind::as_str) {
                let n = count(&clusters, phase, kind);
                let _ = writeln!(out, "paddock_clusters{{phase=\"{phase}\",kind=\"{kind}\"}} {n}");
            }
        }
        out.push_str("# HELP paddock_clusters_waiting_for_machines Clusters waiting in line for machines now.\n");
        out.push_str("# TYPE paddock_clusters_waiting_for_machines gauge\n");
        let _ = writeln!(out, "paddock_clusters_waiting_for_machines {}", waiting.0);
        out.push_str(
            "# HELP paddock_allocation_oldest_wait_seconds How long the cluster waiting longest for machines has \
             waited (0 when none waits).\n",
        );
        out.push_str("# TYPE paddock_allocation_oldest_wait_seconds gauge\n");
        let _ = writeln!(out, "paddock_allocation_oldest_wait_seconds {}", waiting.1);
        out.push_str("# HELP paddock_queue_depth Jobs of the durable queue not yet finished, by kind and state.\n");
        out.push_str("# TYPE paddock_queue_depth gauge\n");
        for depth in &jobs {
            let _ = writeln!(
                out,
                "paddock_queue_depth{{kind=\"{}\",state=\"{}\"}} {}",
                depth.kind, depth.state, depth.count
            );
        }
    }
}

/// The count under two labels, zero when none.
fn count(counts: &[Count], a: &str, b: &str) -> i64 {
    counts.iter().find(|(x, y, _)| x == a && y == b).map_or(0, |(_, _, n)| *n)
}

/// A label value in the Prometheus text format's escaping (backslash, quote, newline).
pub fn label_value(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
