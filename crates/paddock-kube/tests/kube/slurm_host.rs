//! paddock's Slurm configuration of elastic pools against a REAL slurmctld 26.05 on this host
//! (`paddock_testkit::slurm_host`: the root `scripts/slurm-host` builds, `PADDOCK_TEST_SLURM_HOST`),
//! with a real slurmd registering as a dynamic node (`slurmd -Z --conf Features=<pool>`, as a
//! Slinky NodeSet pod does).
//!
//! The slurm.conf is the part paddock decides, written as the operator writes it
//! (`buildNodeSetConf` and the Controller's `extraConf` of slurm-operator 1.2.1): a `NodeSet=<pool>
//! Feature=<pool>` line per NodeSet, then the Controller's `extraConf` verbatim. The operator test
//! (`operator.rs`) checks the same lines in the slurm.conf the real operator renders.

use paddock_domain::driver::{DemandPool, SlurmPool};
use paddock_kube::slurm::{self, demand_of, objects, parse_jobs, parse_nodes, SlurmQueue, CURABLE_REASONS};
use paddock_testkit::slurm_host::{self, SlurmHost};
use paddock_types::cluster::{Partition, SlurmSpec};
use paddock_types::ClusterId;
use serde_json::Value;

use crate::slurm::{pool, version};

/// The slurm.conf lines of paddock's Slurm objects for `pools` under `spec`, as slurm-operator
/// 1.2.1 renders them: the NodeSets (sorted by name), each one's partition when it has one, then
/// the Controller's `extraConf`.
fn rendered(spec: &SlurmSpec, pools: &[SlurmPool]) -> String {
    let v = version();
    let catalog = slurm::SlurmCatalog::embedded();
    let images = catalog.images(&v.stack_version, &v.version).expect("a supported Slurm");
    let cluster = ClusterId::new();
    let own = spec.partitions.is_empty();
    let mut nodesets: Vec<Value> = pools
        .iter()
        .enumerate()
        .map(|(i, p)| objects::nodeset("slurm", cluster, images, p, p.count, own, i == 0))
        .collect();
    nodesets.sort_by(|a, b| a["metadata"]["name"].as_str().cmp(&b["metadata"]["name"].as_str()));
    let mut lines = Vec::new();
    for n in &nodesets {
        let name = n["metadata"]["name"].as_str().expect("a name");
        lines.push(format!("NodeSet={name} Feature={name}"));
        if n["spec"]["partition"]["enabled"] == true {
            let config = n["spec"]["partition"]["config"].as_str().unwrap_or_default();
            lines.push(format!("PartitionName={name} Nodes={name} {config}"));
        }
    }
    let controller = objects::controller("slurm", cluster, images, "local-path", spec, pools, None);
    lines.push(controller["spec"]["extraConf"].as_str().unwrap_or_default().to_owned());
    lines.join("\n")
}

/// Submits `args` with `sbatch`: the job's id, or sbatch's refusal.
fn sbatch(slurm: &SlurmHost, args: &[&str]) -> Result<String, String> {
    let mut all = vec!["sbatch", "--parsable"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--wrap", "hostname"]);
    let out = slurm.run(&all);
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// The job `id` as `squeue --json` gives it (v0.0.42's fields, as slurmrestd gives them), if the
/// queue still holds it.
fn job(slurm: &SlurmHost, id: &str) -> Option<Value> {
    let out = slurm.run(&["squeue", "--json", "--states=all", "-j", id]);
    let queue: Value = serde_json::from_slice(&out.stdout).ok()?;
    queue["jobs"].as_array()?.first().cloned()
}

fn state(job: &Value) -> Vec<String> {
    job["job_state"].as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_owned)).collect()
}

/// The job `id` is accepted and waits as demand: `PENDING` for a reason the demand read counts.
fn assert_pending_as_demand(slurm: &SlurmHost, id: &str, what: &str) {
    let job = slurm.wait(&format!("{what} to be scheduled once"), |s| {
        job(s, id).filter(|j| j["state_reason"].as_str().is_some_and(|r| r != "None"))
    });
    let reason = job["state_reason"].as_str().unwrap_or_default();
    assert_eq!(state(&job), ["PENDING"], "{what}: {job}");
    assert!(CURABLE_REASONS.contains(&reason), "{what} waits for {reason:?}, which is no demand");
}

/// An elastic pool at zero that shares a partition with a fixed pool's nodes: without its nodes
/// declared, Slurm refuses a job for what only that pool's machines have (its feature, its GPUs);
/// with paddock's `FUTURE` nodes of the pool's class the job is accepted, pends as demand (up to
/// the pool's `max` nodes), is never put on a declared node, and runs once the pool's machine
/// registers its slurmd. What no machine of the class has is still refused.
#[test]
fn an_elastic_pool_at_zero_takes_jobs_for_its_max_nodes_and_runs_them_when_its_nodes_join() {
    let Some(root) = slurm_host::root() else { return };
    let fixed = pool("cpu", 1, 0, Vec::new());
    let mut big = pool("big", 0, 0, Vec::new());
    big.autoscaling_max = Some(2);
    big.class_size = (1, 1);
    let mut gpu = pool("gpu", 0, 8, Vec::new());
    gpu.autoscaling_max = Some(2);
    gpu.class_size = (1, 1);
    let all = Partition {
        name: "all".to_owned(),
        node_pools: vec!["cpu".to_owned(), "big".to_owned(), "gpu".to_owned()],
        default: true,
        max_time: None,
    };
    let spec = SlurmSpec { partitions: vec![all], ..SlurmSpec::default() };
    let conf = rendered(&spec, &[fixed, big.clone(), gpu]);
    let mut slurm = SlurmHost::start(&root, &conf);

    // The fixed pool's node, registered as its NodeSet pod registers.
    slurm.start_slurmd("cpu-0", "Features=cpu");
    slurm.wait("cpu-0 to register idle", |s| {
        let out = s.run(&["sinfo", "-h", "-N", "-n", "cpu-0", "-o", "%T"]);
        (String::from_utf8_lossy(&out.stdout).trim() == "idle").then_some(())
    });

    // Work for the elastic pools at zero: accepted, and pending as demand.
    let big_max = sbatch(&slurm, &["-p", "all", "-C", "big", "-N", "2"]).expect("a job for big's max nodes");
    assert_pending_as_demand(&slurm, &big_max, "a job for big's 2 nodes");
    let gpus = sbatch(&slurm, &["-p", "all", "--gres=gpu:8"]).expect("a job for a machine of gpu's class");
    assert_pending_as_demand(&slurm, &gpus, "a job for 8 GPUs");
    let gpu_max = sbatch(&slurm, &["-p", "all", "--gres=gpu:8", "-N", "2"]).expect("a job for gpu's max nodes");
    assert_pending_as_demand(&slurm, &gpu_max, "a job for gpu's 2 nodes");
    // What no machine of the class has is refused at submission, as before.
    let refused = sbatch(&slurm, &["-p", "all", "--gres=gpu:9"]).expect_err("9 GPUs on a class of 8");
    assert!(refused.contains("Requested node configuration is not available"), "{refused}");
    let refused = sbatch(&slurm, &["-p", "all", "-C", "big", "--mem=2000"]).expect_err("more memory than big's");
    assert!(refused.contains("Requested node configuration is not available"), "{refused}");

    assert_demand_read(&mut slurm, &big);

    // big's first machine joins (the fixed pool's slurmd gives way: one slurmd a host): the job
    // for one of its nodes runs there, not on a declared node.
    let one = sbatch(&slurm, &["-p", "all", "-C", "big"]).expect("a job for one of big's nodes");
    assert_pending_as_demand(&slurm, &one, "a job for one of big's nodes");
    slurm.stop_slurmd("cpu-0");
    slurm.start_slurmd("big-0", "Features=big");
    let done = slurm.wait("the job for one of big's nodes to run on big-0", |s| {
        job(s, &one).filter(|j| state(j).iter().any(|st| st == "COMPLETED"))
    });
    assert_eq!(done["nodes"], "big-0", "{done}");
    // The job for 2 nodes still waits: one node of big is there, the other still to come.
    assert_pending_as_demand(&slurm, &big_max, "a job for big's 2 nodes");
}

/// `GET /slurm/v0.0.42/<what>/` of the real slurmrestd, as paddock's probe asks it.
fn rest(port: u16, token: &str, what: &str) -> String {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--fail", "-H", "X-SLURM-USER-NAME: root", "-H"])
        .arg(format!("X-SLURM-USER-TOKEN: {token}"))
        .arg(format!("http://127.0.0.1:{port}/slurm/v0.0.42/{what}/"))
        .output()
        .expect("curl");
    assert!(out.status.success(), "GET {what}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// paddock's demand read of the real slurmrestd's job and node lists (v0.0.42): the declared
/// nodes are not listed, so the elastic pool has no node yet; the jobs pending in its partition
/// (three of them, waiting because of the declared nodes) are its demand.
fn assert_demand_read(slurm: &mut SlurmHost, pool: &SlurmPool) {
    let port = slurm.start_slurmrestd();
    let token = slurm.token("root");
    let queue = SlurmQueue {
        jobs: parse_jobs(&rest(port, &token, "jobs")).expect("the job list"),
        nodes: parse_nodes(&rest(port, &token, "nodes")).expect("the node list"),
    };
    let names: Vec<&str> = queue.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["cpu-0"], "only the registered node is listed");
    let demand = DemandPool {
        node_pool_id: pool.node_pool_id,
        name: pool.name.clone(),
        partitions: vec!["all".to_owned()],
        node_names: Vec::new(),
        labels: Default::default(),
        taints: Vec::new(),
        cpu_cores: pool.class_size.0,
        memory_gib: pool.class_size.1,
        gpus: pool.gpus_per_node,
    };
    let read = demand_of(&[demand], &queue);
    assert_eq!((read.pools[0].pending, read.pools[0].nodes), (3, 0), "{read:?}");
}
