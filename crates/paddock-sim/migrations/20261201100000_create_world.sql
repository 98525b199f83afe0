-- The simulated world of `paddock-sim` (the dev default, demos, benchmarks): what a fleet of BMCs,
-- the machines' agents, the platform cluster and the tenant clusters would hold. Kept in
-- PostgreSQL so every worker process, and a restarted one, sees one world, but in a schema of its
-- own (`paddock_sim`, created by `paddock_sim::migrate` before these migrations run, which also
-- keeps their `_sqlx_migrations` there): a production database has none of it. Nothing here is
-- read by paddock's own logic: only the simulated drivers and their tests touch these tables,
-- always with idempotent upserts. Times are the database's (`now()`), so processes never disagree
-- on them.

-- One simulated machine behind its BMC, created on first contact.
create table paddock_sim.machines (
    -- The BMC URL, `sim://<name>`.
    bmc_url text primary key,
    name text not null,
    -- UUID v5 of the BMC URL (URL namespace): stable across restarts and databases.
    system_uuid text not null unique,
    serial text not null,
    model text not null,
    -- What inspection reports; null = not reported (unverified), the default.
    cpu_cores integer,
    memory_gib integer,
    -- `[{id, capacity_bytes, model}]`.
    drives jsonb not null,
    power_on boolean not null default false,
    -- The one-time boot device: 'cd' after a boot from media, null = disk.
    boot_override text check (boot_override in ('cd')),
    -- The inserted virtual media. The seed URL holds the run's agent token, exactly as a real BMC
    -- keeps it in its VirtualMedia resource; a test database holds nothing else of value.
    image_url text,
    seed_url text,
    -- The last boot from media: its time and sequence number.
    booted_at timestamptz,
    boot_seq bigint not null default 0,
    -- The last boot the simulated agent reported (or gave up on); `boot_seq > reported_seq` means
    -- a report is due.
    reported_seq bigint not null default 0,
    -- A process reporting for this machine holds it until then (a lease: a crash just expires).
    agent_claimed_until timestamptz,
    -- The last restart from disk (the installed OS coming up).
    disk_booted_at timestamptz,
    -- Injected faults: bmc_timeout, auth_fails, single_virtual_media, wipe_fails, never_reports,
    -- never_joins.
    faults text[] not null default '{}',
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now()
);
-- The simulated agent's pick: machines with a report due.
create index machines_due_idx on paddock_sim.machines (booted_at) where boot_seq > reported_seq;

-- One tenant cluster as the platform cluster and its own API server would show it.
create table paddock_sim.clusters (
    cluster_id uuid primary key,
    -- Step 1: the namespace (null = absent), and since when it is terminating.
    namespace text,
    namespace_created_at timestamptz,
    namespace_deleting_at timestamptz,
    -- Step 2: the tenant control plane.
    control_plane_created_at timestamptz,
    control_plane_deleting_at timestamptz,
    kubernetes_version text,
    -- Step 4: the base stack.
    stack_applied_at timestamptz,
    -- Step 5: Slurm; `slurm_nodes_at` = since when every pool with a count has a node.
    slurm_applied_at timestamptz,
    slurm_nodes_at timestamptz,
    slurm_deleting_at timestamptz,
    -- The last desired Slurm pools, for people debugging a demo.
    slurm_pools jsonb,
    -- Injected faults: control_plane_never_ready, tenant_unreachable.
    faults text[] not null default '{}',
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now()
);

-- Nodes of the tenant clusters: written by the simulated agent when a provisioning boot reports,
-- registered when the machine restarts from disk, Ready some time later.
create table paddock_sim.nodes (
    cluster_id uuid not null,
    node_name text not null,
    system_uuid text not null,
    labels jsonb not null default '{}',
    taints jsonb not null default '[]',
    -- When the provisioning boot reported (the OS is installed).
    provisioned_at timestamptz not null default now(),
    -- When the kubelet registered (the machine restarted from disk); null = no Node object yet.
    joined_at timestamptz,
    -- When the Node turns Ready; null = never (powered off, or the never_joins fault).
    ready_at timestamptz,
    primary key (cluster_id, node_name),
    unique (cluster_id, system_uuid)
);
create index nodes_system_uuid_idx on paddock_sim.nodes (system_uuid);
