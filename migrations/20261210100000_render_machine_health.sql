-- The provider's machine view carries the machine's health as its newest report says it
-- (`MachineView.health`: null when none was ever recorded), so the webhook view of a machine
-- renders it too, field for field as the Rust view serializes it.
create or replace function webhook_machine_view(m machines) returns jsonb language plpgsql stable as $$
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
        'health', (select jsonb_build_object('status', r.status, 'source', r.source,
                'observed_at', webhook_ts(r.observed_at), 'report_id', r.id, 'checks', r.checks)
            from machine_health_reports r where r.machine_id = m.id order by r.id desc limit 1),
        'bmc', jsonb_build_object('url', m.bmc_url, 'system_id', m.bmc_system_id, 'username', m.bmc_username,
            'insecure_tls', m.bmc_insecure_tls, 'has_ca_cert', m.bmc_ca_cert is not null),
        'generation', m.generation, 'etag', '"' || m.generation || '"',
        'created_at', webhook_ts(m.created_at), 'updated_at', webhook_ts(m.updated_at)));
end
$$;
