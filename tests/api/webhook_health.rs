//! Webhook events of machine health and remediation on the simulated drivers: a failed report on
//! a machine each of two tenants holds is delivered to the provider as `machine.health_reported`,
//! each remediation's start and end to the provider and to its own tenant's subscription only,
//! and each event's `data` is what the API lists for it at that moment.

use std::sync::Arc;

use paddock_testkit::{admin, eventually, TestApp};
use paddock_worker::webhook::SystemLookup;
use serde_json::{json, Value};

use crate::common::{id, machine_class};
use crate::lifecycle::{Lab, Seat};
use crate::remediation::{kubernetes, report, FAILED};
use crate::webhooks::{config, deliverer, events, loopback_guard, start, subscribe, Receiver, DEADLINE};

const REMEDIATION_EVENTS: [&str; 2] = ["remediation.started", "remediation.ended"];

/// A lab whose services accept loopback receivers.
async fn lab() -> Lab {
    let app = TestApp::served_with_services(|s| s.with_webhook_guard(loopback_guard())).await;
    Lab::on(app, |_| {}, |drivers| drivers).await
}

/// The `data` of the last `type_` event written about `subject`, for (the provider, the tenant).
async fn written(lab: &Lab, type_: &str, subject: &str) -> (Value, Option<Value>) {
    sqlx::query_as(
        "select data_provider, data_tenant from webhook_events where type = $1 and subject = $2 \
         order by seq desc limit 1",
    )
    .bind(format!("dev.paddock.{type_}"))
    .bind(subject)
    .fetch_optional(&lab.app.db.pool)
    .await
    .expect("events")
    .unwrap_or_else(|| panic!("no {type_} event about {subject}"))
}

/// The remediation `id` as `path` lists it to `bearer`.
async fn listed(lab: &Lab, path: &str, bearer: &str, remediation: &str) -> Value {
    let page = lab.app.get(path).token(bearer).send().await.expect(200).json();
    let items = page["items"].as_array().expect("items");
    items.iter().find(|r| r["id"] == remediation).unwrap_or_else(|| panic!("{remediation} not in {page}")).clone()
}

/// A one-machine Kubernetes cluster of `seat`, ready: (its path, its machine).
async fn cluster_of(lab: &Lab, seat: &Seat) -> (String, String) {
    let created = lab.create_as(seat, kubernetes(1, None)).await;
    let cluster = id(&created["cluster"]);
    lab.ready_as(seat, &cluster, DEADLINE).await;
    let path = format!("/v1/tenants/{}/clusters/{cluster}", seat.tenant);
    let page = lab.app.get(format!("{path}/machines")).token(&seat.token).send().await.expect(200).json();
    (path, id(&page["items"][0]))
}

#[tokio::test]
async fn health_and_remediation_events_reach_the_provider_and_only_the_owning_tenant() {
    let lab = lab().await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("gpu", &["a1", "b1"]).await;
    let (own, other) = (lab.own(), lab.seat("globex").await);

    // A tenant may not ask for health reports: they are fleet facts.
    let (provider, mine) = (Receiver::default(), Receiver::default());
    let (provider_url, mine_url) = (provider.serve().await, mine.serve().await);
    let hooks = format!("/v1/tenants/{}/webhooks", own.tenant);
    let fleet = json!({ "url": mine_url, "events": ["machine.health_reported"] });
    let refused = lab.app.post(&hooks).token(&own.token).json(&fleet).send().await;
    assert_eq!((refused.status.as_u16(), refused.json()["code"].as_str()), (422, Some("validation_failed")));
    let all = [&REMEDIATION_EVENTS[..], &["machine.health_reported"]].concat();
    subscribe(&lab.app, "/v1/webhooks", &admin(), &provider_url, &all).await;
    subscribe(&lab.app, &hooks, &own.token, &mine_url, &REMEDIATION_EVENTS).await;

    let (a_cluster, a_machine) = cluster_of(&lab, &own).await;
    let (b_cluster, b_machine) = cluster_of(&lab, &other).await;
    let (a_subject, b_subject) = (format!("{a_cluster}/remediations"), format!("{b_cluster}/remediations"));
    // Each machine fails with no spare free: each remediation waits for one.
    let a_report = report(&lab, &a_machine, FAILED).await;
    report(&lab, &b_machine, FAILED).await;

    // What the events carry is what the API lists at that moment, to each audience.
    let reports = format!("/v1/machines/{a_machine}/health-reports");
    let (data, to_tenant) = written(&lab, "machine.health_reported", &reports).await;
    let page = lab.app.get(&reports).token(&admin()).send().await.expect(200).json();
    assert_eq!((data, to_tenant), (page["items"][0].clone(), None), "the provider's view, to the provider only");
    let page = lab.app.get(&a_subject).token(&own.token).send().await.expect(200).json();
    let a_remediation = id(&page["items"][0]);
    let (data, to_tenant) = written(&lab, "remediation.started", &a_subject).await;
    let shown = listed(&lab, &a_subject, &own.token, &a_remediation).await;
    assert_eq!(shown["state"], "awaiting_spare", "{shown}");
    assert_eq!(shown["report_id"], a_report["id"]);
    assert_eq!(data, listed(&lab, "/v1/remediations", &admin(), &a_remediation).await);
    assert_eq!(to_tenant.as_ref(), Some(&shown), "the tenant's data is its API's view");

    // Spares free up: both machines are replaced, and both remediations end.
    lab.enroll("gpu", &["a2", "b2"]).await;
    for machine in [&a_machine, &b_machine] {
        lab.machine_in(machine, "maintenance").await;
    }
    let ended = eventually(DEADLINE, || async {
        let item = listed(&lab, &a_subject, &own.token, &a_remediation).await;
        (item["state"] == "ended").then_some(item)
    })
    .await;
    let (data, to_tenant) = written(&lab, "remediation.ended", &a_subject).await;
    assert_eq!((data.clone(), to_tenant), (ended.clone(), Some(ended)), "the ended remediation as listed");
    assert_eq!(data["outcome"], "replaced");

    let worker = start(deliverer(&lab.app, loopback_guard(), Arc::new(SystemLookup), config("w1")));
    let types_about = |got: &[Value], subject: &str| -> Vec<String> {
        let about = got.iter().filter(|e| e["subject"] == subject);
        about.map(|e| e["type"].as_str().expect("type").to_owned()).collect()
    };
    let both = ["dev.paddock.remediation.started", "dev.paddock.remediation.ended"];
    let to_provider = eventually(DEADLINE, || async {
        let got = events(&provider.got());
        let reported = got.iter().filter(|e| e["type"] == "dev.paddock.machine.health_reported").count();
        let done = types_about(&got, &a_subject) == both && types_about(&got, &b_subject) == both && reported >= 2;
        done.then_some(got)
    })
    .await;
    let b_report = format!("/v1/machines/{b_machine}/health-reports");
    assert!(to_provider.iter().any(|e| e["subject"] == b_report.as_str()), "the provider hears of every machine");
    let to_mine = eventually(DEADLINE, || async {
        let got = events(&mine.got());
        (types_about(&got, &a_subject) == both).then_some(got)
    })
    .await;
    worker.abort();
    // The tenant heard of its own remediations in order, and of nothing of the other tenant's.
    assert_eq!(to_mine.len(), 2, "{to_mine:?}");
    let text = serde_json::to_string(&events(&mine.got())).expect("json");
    for foreign in [&other.tenant, &b_cluster, &b_machine] {
        assert!(!text.contains(foreign.as_str()), "another tenant's {foreign} reached the tenant: {text}");
    }
    assert!(!text.contains("health_reported"), "a fleet fact reached the tenant: {text}");
}
