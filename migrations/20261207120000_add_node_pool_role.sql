-- A node pool's role: `compute` (a Slurm NodeSet, or plain Kubernetes nodes) or `system`, the one
-- pool of a slurm cluster that carries Slurm's control pods (slurmctld, slurmrestd, slurmdbd,
-- MariaDB, the login pods) and their local volumes, and is never scaled down or deleted while
-- its cluster lives.
alter table node_pools
    add column role text not null default 'compute' check (role in ('compute', 'system'));

-- At most one system pool per cluster.
create unique index node_pools_cluster_system_key on node_pools (cluster_id)
    where role = 'system' and deleted_at is null;

-- Every existing slurm cluster gets its first live pool by creation as its system pool (the
-- first that has a node, when there is one: a system pool needs one). That pool stops carrying a
-- NodeSet; the control pods move onto its nodes at the cluster's next reconcile.
update node_pools p
set role = 'system', updated_at = now()
from (
    select distinct on (np.cluster_id) np.id
    from node_pools np
    join clusters c on c.id = np.cluster_id and c.tenant_id = np.tenant_id
    where c.kind = 'slurm' and c.deleted_at is null
      and np.deleted_at is null and np.deletion_requested_at is null
    order by np.cluster_id, (np.count > 0) desc, np.created_at, np.id
) first_pool
where p.id = first_pool.id;
