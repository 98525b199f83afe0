-- The tenant a job works for (its cluster's tenant, or the tenant holding its machine when it was
-- enqueued); null for the fleet's own jobs (enrolling, cleaning, power checks, re-sealing). A
-- worker bounds how many of its slots one tenant's jobs hold at once (`PADDOCK_WORKER_TENANT_SLOTS`),
-- so a tenant whose cluster answers slowly cannot stall the worker for everyone.
alter table jobs add column tenant_id uuid;

-- The claim's count of the slots a tenant holds on one worker.
create index jobs_running_tenant_idx on jobs (locked_by, tenant_id) where state = 'running' and tenant_id is not null;
