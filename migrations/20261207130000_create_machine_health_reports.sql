-- Machine health reports: what was said about a machine's health, by whom, recorded as said.
-- Append-only like the custody ledger: a report is evidence (a remediation and a credit will
-- point at the one that started them), so the runtime role may read and append, nothing more.
create table machine_health_reports (
    id uuid primary key,
    machine_id uuid not null references machines (id),
    -- The tenancy the machine was in when the report was recorded: its tenant reads the report.
    allocation_id uuid references machine_allocations (id),
    status text not null check (status in ('healthy', 'degraded', 'failed')),
    -- [{name, status, detail}], validated by the API.
    checks jsonb not null check (jsonb_typeof(checks) = 'array'),
    source text not null check (source in ('operator', 'bmc', 'kubernetes')),
    -- The operator's token subject; `paddock` for what the worker read (the BMC, the tenant's Nodes).
    reporter text not null,
    observed_at timestamptz not null,
    recorded_at timestamptz not null default now()
);
create index machine_health_reports_machine_idx on machine_health_reports (machine_id, id);
create index machine_health_reports_allocation_idx on machine_health_reports (allocation_id, id)
    where allocation_id is not null;

create trigger machine_health_reports_append_only before update or delete on machine_health_reports
    for each row execute function custody_entries_append_only();
create trigger machine_health_reports_no_truncate before truncate on machine_health_reports
    for each statement execute function custody_entries_append_only();

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
    -- Migrations are the migrating role's; the runtime only checks that they are applied.
    execute format('revoke insert, update, delete, truncate on _sqlx_migrations from %I', runtime);
end
$$;

revoke execute on function paddock_grant_runtime(name) from public;
