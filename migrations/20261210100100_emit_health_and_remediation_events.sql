-- Webhook events of machine health and remediation (docs/webhooks.md), written by triggers in the
-- transaction of the change, like the other events:
-- * `machine.health_reported`: a health report was recorded, whatever its source. Provider only:
--   it names machines and sources across tenancies. `data` is the report as
--   `GET /v1/machines/{machine_id}/health-reports` lists it; `subject` is that collection, so a
--   machine's reports arrive in order.
-- * `remediation.started` and `remediation.ended`: a remediation was recorded, or ended. The
--   provider and the remediation's tenant: `data` is the remediation as both
--   `GET /v1/remediations` and the tenant's `GET .../clusters/{cluster_id}/remediations` list it
--   (only the tenant's own cluster, machine, spare and report ids); `subject` is the cluster's
--   remediations collection.

-- `HealthReportView` as the provider sees it (with the reporter).
create function webhook_health_report_view(r machine_health_reports) returns jsonb language plpgsql stable as $$
begin
    return jsonb_build_object('id', r.id, 'machine_id', r.machine_id, 'status', r.status, 'checks', r.checks,
        'source', r.source, 'reporter', r.reporter, 'observed_at', webhook_ts(r.observed_at),
        'recorded_at', webhook_ts(r.recorded_at));
end
$$;

create function webhook_health_report_event() returns trigger language plpgsql as $$
begin
    if not webhook_wanted('machine.health_reported', null, false) then
        return null;
    end if;
    perform webhook_emit('dev.paddock.machine.health_reported',
        '/v1/machines/' || new.machine_id || '/health-reports', null, webhook_health_report_view(new), null);
    return null;
end
$$;
create trigger machine_health_reports_webhook after insert on machine_health_reports
    for each row execute function webhook_health_report_event();

-- `RemediationView`, the same to the provider and the tenant: the credit as the API reads it.
create function webhook_remediation_view(r machine_remediations) returns jsonb language plpgsql stable as $$
begin
    return jsonb_build_object('id', r.id, 'machine_id', r.machine_id, 'tenant_id', r.tenant_id,
        'cluster_id', r.cluster_id, 'node_pool_id', r.node_pool_id, 'reason', r.reason, 'source', r.source,
        'report_id', r.report_id, 'state', r.state, 'spare_machine_id', r.spare_machine_id,
        'started_at', webhook_ts(r.started_at), 'ended_at', webhook_ts(r.ended_at), 'outcome', r.outcome,
        'credited_seconds', (select -a.node_seconds from usage_adjustments a where a.remediation_id = r.id));
end
$$;

create function webhook_remediation_event() returns trigger language plpgsql as $$
declare
    name text;
    view jsonb;
begin
    if tg_op = 'INSERT' then
        name := 'remediation.started';
    elsif new.ended_at is not null and old.ended_at is null then
        name := 'remediation.ended';
    else
        return null;
    end if;
    if not webhook_wanted(name, new.tenant_id, true) then
        return null;
    end if;
    view := webhook_remediation_view(new);
    perform webhook_emit('dev.paddock.' || name,
        '/v1/tenants/' || new.tenant_id || '/clusters/' || new.cluster_id || '/remediations', new.tenant_id,
        view, view);
    return null;
end
$$;
create trigger machine_remediations_webhook after insert or update of ended_at on machine_remediations
    for each row execute function webhook_remediation_event();
