//! Usage reads, exports, billing periods and adjustments (docs/billing.md).
//!
//! Every read happens at a watermark `as_of` (see `paddock_store::usage`): taken now, or given by
//! the caller (never above the current one), and kept in cursors, so a repeated read at the same
//! `as_of` answers the same bytes. Tenant roles read their own tenant only; `billing:reader` and
//! the provider roles read every tenant; only `provider:admin` closes periods and adjusts.

use bytes::Bytes;
use chrono::{DateTime, Duration, Utc};
use futures::stream::BoxStream;
use futures::StreamExt;
use paddock_domain::usage::{self as math, GroupBy, Period, Range, Window};
use paddock_domain::{cursor, Error, Permission, Result};
use paddock_store::usage::{self as store, ClosedPeriod, NewAdjustment, Query};
use paddock_types::usage::{
    UsageAdjustmentCreate, UsageAdjustmentView, UsageAggregate, UsageKind, UsagePeriodClosed, UsagePeriodView,
    UsageRecord, UsageRecordPage, UsageSigningKey, UsageSigningKeys, UsageTotals,
};
use paddock_types::{ClusterId, NodePoolId, TenantId};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::audit::Done;
use crate::{commit, Body, Ctx, Services};

mod export;
mod focus;
mod prices;
pub use export::ExportSlots;
pub use focus::COLUMNS as FOCUS_COLUMNS;

/// Metering settings (`PADDOCK_USAGE_CLOSE_GRACE`, `PADDOCK_BILLING_PROVIDER_NAME`,
/// `PADDOCK_USAGE_EXPORT_*`).
#[derive(Debug, Clone)]
pub struct UsageSettings {
    /// How long after a period's end it may be closed.
    pub close_grace: Duration,
    /// The provider's name in FOCUS exports.
    pub billing_provider_name: Option<String>,
    /// Exports one caller (JWT subject) may run at once; one more is 429.
    pub export_max_per_caller: usize,
    /// Longest an export waits for the client to take its next chunk before it is cut off.
    pub export_idle_timeout: std::time::Duration,
    /// Longest an export may run before it is cut off.
    pub export_max_duration: std::time::Duration,
}

impl Default for UsageSettings {
    fn default() -> Self {
        Self {
            close_grace: Duration::seconds(3600),
            billing_provider_name: None,
            export_max_per_caller: 4,
            export_idle_timeout: std::time::Duration::from_secs(60),
            export_max_duration: std::time::Duration::from_secs(3600),
        }
    }
}

/// The common parameters of usage reads, as the caller sent them (validated here).
#[derive(Debug, Clone, Default)]
pub struct UsageParams {
    /// Range start (required).
    pub from: Option<String>,
    /// Range end (required).
    pub to: Option<String>,
    /// The snapshot to read at (default: now's watermark).
    pub as_of: Option<String>,
    /// Only this tenant.
    pub tenant_id: Option<TenantId>,
    /// Only this cluster.
    pub cluster_id: Option<ClusterId>,
    /// Only this node pool.
    pub node_pool_id: Option<NodePoolId>,
    /// Only this machine class.
    pub machine_class: Option<String>,
    /// Only this kind (`machine`, `control_plane`, `adjustment`).
    pub kind: Option<String>,
}

/// A records cursor: the snapshot and the keyset position.
#[derive(Debug, Serialize, Deserialize)]
struct RecordCursor {
    as_of: DateTime<Utc>,
    start: DateTime<Utc>,
    id: Uuid,
}

/// An export format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// CSV with a header row.
    Csv,
    /// One JSON record per line and a summary line.
    Ndjson,
    /// CSV in the FinOps FOCUS 1.2 layout, priced (see the `focus` module).
    Focus,
}

impl ExportFormat {
    /// Parses `csv` | `ndjson` (absent: `ndjson`); anything else is 422.
    pub fn parse(text: Option<&str>) -> Result<Self> {
        match text {
            Some("csv") => Ok(Self::Csv),
            None | Some("ndjson") => Ok(Self::Ndjson),
            Some("focus") => Ok(Self::Focus),
            Some(_) => Err(Error::invalid("format", "must be one of csv, ndjson, focus")),
        }
    }

    /// The media type of the body.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Csv | Self::Focus => "text/csv; charset=utf-8",
            Self::Ndjson => "application/x-ndjson",
        }
    }
}

/// A streamed export: its snapshot, media type and body.
pub struct Export {
    /// The watermark it was read at.
    pub as_of: DateTime<Utc>,
    /// The body's media type.
    pub content_type: &'static str,
    /// The body, produced as the client reads it (bounded buffering).
    pub body: BoxStream<'static, std::result::Result<Bytes, std::io::Error>>,
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export").field("as_of", &self.as_of).finish_non_exhaustive()
    }
}

impl Services {
    /// Sets the metering settings.
    pub fn with_usage_settings(mut self, settings: UsageSettings) -> Self {
        self.usage = std::sync::Arc::new(settings);
        self
    }

    /// The scope of a usage read: the caller's reach, narrowed to the path's tenant (404 when
    /// foreign or missing) and to a `tenant_id` filter (a tenant role asking for another: 404).
    async fn usage_scope(
        &self,
        ctx: &Ctx,
        path_tenant: Option<TenantId>,
        filter: Option<TenantId>,
    ) -> Result<Option<TenantId>> {
        let scope = match path_tenant {
            Some(t) => {
                ctx.actor.authorize_tenant(Permission::UsageRead, t, "tenant")?;
                self.require_tenant(t).await?;
                Some(t)
            }
            None => ctx.actor.authorize(Permission::UsageRead)?.tenant(),
        };
        match (scope, filter) {
            (Some(own), Some(asked)) if own != asked => Err(Error::NotFound { kind: "tenant" }),
            (Some(own), _) => Ok(Some(own)),
            (None, asked) => Ok(asked),
        }
    }

    /// Validates the parameters into a store query at a watermark.
    async fn usage_query(
        &self,
        tenant: Option<TenantId>,
        p: &UsageParams,
        max_days: i64,
        as_of: Option<DateTime<Utc>>,
    ) -> Result<Query> {
        let range = Range::parse(p.from.as_deref(), p.to.as_deref(), max_days)?;
        let now = store::watermark(&self.store).await?;
        let given = match (as_of, p.as_of.as_deref()) {
            (Some(at), _) => Some(at),
            (None, Some(text)) => Some(math::parse_optional_instant("as_of", text)?),
            (None, None) => None,
        };
        if given.is_some_and(|at| at > now) {
            return Err(Error::invalid("as_of", "must not be later than the current watermark"));
        }
        Ok(Query {
            from: range.from,
            to: range.to,
            as_of: given.unwrap_or(now),
            tenant,
            cluster: p.cluster_id,
            node_pool: p.node_pool_id,
            machine_class: p.machine_class.clone(),
            kind: p.kind.as_deref().map(parse_kind).transpose()?,
        })
    }

    /// `GET /v1/usage/records` (and the tenant's): one page of clipped records, keyset-paginated
    /// at the cursor's watermark.
    pub async fn usage_records(
        &self,
        ctx: &Ctx,
        path_tenant: Option<TenantId>,
        p: &UsageParams,
        limit: Option<&str>,
        cursor_text: Option<&str>,
    ) -> Result<UsageRecordPage> {
        let tenant = self.usage_scope(ctx, path_tenant, p.tenant_id).await?;
        let page = cursor::PageRequest::parse(limit, None)?;
        let after: Option<RecordCursor> = cursor_text.map(cursor::decode).transpose()?;
        let q = self.usage_query(tenant, p, math::MAX_RECORDS_SPAN_DAYS, after.as_ref().map(|c| c.as_of)).await?;
        let mut conn = self.store.conn().await?;
        let items = store::records(&mut conn, &q, after.map(|c| (c.start, c.id)), page.limit).await?;
        let next_cursor = (items.len() == page.limit as usize)
            .then(|| items.last().map(|r| cursor::encode(&RecordCursor { as_of: q.as_of, start: r.start, id: r.id })))
            .flatten();
        Ok(UsageRecordPage { items, next_cursor, as_of: q.as_of })
    }

    /// `GET /v1/usage/aggregate` (and the tenant's): sums per UTC window and group, with totals.
    pub async fn usage_aggregate(
        &self,
        ctx: &Ctx,
        path_tenant: Option<TenantId>,
        p: &UsageParams,
        window: Option<&str>,
        group_by: Option<&str>,
    ) -> Result<UsageAggregate> {
        let tenant = self.usage_scope(ctx, path_tenant, p.tenant_id).await?;
        let window = Window::parse(window)?;
        let group = GroupBy::parse(group_by)?;
        let q = self.usage_query(tenant, p, math::MAX_AGGREGATE_SPAN_DAYS, None).await?;
        // A range inside one window is that window, clipped: the store then sums records whole
        // instead of cutting each at the window's bounds.
        let window = if window.holds(Range { from: q.from, to: q.to }) { Window::None } else { window };
        let unit = match window {
            Window::Hour => Some("hour"),
            Window::Day => Some("day"),
            Window::Month => Some("month"),
            Window::None => None,
        };
        let groups = [group.tenant_id, group.cluster_id, group.node_pool_id, group.machine_class];
        let mut tx = self.store.begin().await?;
        store::utc(&mut tx).await?;
        let items = store::aggregate(&mut tx, &q, unit, groups).await?;
        commit(tx).await?;
        let totals = totals_of(items.iter().map(|i| &i.totals))?;
        Ok(UsageAggregate { items, totals, as_of: q.as_of })
    }

    /// `GET /v1/usage/export` (and the tenant's): every record ordered by (start, id), streamed in
    /// keyset pages through a small bounded channel (see `export`): memory stays flat in the rows,
    /// and no database connection is held while the client reads. 429 when the caller already
    /// runs its maximum of exports.
    pub async fn usage_export(
        &self,
        ctx: &Ctx,
        path_tenant: Option<TenantId>,
        p: &UsageParams,
        format: Option<&str>,
    ) -> Result<Export> {
        let tenant = self.usage_scope(ctx, path_tenant, p.tenant_id).await?;
        let format = ExportFormat::parse(format)?;
        let slot = self.exports.take(&ctx.actor.subject, self.usage.export_max_per_caller)?;
        let q = self.usage_query(tenant, p, math::MAX_RECORDS_SPAN_DAYS, None).await?;
        let source = match format {
            ExportFormat::Focus => export::Source::Focus(Box::new(
                focus::Focus::prepare(&self.store, self.usage.billing_provider_name.as_deref(), &q).await?,
            )),
            ExportFormat::Csv | ExportFormat::Ndjson => export::Source::Plain(format),
        };
        let bounds = export::Bounds { idle: self.usage.export_idle_timeout, total: self.usage.export_max_duration };
        let (as_of, content_type) = (q.as_of, format.content_type());
        let body = export::spawn(self.store.clone(), q, source, bounds, slot);
        Ok(Export { as_of, content_type, body })
    }

    /// `GET /v1/usage/signing-key`: the published verification key (409 without one).
    pub fn usage_signing_keys(&self, ctx: &Ctx) -> Result<UsageSigningKeys> {
        ctx.actor.authorize(Permission::UsageRead)?;
        let key = self.signing_key().ok_or_else(no_signing_key)?.public_key();
        Ok(UsageSigningKeys {
            keys: vec![UsageSigningKey {
                key_id: key.key_id,
                algorithm: key.algorithm.to_owned(),
                public_key: key.public_key,
                public_key_pem: key.public_key_pem,
            }],
        })
    }

    /// `GET /v1/usage/periods/{period}`: open (with when it may close) or closed (its manifest).
    pub async fn usage_period_view(&self, ctx: &Ctx, period: &str) -> Result<UsagePeriodView> {
        ctx.actor.authorize(Permission::UsageRead)?;
        let period = Period::parse(period)?;
        let mut conn = self.store.conn().await?;
        let closed = store::period_get(&mut conn, &period.name()).await?;
        self.period_view(period, closed.as_ref())
    }

    fn period_view(&self, period: Period, closed: Option<&ClosedPeriod>) -> Result<UsagePeriodView> {
        let closed = closed.map(closed_view).transpose()?;
        Ok(UsagePeriodView {
            period: period.name(),
            start: period.start,
            end: period.end,
            state: if closed.is_some() { "closed" } else { "open" }.to_owned(),
            closable_at: period.end + self.usage.close_grace,
            closed,
        })
    }

    /// `POST /v1/usage/periods/{period}/close`: signs and stores the manifest of the period at
    /// the closing watermark; closing again answers the stored one (`false`: not new).
    pub async fn usage_period_close(
        &self,
        ctx: &Ctx,
        period: &str,
        idempotency_key: bool,
    ) -> Result<(UsagePeriodClosed, bool)> {
        self.audited(ctx, "usage.period.close", "usage_period", async |_audit| {
            ctx.actor.authorize(Permission::UsageWrite)?;
            if !idempotency_key {
                return Err(Error::BadRequest {
                    code: "idempotency_key_required",
                    message: "closing a period requires an Idempotency-Key header".to_owned(),
                });
            }
            let period = Period::parse(period)?;
            let mut tx = self.store.begin().await?;
            if let Some(stored) = store::period_get(&mut tx, &period.name()).await? {
                let details = json!({ "period": stored.period, "already_closed": true });
                return Ok(Done::Commit { tx, value: (closed_view(&stored)?, false), details });
            }
            let key = self.signing_key().ok_or_else(no_signing_key)?.clone();
            let as_of = store::watermark(&self.store).await?;
            if as_of < period.end + self.usage.close_grace {
                return Err(Error::conflict(
                    "period_not_closable",
                    format!("{} may be closed from {} on", period.name(), period.end + self.usage.close_grace),
                ));
            }
            let manifest = self.manifest(period, as_of).await?;
            let signature = key.sign(&manifest);
            let closed = ClosedPeriod {
                period: period.name(),
                as_of,
                manifest: manifest.to_string(),
                signature: signature.signature,
                key_id: signature.key_id,
            };
            let stored = store::period_insert(&mut tx, &closed, &ctx.actor.subject).await?;
            let view = serde_json::to_value(self.period_view(period, Some(&stored))?).map_err(Error::internal)?;
            paddock_store::webhook::emit_period_closed(&mut tx, &stored.period, &view).await?;
            let details = json!({ "period": closed.period, "as_of": as_of });
            Ok(Done::Commit { tx, value: (closed_view(&stored)?, true), details })
        })
        .await
    }

    /// The manifest of `period` at `as_of`: rows, totals per tenant and class, the list prices in
    /// force during the period (`prices`), and the SHA-256 of the canonical (NDJSON) export.
    async fn manifest(&self, period: Period, as_of: DateTime<Utc>) -> Result<Value> {
        let q = Query { from: period.start, to: period.end, as_of, ..Query::default() };
        let mut hasher = Sha256::new();
        let mut rows = 0u64;
        {
            let mut conn = self.store.conn().await?;
            let sql = store::export_sql();
            let mut stream = store::export(&mut conn, &q, &sql);
            let mut line = Vec::new();
            let mut sums = Sums::default();
            while let Some(record) = stream.next().await {
                let record = record?;
                sums.add_record(&record)?;
                line.clear();
                export::ndjson_line(&record, &mut line);
                hasher.update(&line);
                rows += 1;
            }
            line.clear();
            export::ndjson_summary(rows, sums.0, &mut line);
            hasher.update(&line);
        }
        let mut tx = self.store.begin().await?;
        store::utc(&mut tx).await?;
        let groups = store::aggregate(&mut tx, &q, None, [true, false, false, true]).await?;
        let history = store::price_history(&mut tx, as_of).await?;
        commit(tx).await?;
        let prices = prices::manifest_prices(&prices::in_force(&history, period.start, period.end));
        let totals = totals_of(groups.iter().map(|i| &i.totals))?;
        let by_tenant_and_class: Vec<Value> = groups
            .iter()
            .map(|g| {
                json!({ "tenant_id": g.tenant_id, "machine_class": g.machine_class, "node_seconds": g.totals.node_seconds,
                        "gpu_seconds": g.totals.gpu_seconds, "control_plane_seconds": g.totals.control_plane_seconds })
            })
            .collect();
        Ok(json!({
            "version": prices::MANIFEST_VERSION,
            "period": period.name(), "start": period.start, "end": period.end, "as_of": as_of,
            "row_count": rows, "totals": totals, "by_tenant_and_class": by_tenant_and_class,
            "prices": prices,
            "export": { "format": "ndjson", "sha256": hex::encode(hasher.finalize()) },
        }))
    }

    /// `POST /v1/usage/adjustments`: records a signed correction in the open period (audited).
    pub async fn usage_adjustment_create(&self, ctx: &Ctx, body: &Body) -> Result<UsageAdjustmentView> {
        self.audited(ctx, "usage.adjustment.create", "usage_adjustment", async |audit| {
            ctx.actor.authorize(Permission::UsageWrite)?;
            let spec: UsageAdjustmentCreate = body.decode()?;
            audit.target_tenant(spec.tenant_id);
            validate_adjustment(&spec)?;
            self.require_tenant(spec.tenant_id).await?;
            let new = NewAdjustment {
                tenant: spec.tenant_id,
                cluster: spec.cluster_id,
                node_pool: spec.node_pool_id,
                machine: spec.machine_id,
                category: spec.category,
                machine_class: &spec.machine_class,
                seconds: [spec.node_seconds, spec.gpu_seconds, spec.control_plane_seconds],
                corrects_period: spec.corrects_period.as_deref(),
                reason: &spec.reason,
                actor: &ctx.actor.subject,
            };
            let mut tx = self.store.begin().await?;
            adjustment_targets(&mut tx, &spec).await?;
            let (id, recorded_at) = store::adjustment_insert(&mut tx, &new).await?;
            audit.target(id, Some(spec.tenant_id));
            let details = serde_json::to_value(&spec).unwrap_or_default();
            let value = UsageAdjustmentView {
                id,
                tenant_id: spec.tenant_id,
                cluster_id: spec.cluster_id,
                node_pool_id: spec.node_pool_id,
                machine_id: spec.machine_id,
                category: spec.category,
                remediation_id: None,
                machine_class: spec.machine_class,
                node_seconds: spec.node_seconds,
                gpu_seconds: spec.gpu_seconds,
                control_plane_seconds: spec.control_plane_seconds,
                corrects_period: spec.corrects_period,
                reason: spec.reason,
                recorded_at,
            };
            Ok(Done::Commit { tx, value, details })
        })
        .await
    }
}

/// What an adjustment names belongs to its tenant: the cluster, the pool (of that cluster), the
/// machine (held by the tenant, there); 422 naming the field otherwise.
async fn adjustment_targets(conn: &mut paddock_store::Conn, spec: &UsageAdjustmentCreate) -> Result<()> {
    let tenant = spec.tenant_id;
    if let Some(cluster) = spec.cluster_id {
        if !store::cluster_of_tenant(conn, tenant, cluster).await? {
            return Err(Error::invalid("cluster_id", "must name a cluster of the tenant tenant_id"));
        }
    }
    if let Some(pool) = spec.node_pool_id {
        let Some(cluster) = spec.cluster_id else {
            return Err(Error::invalid("node_pool_id", "needs cluster_id, the cluster of the pool"));
        };
        if !store::pool_of_cluster(conn, tenant, cluster, pool).await? {
            return Err(Error::invalid("node_pool_id", "must name a node pool of the cluster cluster_id"));
        }
    }
    if let Some(machine) = spec.machine_id {
        if !store::machine_held_by(conn, tenant, spec.cluster_id, spec.node_pool_id, machine).await? {
            return Err(Error::invalid(
                "machine_id",
                "must name a machine the tenant held (in cluster_id and node_pool_id, when given)",
            ));
        }
    }
    Ok(())
}

fn validate_adjustment(spec: &UsageAdjustmentCreate) -> Result<()> {
    let mut c = paddock_domain::validate::Checks::new();
    c.dns_label("machine_class", &spec.machine_class, 63);
    let bound = format!("must be from -{0} to {0} seconds", math::MAX_ADJUSTMENT_SECONDS);
    for (field, seconds) in [
        ("node_seconds", spec.node_seconds),
        ("gpu_seconds", spec.gpu_seconds),
        ("control_plane_seconds", spec.control_plane_seconds),
    ] {
        c.check(seconds.unsigned_abs() <= math::MAX_ADJUSTMENT_SECONDS.unsigned_abs(), field, bound.as_str());
    }
    if let Some(period) = &spec.corrects_period {
        c.check(Period::parse(period).is_ok(), "corrects_period", "must be a UTC month as YYYY-MM");
    }
    c.text("reason", spec.reason.trim(), 1000);
    c.finish()
}

fn parse_kind(text: &str) -> Result<UsageKind> {
    UsageKind::parse(text).ok_or_else(|| Error::invalid("kind", "must be one of machine, control_plane, adjustment"))
}

fn no_signing_key() -> Error {
    Error::conflict("signing_key_missing", "no signing key is configured: set PADDOCK_USAGE_SIGNING_KEY")
}

fn closed_view(stored: &ClosedPeriod) -> Result<UsagePeriodClosed> {
    let manifest: Value = serde_json::from_str(&stored.manifest).map_err(Error::internal)?;
    Ok(UsagePeriodClosed { manifest, signature: stored.signature.clone(), key_id: stored.key_id.clone() })
}

/// Sums of node, GPU and control-plane seconds, checked: past the range of a 64-bit integer they
/// are 409 `usage_overflow`, never a wrapped number.
#[derive(Debug, Default, Clone, Copy)]
struct Sums([i64; 3]);

impl Sums {
    fn add(&mut self, row: [i64; 3]) -> Result<()> {
        for (sum, v) in self.0.iter_mut().zip(row) {
            *sum = sum.checked_add(v).ok_or_else(overflow)?;
        }
        Ok(())
    }

    fn add_record(&mut self, r: &UsageRecord) -> Result<()> {
        self.add([r.node_seconds, r.gpu_seconds, r.control_plane_seconds])
    }

    fn totals(self) -> UsageTotals {
        let [node_seconds, gpu_seconds, control_plane_seconds] = self.0;
        UsageTotals {
            node_seconds,
            gpu_seconds,
            control_plane_seconds,
            node_hours: math::hours(node_seconds),
            gpu_hours: math::hours(gpu_seconds),
        }
    }
}

fn overflow() -> Error {
    Error::conflict(
        "usage_overflow",
        "the usage sums exceed the range of a 64-bit integer (9223372036854775807 seconds): narrow the query",
    )
}

fn totals_of<'a>(items: impl Iterator<Item = &'a UsageTotals>) -> Result<UsageTotals> {
    let mut sums = Sums::default();
    for t in items {
        sums.add([t.node_seconds, t.gpu_seconds, t.control_plane_seconds])?;
    }
    Ok(sums.totals())
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
