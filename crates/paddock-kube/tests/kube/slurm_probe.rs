//! paddock's production slurmrestd probe ([`ServiceProxyProbe`]) through a real API server's
//! service proxy, against a REAL slurmrestd and slurmctld 26.05 with real slurmds registering as
//! dynamic nodes (`paddock_testkit::slurm_host`), the slurmrestd on this host's routable address
//! behind the cluster's RestApi Service and accepting tokens of the JWT key the driver wrote: its
//! ping, its drain (of an idle node, and of one running a job), and its read of the nodes' drain
//! reasons.

use paddock_domain::driver::SlurmSecrets;
use paddock_domain::secret::SecretString;
use paddock_kube::slurm::{self, ServiceProxyProbe};
use paddock_testkit::slurm_host::{self, Options, SlurmHost};

use crate::slurm::{b64, desired, pool, random_bytes, unique};
use crate::slurm_rest::RestCluster;

/// Waits until slurmd `node` registered and is `state` (as `sinfo` says it).
fn wait_state(slurm: &SlurmHost, node: &str, state: &str) {
    slurm.wait(&format!("{node} to be {state}"), |s| {
        let out = s.run(&["sinfo", "-h", "-N", "-n", node, "-o", "%T"]);
        (String::from_utf8_lossy(&out.stdout).trim() == state).then_some(())
    });
}

#[tokio::test]
async fn the_service_proxy_probe_pings_drains_and_reads_a_real_slurmrestd() {
    let Some(root) = slurm_host::root() else { return };
    let Some(rest) = RestCluster::new(vec![pool(&unique("cpu"), 1, 0, Vec::new())]).await else { return };
    let RestCluster { tenant, ns, secrets, driver, .. } = &rest;
    let options = Options {
        cluster: Some(slurm::cluster_name(tenant.cluster.cluster_id)),
        jwt_key: Some(rest.jwt_key()),
        accounting: false,
    };
    // A NodeSet and its partition, as the operator writes them.
    let conf = "NodeSet=cpu Feature=cpu\nPartitionName=cpu Nodes=cpu Default=YES State=UP";
    let mut slurm = SlurmHost::start_with(&root, conf, &options);
    // A tenant's admin drained `cpu-1` to report a fault; its slurmd then gave way to cpu-0's
    // (one slurmd a host): Slurm keeps the node, drained, with the admin's reason.
    slurm.start_slurmd("cpu-1", "Features=cpu");
    wait_state(&slurm, "cpu-1", "idle");
    let fault = "paddock:hw: GPU 3 ECC";
    let out = slurm.run(&["scontrol", "update", "nodename=cpu-1", "state=drain", &format!("reason={fault}")]);
    assert!(out.status.success(), "scontrol: {}", String::from_utf8_lossy(&out.stderr));
    slurm.stop_slurmd("cpu-1");
    slurm.start_slurmd("cpu-0", "Features=cpu");
    wait_state(&slurm, "cpu-0", "idle");
    let port = slurm.start_slurmrestd_on(rest.ip);
    rest.route_to(port).await;

    let probe = ServiceProxyProbe::new(ns.clone());
    assert!(probe.ping(tenant, "v0.0.42").await.expect("ping through the service proxy"));
    // A job runs on cpu-0: the drain holds new work off and waits for it.
    let out = slurm.run(&["sbatch", "--parsable", "-p", "cpu", "-w", "cpu-0", "--wrap", "sleep 600"]);
    assert!(out.status.success(), "sbatch: {}", String::from_utf8_lossy(&out.stderr));
    let job = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    wait_state(&slurm, "cpu-0", "allocated");
    assert_eq!(probe.drain(tenant, "v0.0.42", "cpu-0", slurm::DRAIN_REASON).await.expect("drain"), Some(false));
    let out = slurm.run(&["scancel", &job]);
    assert!(out.status.success(), "scancel: {}", String::from_utf8_lossy(&out.stderr));
    wait_state(&slurm, "cpu-0", "drained");
    assert_eq!(probe.drain(tenant, "v0.0.42", "cpu-0", slurm::DRAIN_REASON).await.expect("again"), Some(true));
    assert_eq!(probe.drain(tenant, "v0.0.42", "unknown-7", slurm::DRAIN_REASON).await.expect("unknown"), None);
    // Every node with its reason: the tenant's fault report, and paddock's own drain.
    let listed = probe.nodes(tenant, "v0.0.42").await.expect("nodes through the service proxy");
    let mut reasons: Vec<(&str, &str)> = listed.iter().map(|n| (n.name.as_str(), n.reason.as_str())).collect();
    reasons.sort_unstable();
    assert_eq!(reasons, [("cpu-0", slurm::DRAIN_REASON), ("cpu-1", fault)], "{listed:?}");
    assert!(listed.iter().all(|n| n.state.iter().any(|s| s == "DRAIN")), "{listed:?}");

    // A token signed with another key is refused: the ping is not a success.
    let other = SlurmSecrets { jwt_hs256_key: SecretString::new(b64(&random_bytes(64))), ..secrets.clone() };
    driver.ensure_slurm(tenant, &desired(vec![pool(&unique("cpu"), 1, 0, Vec::new())], &other)).await.expect("ensure");
    let denied = probe.ping(tenant, "v0.0.42").await;
    assert!(!matches!(denied, Ok(true)), "a token of another key was accepted: {denied:?}");
}
