//! Prices of closed periods: the signed manifest lists the list prices in force during the period,
//! and a FOCUS export of the period prices its rows with them even after the history was edited
//! in the database; the price history is append-only (every change keeps its own row), and the
//! runtime role may only read and append it.

use base64::Engine;
use paddock_service::usage::UsageSettings;
use paddock_testkit::{admin, token, TestApp};
use serde_json::json;
use uuid::Uuid;

use crate::common;
use crate::focus::{class_with_price, past_price, rows, segment};

async fn app() -> TestApp {
    let settings =
        UsageSettings { billing_provider_name: Some("Example Metal".to_owned()), ..UsageSettings::default() };
    TestApp::with_services(move |s| s.with_usage_settings(settings)).await
}

async fn billed(app: &TestApp) -> Vec<String> {
    let resp = app
        .get("/v1/usage/export?from=2026-10-01T00:00:00Z&to=2026-10-02T00:00:00Z&format=focus")
        .token(&token(&["billing:reader"], None))
        .send()
        .await
        .expect(200);
    rows(&resp.body).1.iter().map(|r| r["BilledCost"].clone()).collect()
}

#[tokio::test]
async fn a_closed_period_pins_its_prices_in_the_signed_manifest_and_its_focus_export_keeps_them() {
    let app = app().await;
    let tenant: Uuid = crate::common::id(&crate::common::tenant(&app, "acme").await).parse().expect("uuid");
    class_with_price(&app, "gpu-l4", serde_json::Value::Null).await;
    past_price(&app, "gpu-l4", "2026-08-01T00:00:00Z", Some("7")).await;
    past_price(&app, "gpu-l4", "2026-09-01T00:00:00Z", Some("10")).await;
    past_price(&app, "gpu-l4", "2026-10-15T00:00:00Z", Some("12.5")).await;
    segment(&app, tenant, Some("gpu-l4"), "2026-10-01T00:00:00Z", "2026-10-01T02:00:00Z").await;
    assert_eq!(billed(&app).await, ["20.000000"]);
    let closed = common::close_period(&app, "2026-10", "k1").await;
    let manifest = &closed["manifest"];
    // The price in force at the start (not the one it replaced) and the change within.
    assert_eq!(
        manifest["prices"],
        json!([
            { "machine_class": "gpu-l4", "effective_from": "2026-09-01T00:00:00Z", "currency": "EUR", "node_hour": "10" },
            { "machine_class": "gpu-l4", "effective_from": "2026-10-15T00:00:00Z", "currency": "EUR", "node_hour": "12.5" },
        ])
    );
    let keys = app.get("/v1/usage/signing-key").token(&admin()).send().await.expect(200).json();
    let public = base64::engine::general_purpose::STANDARD
        .decode(keys["keys"][0]["public_key"].as_str().expect("key"))
        .expect("b64");
    assert!(paddock_domain::signing::verify(&public, manifest, closed["signature"].as_str().expect("signature")));
    // Someone with the schema owner's rights rewrites the history: the closed month's FOCUS
    // export keeps the prices it was closed with.
    for statement in [
        "alter table machine_class_prices disable trigger machine_class_prices_append_only",
        "update machine_class_prices set node_hour = 100 where machine_class = 'gpu-l4'",
        "alter table machine_class_prices enable trigger machine_class_prices_append_only",
    ] {
        sqlx::query(statement).execute(&app.db.pool).await.expect(statement);
    }
    assert_eq!(billed(&app).await, ["20.000000"]);
}

#[tokio::test]
async fn the_price_history_is_append_only_and_every_change_keeps_its_own_row() {
    let app = app().await;
    class_with_price(&app, "gpu-l4", json!({ "currency": "USD", "node_hour": "1" })).await;
    // Two more changes in one transaction: within one second of each other and of the first.
    let mut tx = app.db.pool.begin().await.expect("begin");
    for price in ["2", "3"] {
        sqlx::query("update machine_classes set price_node_hour = $1::numeric where name = 'gpu-l4'")
            .bind(price)
            .execute(&mut *tx)
            .await
            .expect("a price change");
    }
    tx.commit().await.expect("commit");
    let history: Vec<(chrono::DateTime<chrono::Utc>, String)> = sqlx::query_as(
        "select effective_from, node_hour::text from machine_class_prices where machine_class = 'gpu-l4' \
         order by effective_from",
    )
    .fetch_all(&app.db.pool)
    .await
    .expect("history");
    let prices: Vec<&str> = history.iter().map(|(_, p)| p.as_str()).collect();
    assert_eq!(prices, ["1.000000", "2.000000", "3.000000"], "every change keeps its row");
    assert!(history.windows(2).all(|w| w[0].0 < w[1].0), "in order: {history:?}");
    for statement in [
        "update machine_class_prices set node_hour = 200",
        "delete from machine_class_prices",
        "truncate machine_class_prices",
    ] {
        sqlx::query(statement).execute(&app.db.pool).await.expect_err(statement);
    }
    assert_eq!(app.count("machine_class_prices").await, 3);
}

#[tokio::test]
async fn the_runtime_role_reads_and_appends_the_price_history_and_nothing_more() {
    let app = crate::common::served_as_runtime_role().await;
    // Setting prices appends to the history as the runtime role.
    class_with_price(&app, "gpu-l4", json!({ "currency": "USD", "node_hour": "1" })).await;
    app.patch("/v1/machine-classes/gpu-l4")
        .token(&admin())
        .json(&json!({ "price": { "node_hour": "2" } }))
        .send()
        .await
        .expect(200);
    for statement in [
        "update machine_class_prices set node_hour = 200",
        "delete from machine_class_prices",
        "truncate machine_class_prices",
        "alter table machine_class_prices disable trigger machine_class_prices_append_only",
    ] {
        let refused = sqlx::query(statement).execute(&app.db.pool).await.expect_err(statement);
        let code = refused.as_database_error().and_then(|e| e.code()).map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some("42501"), "{statement}: {refused}");
        let message = refused.to_string();
        assert!(message.contains("permission denied") || message.contains("must be owner"), "{statement}: {message}");
    }
    assert_eq!(app.count("machine_class_prices").await, 2);
}
