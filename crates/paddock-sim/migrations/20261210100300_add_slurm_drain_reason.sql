-- The simulated Slurm node on each simulated Node: drained with a reason, or not (null). Set by
-- the knob `SimWorld::set_slurm_drain` (a tenant's `scontrol update ... state=drain reason=...`)
-- and by paddock's own drain of a node it releases.
alter table paddock_sim.nodes add column slurm_drain_reason text;
