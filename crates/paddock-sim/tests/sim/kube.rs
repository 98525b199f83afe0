//! The simulated platform, control planes and tenant clusters.

use std::time::Duration;

use paddock_domain::bmc::AfterBoot;
use paddock_domain::driver::{
    ControlPlaneSpec, Drain, NodeRef, Removal, ServiceType, SlurmDesired, SlurmPool, SlurmSecrets, SlurmVersion,
};
use paddock_domain::secret::SecretString;
use paddock_sim::{system_uuid, ClusterFault, MachineFault, SimConfig};
use paddock_types::cluster::SlurmSpec;
use paddock_types::NodePoolId;
use uuid::Uuid;

use crate::{access, cluster, node_of, tenant, world, world_on};

fn spec(cluster: &paddock_domain::driver::ClusterRef) -> ControlPlaneSpec {
    ControlPlaneSpec {
        cluster: cluster.clone(),
        kubernetes_version: "v1.34.1".to_owned(),
        replicas: 2,
        service_type: ServiceType::LoadBalancer,
        datastore: None,
    }
}

fn slurm_version() -> SlurmVersion {
    let stack_version = paddock_domain::stack::latest_version().to_owned();
    SlurmVersion { stack_version, version: SlurmSpec::default().version }
}

fn slurm(pools: &[(&str, u32, &[&str])]) -> SlurmDesired {
    SlurmDesired {
        spec: SlurmSpec::default(),
        stack_version: paddock_domain::stack::latest_version().to_owned(),
        pools: pools
            .iter()
            .map(|(name, count, nodes)| SlurmPool {
                node_pool_id: NodePoolId(Uuid::now_v7()),
                name: (*name).to_owned(),
                count: *count,
                node_names: nodes.iter().map(|n| (*n).to_owned()).collect(),
                releasing: Vec::new(),
                gpus_per_node: 0,
                class_size: (8, 32),
                autoscaling_max: None,
                taints: Vec::new(),
                role: Default::default(),
            })
            .collect(),
        secrets: SlurmSecrets {
            slurm_key: SecretString::new("k".into()),
            jwt_hs256_key: SecretString::new("j".into()),
            database_password: SecretString::new("p".into()),
        },
    }
}

#[tokio::test]
async fn a_cluster_comes_up_and_goes_away_idempotently() {
    let (db, world) = world().await;
    let kube = world.kube();
    let c = cluster();
    let t = tenant(&c);

    // Step 2 needs step 1.
    let err = kube.control_plane.ensure_control_plane(&spec(&c)).await.expect_err("no namespace yet");
    assert_eq!(err.code, "namespace_missing");
    let iso = kube.platform.ensure_isolation(&c).await.expect("isolation");
    assert_eq!(iso.namespace, paddock_sim::namespace_name(c.cluster_id));
    assert!(!iso.changed.is_empty());
    assert!(kube.platform.ensure_isolation(&c).await.expect("again").changed.is_empty(), "a repeat changes nothing");

    for _ in 0..2 {
        let status = kube.control_plane.ensure_control_plane(&spec(&c)).await.expect("control plane");
        assert!(status.ready, "{status:?}");
        assert_eq!(status.endpoint.as_deref(), Some(paddock_sim::endpoint(c.cluster_id).as_str()));
        let kubeconfig = String::from_utf8(status.admin_kubeconfig.expect("kubeconfig")).expect("utf-8");
        assert!(kubeconfig.contains("kind: Config") && kubeconfig.contains(".paddock.invalid:6443"));
        assert!(
            kube.stack
                .ensure_stack(&t, paddock_domain::stack::latest_version(), paddock_types::cluster::ClusterKind::Slurm)
                .await
                .expect("stack")
                .ready
        );
    }

    // Slurm waits for a node in every pool with a count.
    let waiting = kube.slurm.ensure_slurm(&t, &slurm(&[("gpu", 2, &[]), ("cpu", 0, &[])])).await.expect("slurm");
    assert!(!waiting.ready && waiting.reason.contains("gpu"), "{waiting:?}");
    let ready = kube.slurm.ensure_slurm(&t, &slurm(&[("gpu", 2, &["m-a"]), ("cpu", 0, &[])])).await.expect("slurm");
    assert!(ready.ready, "{ready:?}");
    let drained = kube.slurm.drain_node(&t, &slurm_version(), "m-a").await.expect("drain");
    assert_eq!(drained, paddock_domain::driver::SlurmDrain::Done);

    // Deletion, in the worker's order, each step repeated.
    for _ in 0..2 {
        assert_eq!(kube.slurm.remove_slurm(&t).await.expect("slurm"), Removal::Gone);
        assert_eq!(kube.control_plane.delete_control_plane(&c).await.expect("cp"), Removal::Gone);
        assert_eq!(kube.platform.remove_isolation(&c).await.expect("ns"), Removal::Gone);
    }
    let gone: bool = sqlx::query_scalar(
        "select namespace is null and control_plane_created_at is null and slurm_applied_at is null
         from paddock_sim.clusters where cluster_id = $1",
    )
    .bind(c.cluster_id.uuid())
    .fetch_one(&db.pool)
    .await
    .expect("row");
    assert!(gone);
    let err = kube
        .stack
        .ensure_stack(&t, paddock_domain::stack::latest_version(), paddock_types::cluster::ClusterKind::Slurm)
        .await
        .expect_err("no tenant cluster any more");
    assert_eq!(err.code, "tenant_unreachable");
}

#[tokio::test]
async fn latencies_make_things_wait_and_removal_deletes_then_is_gone() {
    let (db, _) = world().await;
    let config = SimConfig {
        control_plane_latency: Duration::from_secs(3600),
        delete_latency: Duration::from_secs(3600),
        ..SimConfig::zero()
    };
    let slow = world_on(&db, config).kube();
    let c = cluster();
    slow.platform.ensure_isolation(&c).await.expect("isolation");
    let status = slow.control_plane.ensure_control_plane(&spec(&c)).await.expect("control plane");
    assert!(!status.ready && status.endpoint.is_none() && status.admin_kubeconfig.is_none(), "{status:?}");
    assert_eq!(slow.control_plane.delete_control_plane(&c).await.expect("delete"), Removal::Deleting);
    assert_eq!(slow.control_plane.delete_control_plane(&c).await.expect("delete"), Removal::Deleting);
    // Another process over the same world sees the same deletion; with its zero latency the
    // deletion is over, and then it is over for everyone.
    let fast = world_on(&db, SimConfig::zero()).kube();
    assert_eq!(fast.control_plane.delete_control_plane(&c).await.expect("delete"), Removal::Gone);
    assert_eq!(slow.control_plane.delete_control_plane(&c).await.expect("delete"), Removal::Gone);
}

#[tokio::test]
async fn control_plane_faults_hold_the_cluster() {
    let (_db, world) = world().await;
    let kube = world.kube();
    let c = cluster();
    world.set_cluster_fault(c.cluster_id, ClusterFault::ControlPlaneNeverReady, true).await.expect("fault");
    kube.platform.ensure_isolation(&c).await.expect("isolation");
    let status = kube.control_plane.ensure_control_plane(&spec(&c)).await.expect("control plane");
    assert!(!status.ready, "{status:?}");
    world.set_cluster_fault(c.cluster_id, ClusterFault::ControlPlaneNeverReady, false).await.expect("heal");
    assert!(kube.control_plane.ensure_control_plane(&spec(&c)).await.expect("control plane").ready);

    world.set_cluster_fault(c.cluster_id, ClusterFault::TenantUnreachable, true).await.expect("fault");
    let err = kube
        .stack
        .ensure_stack(&tenant(&c), paddock_domain::stack::latest_version(), paddock_types::cluster::ClusterKind::Slurm)
        .await
        .expect_err("unreachable");
    assert!(err.is_transient() && err.code == "tenant_unreachable", "{err:?}");
}

/// A provisioned machine's Node, as the agent leaves it, without going through HTTP.
async fn provisioned(db: &paddock_testkit::TestDb, cluster: Uuid, machine: &str) {
    sqlx::query("insert into paddock_sim.nodes (cluster_id, node_name, system_uuid) values ($1, $2, $3)")
        .bind(cluster)
        .bind(format!("m-{machine}"))
        .bind(system_uuid(machine))
        .execute(&db.pool)
        .await
        .expect("node");
}

#[tokio::test]
async fn nodes_register_on_disk_boot_and_turn_ready() {
    let (db, world) = world().await;
    let kube = world.kube();
    let c = cluster();
    let t = tenant(&c);
    kube.platform.ensure_isolation(&c).await.expect("isolation");
    kube.control_plane.ensure_control_plane(&spec(&c)).await.expect("control plane");
    let n = node_of("w1");

    let join = kube.nodes.join_config(&t, &n, 600).await.expect("join config");
    assert_eq!(join.0["cluster_id"], c.cluster_id.uuid().to_string());
    assert_eq!(join.0["node_name"], "m-w1");
    let token = join.0["bootstrap_token"].as_str().expect("token");
    assert_eq!((token.len(), token.find('.')), (23, Some(6)));

    assert_eq!(kube.nodes.node(&t, &n).await.expect("node"), None, "nothing provisioned yet");
    provisioned(&db, c.cluster_id.uuid(), "w1").await;
    assert_eq!(kube.nodes.node(&t, &n).await.expect("node"), None, "installed, not booted from disk");

    let a = access("w1", Some(system_uuid("w1")));
    world.bmc().finish_boot(&a, AfterBoot::BootFromDisk).await.expect("boot from disk");
    let status = kube.nodes.node(&t, &n).await.expect("node").expect("registered");
    assert_eq!(status.name, "m-w1");
    assert!(status.ready);
    let nodes = world.nodes(c.cluster_id).await.expect("nodes");
    assert_eq!(nodes[0].labels["pool"], "gpu", "labels converged to the pool's");
    assert_eq!(kube.nodes.drain_node(&t, &n).await.expect("drain"), Drain::Drained, "simulated Nodes run no pods");
    assert_eq!(kube.nodes.foreign_node(&t, &n).await.expect("foreign node"), None, "its own UUID");
    // Seen from a machine expecting that name with another UUID, the Node is foreign.
    let expecting = NodeRef { system_uuid: system_uuid("w9"), ..n.clone() };
    assert_eq!(kube.nodes.foreign_node(&t, &expecting).await.expect("foreign node"), Some(system_uuid("w1")));

    // Powered off: NotReady; removed: gone, and removing again is fine.
    world.bmc().power_off(&a).await.expect("off");
    assert!(!kube.nodes.node(&t, &n).await.expect("node").expect("still there").ready);
    for _ in 0..2 {
        assert_eq!(kube.nodes.remove_node(&t, &n).await.expect("remove"), Removal::Gone);
    }
    assert_eq!(kube.nodes.node(&t, &n).await.expect("node"), None);
}

#[tokio::test]
async fn a_machine_that_never_joins_stays_not_ready() {
    let (db, world) = world().await;
    let kube = world.kube();
    let c = cluster();
    let t = tenant(&c);
    kube.platform.ensure_isolation(&c).await.expect("isolation");
    kube.control_plane.ensure_control_plane(&spec(&c)).await.expect("control plane");
    world.set_machine_fault("w2", MachineFault::NeverJoins, true).await.expect("fault");
    provisioned(&db, c.cluster_id.uuid(), "w2").await;
    world.bmc().finish_boot(&access("w2", Some(system_uuid("w2"))), AfterBoot::BootFromDisk).await.expect("boot");
    let status = kube.nodes.node(&t, &node_of("w2")).await.expect("node").expect("registered");
    assert!(!status.ready);
}

#[tokio::test]
async fn a_node_turns_ready_only_after_its_latency() {
    let (db, _) = world().await;
    let world = world_on(&db, SimConfig { node_ready_latency: Duration::from_secs(3600), ..SimConfig::zero() });
    let kube = world.kube();
    let c = cluster();
    kube.platform.ensure_isolation(&c).await.expect("isolation");
    kube.control_plane.ensure_control_plane(&spec(&c)).await.expect("control plane");
    provisioned(&db, c.cluster_id.uuid(), "w3").await;
    world.bmc().finish_boot(&access("w3", Some(system_uuid("w3"))), AfterBoot::BootFromDisk).await.expect("boot");
    let status = kube.nodes.node(&tenant(&c), &node_of("w3")).await.expect("node").expect("registered");
    assert!(!status.ready, "kubelet still starting");
}
