//! focus: the FOCUS export (docs/billing.md) on the real PostgreSQL, checked against the FOCUS 1.2
//! specification's own column files (PADDOCK_TEST_FOCUS_SPEC, unpacked by scripts/focus-spec from
//! the pinned tarball): every mandatory column is present, every FOCUS column's values have the
//! column's data type, and no value is null where the column allows none. Rows are cut at UTC
//! midnights and priced with the price in force at their ChargePeriodStart; a price change is
//! audited and kept in the history; no price or no provider name is a 409 naming what is missing.

use std::collections::HashMap;
use std::path::PathBuf;

use paddock_service::usage::{UsageSettings, FOCUS_COLUMNS};
use paddock_testkit::{admin, skip, token, TestApp};
use serde_json::json;
use uuid::Uuid;

/// A column as the specification defines it.
#[derive(Debug)]
struct SpecColumn {
    mandatory: bool,
    nullable: bool,
    data_type: String,
}

fn spec_dir() -> PathBuf {
    let dir = std::env::var("PADDOCK_TEST_FOCUS_SPEC")
        .expect("PADDOCK_TEST_FOCUS_SPEC: the FOCUS 1.2 specification (scripts/test sets it via scripts/focus-spec)");
    PathBuf::from(dir).join("specification/columns")
}

/// The value of a row of a column file's "Content constraints" table, e.g. `Allows nulls`.
fn constraint(text: &str, name: &str) -> Option<String> {
    text.lines()
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
        .find(|cells| cells.len() > 2 && cells[1] == name)
        .map(|cells| cells[2].to_owned())
}

/// Every column file of the specification, by column id.
fn spec_columns() -> HashMap<String, SpecColumn> {
    let mut columns = HashMap::new();
    for entry in std::fs::read_dir(spec_dir()).expect("the specification's columns directory") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a column file");
        let Some(id) = text.split("## Column ID").nth(1).and_then(|t| t.lines().map(str::trim).find(|l| !l.is_empty()))
        else {
            continue;
        };
        let (Some(level), Some(nulls), Some(data_type)) =
            (constraint(&text, "Feature level"), constraint(&text, "Allows nulls"), constraint(&text, "Data type"))
        else {
            panic!("{} lacks its content constraints", path.display());
        };
        columns.insert(
            id.to_owned(),
            SpecColumn { mandatory: level == "Mandatory", nullable: nulls == "True", data_type },
        );
    }
    assert!(columns.len() >= 50, "FOCUS 1.2 defines over 50 columns; read {}", columns.len());
    columns
}

fn decimal(v: &str) -> bool {
    let digits = v.strip_prefix('-').unwrap_or(v);
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, "0"));
    !whole.is_empty() && !fraction.is_empty() && (whole.bytes().chain(fraction.bytes())).all(|b| b.is_ascii_digit())
}

fn date_time(v: &str) -> bool {
    v.len() == 20 && chrono::DateTime::parse_from_rfc3339(v).is_ok() && v.ends_with('Z') && v.as_bytes()[10] == b'T'
}

pub(crate) async fn focus_app(provider: Option<&str>) -> TestApp {
    let settings = UsageSettings { billing_provider_name: provider.map(str::to_owned), ..UsageSettings::default() };
    TestApp::with_services(move |s| s.with_usage_settings(settings)).await
}

pub(crate) async fn class_with_price(app: &TestApp, name: &str, price: serde_json::Value) {
    app.post("/v1/machine-classes")
        .token(&admin())
        .json(&json!({ "name": name, "cpu_cores": 8, "memory_gib": 64, "gpu_model": "L4", "gpu_count": 2,
                       "price": price }))
        .send()
        .await
        .expect(201);
}

/// Sets a past price directly (the API sets prices from now on; history the tests need is older).
pub(crate) async fn past_price(app: &TestApp, class: &str, from: &str, node_hour: Option<&str>) {
    sqlx::query(
        "insert into machine_class_prices (machine_class, effective_from, currency, node_hour) \
         values ($1, $2::timestamptz, case when $3::numeric is null then null else 'EUR' end, $3::numeric)",
    )
    .bind(class)
    .bind(from)
    .bind(node_hour)
    .execute(&app.db.pool)
    .await
    .expect("a past price");
}

pub(crate) async fn segment(app: &TestApp, tenant: Uuid, class: Option<&str>, start: &str, end: &str) {
    let kind = if class.is_some() { "machine" } else { "control_plane" };
    let id = || class.map(|_| Uuid::now_v7());
    sqlx::query(
        "insert into usage_segments (id, kind, tenant_id, cluster_id, node_pool_id, machine_id, allocation_id, \
           machine_class, gpu_count, start_at, end_at, close_reason) \
         values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::timestamptz, $11::timestamptz, 'fixture')",
    )
    .bind(Uuid::now_v7())
    .bind(kind)
    .bind(tenant)
    .bind(Uuid::now_v7())
    .bind(id())
    .bind(id())
    .bind(id())
    .bind(class)
    .bind(if class.is_some() { 2 } else { 0 })
    .bind(start)
    .bind(end)
    .execute(&app.db.pool)
    .await
    .expect("a segment");
}

pub(crate) fn rows(body: &[u8]) -> (Vec<String>, Vec<HashMap<String, String>>) {
    let text = String::from_utf8(body.to_vec()).expect("utf-8");
    let mut lines = text.lines();
    let header: Vec<String> = lines.next().expect("a header").split(',').map(str::to_owned).collect();
    let rows = lines
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            assert_eq!(cells.len(), header.len(), "a row has every column: {l}");
            header.iter().cloned().zip(cells.into_iter().map(str::to_owned)).collect()
        })
        .collect();
    (header, rows)
}

/// A tenant `acme` with a priced class (2, then 3.5 EUR per node hour from 2026-10-02T12:00Z), a
/// machine segment across two midnights and the price change, a control plane, a correction of
/// the closed September, an adjustment of the open October and a credit.
async fn fixture(app: &TestApp) -> Uuid {
    let tenant: Uuid = crate::common::id(&crate::common::tenant(app, "acme").await).parse().expect("uuid");
    class_with_price(app, "gpu-l4", serde_json::Value::Null).await;
    past_price(app, "gpu-l4", "2026-09-01T00:00:00Z", Some("2")).await;
    past_price(app, "gpu-l4", "2026-10-02T12:00:00Z", Some("3.5")).await;
    // Across two midnights and the price change; a control plane; a correction.
    segment(app, tenant, Some("gpu-l4"), "2026-10-01T22:00:00Z", "2026-10-03T01:00:00Z").await;
    segment(app, tenant, None, "2026-10-01T00:00:00Z", "2026-10-01T06:00:00Z").await;
    // September is closed (its watermark before both adjustments), October is not: only the
    // correction of September is a FOCUS Correction.
    sqlx::query(
        "insert into usage_periods (period, as_of, manifest, signature, key_id, closed_by) \
         values ('2026-09', '2026-10-01T01:00:00Z', '{}', 'x', 'k', 'test')",
    )
    .execute(&app.db.pool)
    .await
    .expect("a closed period");
    for (seconds, period, at) in [(-3600, "2026-09", "2026-10-03T10:00:00Z"), (1800, "2026-10", "2026-10-03T11:00:00Z")]
    {
        sqlx::query(
            "insert into usage_adjustments (id, tenant_id, machine_class, node_seconds, gpu_seconds, \
               control_plane_seconds, corrects_period, reason, actor, recorded_at) \
             values ($1, $2, 'gpu-l4', $3, $3 * 2, 0, $4, 'refund', 'test', $5::timestamptz)",
        )
        .bind(Uuid::now_v7())
        .bind(tenant)
        .bind(seconds)
        .bind(period)
        .bind(at)
        .execute(&app.db.pool)
        .await
        .expect("an adjustment");
    }
    // A credit for a failed machine of a pool: a FOCUS Credit row.
    sqlx::query(
        "insert into usage_adjustments (id, tenant_id, machine_class, node_seconds, gpu_seconds, \
           control_plane_seconds, reason, actor, recorded_at, category, node_pool_id, machine_id) \
         values ($1, $2, 'gpu-l4', -720, -1440, 0, 'credit', 'test', '2026-10-03T12:00:00Z', 'credit', $3, $4)",
    )
    .bind(Uuid::now_v7())
    .bind(tenant)
    .bind(Uuid::now_v7())
    .bind(Uuid::now_v7())
    .execute(&app.db.pool)
    .await
    .expect("a credit");
    tenant
}

const RANGE: &str = "from=2026-10-01T00:00:00Z&to=2026-10-04T00:00:00Z";

#[tokio::test]
async fn the_focus_export_has_every_mandatory_column_with_the_specified_types_and_nulls() {
    let spec = spec_columns();
    let app = focus_app(Some("Example Metal")).await;
    let tenant = fixture(&app).await;

    let resp = app.get(format!("/v1/usage/export?{RANGE}&format=focus")).token(&token(&["billing:reader"], None));
    let resp = resp.send().await.expect(200);
    assert_eq!(resp.header("content-type"), Some("text/csv; charset=utf-8"));
    let (header, rows) = rows(&resp.body);
    assert_eq!(header, FOCUS_COLUMNS);
    for (id, column) in &spec {
        assert!(!column.mandatory || header.contains(id), "the mandatory column {id} is missing");
    }
    for name in &header {
        let Some(column) = spec.get(name) else {
            assert!(name.starts_with("x_"), "{name} is neither a FOCUS column nor x_-prefixed");
            continue;
        };
        for row in &rows {
            let v = &row[name];
            assert!(column.nullable || !v.is_empty(), "{name} allows no nulls: {row:?}");
            let typed = match column.data_type.as_str() {
                "Decimal" => v.is_empty() || decimal(v),
                "Date/Time" => v.is_empty() || date_time(v),
                "String" => true,
                other => panic!("{name} has the data type {other}, which the export does not write"),
            };
            assert!(typed, "{name} = {v:?} is not a {}", column.data_type);
        }
    }

    // The machine segment: three days' rows, the second cut at midnight and priced at its start.
    let machine: Vec<_> = rows
        .iter()
        .filter(|r| r["SkuId"] == "gpu-l4" && !r["ResourceId"].is_empty() && r["ChargeCategory"] == "Usage")
        .collect();
    let got: Vec<(&str, &str, &str, &str)> = machine
        .iter()
        .map(|r| {
            (
                r["ChargePeriodStart"].as_str(),
                r["ConsumedQuantity"].as_str(),
                r["ListCost"].as_str(),
                r["x_GpuHours"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("2026-10-01T22:00:00Z", "2.000000", "4.000000", "4.000000"),
            ("2026-10-02T00:00:00Z", "24.000000", "48.000000", "48.000000"),
            ("2026-10-03T00:00:00Z", "1.000000", "3.500000", "2.000000"),
        ]
    );
    for r in &machine {
        assert_eq!((r["BillingCurrency"].as_str(), r["ProviderName"].as_str()), ("EUR", "Example Metal"));
        assert_eq!((r["BillingAccountId"].clone(), r["BillingAccountName"].as_str()), (tenant.to_string(), "acme"));
        assert_eq!(
            (r["BillingPeriodStart"].as_str(), r["BillingPeriodEnd"].as_str()),
            ("2026-10-01T00:00:00Z", "2026-11-01T00:00:00Z")
        );
        assert_eq!(r["BilledCost"], r["ListCost"]);
    }
    let control = rows.iter().find(|r| r["SkuId"] == "control-plane").expect("a control-plane row");
    assert_eq!((control["ListCost"].as_str(), control["ConsumedQuantity"].as_str()), ("0.000000", "6.000000"));
    let correction = rows.iter().find(|r| r["ChargeClass"] == "Correction").expect("a correction row");
    assert_eq!(
        (correction["ListCost"].as_str(), correction["ChargePeriodEnd"].as_str()),
        ("-3.500000", "2026-10-03T10:00:01Z")
    );
    assert_eq!(rows.iter().filter(|r| r["ChargeClass"] == "Correction").count(), 1, "{rows:?}");
    let open =
        rows.iter().find(|r| r["ChargePeriodStart"] == "2026-10-03T11:00:00Z").expect("the open period's adjustment");
    assert_eq!((open["ChargeClass"].as_str(), open["ListCost"].as_str()), ("", "1.750000"));
    let credit = rows.iter().find(|r| r["ChargeCategory"] == "Credit").expect("the credit");
    assert_eq!((credit["ListCost"].as_str(), credit["ChargeFrequency"].as_str()), ("-0.700000", "One-Time"));
    assert_eq!((credit["ConsumedQuantity"].as_str(), credit["ConsumedUnit"].as_str()), ("", ""), "no consumption");
    assert!(!credit["ResourceId"].is_empty() && !credit["x_NodePoolId"].is_empty(), "{credit:?}");

    // The same query at the same snapshot: the same bytes.
    let as_of = resp.header("x-usage-as-of").expect("the export's as_of").to_owned();
    let again = app
        .get(format!("/v1/usage/export?{RANGE}&format=focus&as_of={as_of}"))
        .token(&token(&["billing:reader"], None))
        .send()
        .await
        .expect(200);
    assert_eq!(again.body, resp.body);
}

#[tokio::test]
async fn a_class_without_a_price_or_no_provider_name_is_409_naming_it() {
    let app = focus_app(Some("Example Metal")).await;
    let tenant: Uuid = crate::common::id(&crate::common::tenant(&app, "acme").await).parse().expect("uuid");
    class_with_price(&app, "gpu-l4", serde_json::Value::Null).await;
    segment(&app, tenant, Some("gpu-l4"), "2026-10-01T22:00:00Z", "2026-10-02T01:00:00Z").await;
    let url = format!("/v1/usage/export?{RANGE}&format=focus");
    let problem = app.get(&url).token(&admin()).send().await.problem(409, "price_missing");
    assert!(problem["detail"].to_string().contains("gpu-l4"), "{problem}");
    // A price from after the segment's first row started is not in force there.
    past_price(&app, "gpu-l4", "2026-10-01T23:00:00Z", Some("2")).await;
    app.get(&url).token(&admin()).send().await.problem(409, "price_missing");
    // Removed before a later midnight: that day's row has none.
    past_price(&app, "gpu-l4", "2026-10-01T22:00:00Z", Some("2")).await;
    past_price(&app, "gpu-l4", "2026-10-01T23:30:00Z", None).await;
    app.get(&url).token(&admin()).send().await.problem(409, "price_missing");
    past_price(&app, "gpu-l4", "2026-10-02T00:00:00Z", Some("2")).await;
    app.get(&url).token(&admin()).send().await.expect(200);

    let unnamed = focus_app(None).await;
    let problem = unnamed.get(&url).token(&admin()).send().await.problem(409, "billing_provider_name_missing");
    assert!(problem["detail"].to_string().contains("PADDOCK_BILLING_PROVIDER_NAME"), "{problem}");
}

#[tokio::test]
async fn setting_and_changing_a_price_is_audited_and_kept_in_the_history() {
    let app = focus_app(Some("Example Metal")).await;
    class_with_price(&app, "gpu-l4", json!({ "currency": "USD", "node_hour": "2.50" })).await;
    let class = app.get("/v1/machine-classes/gpu-l4").token(&admin()).send().await.expect(200).json();
    assert_eq!(class["price"], json!({ "currency": "USD", "node_hour": "2.5" }));
    let patched = app
        .patch("/v1/machine-classes/gpu-l4")
        .token(&admin())
        .json(&json!({ "price": { "node_hour": "3" } }))
        .send()
        .await
        .expect(200)
        .json();
    assert_eq!(patched["price"], json!({ "currency": "USD", "node_hour": "3" }));
    app.patch("/v1/machine-classes/gpu-l4").token(&admin()).json(&json!({ "price": null })).send().await.expect(200);
    let history: Vec<(Option<String>, Option<String>)> = sqlx::query_as(
        "select currency, node_hour::text from machine_class_prices where machine_class = 'gpu-l4' \
         order by effective_from",
    )
    .fetch_all(&app.db.pool)
    .await
    .expect("history");
    // Every change keeps its row, in order (one within the second of the last takes effect a
    // second after it).
    let usd = |v: &str| (Some("USD".to_owned()), Some(v.to_owned()));
    assert_eq!(history, [usd("2.500000"), usd("3.000000"), (None, None)]);
    let audited: i64 = sqlx::query_scalar(
        "select count(*) from audit_events where action in ('machine_class.create', 'machine_class.update') \
         and outcome = 'success' and details::text like '%price%'",
    )
    .fetch_one(&app.db.pool)
    .await
    .expect("audit");
    assert!(audited >= 2, "the price changes are audited ({audited})");
    for bad in [json!({ "currency": "usd", "node_hour": "1" }), json!({ "currency": "USD", "node_hour": "1.0000001" })]
    {
        app.patch("/v1/machine-classes/gpu-l4")
            .token(&admin())
            .json(&json!({ "price": bad }))
            .send()
            .await
            .problem(422, "validation_failed");
    }
}

/// The FinOps Foundation's validator (scripts/focus-validator: focus-validator 1.0.0) passes the
/// export under FOCUS **1.0** rules, with the presence checks that script's overrides switch off.
/// It is a second opinion on values and types only: conformance to the 1.2 column list, types and
/// nullability is checked from the 1.2 specification's own files by
/// `the_focus_export_has_every_mandatory_column_with_the_specified_types_and_nulls`.
#[tokio::test]
async fn the_finops_validator_passes_the_export_under_focus_1_0_rules_without_presence_checks() {
    let Some(validator) = skip::env("PADDOCK_TEST_FOCUS_VALIDATOR", "scripts/test sets it via scripts/focus-validator")
    else {
        return;
    };
    let app = focus_app(Some("Example Metal")).await;
    fixture(&app).await;
    let resp = app.get(format!("/v1/usage/export?{RANGE}&format=focus")).token(&admin()).send().await.expect(200);
    let file = std::env::temp_dir().join(format!("paddock-focus-{}.csv", Uuid::now_v7()));
    std::fs::write(&file, &resp.body).expect("the export file");
    let out = std::process::Command::new(&validator).arg(&file).output().expect("running the FOCUS validator");
    let _ = std::fs::remove_file(&file);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the FOCUS validator refused the export:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("Validation succeeded."), "{text}");
}
