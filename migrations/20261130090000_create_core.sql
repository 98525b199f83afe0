-- The service core: tenants, machine classes, machines, operations, idempotency keys, audit events.
-- Every id is a UUIDv7 made by paddock. Spec changes bump `generation` (the etag); status changes
-- bump `status_version` (the guard of the worker's writes) and never the etag.

create table tenants (
    id uuid primary key,
    name text not null,
    display_name text not null,
    labels jsonb not null default '{}',
    max_clusters integer check (max_clusters >= 0),
    max_nodes integer check (max_nodes >= 0),
    max_gpus integer check (max_gpus >= 0),
    state text not null default 'active' check (state in ('active', 'suspended')),
    generation bigint not null default 1,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now(),
    deleted_at timestamptz
);
-- A deleted tenant's name may be reused; its id stays in usage and audit history.
create unique index tenants_name_key on tenants (name) where deleted_at is null;

create table machine_classes (
    id uuid primary key,
    name text not null,
    cpu_cores integer not null check (cpu_cores > 0),
    memory_gib integer not null check (memory_gib > 0),
    gpu_model text not null default '',
    gpu_count integer not null check (gpu_count >= 0),
    description text not null default '',
    generation bigint not null default 1,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now()
);
create unique index machine_classes_name_key on machine_classes (name);

create table machines (
    id uuid primary key,
    name text not null,
    -- `restrict`: a class in use cannot be deleted, even by a bug in the service layer.
    machine_class_id uuid not null references machine_classes (id) on delete restrict,
    labels jsonb not null default '{}',
    state text not null check (state in (
        'enrolling', 'inspecting', 'cleaning', 'available', 'allocated', 'provisioning', 'active',
        'releasing', 'provision_failed', 'clean_failed', 'maintenance', 'retired')),
    last_error jsonb,
    tenant_id uuid references tenants (id),
    cluster_id uuid,
    node_pool_id uuid,
    node_name text,
    system_uuid text,
    inventory jsonb not null default '{}',
    -- Operator intent, carried out by the worker: set = wanted in maintenance (the reason);
    -- cleared while in maintenance = leave through cleaning. `retire_requested_at` = retire.
    maintenance_reason text,
    retire_requested_at timestamptz,
    bmc_url text not null,
    bmc_system_id text,
    bmc_username text not null,
    -- AES-256-GCM, bound to (machines, bmc_password_enc, id); never returned, never logged.
    bmc_password_enc bytea not null,
    bmc_ca_cert text,
    bmc_insecure_tls boolean not null default false,
    generation bigint not null default 1,
    status_version bigint not null default 1,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now(),
    retired_at timestamptz
);
-- A retired machine's name may be enrolled again (a rebuilt server); the old row stays for custody.
create unique index machines_name_key on machines (name) where retired_at is null;
create index machines_class_idx on machines (machine_class_id);
create index machines_state_idx on machines (state, id);
create index machines_tenant_idx on machines (tenant_id, id) where tenant_id is not null;

create table operations (
    id uuid primary key,
    kind text not null,
    target_type text not null,
    target_id uuid not null,
    tenant_id uuid references tenants (id),
    -- The target's generation this operation was created for.
    target_generation bigint not null,
    state text not null default 'pending'
        check (state in ('pending', 'running', 'succeeded', 'failed', 'superseded')),
    steps jsonb not null default '[]',
    current_step text,
    error jsonb,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now(),
    finished_at timestamptz
);
create index operations_target_idx on operations (target_id, id);
create index operations_tenant_idx on operations (tenant_id, id) where tenant_id is not null;
create index operations_open_idx on operations (state) where state in ('pending', 'running');

-- Scoped by (subject, tenant, method, path); kept 24 h.
create table idempotency_keys (
    subject text not null,
    tenant_scope uuid not null, -- the caller's tenant, or the nil uuid for provider tokens
    method text not null,
    path text not null,
    key text not null,
    request_hash bytea not null,
    -- null while the first request is still in flight
    response_status integer,
    response_headers jsonb,
    response_body bytea,
    created_at timestamptz not null default now(),
    completed_at timestamptz,
    primary key (subject, tenant_scope, method, path, key)
);
create index idempotency_keys_created_idx on idempotency_keys (created_at);

create table audit_events (
    id uuid primary key,
    at timestamptz not null default now(),
    actor_sub text not null,
    actor_roles text[] not null,
    tenant_id uuid,
    action text not null,
    target_type text not null,
    target_id uuid,
    request_id text not null,
    outcome text not null check (outcome in ('success', 'failure')),
    code text,
    details jsonb not null default '{}'
);
create index audit_events_tenant_idx on audit_events (tenant_id, id);
create index audit_events_target_idx on audit_events (target_id, id);
