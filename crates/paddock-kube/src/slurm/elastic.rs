//! The Slurm nodes slurm.conf declares for a cluster's elastic pools ahead of their machines
//! (the Controller's `extraConf`, [`super::objects::controller_extra_conf`]): pure functions of
//! the pools, documented with why each choice, as tried against a real slurmctld 26.05.

use paddock_domain::driver::SlurmPool;

/// The node table slurmctld keeps beside the nodes slurm.conf declares: the operator's own
/// `MaxNodeCount`, room for the slurmd pods that register as dynamic nodes.
pub const DYNAMIC_NODE_ROOM: u32 = 1024;

/// The Slurm nodes an elastic pool's partition holds before its machines come: `max` nodes of
/// the pool's class in state `FUTURE`, named `<pool>_future[0-<max-1>]`, with the pool's feature
/// (so the operator's `NodeSet=<pool> Feature=<pool>`, and every partition naming the NodeSet,
/// holds them). Why these, tried against a real slurmctld 26.05 (docs/tenants.md, "Elastic
/// pools"):
/// - Without them, a partition whose nodes lack what a job asks for refuses the job at
///   submission ("Requested node configuration is not available"): a GPU, a feature (`-C
///   <pool>`) or the memory of a pool at zero that shares a partition with other pools' nodes.
///   With them the job is accepted and pends (`ReqNodeNotAvail`, `Resources`), which is the
///   demand paddock reads; a job larger than a machine of the class is still refused.
/// - Not named as the NodeSet's pods: a `slurmd -Z` (how Slinky's pods register) whose name
///   slurm.conf already declares exits ("Duplicated NodeName"). A pod's hostname never holds
///   `_`, so these names never meet a pod's.
/// - `FUTURE`, not `CLOUD`: slurmctld allocates powered-down `CLOUD` nodes to a job at once
///   (the job then waits `CONFIGURING` for nodes no resume will bring, instead of pending),
///   while `FUTURE` nodes are never allocated: the job runs on the pool's dynamic nodes once
///   they register.
/// - The memory is 90% of the class's (Slurm's own tolerance for cloud nodes' registered
///   memory): a real node reports less than its installed memory, and a job accepted for memory
///   no node has would hold a machine for nothing.
pub fn future_nodes(pools: &[SlurmPool]) -> Vec<String> {
    pools
        .iter()
        .filter_map(|pool| {
            let max = pool.autoscaling_max.filter(|m| *m > 0)?;
            let mut line = format!("NodeName={}_future[0-{}] State=FUTURE Feature={}", pool.name, max - 1, pool.name);
            let (cpus, memory_gib) = pool.class_size;
            if cpus > 0 {
                line.push_str(&format!(" CPUs={cpus}"));
            }
            if memory_gib > 0 {
                line.push_str(&format!(" RealMemory={}", u64::from(memory_gib) * 1024 * 9 / 10));
            }
            if pool.gpus_per_node > 0 {
                line.push_str(&format!(" Gres=gpu:{}", pool.gpus_per_node));
            }
            Some(line)
        })
        .collect()
}

/// The `extraConf` lines of the elastic pools: a `MaxNodeCount` that keeps
/// [`DYNAMIC_NODE_ROOM`] for the pods beside the declared nodes (slurmctld refuses to start when
/// declared nodes fill its node table; the operator's own `MaxNodeCount=1024` comes first in
/// slurm.conf and the last one wins), then the [`future_nodes`]. None without an elastic pool.
pub fn declared(pools: &[SlurmPool]) -> Vec<String> {
    let count: u32 = pools.iter().filter_map(|p| p.autoscaling_max).sum();
    if count == 0 {
        return Vec::new();
    }
    let mut lines = vec![format!("MaxNodeCount={}", count + DYNAMIC_NODE_ROOM)];
    lines.extend(future_nodes(pools));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::fixtures::pool;

    #[test]
    fn an_elastic_pool_declares_its_max_nodes_ahead_of_its_machines() {
        let mut gpu = pool("gpu", 0, 8);
        gpu.autoscaling_max = Some(4);
        gpu.class_size = (64, 512);
        let mut cpu = pool("cpu", 0, 0);
        cpu.autoscaling_max = Some(1);
        cpu.class_size = (0, 0);
        let fixed = pool("fixed", 2, 0);
        let conf = declared(&[fixed.clone(), gpu, cpu]).join("\n");
        assert_eq!(
            conf,
            "MaxNodeCount=1029\n\
             NodeName=gpu_future[0-3] State=FUTURE Feature=gpu CPUs=64 RealMemory=471859 Gres=gpu:8\n\
             NodeName=cpu_future[0-0] State=FUTURE Feature=cpu"
        );
        // Fixed pools, and an elastic pool of max 0, declare nothing: their nodes stay dynamic.
        let mut none = pool("none", 0, 0);
        none.autoscaling_max = Some(0);
        assert!(declared(&[fixed, none]).is_empty());
    }
}
