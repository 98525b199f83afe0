//! TEST-ONLY: captures every `tracing` span field and event of the current thread as text, so
//! that a test can check that a secret never reaches the logs (at any level).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// The captured text; clones share it.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<String>>);

impl Captured {
    /// Everything captured so far.
    pub fn text(&self) -> String {
        self.0.lock().expect("log buffer").clone()
    }
}

struct Capture {
    out: Captured,
    next: AtomicU64,
}

struct Visitor<'a>(&'a mut String);

impl Visit for Visitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }
}

impl Capture {
    fn write(&self, prefix: &str, record: impl FnOnce(&mut Visitor<'_>)) {
        let mut line = String::from(prefix);
        record(&mut Visitor(&mut line));
        line.push('\n');
        self.out.0.lock().expect("log buffer").push_str(&line);
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        self.write(&format!("span {} ", span.metadata().name()), |v| span.record(v));
        Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed))
    }

    fn record(&self, _: &Id, values: &Record<'_>) {
        self.write("record ", |v| values.record(v));
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        self.write(&format!("{} ", event.metadata().level()), |v| event.record(v));
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Captures this thread's logs (a `#[tokio::test]` runs everything on it) until the guard drops.
pub fn capture() -> (Captured, tracing::subscriber::DefaultGuard) {
    // Tests run on several threads; a callsite first reached on a thread without a capture could
    // be cached as uninteresting (tracing keeps interest per callsite, globally), and its events
    // would then be missing here. A global subscriber interested in everything (which drops what
    // it gets) keeps every callsite live; the capture, set for this thread, takes the events.
    static EVERYTHING: std::sync::Once = std::sync::Once::new();
    EVERYTHING.call_once(|| {
        let _ = tracing::subscriber::set_global_default(Discard);
    });
    let out = Captured::default();
    let guard = tracing::subscriber::set_default(Capture { out: out.clone(), next: AtomicU64::new(1) });
    (out, guard)
}

/// Interested in every callsite, keeps nothing (see [`capture`]).
struct Discard;

impl Subscriber for Discard {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::always()
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }

    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, _: &Event<'_>) {}

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
