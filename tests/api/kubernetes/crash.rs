//! A crash-looping slurmctld, through the API with the played operator: the PLAYED kubelet puts
//! the container of the controller's pod in CrashLoopBackOff (its last run ended with exit code 1,
//! `Error`), so the played StatefulSet controller reports the controller not ready. The cluster
//! says so: phase `degraded` (also while first provisioned), `SlurmReady=False` with the reason
//! `ControllerCrashLoopBackOff` and a message naming the container, its restarts and its exit
//! code; never `ready` while it lasts; `ready` again once slurmctld runs.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::chrono::{SecondsFormat, Utc};
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use paddock_kube::slurm;
use paddock_testkit::eventually;
use serde_json::{json, Value};

use super::{err, Lab, Tenant};

/// The operator's controller pod (`<controller>-controller-0`).
const POD: &str = "slurm-controller-0";
/// The times slurmctld was restarted when the played kubelet reports the crash loop.
const RESTARTS: i32 = 5;

/// PLAYS THE STATEFULSET CONTROLLER AND THE KUBELET for the controller's pod: it exists once the
/// operator's StatefulSet does, with the operator's labels and the Controller's slurmctld image;
/// its container runs (Ready) or, when `crashing`, waits in CrashLoopBackOff after exiting with
/// code 1. Returns whether the pod is ready.
pub(super) async fn controller_pod(client: &Client, crashing: bool) -> Result<bool, String> {
    let ns = slurm::NAMESPACE;
    let controllers: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &slurm::api_resource("Controller"));
    let image = match controllers.get_opt(slurm::CONTROLLER).await {
        Ok(Some(c)) => c.data["spec"]["slurmctld"]["image"].as_str().unwrap_or_default().to_owned(),
        // No Controller (or no CRDs yet): no pod either.
        Ok(None) | Err(kube::Error::Api(_)) => return Ok(true),
        Err(e) => return Err(err(e)),
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = match pods.get_opt(POD).await.map_err(err)? {
        Some(pod) => pod,
        None => {
            let body: Pod = serde_json::from_value(json!({
                "metadata": { "name": POD, "labels": {
                    "app.kubernetes.io/name": "slurmctld", "app.kubernetes.io/instance": slurm::CONTROLLER,
                    "app.kubernetes.io/component": "controller" } },
                "spec": { "containers": [{ "name": "slurmctld", "image": image }] },
            }))
            .map_err(err)?;
            pods.create(&PostParams::default(), &body).await.map_err(err)?
        }
    };
    let waiting =
        pod.status.as_ref().and_then(|s| s.container_statuses.as_ref()).and_then(|c| c.first()).map(|c| {
            c.state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.clone()).unwrap_or_default()
        });
    let shown = match waiting.as_deref() {
        Some("CrashLoopBackOff") => Some(true),
        Some(_) => Some(false),
        None => None,
    };
    if shown != Some(crashing) {
        let status = pod_status(&image, crashing);
        pods.patch_status(POD, &PatchParams::default(), &Patch::Merge(&status)).await.map_err(err)?;
    }
    Ok(!crashing)
}

/// What a kubelet reports of slurmctld's pod: running and ready, or crash-looping.
fn pod_status(image: &str, crashing: bool) -> Value {
    let now = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);
    let ready = if crashing { "False" } else { "True" };
    let (state, last, restarts) = if crashing {
        let back_off = format!("back-off 2m40s restarting failed container=slurmctld pod={POD}");
        let waiting = json!({ "waiting": { "reason": "CrashLoopBackOff", "message": back_off } });
        let exited = json!({ "terminated": { "exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now } });
        (waiting, exited, RESTARTS)
    } else {
        (json!({ "running": { "startedAt": now } }), json!({}), 0)
    };
    let condition = |t: &str, s: &str| json!({ "type": t, "status": s, "lastTransitionTime": now });
    json!({ "status": {
        "phase": "Running", "podIP": "10.244.250.1", "startTime": now,
        "conditions": [condition("PodScheduled", "True"), condition("Initialized", "True"),
                       condition("ContainersReady", ready), condition("Ready", ready)],
        "containerStatuses": [{ "name": "slurmctld", "image": image, "imageID": format!("{image}@played"),
            "ready": !crashing, "started": !crashing, "restartCount": restarts, "state": state, "lastState": last }],
    }})
}

impl Lab {
    /// Makes the played kubelet keep the cluster's slurmctld crash-looping, or run it again.
    fn crash_controller(&self, cluster: &str, crashing: bool) {
        let mut set = self.play.crash_looping.lock().expect("lock");
        if crashing {
            set.insert(cluster.to_owned());
        } else {
            set.remove(cluster);
        }
    }

    /// Waits until the played kubelet and StatefulSet controller show the cluster's slurmctld
    /// crash-looping (its pod in CrashLoopBackOff, its StatefulSet with no ready replica), so a
    /// check that runs now finds it.
    async fn crash_shown(&self, cluster: &str) {
        let client = self.play.tenants.lock().expect("lock").get(cluster).map(|t| t.client.clone()).expect("tenant");
        let pods: Api<Pod> = Api::namespaced(client.clone(), slurm::NAMESPACE);
        let sets: Api<StatefulSet> = Api::namespaced(client, slurm::NAMESPACE);
        eventually(self.wait, || async {
            let pod = pods.get_opt(POD).await.ok()??;
            let statuses = pod.status?.container_statuses?;
            let waiting = statuses.iter().filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone());
            let crashing = waiting.into_iter().any(|r| r == "CrashLoopBackOff");
            let set = sets.get_opt(slurm::CONTROLLER_WORKLOAD).await.ok()??;
            let ready = set.status.and_then(|s| s.ready_replicas).unwrap_or(0);
            (crashing && ready == 0).then_some(())
        })
        .await;
    }

    /// Waits until a run of the cluster's reconcile job that started after now has ended (waiting
    /// again, or handed over to a follow-up that another change enqueued meanwhile).
    async fn run_after_now(&self, cluster: &str) {
        let pool = &self.app.db.pool;
        let t0: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("select now()").fetch_one(pool).await.expect("now");
        eventually(self.wait, || async {
            let ran: i64 = sqlx::query_scalar(
                "select count(*) from jobs where target_id = $1::uuid and kind = 'cluster_reconcile' \
                 and state <> 'running' and started_at > $2",
            )
            .bind(cluster)
            .bind(t0)
            .fetch_one(pool)
            .await
            .expect("jobs");
            (ran > 0).then_some(())
        })
        .await;
    }

    /// Waits until the cluster is `degraded` by the crash loop, asserting on the way that it is
    /// never `ready` when `never_ready` (a ready cluster stays ready until a run looks); the
    /// cluster as the API shows it then.
    async fn degraded_by_crash_loop(&self, t: &Tenant, cluster: &str, never_ready: bool) -> Value {
        eventually(self.wait, || async {
            let view = self.cluster(t, cluster).await;
            if never_ready {
                assert_ne!(view["status"]["phase"], "ready", "ready while slurmctld crash-loops: {view:#}");
            }
            let slurm = condition(&view, "SlurmReady");
            let crashing = slurm["reason"] == "ControllerCrashLoopBackOff";
            (view["status"]["phase"] == "degraded" && crashing).then_some(view)
        })
        .await
    }
}

fn condition(view: &Value, type_: &str) -> Value {
    let conditions = view["status"]["conditions"].as_array().cloned().unwrap_or_default();
    conditions.into_iter().find(|c| c["type"] == type_).unwrap_or(Value::Null)
}

fn says_why(view: &Value) {
    let slurm = condition(view, "SlurmReady");
    assert_eq!(slurm["status"], "False", "{view:#}");
    let message = slurm["message"].as_str().unwrap_or_default();
    for part in [
        "slurmctld is crash-looping",
        &format!("container slurmctld of pod {POD} is in CrashLoopBackOff after {RESTARTS} restart(s)"),
        "last exited with code 1 (Error)",
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    assert_eq!(condition(view, "Ready")["status"], "False", "{view:#}");
}

#[tokio::test]
async fn a_crash_looping_slurmctld_degrades_the_cluster_with_its_reason_until_it_runs() {
    let Some(lab) = Lab::new().await else { return };
    let (t, cluster, _) = lab.create_hpc(1).await;
    // From the start: the cluster being provisioned is degraded, not provisioning.
    lab.crash_controller(&cluster, true);
    let view = lab.degraded_by_crash_loop(&t, &cluster, true).await;
    says_why(&view);
    assert_eq!(view["status"]["observed_generation"], 0, "never ready: its generation is not observed");
    // A later run of its reconcile job (which waits, never succeeds) finds it as it was.
    lab.run_after_now(&cluster).await;
    says_why(&lab.degraded_by_crash_loop(&t, &cluster, true).await);

    // slurmctld runs: the cluster goes ready by itself.
    lab.crash_controller(&cluster, false);
    let ready = lab.ready(&t, &cluster).await;
    assert_eq!(condition(&ready, "SlurmReady")["status"], "True", "{ready:#}");

    // It crash-loops on a ready cluster: the next drift check finds it (and hands the cluster to
    // its reconcile job, which takes it back to ready once slurmctld runs).
    lab.crash_controller(&cluster, true);
    lab.crash_shown(&cluster).await;
    let due = sqlx::query(
        "update jobs set run_at = now() where target_id = $1::uuid and kind = 'cluster_drift_check' \
         and state = 'queued'",
    )
    .bind(&cluster)
    .execute(&lab.app.db.pool)
    .await
    .expect("make the drift check due");
    assert_eq!(due.rows_affected(), 1, "a ready cluster has a queued drift check");
    says_why(&lab.degraded_by_crash_loop(&t, &cluster, false).await);
    lab.crash_controller(&cluster, false);
    lab.ready(&t, &cluster).await;
    lab.finish().await;
}
