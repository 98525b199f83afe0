-- pgbench script (a): one row by primary key, all columns. `rows` comes from `pgbench -D rows=N`.
\set id random(1, :rows)
select id, name, display_name, labels, state, generation, created_at, updated_at
from bench_rows where id = :id;
