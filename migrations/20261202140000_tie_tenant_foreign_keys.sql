-- Composite foreign keys tie a tenancy's rows together, so that no bug can attach a machine to
-- another tenant's pool: a node pool belongs to its cluster's tenant, an allocation names a pool
-- of its own cluster and tenant, and a machine's holder columns are those of its allocation.
alter table clusters add constraint clusters_id_tenant_key unique (id, tenant_id);

alter table node_pools
    add constraint node_pools_id_cluster_tenant_key unique (id, cluster_id, tenant_id),
    add constraint node_pools_cluster_tenant_fkey
        foreign key (cluster_id, tenant_id) references clusters (id, tenant_id);

alter table cluster_events
    add constraint cluster_events_cluster_tenant_fkey
        foreign key (cluster_id, tenant_id) references clusters (id, tenant_id);

alter table machine_allocations
    add constraint machine_allocations_holder_key
        unique (id, machine_id, tenant_id, cluster_id, node_pool_id),
    add constraint machine_allocations_pool_fkey
        foreign key (node_pool_id, cluster_id, tenant_id) references node_pools (id, cluster_id, tenant_id);

-- The holder columns are all null or all set (machines_holder_check), so MATCH SIMPLE applies
-- these exactly when the machine is held.
alter table machines
    add constraint machines_pool_fkey
        foreign key (node_pool_id, cluster_id, tenant_id) references node_pools (id, cluster_id, tenant_id),
    add constraint machines_allocation_fkey
        foreign key (allocation_id, id, tenant_id, cluster_id, node_pool_id)
        references machine_allocations (id, machine_id, tenant_id, cluster_id, node_pool_id);
