//! Streaming an export (docs/billing.md) without holding the database while the client reads.
//!
//! The records are read in keyset pages of [`PAGE`] rows ordered by (start, id), each page on a
//! pooled connection taken for that one query and given back before its bytes are handed on: an
//! export the client reads slowly, or not at all, holds no connection. The next page is read while
//! one is written, so the database's work and paddock's overlap. At one `as_of` every page
//! reads the same snapshot, so the pages together are the same rows, in the same order, as one
//! query: the bytes are those of a single read.
//!
//! Each export is bounded: a chunk the client has not taken within the idle timeout, or an export
//! still running at its maximum duration, ends it, and the response is cut off (never completed
//! as if the export were whole). Each caller (JWT subject) runs at most a set number of exports at
//! once; one more is answered 429 with `Retry-After`. A caller's slot is freed when its export's
//! streaming ends (done, cut off, or the client gone).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use paddock_domain::{Error, Result};
use paddock_store::usage::{self as store, Query};
use paddock_store::{Store, StoreError};
use paddock_types::usage::{AdjustmentCategory, UsageRecord};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::focus::Focus;
use super::{rfc3339, ExportFormat, Sums};

/// Records per keyset page (one short query each).
pub(super) const PAGE: u32 = 4000;

/// Seconds a caller refused for too many exports is told to wait.
const RETRY_AFTER_SECS: u64 = 5;

/// The exports running per caller.
#[derive(Debug, Default)]
pub struct ExportSlots {
    running: Mutex<HashMap<String, usize>>,
}

/// One running export of a caller: frees its slot when dropped.
#[derive(Debug)]
pub(super) struct Slot {
    slots: Arc<ExportSlots>,
    caller: String,
}

impl ExportSlots {
    /// Takes one of `caller`'s `max` slots; 429 `too_many_exports` when all are taken.
    pub(super) fn take(self: &Arc<Self>, caller: &str, max: usize) -> Result<Slot> {
        let refused = || Error::TooManyRequests {
            code: "too_many_exports",
            message: format!("this caller already runs {max} exports; finish or close one first"),
            retry_after: RETRY_AFTER_SECS,
        };
        let mut running = self.running.lock().map_err(|_| refused())?;
        let count = running.entry(caller.to_owned()).or_default();
        if *count >= max {
            return Err(refused());
        }
        *count += 1;
        Ok(Slot { slots: self.clone(), caller: caller.to_owned() })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Ok(mut running) = self.slots.running.lock() else { return };
        if let Some(count) = running.get_mut(&self.caller) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                running.remove(&self.caller);
            }
        }
    }
}

/// An export's bounds in time.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    /// Longest a chunk may wait for the client to take it.
    pub idle: Duration,
    /// Longest the whole export may run.
    pub total: Duration,
}

/// Why streaming stopped before the end.
#[derive(Debug)]
enum Stop {
    /// The client went away.
    Gone,
    /// The client took no chunk within the idle timeout.
    Idle,
    /// The export ran out of its time.
    Expired,
    /// The summary's sums left the range of a 64-bit integer.
    Overflow,
    /// Reading the records failed.
    Failed(StoreError),
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        Stop::Failed(e)
    }
}

/// Where the chunks go: the response body's channel, within the bounds.
struct Sink {
    sender: mpsc::Sender<Bytes>,
    idle: Duration,
    deadline: Instant,
}

impl Sink {
    async fn send(&self, chunk: Vec<u8>) -> std::result::Result<(), Stop> {
        let until = self.deadline.min(Instant::now() + self.idle);
        match tokio::time::timeout_at(until, self.sender.send(Bytes::from(chunk))).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Stop::Gone),
            Err(_) if Instant::now() >= self.deadline => Err(Stop::Expired),
            Err(_) => Err(Stop::Idle),
        }
    }

    fn check_deadline(&self) -> std::result::Result<(), Stop> {
        if Instant::now() >= self.deadline {
            return Err(Stop::Expired);
        }
        Ok(())
    }
}

/// The bytes of an export, handed to the sink in chunks of about 64 KiB.
struct Chunks {
    buf: Vec<u8>,
    sink: Sink,
}

impl Chunks {
    const SIZE: usize = 64 * 1024;
    const SLACK: usize = 4096;

    fn new(sink: Sink) -> Self {
        Self { buf: Vec::with_capacity(Self::SIZE + Self::SLACK), sink }
    }

    /// Hands the chunk over once it is full.
    async fn flush_full(&mut self) -> std::result::Result<(), Stop> {
        if self.buf.len() < Self::SIZE {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(Self::SIZE + Self::SLACK));
        self.sink.send(chunk).await
    }

    /// Hands over what is left.
    async fn finish(self) -> std::result::Result<(), Stop> {
        self.sink.send(self.buf).await
    }
}

/// What an export streams: the plain records (CSV, NDJSON) or FOCUS rows.
pub(super) enum Source {
    /// CSV or NDJSON.
    Plain(ExportFormat),
    /// FOCUS, with its prices.
    Focus(Box<Focus>),
}

/// Starts streaming the export of `q` on its own task and returns the body: chunks as the client
/// takes them, and an error at the end unless the export was whole.
pub(super) fn spawn(
    store: Store,
    q: Query,
    source: Source,
    bounds: Bounds,
    slot: Slot,
) -> BoxStream<'static, std::result::Result<Bytes, std::io::Error>> {
    let (sender, receiver) = mpsc::channel(4);
    let whole = Arc::new(AtomicBool::new(false));
    let done = whole.clone();
    tokio::spawn(async move {
        let _slot = slot;
        let sink = Sink { sender, idle: bounds.idle, deadline: Instant::now() + bounds.total };
        let written = match &source {
            Source::Plain(format) => write_plain(&store, &q, *format, sink).await,
            Source::Focus(focus) => write_focus(&store, &q, focus, sink).await,
        };
        match written {
            Ok(()) => done.store(true, Ordering::Release),
            Err(Stop::Gone) => {}
            Err(Stop::Idle) => tracing::info!("usage export cut off: the client took nothing within the idle timeout"),
            Err(Stop::Expired) => tracing::info!("usage export cut off: it ran out of its maximum duration"),
            Err(Stop::Overflow) => tracing::warn!("usage export cut off: its summary's sums overflow 64 bits"),
            Err(Stop::Failed(e)) => {
                tracing::error!(error = %paddock_domain::error::chain(&e), "usage export failed while streaming");
            }
        }
    });
    futures::stream::unfold((receiver, whole, false), |(mut rx, whole, ended)| async move {
        if ended {
            return None;
        }
        match rx.recv().await {
            Some(chunk) => Some((Ok(chunk), (rx, whole, false))),
            None if whole.load(Ordering::Acquire) => None,
            None => Some((Err(std::io::Error::other("the export was cut off")), (rx, whole, true))),
        }
    })
    .boxed()
}

/// Where a page ends: the (start, id) of its last record.
type Key = (chrono::DateTime<chrono::Utc>, uuid::Uuid);

/// Streams the records that `fetch` reads page by page (each page on a pooled connection held for
/// its query only) into `out`, each record written by `write`. The next page's query runs while
/// the page before it is written and handed on, so the database and the writing overlap; at most
/// two pages are in memory. Whichever of the two fails first ends the export, without waiting for
/// the other (a client gone need not wait for a query, nor a failed query for a slow client).
async fn stream_pages<T, F, Fut>(
    out: &mut Chunks,
    mut fetch: F,
    key: impl Fn(&T) -> Key,
    mut write: impl FnMut(&T, &mut Vec<u8>) -> std::result::Result<(), Stop>,
) -> std::result::Result<(), Stop>
where
    F: FnMut(Option<Key>) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<Vec<T>, StoreError>>,
{
    out.sink.check_deadline()?;
    let mut records = fetch(None).await?;
    loop {
        let after = records.last().filter(|_| records.len() >= PAGE as usize).map(&key);
        let next = async {
            match after {
                Some(after) => fetch(Some(after)).await.map(Some).map_err(Stop::from),
                None => Ok(None),
            }
        };
        let written = async {
            for record in &records {
                write(record, &mut out.buf)?;
                out.flush_full().await?;
            }
            Ok::<_, Stop>(())
        };
        let (next, ()) = tokio::try_join!(next, written)?;
        let Some(next) = next else { return Ok(()) };
        out.sink.check_deadline()?;
        records = next;
    }
}

/// Streams the CSV or NDJSON export of `q` into `sink`, page by page.
async fn write_plain(store: &Store, q: &Query, format: ExportFormat, sink: Sink) -> std::result::Result<(), Stop> {
    let mut out = Chunks::new(sink);
    if format == ExportFormat::Csv {
        out.buf.extend_from_slice(CSV_HEADER.as_bytes());
    }
    let (mut count, mut sums) = (0u64, Sums::default());
    let fetch = |after| async move {
        let mut conn = store.conn().await?;
        store::records(&mut conn, q, after, PAGE).await
    };
    let write = |record: &UsageRecord, buf: &mut Vec<u8>| {
        count += 1;
        sums.add_record(record).map_err(|_| Stop::Overflow)?;
        match format {
            ExportFormat::Ndjson => ndjson_line(record, buf),
            ExportFormat::Csv | ExportFormat::Focus => csv_line(record, buf),
        }
        Ok(())
    };
    stream_pages(&mut out, fetch, |r: &UsageRecord| (r.start, r.id), write).await?;
    if format == ExportFormat::Ndjson {
        ndjson_summary(count, sums.0, &mut out.buf);
    }
    out.finish().await
}

/// Streams the FOCUS export of `q` into `sink`, page by page.
async fn write_focus(store: &Store, q: &Query, focus: &Focus, sink: Sink) -> std::result::Result<(), Stop> {
    let mut out = Chunks::new(sink);
    Focus::header(&mut out.buf);
    let fetch = |after| async move {
        let mut conn = store.conn().await?;
        store::focus_records(&mut conn, q, after, PAGE).await
    };
    let key = |r: &store::FocusRecord| (r.record.start, r.record.id);
    let write = |record: &store::FocusRecord, buf: &mut Vec<u8>| Ok(focus.rows(record, buf)?);
    stream_pages(&mut out, fetch, key, write).await?;
    out.finish().await
}

const CSV_HEADER: &str = "id,kind,tenant_id,cluster_id,node_pool_id,machine_id,machine_class,gpu_count,start,end,\
node_seconds,gpu_seconds,control_plane_seconds\n";

/// One CSV row. No field can hold a comma, quote or newline (ids, DNS labels, timestamps).
fn csv_line(r: &UsageRecord, out: &mut Vec<u8>) {
    let opt = |v: Option<String>| v.unwrap_or_default();
    let line = format!(
        "{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
        r.id,
        r.kind.as_str(),
        r.tenant_id,
        opt(r.cluster_id.map(|c| c.to_string())),
        opt(r.node_pool_id.map(|c| c.to_string())),
        opt(r.machine_id.map(|c| c.to_string())),
        r.machine_class.as_deref().unwrap_or(""),
        r.gpu_count,
        rfc3339(r.start),
        rfc3339(r.end),
        r.node_seconds,
        r.gpu_seconds,
        r.control_plane_seconds
    );
    out.extend_from_slice(line.as_bytes());
}

/// One NDJSON record line: the record's fields in a fixed order, with `"type": "record"`
/// (`category` only for a credit).
pub(super) fn ndjson_line(r: &UsageRecord, out: &mut Vec<u8>) {
    let mut value = serde_json::to_value(r).unwrap_or_default();
    if let Value::Object(map) = &mut value {
        map.insert("type".to_owned(), json!("record"));
        // Only a credit says its category: a correction's line stays what it was before
        // adjustments had categories, so a period closed earlier still exports to the bytes its
        // manifest's SHA-256 names.
        if r.category == Some(AdjustmentCategory::Correction) {
            map.remove("category");
        }
    }
    // Writing JSON into a Vec cannot fail.
    // serde_json's maps are ordered by key, so the line is the same for the same record.
    let _ = serde_json::to_writer(&mut *out, &value);
    out.push(b'\n');
}

/// The NDJSON summary line.
pub(super) fn ndjson_summary(rows: u64, sums: [i64; 3], out: &mut Vec<u8>) {
    let summary = json!({ "type": "summary", "row_count": rows, "node_seconds": sums[0], "gpu_seconds": sums[1],
        "control_plane_seconds": sums[2] });
    let _ = serde_json::to_writer(&mut *out, &summary);
    out.push(b'\n');
}
