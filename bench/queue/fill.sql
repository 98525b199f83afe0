-- bench/queue: an empty queue, then `jobs` due no-op jobs, each on its own target (so the
-- one-running-job-per-target rule never holds a job back), oldest first by `run_at`.
-- `jobs` is set with `psql -v jobs=N`.
truncate jobs;
insert into jobs (id, kind, target_type, target_id, payload, run_at)
select gen_random_uuid(), 'bench_noop', 'bench', gen_random_uuid(), '{}',
       now() - interval '1 hour' + g * interval '1 millisecond'
from generate_series(1, :jobs) g;
vacuum analyze jobs;
checkpoint;
