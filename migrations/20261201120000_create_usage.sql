-- Metering (SPEC section 7): usage segments, adjustments and closed billing periods.
--
-- `btree_gist` is a trusted extension: the role running `paddock migrate` needs CREATE on the
-- database (not superuser) to install it. It lets one exclusion constraint combine a machine's id
-- (`=`) with its segment's time range (`&&`).
create extension if not exists btree_gist;

-- One row per interval during which a machine was held by a tenant cluster's node pool (`machine`,
-- opened when it became `active`, closed when it left the tenant's control), or a cluster's
-- control plane existed (`control_plane`, first `ready` to deletion start). Bounds are whole
-- seconds from `clock_timestamp()` of the writing transaction, half-open `[start_at, end_at)`.
-- No foreign keys: usage outlives the clusters, pools and tenants it names.
create table usage_segments (
    id uuid primary key,
    kind text not null check (kind in ('machine', 'control_plane')),
    tenant_id uuid not null,
    cluster_id uuid not null,
    node_pool_id uuid,
    machine_id uuid,
    -- The allocation a machine segment bills: at most one segment per allocation, so a replayed
    -- activation writes nothing.
    allocation_id uuid unique,
    machine_class text,
    gpu_model text not null default '',
    gpu_count integer not null default 0 check (gpu_count >= 0),
    start_at timestamptz not null check (start_at = date_trunc('second', start_at, 'UTC')),
    end_at timestamptz check (end_at = date_trunc('second', end_at, 'UTC')),
    close_reason text,
    check (end_at is null or end_at >= start_at),
    check ((end_at is null) = (close_reason is null)),
    check ((kind = 'machine') = (machine_id is not null and node_pool_id is not null
        and allocation_id is not null and machine_class is not null)),
    -- Two segments of one machine never overlap (an open segment reaches to infinity).
    constraint usage_segments_no_overlap
        exclude using gist (machine_id with =, tstzrange(start_at, end_at, '[)') with &&) where (kind = 'machine')
);
create unique index usage_segments_control_plane_key on usage_segments (cluster_id) where kind = 'control_plane';
create index usage_segments_start_idx on usage_segments (start_at, id);
create index usage_segments_tenant_start_idx on usage_segments (tenant_id, start_at, id);
create index usage_segments_open_idx on usage_segments (machine_id) where end_at is null;

-- Nothing about a segment changes but its one close (end and reason, from null); none is deleted.
create function usage_segments_immutable() returns trigger language plpgsql as $$
begin
    if tg_op = 'DELETE' then
        raise exception 'usage segments are never deleted' using errcode = 'P0001';
    end if;
    if old.end_at is not null
       or (new.id, new.kind, new.tenant_id, new.cluster_id, new.node_pool_id, new.machine_id, new.allocation_id,
           new.machine_class, new.gpu_model, new.gpu_count, new.start_at)
          is distinct from
          (old.id, old.kind, old.tenant_id, old.cluster_id, old.node_pool_id, old.machine_id, old.allocation_id,
           old.machine_class, old.gpu_model, old.gpu_count, old.start_at) then
        raise exception 'a usage segment only closes once' using errcode = 'P0001';
    end if;
    return new;
end $$;
create trigger usage_segments_immutable before update or delete on usage_segments
    for each row execute function usage_segments_immutable();

-- Corrections (`POST /v1/usage/adjustments`): signed seconds, recorded in the open period.
create table usage_adjustments (
    id uuid primary key,
    tenant_id uuid not null,
    cluster_id uuid,
    machine_class text not null,
    node_seconds bigint not null,
    gpu_seconds bigint not null,
    control_plane_seconds bigint not null,
    corrects_period text check (corrects_period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    reason text not null,
    actor text not null,
    recorded_at timestamptz not null check (recorded_at = date_trunc('second', recorded_at, 'UTC'))
);
create index usage_adjustments_recorded_idx on usage_adjustments (recorded_at, id);

-- Closed billing periods (UTC months): the signed manifest, stored as the exact text answered.
create table usage_periods (
    period text primary key check (period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    as_of timestamptz not null,
    manifest text not null,
    signature text not null,
    key_id text not null,
    closed_by text not null,
    closed_at timestamptz not null default now()
);

create function usage_rows_immutable() returns trigger language plpgsql as $$
begin
    raise exception '% rows never change', tg_table_name using errcode = 'P0001';
end $$;
create trigger usage_adjustments_immutable before update or delete on usage_adjustments
    for each row execute function usage_rows_immutable();
create trigger usage_periods_immutable before update or delete on usage_periods
    for each row execute function usage_rows_immutable();
