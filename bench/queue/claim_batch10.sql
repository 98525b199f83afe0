-- bench/queue, raw baseline (b): claim TEN due jobs in one statement, commit; then complete all
-- ten in one statement, commit. One pgbench transaction = ten jobs.
with c as (
    select id from jobs
    where state = 'queued' and run_at <= now() and kind = 'bench_noop'
    order by run_at, id limit 10
    for update skip locked
), u as (
    update jobs j set state = 'running', locked_by = 'pgbench-' || :client_id,
        locked_until = now() + interval '30 seconds', started_at = now(), updated_at = now()
    from c where j.id = c.id
    returning j.id
)
select array_agg(id)::text as ids from u \gset
update jobs set state = 'succeeded', locked_by = null, locked_until = null,
    finished_at = now(), updated_at = now()
where id = any(:ids::uuid[]) and locked_by = 'pgbench-' || :client_id and state = 'running';
