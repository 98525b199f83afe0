-- bench/queue, raw baseline (a): claim ONE due job with `for update skip locked` and a lease,
-- commit; then complete it guarded on the lease holder, commit. Two durable commits per job, the
-- same as paddock's claim + complete, on the same `jobs` table and indexes, without paddock's
-- extras (expired-lease takeover, one-job-per-target check, operation updates, wake-ups).
with c as (
    select id from jobs
    where state = 'queued' and run_at <= now() and kind = 'bench_noop'
    order by run_at, id limit 1
    for update skip locked
)
update jobs j set state = 'running', locked_by = 'pgbench-' || :client_id,
    locked_until = now() + interval '30 seconds', started_at = now(), updated_at = now()
from c where j.id = c.id
returning j.id as id \gset
update jobs set state = 'succeeded', locked_by = null, locked_until = null,
    finished_at = now(), updated_at = now()
where id = :id and locked_by = 'pgbench-' || :client_id and state = 'running';
