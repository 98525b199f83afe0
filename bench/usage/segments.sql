-- bench/usage/segments.sql: closed machine segments, rounds [lo, hi) of every machine.
-- psql variables: lo, hi, rounds (segments per machine), machines, segments (the total), tenants,
-- t0, t1 (the span). Round j of machine m lies in the machine's j-th slot of the span (span /
-- rounds long): it starts in the slot's first quarter and lasts 10% to 75% of a slot, so one
-- machine's segments never overlap and every segment is closed before t1. Segment number
-- n = j * machines + m stops at `segments`. The tenant of (m, j) is a hash of both (a machine
-- changes hands between tenancies); the cluster is one of the tenant's two, the pool the one of
-- the machine's class. Ids sort by start (a v7-like prefix of the start's milliseconds), as
-- paddock's v7 ids do.
\set ON_ERROR_STOP 1
set time zone 'UTC';
insert into usage_segments (id, kind, tenant_id, cluster_id, node_pool_id, machine_id, allocation_id,
  machine_class, gpu_model, gpu_count, start_at, end_at, close_reason)
select (lpad(to_hex((extract(epoch from s.st) * 1000)::bigint), 12, '0') || substr(md5(random()::text), 1, 20))::uuid,
       'machine', p.tenant_id, p.cluster_id, p.node_pool_id, s.machine_id, gen_random_uuid(),
       mc.name, mc.gpu_model, mc.gpu_count, s.st, s.st + s.len, 'machine moved to cleaning'
from (
  select b.id as machine_id, b.k,
         abs(hashint8(b.m::bigint * 1000003 + j)) % :tenants as t, abs(hashint8(b.m::bigint * 7 + j)) % 2 as c,
         date_trunc('second', timestamptz :'t0' + slot * j + slot * random() / 4) as st,
         date_trunc('second', slot / 10 + slot * random() * 0.65) as len
  from generate_series(:lo, :hi - 1) j
  cross join bench_usage.machines b
  cross join (select (timestamptz :'t1' - timestamptz :'t0') / :rounds as slot) sl
  where j::bigint * :machines + b.m < :segments
  order by j, st
) s
join bench_usage.pools p on p.t = s.t and p.c = s.c and p.k = s.k
join machine_classes mc on mc.name = 'bench-c' || s.k;
