use paddock_types::NodePoolId;
use serde_json::json;

use super::*;

fn pool(name: &str, partitions: &[&str]) -> DemandPool {
    DemandPool {
        node_pool_id: NodePoolId::new(),
        name: name.to_owned(),
        partitions: partitions.iter().map(|p| (*p).to_owned()).collect(),
        node_names: Vec::new(),
        labels: Default::default(),
        taints: Vec::new(),
        cpu_cores: 16,
        memory_gib: 64,
        gpus: 0,
    }
}

fn no_val(n: u64) -> Value {
    json!({ "set": true, "infinite": false, "number": n })
}

/// A job of `GET /slurm/v0.0.42/jobs/` (`v0.0.42_job_info`, the fields slurmctld fills for a
/// pending batch job).
fn job(id: u64, partition: &str, state: &str, reason: &str, nodes: u64, cpus: u64) -> Value {
    json!({
        "account": "root", "batch_flag": true, "job_id": id, "name": format!("job-{id}"),
        "partition": partition, "job_state": [state], "state_reason": reason, "state_description": "",
        "hold": false, "node_count": no_val(nodes), "cpus": no_val(cpus), "tasks": no_val(cpus),
        "memory_per_node": no_val(1024), "memory_per_cpu": { "set": false, "infinite": false, "number": 0 },
        "priority": no_val(4294901759), "shared": [], "tres_per_node": "", "nodes": "",
        "submit_time": no_val(1_765_000_000), "user_name": "root", "user_id": 0,
    })
}

fn answer(key: &str, items: Vec<Value>) -> String {
    json!({
        key: items,
        "last_backfill": no_val(1_765_000_100), "last_update": no_val(1_765_000_100),
        "meta": { "plugin": { "type": "openapi/slurmctld", "name": "Slurm OpenAPI slurmctld",
                  "data_parser": "data_parser/v0.0.42" },
                  "slurm": { "version": { "major": "25", "micro": "4", "minor": "11" }, "release": "25.11.4" } },
        "errors": [], "warnings": [],
    })
    .to_string()
}

/// A node of `GET /slurm/v0.0.42/nodes/` as a Slinky NodeSet's slurmd registers it.
fn node(name: &str, pool: &str, on: &str, state: &[&str]) -> Value {
    let comment = json!({ "namespace": "slurm", "podName": name, "nodeSetName": pool, "node": on }).to_string();
    json!({
        "name": name, "hostname": name, "address": "10.244.1.7", "state": state, "features": [pool],
        "active_features": [pool], "partitions": [pool], "comment": comment, "cpus": 16, "real_memory": 64000,
        "alloc_cpus": 0, "reason": "", "version": "25.11.4",
    })
}

#[test]
fn the_documented_answers_parse_and_errors_are_refused() {
    let jobs = parse_jobs(&answer("jobs", vec![job(7, "gpu", "PENDING", "Resources", 2, 8)])).expect("jobs");
    assert_eq!((jobs[0].job_id, jobs[0].node_count.value(), jobs[0].cpus.value()), (7, Some(2), Some(8)));
    assert_eq!(jobs[0].memory_per_cpu.value(), None, "unset");
    let nodes = parse_nodes(&answer("nodes", vec![node("gpu-0", "gpu", "n-1", &["IDLE"])])).expect("nodes");
    assert_eq!((nodes[0].name.as_str(), nodes[0].features.clone()), ("gpu-0", vec!["gpu".to_owned()]));
    let failed = json!({ "jobs": [], "errors": [{ "description": "Unable to contact slurmctld", "error_number": 1007,
                         "error": "Unable to contact slurm controller (connect failure)", "source": "slurm_load_jobs" }] });
    let e = parse_jobs(&failed.to_string()).expect_err("an error answer");
    assert!(e.contains("Unable to contact slurmctld"), "{e}");
    assert!(parse_nodes("<html>").is_err());
}

#[test]
fn only_pending_jobs_more_nodes_would_start_count() {
    let parsed = |v: Value| serde_json::from_value::<SlurmJob>(v).expect("job");
    assert!(curable(&parsed(job(1, "cpu", "PENDING", "Resources", 1, 1))));
    assert!(curable(&parsed(job(1, "cpu", "PENDING", "Priority", 1, 1))));
    assert!(curable(&parsed(job(1, "cpu", "PENDING", "ReqNodeNotAvail", 1, 1))));
    assert!(!curable(&parsed(job(1, "cpu", "RUNNING", "None", 1, 1))));
    assert!(!curable(&parsed(job(1, "cpu", "PENDING", "Dependency", 1, 1))));
    assert!(!curable(&parsed(job(1, "cpu", "PENDING", "BeginTime", 1, 1))));
    assert!(!curable(&parsed(job(1, "cpu", "PENDING", "AssocGrpCpuLimit", 1, 1))));
    let mut held = job(1, "cpu", "PENDING", "Resources", 1, 1);
    held["hold"] = json!(true);
    assert!(!curable(&parsed(held)));
}

#[test]
fn pending_jobs_become_nodes_of_their_partitions_pool() {
    let pools = [pool("cpu", &["cpu", "all"]), pool("gpu", &["gpu", "all"])];
    let mut exclusive = job(6, "cpu", "PENDING", "Resources", 1, 1);
    exclusive["shared"] = json!(["none"]);
    let jobs = vec![
        job(1, "gpu", "PENDING", "Resources", 2, 32), // two whole nodes
        job(2, "cpu", "PENDING", "Priority", 1, 8),   // these two share a 16-CPU node
        job(3, "cpu", "PENDING", "Resources", 1, 8),
        job(4, "cpu", "RUNNING", "None", 1, 16),           // not demand
        job(5, "other,gpu", "PENDING", "Resources", 1, 4), // several partitions: gpu's
        exclusive,                                         // a node of its own
        job(7, "all", "PENDING", "Resources", 1, 1),       // the first pool of the partition
        job(8, "cpu", "PENDING", "Dependency", 4, 4),      // waits for another job, not for nodes
    ];
    let nodes = vec![
        node("cpu-0", "cpu", "n-c0", &["ALLOCATED"]),
        node("cpu-1", "cpu", "n-c1", &["IDLE"]),
        node("cpu-2", "cpu", "n-c2", &["IDLE", "DRAIN"]),
        node("cpu-3", "cpu", "n-c3", &["MIXED"]),
        node("cpu-4", "cpu", "", &["IDLE", "PLANNED"]),
        node("gpu-0", "gpu", "n-g0", &["IDLE"]),
        node("gpu-9", "gpu", "", &["IDLE", "CLOUD", "POWERED_DOWN"]), // a place for a machine to come
        node("login", "login", "n-l", &["IDLE"]),
    ];
    let queue = SlurmQueue {
        jobs: parse_jobs(&answer("jobs", jobs)).expect("jobs"),
        nodes: parse_nodes(&answer("nodes", nodes)).expect("nodes"),
    };
    let demand = demand_of(&pools, &queue);
    // cpu: job 6 alone on a node, 2 and 3 share one (8 + 8 CPUs fill it), 7 needs a third.
    assert_eq!(demand.pools[0], PoolDemand { pending: 4, pending_nodes: 3, nodes: 5, idle_nodes: 2 });
    assert_eq!(demand.pools[1], PoolDemand { pending: 2, pending_nodes: 3, nodes: 1, idle_nodes: 1 });
    assert_eq!(demand.idle_node_names, ["n-c1", "n-c2", "n-g0"]);
    // The one job of several nodes is listed, for the autoscaler to set apart if too wide.
    let wide: Vec<(NodePoolId, &str, u32)> =
        demand.wide_jobs.iter().map(|j| (j.node_pool_id, j.job.as_str(), j.nodes)).collect();
    assert_eq!(wide, [(pools[1].node_pool_id, "1", 2)]);
}

#[test]
fn a_pool_without_resolved_partitions_is_its_nodesets_partition_and_gpus_pack() {
    let mut gpu = pool("gpu", &[]);
    gpu.gpus = 8;
    let mut small = job(1, "gpu", "PENDING", "Resources", 1, 2);
    small["tres_per_node"] = json!("gres/gpu:4");
    let mut typed = job(2, "gpu", "PENDING", "Resources", 1, 2);
    typed["tres_per_node"] = json!("gres/gpu:h100:6");
    let queue = SlurmQueue { jobs: parse_jobs(&answer("jobs", vec![small, typed])).expect("jobs"), nodes: Vec::new() };
    assert_eq!(
        demand_of(&[gpu], &queue).pools[0],
        PoolDemand { pending: 2, pending_nodes: 2, nodes: 0, idle_nodes: 0 }
    );
}
