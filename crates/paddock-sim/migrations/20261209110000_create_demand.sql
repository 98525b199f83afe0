-- The simulated demand of tenant clusters' node pools: what slurmrestd (pending jobs in the
-- pool's partition, the nodes they ask for, nodes running jobs) or the tenant's scheduler
-- (unschedulable pods matching the pool) would report. Set by tests and `paddock dev` users.
create table paddock_sim.demand (
    cluster_id uuid not null,
    pool text not null,
    pending_jobs integer not null default 0 check (pending_jobs >= 0),
    pending_nodes integer not null default 0 check (pending_nodes >= 0),
    busy_nodes integer not null default 0 check (busy_nodes >= 0),
    updated_at timestamptz not null default now(),
    primary key (cluster_id, pool)
);
