-- The webhook views follow the identity sync of Slurm clusters: the cluster view carries
-- `slurm.accounts` (empty for clusters stored before it) and `status.identity` (the last sync of the
-- tenant's people into the cluster's Slurm, null until then), as the API shows them.

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
            when jsonb_array_length(coalesce(c.slurm -> 'partitions', '[]')) > 0
                then jsonb_build_object('accounts', '[]'::jsonb) || c.slurm
            else jsonb_build_object('accounts', '[]'::jsonb) || c.slurm || jsonb_build_object('partitions', coalesce((
                select jsonb_agg(jsonb_build_object('name', k.name, 'node_pools', jsonb_build_array(k.name),
                    'default', k.n = 1, 'max_time', null) order by k.n) from compute k), '[]'))
        end,
        'ray', c.ray,
        'stack_version', c.stack_version,
        'node_pools', coalesce((select jsonb_agg(jsonb_build_object('id', l.id, 'name', l.name,
            'machine_class', l.machine_class, 'count', l.count, 'role', l.role,
            'desired_count', l.desired_count) order by l.n) from live l), '[]'),
        'status', jsonb_build_object('phase', c.phase, 'conditions', webhook_conditions(c.conditions),
            'observed_generation', c.observed_generation,
            'endpoints', jsonb_build_object('kubernetes_api', c.endpoints -> 'kubernetes_api',
                'slurm_rest_api', c.endpoints -> 'slurm_rest_api', 'login_ssh', c.endpoints -> 'login_ssh',
                'login_ssh_host_keys', coalesce(c.endpoints -> 'login_ssh_host_keys', '[]'),
                'ray_client', c.endpoints -> 'ray_client', 'dashboard', c.endpoints -> 'dashboard'),
            'identity', c.identity_sync),
        'generation', c.generation, 'etag', '"' || c.generation || '"',
        'created_at', webhook_ts(c.created_at), 'updated_at', webhook_ts(c.updated_at)));
end
$$;
