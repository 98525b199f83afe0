-- A run that ends or is re-issued expires its unused tokens by run id
-- (`update agent_tokens ... where run_id = $1 and used_at is null`). Without an index that is a
-- scan of every token ever issued: one per wipe and per provisioning, kept as evidence, so the
-- table only grows (at 100,000 tokens the statement took 50-80 ms; with this index 0.05 ms).
-- Only unused tokens are indexed: few at any time.
create index agent_tokens_unused_run_idx on agent_tokens (run_id) where used_at is null;
