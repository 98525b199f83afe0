//! [`KubeTenantNodes`] as the [`TenantNodes`] driver: each method its own, its error the driver's.

use futures::FutureExt;
use paddock_domain::driver::{
    BoxFuture, Demand, DemandPool, Drain, DriverError, JoinConfig, NodeRef, NodeStatus, RegisteredNode, Removal,
    TenantAccess, TenantNodes,
};

use super::KubeTenantNodes;

impl TenantNodes for KubeTenantNodes {
    fn pod_demand<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        pools: &'a [DemandPool],
    ) -> BoxFuture<'a, Result<Demand, DriverError>> {
        KubeTenantNodes::pod_demand(self, tenant, pools).map(|r| r.map_err(DriverError::from)).boxed()
    }

    fn join_config<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
        ttl_seconds: u64,
    ) -> BoxFuture<'a, Result<JoinConfig, DriverError>> {
        KubeTenantNodes::join_config(self, tenant, node, ttl_seconds).map(|r| r.map_err(DriverError::from)).boxed()
    }

    fn node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Option<NodeStatus>, DriverError>> {
        KubeTenantNodes::node(self, tenant, node).map(|r| r.map_err(DriverError::from)).boxed()
    }

    fn registered_nodes<'a>(
        &'a self,
        tenant: &'a TenantAccess,
    ) -> BoxFuture<'a, Result<Vec<RegisteredNode>, DriverError>> {
        KubeTenantNodes::registered_nodes(self, tenant).map(|r| r.map_err(DriverError::from)).boxed()
    }

    fn drain_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Drain, DriverError>> {
        KubeTenantNodes::drain_node(self, tenant, node).map(|r| r.map_err(DriverError::from)).boxed()
    }

    fn foreign_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Option<String>, DriverError>> {
        KubeTenantNodes::foreign_node(self, tenant, node).map(|r| r.map_err(DriverError::from)).boxed()
    }

    fn remove_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<Removal, DriverError>> {
        KubeTenantNodes::remove_node(self, tenant, node).map(|r| r.map_err(DriverError::from)).boxed()
    }

    fn delete_join_tokens<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        KubeTenantNodes::delete_join_tokens(self, tenant, node).map(|r| r.map_err(DriverError::from)).boxed()
    }

    fn abandon_node<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        node: &'a NodeRef,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        KubeTenantNodes::abandon_node(self, tenant, node).map(|r| r.map_err(DriverError::from)).boxed()
    }
}
