-- The power sync (issue #7): machines in a stable state (`available`, `maintenance`,
-- `clean_failed` = off; `active` = on) have their power read periodically and re-asserted when
-- it drifted; repeated drift takes the machine out of service.
--
-- Bookkeeping only: writing these columns never bumps `status_version` or `updated_at`, so the
-- periodic check never makes a reconciler's guarded write lose a race.
alter table machines
    -- When the power sync last read the machine's power (null: never).
    add column power_checked_at timestamptz,
    -- Checks in a row that found the power drifted (reset by a check that found it right).
    add column power_drift_count integer not null default 0 check (power_drift_count >= 0);

-- The power sync's pick: the machines in stable states checked longest ago.
create index machines_power_check_idx on machines (power_checked_at nulls first, id)
    where state in ('available', 'active', 'maintenance', 'clean_failed');
