//! The demand of a `slurm` cluster's elastic pools ([`SlurmDriver::job_demand`]) read by the
//! production probe through the API server's service proxy from the slurmrestd STAND-IN of the
//! real-operator tests (`played::restd`), which answers v0.0.42's job and node lists in the shapes of
//! Slurm's OpenAPI. It listens on a free port of this host's routable address here (the
//! real-operator tests hold port 6820). The same read of a real slurmrestd's answers, with real
//! jobs pending in a real slurmctld, is `slurm_host.rs`'s.

use paddock_domain::driver::{DemandPool, PoolDemand};
use paddock_types::NodePoolId;
use serde_json::json;

use crate::slurm::{pool, unique, version};
use crate::slurm_rest::RestCluster;

/// A pool as the autoscaler asks about it: a NodeSet's own partition, 16 cores and 64 GiB.
fn asked(name: &str) -> DemandPool {
    DemandPool {
        node_pool_id: NodePoolId::new(),
        name: name.to_owned(),
        partitions: vec![name.to_owned()],
        node_names: Vec::new(),
        labels: Default::default(),
        taints: Vec::new(),
        cpu_cores: 16,
        memory_gib: 64,
        gpus: 0,
    }
}

#[tokio::test]
async fn pending_jobs_and_idle_nodes_are_read_through_slurmrestd() {
    let (cpu, gpu) = (unique("cpu"), unique("gpu"));
    let pools = vec![pool(&cpu, 1, 0, Vec::new()), pool(&gpu, 0, 0, Vec::new())];
    let Some(cluster) = RestCluster::new(pools).await else { return };
    let RestCluster { tenant, ns, driver, .. } = &cluster;
    let restd = cluster.stand_in().await;

    // The cpu pool's one machine: its slurmd registered (`--conf 'Features=<pool>'`, as the
    // operator starts it) and the operator wrote the node its pod's information.
    let slurmd = format!("{cpu}-0");
    restd.register(&slurmd, &["--conf".to_owned(), format!("'Features={cpu}'")]);
    let info = json!({ "namespace": ns, "podName": slurmd, "nodeSetName": cpu, "node": "n-cpu-0" });
    restd.set_comment(&slurmd, &info.to_string());
    let asked = [asked(&cpu), asked(&gpu)];

    let at_rest = driver.job_demand(tenant, &version(), &asked).await.expect("demand at rest");
    let idle_one = PoolDemand { pending: 0, pending_nodes: 0, nodes: 1, idle_nodes: 1 };
    assert_eq!(at_rest.pools, [idle_one, PoolDemand::default()]);
    assert_eq!(at_rest.idle_node_names, ["n-cpu-0"]);

    // `sbatch -p <gpu> -N 2` on the pool at zero, and two one-node jobs on the cpu pool while its
    // node runs a third.
    let wide = restd.submit(&gpu, 2, 32);
    restd.submit(&cpu, 1, 8);
    restd.submit(&cpu, 1, 12);
    let running = restd.submit(&cpu, 1, 16);
    restd.set_job_state(running, Some("RUNNING"));
    restd.set_job(&slurmd, true);
    let busy = driver.job_demand(tenant, &version(), &asked).await.expect("demand with work");
    assert_eq!(busy.pools[0], PoolDemand { pending: 2, pending_nodes: 2, nodes: 1, idle_nodes: 0 });
    assert_eq!(busy.pools[1], PoolDemand { pending: 1, pending_nodes: 2, nodes: 0, idle_nodes: 0 });
    assert!(busy.idle_node_names.is_empty(), "{:?}", busy.idle_node_names);

    // The wide job started elsewhere and ended: the gpu pool asks for nothing.
    restd.set_job_state(wide, None);
    let after = driver.job_demand(tenant, &version(), &asked).await.expect("demand after");
    assert_eq!(after.pools[1], PoolDemand::default());

    // Through the pinned REST version, with tokens of the cluster's key.
    let seen = restd.seen();
    for read in ["GET /slurm/v0.0.42/jobs/", "GET /slurm/v0.0.42/nodes/"] {
        assert!(seen.contains(read), "{read} not among {seen:?}");
    }
    assert_eq!(restd.denied(), 0);
}
