-- One-time tokens of the machine agents (SPEC section 5): 32 random bytes handed to a machine in
-- its seed, stored only as their SHA-256, bound to (machine, run, purpose), expiring. The run's
-- configuration may hold secrets (a join token): it is sealed, bound to its row. The report uses
-- the token up, in one guarded update.

create table agent_tokens (
    id uuid primary key,
    token_sha256 bytea not null unique,
    machine_id uuid not null references machines (id),
    run_id uuid not null,
    purpose text not null check (purpose in ('wipe', 'provision')),
    config_enc bytea not null,
    expires_at timestamptz not null,
    created_at timestamptz not null default now(),
    used_at timestamptz,
    -- The agent's report, and whether it proves the run: for a wipe, every listed drive wiped.
    report jsonb,
    verified boolean,
    check ((used_at is null) = (report is null))
);
create index agent_tokens_machine_idx on agent_tokens (machine_id, created_at);
