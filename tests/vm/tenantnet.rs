//! The tenant network between node VMs, standing in for a provider's per-tenant network (a VLAN or
//! VRF per cluster): scripts/lib/vm-domains.py links each node VM's second NIC to a UDP port of
//! this hub (QEMU's `-netdev dgram`: one Ethernet frame per datagram), and the hub passes a frame
//! from one VM to every other VM that paddock has in the same cluster at that moment, and nowhere
//! else. A machine in no cluster (being wiped, available, in maintenance) reaches nobody and is
//! reached by nobody; a released machine is cut off as soon as paddock records the release.
//!
//! It floods instead of learning addresses (a hub, not a switch): with the few VMs of a test the
//! difference is only load, and which VMs see a frame is still decided by the cluster alone.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

use crate::testbed::NodePorts;

/// One VM on the hub: its socket (frames from it arrive here, frames to it leave from here) and
/// where QEMU listens for them.
struct Port {
    uuid: String,
    ports: NodePorts,
    socket: Arc<UdpSocket>,
    qemu: SocketAddr,
}

/// Frames the hub passed on (one per receiving VM) and frames it kept from everyone.
#[derive(Debug, Default)]
pub struct Counts {
    pub forwarded: AtomicU64,
    pub dropped: AtomicU64,
}

pub struct Hub {
    ports: Arc<Mutex<Vec<Port>>>,
    /// The cluster paddock has each machine in, by lower-case system UUID, re-read every 250 ms.
    clusters: Arc<Mutex<HashMap<String, String>>>,
    pub counts: Arc<Counts>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Hub {
    /// A hub reading cluster membership from paddock's database.
    pub fn start(db: PgPool) -> Hub {
        let clusters = Arc::new(Mutex::new(HashMap::new()));
        let reader = tokio::spawn(read_clusters(db, clusters.clone()));
        Hub {
            ports: Arc::new(Mutex::new(Vec::new())),
            clusters,
            counts: Arc::new(Counts::default()),
            tasks: Mutex::new(vec![reader]),
        }
    }

    /// Links the VM whose system UUID is `uuid` (its link's ports: `ports`) to the hub.
    pub async fn attach(&self, ports: NodePorts, uuid: &str) {
        let socket = UdpSocket::bind(("127.0.0.1", ports.tenant_net))
            .await
            .unwrap_or_else(|e| panic!("the tenant network hub on udp :{}: {e}", ports.tenant_net));
        let socket = Arc::new(socket);
        let qemu = SocketAddr::from(([127, 0, 0, 1], ports.tenant_net_qemu));
        let uuid = uuid.to_lowercase();
        self.ports.lock().expect("lock").push(Port { uuid: uuid.clone(), ports, socket: socket.clone(), qemu });
        let (ports, clusters, counts) = (self.ports.clone(), self.clusters.clone(), self.counts.clone());
        let task = tokio::spawn(async move {
            let mut frame = vec![0u8; 65536];
            while let Ok(len) = socket.recv(&mut frame).await {
                let to = peers(&ports, &clusters, &uuid);
                if to.is_empty() {
                    counts.dropped.fetch_add(1, Ordering::Relaxed);
                }
                for (peer, addr) in to {
                    if peer.send_to(&frame[..len], addr).await.is_ok() {
                        counts.forwarded.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        self.tasks.lock().expect("lock").push(task);
    }
}

impl Hub {
    /// The host port forwarded to the kubelet of the node whose tenant network address is `ip`,
    /// while paddock has that machine in `cluster`.
    pub fn kubelet(&self, cluster: &str, ip: &str) -> Option<u16> {
        let number: u8 = ip.strip_prefix("10.70.0.")?.parse().ok()?;
        let clusters = self.clusters.lock().expect("lock");
        let ports = self.ports.lock().expect("lock");
        let port = ports.iter().find(|p| p.ports.number == number)?;
        (clusters.get(&port.uuid).map(String::as_str) == Some(cluster)).then_some(port.ports.kubelet)
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        for task in self.tasks.lock().expect("lock").drain(..) {
            task.abort();
        }
    }
}

/// Every other VM in the cluster `from` is in (none when `from` is in none): each one's socket
/// and QEMU's address.
fn peers(
    ports: &Mutex<Vec<Port>>,
    clusters: &Mutex<HashMap<String, String>>,
    from: &str,
) -> Vec<(Arc<UdpSocket>, SocketAddr)> {
    let clusters = clusters.lock().expect("lock");
    let Some(cluster) = clusters.get(from) else { return Vec::new() };
    let ports = ports.lock().expect("lock");
    ports
        .iter()
        .filter(|p| p.uuid != from && clusters.get(&p.uuid) == Some(cluster))
        .map(|p| (p.socket.clone(), p.qemu))
        .collect()
}

/// Keeps `clusters` current: every live machine paddock has in a cluster, by system UUID.
async fn read_clusters(db: PgPool, clusters: Arc<Mutex<HashMap<String, String>>>) {
    loop {
        let rows: Result<Vec<(String, String)>, _> = sqlx::query_as(
            "select lower(system_uuid), cluster_id::text from machines \
             where cluster_id is not null and system_uuid is not null and retired_at is null",
        )
        .fetch_all(&db)
        .await;
        if let Ok(rows) = rows {
            *clusters.lock().expect("lock") = rows.into_iter().collect();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
