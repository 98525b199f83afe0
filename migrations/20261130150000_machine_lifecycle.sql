-- The machine lifecycle beyond inspection (SPEC sections 5 and 6): verified cleans, allocations,
-- the agent run a machine is in, and what a cluster needs to allocate first come, first served.
--
-- Invariants kept by the schema:
--   * a machine is `available` only with a verified clean not yet used by an allocation
--     (`machines_available_clean_check`);
--   * every allocation consumes one verified clean of its own machine, and a clean is consumed at
--     most once (`machine_allocations.clean_id` unique, foreign key on (clean, machine)): no
--     allocation without a verified clean since the machine's last tenancy;
--   * at most one live allocation per machine (`machine_allocations_live_key`), and a machine holds
--     an allocation exactly while its state is a tenancy state (`machines_tenancy_check`).

-- A verified wipe: the agent's report listed every drive the run's configuration listed as wiped.
create table machine_cleans (
    id uuid primary key,
    machine_id uuid not null references machines (id),
    -- The wipe run (the agent token's run); a run is recorded once.
    run_id uuid not null unique,
    method text not null,
    -- The agent's report.
    evidence jsonb not null,
    completed_at timestamptz not null default now(),
    unique (id, machine_id)
);
create index machine_cleans_machine_idx on machine_cleans (machine_id, completed_at);

create table machine_allocations (
    id uuid primary key,
    machine_id uuid not null references machines (id),
    clean_id uuid not null unique,
    tenant_id uuid not null references tenants (id),
    cluster_id uuid not null references clusters (id),
    node_pool_id uuid not null references node_pools (id),
    allocated_at timestamptz not null default now(),
    -- The machine entered `releasing` (billing stops here).
    release_started_at timestamptz,
    -- The machine reached `cleaning`: the tenancy is over.
    released_at timestamptz,
    foreign key (clean_id, machine_id) references machine_cleans (id, machine_id)
);
create unique index machine_allocations_live_key on machine_allocations (machine_id) where released_at is null;
create index machine_allocations_cluster_idx on machine_allocations (cluster_id) where released_at is null;

alter table machines
    -- The verified clean that made the machine available; consumed (cleared) by its allocation.
    add column clean_id uuid references machine_cleans (id),
    add column allocation_id uuid references machine_allocations (id),
    -- The agent run in progress (a wipe in `cleaning`, a provisioning boot in `provisioning`):
    -- decided before the machine boots, so a crash re-enters the same run.
    add column run_id uuid,
    add column run_purpose text check (run_purpose in ('wipe', 'provision')),
    -- When the machine was last booted into the run's media.
    add column run_booted_at timestamptz,
    -- When the media were ejected and the boot device set back to disk after the run's report.
    add column run_finished_at timestamptz,
    add constraint machines_available_clean_check check (state <> 'available' or clean_id is not null),
    add constraint machines_tenancy_check check (
        (state in ('allocated', 'provisioning', 'active', 'releasing', 'provision_failed'))
        = (allocation_id is not null)),
    add constraint machines_holder_check check ((allocation_id is null) = (tenant_id is null)
        and (tenant_id is null) = (cluster_id is null) and (cluster_id is null) = (node_pool_id is null)),
    add constraint machines_run_check check ((run_id is null) = (run_purpose is null));

create index machines_pool_idx on machines (node_pool_id) where node_pool_id is not null;
create index machines_cluster_idx on machines (cluster_id) where cluster_id is not null;
-- The allocator's pick: available machines of a class.
create index machines_available_idx on machines (machine_class_id, id) where state = 'available';

alter table clusters
    -- The admin kubeconfig of the tenant control plane, AES-256-GCM bound to
    -- (clusters, admin_kubeconfig_enc, id); used only by paddock.
    add column admin_kubeconfig_enc bytea,
    -- Since when the cluster waits for machines (its place in the first come, first served queue);
    -- null while it is not waiting.
    add column waiting_since timestamptz;
create index clusters_waiting_idx on clusters (waiting_since, id) where waiting_since is not null;
