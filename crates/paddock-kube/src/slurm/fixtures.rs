//! Test fixtures shared by the Slurm driver's unit tests.

use paddock_domain::driver::SlurmPool;
use paddock_types::cluster::NodePoolRole;
use paddock_types::NodePoolId;

/// A compute pool `name` of `count` machines of an 8-core, 32 GiB class with `gpus` GPUs each,
/// not autoscaled, without taints.
pub(crate) fn pool(name: &str, count: u32, gpus: u32) -> SlurmPool {
    SlurmPool {
        node_pool_id: NodePoolId::new(),
        name: name.to_owned(),
        count,
        node_names: Vec::new(),
        releasing: Vec::new(),
        gpus_per_node: gpus,
        class_size: (8, 32),
        autoscaling_max: None,
        taints: Vec::new(),
        role: NodePoolRole::Compute,
    }
}
