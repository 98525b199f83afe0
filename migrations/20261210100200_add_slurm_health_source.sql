-- The tenant's Slurm is a health source: a Slurm node drained with a reason that starts with
-- `paddock:hw:` is a `failed` report (source `slurm`) on the machine the node runs on, and the
-- remediation it starts carries that source. Like `kubernetes`, it is never provider-side
-- evidence: it earns no credit (`paddock_store::credit::PROVIDER_SOURCES`).
alter table machine_health_reports drop constraint machine_health_reports_source_check,
    add constraint machine_health_reports_source_check
        check (source in ('operator', 'bmc', 'kubernetes', 'slurm'));
alter table machine_remediations drop constraint machine_remediations_source_check,
    add constraint machine_remediations_source_check
        check (source in ('operator', 'bmc', 'kubernetes', 'slurm', 'tenant'));
