-- Webhook events carry the API's own views, only when someone wants them, and wake the workers
-- (docs/webhooks.md).
--
-- * `data` is exactly what the API returns for the resource to the audience: the triggers below
--   render `MachineView`, `ClusterView`, `NodePoolView` and `OperationView` field for field as
--   the Rust views serialize them (timestamps as chrono writes them, defaults filled as the store
--   reads them). tests/api/webhooks.rs fetches each resource through the API right after each
--   event type and compares, so a view that changes without these functions fails CI.
--   `usage.period_closed` is no longer a trigger: its view holds a setting (`closable_at`) and
--   its one writer (closing a period) renders it in Rust in the same transaction.
-- * An event is written only when an enabled subscription of an audience that sees it names its
--   type (`webhook_interest`): a machine's transition costs one primary-key probe, not a row kept
--   7 days, when nobody listens. A subscription receives the events from its creation on.
-- * Writing an event notifies `paddock_jobs` (payload `webhook`) at commit: the job queue's
--   channel, on which every worker already listens, wakes the deliverer.

-- A timestamp as chrono serializes a `DateTime<Utc>`: RFC 3339, `Z`, and 0, 3 or 6 fractional
-- digits as needed. One expression, so that it is inlined where it is called. The functions with
-- queries below are PL/pgSQL, whose plans a session keeps: a SQL function's would be made again
-- in every transaction that fires a trigger.
create function webhook_ts(t timestamptz) returns text language sql stable as $$
    select to_char(t at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
        || case
            when extract(microseconds from t at time zone 'UTC')::bigint % 1000000 = 0 then ''
            when extract(microseconds from t at time zone 'UTC')::bigint % 1000 = 0
                then '.' || lpad((extract(microseconds from t at time zone 'UTC')::bigint % 1000000 / 1000)::text, 3, '0')
            else '.' || lpad((extract(microseconds from t at time zone 'UTC')::bigint % 1000000)::text, 6, '0')
        end || 'Z'
$$;

-- A timestamp inside stored JSON (written by Rust as `...Z`, or by SQL's `now()` as `...+00:00`)
-- as the API shows it once serde has read it.
create function webhook_ts_json(j jsonb) returns jsonb language sql stable as $$
    select to_jsonb(webhook_ts((j #>> '{}')::timestamptz))
$$;

-- Conditions (`Condition`) as the API shows them.
create function webhook_conditions(c jsonb) returns jsonb language plpgsql stable as $$
begin
    return (select coalesce(jsonb_agg(jsonb_build_object('type', x->'type', 'status', x->'status',
        'reason', x->'reason', 'message', x->'message',
        'last_transition_time', webhook_ts_json(x->'last_transition_time')) order by n), '[]')
        from jsonb_array_elements(c) with ordinality e(x, n));
end
$$;

-- Which events enabled subscriptions want, per audience: what a change looks up (one primary-key
-- probe) to know whether to write an event. Kept by a trigger on `webhook_subscriptions`; a few
-- rows per tenant at most. (A lookup in `webhook_subscriptions` itself scans every subscription
-- under a generic plan: 3.6 ms per change with 10,000 of them.)
create table webhook_interest (
    -- The event's name without `dev.paddock.`.
    event text not null,
    -- The subscriptions' tenant; the nil uuid for the provider's.
    tenant_id uuid not null,
    -- Enabled subscriptions naming it.
    subscriptions integer not null check (subscriptions >= 0),
    primary key (event, tenant_id)
);

create function webhook_interest_change() returns trigger language plpgsql as $$
declare
    nil constant uuid := '00000000-0000-0000-0000-000000000000';
begin
    if tg_op in ('UPDATE', 'DELETE') and old.enabled then
        update webhook_interest i set subscriptions = i.subscriptions - 1
        from (select distinct e from unnest(old.events) e) named
        where i.event = named.e and i.tenant_id = coalesce(old.tenant_id, nil);
    end if;
    if tg_op in ('INSERT', 'UPDATE') and new.enabled then
        insert into webhook_interest (event, tenant_id, subscriptions)
        select distinct e, coalesce(new.tenant_id, nil), 1 from unnest(new.events) e
        on conflict (event, tenant_id) do update set subscriptions = webhook_interest.subscriptions + 1;
    end if;
    return null;
end
$$;
create trigger webhook_subscriptions_interest after insert or delete or update of enabled, events, tenant_id
    on webhook_subscriptions for each row execute function webhook_interest_change();
insert into webhook_interest (event, tenant_id, subscriptions)
select e, coalesce(s.tenant_id, '00000000-0000-0000-0000-000000000000'), count(*)
from webhook_subscriptions s, unnest(s.events) e where s.enabled group by 1, 2;

-- Whether an enabled subscription wants events of `p_name` (without `dev.paddock.`): a provider
-- one, or, when tenants see the event, one of tenant `p_tenant`.
create function webhook_wanted(p_name text, p_tenant uuid, p_tenant_sees boolean)
returns boolean language plpgsql stable as $$
begin
    return (select exists (
        select 1 from webhook_interest i
        where i.event = p_name and i.subscriptions > 0
          and (i.tenant_id = '00000000-0000-0000-0000-000000000000' or (p_tenant_sees and i.tenant_id = p_tenant))
    ));
end
$$;

-- Writes an event when some subscription wants it, and wakes the deliverers at commit.
create or replace function webhook_emit(p_type text, p_subject text, p_tenant uuid, p_provider jsonb, p_tenant_view jsonb)
returns void language plpgsql as $$
begin
    if not webhook_wanted(substr(p_type, 13), p_tenant, p_tenant_view is not null) then
        return;
    end if;
    insert into webhook_events (id, type, subject, tenant_id, data_provider, data_tenant)
    values (gen_random_uuid(), p_type, p_subject, p_tenant, p_provider, p_tenant_view);
    perform pg_notify('paddock_jobs', 'webhook');
end
$$;

-- `OperationView`: the same to the provider and to its tenant.
create function webhook_operation_view(o operations) returns jsonb language plpgsql stable as $$
begin
    return (select jsonb_build_object('id', o.id, 'kind', o.kind,
        'target', jsonb_build_object('type', o.target_type, 'id', o.target_id),
        'tenant_id', o.tenant_id, 'state', o.state,
        'steps', (select coalesce(jsonb_agg(jsonb_build_object('name', x->'name', 'state', x->'state',
            'started_at', webhook_ts_json(x->'started_at'), 'finished_at', webhook_ts_json(x->'finished_at'))
            order by n), '[]') from jsonb_array_elements(o.steps) with ordinality e(x, n)),
        'current_step', o.current_step,
        'error', o.error, 'created_at', webhook_ts(o.created_at), 'finished_at', webhook_ts(o.finished_at)));
end
$$;

create or replace function webhook_operation_event() returns trigger language plpgsql as $$
declare
    name text := 'operation.' || new.state;
    view jsonb;
begin
    if new.state = old.state or new.state not in ('succeeded', 'failed')
        or not webhook_wanted(name, new.tenant_id, new.tenant_id is not null) then
        return null;
    end if;
    view := webhook_operation_view(new);
    perform webhook_emit('dev.paddock.' || name, '/v1/operations/' || new.id, new.tenant_id,
        view, case when new.tenant_id is null then null else view end);
    return null;
end
$$;

-- `NodePoolView`, the same to the provider and the tenant.
create function webhook_node_pool_view(p node_pools) returns jsonb language plpgsql stable as $$
begin
    return (select jsonb_build_object('id', p.id, 'cluster_id', p.cluster_id, 'name', p.name,
        'machine_class', (select c.name from machine_classes c where c.id = p.machine_class_id),
        'count', p.count, 'labels', p.labels, 'taints', p.taints,
        'status', jsonb_build_object('ready', p.ready, 'allocated', p.allocated,
            'conditions', webhook_conditions(p.conditions)),
        'generation', p.generation, 'etag', '"' || p.generation || '"',
        'created_at', webhook_ts(p.created_at), 'updated_at', webhook_ts(p.updated_at)));
end
$$;

create or replace function webhook_node_pool_event() returns trigger language plpgsql as $$
declare
    view jsonb;
begin
    if new.count = old.count or not webhook_wanted('node_pool.scaled', new.tenant_id, true) then
        return null;
    end if;
    view := webhook_node_pool_view(new);
    perform webhook_emit('dev.paddock.node_pool.scaled',
        '/v1/tenants/' || new.tenant_id || '/clusters/' || new.cluster_id || '/node-pools/' || new.id,
        new.tenant_id, view, view);
    return null;
end
$$;

-- `ClusterView`: its live pools (not deleting) by id, Slurm partitions resolved (one per pool,
-- the first the default, when none are given), endpoints with their defaults. The same to the
-- provider and the tenant: no machine or fleet fact is in it.
create function webhook_cluster_view(c clusters) returns jsonb language plpgsql stable as $$
begin
    return (with live as (
        select p.id, p.name, mc.name as machine_class, p.count,
            row_number() over (order by p.id) as n
        from node_pools p join machine_classes mc on mc.id = p.machine_class_id
        where p.cluster_id = c.id and p.deleted_at is null and p.deletion_requested_at is null
    )
    select jsonb_build_object('id', c.id, 'tenant_id', c.tenant_id, 'name', c.name, 'kind', c.kind,
        'isolation', c.isolation, 'kubernetes_version', c.kubernetes_version,
        'slurm', case
            when c.slurm is null then null
            when jsonb_array_length(coalesce(c.slurm -> 'partitions', '[]')) > 0 then c.slurm
            else c.slurm || jsonb_build_object('partitions', coalesce((
                select jsonb_agg(jsonb_build_object('name', l.name, 'node_pools', jsonb_build_array(l.name),
                    'default', l.n = 1, 'max_time', null) order by l.n) from live l), '[]'))
        end,
        'stack_version', c.stack_version,
        'node_pools', coalesce((select jsonb_agg(jsonb_build_object('id', l.id, 'name', l.name,
            'machine_class', l.machine_class, 'count', l.count) order by l.n) from live l), '[]'),
        'status', jsonb_build_object('phase', c.phase, 'conditions', webhook_conditions(c.conditions),
            'observed_generation', c.observed_generation,
            'endpoints', jsonb_build_object('kubernetes_api', c.endpoints -> 'kubernetes_api',
                'slurm_rest_api', c.endpoints -> 'slurm_rest_api', 'login_ssh', c.endpoints -> 'login_ssh',
                'login_ssh_host_keys', coalesce(c.endpoints -> 'login_ssh_host_keys', '[]'))),
        'generation', c.generation, 'etag', '"' || c.generation || '"',
        'created_at', webhook_ts(c.created_at), 'updated_at', webhook_ts(c.updated_at)));
end
$$;

create or replace function webhook_cluster_event() returns trigger language plpgsql as $$
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
    if not webhook_wanted(name, new.tenant_id, true) then
        return null;
    end if;
    view := webhook_cluster_view(new);
    perform webhook_emit('dev.paddock.' || name,
        '/v1/tenants/' || new.tenant_id || '/clusters/' || new.id, new.tenant_id, view, view);
    return null;
end
$$;

-- `MachineView` (never the BMC password): a fleet fact, the provider's only.
create function webhook_machine_view(m machines) returns jsonb language plpgsql stable as $$
begin
    return (select jsonb_build_object('id', m.id, 'name', m.name,
        'machine_class', (select c.name from machine_classes c where c.id = m.machine_class_id),
        'labels', m.labels, 'state', m.state,
        'last_error', case when jsonb_typeof(m.last_error) = 'object' then jsonb_build_object(
            'code', m.last_error->'code', 'message', m.last_error->'message',
            'at', webhook_ts_json(m.last_error->'at')) end,
        'tenant_id', m.tenant_id,
        'cluster_id', m.cluster_id, 'node_pool_id', m.node_pool_id, 'node_name', m.node_name,
        'system_uuid', m.system_uuid, 'inventory', m.inventory, 'maintenance_reason', m.maintenance_reason,
        'bmc', jsonb_build_object('url', m.bmc_url, 'system_id', m.bmc_system_id, 'username', m.bmc_username,
            'insecure_tls', m.bmc_insecure_tls, 'has_ca_cert', m.bmc_ca_cert is not null),
        'generation', m.generation, 'etag', '"' || m.generation || '"',
        'created_at', webhook_ts(m.created_at), 'updated_at', webhook_ts(m.updated_at)));
end
$$;

create or replace function webhook_machine_event() returns trigger language plpgsql as $$
declare
    changed boolean;
    quarantined boolean;
    view jsonb;
begin
    if new.state = old.state then
        return null;
    end if;
    changed := webhook_wanted('machine.state_changed', null, false);
    quarantined := new.state = 'clean_failed' and webhook_wanted('machine.quarantined', null, false);
    if not (changed or quarantined) then
        return null;
    end if;
    view := webhook_machine_view(new);
    if changed then
        perform webhook_emit('dev.paddock.machine.state_changed', '/v1/machines/' || new.id, null, view, null);
    end if;
    if quarantined then
        perform webhook_emit('dev.paddock.machine.quarantined', '/v1/machines/' || new.id, null, view, null);
    end if;
    return null;
end
$$;

drop trigger usage_periods_webhook on usage_periods;
drop function webhook_usage_period_event();
