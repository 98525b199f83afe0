-- The durable job queue: work the worker carries out, enqueued in the same transaction as the state
-- change that needs it. A job carries only ids; every run re-reads desired state from the top.
--
-- Lifecycle: queued -> running -> succeeded | failed, or back to queued (retry with backoff, or wait
-- without using up an attempt); queued -> cancelled. A running job holds a lease (`locked_by`,
-- `locked_until`) renewed by heartbeat; a lease that expires means its worker died, and another
-- worker takes the job over (counted as a failed attempt).
--
-- Invariants kept by the schema:
--   * at most one running job per target (`jobs_running_target_key`): two reconcilers never act on
--     one cluster or machine at once, whatever their kinds;
--   * at most one queued job per (target, kind) (`jobs_queued_key`): a second enqueue while one is
--     queued merges into it. An enqueue while the job runs adds one queued follow-up, which cannot
--     start before the running one ends (the index above), so a request made during a run is never
--     lost and always sees the run's result;
--   * a running job has a lease, any other job has none; a finished job has `finished_at`.

create table jobs (
    id uuid primary key,
    -- Stable snake_case, e.g. `machine_enroll`, `cluster_provision`.
    kind text not null check (kind ~ '^[a-z][a-z0-9_]*$'),
    target_type text not null check (target_type ~ '^[a-z][a-z0-9_]*$'),
    target_id uuid not null,
    -- Ids only (`{"cluster_id": ...}`), never a snapshot of the spec.
    payload jsonb not null default '{}' check (jsonb_typeof(payload) = 'object'),
    -- The operation this job reports to (running / succeeded / failed with a Problem).
    operation_id uuid references operations (id),
    state text not null default 'queued'
        check (state in ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    -- Runs that ended in a transient failure or a lost lease; `wait` does not count.
    attempts integer not null default 0 check (attempts >= 0),
    -- Not claimed before this instant.
    run_at timestamptz not null default now(),
    -- The lease: which worker runs the job, until when (renewed by heartbeat).
    locked_by text,
    locked_until timestamptz,
    -- When the current (or last) run started.
    started_at timestamptz,
    -- `{code, message, at}` of the last transient failure or wait reason.
    last_error jsonb,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now(),
    finished_at timestamptz,
    constraint jobs_lease_check
        check ((state = 'running') = (locked_by is not null and locked_until is not null)),
    constraint jobs_finished_check
        check ((state in ('succeeded', 'failed', 'cancelled')) = (finished_at is not null))
);

-- At most one running job per target, whatever the kind; also the probe of the claim's
-- "target busy" check.
create unique index jobs_running_target_key on jobs (target_id) where state = 'running';
-- Enqueue is idempotent per (target, kind) while queued (`on conflict ... do update`).
create unique index jobs_queued_key on jobs (target_id, kind) where state = 'queued';
-- The claim: due queued jobs, oldest first.
create index jobs_ready_idx on jobs (run_at, id) where state = 'queued';
-- The claim's reclaim of expired leases.
create index jobs_lease_idx on jobs (locked_until) where state = 'running';
-- A target's history, and the jobs of an operation.
create index jobs_target_idx on jobs (target_id, id);
create index jobs_operation_idx on jobs (operation_id) where operation_id is not null;
-- Purging finished jobs.
create index jobs_finished_idx on jobs (finished_at) where finished_at is not null;
