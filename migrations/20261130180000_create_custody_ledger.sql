-- The custody ledger (SPEC section 5): one append-only, tamper-evident chain of entries per
-- machine, one entry per state transition, with who made it, why, and the evidence.
--
-- Each entry's `mac` is HMAC-SHA256(ledger key, canonical JSON (RFC 8785) of the entry's fields
-- and the previous entry's MAC of the same machine); the key lives in paddock's configuration,
-- never in this database. An entry is written in the transaction of its transition (by the store
-- function that moves the machine, so no transition goes unrecorded) and sealed (`mac` set) by a
-- holder of the key: in the same transaction where that caller holds the key, otherwise right
-- after, in order (see `paddock_service::custody`). Until then `mac` is null and verification
-- reports the entry as unsealed.
--
-- The trigger below refuses updates (other than sealing an unsealed entry once) and deletes. It
-- stops mistakes and ordinary roles, not the table owner, who can drop it: the MAC chain is what
-- detects such edits.

create table custody_entries (
    id uuid primary key,
    machine_id uuid not null references machines (id),
    -- 1, 2, 3, ... per machine, without gaps; the chain order.
    seq bigint not null check (seq > 0),
    at timestamptz not null default now(),
    -- The token subject for an API call, `paddock-worker` for the reconcilers.
    actor text not null,
    -- null for enrollment (the first entry).
    from_state text,
    to_state text not null,
    reason text not null,
    evidence jsonb not null default '{}',
    -- The previous entry's MAC (null for the first entry), and this entry's (null until sealed).
    prev_mac bytea,
    mac bytea,
    unique (machine_id, seq)
);

create function custody_entries_append_only() returns trigger language plpgsql as $$
begin
    if tg_op = 'UPDATE' and old.mac is null and new.mac is not null
        and (new.id, new.machine_id, new.seq, new.at, new.actor, new.from_state, new.to_state, new.reason,
             new.evidence)
            is not distinct from
            (old.id, old.machine_id, old.seq, old.at, old.actor, old.from_state, old.to_state, old.reason,
             old.evidence) then
        return new;
    end if;
    raise exception 'custody_entries is append-only (% refused)', tg_op using errcode = 'insufficient_privilege';
end
$$;

create trigger custody_entries_append_only before update or delete on custody_entries
    for each row execute function custody_entries_append_only();

-- Machines enrolled before the ledger existed start their chain here, with their state now. The
-- entry is unsealed (this migration has no key); the worker seals it with the machine's next job.
-- Its id is a v4 UUID: the database has no v7 generator.
insert into custody_entries (id, machine_id, seq, actor, from_state, to_state, reason, evidence)
select gen_random_uuid(), id, 1, 'paddock-migration', null, state,
       'custody ledger started: the machine was enrolled before the ledger existed',
       jsonb_build_object('name', name, 'enrolled_at', created_at)
from machines;
