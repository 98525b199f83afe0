-- Credits: an adjustment may name the node pool and machine it concerns and says what it is: a
-- `correction` (what every adjustment was until now) or a `credit` (seconds given back to the
-- tenant). paddock writes one credit on its own for a remediation whose failure a provider-side
-- source reported (the BMC, an operator), in the transaction that closes the failed machine's
-- usage segment: it covers the machine from the first such `failed` report to that close.
--
-- No foreign keys to pools or machines, as for usage segments: usage outlives what it names.
alter table usage_adjustments
    add column node_pool_id uuid,
    add column machine_id uuid,
    add column category text not null default 'correction' check (category in ('correction', 'credit')),
    -- The remediation a credit paddock wrote is for; null for the provider's own adjustments.
    add column remediation_id uuid references machine_remediations (id),
    add constraint usage_adjustments_remediation_credit check (remediation_id is null or category = 'credit');

-- One credit per remediation: a repeated close (a replayed transaction, a second worker) writes
-- nothing.
create unique index usage_adjustments_remediation_key on usage_adjustments (remediation_id)
    where remediation_id is not null;
