-- bench/usage/control_planes.sql: one closed control-plane segment per cluster over the span
-- (a cluster has at most one).
\set ON_ERROR_STOP 1
insert into usage_segments (id, kind, tenant_id, cluster_id, start_at, end_at, close_reason)
select (lpad(to_hex((extract(epoch from timestamptz :'t0') * 1000)::bigint), 12, '0')
          || substr(md5(random()::text), 1, 20))::uuid,
       'control_plane', tenant_id, cluster_id, timestamptz :'t0', timestamptz :'t1', 'cluster deletion started'
from (select distinct tenant_id, cluster_id from bench_usage.pools) c;
