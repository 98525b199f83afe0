-- bench/usage/setup.sql: the world the usage segments belong to, in a database migrated by
-- `paddock migrate`. psql variables: tenants, machines, t0 (the first instant, a UTC month start).
-- Everything is set-based; nothing of the product schema is altered. Ids are made in SQL
-- (gen_random_uuid: the database has no v7 generator).
\set ON_ERROR_STOP 1
begin;
set local time zone 'UTC';

-- Ten machine classes: CPU-only and GPU ones, each with a list price in force since before t0
-- (the FOCUS export prices each row with the price in force at its start). The classes are
-- created unpriced (no history row), the history is written back-dated, then the current price
-- is set (its trigger appends one more row, now, of the same price).
insert into machine_classes (id, name, cpu_cores, memory_gib, gpu_model, gpu_count, description)
select gen_random_uuid(), 'bench-c' || c, 32 * (1 + c % 4), 256 * (1 + c % 4),
       case when (array[0, 1, 2, 4, 8])[1 + c % 5] > 0 then 'H100' else '' end,
       (array[0, 1, 2, 4, 8])[1 + c % 5], 'bench/usage class'
from generate_series(0, 9) c;
insert into machine_class_prices (machine_class, effective_from, currency, node_hour)
select name, timestamptz :'t0' - interval '1 month', 'USD', 0.5 + 2.25 * gpu_count
from machine_classes where name like 'bench-c%';
update machine_classes set price_currency = 'USD', price_node_hour = 0.5 + 2.25 * gpu_count
where name like 'bench-c%';

insert into tenants (id, name, display_name, labels)
select gen_random_uuid(), 'bench-t' || lpad(t::text, 5, '0'), 'Bench tenant ' || t, '{"bench": "usage"}'
from generate_series(0, :tenants - 1) t;

-- Two clusters per tenant, each with one node pool per class.
create schema bench_usage;
create table bench_usage.pools (t int, c int, k int, tenant_id uuid, cluster_id uuid, node_pool_id uuid,
  primary key (t, c, k));
insert into bench_usage.pools
select t.n, c, k, t.id, null, gen_random_uuid()
from (select id, substr(name, 8)::int as n from tenants where name like 'bench-t%') t,
     generate_series(0, 1) c, generate_series(0, 9) k;
create temporary table cl on commit drop as
select t, c, tenant_id, gen_random_uuid() as cluster_id from bench_usage.pools group by t, c, tenant_id;
update bench_usage.pools p set cluster_id = cl.cluster_id from cl where cl.t = p.t and cl.c = p.c;
insert into clusters (id, tenant_id, name, kind, isolation, kubernetes_version, stack_version, phase,
                      observed_generation)
select cluster_id, tenant_id, 'bench-k' || c, 'kubernetes', 'private-nodes', '1.31', '2026.12.0', 'ready', 1 from cl;
insert into node_pools (id, tenant_id, cluster_id, name, machine_class_id, count)
select p.node_pool_id, p.tenant_id, p.cluster_id, 'pool-c' || p.k, mc.id, 0
from bench_usage.pools p join machine_classes mc on mc.name = 'bench-c' || p.k;

-- The machines: all in maintenance now (held by nobody, so no allocation or clean is live; the
-- segments carry fresh allocation ids, which usage keeps without a foreign key). No custody
-- entries: they need the ledger key's MAC and no foreign key asks for them (the usage API never
-- reads them). Class k = machine number mod 10.
create table bench_usage.machines (m int primary key, id uuid not null, k int not null);
insert into bench_usage.machines select m, gen_random_uuid(), m % 10 from generate_series(0, :machines - 1) m;
insert into machines (id, name, machine_class_id, state, maintenance_reason, bmc_url, bmc_username,
                      bmc_password_enc, labels)
select b.id, 'bench-m' || lpad(b.m::text, 7, '0'), mc.id, 'maintenance', 'bench/usage',
       'https://bmc-' || b.m || '.bench.invalid', 'bench', '\x00'::bytea, '{"bench": "usage"}'
from bench_usage.machines b join machine_classes mc on mc.name = 'bench-c' || b.k;
commit;
