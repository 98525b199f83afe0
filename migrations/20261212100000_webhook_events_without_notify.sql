-- An event no longer notifies at commit: a transaction that calls `pg_notify` takes PostgreSQL's
-- notify lock at its commit and holds it through the commit's flush, so every commit that changed a
-- subscribed resource waited for the one before it. The deliverers look for new events instead
-- (docs/webhooks.md, "Delivery").
create or replace function webhook_emit(p_type text, p_subject text, p_tenant uuid, p_provider jsonb, p_tenant_view jsonb)
returns void language plpgsql as $$
begin
    if not webhook_wanted(substr(p_type, 13), p_tenant, p_tenant_view is not null) then
        return;
    end if;
    insert into webhook_events (id, type, subject, tenant_id, data_provider, data_tenant)
    values (gen_random_uuid(), p_type, p_subject, p_tenant, p_provider, p_tenant_view);
end
$$;
