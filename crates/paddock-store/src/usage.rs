//! Usage segments (docs/billing.md): written in the transaction of the state change that causes
//! them, read back clipped to a range at a watermark.
//!
//! Writes. A machine segment opens (end null) when the machine becomes `active` (keyed by its
//! allocation: a replay writes nothing) and closes with one guarded `update ... where end_at is
//! null` when it leaves the tenant's control; a control-plane segment opens when its cluster is
//! first `ready` and closes when its deletion starts. Bounds are `clock_timestamp()` truncated to
//! whole seconds. The schema forbids overlaps and every change of a closed segment.
//!
//! Snapshots. Every writer takes a shared advisory lock ([`USAGE_WRITE_LOCK`]) before it reads the
//! clock and holds it until it commits; [`watermark`] takes the lock exclusively (without
//! waiting, so it never queues in front of a writer) and reads the clock inside it. So once a
//! watermark `w` is returned, every bound below `w` is committed and visible, and every later
//! writer's bounds are at or above it: reads clipped at `w` never change.

use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use futures::StreamExt;
use paddock_types::machine::MachineState;
use paddock_types::usage::{AdjustmentCategory, UsageAggregateItem, UsageKind, UsageRecord, UsageTotals};
use paddock_types::{ClusterId, MachineId, NodePoolId, TenantId};
use sqlx::Row;
use uuid::Uuid;

use crate::{Conn, Store, StoreError};

/// The advisory lock key of usage writes ("paddusag").
pub const USAGE_WRITE_LOCK: i64 = 0x7061_6464_7573_6167;

/// Whole seconds of the transaction's clock, UTC.
const NOW: &str = "date_trunc('second', clock_timestamp(), 'UTC')";

/// Joins the usage writers (shared): a watermark waits for this transaction's commit.
pub(crate) async fn join_writers(conn: &mut Conn) -> Result<(), StoreError> {
    sqlx::query("select pg_advisory_xact_lock_shared($1)").bind(USAGE_WRITE_LOCK).execute(conn).await?;
    Ok(())
}

/// The usage side of a machine's state change, in its transaction: becoming `active` opens its
/// segment; leaving `active`/`releasing` for anything else (the power-off that ends a release,
/// maintenance) closes it.
pub async fn on_transition(
    conn: &mut Conn,
    machine: MachineId,
    from: Option<MachineState>,
    to: MachineState,
) -> Result<(), StoreError> {
    use MachineState as S;
    if from == Some(to) {
        // An event in a state (a forced release, a remediation's start or swap): no move.
        return Ok(());
    }
    if to == S::Active {
        open_machine_segment(conn, machine).await?;
    } else if matches!(from, Some(S::Active | S::Releasing)) && to != S::Releasing {
        close_machine_segment(conn, machine, &format!("machine moved to {}", to.as_str())).await?;
    }
    Ok(())
}

/// Opens the machine's segment for its current allocation (once: keyed by the allocation), with
/// its holder, class and GPUs as they are now. True when it opened one.
pub async fn open_machine_segment(conn: &mut Conn, machine: MachineId) -> Result<bool, StoreError> {
    join_writers(conn).await?;
    let done = sqlx::query(&format!(
        "insert into usage_segments (id, kind, tenant_id, cluster_id, node_pool_id, machine_id, allocation_id, \
           machine_class, gpu_model, gpu_count, start_at) \
         select $2, 'machine', m.tenant_id, m.cluster_id, m.node_pool_id, m.id, m.allocation_id, mc.name, \
           mc.gpu_model, mc.gpu_count, {NOW} \
         from machines m join machine_classes mc on mc.id = m.machine_class_id \
         where m.id = $1 and m.allocation_id is not null \
         on conflict (allocation_id) do nothing"
    ))
    .bind(machine.uuid())
    .bind(Uuid::now_v7())
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Closes the machine's open segment now, with `reason` (the release's power-off, a forced
/// release), and writes the credit of a remediation of that tenancy, if it earned one
/// ([`crate::credit::write`]), in the same transaction. Guarded on `end_at is null`: a repeat
/// closes nothing. True when it closed one.
pub async fn close_machine_segment(conn: &mut Conn, machine: MachineId, reason: &str) -> Result<bool, StoreError> {
    join_writers(conn).await?;
    let closed: Option<Uuid> = sqlx::query_scalar(&format!(
        "update usage_segments set end_at = greatest(start_at, {NOW}), close_reason = $2 \
         where machine_id = $1 and kind = 'machine' and end_at is null returning id"
    ))
    .bind(machine.uuid())
    .bind(reason)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(segment) = closed else {
        return Ok(false);
    };
    crate::credit::write(conn, segment).await?;
    Ok(true)
}

/// Opens the cluster's control-plane segment when it is first `ready` (never again after; never
/// once its deletion started).
pub async fn open_control_plane_segment(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
) -> Result<bool, StoreError> {
    join_writers(conn).await?;
    let done = sqlx::query(&format!(
        "insert into usage_segments (id, kind, tenant_id, cluster_id, start_at) \
         select $3, 'control_plane', c.tenant_id, c.id, {NOW} from clusters c \
         where c.tenant_id = $1 and c.id = $2 and c.deletion_requested_at is null \
         on conflict (cluster_id) where kind = 'control_plane' do nothing"
    ))
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .bind(Uuid::now_v7())
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Closes the cluster's control-plane segment: its deletion started. Guarded like a machine's.
pub async fn close_control_plane_segment(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
) -> Result<bool, StoreError> {
    join_writers(conn).await?;
    let done = sqlx::query(&format!(
        "update usage_segments set end_at = greatest(start_at, {NOW}), close_reason = 'cluster deletion started' \
         where tenant_id = $1 and cluster_id = $2 and kind = 'control_plane' and end_at is null"
    ))
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// How often [`watermark`] tries for the lock before it gives up (at 5 ms apart: 10 s).
const WATERMARK_TRIES: u32 = 2000;

/// The current watermark: whole seconds below which no usage writer is still open (see the
/// module doc). Never waits in the lock queue, so it never delays a writer.
pub async fn watermark(store: &Store) -> Result<DateTime<Utc>, StoreError> {
    for _ in 0..WATERMARK_TRIES {
        let mut tx = store.begin().await?;
        let at: Option<DateTime<Utc>> =
            sqlx::query_scalar(&format!("select case when pg_try_advisory_xact_lock($1) then {NOW} end"))
                .bind(USAGE_WRITE_LOCK)
                .fetch_one(&mut *tx)
                .await?;
        tx.commit().await?;
        if let Some(at) = at {
            return Ok(at);
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // Writers held the lock for 10 s without a gap: answer "busy, retry" (503), not a 500.
    Err(StoreError::Unavailable(sqlx::Error::PoolTimedOut))
}

/// What a usage read selects: the range, the watermark, and filters (all `None`: everything).
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Inclusive start.
    pub from: DateTime<Utc>,
    /// Exclusive end.
    pub to: DateTime<Utc>,
    /// The snapshot: open segments (and anything written later) are cut here.
    pub as_of: DateTime<Utc>,
    /// Only this tenant's usage.
    pub tenant: Option<TenantId>,
    /// Only this cluster's.
    pub cluster: Option<ClusterId>,
    /// Only this node pool's.
    pub node_pool: Option<NodePoolId>,
    /// Only this machine class's (by name).
    pub machine_class: Option<String>,
    /// Only records of this kind.
    pub kind: Option<UsageKind>,
}

// The pieces of the records' CTEs ([`RECORDS`], [`PAGE_RECORDS`]): a segment's columns clipped
// to `[from, min(to, as_of))`, the filters $4..$8, and the record of a segment or an adjustment.
macro_rules! segment_columns {
    ($start:literal) => {
        concat!(
            "id, kind, tenant_id, cluster_id, node_pool_id, machine_id, machine_class, gpu_count, ",
            $start,
            " as st, least(case when end_at <= $3 then end_at else $3 end, $2) as en"
        )
    };
}
macro_rules! filters {
    ($kind:literal) => {
        concat!(
            "($4::uuid is null or tenant_id = $4) and ($5::uuid is null or cluster_id = $5) \
             and ($6::uuid is null or node_pool_id = $6) and ($7::text is null or machine_class = $7) \
             and ($8::text is null or ",
            $kind,
            ")"
        )
    };
}
macro_rules! segment_record {
    () => {
        "select id, kind, tenant_id, cluster_id, node_pool_id, machine_id, machine_class, gpu_count, \
           st as start_at, en as end_at, \
           case when kind = 'machine' then extract(epoch from en - st)::bigint else 0 end as node_seconds, \
           case when kind = 'machine' then extract(epoch from en - st)::bigint * gpu_count else 0 end as gpu_seconds, \
           case when kind = 'control_plane' then extract(epoch from en - st)::bigint else 0 end as control_plane_seconds, \
           null::text as corrects_period, null::text as category"
    };
}
macro_rules! adjustment_record {
    () => {
        "select id, 'adjustment', tenant_id, cluster_id, node_pool_id, machine_id, machine_class, 0, recorded_at, \
           recorded_at, node_seconds, gpu_seconds, control_plane_seconds, corrects_period, category \
         from usage_adjustments"
    };
}

/// The records of a query, clipped to `[from, min(to, as_of))`, as a CTE `r` with parameters
/// $1..$8. Segments contribute their clipped seconds; adjustments count whole, at the second
/// they were recorded (under a pool filter: those that name the pool).
const RECORDS: &str = concat!(
    "with s as (select ",
    segment_columns!("greatest(start_at, $1)"),
    " from usage_segments where start_at < least($2, $3) and (end_at is null or end_at > $1) and ",
    filters!("kind = $8"),
    "), r as (",
    segment_record!(),
    " from s where en > st union all ",
    adjustment_record!(),
    " where recorded_at >= $1 and recorded_at < least($2, $3) and ",
    filters!("$8 = 'adjustment'"),
    ")"
);

/// [`RECORDS`]' rows of one export page: the first $11 after the keyset position, in the order
/// (clipped start, id), each table read by an index in that order and cut at $11, so that a page
/// costs its own rows whatever the table holds (over the whole CTE the position cannot use an
/// index: every page was a scan of every segment). The order has two parts:
/// - the records clipped to `from` (segments begun at or before it, adjustments recorded at it),
///   by id: read while $12 is true, after the id $13 (none: from the first);
/// - then every later record by (start, id), after ($9, $10): segments by their own start, which
///   is their clipped start there (index `(start_at, id)`), adjustments by `(recorded_at, id)`.
///   Before any of them, the position is (`from`, the greatest id).
const PAGE_RECORDS: &str = concat!(
    "with s as ((select ",
    segment_columns!("greatest(start_at, $1)"),
    " from usage_segments where $12 and start_at <= $1 and start_at < least($2, $3) \
       and (end_at is null or end_at > $1) and ($13::uuid is null or id > $13) \
       and least(case when end_at <= $3 then end_at else $3 end, $2) > $1 and ",
    filters!("kind = $8"),
    " order by id limit $11) union all (select ",
    segment_columns!("start_at"),
    " from usage_segments where (start_at, id) > ($9, $10) and start_at < least($2, $3) \
       and least(case when end_at <= $3 then end_at else $3 end, $2) > start_at and ",
    filters!("kind = $8"),
    " order by start_at, id limit $11)), r as (",
    segment_record!(),
    " from s union all (",
    adjustment_record!(),
    " where $12 and recorded_at = $1 and recorded_at < least($2, $3) and ($13::uuid is null or id > $13) and ",
    filters!("$8 = 'adjustment'"),
    " order by id limit $11) union all (",
    adjustment_record!(),
    " where (recorded_at, id) > ($9, $10) and recorded_at < least($2, $3) and ",
    filters!("$8 = 'adjustment'"),
    " order by recorded_at, id limit $11))"
);

fn bind_query<'q>(sql: &'q str, q: &'q Query) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sql)
        .bind(q.from)
        .bind(q.to)
        .bind(q.as_of)
        .bind(q.tenant.map(TenantId::uuid))
        .bind(q.cluster.map(ClusterId::uuid))
        .bind(q.node_pool.map(NodePoolId::uuid))
        .bind(q.machine_class.as_deref())
        .bind(q.kind.map(UsageKind::as_str))
}

const RECORD_COLUMNS: &str = "id, kind, tenant_id, cluster_id, node_pool_id, machine_id, machine_class, gpu_count, \
    start_at, end_at, node_seconds, gpu_seconds, control_plane_seconds, category";

fn record_from(row: &sqlx::postgres::PgRow) -> Result<UsageRecord, StoreError> {
    let kind: String = row.try_get("kind")?;
    Ok(UsageRecord {
        id: row.try_get("id")?,
        kind: crate::parse_state(&kind, UsageKind::parse)?,
        tenant_id: TenantId(row.try_get("tenant_id")?),
        cluster_id: row.try_get::<Option<Uuid>, _>("cluster_id")?.map(ClusterId),
        node_pool_id: row.try_get::<Option<Uuid>, _>("node_pool_id")?.map(NodePoolId),
        machine_id: row.try_get::<Option<Uuid>, _>("machine_id")?.map(MachineId),
        machine_class: row.try_get("machine_class")?,
        gpu_count: row.try_get("gpu_count")?,
        start: row.try_get("start_at")?,
        end: row.try_get("end_at")?,
        node_seconds: row.try_get("node_seconds")?,
        gpu_seconds: row.try_get("gpu_seconds")?,
        control_plane_seconds: row.try_get("control_plane_seconds")?,
        category: row
            .try_get::<Option<String>, _>("category")?
            .map(|c| crate::parse_state(&c, AdjustmentCategory::parse))
            .transpose()?,
    })
}

/// One page of records ordered by (start, id), after the keyset position `after`.
pub async fn records(
    conn: &mut Conn,
    q: &Query,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: u32,
) -> Result<Vec<UsageRecord>, StoreError> {
    let sql = format!("{PAGE_RECORDS} select {RECORD_COLUMNS} from r order by start_at, id limit $11");
    let rows = bind_page(&sql, q, after, limit).fetch_all(conn).await?;
    rows.iter().map(record_from).collect()
}

/// [`PAGE_RECORDS`]' parameters for the page after `after` (see there): $9..$13.
fn bind_page<'q>(
    sql: &'q str,
    q: &'q Query,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: u32,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let last = Uuid::from_u128(u128::MAX);
    // Records clipped to `from` come first; a position past them is a later record's.
    let (clipped, clipped_after, later) = match after {
        None => (true, None, (q.from, last)),
        Some((start, id)) if start <= q.from => (true, Some(id), (q.from, last)),
        Some(position) => (false, None, position),
    };
    bind_query(sql, q).bind(later.0).bind(later.1).bind(i64::from(limit)).bind(clipped).bind(clipped_after)
}

/// Every record ordered by (start, id), streamed from the database (memory stays flat).
pub fn export<'c>(conn: &'c mut Conn, q: &'c Query, sql: &'c str) -> BoxStream<'c, Result<UsageRecord, StoreError>> {
    bind_query(sql, q).fetch(conn).map(|row| record_from(&row?)).boxed()
}

/// The SQL [`export`] runs (kept by the caller for the stream's lifetime).
pub fn export_sql() -> String {
    format!("{RECORDS} select {RECORD_COLUMNS} from r order by start_at, id")
}

/// A record with what the FOCUS export adds: the tenant's and cluster's names (their ids when
/// they are gone) and, for an adjustment, the period it corrects and whether that period was
/// already closed when it was recorded (a FOCUS `Correction`).
#[derive(Debug, Clone)]
pub struct FocusRecord {
    /// The record.
    pub record: UsageRecord,
    /// The tenant's name.
    pub tenant_name: String,
    /// The cluster's name.
    pub cluster_name: Option<String>,
    /// The period an adjustment corrects.
    pub corrects_period: Option<String>,
    /// The corrected period was closed (its closing watermark at or below the adjustment's
    /// second): both are immutable, so a re-export keeps this.
    pub correction: bool,
}

/// One page of records with their names, ordered by (start, id), after the keyset position
/// `after`: [`records`]' rows and order.
pub async fn focus_records(
    conn: &mut Conn,
    q: &Query,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: u32,
) -> Result<Vec<FocusRecord>, StoreError> {
    let sql = format!(
        "{PAGE_RECORDS} select r.*, coalesce(t.name, r.tenant_id::text) as tenant_name, \
           coalesce(c.name, r.cluster_id::text) as cluster_name, p.period is not null as correction \
         from r left join tenants t on t.id = r.tenant_id left join clusters c on c.id = r.cluster_id \
           left join usage_periods p on p.period = r.corrects_period and p.as_of <= r.start_at \
         order by r.start_at, r.id limit $11"
    );
    let rows = bind_page(&sql, q, after, limit).fetch_all(conn).await?;
    rows.iter()
        .map(|row| {
            Ok(FocusRecord {
                record: record_from(row)?,
                tenant_name: row.try_get("tenant_name")?,
                cluster_name: row.try_get("cluster_name")?,
                corrects_period: row.try_get("corrects_period")?,
                correction: row.try_get("correction")?,
            })
        })
        .collect()
}

/// One change of a class's list price: from then on (whole seconds) the price is `price`
/// (`(currency, millionths per node hour)`, or none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceChange {
    /// The class's name.
    pub machine_class: String,
    /// When it took effect.
    pub from: DateTime<Utc>,
    /// The price from then on.
    pub price: Option<(String, i64)>,
}

/// Every price change that took effect before `as_of`, by class and time (a short list: one
/// row per class and change).
pub async fn price_history(conn: &mut Conn, as_of: DateTime<Utc>) -> Result<Vec<PriceChange>, StoreError> {
    type Row = (String, DateTime<Utc>, Option<String>, Option<i64>);
    let rows: Vec<Row> = sqlx::query_as(
        "select machine_class, effective_from, currency, (node_hour * 1000000)::bigint \
         from machine_class_prices where effective_from < $1 order by machine_class, effective_from",
    )
    .bind(as_of)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(machine_class, from, currency, micros)| PriceChange { machine_class, from, price: currency.zip(micros) })
        .collect())
}

/// A class's stretch of time without a price: `[from, to)`, unbounded where `None`.
#[derive(Debug, Clone)]
pub struct PriceGap {
    /// The class's name.
    pub machine_class: String,
    /// Start (`None`: since always).
    pub from: Option<DateTime<Utc>>,
    /// End (`None`: still).
    pub to: Option<DateTime<Utc>>,
}

/// The first class (by name) of the query's priced records (machine segments and adjustments)
/// that has a FOCUS row (a record cut at UTC midnights) starting where the class has no price:
/// inside one of `gaps`, or anywhere for a class not in `priced`. The caller's transaction runs
/// in UTC (see [`utc`]).
pub async fn first_unpriced(
    conn: &mut Conn,
    q: &Query,
    gaps: &[PriceGap],
    priced: &[String],
) -> Result<Option<String>, StoreError> {
    // A row starts in [g0, g1) when the record does, or when the record started earlier and the
    // first midnight at or after g0 is before both g1 and the record's end.
    let sql = format!(
        "{RECORDS} select min(machine_class) from r \
         where kind <> 'control_plane' and (machine_class <> all($9) or exists ( \
           select 1 from unnest($10::text[], $11::timestamptz[], $12::timestamptz[]) g(class, g0, g1) \
           where g.class = r.machine_class and r.start_at < coalesce(g.g1, 'infinity') \
             and (r.start_at >= coalesce(g.g0, '-infinity') \
               or date_trunc('day', g.g0 + interval '1 day' - interval '1 second') \
                  < least(coalesce(g.g1, 'infinity'), r.end_at))))"
    );
    let row = bind_query(&sql, q)
        .bind(priced)
        .bind(gaps.iter().map(|g| g.machine_class.as_str()).collect::<Vec<_>>())
        .bind(gaps.iter().map(|g| g.from).collect::<Vec<_>>())
        .bind(gaps.iter().map(|g| g.to).collect::<Vec<_>>())
        .fetch_one(conn)
        .await?;
    Ok(row.try_get(0)?)
}

/// Whether the query has any control-plane record.
pub async fn has_control_plane(conn: &mut Conn, q: &Query) -> Result<bool, StoreError> {
    let sql = format!("{RECORDS} select exists (select 1 from r where kind = 'control_plane')");
    Ok(bind_query(&sql, q).fetch_one(conn).await?.try_get(0)?)
}

/// The window unit of an aggregate, as `date_trunc` names it (`None`: one window, the range).
pub type WindowUnit = Option<&'static str>;

/// Sums of the query's records per UTC window and group. The caller's transaction must run in
/// UTC (`set local time zone 'UTC'`, see [`utc`]), so day and month steps are UTC-aligned.
pub async fn aggregate(
    conn: &mut Conn,
    q: &Query,
    unit: WindowUnit,
    group: [bool; 4],
) -> Result<Vec<UsageAggregateItem>, StoreError> {
    let sql = match unit {
        Some(_) => windowed_sql(),
        None => one_window_sql(),
    };
    let mut query = bind_query(&sql, q);
    if let Some(unit) = unit {
        query = query.bind(unit);
    }
    let rows = query.bind(group[0]).bind(group[1]).bind(group[2]).bind(group[3]).fetch_all(conn).await?;
    rows.iter().map(aggregate_item_from).collect()
}

/// The group columns of an aggregate, switched on by the booleans from `$first` on.
fn group_columns(first: u8) -> String {
    let [t, c, p, m] = [first, first + 1, first + 2, first + 3];
    format!(
        "case when ${t} then tenant_id end as g_tenant, case when ${c} then cluster_id end as g_cluster, \
         case when ${p} then node_pool_id end as g_pool, case when ${m} then machine_class end as g_class"
    )
}

/// The range is one window: every record (already clipped to it) is summed whole, with no
/// per-record window series (which cost the provider-wide month most of its time).
fn one_window_sql() -> String {
    // The sums are exact (numeric) and read back as text: a sum past 64 bits is an
    // `Overflow`, not a failing cast.
    format!(
        "{RECORDS} select $1::timestamptz as window_start, $2::timestamptz as window_end, {}, \
           sum(node_seconds)::text as node_seconds, sum(gpu_seconds)::text as gpu_seconds, \
           sum(control_plane_seconds)::text as control_plane_seconds \
         from r group by 3, 4, 5, 6 order by 3, 4, 5, 6",
        group_columns(9)
    )
}

/// One row per record and window (`$9`) it meets; a record of no length (an adjustment) meets one.
fn windowed_sql() -> String {
    format!(
        "{RECORDS}, w as ( \
           select r.*, g as ws, g + ('1 ' || $9)::interval as we \
           from r cross join lateral generate_series( \
             date_trunc($9, r.start_at), greatest(r.start_at, r.end_at - interval '1 second'), ('1 ' || $9)::interval) g), \
         p as ( \
           select ws, we, {}, kind, node_seconds, gpu_seconds, control_plane_seconds, gpu_count, \
             extract(epoch from least(end_at, we) - greatest(start_at, ws))::bigint as part \
           from w) \
         select greatest(ws, $1) as window_start, least(we, $2) as window_end, g_tenant, g_cluster, g_pool, g_class, \
           sum(case kind when 'adjustment' then node_seconds when 'machine' then part else 0 end)::text as node_seconds, \
           sum(case kind when 'adjustment' then gpu_seconds when 'machine' then part * gpu_count else 0 end)::text as gpu_seconds, \
           sum(case kind when 'adjustment' then control_plane_seconds when 'control_plane' then part else 0 end)::text \
             as control_plane_seconds \
         from p group by 1, 2, 3, 4, 5, 6 order by 1, 3, 4, 5, 6",
        group_columns(10)
    )
}

/// An exact sum read back as text, as a 64-bit integer.
fn sum_of(row: &sqlx::postgres::PgRow, column: &'static str) -> Result<i64, StoreError> {
    let text: String = row.try_get(column)?;
    text.parse().map_err(|_| StoreError::Overflow { what: column })
}

fn aggregate_item_from(row: &sqlx::postgres::PgRow) -> Result<UsageAggregateItem, StoreError> {
    let (node_seconds, gpu_seconds) = (sum_of(row, "node_seconds")?, sum_of(row, "gpu_seconds")?);
    Ok(UsageAggregateItem {
        window_start: row.try_get("window_start")?,
        window_end: row.try_get("window_end")?,
        tenant_id: row.try_get::<Option<Uuid>, _>("g_tenant")?.map(TenantId),
        cluster_id: row.try_get::<Option<Uuid>, _>("g_cluster")?.map(ClusterId),
        node_pool_id: row.try_get::<Option<Uuid>, _>("g_pool")?.map(NodePoolId),
        machine_class: row.try_get("g_class")?,
        totals: UsageTotals {
            node_seconds,
            gpu_seconds,
            control_plane_seconds: sum_of(row, "control_plane_seconds")?,
            node_hours: paddock_domain::usage::hours(node_seconds),
            gpu_hours: paddock_domain::usage::hours(gpu_seconds),
        },
    })
}

/// Makes the caller's transaction compute in UTC (windows, month steps).
pub async fn utc(conn: &mut Conn) -> Result<(), StoreError> {
    sqlx::query("set local time zone 'UTC'").execute(conn).await?;
    Ok(())
}

/// A correction to record.
#[derive(Debug, Clone)]
pub struct NewAdjustment<'a> {
    /// The tenant corrected.
    pub tenant: TenantId,
    /// The cluster, if any.
    pub cluster: Option<ClusterId>,
    /// The node pool, if any.
    pub node_pool: Option<NodePoolId>,
    /// The machine, if any.
    pub machine: Option<MachineId>,
    /// What it is.
    pub category: AdjustmentCategory,
    /// The class's name.
    pub machine_class: &'a str,
    /// Signed seconds: node, GPU, control plane.
    pub seconds: [i64; 3],
    /// The period corrected, if any.
    pub corrects_period: Option<&'a str>,
    /// Why.
    pub reason: &'a str,
    /// Who.
    pub actor: &'a str,
}

/// Whether `cluster` is (or was: deleted clusters count) one of `tenant`'s.
pub async fn cluster_of_tenant(conn: &mut Conn, tenant: TenantId, cluster: ClusterId) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar("select exists (select 1 from clusters where id = $2 and tenant_id = $1)")
        .bind(tenant.uuid())
        .bind(cluster.uuid())
        .fetch_one(conn)
        .await?)
}

/// Whether `pool` is (or was: deleted pools count) a pool of `tenant`'s `cluster`.
pub async fn pool_of_cluster(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: ClusterId,
    pool: NodePoolId,
) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(
        "select exists (select 1 from node_pools where id = $3 and cluster_id = $2 and tenant_id = $1)",
    )
    .bind(tenant.uuid())
    .bind(cluster.uuid())
    .bind(pool.uuid())
    .fetch_one(conn)
    .await?)
}

/// Whether `tenant` ever held `machine` (in `cluster` and `pool`, when given).
pub async fn machine_held_by(
    conn: &mut Conn,
    tenant: TenantId,
    cluster: Option<ClusterId>,
    pool: Option<NodePoolId>,
    machine: MachineId,
) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(
        "select exists (select 1 from machine_allocations where machine_id = $4 and tenant_id = $1 \
           and ($2::uuid is null or cluster_id = $2) and ($3::uuid is null or node_pool_id = $3))",
    )
    .bind(tenant.uuid())
    .bind(cluster.map(ClusterId::uuid))
    .bind(pool.map(NodePoolId::uuid))
    .bind(machine.uuid())
    .fetch_one(conn)
    .await?)
}

/// Records an adjustment now (in the open period), as a usage writer; returns its id and time.
pub async fn adjustment_insert(conn: &mut Conn, new: &NewAdjustment<'_>) -> Result<(Uuid, DateTime<Utc>), StoreError> {
    join_writers(conn).await?;
    let id = Uuid::now_v7();
    let at: DateTime<Utc> = sqlx::query_scalar(&format!(
        "insert into usage_adjustments (id, tenant_id, cluster_id, machine_class, node_seconds, gpu_seconds, \
           control_plane_seconds, corrects_period, reason, actor, recorded_at, node_pool_id, machine_id, category) \
         values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, {NOW}, $11, $12, $13) returning recorded_at"
    ))
    .bind(id)
    .bind(new.tenant.uuid())
    .bind(new.cluster.map(ClusterId::uuid))
    .bind(new.machine_class)
    .bind(new.seconds[0])
    .bind(new.seconds[1])
    .bind(new.seconds[2])
    .bind(new.corrects_period)
    .bind(new.reason)
    .bind(new.actor)
    .bind(new.node_pool.map(NodePoolId::uuid))
    .bind(new.machine.map(MachineId::uuid))
    .bind(new.category.as_str())
    .fetch_one(conn)
    .await?;
    Ok((id, at))
}

/// A closed period as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ClosedPeriod {
    /// `YYYY-MM`.
    pub period: String,
    /// The closing watermark.
    pub as_of: DateTime<Utc>,
    /// The manifest's JSON text.
    pub manifest: String,
    /// Its signature.
    pub signature: String,
    /// The key that signed it.
    pub key_id: String,
}

/// A closed period, if it is.
pub async fn period_get(conn: &mut Conn, period: &str) -> Result<Option<ClosedPeriod>, StoreError> {
    Ok(sqlx::query_as("select period, as_of, manifest, signature, key_id from usage_periods where period = $1")
        .bind(period)
        .fetch_optional(conn)
        .await?)
}

/// Stores a closed period once (a concurrent close that lost keeps the winner's); returns the
/// stored one.
pub async fn period_insert(conn: &mut Conn, closed: &ClosedPeriod, actor: &str) -> Result<ClosedPeriod, StoreError> {
    sqlx::query(
        "insert into usage_periods (period, as_of, manifest, signature, key_id, closed_by) \
         values ($1, $2, $3, $4, $5, $6) on conflict (period) do nothing",
    )
    .bind(&closed.period)
    .bind(closed.as_of)
    .bind(&closed.manifest)
    .bind(&closed.signature)
    .bind(&closed.key_id)
    .bind(actor)
    .execute(&mut *conn)
    .await?;
    period_get(conn, &closed.period).await?.ok_or_else(|| StoreError::Corrupt("a stored period vanished".to_owned()))
}
