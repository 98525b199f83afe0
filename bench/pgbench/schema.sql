-- pgbench's baseline tables for bench/api-load, shaped like `tenants` (a key, a few text columns,
-- jsonb labels, a state, a generation, timestamps). They live in the benchmark's database beside
-- paddock's tables and are not touched by paddock. `rows` is set with `psql -v rows=N`.
set client_min_messages = warning;
drop table if exists bench_rows, bench_inserts;

-- (a) single-row select by primary key: pre-filled.
create table bench_rows (
    id bigint primary key,
    name text not null,
    display_name text not null,
    labels jsonb not null default '{}',
    state text not null default 'active',
    generation bigint not null default 1,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now()
);
insert into bench_rows (id, name, display_name, labels)
select g, 'row-' || g, 'Bench row ' || g, '{"bench": "pgbench"}'
from generate_series(1, :rows) g;

-- (b) single-row insert: uuid key like `tenants`, starts empty.
create table bench_inserts (
    id uuid primary key,
    name text not null,
    display_name text not null,
    labels jsonb not null default '{}',
    state text not null default 'active',
    generation bigint not null default 1,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now()
);

vacuum analyze bench_rows;
