//! Webhook deliveries that fail: a 410 disables the subscription at once, 3 days of failures
//! disable it and keep its undelivered events 7 days, and a redelivery sends the same event
//! (same `webhook-id`) again. Time is moved by moving the rows' timestamps, never waited for.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use paddock_testkit::{admin, eventually, TestApp};
use paddock_worker::webhook::{Deliverer, DeliveryConfig, SystemLookup};
use serde_json::{json, Value};

use crate::common::{close_period, id};
use crate::webhooks::{app, config, deliverer, loopback_guard, subscribe, Receiver, DEADLINE};

fn worker(app: &TestApp, config: DeliveryConfig) -> Deliverer {
    deliverer(app, loopback_guard(), Arc::new(SystemLookup), config)
}

async fn deliveries(app: &TestApp, hook: &str) -> Vec<Value> {
    let list = app.get(format!("/v1/webhooks/{hook}/deliveries")).token(&admin()).send().await.expect(200).json();
    list["items"].as_array().expect("items").clone()
}

async fn subscription(app: &TestApp, hook: &str) -> Value {
    app.get(format!("/v1/webhooks/{hook}")).token(&admin()).send().await.expect(200).json()
}

async fn count(app: &TestApp, table: &str) -> i64 {
    sqlx::query_scalar(&format!("select count(*) from {table}")).fetch_one(&app.db.pool).await.expect("count")
}

async fn expire(app: &TestApp) -> u64 {
    let mut conn = app.services.store().conn().await.expect("a connection");
    paddock_store::webhook::delivery::expire(&mut conn).await.expect("expiring")
}

/// Ages every event (and its deliveries) of the database by `age`.
async fn age_events(app: &TestApp, age: &str) {
    sqlx::query("update webhook_events set occurred_at = now() - $1::interval")
        .bind(age)
        .execute(&app.db.pool)
        .await
        .expect("ageing the events");
}

#[tokio::test]
async fn a_410_answer_disables_the_subscription_at_once_with_the_reason() {
    let app = app().await;
    let receiver = Receiver::default();
    receiver.gone.store(true, Ordering::SeqCst);
    let url = receiver.serve().await;
    let hook = id(&subscribe(&app, "/v1/webhooks", &admin(), &url, &["usage.period_closed"]).await);
    close_period(&app, "2026-01", "gone-1").await;
    let d = worker(&app, config("w1"));
    eventually(DEADLINE, || async {
        d.tick().await.expect("a round");
        (!receiver.tried.lock().expect("lock").is_empty()).then_some(())
    })
    .await;

    let hook_now = subscription(&app, &hook).await;
    assert_eq!(hook_now["enabled"], false, "{hook_now}");
    assert!(hook_now["disabled_reason"].as_str().is_some_and(|r| r.contains("410")), "{hook_now}");
    let listed = deliveries(&app, &hook).await;
    assert_eq!(listed[0]["state"], "failed", "{listed:?}");
    assert_eq!(listed[0]["attempts"], 1, "given up at the first 410: {listed:?}");
    assert_eq!(d.metrics().attempts("disabled"), 1, "counted as given up");
    assert_eq!(d.metrics().attempts("retried"), 0);
    // Nothing more is tried: a later event is not even fanned out to it.
    close_period(&app, "2026-02", "gone-2").await;
    d.tick().await.expect("a round");
    assert_eq!(receiver.tried.lock().expect("lock").len(), 1);
}

#[tokio::test]
async fn three_days_of_failures_disable_the_subscription_and_keep_its_events_seven_days() {
    let app = app().await;
    let receiver = Receiver::default();
    receiver.fail.store(usize::MAX / 2, Ordering::SeqCst);
    let url = receiver.serve().await;
    let hook = id(&subscribe(&app, "/v1/webhooks", &admin(), &url, &["usage.period_closed"]).await);
    close_period(&app, "2026-01", "expiry-1").await;
    close_period(&app, "2026-02", "expiry-2").await;
    let d = worker(&app, config("w1"));
    eventually(DEADLINE, || async {
        d.tick().await.expect("a round");
        (receiver.tried.lock().expect("lock").len() >= 2).then_some(())
    })
    .await;
    assert_eq!(subscription(&app, &hook).await["enabled"], true, "failing, not yet for 3 days");
    d.read_backlog().await;
    let mut rendered = String::new();
    d.metrics().render(&mut rendered);
    assert!(rendered.contains("paddock_webhook_backlog{stage=\"delivery\"} 2\n"), "{rendered}");

    // The first event has failed for just over 3 days: its next try gives up.
    let first = "select id from webhook_events where subject = '/v1/usage/periods/2026-01'";
    sqlx::query(&format!(
        "update webhook_deliveries set created_at = now() - interval '3 days 1 minute', next_attempt_at = now(), \
         locked_until = null where event_id = ({first})"
    ))
    .execute(&app.db.pool)
    .await
    .expect("ageing the first delivery");
    let disabled = eventually(DEADLINE, || async {
        d.tick().await.expect("a round");
        Some(subscription(&app, &hook).await).filter(|s| s["enabled"] == false)
    })
    .await;
    let reason = disabled["disabled_reason"].as_str().expect("a reason");
    assert!(reason.contains("3 days") && reason.contains("503"), "{reason}");
    let listed = deliveries(&app, &hook).await;
    let states: Vec<&str> = listed.iter().map(|l| l["state"].as_str().expect("state")).collect();
    assert_eq!(states.iter().filter(|s| **s == "failed").count(), 1, "{listed:?}");
    assert_eq!(states.iter().filter(|s| **s == "pending").count(), 1, "{listed:?}");
    // The metrics count the tries, and see no backlog (the subscription is disabled).
    assert!(d.metrics().attempts("retried") >= 2 && d.metrics().attempts("disabled") == 1);
    d.read_backlog().await;
    let mut rendered = String::new();
    d.metrics().render(&mut rendered);
    assert!(rendered.contains("paddock_webhook_backlog{stage=\"delivery\"} 0\n"), "{rendered}");

    // Undelivered events are kept for 7 days: not deleted just before.
    age_events(&app, "6 days 23 hours").await;
    assert_eq!(expire(&app).await, 0);
    assert_eq!((count(&app, "webhook_events").await, count(&app, "webhook_deliveries").await), (2, 2));
    // Re-enabled with the receiver up, the subscription gets both, as listed.
    receiver.fail.store(0, Ordering::SeqCst);
    app.patch(format!("/v1/webhooks/{hook}"))
        .token(&admin())
        .json(&json!({ "enabled": true }))
        .send()
        .await
        .expect(200);
    let got = eventually(DEADLINE, || async {
        d.tick().await.expect("a round");
        Some(receiver.got()).filter(|g| g.len() == 2)
    })
    .await;
    let mut ids: Vec<String> = got.iter().map(|g| g.id.clone()).collect();
    let mut listed_ids: Vec<String> =
        listed.iter().map(|l| l["event_id"].as_str().expect("event id").to_owned()).collect();
    ids.sort();
    listed_ids.sort();
    assert_eq!(ids, listed_ids);
    // After 7 days they are gone, with their deliveries.
    age_events(&app, "7 days 1 minute").await;
    assert_eq!(expire(&app).await, 2);
    assert_eq!(count(&app, "webhook_deliveries").await, 0);
}

#[tokio::test]
async fn a_redelivery_sends_the_same_event_again_under_the_same_webhook_id() {
    let app = app().await;
    let receiver = Receiver::default();
    receiver.fail.store(1, Ordering::SeqCst);
    let url = receiver.serve().await;
    let hook = id(&subscribe(&app, "/v1/webhooks", &admin(), &url, &["usage.period_closed"]).await);
    close_period(&app, "2026-01", "redeliver").await;
    // The next retry would be an hour after the failure.
    let hourly =
        DeliveryConfig { retry_base: Duration::from_secs(3600), retry_cap: Duration::from_secs(3600), ..config("w1") };
    let d = worker(&app, hourly);
    eventually(DEADLINE, || async {
        d.tick().await.expect("a round");
        (!receiver.tried.lock().expect("lock").is_empty()).then_some(())
    })
    .await;
    let failed = deliveries(&app, &hook).await[0].clone();
    assert_eq!((failed["state"].as_str(), failed["attempts"].as_i64()), (Some("pending"), Some(1)), "{failed}");
    assert_eq!(d.tick().await.expect("a round"), 0, "the retry is not due yet");

    // The receiver is up: a redelivery sends it now, under the id of the failed try.
    let redeliver = format!("/v1/webhooks/{hook}/deliveries/{}/redeliver", id(&failed));
    app.post(&redeliver).token(&admin()).send().await.expect(202);
    let got = eventually(DEADLINE, || async {
        d.tick().await.expect("a round");
        Some(receiver.got()).filter(|g| !g.is_empty())
    })
    .await;
    let tried = receiver.tried.lock().expect("lock").clone();
    assert_eq!(got[0].id, tried[0], "the same webhook-id as the failed try");
    assert_eq!(failed["event_id"].as_str(), Some(got[0].id.as_str()));

    // A delivered event may be redelivered too: the same event again.
    app.post(&redeliver).token(&admin()).send().await.expect(202);
    let again = eventually(DEADLINE, || async {
        d.tick().await.expect("a round");
        Some(receiver.got()).filter(|g| g.len() == 2)
    })
    .await;
    assert_eq!((again[1].id.as_str(), again[1].body.as_str()), (got[0].id.as_str(), got[0].body.as_str()));
}
