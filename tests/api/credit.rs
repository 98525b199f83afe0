//! Credits for failed machines, on the simulated drivers: a provider-side `failed` report (an
//! operator's, the BMC's) on a machine a tenant holds earns one credit adjustment covering the
//! machine from the report to the close of its usage segment, to the second; it shows in the
//! records, the FOCUS export and the remediation; the custody ledger records the report, the swap
//! and the return; the isolation report shows the remediation. A tenant-sourced failure (its
//! Kubernetes, its `replace`) swaps the machine but credits nothing. A second attempt to write a
//! credit writes nothing.

use chrono::{DateTime, Datelike, TimeZone, Utc};
use paddock_service::usage::UsageSettings;
use paddock_store::health;
use paddock_testkit::{admin, eventually};
use paddock_types::health::{HealthCheck, HealthSource, HealthStatus};
use paddock_types::MachineId;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::common::{id, machine_class};
use crate::focus::rows;
use crate::lifecycle::Lab;
use crate::remediation::{ended, held, kubernetes, ready_kubernetes, report, FAILED};

const WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The credit adjustments written for `machine`: (id, node, GPU seconds, pool, remediation).
async fn credits(lab: &Lab, machine: &str) -> Vec<(Uuid, i64, i64, Option<Uuid>, Option<Uuid>)> {
    sqlx::query_as(
        "select id, node_seconds, gpu_seconds, node_pool_id, remediation_id from usage_adjustments \
         where machine_id = $1::uuid and category = 'credit' order by id",
    )
    .bind(machine)
    .fetch_all(&lab.app.db.pool)
    .await
    .expect("credits")
}

/// The failed machine's one usage segment: (id, start, end).
async fn segment(lab: &Lab, machine: &str) -> (Uuid, DateTime<Utc>, DateTime<Utc>) {
    sqlx::query_as("select id, start_at, end_at from usage_segments where machine_id = $1::uuid and kind = 'machine'")
        .bind(machine)
        .fetch_one(&lab.app.db.pool)
        .await
        .expect("one closed segment")
}

/// This UTC month as a usage range.
fn this_month() -> String {
    let now = Utc::now();
    let start = Utc.with_ymd_and_hms(now.year(), now.month(), 1, 0, 0, 0).single().expect("month start");
    let end = if now.month() == 12 {
        Utc.with_ymd_and_hms(now.year() + 1, 1, 1, 0, 0, 0)
    } else {
        Utc.with_ymd_and_hms(now.year(), now.month() + 1, 1, 0, 0, 0)
    };
    let stamp = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    format!("from={}&to={}", stamp(start), stamp(end.single().expect("month end")))
}

/// Waits until the database's clock is in a later whole second than `after`, so what follows is
/// at least one second later in usage.
async fn past(lab: &Lab, after: DateTime<Utc>) {
    eventually(WAIT, || async {
        let later: bool =
            sqlx::query_scalar("select date_trunc('second', clock_timestamp()) > date_trunc('second', $1)")
                .bind(after)
                .fetch_one(&lab.app.db.pool)
                .await
                .expect("the clock");
        later.then_some(())
    })
    .await;
}

/// When the machine's (open) segment started.
async fn started(lab: &Lab, machine: &str) -> DateTime<Utc> {
    sqlx::query_scalar("select start_at from usage_segments where machine_id = $1::uuid and kind = 'machine'")
        .bind(machine)
        .fetch_one(&lab.app.db.pool)
        .await
        .expect("an open segment")
}

/// A machine's custody entries' reasons, and whether its chain verifies.
async fn ledger(lab: &Lab, machine: &str) -> (Vec<String>, Value) {
    let view = lab.app.get(format!("/v1/machines/{machine}/custody")).token(&admin()).send().await.expect(200).json();
    let reasons =
        view["items"].as_array().expect("items").iter().map(|e| e["reason"].as_str().unwrap_or("").to_owned());
    (reasons.collect(), view)
}

#[tokio::test]
async fn an_operators_failed_report_credits_the_fault_window_to_the_second_once_and_shows_everywhere() {
    let mut lab = Lab::new().await;
    let settings = UsageSettings { billing_provider_name: Some("Acme Cloud".into()), ..UsageSettings::default() };
    lab.app.edit_services(move |s| s.with_usage_settings(settings)).await;
    machine_class(&lab.app, "gpu", 8).await;
    let price = json!({ "price": { "currency": "EUR", "node_hour": "3.6" } });
    lab.app.patch("/v1/machine-classes/gpu").token(&admin()).json(&price).send().await.expect(200);
    lab.available("gpu", &["c1"]).await;
    let created = lab.create(kubernetes(1, None)).await;
    let cluster = id(&created["cluster"]);
    let pool = id(&created["cluster"]["node_pools"][0]);
    lab.ready(&cluster).await;
    let failed = id(&held(&lab, &cluster).await[0]);

    // Billed a while, then reported failed; the spare comes a while later (the window is then
    // at least a second at each end, on a fast machine too).
    past(&lab, started(&lab, &failed).await).await;
    let recorded = report(&lab, &failed, FAILED).await;
    let observed: DateTime<Utc> = recorded["observed_at"].as_str().expect("observed_at").parse().expect("time");
    past(&lab, observed).await;
    let spare = lab.enroll("gpu", &["c2"]).await.remove(0);
    lab.machine_in(&spare, "active").await;
    lab.machine_in(&failed, "maintenance").await;
    assert_eq!(ended(&lab, &failed).await.3.as_deref(), Some("replaced"));

    // The credit: from the report's second to the segment's close, for the failed machine's pool.
    let (closed, start, end) = segment(&lab, &failed).await;
    let written = credits(&lab, &failed).await;
    assert_eq!(written.len(), 1, "{written:?}");
    let (_, node, gpu, credit_pool, remediation) = written[0];
    let from = observed.timestamp().max(start.timestamp());
    let window = end.timestamp() - from;
    assert!(observed > start && window > 0, "billed before and after the report: {start} {observed} {end}");
    assert_eq!((node, gpu), (-window, -window * 8), "the fault window [{observed}, {end})");
    assert_eq!(credit_pool.map(|p| p.to_string()), Some(pool.clone()));
    // The tenant pays for the pool what it could use: the failed machine up to the report.
    let billed = end.timestamp() - start.timestamp();
    assert_eq!(billed + node, from - start.timestamp());

    // A second attempt (a replayed close, another worker) writes nothing.
    let mut conn = lab.app.db.pool.acquire().await.expect("conn");
    assert_eq!(paddock_store::credit::write(&mut conn, closed).await.expect("write"), None);
    assert_eq!(credits(&lab, &failed).await.len(), 1);

    // The remediation says what was credited; the tenant's records show a credit of the pool.
    let listed = format!("{}/remediations", lab.cluster_path(&cluster));
    let page = lab.app.get(&listed).token(&lab.tenant_token).send().await.expect(200).json();
    assert_eq!(page["items"][0]["credited_seconds"], json!(window), "{page}");
    assert_eq!(page["items"][0]["id"].as_str(), remediation.map(|r| r.to_string()).as_deref());
    let range = this_month();
    let path = format!("/v1/tenants/{}/usage/records?{range}&kind=adjustment&node_pool_id={pool}", lab.tenant);
    // Read once the watermark has passed the second the credit was written at.
    let records = eventually(WAIT, || async {
        let page = lab.app.get(&path).token(&lab.tenant_token).send().await.expect(200).json();
        (page["items"].as_array().is_some_and(|i| !i.is_empty())).then_some(page)
    })
    .await;
    let as_of = records["as_of"].as_str().expect("as_of");
    let record = &records["items"][0];
    assert_eq!((record["category"].as_str(), record["machine_id"].as_str()), (Some("credit"), Some(failed.as_str())));
    assert_eq!(record["node_seconds"], json!(-window), "{records}");

    // FOCUS: a Credit row of the failed machine, priced, with no consumed quantity.
    let export = format!("/v1/usage/export?{range}&format=focus&as_of={as_of}");
    let export = lab.app.get(export).token(&admin()).send().await;
    let (_, focus) = rows(&export.expect(200).body);
    let credit_rows: Vec<_> = focus.iter().filter(|r| r["ChargeCategory"] == "Credit").collect();
    assert_eq!(credit_rows.len(), 1, "{focus:?}");
    let row = credit_rows[0];
    assert_eq!((row["ResourceId"].as_str(), row["x_NodePoolId"].as_str()), (failed.as_str(), pool.as_str()));
    assert_eq!((row["ChargeFrequency"].as_str(), row["ConsumedQuantity"].as_str()), ("One-Time", ""));
    let cost = format!("-{}.{:06}", window / 1000, (window % 1000) * 1000);
    assert_eq!(row["BilledCost"], cost, "3.6 per hour is 0.001 per second");
    assert!(focus.iter().any(|r| r["ResourceId"] == failed && r["ChargeCategory"] == "Usage"));

    // The ledger: the report that started it, the swap; the isolation report shows it.
    let (reasons, view) = ledger(&lab, &failed).await;
    assert_eq!(view["verified"], true, "{view}");
    let report_id = recorded["id"].as_str().expect("report id");
    assert!(reasons.iter().any(|r| r.starts_with("remediation started") && r.contains(report_id)), "{reasons:?}");
    assert!(
        reasons.iter().any(|r| r.starts_with(&format!("replaced: spare machine {spare} is active"))),
        "{reasons:?}"
    );
    let isolation = format!("/v1/tenants/{}/isolation-report", lab.tenant);
    let isolation = lab.app.get(isolation).token(&lab.tenant_token).send().await.expect(200).json();
    let shown = &isolation["clusters"][0]["remediations"][0];
    assert_eq!(
        (shown["machine_id"].as_str(), shown["spare_machine_id"].as_str()),
        (Some(failed.as_str()), Some(spare.as_str()))
    );
    assert_eq!(shown["credited_seconds"], json!(window), "{isolation}");

    // The operator's return goes through a wipe, recorded against the remediation.
    lab.app.delete(format!("/v1/machines/{failed}/maintenance")).token(&admin()).send().await.expect(202);
    lab.machine_in(&failed, "available").await;
    let (reasons, view) = ledger(&lab, &failed).await;
    assert_eq!(view["verified"], true, "{view}");
    let remediation = remediation.expect("a remediation").to_string();
    assert!(reasons.iter().any(|r| r.starts_with(&format!("returned after remediation {remediation}"))), "{reasons:?}");
}

#[tokio::test]
async fn a_tenant_sourced_failure_swaps_the_machine_but_writes_no_credit() {
    let lab = Lab::new().await;
    let (_, _, cluster) = ready_kubernetes(&lab, &["t1", "t2"], 2).await;
    let machines: Vec<String> = held(&lab, &cluster).await.iter().map(id).collect();
    let (replaced, not_ready) = (&machines[0], &machines[1]);
    past(&lab, started(&lab, not_ready).await.max(started(&lab, replaced).await)).await;

    // The tenant's own request, and its Kubernetes' Node not Ready (what the cluster reconcile
    // records, through the same store call).
    let machines_path = format!("{}/machines", lab.cluster_path(&cluster));
    let reason = json!({ "reason": "slurm drained it: NCCL timeouts" });
    let replace = lab.app.post(format!("{machines_path}/{replaced}/replace")).token(&lab.tenant_token).json(&reason);
    assert_eq!(replace.send().await.status.as_u16(), 202);
    let check = HealthCheck {
        name: "kubernetes.node_ready".into(),
        status: HealthStatus::Failed,
        detail: "Node has not been Ready since a while".into(),
    };
    let mut tx = paddock_store::Store::from_pool(lab.app.db.pool.clone()).begin().await.expect("tx");
    let key = paddock_testkit::ledger_key();
    let machine = MachineId(not_ready.parse().expect("uuid"));
    assert_eq!(
        health::record_changes(&mut tx, &key, HealthSource::Kubernetes, &[(machine, check)]).await.expect("report"),
        1
    );
    tx.commit().await.expect("commit");
    // The spares come a second later: a credit, were one written, would have seconds to cover.
    past(&lab, Utc::now()).await;
    lab.enroll("gpu", &["t3", "t4"]).await;

    for m in [replaced, not_ready] {
        lab.machine_in(m, "maintenance").await;
        assert_eq!(ended(&lab, m).await.3.as_deref(), Some("replaced"));
        let (_, start, end) = segment(&lab, m).await;
        assert!(end.timestamp() - start.timestamp() >= 2, "billed before and after the failure: {start} {end}");
        assert!(credits(&lab, m).await.is_empty(), "no credit for {m}");
    }
    let listed = format!("{}/remediations", lab.cluster_path(&cluster));
    let page = lab.app.get(&listed).token(&lab.tenant_token).send().await.expect(200).json();
    let items = page["items"].as_array().expect("items");
    assert_eq!(items.len(), 2, "{page}");
    assert!(items.iter().all(|r| r["credited_seconds"].is_null()), "{page}");
    let total: i64 = lab.scalar("select count(*) from usage_adjustments").await;
    assert_eq!(total, 0);
}

#[tokio::test]
async fn a_provider_grants_a_credit_naming_a_pool_and_machine_of_the_tenant_and_nothing_else() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    let ids = lab.available("gpu", &["g1", "g2"]).await;
    let created = lab.create(kubernetes(1, None)).await;
    let cluster = id(&created["cluster"]);
    let pool = id(&created["cluster"]["node_pools"][0]);
    lab.ready(&cluster).await;
    let machine = id(&held(&lab, &cluster).await[0]);
    let fleet = ids.iter().find(|m| **m != machine).expect("a machine the tenant never held");
    let grant = |edit: Value| {
        let mut body = json!({ "tenant_id": lab.tenant, "cluster_id": cluster, "node_pool_id": pool,
            "machine_id": machine, "machine_class": "gpu", "node_seconds": -600, "gpu_seconds": -4800,
            "control_plane_seconds": 0, "category": "credit", "reason": "goodwill for the slow network (INC-9)" });
        for (k, v) in edit.as_object().expect("an object") {
            body[k] = v.clone();
        }
        lab.app.post("/v1/usage/adjustments").token(&admin()).json(&body).send()
    };

    for (edit, field) in [
        (json!({ "cluster_id": null }), "node_pool_id"),
        (json!({ "node_pool_id": Uuid::now_v7() }), "node_pool_id"),
        (json!({ "machine_id": fleet }), "machine_id"),
        (json!({ "machine_id": Uuid::now_v7() }), "machine_id"),
    ] {
        let problem = grant(edit.clone()).await.problem(422, "validation_failed");
        let fields: Vec<&str> =
            problem["errors"].as_array().expect("errors").iter().filter_map(|e| e["field"].as_str()).collect();
        assert_eq!(fields, [field], "{edit}: {problem}");
    }
    let refund = grant(json!({ "category": "refund" })).await;
    assert_eq!(refund.status.as_u16(), 422, "an unknown category");
    assert_eq!(lab.scalar("select count(*) from usage_adjustments").await, 0);

    let granted = grant(json!({})).await.expect(201).json();
    assert_eq!((granted["category"].as_str(), granted["remediation_id"].as_str()), (Some("credit"), None));
    assert_eq!(
        (granted["node_pool_id"].as_str(), granted["machine_id"].as_str()),
        (Some(pool.as_str()), Some(machine.as_str()))
    );
    let correction = json!({ "node_pool_id": null, "machine_id": null, "category": null });
    let correction = grant(correction).await;
    assert_eq!(correction.status.as_u16(), 422, "category is correction or credit, never null");
    let plain = json!({ "tenant_id": lab.tenant, "machine_class": "gpu", "node_seconds": 60, "gpu_seconds": 480,
        "control_plane_seconds": 0, "reason": "a correction" });
    let plain = lab.app.post("/v1/usage/adjustments").token(&admin()).json(&plain).send().await.expect(201).json();
    assert_eq!(plain["category"], "correction", "the default");
}
