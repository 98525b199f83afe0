-- pgbench script (b): one row, autocommit (one durable commit per row, like one API create).
\set n random(1, 2000000000)
insert into bench_inserts (id, name, display_name, labels)
values (gen_random_uuid(), 'ins-' || :client_id || '-' || :n, 'Bench insert ' || :n, '{"bench": "pgbench"}');
