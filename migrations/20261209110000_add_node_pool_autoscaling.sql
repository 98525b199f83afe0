-- Elastic pools: a node pool may carry `autoscaling` (min, max and the two delays). Its target
-- is status, not spec: `desired_count` is what the autoscaler decided (the pool's `count` at
-- creation to begin with), so a scaling decision moves neither the generation nor the etag.
-- The autoscaler's memory: since when demand has asked for more (`scale_up_since`) or fewer
-- (`scale_down_since`) nodes than the target, without a break.
alter table node_pools
    add column autoscale_min integer,
    add column autoscale_max integer,
    add column scale_down_delay_seconds integer,
    add column scale_up_delay_seconds integer,
    add column desired_count integer,
    add column scale_up_since timestamptz,
    add column scale_down_since timestamptz,
    add column last_scaled_at timestamptz,
    add constraint node_pools_autoscaling_whole check (
        (autoscale_min is null) = (autoscale_max is null)
        and (autoscale_min is null) = (scale_down_delay_seconds is null)
        and (autoscale_min is null) = (scale_up_delay_seconds is null)
        and (autoscale_min is null) = (desired_count is null)),
    add constraint node_pools_autoscaling_bounds check (
        autoscale_min is null or (
            autoscale_min >= 0 and autoscale_min <= autoscale_max and autoscale_max <= 10000
            and desired_count >= 0 and desired_count <= autoscale_max
            and scale_down_delay_seconds >= 0 and scale_up_delay_seconds >= 0)),
    -- Slurm's control pods live on the system pool: it is never autoscaled.
    add constraint node_pools_system_not_autoscaled check (role <> 'system' or autoscale_min is null);

-- The autoscaler reads every autoscaled pool of a cluster at each demand check.
create index node_pools_autoscaled_idx on node_pools (cluster_id)
    where autoscale_min is not null and deleted_at is null;

-- Why paddock started an operation on its own (a scaling decision: `scale_up: 3 pending jobs
-- need 2 nodes`); null for operations a request started.
alter table operations add column reason text;

-- The webhook views follow the API's: a pool's `autoscaling` and `status.desired_count`, the
-- pool summaries' `desired_count`, an operation's `reason`; `node_pool.scaled` also fires when an
-- autoscaled pool's target moves.
create or replace function webhook_node_pool_view(p node_pools) returns jsonb language plpgsql stable as $$
begin
    return (select jsonb_build_object('id', p.id, 'cluster_id', p.cluster_id, 'name', p.name,
        'machine_class', (select c.name from machine_classes c where c.id = p.machine_class_id),
        'count', p.count, 'labels', p.labels, 'taints', p.taints, 'role', p.role,
        'remediation', jsonb_build_object('automatic', p.remediation_automatic),
        'autoscaling', case when p.autoscale_min is null then null else jsonb_build_object(
            'min', p.autoscale_min, 'max', p.autoscale_max,
            'scale_down_delay_seconds', p.scale_down_delay_seconds,
            'scale_up_delay_seconds', p.scale_up_delay_seconds) end,
        'status', jsonb_build_object('ready', p.ready, 'allocated', p.allocated,
            'desired_count', coalesce(p.desired_count, p.count),
            'conditions', webhook_conditions(p.conditions)),
        'generation', p.generation, 'etag', '"' || p.generation || '"',
        'created_at', webhook_ts(p.created_at), 'updated_at', webhook_ts(p.updated_at)));
end
$$;

create or replace function webhook_node_pool_event() returns trigger language plpgsql as $$
declare
    view jsonb;
begin
    if (new.count = old.count and new.desired_count is not distinct from old.desired_count)
        or not webhook_wanted('node_pool.scaled', new.tenant_id, true) then
        return null;
    end if;
    view := webhook_node_pool_view(new);
    perform webhook_emit('dev.paddock.node_pool.scaled',
        '/v1/tenants/' || new.tenant_id || '/clusters/' || new.cluster_id || '/node-pools/' || new.id,
        new.tenant_id, view, view);
    return null;
end
$$;

drop trigger node_pools_webhook on node_pools;
create trigger node_pools_webhook after update of count, desired_count on node_pools
    for each row execute function webhook_node_pool_event();

create or replace function webhook_operation_view(o operations) returns jsonb language plpgsql stable as $$
begin
    return (select jsonb_build_object('id', o.id, 'kind', o.kind,
        'target', jsonb_build_object('type', o.target_type, 'id', o.target_id),
        'tenant_id', o.tenant_id, 'state', o.state,
        'steps', (select coalesce(jsonb_agg(jsonb_build_object('name', x->'name', 'state', x->'state',
            'started_at', webhook_ts_json(x->'started_at'), 'finished_at', webhook_ts_json(x->'finished_at'))
            order by n), '[]') from jsonb_array_elements(o.steps) with ordinality e(x, n)),
        'current_step', o.current_step,
        'error', o.error, 'reason', o.reason,
        'created_at', webhook_ts(o.created_at), 'finished_at', webhook_ts(o.finished_at)));
end
$$;

create or replace function webhook_cluster_view(c clusters) returns jsonb language plpgsql stable as $$
begin
    return (with live as (
        select p.id, p.name, mc.name as machine_class, p.count, p.role,
            coalesce(p.desired_count, p.count) as desired_count,
            row_number() over (order by p.id) as n
        from node_pools p join machine_classes mc on mc.id = p.machine_class_id
        where p.cluster_id = c.id and p.deleted_at is null and p.deletion_requested_at is null
    ), compute as (
        select l.name, row_number() over (order by l.n) as n from live l where l.role = 'compute'
    )
    select jsonb_build_object('id', c.id, 'tenant_id', c.tenant_id, 'name', c.name, 'kind', c.kind,
        'isolation', c.isolation, 'kubernetes_version', c.kubernetes_version,
        'slurm', case
            when c.slurm is null then null
            when jsonb_array_length(coalesce(c.slurm -> 'partitions', '[]')) > 0 then c.slurm
            else c.slurm || jsonb_build_object('partitions', coalesce((
                select jsonb_agg(jsonb_build_object('name', k.name, 'node_pools', jsonb_build_array(k.name),
                    'default', k.n = 1, 'max_time', null) order by k.n) from compute k), '[]'))
        end,
        'stack_version', c.stack_version,
        'node_pools', coalesce((select jsonb_agg(jsonb_build_object('id', l.id, 'name', l.name,
            'machine_class', l.machine_class, 'count', l.count, 'role', l.role,
            'desired_count', l.desired_count) order by l.n) from live l), '[]'),
        'status', jsonb_build_object('phase', c.phase, 'conditions', webhook_conditions(c.conditions),
            'observed_generation', c.observed_generation,
            'endpoints', jsonb_build_object('kubernetes_api', c.endpoints -> 'kubernetes_api',
                'slurm_rest_api', c.endpoints -> 'slurm_rest_api', 'login_ssh', c.endpoints -> 'login_ssh',
                'login_ssh_host_keys', coalesce(c.endpoints -> 'login_ssh_host_keys', '[]'))),
        'generation', c.generation, 'etag', '"' || c.generation || '"',
        'created_at', webhook_ts(c.created_at), 'updated_at', webhook_ts(c.updated_at)));
end
$$;

-- The Node names the last scale-down found idle (Slurm's idle nodes): the machines given back
-- first, so a shrink does not drain a node that runs jobs while an idle one stays.
alter table node_pools add column release_first text[] not null default '{}';
