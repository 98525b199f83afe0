-- Acceptance (docs/acceptance.md): a machine class may name an acceptance image that a machine of
-- the class boots, in a run of its own after the wipe, before it enters the fleet or returns from
-- maintenance. `{image_url, image_sha256, timeout_seconds}`, validated by the API; null: none.
alter table machine_classes
    add column acceptance jsonb check (acceptance is null or jsonb_typeof(acceptance) = 'object');

-- An acceptance run is an agent run like the wipe's: recorded on the machine, with its own tokens.
alter table machines drop constraint machines_run_purpose_check;
alter table machines add constraint machines_run_purpose_check
    check (run_purpose in ('wipe', 'provision', 'acceptance'));
alter table agent_tokens drop constraint agent_tokens_purpose_check;
alter table agent_tokens add constraint agent_tokens_purpose_check
    check (purpose in ('wipe', 'provision', 'acceptance'));

-- A failed (or timed-out) acceptance is recorded as the machine's health report, by the provider's
-- own check: source `acceptance`.
alter table machine_health_reports drop constraint machine_health_reports_source_check;
alter table machine_health_reports add constraint machine_health_reports_source_check
    check (source in ('operator', 'bmc', 'kubernetes', 'slurm', 'acceptance'));
