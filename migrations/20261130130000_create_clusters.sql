-- Tenant clusters, their node pools and their events. A cluster or pool whose deletion was asked
-- for stays (`deletion_requested_at`) until the worker has confirmed every external object gone;
-- only then it gets `deleted_at` and answers 404.

create table clusters (
    id uuid primary key,
    tenant_id uuid not null references tenants (id),
    name text not null,
    kind text not null check (kind in ('slurm', 'kubernetes')),
    isolation text not null check (isolation = 'private-nodes'),
    kubernetes_version text not null,
    slurm jsonb,
    generation bigint not null default 1,
    -- Status, written by the worker with a guard on status_version; never bumps the generation.
    status_version bigint not null default 1,
    phase text not null default 'pending'
        check (phase in ('pending', 'provisioning', 'ready', 'updating', 'degraded', 'deleting', 'failed')),
    conditions jsonb not null default '[]',
    observed_generation bigint not null default 0,
    endpoints jsonb not null default '{}',
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now(),
    deletion_requested_at timestamptz,
    deleted_at timestamptz,
    check ((kind = 'slurm') = (slurm is not null))
);
create unique index clusters_tenant_name_key on clusters (tenant_id, name) where deleted_at is null;
create index clusters_tenant_idx on clusters (tenant_id, id) where deleted_at is null;

create table node_pools (
    id uuid primary key,
    tenant_id uuid not null references tenants (id),
    cluster_id uuid not null references clusters (id),
    name text not null,
    machine_class_id uuid not null references machine_classes (id),
    count integer not null check (count >= 0),
    labels jsonb not null default '{}',
    taints jsonb not null default '[]',
    generation bigint not null default 1,
    status_version bigint not null default 1,
    ready integer not null default 0,
    allocated integer not null default 0,
    conditions jsonb not null default '[]',
    observed_generation bigint not null default 0,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now(),
    deletion_requested_at timestamptz,
    deleted_at timestamptz
);
create unique index node_pools_cluster_name_key on node_pools (cluster_id, name) where deleted_at is null;
create index node_pools_cluster_idx on node_pools (cluster_id, id) where deleted_at is null;
create index node_pools_class_idx on node_pools (machine_class_id);

create table cluster_events (
    id uuid primary key,
    tenant_id uuid not null references tenants (id),
    cluster_id uuid not null references clusters (id),
    at timestamptz not null default now(),
    type text not null check (type in ('Normal', 'Warning')),
    reason text not null,
    message text not null
);
create index cluster_events_cluster_idx on cluster_events (cluster_id, id);
