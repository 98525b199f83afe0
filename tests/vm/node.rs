//! What a real join needs around the VMs: paddock with the REAL Kubernetes drivers (as `paddock
//! serve` assembles them with `PADDOCK_KUBE_DRIVER=kubernetes`) and the real Redfish driver; the
//! node network's far ends (the relays behind a node VM's doors); and Kamaji, PLAYED: Kamaji's
//! tenant control planes are pods of a management cluster built from images no registry here
//! serves, so for each TenantControlPlane paddock applies to the platform API server, a tenant
//! API server of the kube-harness stands in (with the controllers a kubelet's join needs:
//! csrapproving, csrsigning, bootstrapsigner, tokencleaner, node-lifecycle), and the player writes
//! the admin kubeconfig Secret and the status Kamaji would, and applies Kamaji's kube-proxy and
//! CoreDNS add-ons with local images (tests/vm/addons.rs). Each tenant API server runs the
//! workload controllers and the scheduler, as a real control plane does. Everything else is
//! real: the kubelet in the VM, its TLS bootstrap, the Node it registers, paddock's drivers, and
//! the pods the add-ons run on the nodes. The node VMs' tenant network is tests/vm/tenantnet.rs.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, ResourceExt};
use paddock_domain::driver::KubeDrivers;
use paddock_kube::isolation::LABEL_CLUSTER_ID;
use paddock_kube::kamaji::{self, ADMIN_KUBECONFIG_KEY};
use paddock_kube::slurm::{SlinkyDriver, SlinkySettings};
use paddock_kube::{KamajiBackend, KubePlatform, KubeTenantCredentials, KubeTenantNodes};
use paddock_redfish::{BmcLimiter, RedfishBmc};
use paddock_service::agent::AgentSettings;
use paddock_testkit::{skip, TestApp};
use paddock_worker::reconcile::{ClusterReconciler, DriftCheck, Drivers, MachineReconciler, Settings};
use paddock_worker::JobHandler;
use serde_json::{json, Value};
use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};

use crate::egress::Egress;
use crate::tenantnet::Hub;
use crate::testbed::{spawn_worker, NodePorts, Paddock, Testbed};

/// Where a node VM's guest dials its tenant's API server (scripts/lib/vm-domains.py's door).
pub const NODE_API_URL: &str = "https://10.0.2.100:6443";
/// Where a node VM's guest dials paddock's agent endpoint.
const NODE_AGENT_URL: &str = "http://10.0.2.100:8080";
/// The finalizer Kamaji puts on a TenantControlPlane (played here).
const KAMAJI_FINALIZER: &str = "finalizer.kamaji.clastix.io";
const KAMAJI_CRDS: [&str; 2] = ["kamaji.clastix.io_tenantcontrolplanes.yaml", "kamaji.clastix.io_datastores.yaml"];

/// Decides, per connection, where a relay forwards it (a loopback port), or refuses it (`None`).
pub type Route = Arc<dyn Fn() -> BoxFuture<'static, Option<u16>> + Send + Sync>;

/// Relays every connection to the loopback `port` of this host to where `route` says, for as
/// long as the test runs: the far end of a node VM's door, standing in for the provider's network
/// (which leads a tenant's machine to its own tenant's control plane, and nowhere else).
pub async fn relay(port: u16, route: Route) {
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap_or_else(|e| panic!("relay on :{port}: {e}"));
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let route = route.clone();
            tokio::spawn(async move {
                let Some(to) = route().await else { return };
                if let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", to)).await {
                    let _ = copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
}

/// One API server of the harness, as `POST /apiservers` describes it.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ApiServer {
    pub name: String,
    pub url: String,
    pub kubeconfig: PathBuf,
}

impl ApiServer {
    pub async fn client(&self) -> Client {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).expect("the harness kubeconfig");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.expect("config");
        Client::try_from(config).expect("client")
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("the API server's port")
    }
}

/// The kube-harness's control endpoint.
pub struct Harness(String);

impl Harness {
    /// `PADDOCK_TEST_KUBE_CONTROL`, or `None` (skipped outside CI, as [`skip`] says).
    pub fn from_env() -> Option<Harness> {
        let url = skip::env("PADDOCK_TEST_KUBE_CONTROL", "scripts/test starts the kube-harness")?;
        Some(Harness(url.trim_end_matches('/').to_owned()))
    }

    fn http() -> reqwest::Client {
        reqwest::Client::builder().timeout(Duration::from_secs(240)).build().expect("client")
    }

    /// A fresh API server named after `label`, from `body` (the harness's request fields).
    pub async fn create(&self, label: &str, mut body: Value) -> ApiServer {
        let mut name = format!("vm-{label}-{}-{}", std::process::id(), &uuid::Uuid::new_v4().simple().to_string()[..6]);
        name.truncate(63);
        body["name"] = json!(name);
        let rsp =
            Self::http().post(format!("{}/apiservers", self.0)).json(&body).send().await.expect("POST /apiservers");
        let status = rsp.status().as_u16();
        let text = rsp.text().await.expect("body");
        assert_eq!(status, 201, "creating API server {name}: {text}");
        serde_json::from_str(&text).expect("API server info")
    }

    pub async fn delete(&self, name: &str) {
        let _ = Self::http().delete(format!("{}/apiservers/{name}", self.0)).send().await;
    }
}

/// PLAYS KAMAJI (see the module documentation): cluster id -> its tenant API server.
pub struct Kamaji {
    harness: Harness,
    platform: Client,
    tenants: Mutex<HashMap<String, ApiServer>>,
    started: Mutex<Vec<String>>,
    /// The tenant API servers the add-ons were applied to.
    with_addons: Mutex<Vec<String>>,
    hub: Arc<Hub>,
    /// Each tenant API server's reach into its cluster's network (tests/vm/egress.rs).
    egress: Mutex<Vec<Egress>>,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Kamaji {
    /// The tenant API server of `cluster`, while its control plane exists.
    pub fn tenant(&self, cluster: &str) -> Option<ApiServer> {
        self.tenants.lock().expect("lock").get(cluster).cloned()
    }

    async fn run(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            if let Err(e) = self.round().await {
                eprintln!("kamaji (played): {e}");
            }
            tokio::select! {
                _ = stop.changed() => return,
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }

    async fn round(&self) -> Result<(), String> {
        let all: Api<DynamicObject> = Api::all_with(self.platform.clone(), &kamaji::api_resource());
        for tcp in all.list(&ListParams::default()).await.map_err(err)?.items {
            let (ns, name) = (tcp.namespace().unwrap_or_default(), tcp.name_any());
            let cluster = tcp.labels().get(LABEL_CLUSTER_ID).cloned().unwrap_or_default();
            let api: Api<DynamicObject> = Api::namespaced_with(self.platform.clone(), &ns, &kamaji::api_resource());
            if tcp.metadata.deletion_timestamp.is_some() {
                let gone = self.tenants.lock().expect("lock").remove(&cluster);
                if let Some(server) = gone {
                    self.harness.delete(&server.name).await;
                }
                let clear = json!({ "metadata": { "finalizers": null } });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&clear)).await.map_err(err)?;
                continue;
            }
            let server = match self.tenant(&cluster) {
                Some(s) => s,
                None => {
                    let controllers = ["defaults", "node-join", "workloads"];
                    let reach = Arc::new(OnceLock::new());
                    let egress = Egress::start(cluster.clone(), self.hub.clone(), reach.clone()).await;
                    // Kamaji's API servers reach kubelets by address first, as these do.
                    let args = [
                        format!("--egress-selector-config-file={}", egress.config.display()),
                        "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname".to_owned(),
                    ];
                    let body = json!({ "controllers": controllers, "node_url": NODE_API_URL, "args": args });
                    let server = self.harness.create("tenant", body).await;
                    let _ = reach.set(server.client().await);
                    self.egress.lock().expect("lock").push(egress);
                    self.started.lock().expect("lock").push(server.name.clone());
                    self.tenants.lock().expect("lock").insert(cluster.clone(), server.clone());
                    server
                }
            };
            if !self.with_addons.lock().expect("lock").contains(&server.name) {
                crate::addons::apply(&server.client().await).await.map_err(err)?;
                self.with_addons.lock().expect("lock").push(server.name.clone());
            }
            self.reconcile(&api, &tcp, &ns, &name, &server).await?;
        }
        Ok(())
    }

    /// What Kamaji writes for a live TenantControlPlane: its finalizer, the admin kubeconfig
    /// Secret (the harness server's loopback kubeconfig: paddock's worker talks to it from this
    /// host), and a Ready status whose endpoint is the address nodes dial.
    async fn reconcile(
        &self,
        api: &Api<DynamicObject>,
        tcp: &DynamicObject,
        ns: &str,
        name: &str,
        server: &ApiServer,
    ) -> Result<(), String> {
        if !tcp.finalizers().iter().any(|f| f == KAMAJI_FINALIZER) {
            let add = json!({ "metadata": { "finalizers": [KAMAJI_FINALIZER] } });
            api.patch(name, &PatchParams::default(), &Patch::Merge(&add)).await.map_err(err)?;
        }
        let secret_name = format!("{name}-admin-kubeconfig");
        let secrets: Api<Secret> = Api::namespaced(self.platform.clone(), ns);
        if secrets.get_opt(&secret_name).await.map_err(err)?.is_none() {
            let admin_conf = std::fs::read_to_string(&server.kubeconfig).map_err(err)?;
            let secret: Secret = serde_json::from_value(json!({
                "metadata": { "name": secret_name },
                "stringData": { ADMIN_KUBECONFIG_KEY: admin_conf, "admin.svc": admin_conf },
            }))
            .map_err(err)?;
            secrets.create(&PostParams::default(), &secret).await.map_err(err)?;
        }
        let status = &tcp.data["status"];
        let generation = tcp.metadata.generation;
        if status["observedGeneration"].as_i64() != generation
            || status["kubernetesResources"]["version"]["status"] != "Ready"
        {
            let version = tcp.data["spec"]["kubernetes"]["version"].clone();
            let endpoint = NODE_API_URL.trim_start_matches("https://");
            let status = json!({ "status": {
                "observedGeneration": generation,
                "controlPlaneEndpoint": endpoint,
                "kubeconfig": { "admin": { "secretName": secret_name, "checksum": "played" } },
                "kubernetesResources": { "version": { "status": "Ready", "version": version } },
            }});
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.map_err(err)?;
        }
        Ok(())
    }
}

/// paddock with the real drivers, the played Kamaji and its platform API server; stopped (and
/// its API servers deleted) by [`NodeLab::finish`].
pub struct NodeLab {
    pub p: Paddock,
    pub kamaji: Arc<Kamaji>,
    pub hub: Arc<Hub>,
    platform: ApiServer,
    /// The tenant stack's files (tests/vm/stack.rs).
    stack_dir: PathBuf,
}

impl NodeLab {
    /// `None`: skipped outside CI without the harness, the Kamaji CRDs or the stacks' files.
    pub async fn start(bed: &Testbed) -> Option<NodeLab> {
        let harness = Harness::from_env()?;
        let stacks = skip::env("PADDOCK_TEST_UPSTREAM_STACKS", "scripts/test fetches the stacks' upstream files")?;
        let crds_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/crds/kamaji");
        let crds: Vec<PathBuf> = KAMAJI_CRDS.iter().map(|f| crds_dir.join(f)).collect();
        if !crds.iter().all(|c| c.is_file()) {
            skip::skip(format_args!("the Kamaji CRDs are missing in {}", crds_dir.display()));
            return None;
        }
        let (node_image, node_sha) = bed.node_image.clone().expect("checked by the caller");
        let platform = harness.create("platform", json!({ "crds": crds })).await;

        let wipe = bed.image_sha256.clone();
        let os = node_sha.clone();
        let app = TestApp::served_with(move |a| AgentSettings {
            base_url: NODE_AGENT_URL.to_owned(),
            wipe_image_sha256: wipe,
            os_image_sha256: os,
            ..a
        })
        .await;
        let kube_platform = KubePlatform::connect(Some(&platform.kubeconfig)).await.expect("platform");
        let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let stack_dir = std::env::temp_dir().join(format!("paddock-vm-stack-{}-{tag}", std::process::id()));
        let stack = crate::stack::local(&PathBuf::from(stacks), &stack_dir);
        let kube = KubeDrivers {
            control_plane: Arc::new(KamajiBackend::new(kube_platform.client().clone())),
            platform: Arc::new(kube_platform),
            nodes: Arc::new(KubeTenantNodes::new()),
            stack: Arc::new(stack),
            slurm: Arc::new(SlinkyDriver::with_service_proxy(SlinkySettings::default())),
            ray: Arc::new(paddock_kube::KubeRayDriver::with_pod_proxy(paddock_kube::ray::RaySettings::default())),
            credentials: Arc::new(KubeTenantCredentials::new()),
        };
        let settings = Settings {
            wipe_image_url: Some(bed.image_url.clone()),
            os_image_url: Some(node_image),
            agent_token_ttl: Duration::from_secs(3600),
            report_wait: Duration::from_secs(5),
            poll: Duration::from_secs(2),
            // A BMC that comes back is tried again within seconds (the join test takes it away).
            outage_wait: Duration::from_secs(5),
            // A ready cluster's drift check reads its Nodes and Slurm nodes again: often, so that
            // the join test sees paddock's status follow a node rebooted under a job.
            drift_interval: Duration::from_secs(20),
            ..Settings::default()
        };
        let stop = run_worker(&app, kube, settings);
        let hub = Arc::new(Hub::start(app.db.pool.clone()));
        let kamaji = Arc::new(Kamaji {
            harness,
            platform: platform.client().await,
            tenants: Mutex::new(HashMap::new()),
            started: Mutex::new(Vec::new()),
            with_addons: Mutex::new(Vec::new()),
            hub: hub.clone(),
            egress: Mutex::new(Vec::new()),
        });
        tokio::spawn(kamaji.clone().run(stop.subscribe()));
        Some(NodeLab { p: Paddock::new(app, stop), kamaji, hub, platform, stack_dir })
    }

    /// Opens `ports`' doors for the node VM whose system UUID is `uuid`: the agent door to this
    /// paddock, the API door to the tenant API server of whichever cluster holds the machine at
    /// the moment of each connection (none: refused); and links it to the tenant network's hub.
    pub async fn open_doors(&self, ports: NodePorts, uuid: &str) {
        self.hub.attach(ports, uuid).await;
        let api_port = self.p.app.base_url.as_deref().and_then(|u| u.rsplit(':').next()?.parse().ok()).expect("port");
        relay(ports.agent, Arc::new(move || async move { Some(api_port) }.boxed())).await;
        let (pool, kamaji, uuid) = (self.p.app.db.pool.clone(), self.kamaji.clone(), uuid.to_owned());
        let route: Route = Arc::new(move || {
            let (pool, kamaji, uuid) = (pool.clone(), kamaji.clone(), uuid.clone());
            async move {
                let cluster: Option<(Option<String>,)> = sqlx::query_as(
                    "select cluster_id::text from machines where lower(system_uuid) = lower($1) and retired_at is null",
                )
                .bind(&uuid)
                .fetch_optional(&pool)
                .await
                .ok()?;
                Some(kamaji.tenant(&cluster?.0?)?.port())
            }
            .boxed()
        });
        relay(ports.api, route).await;
    }

    pub async fn finish(self) {
        drop(self.p);
        let started: Vec<String> = self.kamaji.started.lock().expect("lock").clone();
        for name in started {
            self.kamaji.harness.delete(&name).await;
        }
        self.kamaji.harness.delete(&self.platform.name).await;
        let _ = std::fs::remove_dir_all(&self.stack_dir);
    }
}

/// The worker as `paddock worker` runs it: the machine and cluster reconcilers (and the drift
/// check) on the real Redfish and Kubernetes drivers; stopped when the returned sender sends.
fn run_worker(app: &TestApp, kube: KubeDrivers, settings: Settings) -> tokio::sync::watch::Sender<bool> {
    let bmc = Arc::new(RedfishBmc::new(BmcLimiter::new(4)));
    let drivers = Drivers { bmc: Some(bmc), kube: Some(kube) };
    let cluster = ClusterReconciler::new(app.services.clone(), drivers.clone(), settings.clone());
    let handlers: Vec<Arc<dyn JobHandler>> = vec![
        Arc::new(MachineReconciler::new(app.services.clone(), drivers, settings)),
        Arc::new(DriftCheck(cluster.clone())),
        Arc::new(cluster),
    ];
    spawn_worker(app, "vm-node-worker", handlers)
}
