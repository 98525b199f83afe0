//! What the tests of paddock's slurmrestd calls through the API server's service proxy share: a
//! Slurm cluster's objects written by the production driver on the shared API server (the JWT
//! key Secret the probe reads among them), and a slurmrestd on this host's routable address (a
//! stand-in, or a real one from `paddock_testkit::slurm_host`) behind the RestApi's Service.

use std::net::IpAddr;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use paddock_domain::driver::{SlurmPool, SlurmSecrets, TenantAccess};
use paddock_kube::{slurm, SlinkyDriver};
use paddock_testkit::skip;
use serde_json::json;
use tokio::net::TcpListener;

use crate::played::operator::routable_ip;
use crate::played::restd;
use crate::slurm::{access, desired, secrets, server, settings, unique};
use crate::support;

/// Why a test of paddock's probe through the API server's service proxy cannot run on this host.
pub const NO_ROUTABLE_ADDRESS: &str =
    "this host has no routable address for the slurmrestd stand-in (the API server proxies to no loopback address)";

/// A Slurm cluster as the production driver wrote it, for tests of its slurmrestd calls.
pub(crate) struct RestCluster {
    /// This host's routable address: where a test's slurmrestd listens.
    pub ip: IpAddr,
    pub client: Client,
    pub tenant: TenantAccess,
    /// The cluster's namespace.
    pub ns: String,
    pub secrets: SlurmSecrets,
    /// The production driver, probing through the service proxy.
    pub driver: SlinkyDriver,
}

impl RestCluster {
    /// Writes a cluster with `pools` through the driver; `None` (a skip) without a routable
    /// address or an API server.
    pub async fn new(pools: Vec<SlurmPool>) -> Option<Self> {
        let ip = skip::require(routable_ip(), NO_ROUTABLE_ADDRESS)?;
        let server = server().await?;
        let client = server.client().await;
        let tenant = access(&server);
        let ns = unique("slurm");
        let secrets = secrets();
        let driver = SlinkyDriver::with_service_proxy(settings(&ns));
        driver.ensure_slurm(&tenant, &desired(pools, &secrets)).await.expect("ensure");
        Some(RestCluster { ip, client, tenant, ns, secrets, driver })
    }

    /// The cluster's JWT key (the Secret's bytes), which its slurmrestd must accept tokens of.
    pub fn jwt_key(&self) -> Vec<u8> {
        base64::engine::general_purpose::STANDARD.decode(self.secrets.jwt_hs256_key.expose()).expect("b64")
    }

    /// A listener on a free port of [`RestCluster::ip`], for a stand-in to serve on.
    pub async fn listener(&self) -> (TcpListener, u16) {
        let listener = TcpListener::bind((self.ip, 0)).await.expect("bind the stand-in");
        let port = listener.local_addr().expect("addr").port();
        (listener, port)
    }

    /// The slurmrestd stand-in of the real-operator tests with the cluster's key, serving, and
    /// behind the RestApi's Service.
    pub async fn stand_in(&self) -> restd::StandInRestd {
        let restd = restd::StandInRestd::new(self.jwt_key());
        let (listener, port) = self.listener().await;
        let _serving = restd.clone().serve_on(listener);
        self.route_to(port).await;
        restd
    }

    /// Points the RestApi's Service at `port` of [`RestCluster::ip`] (playing the operator and
    /// the kubelet: slurmrestd's pod with that IP, and the Service's endpoints).
    pub async fn route_to(&self, port: u16) {
        play_restapi(&self.client, &self.ns, self.ip, port).await;
    }
}

/// PLAYS THE OPERATOR (and the kubelet): slurmrestd's pod in `ns`, with the stand-in's address
/// `ip` as its IP (the API server proxies only to endpoint addresses that are the IPs of their
/// target pods), and the RestApi's Service, its endpoint the stand-in's `port` (selector-less).
pub(crate) async fn play_restapi(client: &Client, ns: &str, ip: std::net::IpAddr, port: u16) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "slurm-restapi-0" },
        "spec": { "nodeName": unique("n-restd"), "containers": [{ "name": "slurmrestd", "image": "example.invalid/c:1" }] },
    }))
    .expect("pod");
    support::eventually(Duration::from_secs(30), "slurmrestd's pod to be created", || async {
        pods.create(&PostParams::default(), &pod).await.ok().map(|_| ())
    })
    .await;
    let pod_status =
        json!({ "status": { "phase": "Running", "podIP": ip.to_string(), "podIPs": [{ "ip": ip.to_string() }] } });
    pods.patch_status("slurm-restapi-0", &PatchParams::default(), &Patch::Merge(&pod_status)).await.expect("pod IP");
    let target = json!({ "kind": "Pod", "name": "slurm-restapi-0", "namespace": ns });

    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let svc = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": slurm::RESTAPI_SERVICE, "namespace": ns },
        "spec": { "ports": [{ "name": "slurmrestd", "port": 6820, "targetPort": port }] },
    });
    services.patch(slurm::RESTAPI_SERVICE, &PatchParams::apply("stand-in"), &Patch::Apply(&svc)).await.expect("svc");
    let endpoints: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("", "v1", "Endpoints")),
    );
    let ep = json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": { "name": slurm::RESTAPI_SERVICE, "namespace": ns },
        "subsets": [{ "addresses": [{ "ip": ip.to_string(), "targetRef": target }], "ports": [{ "name": "slurmrestd", "port": port }] }],
    });
    endpoints.patch(slurm::RESTAPI_SERVICE, &PatchParams::apply("stand-in"), &Patch::Apply(&ep)).await.expect("ep");
    let slices: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("discovery.k8s.io", "v1", "EndpointSlice")),
    );
    let slice_name = format!("{}-stand-in", slurm::RESTAPI_SERVICE);
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": { "name": slice_name, "namespace": ns,
                      "labels": { "kubernetes.io/service-name": slurm::RESTAPI_SERVICE } },
        "addressType": if ip.is_ipv4() { "IPv4" } else { "IPv6" },
        "endpoints": [{ "addresses": [ip.to_string()], "conditions": { "ready": true }, "targetRef": target }],
        "ports": [{ "name": "slurmrestd", "port": port, "protocol": "TCP" }],
    });
    slices.patch(&slice_name, &PatchParams::apply("stand-in"), &Patch::Apply(&slice)).await.expect("slice");
}
