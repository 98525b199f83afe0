-- The simulated Slurm node on each simulated Node: down with Slurm's reason (as after an
-- unexpected reboot), or not (null). Set by the knob `SimWorld::set_slurm_down`.
alter table paddock_sim.nodes add column slurm_down_reason text;
