-- The simulated demand may single out its widest pending job: one of `pending_jobs`, asking for
-- `widest_job_nodes` of the `pending_nodes` (0: none of several nodes is singled out), as
-- slurmrestd would list it, so a job wider than a pool can ever be can be played.
alter table paddock_sim.demand
    add column widest_job_nodes integer not null default 0 check (widest_job_nodes >= 0);
