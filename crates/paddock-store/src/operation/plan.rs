//! Step plans: the steps an operation carries out, written (all `pending`) when it is accepted,
//! then moved by the reconciler doing each step through [`super::progress`] (docs/api.md).

/// The step names, as the reconcilers that carry them out report them.
pub mod step {
    /// The platform namespace and its isolation.
    pub const NAMESPACE: &str = "namespace";
    /// The tenant control plane (created, or changed to the spec's version).
    pub const CONTROL_PLANE: &str = "control_plane";
    /// The pools' machines allocated (a resize allocates or releases).
    pub const MACHINES: &str = "machines";
    /// The nodes joined and ready.
    pub const NODES: &str = "nodes";
    /// The tenant base stack.
    pub const STACK: &str = "stack";
    /// Slurm.
    pub const SLURM: &str = "slurm";
    /// A deletion removing Slurm.
    pub const REMOVE_SLURM: &str = "remove_slurm";
    /// Ray (the RayCluster of a `ray` cluster).
    pub const RAY: &str = "ray";
    /// A deletion removing Ray.
    pub const REMOVE_RAY: &str = "remove_ray";
    /// A deletion releasing every machine.
    pub const RELEASE_MACHINES: &str = "release_machines";
    /// A deletion removing the control plane.
    pub const DELETE_CONTROL_PLANE: &str = "delete_control_plane";
    /// A deletion removing the namespace.
    pub const DELETE_NAMESPACE: &str = "delete_namespace";
    /// The machine reconciler's run with what the change wrote (new BMC credentials).
    pub const RECONCILE: &str = "reconcile";
    /// The BMC read: system UUID, power state, inventory.
    pub const INSPECT: &str = "inspect";
    /// The inventory recorded and checked against the machine class.
    pub const RECORD_INVENTORY: &str = "record_inventory";
    /// A machine holding a tenancy released: drained, its node removed, powered off.
    pub const RELEASE: &str = "release";
    /// The wipe: booted into the wipe image, the agent's verified report, powered off.
    pub const CLEAN: &str = "clean";
    /// The acceptance image booted after the wipe, and its report passed (docs/acceptance.md).
    pub const ACCEPTANCE: &str = "acceptance";
    /// The clean's evidence recorded (with the BMC's own erase) and the machine `available`.
    pub const AVAILABLE: &str = "available";
    /// The run the machine was in abandoned, a machine booted into it powered off.
    pub const POWER_OFF: &str = "power_off";
    /// The machine in `maintenance`.
    pub const MAINTENANCE: &str = "maintenance";
    /// The machine `retired`.
    pub const RETIRE: &str = "retire";
}

/// What an operation's plan depends on besides its kind: the target as the change found it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanContext {
    /// The cluster runs Slurm: its create, update and delete have Slurm's steps.
    pub slurm: bool,
    /// The cluster runs Ray: its create, update and delete have Ray's steps.
    pub ray: bool,
    /// The machine holds (or is leaving) a tenancy: maintenance releases it first.
    pub held: bool,
    /// The machine's class names an acceptance image: an enrollment and a return from
    /// maintenance accept the machine after its wipe.
    pub acceptance: bool,
}

/// The steps an operation of `kind` carries out, in order.
pub fn plan(kind: &str, context: PlanContext) -> Vec<&'static str> {
    use step::*;
    let slurm = |steps: &[&'static str], name| {
        let mut steps = steps.to_vec();
        if context.slurm {
            steps.push(name);
        }
        steps
    };
    let workload = |steps: &[&'static str], slurm_step, ray_step| {
        let mut steps = slurm(steps, slurm_step);
        if context.ray {
            steps.push(ray_step);
        }
        steps
    };
    match kind {
        // An update runs the same steps: each confirms (or changes) its part of the spec.
        "cluster_create" | "cluster_update" => {
            workload(&[NAMESPACE, CONTROL_PLANE, MACHINES, NODES, STACK], SLURM, RAY)
        }
        "node_pool_create" | "node_pool_update" | "node_pool_scale" => vec![MACHINES, NODES],
        "cluster_delete" => {
            let mut steps = workload(&[], REMOVE_SLURM, REMOVE_RAY);
            steps.extend([RELEASE_MACHINES, DELETE_CONTROL_PLANE, DELETE_NAMESPACE]);
            steps
        }
        "node_pool_delete" => vec![RELEASE_MACHINES],
        "machine_enroll" if context.acceptance => vec![INSPECT, RECORD_INVENTORY, CLEAN, ACCEPTANCE, AVAILABLE],
        "machine_enroll" => vec![INSPECT, RECORD_INVENTORY, CLEAN, AVAILABLE],
        "machine_maintenance_enter" if context.held => vec![RELEASE, POWER_OFF, MAINTENANCE],
        "machine_maintenance_enter" => vec![POWER_OFF, MAINTENANCE],
        "machine_maintenance_leave" if context.acceptance => vec![CLEAN, ACCEPTANCE, AVAILABLE],
        "machine_maintenance_leave" => vec![CLEAN, AVAILABLE],
        "machine_force_release" => vec![RELEASE, CLEAN, AVAILABLE],
        "machine_retire" => vec![RETIRE],
        _ => vec![RECONCILE],
    }
}
