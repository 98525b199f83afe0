-- An adjustment that names a cluster names one of its own tenant's, as every other tenancy row
-- does (`20261202140000_tie_tenant_foreign_keys.sql`): a composite foreign key on (cluster_id,
-- tenant_id). Clusters are never deleted (a deleted cluster keeps its row), so corrections of a
-- deleted cluster's usage still have their cluster. MATCH SIMPLE: an adjustment without a cluster
-- is not checked.
alter table usage_adjustments
    add constraint usage_adjustments_cluster_tenant_fkey
        foreign key (cluster_id, tenant_id) references clusters (id, tenant_id);
