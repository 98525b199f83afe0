-- An idempotency key in flight is held under a lease that its request renews while it runs: a key
-- whose process died mid-request is taken over once the lease has run out, instead of answering
-- 409 (in flight) for 24 hours. `holder` names the claim, so a holder that lost its key to a
-- takeover can neither renew, complete nor release it.
alter table idempotency_keys add column holder uuid, add column lease_until timestamptz;
