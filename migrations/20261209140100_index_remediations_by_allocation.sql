-- Closing a machine's usage segment looks for a remediation of that tenancy to credit
-- (`paddock_store::credit::write`), by its allocation: at every release, so by an index.
create index machine_remediations_allocation_idx on machine_remediations (allocation_id);
