//! The tenant's Slurm as a health source, on the simulated drivers (the simulated Slurm has a
//! knob to drain a node with a reason, as a tenant's admin does with `scontrol update
//! nodename=... state=drain reason="paddock:hw: ..."`): a node drained with the documented
//! prefix is one `failed` report (source `slurm`) on the machine it runs on, however many runs
//! read it, which swaps the machine but earns no credit; a node drained with paddock's own reason
//! is no fault. The read through slurmrestd itself is proven against the slurmrestd stand-in in
//! paddock-kube's tests; against real Slurm daemons, with the real-Slurm path.

use std::time::Duration;

use paddock_domain::health::SLURM_RELEASE_REASON;
use paddock_testkit::eventually;
use paddock_types::ClusterId;
use serde_json::Value;

use crate::common::{id, machine_class};
use crate::lifecycle::{condition, gpu_and_system, pool_named, slurm, Lab};
use crate::remediation::{ended, held, remediations};

const WAIT: Duration = Duration::from_secs(60);

/// The `slurm` reports of `machine`: (status, the check's detail), oldest first.
async fn slurm_reports(lab: &Lab, machine: &str) -> Vec<(String, String)> {
    sqlx::query_as(
        "select status, checks->0->>'detail' from machine_health_reports \
         where machine_id = $1::uuid and source = 'slurm' order by id",
    )
    .bind(machine)
    .fetch_all(&lab.app.db.pool)
    .await
    .expect("reports")
}

#[tokio::test]
async fn a_node_drained_with_the_fault_prefix_is_reported_once_and_swapped_without_a_credit() {
    // Frequent drift checks: a cluster at rest reads its Slurm nodes at each.
    let lab = Lab::tuned(|s| s.drift_interval = Duration::from_millis(100), |drivers| drivers).await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("gpu", &["s1", "g1", "g2"]).await;
    let created = lab.create(slurm("s", gpu_and_system(2))).await;
    let cluster = id(&created["cluster"]);
    lab.ready(&cluster).await;
    let gpu_pool = pool_named(&created["cluster"], "gpu");
    let gpu: Vec<Value> =
        held(&lab, &cluster).await.into_iter().filter(|m| m["node_pool_id"] == gpu_pool.as_str()).collect();
    let node = |m: &Value| m["node_name"].as_str().expect("node name").to_owned();
    let (broken, other) = (id(&gpu[0]), id(&gpu[1]));
    let cluster_id = ClusterId(cluster.parse().expect("uuid"));

    // One node drains with paddock's own reason (as its release drain leaves it), the other is
    // reported broken by the tenant's admin.
    assert!(lab.world.set_slurm_drain(cluster_id, &node(&gpu[1]), Some(SLURM_RELEASE_REASON)).await.expect("drain"));
    let reason = "paddock:hw: GPU 3 reports uncorrectable ECC errors";
    assert!(lab.world.set_slurm_drain(cluster_id, &node(&gpu[0]), Some(reason)).await.expect("drain"));
    let reported = eventually(WAIT, || async {
        let reports = slurm_reports(&lab, &broken).await;
        (!reports.is_empty()).then_some(reports)
    })
    .await;
    assert_eq!(reported[0].0, "failed");
    assert!(reported[0].1.ends_with(&format!("drained: {reason}")), "{reported:?}");
    // The run that read both nodes rated the one paddock drained not at all.
    let own = slurm_reports(&lab, &other).await;
    assert!(own.is_empty(), "paddock's own drain was read back as a fault: {own:?}");

    // The report started the swap; no spare is free, so the cluster waits for one, and the runs
    // that follow (each reads the still drained node again) record nothing more.
    let started = remediations(&lab, &broken).await;
    assert_eq!((started.len(), started[0].0.as_str(), started[0].1.as_str()), (1, "awaiting_spare", "slurm"));
    eventually(WAIT, || async {
        let c = lab.cluster(&cluster).await;
        (condition(&c, "NodesReady")["reason"] == "AwaitingSpare").then_some(())
    })
    .await;
    assert_eq!(slurm_reports(&lab, &broken).await.len(), 1, "a drain is one report, not one per read");

    // A spare: the machine is replaced and goes to maintenance, and nothing is credited (the
    // tenant controls its drain reasons).
    let spare = lab.enroll("gpu", &["g3"]).await.remove(0);
    lab.machine_in(&spare, "active").await;
    let m = lab.machine_in(&broken, "maintenance").await;
    assert!(m["maintenance_reason"].as_str().is_some_and(|r| r.contains(reason)), "{m}");
    assert_eq!(ended(&lab, &broken).await.3.as_deref(), Some("replaced"));
    let credits = lab.scalar(&format!("select count(*) from usage_adjustments where machine_id = '{broken}'")).await;
    assert_eq!(credits, 0, "a Slurm drain reason earned a credit");
    let listed = lab.app.get(format!("{}/remediations", lab.cluster_path(&cluster))).token(&lab.tenant_token).send();
    let page = listed.await.expect(200).json();
    assert_eq!(
        (page["items"][0]["source"].as_str(), &page["items"][0]["credited_seconds"]),
        (Some("slurm"), &Value::Null)
    );
    assert_eq!(lab.machine_in(&other, "active").await["state"], "active");
}

/// A node Slurm holds down (here as slurmctld leaves one whose slurmd registered after an
/// unexpected reboot) is no health report and takes no machine away: the cluster stays `ready`
/// and says so in `SlurmNodesUp`, with one `SlurmNodeDown` event, until the tenant resumes it.
#[tokio::test]
async fn a_node_down_in_slurm_shows_in_the_status_and_takes_no_machine() {
    let lab = Lab::tuned(|s| s.drift_interval = Duration::from_millis(100), |drivers| drivers).await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("gpu", &["s1", "g1"]).await;
    let created = lab.create(slurm("s", gpu_and_system(1))).await;
    let cluster = id(&created["cluster"]);
    lab.ready(&cluster).await;
    let gpu_pool = pool_named(&created["cluster"], "gpu");
    let gpu = held(&lab, &cluster).await.into_iter().find(|m| m["node_pool_id"] == gpu_pool.as_str()).expect("gpu");
    let (machine, node) = (id(&gpu), gpu["node_name"].as_str().expect("node name").to_owned());
    let cluster_id = ClusterId(cluster.parse().expect("uuid"));
    let up = |c: &Value| condition(c, "SlurmNodesUp").clone();
    eventually(WAIT, || async { (up(&lab.cluster(&cluster).await)["status"] == "True").then_some(()) }).await;

    let reason = "Node unexpectedly rebooted";
    assert!(lab.world.set_slurm_down(cluster_id, &node, Some(reason)).await.expect("down"));
    let c = eventually(WAIT, || async {
        let c = lab.cluster(&cluster).await;
        (up(&c)["status"] == "False").then_some(c)
    })
    .await;
    assert_eq!(up(&c)["reason"], "SlurmNodeDown");
    assert_eq!(up(&c)["message"], format!("down in Slurm: {node} on {node} ({reason})").as_str());
    // The cluster stays ready: one event, no health report, no swap.
    let events_path = format!("{}/events", lab.cluster_path(&cluster));
    let down_events = || async {
        let page = lab.app.get(&events_path).token(&lab.tenant_token).send().await.expect(200).json();
        let items = page["items"].as_array().expect("items").clone();
        items.into_iter().filter(|e| e["reason"] == "SlurmNodeDown").count()
    };
    eventually(WAIT, || async { (down_events().await == 1).then_some(()) }).await;
    // Later runs read it again: Slurm's new reason shows, with no second event.
    let reason = "Not responding";
    assert!(lab.world.set_slurm_down(cluster_id, &node, Some(reason)).await.expect("down"));
    let message = format!("down in Slurm: {node} on {node} ({reason})");
    eventually(WAIT, || async { (up(&lab.cluster(&cluster).await)["message"] == message.as_str()).then_some(()) })
        .await;
    let c = lab.cluster(&cluster).await;
    assert_eq!((c["status"]["phase"].as_str(), down_events().await), (Some("ready"), 1), "{}", c["status"]);
    assert!(slurm_reports(&lab, &machine).await.iter().all(|(status, _)| status == "healthy"));
    assert!(remediations(&lab, &machine).await.is_empty(), "a node down in Slurm started a swap");
    assert_eq!(lab.machine_in(&machine, "active").await["cluster_id"], cluster.as_str());

    // The tenant resumes it: up again.
    assert!(lab.world.set_slurm_down(cluster_id, &node, None).await.expect("up"));
    eventually(WAIT, || async { (up(&lab.cluster(&cluster).await)["status"] == "True").then_some(()) }).await;
}
