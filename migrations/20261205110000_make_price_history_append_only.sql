-- The list-price history is evidence, like the custody ledger (SPEC section 7): a closed period's
-- signed manifest pins the prices in force during the period, and the FOCUS export of a closed
-- period prices it with them. The history itself is append-only from now on.
--
-- 1. No row of `machine_class_prices` is updated or deleted, and the table is not truncated (the
--    ledger's trigger function refuses, for the owner too until the owner drops the triggers).
-- 2. Two changes of a class within one second no longer overwrite each other (the upsert is
--    gone): every change appends its own row, and a change within the second of the class's
--    latest one takes effect one second after it. So the history holds every price the class
--    ever had, in order, and a row is never rewritten. A price still never appears below a usage
--    watermark already returned: the writer joins the usage writers, and its second is never
--    earlier than its own clock's.
-- 3. The runtime role (`paddock_grant_runtime`) may read and append the history, nothing more.

create or replace function machine_class_price_history() returns trigger language plpgsql as $$
declare
    effective timestamptz;
begin
    if tg_op = 'UPDATE' and (new.price_currency, new.price_node_hour)
            is not distinct from (old.price_currency, old.price_node_hour) then
        return new;
    end if;
    if tg_op = 'INSERT' and new.price_currency is null then
        return new;
    end if;
    -- 0x7061646475736167: the usage writers' lock ("paddusag").
    perform pg_advisory_xact_lock_shared(8097863987618865511);
    select greatest(date_trunc('second', clock_timestamp(), 'UTC'), max(effective_from) + interval '1 second')
        into effective from machine_class_prices where machine_class = new.name;
    insert into machine_class_prices (machine_class, effective_from, currency, node_hour)
    values (new.name, effective, new.price_currency, new.price_node_hour);
    return new;
end $$;

create trigger machine_class_prices_append_only before update or delete on machine_class_prices
    for each row execute function custody_entries_append_only();
create trigger machine_class_prices_no_truncate before truncate on machine_class_prices
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
                   'machine_class_prices from %I', runtime);
    -- Migrations are the migrating role's; the runtime only checks that they are applied.
    execute format('revoke insert, update, delete, truncate on _sqlx_migrations from %I', runtime);
end
$$;

revoke execute on function paddock_grant_runtime(name) from public;
