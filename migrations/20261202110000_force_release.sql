-- Release deadlines and forced releases (SPEC revision 2, sections 4 to 7).
--
-- A release waits for the Slurm drain and the Node's removal for at most PADDOCK_RELEASE_TIMEOUT
-- (counted from `machine_allocations.release_started_at`); after it, or at once when an operator
-- asks (`POST /v1/machines/{machine_id}/force-release`), the worker forces it: it records the
-- forcing (`release_forced_at`, the moment the machine left the tenant's control, where its usage
-- segment closes), powers the machine off through the BMC, deletes the Node and its Lease best
-- effort, and goes on to cleaning (or to maintenance when the power-off fails).

alter table machines
    -- Operator intent, carried out by the worker: set = force the release of the machine's
    -- tenancy (the operator's reason, and who asked); cleared when the tenancy ends.
    add column force_release_reason text,
    add column force_release_requested_by text,
    add constraint machines_force_release_check check (force_release_reason is null or allocation_id is not null);

alter table machine_allocations
    -- The release was forced: the machine left the tenant's control here (billing stops here).
    add column release_forced_at timestamptz;
