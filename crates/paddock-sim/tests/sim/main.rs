//! The simulated drivers against a real PostgreSQL (and, for the agent, the real API on a port).
//! Zero latencies throughout, except where a test is about a latency.

mod agent;
mod bmc;
mod kube;
mod schema;

use paddock_domain::bmc::BmcAccess;
use paddock_domain::driver::{ClusterRef, NodeRef, TenantAccess};
use paddock_domain::secret::SecretString;
use paddock_sim::{SimConfig, SimWorld};
use paddock_store::Store;
use paddock_testkit::TestDb;
use paddock_types::{ClusterId, MachineId, NodePoolId, TenantId};
use uuid::Uuid;

/// A world over a fresh database.
pub async fn world() -> (TestDb, SimWorld) {
    let db = TestDb::new().await;
    let world = SimWorld::new(Store::from_pool(db.pool.clone()), SimConfig::zero());
    (db, world)
}

/// Another world over the same database (another worker process).
pub fn world_on(db: &TestDb, config: SimConfig) -> SimWorld {
    SimWorld::new(Store::from_pool(db.pool.clone()), config)
}

/// How the worker reaches `sim://<name>`, with the recorded system UUID.
pub fn access(name: &str, system_uuid: Option<String>) -> BmcAccess {
    BmcAccess {
        machine_id: MachineId(Uuid::now_v7()),
        url: format!("sim://{name}"),
        system_id: None,
        username: "admin".to_owned(),
        password: SecretString::new("pw".to_owned()),
        ca_cert: None,
        insecure_tls: false,
        system_uuid,
    }
}

/// A tenant cluster reference.
pub fn cluster() -> ClusterRef {
    ClusterRef {
        tenant_id: TenantId(Uuid::now_v7()),
        cluster_id: ClusterId(Uuid::now_v7()),
        tenant_name: "acme".to_owned(),
        cluster_name: "c1".to_owned(),
    }
}

/// Access to a tenant cluster.
pub fn tenant(cluster: &ClusterRef) -> TenantAccess {
    TenantAccess {
        cluster: cluster.clone(),
        endpoint: paddock_sim::endpoint(cluster.cluster_id),
        admin_kubeconfig: SecretString::new("kubeconfig".to_owned()),
    }
}

/// The node a simulated machine becomes.
pub fn node_of(machine: &str) -> NodeRef {
    NodeRef {
        machine_id: MachineId(Uuid::now_v7()),
        node_pool_id: NodePoolId(Uuid::now_v7()),
        pool_name: "gpu".to_owned(),
        node_name: format!("m-{machine}"),
        system_uuid: paddock_sim::system_uuid(machine),
        labels: [("pool".to_owned(), "gpu".to_owned())].into(),
        taints: Vec::new(),
    }
}
