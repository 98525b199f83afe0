//! A Node of an active machine that goes NotReady: the cluster says so within a drift check and
//! recovers by itself; the machine stays the tenant's; past the grace it is a `failed` health
//! report from the tenant's Kubernetes, and Ready again a `healthy` one.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use paddock_testkit::{admin, eventually};
use serde_json::{json, Value};

use super::{kubernetes, Lab, Tenant, WAIT};
use crate::common::{id, machine_class};

/// Sets the Node's `Ready` condition as a kubelet (or the node lifecycle controller) would.
async fn set_ready(lab: &Lab, cluster: &str, node: &str, ready: bool) {
    let (status, reason) = if ready { ("True", "KubeletReady") } else { ("Unknown", "NodeStatusUnknown") };
    let at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let condition = json!({ "type": "Ready", "status": status, "reason": reason, "lastTransitionTime": at });
    let patch = json!({ "status": { "conditions": [condition] } });
    Api::<Node>::all(lab.tenant_client(cluster))
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("the Node's status");
}

fn condition<'a>(view: &'a Value, type_: &str) -> &'a Value {
    let conditions = view["status"]["conditions"].as_array().expect("conditions");
    conditions.iter().find(|c| c["type"] == type_).unwrap_or_else(|| panic!("no {type_} in {view}"))
}

async fn in_phase(lab: &Lab, t: &Tenant, cluster: &str, phase: &str) -> Value {
    eventually(WAIT, || async {
        let view = lab.cluster(t, cluster).await;
        (view["status"]["phase"] == phase).then_some(view)
    })
    .await
}

/// Waits until the tenant's view of the machine shows `health`.
async fn health_becomes(lab: &Lab, t: &Tenant, machine: &str, health: &str) {
    eventually(WAIT, || async {
        let view = lab.app.get(machine).token(&t.token).send().await.expect(200).json();
        (view["health"] == health).then_some(())
    })
    .await
}

#[tokio::test]
async fn a_node_that_goes_not_ready_while_active_degrades_its_cluster_and_keeps_its_machine() {
    // Drift checks every second or so: the loss is seen by the cluster's periodic check, not by a
    // run this test starts.
    let tuned = |s: &mut paddock_worker::reconcile::Settings| {
        s.drift_interval = Duration::from_secs(1);
        s.node_not_ready_grace = Duration::from_secs(2);
    };
    let Some(lab) = Lab::with(tuned).await else { return };
    machine_class(&lab.app, "cpu", 0).await;
    let machines = lab.enroll("cpu", &["nr1"]).await;
    let t = lab.tenant("acme").await;
    // Without automatic remediation: the failed report past the grace would swap the machine.
    let pools =
        json!([{ "name": "workers", "machine_class": "cpu", "count": 1, "remediation": { "automatic": false } }]);
    let created = lab.create(&t, kubernetes("flaky", pools)).await;
    let (c, pool) = (id(&created["cluster"]), id(&created["cluster"]["node_pools"][0]));
    lab.ready(&t, &c).await;
    let node = lab.nodes(&c).await.into_iter().next().expect("the cluster's Node");

    set_ready(&lab, &c, &node, false).await;
    let degraded = in_phase(&lab, &t, &c, "degraded").await;
    let nodes_ready = condition(&degraded, "NodesReady");
    assert_eq!(
        (&nodes_ready["status"], &nodes_ready["reason"]),
        (&json!("False"), &json!("NodeNotReady")),
        "{degraded}"
    );
    let message = nodes_ready["message"].as_str().expect("message");
    assert!(message.contains("0 of 1 nodes ready") && message.contains(&node), "{message}");
    assert_eq!(condition(&degraded, "Ready")["status"], "False");
    let pool_path = format!("{}/node-pools/{pool}", Lab::path(&t, &c));
    let pool_view = lab.app.get(&pool_path).token(&t.token).send().await.expect(200).json();
    assert_eq!(pool_view["status"]["ready"], 0, "{pool_view}");
    assert_eq!(condition(&pool_view, "NodesReady")["reason"], "NodeNotReady", "{pool_view}");
    // The machine stays active and the tenant's: a NotReady Node hands nothing back by itself.
    let machine = lab.app.get(format!("/v1/machines/{}", machines[0])).token(&admin()).send().await.expect(200).json();
    assert_eq!((&machine["state"], &machine["cluster_id"]), (&json!("active"), &json!(c)), "{machine}");
    // Past the grace: a failed report from the tenant's Kubernetes, which the tenant sees.
    let held = format!("{}/machines/{}", Lab::path(&t, &c), machines[0]);
    health_becomes(&lab, &t, &held, "failed").await;
    let reports = lab.app.get(format!("{held}/health-reports")).token(&t.token).send().await.expect(200).json();
    assert_eq!(reports["items"][0]["source"], "kubernetes", "{reports}");
    assert!(reports["items"][0]["checks"][0]["detail"].as_str().is_some_and(|d| d.contains(&node)), "{reports}");

    set_ready(&lab, &c, &node, true).await;
    let recovered = in_phase(&lab, &t, &c, "ready").await;
    assert_eq!(condition(&recovered, "NodesReady")["status"], "True", "{recovered}");
    let pool_view = lab.app.get(&pool_path).token(&t.token).send().await.expect(200).json();
    assert_eq!(pool_view["status"]["ready"], 1, "{pool_view}");
    health_becomes(&lab, &t, &held, "healthy").await;
    let reports = lab.app.get(format!("{held}/health-reports")).token(&t.token).send().await.expect(200).json();
    let statuses: Vec<&str> =
        reports["items"].as_array().expect("items").iter().filter_map(|r| r["status"].as_str()).collect();
    assert_eq!(statuses, ["healthy", "failed"], "each change once, newest first: {reports}");
    lab.finish().await;
}
