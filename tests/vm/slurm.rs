//! A tenant's own Slurm on its own machines, used as its people use it: the real slurm-operator
//! (a pod of the tenant's stack, tests/vm/stack.rs) runs slurmctld, slurmdbd and its MariaDB,
//! slurmrestd and the login pods on the system pool's node VM and slurmd on the compute pool's,
//! from the images the node image carries (scripts/slurm-images); paddock calls the cluster's
//! Slurm ready only when its probe reaches slurmctld through slurmrestd. Then, as the tenant with
//! its kubeconfig (`kubectl exec` into the login pod), `sbatch`, `srun`, `sinfo` and `sacct` run
//! as they would for a tenant's user.
//!
//! The tenant has no shared file system here (a tenant brings its own), so a batch job's output
//! file is where Slurm writes it: on the compute node that ran it, read there.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{AttachParams, ListParams, LogParams};
use kube::{Api, Client, ResourceExt};
use serde_json::Value;
use tokio::io::AsyncReadExt;

use crate::join::until;
use crate::node::NodeLab;
use crate::testbed::Vm;

/// The tenant's Slurm namespace (paddock_kube::slurm::NAMESPACE).
const NS: &str = paddock_kube::slurm::NAMESPACE;

/// The cluster's condition `type_` (the API's view).
pub fn condition<'a>(cluster: &'a Value, type_: &str) -> Option<&'a Value> {
    cluster["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

/// Waits until paddock says the cluster's Slurm is ready (its probe reached slurmctld through
/// slurmrestd); returns the cluster.
pub async fn ready(lab: &NodeLab, tenant: &(String, String), cluster: &str, client: &Client, vm: &Vm) -> Value {
    until(vm, "paddock finds the cluster's Slurm ready", || async {
        let c = lab.p.app.get(cluster).token(&tenant.1).send().await.expect(200).json();
        match condition(&c, "SlurmReady") {
            Some(s) if s["status"] == "True" => Ok(c),
            _ => Err(format!(
                "phase {}, conditions {}\npods: {}",
                c["status"]["phase"],
                c["status"]["conditions"],
                pods_now(client).await
            )),
        }
    })
    .await
}

/// Every pod of the cluster with its node, phase and what its containers wait for (a failure's
/// diagnosis).
pub async fn pods_now(client: &Client) -> String {
    let Ok(pods) = Api::<Pod>::all(client.clone()).list(&ListParams::default()).await else {
        return "(unlisted)".to_owned();
    };
    let line = |p: &Pod| {
        let status = p.status.clone().unwrap_or_default();
        let waiting: Vec<String> = status
            .container_statuses
            .unwrap_or_default()
            .into_iter()
            .chain(status.init_container_statuses.unwrap_or_default())
            .filter_map(|c| {
                let w = c.state?.waiting?;
                Some(format!("{}: {} {}", c.name, w.reason.unwrap_or_default(), w.message.unwrap_or_default()))
            })
            .collect();
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        format!(
            "\n  {}/{} on {node}: {} {waiting:?}",
            p.namespace().unwrap_or_default(),
            p.name_any(),
            status.phase.unwrap_or_default()
        )
    };
    pods.items.iter().map(line).collect()
}

/// The running pod of the Slurm namespace with a container named `container` (`login`,
/// `slurmd`), on Node `node` when given.
pub async fn pod(client: &Client, container: &str, node: Option<&str>) -> Result<String, String> {
    let pods =
        Api::<Pod>::namespaced(client.clone(), NS).list(&ListParams::default()).await.map_err(|e| e.to_string())?;
    let found = pods.items.iter().find(|p| {
        let spec = p.spec.as_ref();
        let has = spec.is_some_and(|s| s.containers.iter().any(|c| c.name == container));
        let on = node.is_none_or(|n| spec.and_then(|s| s.node_name.as_deref()) == Some(n));
        let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        has && on && running && p.metadata.deletion_timestamp.is_none()
    });
    found.map(ResourceExt::name_any).ok_or_else(|| {
        let all: Vec<String> = pods
            .items
            .iter()
            .map(|p| format!("{} {:?}", p.name_any(), p.status.as_ref().and_then(|s| s.phase.clone())))
            .collect();
        format!("no running {container} pod: {all:?}")
    })
}

/// How long one `exec` may take before it counts as failed (a poll tries again): an exec whose
/// stream went quiet, which a node reset next to it has been seen to leave open for good.
const EXEC_BOUND: Duration = Duration::from_secs(120);

/// Runs `script` with `sh -c` in container `container` of pod `pod` (as the tenant's admin does
/// with `kubectl exec`): its standard output, or its standard error and status; an error after
/// [`EXEC_BOUND`].
pub async fn exec(client: &Client, pod: &str, container: &str, script: &str) -> Result<String, String> {
    match tokio::time::timeout(EXEC_BOUND, exec_once(client, pod, container, script)).await {
        Ok(done) => done,
        Err(_) => Err(format!("`{script}` in {pod}: no answer within {} s", EXEC_BOUND.as_secs())),
    }
}

async fn exec_once(client: &Client, pod: &str, container: &str, script: &str) -> Result<String, String> {
    let pods = Api::<Pod>::namespaced(client.clone(), NS);
    let params = AttachParams::default().container(container).stdout(true).stderr(true);
    let mut attached = pods.exec(pod, ["sh", "-c", script], &params).await.map_err(|e| format!("exec: {e}"))?;
    let (mut out, mut err) = (String::new(), String::new());
    if let Some(mut stdout) = attached.stdout() {
        stdout.read_to_string(&mut out).await.map_err(|e| e.to_string())?;
    }
    if let Some(mut stderr) = attached.stderr() {
        stderr.read_to_string(&mut err).await.map_err(|e| e.to_string())?;
    }
    let status = attached.take_status().expect("the exec's status").await;
    let failed = status.as_ref().is_some_and(|s| s.status.as_deref() == Some("Failure"));
    attached.join().await.map_err(|e| e.to_string())?;
    if failed {
        return Err(format!("`{script}` in {pod}: {status:?}\nstdout: {out}\nstderr: {err}"));
    }
    Ok(out)
}

/// Submits a batch job as a tenant's user does on the login node (`sbatch --parsable` with
/// `args`, from /var/tmp): its id.
async fn sbatch(client: &Client, login: &str, args: &str) -> String {
    let script = format!("cd /var/tmp && sbatch --parsable {args}");
    let out = exec(client, login, "login", &script).await.expect("sbatch");
    let id = out.trim().split(';').next().unwrap_or_default().to_owned();
    assert!(id.parse::<u64>().is_ok(), "sbatch --parsable answers a job id: {out:?}");
    id
}

/// What a tenant's user does on the login node, and what each command must answer: a batch job
/// runs on the compute node (its output read where Slurm wrote it), `srun` answers from that node,
/// `sinfo` shows it idle and `sacct` has the job COMPLETED. Returns the batch job's id.
pub async fn use_it(client: &Client, vm: &Vm, compute_node: &str) -> String {
    let t0 = Instant::now();
    let login = until(vm, "a running login pod", || pod(client, "login", None)).await;
    let slurmd =
        until(vm, "a running slurmd pod on the compute node", || pod(client, "slurmd", Some(compute_node))).await;
    let host = exec(client, &slurmd, "slurmd", "hostname").await.expect("the slurmd pod's hostname");
    let host = host.trim().to_owned();
    let idle = format!("{host} idle");
    until(vm, "sinfo shows the compute node idle", || async {
        let out = exec(client, &login, "login", "sinfo -h -N -o '%N %T'").await?;
        out.lines().any(|l| l.trim() == idle).then_some(()).ok_or(out)
    })
    .await;
    eprintln!("slurm: the compute node idle in sinfo {:.1} s after Slurm was ready", t0.elapsed().as_secs_f64());
    let id = sbatch(client, &login, "--output=/var/tmp/job-%j.out --wrap 'hostname; id'").await;
    let state = |id: String| {
        let login = login.clone();
        async move {
            let out = exec(client, &login, "login", &format!("sacct -n -X -P -j {id} -o State")).await?;
            let state = out.trim().to_owned();
            (state == "COMPLETED").then_some(()).ok_or(state)
        }
    };
    until(vm, "sacct has the batch job COMPLETED", || state(id.clone())).await;
    eprintln!("slurm: sbatch to COMPLETED in sacct {:.1} s", t0.elapsed().as_secs_f64());
    let output =
        exec(client, &slurmd, "slurmd", &format!("cat /var/tmp/job-{id}.out")).await.expect("the job's output");
    let mut lines = output.lines();
    assert_eq!(lines.next(), Some(host.as_str()), "the job ran on the compute node: {output}");
    assert!(lines.next().is_some_and(|l| l.starts_with("uid=0(root)")), "`id` in the job: {output}");
    let srun = exec(client, &login, "login", "srun -N1 hostname").await.expect("srun");
    assert_eq!(srun.trim(), host, "srun -N1 hostname answers from the compute node");
    id
}

/// The compute node rebooted under a running job, as a kernel panic or a power glitch would do it
/// (the VM reset, its disk kept): Slurm marks the node down (`Node unexpectedly rebooted`) and
/// requeues the job; paddock's status follows Slurm (`SlurmNodesUp=False` naming the node and
/// Slurm's reason) and no machine leaves the tenant on its own: the machine stays active in the
/// cluster with its Node Ready again, no health report says failed and no remediation starts.
/// The tenant's admin resumes the node, and paddock's status follows again. The requeued job is
/// cancelled: it would wait Slurm's requeue delay (two minutes) before it may start again.
pub async fn reboot_under_a_job(
    lab: &NodeLab,
    (tenant, cluster): (&(String, String), &str),
    client: &Client,
    login: &str,
    (vm, machine): (&Vm, &str),
    node: &str,
) {
    let t0 = Instant::now();
    let id = sbatch(client, login, "--output=/var/tmp/reboot-%j.out --wrap 'sleep 3600'").await;
    let squeue = format!("squeue -h -j {id} -o '%T %N'");
    let host = until(vm, "the job runs", || async {
        let out = exec(client, login, "login", &squeue).await?;
        out.trim().strip_prefix("RUNNING ").map(str::to_owned).ok_or(out)
    })
    .await;
    crate::testbed::virsh(&["reset", &vm.name]);
    let sinfo = format!("sinfo -h -n {host} -o '%T|%E'");
    until(vm, "Slurm marks the rebooted node down", || async {
        let out = exec(client, login, "login", &sinfo).await?;
        (out.trim() == "down|Node unexpectedly rebooted").then_some(()).ok_or(out)
    })
    .await;
    eprintln!("slurm: the reset to the node down in Slurm {:.1} s", t0.elapsed().as_secs_f64());
    let requeued = until(vm, "Slurm requeues the job", || async {
        let out = exec(client, login, "login", &squeue).await?;
        if out.trim().starts_with("PENDING") {
            Ok(out)
        } else {
            Err(out)
        }
    })
    .await;
    let runs = exec(client, login, "login", &format!("sacct -n -D -X -P -j {id} -o State")).await.expect("sacct");
    assert!(
        runs.lines().next().is_some_and(|s| s == "NODE_FAIL"),
        "the run on the rebooted node: {runs:?} ({requeued})"
    );
    let up = |c: &Value| condition(c, "SlurmNodesUp").cloned().unwrap_or_default();
    // The cluster stays ready (its Node may have gone NotReady for a while, and back): a node down
    // in Slurm is the tenant's to resume.
    let c = until(vm, "paddock's status shows the node down, the cluster ready", || async {
        let c = lab.p.app.get(cluster).token(&tenant.1).send().await.expect(200).json();
        let shown = up(&c)["status"] == "False" && c["status"]["phase"] == "ready";
        shown.then_some(c.clone()).ok_or_else(|| c["status"].to_string())
    })
    .await;
    let message = up(&c)["message"].as_str().unwrap_or_default().to_owned();
    assert_eq!(up(&c)["reason"], "SlurmNodeDown", "{}", c["status"]);
    assert!(message.contains(&format!("on {node} (Node unexpectedly rebooted)")), "{message}");
    until(vm, "the Node is Ready again", || crate::join::ready_node(client, vm)).await;
    let m = lab.p.get(&format!("/v1/machines/{machine}")).await;
    assert!(m["state"] == "active" && m["cluster_id"].is_string() && m["health"] != "failed", "{m}");
    let remediations = lab.p.app.get(format!("{cluster}/remediations")).token(&tenant.1).send().await.expect(200);
    let remediations = remediations.json()["items"].as_array().map(Vec::len);
    assert_eq!(remediations, Some(0), "no machine leaves the tenant on its own");

    exec(client, login, "login", &format!("scontrol update nodename={host} state=resume")).await.expect("resume");
    until(vm, "paddock's status shows the node up again", || async {
        let c = lab.p.app.get(cluster).token(&tenant.1).send().await.expect(200).json();
        (up(&c)["status"] == "True").then_some(()).ok_or_else(|| c["status"]["conditions"].to_string())
    })
    .await;
    exec(client, login, "login", &format!("scancel {id}")).await.expect("scancel");
    until(vm, "the resumed node is idle", || async {
        let out = exec(client, login, "login", &sinfo).await?;
        out.trim().starts_with("idle|").then_some(()).ok_or(out)
    })
    .await;
    eprintln!("slurm: the reboot under a job, followed and resumed, in {:.1} s", t0.elapsed().as_secs_f64());
}

/// The compute pool to zero while a job runs on its node: paddock drains the Slurm node with its
/// reason (the job goes on, nothing new starts there) and the machine stays the tenant's while the
/// job runs; once the job ended on its own, the machine is released and wiped, and the cluster
/// keeps nothing of its node.
pub async fn scale_to_zero_under_a_job(
    lab: &NodeLab,
    tenant: &(String, String),
    pool: &str,
    client: &Client,
    login: &str,
    (vm, machine): (&Vm, &str),
    node: &str,
) {
    let t0 = Instant::now();
    // The job ends when the test says so (a file in its node's /var/tmp: a job may get a /tmp of
    // its own), not after a guessed time.
    let wrap = "--output=/var/tmp/hold-%j.out --wrap 'until [ -e /var/tmp/release ]; do sleep 1; done'";
    let id = sbatch(client, login, wrap).await;
    let squeue = format!("squeue -h -j {id} -o '%T %N'");
    let host = until(vm, "the holding job runs", || async {
        let out = exec(client, login, "login", &squeue).await?;
        out.trim().strip_prefix("RUNNING ").map(str::to_owned).ok_or(out)
    })
    .await;
    lab.p.app.patch(pool).token(&tenant.1).json(&serde_json::json!({ "count": 0 })).send().await.expect(202);
    let drained = format!("draining {}", paddock_kube::slurm::DRAIN_REASON);
    let sinfo = format!("sinfo -h -n {host} -o '%T %E'");
    until(vm, "paddock drains the Slurm node under the job", || async {
        let out = exec(client, login, "login", &sinfo).await?;
        (out.trim() == drained).then_some(()).ok_or(out)
    })
    .await;
    eprintln!("slurm: the pool to zero, the node draining in {:.1} s", t0.elapsed().as_secs_f64());
    let held = lab.p.get(&format!("/v1/machines/{machine}")).await;
    assert!(held["state"] != "available" && held["cluster_id"].is_string(), "held while the job runs: {held}");
    let running = exec(client, login, "login", &squeue).await.expect("squeue");
    assert!(running.starts_with("RUNNING"), "the job goes on through the drain: {running}");
    let slurmd = pod(client, "slurmd", Some(node)).await.expect("the slurmd pod");
    exec(client, &slurmd, "slurmd", "touch /var/tmp/release").await.expect("the job's release");
    let t1 = Instant::now();
    until(vm, "the compute machine is released and wiped", || async {
        let m = lab.p.get(&format!("/v1/machines/{machine}")).await;
        (m["state"] == "available").then_some(()).ok_or_else(|| m["state"].to_string())
    })
    .await;
    eprintln!("slurm: the job's end to the compute machine wiped in {:.1} s", t1.elapsed().as_secs_f64());
    let sacct = format!("sacct -n -X -P -j {id} -o State");
    let state = exec(client, login, "login", &sacct).await.expect("sacct");
    assert_eq!(state.trim(), "COMPLETED", "the job ended on its own, before the release");
    crate::join::assert_nothing_left(client, node).await;
}

/// Where the time to a ready Slurm went, in seconds from `since`: when each of the cluster's
/// conditions (paddock's view) last turned, and, from its API server, when each pod was created,
/// scheduled, initialized and ready, its warning events by reason, and for each restarted
/// container how its last run ended with its last log lines. Printed, never asserted on; bounded
/// so that a kubelet that does not answer cannot hold the test.
pub async fn timeline(client: &Client, cluster: &Value, since: chrono::DateTime<chrono::Utc>) -> String {
    let rel = |t: chrono::DateTime<chrono::Utc>| format!("{:.0}", (t - since).as_seconds_f64());
    let mut out = String::from("\n  conditions:");
    for c in cluster["status"]["conditions"].as_array().into_iter().flatten() {
        let at = c["last_transition_time"].as_str().and_then(|t| t.parse::<chrono::DateTime<chrono::Utc>>().ok());
        out += &format!(
            " {} {} at {};",
            c["type"].as_str().unwrap_or_default(),
            c["status"],
            at.map(rel).unwrap_or_default()
        );
    }
    match tokio::time::timeout(Duration::from_secs(60), pods_timeline(client, &rel)).await {
        Ok(pods) => out + &pods,
        Err(_) => out + "\n  (the pods' timeline took over 60 s)",
    }
}

async fn pods_timeline(client: &Client, rel: &impl Fn(chrono::DateTime<chrono::Utc>) -> String) -> String {
    let Ok(pods) = Api::<Pod>::all(client.clone()).list(&ListParams::default()).await else {
        return "\n  (the pods could not be listed)".to_owned();
    };
    let events = Api::<Event>::all(client.clone()).list(&ListParams::default()).await.map(|l| l.items);
    let events = events.unwrap_or_default();
    let at = |t: Option<&Time>| t.map_or_else(|| "-".to_owned(), |t| rel(t.0));
    let mut out = String::new();
    for p in &pods.items {
        let status = p.status.clone().unwrap_or_default();
        let conditions = status.conditions.unwrap_or_default();
        let when = |type_: &str| {
            let c = conditions.iter().find(|c| c.type_ == type_ && c.status == "True");
            at(c.and_then(|c| c.last_transition_time.as_ref()))
        };
        let (ns, name) = (p.namespace().unwrap_or_default(), p.name_any());
        let mut warnings = BTreeMap::<String, i32>::new();
        for e in events.iter().filter(|e| e.type_.as_deref() == Some("Warning")) {
            let o = &e.involved_object;
            if o.namespace.as_deref() == Some(ns.as_str()) && o.name.as_deref() == Some(name.as_str()) {
                *warnings.entry(e.reason.clone().unwrap_or_default()).or_default() += e.count.unwrap_or(1);
            }
        }
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        out += &format!(
            "\n  {ns}/{name} on {node}: created {}, scheduled {}, initialized {}, ready {}; warnings {warnings:?}",
            at(p.metadata.creation_timestamp.as_ref()),
            when("PodScheduled"),
            when("Initialized"),
            when("Ready"),
        );
        for c in status.container_statuses.iter().flatten().filter(|c| c.restart_count > 0) {
            let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
            let how = last.map(|t| format!("{} {}", t.reason.clone().unwrap_or_default(), t.exit_code));
            let params = LogParams {
                container: Some(c.name.clone()),
                previous: true,
                tail_lines: Some(4),
                ..LogParams::default()
            };
            let log = Api::<Pod>::namespaced(client.clone(), &ns).logs(&name, &params).await;
            let log = log.unwrap_or_else(|e| format!("(no log: {e})"));
            // The kubelet's copy of the log's tail (FallbackToLogsOnError), which outlives the log.
            let kept = last.and_then(|t| t.message.as_deref()).filter(|m| !m.trim().is_empty());
            let log = match kept {
                Some(m) if log.trim().is_empty() || log.starts_with("(no log") => last_lines(m, 4),
                _ => log,
            };
            let how = how.unwrap_or_default();
            out += &format!("\n    {} restarted {} times, last {how}:\n{}", c.name, c.restart_count, log.trim_end());
        }
    }
    out
}

/// The last `n` lines of `text`.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
