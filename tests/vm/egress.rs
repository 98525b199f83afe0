//! The tenant control plane's reach into its cluster's network, standing in for Kamaji's
//! konnectivity (whose server and agent modules the Go module proxy here refuses): each tenant
//! API server of the harness gets an egress selector (`--egress-selector-config-file`) whose
//! `cluster` traffic (logs, exec, port-forward, and the service and pod proxy paddock's probes
//! use) goes as HTTP CONNECT over a Unix socket to a proxy of this test, which leads it on:
//! - to a node's kubelet (`10.70.0.NN:10250`, the node's address on the tenant network) through
//!   that VM's forwarded kubelet port, only while paddock has the machine in this API server's
//!   cluster (tests/vm/tenantnet.rs knows which);
//! - to a pod's address through a port-forward to that pod, asked of the same API server (which
//!   reaches the kubelet by the first rule): a pod's network is inside the VMs, where nothing on
//!   this host can route;
//! - anywhere else (a webhook on this host) directly, as the API server would without a selector.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use tokio::io::{copy_bidirectional, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UnixListener, UnixStream};

use crate::tenantnet::Hub;

/// One tenant API server's egress proxy; its configuration file is what the API server reads.
pub struct Egress {
    pub config: PathBuf,
    socket: PathBuf,
}

impl Drop for Egress {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Egress {
    /// A proxy for the API server of `cluster` (paddock's cluster id); `server` is set once the
    /// API server exists (a pod's port-forward is asked of it).
    pub async fn start(cluster: String, hub: Arc<Hub>, server: Arc<OnceLock<Client>>) -> Egress {
        // A Unix socket: the API server speaks to a TCP proxy only over TLS with a client
        // certificate, to a socket in plain HTTP.
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!("paddock-egress-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let socket = std::env::temp_dir().join(format!("{name}.sock"));
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).expect("the egress proxy's socket");
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let (cluster, hub, server) = (cluster.clone(), hub.clone(), server.clone());
                tokio::spawn(async move {
                    if let Err(e) = connect(inbound, &cluster, &hub, &server).await {
                        eprintln!("egress (played konnectivity) for cluster {cluster}: {e}");
                    }
                });
            }
        });
        let config = std::env::temp_dir().join(format!("{name}.yaml"));
        let yaml = format!(
            "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\negressSelections:\n\
             - name: cluster\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      uds:\n\
             \x20       udsName: {}\n",
            socket.display()
        );
        std::fs::write(&config, yaml).expect("the egress configuration");
        Egress { config, socket }
    }
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// One CONNECT: reads the request, answers 200 once the far end is open, then relays.
async fn connect(inbound: UnixStream, cluster: &str, hub: &Hub, server: &OnceLock<Client>) -> Result<(), Error> {
    let mut inbound = BufReader::new(inbound);
    let mut line = String::new();
    inbound.read_line(&mut line).await?;
    let target = line
        .strip_prefix("CONNECT ")
        .and_then(|rest| rest.split_whitespace().next())
        .ok_or_else(|| format!("not a CONNECT request: {line:?}"))?
        .to_owned();
    loop {
        let mut header = String::new();
        if inbound.read_line(&mut header).await? <= 2 {
            break;
        }
    }
    let (host, port) = target.rsplit_once(':').ok_or("no port")?;
    let port: u16 = port.parse()?;
    if let Some(kubelet) = hub.kubelet(cluster, host).filter(|_| port == 10250) {
        let mut outbound = TcpStream::connect(("127.0.0.1", kubelet)).await?;
        inbound.get_mut().write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await?;
        copy_bidirectional(inbound.get_mut(), &mut outbound).await?;
    } else if let Some(pod) = pod_at(server, host).await? {
        let client = server.get().ok_or("no API server yet")?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        let mut forward = pods.portforward(&pod.name_any(), &[port]).await?;
        let mut outbound = forward.take_stream(port).ok_or("no port-forward stream")?;
        inbound.get_mut().write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await?;
        copy_bidirectional(inbound.get_mut(), &mut outbound).await?;
    } else {
        let mut outbound = TcpStream::connect((host, port)).await?;
        inbound.get_mut().write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await?;
        copy_bidirectional(inbound.get_mut(), &mut outbound).await?;
    }
    Ok(())
}

/// The running pod whose address is `ip` in the API server's cluster, if any.
async fn pod_at(server: &OnceLock<Client>, ip: &str) -> Result<Option<Pod>, Error> {
    let Some(client) = server.get() else { return Ok(None) };
    if !ip.starts_with("10.244.") {
        return Ok(None);
    }
    let pods: Api<Pod> = Api::all(client.clone());
    let found = pods.list(&ListParams::default().fields(&format!("status.podIP={ip},status.phase=Running"))).await?;
    Ok(found.items.into_iter().find(|p| !p.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false)))
}
