-- Machine class list prices (SPEC sections 2 and 7): the current price on the class, and its
-- history, which the FOCUS export reads (the price in force at each row's ChargePeriodStart).
--
-- A price is `{currency (ISO 4217), node_hour (decimal string, up to 6 places)}` or absent (both
-- columns null). Every change of it (also the one of a class's creation) appends a history row,
-- effective from the writing transaction's whole second; two changes within one second keep the
-- later. The history is keyed by the class's name (usage names classes by name) and outlives the
-- class. A price writer joins the usage writers (the shared advisory lock of
-- `paddock_store::usage::USAGE_WRITE_LOCK`), so a price can never appear below a usage watermark
-- already returned: an export at the same `as_of` keeps its bytes.
alter table machine_classes
    add column price_currency text check (price_currency ~ '^[A-Z]{3}$'),
    add column price_node_hour numeric(24, 6) check (price_node_hour >= 0),
    add check ((price_currency is null) = (price_node_hour is null));

create table machine_class_prices (
    machine_class text not null,
    effective_from timestamptz not null
        check (effective_from = date_trunc('second', effective_from, 'UTC')),
    currency text check (currency ~ '^[A-Z]{3}$'),
    node_hour numeric(24, 6) check (node_hour >= 0),
    check ((currency is null) = (node_hour is null)),
    primary key (machine_class, effective_from)
);

create function machine_class_price_history() returns trigger language plpgsql as $$
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
    insert into machine_class_prices (machine_class, effective_from, currency, node_hour)
    values (new.name, date_trunc('second', clock_timestamp(), 'UTC'), new.price_currency, new.price_node_hour)
    on conflict (machine_class, effective_from)
        do update set currency = excluded.currency, node_hour = excluded.node_hour;
    return new;
end $$;
create trigger machine_class_price_history after insert or update on machine_classes
    for each row execute function machine_class_price_history();
