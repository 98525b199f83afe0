-- Signed, durable webhooks (docs/webhooks.md).
--
-- `webhook_events` is written by triggers on the tables whose changes cause an event, so an event
-- row commits or rolls back with its change, whatever code path made it. Each event carries its
-- data rendered once per audience: `data_provider` (what the provider's API shows) and
-- `data_tenant` (what the owning tenant's API shows; null when tenants never see the event).
-- The worker fans events out to the matching subscriptions (`webhook_deliveries`) and delivers
-- them under a lease, in order per (subscription, subject).

create table webhook_subscriptions (
    id uuid primary key,
    -- null: a provider subscription (every event); set: that tenant's events only.
    tenant_id uuid references tenants (id),
    url text not null,
    events text[] not null,
    description text not null default '',
    enabled boolean not null default true,
    disabled_reason text,
    -- `whsec_...`, AES-256-GCM bound to (webhook_subscriptions, secret_enc, id).
    secret_enc bytea not null,
    -- The secret before the last rotation, still signing until `previous_secret_until`.
    previous_secret_enc bytea,
    previous_secret_until timestamptz,
    generation bigint not null default 1,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now()
);
create index webhook_subscriptions_tenant_idx on webhook_subscriptions (tenant_id, id);

create table webhook_events (
    id uuid primary key,
    -- Commit order per subject follows this: the trigger runs while the changed row is locked.
    seq bigserial not null unique,
    type text not null,
    subject text not null,
    tenant_id uuid,
    data_provider jsonb not null,
    data_tenant jsonb,
    occurred_at timestamptz not null default clock_timestamp(),
    fanned_out boolean not null default false
);
create index webhook_events_unfanned_idx on webhook_events (seq) where not fanned_out;
create index webhook_events_occurred_idx on webhook_events (occurred_at);

create table webhook_deliveries (
    id uuid primary key,
    subscription_id uuid not null references webhook_subscriptions (id) on delete cascade,
    event_id uuid not null references webhook_events (id) on delete cascade,
    event_seq bigint not null,
    subject text not null,
    state text not null default 'pending' check (state in ('pending', 'delivered', 'failed')),
    attempts integer not null default 0,
    next_attempt_at timestamptz not null default now(),
    locked_by text,
    locked_until timestamptz,
    last_status integer,
    last_error text,
    last_latency_ms integer,
    created_at timestamptz not null default now(),
    delivered_at timestamptz,
    unique (subscription_id, event_id)
);
create index webhook_deliveries_due_idx on webhook_deliveries (next_attempt_at) where state = 'pending';
create index webhook_deliveries_subject_idx on webhook_deliveries (subscription_id, subject, event_seq)
    where state <> 'delivered';

create table webhook_attempts (
    delivery_id uuid not null references webhook_deliveries (id) on delete cascade,
    attempt integer not null,
    at timestamptz not null default now(),
    status integer,
    latency_ms integer not null,
    error text,
    primary key (delivery_id, attempt)
);

create function webhook_emit(p_type text, p_subject text, p_tenant uuid, p_provider jsonb, p_tenant_view jsonb)
returns void language sql as $$
    insert into webhook_events (id, type, subject, tenant_id, data_provider, data_tenant)
    values (gen_random_uuid(), p_type, p_subject, p_tenant, p_provider, p_tenant_view);
$$;

-- An operation as `GET /v1/operations/{id}` shows it, the same to the provider and its tenant.
create function webhook_operation_event() returns trigger language plpgsql as $$
declare
    view jsonb;
begin
    if new.state = old.state or new.state not in ('succeeded', 'failed') then
        return null;
    end if;
    view := jsonb_build_object('id', new.id, 'kind', new.kind,
        'target', jsonb_build_object('type', new.target_type, 'id', new.target_id),
        'tenant_id', new.tenant_id, 'state', new.state, 'steps', new.steps,
        'current_step', new.current_step, 'error', new.error, 'created_at', new.created_at,
        'finished_at', new.finished_at);
    perform webhook_emit('dev.paddock.operation.' || new.state, '/v1/operations/' || new.id, new.tenant_id,
        view, case when new.tenant_id is null then null else view end);
    return null;
end
$$;
create trigger operations_webhook after update of state on operations
    for each row execute function webhook_operation_event();

-- A cluster's own fields and status (its node pools have events of their own). No machine or
-- fleet fact is in it, so both audiences get the same view.
create function webhook_cluster_event() returns trigger language plpgsql as $$
declare
    name text;
    view jsonb;
begin
    if new.deleted_at is not null and old.deleted_at is null then
        name := 'cluster.deleted';
    elsif new.phase is distinct from old.phase and new.phase in ('ready', 'degraded') then
        name := 'cluster.' || new.phase;
    else
        return null;
    end if;
    view := jsonb_build_object('id', new.id, 'tenant_id', new.tenant_id, 'name', new.name, 'kind', new.kind,
        'isolation', new.isolation, 'kubernetes_version', new.kubernetes_version,
        'status', jsonb_build_object('phase', new.phase, 'conditions', new.conditions,
            'observed_generation', new.observed_generation, 'endpoints', new.endpoints),
        'generation', new.generation, 'etag', '"' || new.generation || '"',
        'created_at', new.created_at, 'updated_at', new.updated_at, 'deleted_at', new.deleted_at);
    perform webhook_emit('dev.paddock.' || name,
        '/v1/tenants/' || new.tenant_id || '/clusters/' || new.id, new.tenant_id, view, view);
    return null;
end
$$;
create trigger clusters_webhook after update on clusters
    for each row execute function webhook_cluster_event();

create function webhook_node_pool_event() returns trigger language plpgsql as $$
declare
    view jsonb;
begin
    if new.count = old.count then
        return null;
    end if;
    view := jsonb_build_object('id', new.id, 'tenant_id', new.tenant_id, 'cluster_id', new.cluster_id,
        'name', new.name, 'count', new.count, 'previous_count', old.count, 'labels', new.labels,
        'taints', new.taints, 'status', jsonb_build_object('ready', new.ready, 'allocated', new.allocated),
        'generation', new.generation, 'etag', '"' || new.generation || '"', 'updated_at', new.updated_at);
    perform webhook_emit('dev.paddock.node_pool.scaled',
        '/v1/tenants/' || new.tenant_id || '/clusters/' || new.cluster_id || '/node-pools/' || new.id,
        new.tenant_id, view, view);
    return null;
end
$$;
create trigger node_pools_webhook after update of count on node_pools
    for each row execute function webhook_node_pool_event();

-- Machines are fleet facts: provider audience only.
create function webhook_machine_event() returns trigger language plpgsql as $$
declare
    view jsonb;
begin
    if new.state = old.state then
        return null;
    end if;
    view := jsonb_build_object('id', new.id, 'name', new.name, 'machine_class_id', new.machine_class_id,
        'state', new.state, 'previous_state', old.state, 'last_error', new.last_error,
        'tenant_id', new.tenant_id, 'cluster_id', new.cluster_id, 'node_pool_id', new.node_pool_id,
        'maintenance_reason', new.maintenance_reason, 'generation', new.generation,
        'updated_at', new.updated_at);
    perform webhook_emit('dev.paddock.machine.state_changed', '/v1/machines/' || new.id, null, view, null);
    if new.state = 'clean_failed' then
        perform webhook_emit('dev.paddock.machine.quarantined', '/v1/machines/' || new.id, null, view, null);
    end if;
    return null;
end
$$;
create trigger machines_webhook after update of state on machines
    for each row execute function webhook_machine_event();

create function webhook_usage_period_event() returns trigger language plpgsql as $$
begin
    perform webhook_emit('dev.paddock.usage.period_closed', '/v1/usage/periods/' || new.period, null,
        jsonb_build_object('period', new.period, 'as_of', new.as_of, 'key_id', new.key_id,
            'closed_by', new.closed_by, 'closed_at', new.closed_at), null);
    return null;
end
$$;
create trigger usage_periods_webhook after insert on usage_periods
    for each row execute function webhook_usage_period_event();
