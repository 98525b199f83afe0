//! The nudge (`slurm/nudge.rs`) against a real API server: once slurmctld answers (slurmctld and
//! slurmrestd ready, whatever else still waits), a NodeSet still without its pods is annotated (an update the operator reconciles at once), not again
//! within 30 s, again when the last nudge is older; a NodeSet with its pods, or a ping without an
//! answer, writes nothing, and paddock's own apply keeps the annotation of the other manager.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::chrono::{DateTime, Duration, SecondsFormat, Utc};
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::Api;
use paddock_kube::slurm::nudge::{ANSWERED_AT, NUDGE_MANAGER};
use paddock_kube::slurm::{self, MARIADB};
use paddock_kube::SlinkyDriver;
use serde_json::json;

use crate::slurm::{
    access, cr, desired, play_deployment, play_nodeset, play_statefulset, pool, secrets, server, set_ready, settings,
    unique, StandInProbe,
};

fn answered_at(nodeset: &DynamicObject) -> Option<DateTime<Utc>> {
    let stamp = nodeset.metadata.annotations.as_ref()?.get(ANSWERED_AT)?;
    Some(DateTime::parse_from_rfc3339(stamp).expect("an RFC 3339 stamp").with_timezone(&Utc))
}

#[tokio::test]
async fn a_nodeset_without_its_pods_is_nudged_once_slurmctld_answers_and_not_more_often() {
    let Some(server) = server().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let (ns, cpu, gpu) = (unique("slurm"), unique("cpu"), unique("gpu"));
    let probe = Arc::new(StandInProbe::default());
    let driver = SlinkyDriver::new(settings(&ns), probe.clone());
    let want = desired(vec![pool(&cpu, 2, 0, Vec::new()), pool(&gpu, 1, 0, Vec::new())], &secrets());
    let ensure = || async { driver.ensure_slurm(&tenant, &want).await.expect("ensure") };
    let nodeset = |name: String| {
        let (client, ns) = (client.clone(), ns.clone());
        async move { cr(&client, &ns, "NodeSet", &name).await.expect("the NodeSet") }
    };

    // An answer before slurmctld and slurmrestd are ready is not asked for.
    probe.up.store(true, Ordering::SeqCst);
    ensure().await;
    assert_eq!(answered_at(&nodeset(gpu.clone()).await), None, "nothing ready, no nudge");
    probe.up.store(false, Ordering::SeqCst);

    // slurmctld and slurmrestd ready, MariaDB, slurmdbd and the login pods not yet; `cpu` has
    // its pods (the operator's status says so), `gpu` none.
    play_statefulset(&client, &ns, slurm::CONTROLLER_WORKLOAD).await;
    play_deployment(&client, &ns, slurm::RESTAPI_SERVICE, 1).await;
    play_nodeset(&client, &ns, &cpu, 2).await;
    let waiting = format!("MariaDbReady; SlurmAccountingReady; SlurmLoginReady; NodeSetsReady: {gpu} 0/1");

    let status = ensure().await;
    assert_eq!(status.reason, waiting, "a ping without an answer is not named yet");
    assert_eq!(answered_at(&nodeset(gpu.clone()).await), None, "no answer, no nudge");

    probe.up.store(true, Ordering::SeqCst);
    let before = Utc::now() - Duration::seconds(1);
    let status = ensure().await;
    assert_eq!((status.reason.as_str(), status.changed.len()), (waiting.as_str(), 0));
    let nudged = nodeset(gpu.clone()).await;
    let stamp = answered_at(&nudged).expect("the NodeSet without its pod is nudged, whatever else still waits");
    assert!(stamp >= before && stamp <= Utc::now(), "stamped now: {stamp}");
    assert_eq!(answered_at(&nodeset(cpu.clone()).await), None, "the NodeSet with its pods is not");

    ensure().await;
    let again = nodeset(gpu.clone()).await;
    assert_eq!(again.metadata.resource_version, nudged.metadata.resource_version, "not again within 30 s");

    // The last nudge 31 s ago: the next answer nudges again.
    let old = (Utc::now() - Duration::seconds(31)).to_rfc3339_opts(SecondsFormat::Secs, true);
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &slurm::api_resource("NodeSet"));
    let body = json!({
        "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
        "metadata": { "name": gpu, "annotations": { ANSWERED_AT: old } },
    });
    api.patch(&gpu, &PatchParams::apply(NUDGE_MANAGER).force(), &Patch::Apply(&body)).await.expect("backdate");
    ensure().await;
    let renewed = answered_at(&nodeset(gpu.clone()).await).expect("still annotated");
    assert!(renewed > DateTime::parse_from_rfc3339(&old).expect("old").with_timezone(&Utc), "nudged again: {renewed}");

    // The rest and its pod came: ready, and the annotation stays as it was.
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let generation = sts.get(MARIADB).await.expect("MariaDB").metadata.generation.expect("generation");
    set_ready(&sts, MARIADB, generation, 1).await;
    play_statefulset(&client, &ns, slurm::ACCOUNTING_WORKLOAD).await;
    play_deployment(&client, &ns, slurm::LOGIN_SERVICE, 2).await;
    play_nodeset(&client, &ns, &gpu, 1).await;
    let status = ensure().await;
    assert!(status.ready, "{}", status.reason);
    assert_eq!(
        answered_at(&nodeset(gpu.clone()).await),
        Some(renewed),
        "paddock's apply keeps it, nothing rewrites it"
    );
}
