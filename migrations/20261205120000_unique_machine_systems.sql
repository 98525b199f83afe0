-- One server, one machine record: among machines that are not retired, a BMC system (the BMC's
-- normalised origin and the system id) is enrolled once, and a system UUID is held by one record.
-- Two records of one server could otherwise be given to two tenants at once.
--
-- 1. `paddock_bmc_system_key(url, system_id)`: what the Redfish driver talks to. It keeps only the
--    URL's origin (the driver ignores any path): scheme and host lowercased, a trailing dot and
--    the scheme's default port dropped; then the system id as given, a UUID lowercased. The same
--    system named by its `Id` once and by its `UUID` once gets two keys: inspection, which reads
--    the UUID, catches that record.
-- 2. `machines_bmc_system_key`: an enrollment (or a BMC patch) naming a system already enrolled is
--    refused (409 `machine_already_enrolled`).
-- 3. `machines_system_uuid_key`: inspection records a UUID only when no other record holds it; a
--    record that finds its UUID held keeps `duplicate_of` (the holder), stops before any power
--    action and can only be retired (`last_error.code = duplicate_system`).
--
-- Duplicates already in the database: this migration refuses to run while two machines that are
-- not retired share a system UUID or a BMC system, and names them. Nothing here can tell which
-- record is the right one, or move a machine without its custody entry: retire the extra records
-- with the running version (force its release first when one holds a tenancy), then migrate again.

create function paddock_bmc_system_key(url text, system_id text) returns text
    language sql immutable strict parallel safe as $$
    select lower(parts[1]) || '://' || rtrim(lower(parts[2]), '.')
        || case
               when parts[3] is null or parts[3] = '' then ''
               when lower(parts[1]) = 'https' and ltrim(parts[3], '0') = '443' then ''
               when lower(parts[1]) = 'http' and ltrim(parts[3], '0') = '80' then ''
               else ':' || ltrim(parts[3], '0')
           end
        || '#' || case
               when btrim(system_id) ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                   then lower(btrim(system_id))
               else btrim(system_id)
           end
    from regexp_match(url, '^([A-Za-z][A-Za-z0-9+.-]*)://(\[[^]]*\]|[^/?#:]*)(?::([0-9]*))?') as parts
$$;

-- `strict` would make a machine without a system id escape the index: `coalesce` gives it ''.
create function paddock_machine_bmc_system(url text, system_id text) returns text
    language sql immutable parallel safe as $$
    select paddock_bmc_system_key(url, coalesce(system_id, ''))
$$;

alter table machines add column duplicate_of uuid references machines (id);

do $$
declare
    found text;
begin
    select string_agg(names, '; ') into found from (
        select 'system UUID ' || lower(system_uuid) || ': ' || string_agg(name || ' (' || id || ')', ', ' order by created_at) as names
        from machines where retired_at is null and system_uuid is not null
        group by lower(system_uuid) having count(*) > 1
        union all
        select 'BMC system ' || paddock_machine_bmc_system(bmc_url, bmc_system_id) || ': '
            || string_agg(name || ' (' || id || ')', ', ' order by created_at)
        from machines where retired_at is null
        group by paddock_machine_bmc_system(bmc_url, bmc_system_id) having count(*) > 1
    ) duplicates;
    if found is not null then
        raise exception 'paddock: machines that are not retired share a server: %', found
            using hint = 'retire all but one record of each server (force the release of one in a tenancy first), then migrate again';
    end if;
end
$$;

create unique index machines_bmc_system_key on machines (paddock_machine_bmc_system(bmc_url, bmc_system_id))
    where retired_at is null;
create unique index machines_system_uuid_key on machines (lower(system_uuid))
    where retired_at is null and system_uuid is not null;
