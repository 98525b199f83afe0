-- The custody ledger, hardened (SPEC section 5; issue 16).
--
-- 1. paddock computes an entry's MAC before it inserts the entry, in the transaction of its
--    transition, and never seals a row later: the one update the first trigger allowed (setting
--    the MAC of an unsealed entry) is gone, so no row inserted by anyone else can ever be sealed,
--    and new rows must carry a MAC. (Rows written unsealed before this migration keep a null MAC;
--    verification reports each as a break: nothing may seal them now.)
-- 2. Signed checkpoints of every machine's chain head (`GET /v1/custody/checkpoint`) are recorded
--    as issued, append-only like the ledger: the isolation report verifies against the latest.
-- 3. `paddock_grant_runtime(role)`: what the runtime role may do, when paddock runs with two roles
--    (`PADDOCK_MIGRATE_DATABASE_URL` owning the schema, `PADDOCK_DATABASE_URL` serving). `paddock
--    migrate` calls it for the role of PADDOCK_DATABASE_URL after every migration run, so tables
--    added later are covered too. The runtime role reads and appends the ledger and its
--    checkpoints and nothing more: no UPDATE, DELETE or TRUNCATE, and, not owning them, it can
--    neither drop nor disable their triggers.

create or replace function custody_entries_append_only() returns trigger language plpgsql as $$
begin
    raise exception '% is append-only (% refused)', tg_table_name, tg_op using errcode = 'insufficient_privilege';
end
$$;

create trigger custody_entries_no_truncate before truncate on custody_entries
    for each statement execute function custody_entries_append_only();

-- Checked for every row written from now on; the rows of before stay as they are (breaks).
alter table custody_entries add constraint custody_entries_mac_present check (mac is not null) not valid;

create table custody_checkpoints (
    id uuid primary key,
    issued_at timestamptz not null,
    -- The Ed25519 key that signed it (`PADDOCK_USAGE_SIGNING_KEY`'s id) and the signature.
    key_id text not null,
    signature text not null,
    -- The signed document, `{issued_at, machines: [{machine_id, seq, mac}]}`.
    document jsonb not null
);

create index custody_checkpoints_latest on custody_checkpoints (key_id, issued_at desc, id desc);

create trigger custody_checkpoints_append_only before update or delete on custody_checkpoints
    for each row execute function custody_entries_append_only();
create trigger custody_checkpoints_no_truncate before truncate on custody_checkpoints
    for each statement execute function custody_entries_append_only();

create function paddock_grant_runtime(runtime name) returns void language plpgsql as $$
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
    execute format('revoke update, delete, truncate, references, trigger on custody_entries, custody_checkpoints from %I',
                   runtime);
    -- Migrations are the migrating role's; the runtime only checks that they are applied.
    execute format('revoke insert, update, delete, truncate on _sqlx_migrations from %I', runtime);
end
$$;

revoke execute on function paddock_grant_runtime(name) from public;
