-- Remediation: a machine a tenant holds that is reported `failed` (or that its tenant asks to
-- replace) is swapped for a spare of its class in the same pool, and goes to maintenance once the
-- spare is active.

-- Whether a `failed` health report starts a remediation on its own (a tenant's `replace` always does).
alter table node_pools add column remediation_automatic boolean not null default true;

create table machine_remediations (
    id uuid primary key,
    machine_id uuid not null references machines (id),
    tenant_id uuid not null references tenants (id),
    cluster_id uuid not null,
    node_pool_id uuid not null references node_pools (id),
    -- The tenancy it replaces the machine in.
    allocation_id uuid not null references machine_allocations (id),
    reason text not null,
    source text not null check (source in ('operator', 'bmc', 'kubernetes', 'tenant')),
    -- The health report that started it (none for a tenant's request).
    report_id uuid references machine_health_reports (id),
    -- awaiting_spare -> replacing (a spare allocated) -> releasing (the spare active, the machine
    -- on its way to maintenance) -> ended; needs_operator: never released automatically.
    state text not null check (state in ('awaiting_spare', 'replacing', 'releasing', 'needs_operator', 'ended')),
    spare_machine_id uuid references machines (id),
    started_at timestamptz not null default now(),
    ended_at timestamptz,
    -- replaced: the spare took over and the machine left; released: the machine left the tenancy
    -- otherwise (scaled away, the cluster deleted, an operator's intent) before a spare took over.
    outcome text check (outcome in ('replaced', 'released')),
    updated_at timestamptz not null default now(),
    foreign key (cluster_id, tenant_id) references clusters (id, tenant_id),
    check ((state = 'ended') = (ended_at is not null) and (ended_at is null) = (outcome is null))
);
-- At most one open remediation per machine.
create unique index machine_remediations_open_key on machine_remediations (machine_id) where ended_at is null;
create index machine_remediations_cluster_idx on machine_remediations (tenant_id, cluster_id, id);

-- What started a remediation is evidence: it never changes, and an ended remediation is final.
-- Only the state, the spare and the end move, by guarded updates.
create function machine_remediations_evidence() returns trigger language plpgsql as $$
begin
    if tg_op <> 'UPDATE' then
        raise exception 'machine_remediations: % is not allowed', tg_op using errcode = '42501';
    end if;
    if old.state = 'ended'
       or (new.id, new.machine_id, new.tenant_id, new.cluster_id, new.node_pool_id, new.allocation_id,
           new.reason, new.source, new.report_id, new.started_at)
          is distinct from
          (old.id, old.machine_id, old.tenant_id, old.cluster_id, old.node_pool_id, old.allocation_id,
           old.reason, old.source, old.report_id, old.started_at) then
        raise exception 'machine_remediations: what started remediation % does not change, and an ended one is final',
            old.id using errcode = '42501';
    end if;
    return new;
end
$$;
create trigger machine_remediations_evidence before update or delete on machine_remediations
    for each row execute function machine_remediations_evidence();
create trigger machine_remediations_no_truncate before truncate on machine_remediations
    for each statement execute function machine_remediations_evidence();

create or replace function paddock_grant_runtime(runtime name) returns void language plpgsql as $$
begin
    if runtime = current_user then
        -- One role for both: it owns the tables, and grants would change nothing it can do.
        raise notice 'paddock: the runtime role % is the migrating role; nothing to grant', runtime;
        return;
    end if;
    execute format('grant usage on schema public to %I', runtime);
    execute format('grant select, insert, update, delete on all tables in schema public to %I', runtime);
    execute format('grant usage, select on all sequences in schema public to %I', runtime);
    -- The evidence: read and append only.
    execute format('revoke update, delete, truncate, references, trigger on custody_entries, custody_checkpoints, '
                   'machine_class_prices, machine_health_reports from %I', runtime);
    -- Remediations: their state moves (guarded, and the trigger keeps what started them), but none
    -- is ever deleted.
    execute format('revoke delete, truncate, references, trigger on machine_remediations from %I', runtime);
    -- Migrations are the migrating role's; the runtime only checks that they are applied.
    execute format('revoke insert, update, delete, truncate on _sqlx_migrations from %I', runtime);
end
$$;

revoke execute on function paddock_grant_runtime(name) from public;

-- The webhook view of a node pool carries its remediation setting, as the API's view does.
create or replace function webhook_node_pool_view(p node_pools) returns jsonb language plpgsql stable as $$
begin
    return (select jsonb_build_object('id', p.id, 'cluster_id', p.cluster_id, 'name', p.name,
        'machine_class', (select c.name from machine_classes c where c.id = p.machine_class_id),
        'count', p.count, 'labels', p.labels, 'taints', p.taints, 'role', p.role,
        'remediation', jsonb_build_object('automatic', p.remediation_automatic),
        'status', jsonb_build_object('ready', p.ready, 'allocated', p.allocated,
            'conditions', webhook_conditions(p.conditions)),
        'generation', p.generation, 'etag', '"' || p.generation || '"',
        'created_at', webhook_ts(p.created_at), 'updated_at', webhook_ts(p.updated_at)));
end
$$;
