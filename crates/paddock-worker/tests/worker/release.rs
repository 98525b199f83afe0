//! The release and the end of provisioning through the `MachineReconciler` with the REAL tenant-node
//! driver (`paddock_kube::KubeTenantNodes`) against a kube-apiserver of the kube-harness
//! (`PADDOCK_TEST_KUBE_CONTROL`, started by `scripts/test`), the simulated BMC (`paddock_sim`) and
//! a real PostgreSQL. The tests play the kubelet (Nodes, their status and Lease, the final removal
//! of an evicted pod), as the harness runs none.
//!
//! Without the harness these tests skip with a notice, except under `CI=true`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, ServiceAccount};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use paddock_domain::bmc::{AfterBoot, BmcAccess, BmcDriver, BmcError, BootMedia, BoxFuture, Inventory, SystemStatus};
use paddock_domain::driver::{node_name, KubeDrivers};
use paddock_domain::job_kind::MACHINE_RECONCILE;
use paddock_domain::model::{Bmc, Machine};
use paddock_domain::secret::Binding;
use paddock_kube::nodes::{BOOTSTRAP_NAMESPACE, BOOTSTRAP_TOKEN_TYPE, LABEL_MACHINE_ID, NODE_LEASE_NAMESPACE};
use paddock_kube::KubeTenantNodes;
use paddock_sim::{SimConfig, SimWorld};
use paddock_store::allocation::{self, Allocation, Need};
use paddock_store::{cluster, custody, lifecycle, machine, Store};
use paddock_testkit::{admin, skip, TestApp};
use paddock_types::machine::MachineState;
use paddock_types::{ClusterId, Labels, MachineClassId, MachineId, NodePoolId, TenantId};
use paddock_worker::reconcile::{Drivers, MachineReconciler, Settings};
use paddock_worker::{JobHandler, Outcome};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::support::{enqueue, get, init_tracing, new_job};

const WAIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// A kube-apiserver of the harness, as the tenant cluster.

/// One API server of the harness (`POST /apiservers`).
#[derive(Debug, Clone)]
struct ApiServer {
    name: String,
    url: String,
    kubeconfig: std::path::PathBuf,
}

fn http() -> reqwest::Client {
    // API server starts get slow when tests run in parallel on 2 cores (the harness's README).
    reqwest::Client::builder().timeout(Duration::from_secs(180)).build().expect("reqwest client")
}

/// A fresh API server for `test` (delete it with [`ApiServer::delete`]), or None (skipped).
async fn api_server(test: &str) -> Option<ApiServer> {
    let control = skip::env("PADDOCK_TEST_KUBE_CONTROL", "the kube-harness plays the tenant cluster")?;
    let name = format!("{}-{}", test.replace('_', "-"), std::process::id());
    let rsp = http()
        .post(format!("{}/apiservers", control.trim_end_matches('/')))
        .json(&json!({ "name": name }))
        .send()
        .await
        .expect("POST /apiservers");
    let status = rsp.status();
    let body = rsp.text().await.expect("body");
    assert_eq!(status.as_u16(), 201, "creating API server {name}: {body}");
    let info: Value = serde_json::from_str(&body).expect("API server info");
    let field = |k: &str| info[k].as_str().unwrap_or_else(|| panic!("no {k} in {info}")).to_owned();
    Some(ApiServer { name: field("name"), url: field("url"), kubeconfig: field("kubeconfig").into() })
}

impl ApiServer {
    async fn client(&self) -> Client {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).expect("the harness kubeconfig");
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.expect("config");
        Client::try_from(config).expect("client")
    }

    async fn delete(&self) {
        let control = std::env::var("PADDOCK_TEST_KUBE_CONTROL").expect("set, since the server exists");
        let url = format!("{}/apiservers/{}", control.trim_end_matches('/'), self.name);
        let rsp = http().delete(url).send().await.expect("DELETE");
        assert!(rsp.status().is_success(), "deleting API server {}: {}", self.name, rsp.status());
    }
}

/// Plays the kubelet registering Node `name` with `system_uuid`, Ready.
async fn register(client: &Client, name: &str, system_uuid: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({ "metadata": { "name": name } })).expect("node");
    nodes.create(&PostParams::default(), &node).await.expect("register the Node");
    let status = json!({ "status": {
        "nodeInfo": { "systemUUID": system_uuid, "machineID": "m", "bootID": "b", "kernelVersion": "6.8.0",
            "osImage": "paddock", "containerRuntimeVersion": "containerd://2.0.0", "kubeletVersion": "v1.34.1",
            "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64" },
        "conditions": [{ "type": "Ready", "status": "True", "reason": "KubeletReady" }],
    } });
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("the Node's status");
}

/// Watches Node `name` from now on; the task ends with the moment the test saw it deleted.
async fn node_deletion(client: &Client, name: &str) -> tokio::task::JoinHandle<DateTime<Utc>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let version = nodes.get(name).await.expect("the Node").metadata.resource_version.expect("its version");
    let params = WatchParams::default().fields(&format!("metadata.name={name}"));
    let events = nodes.watch(&params, &version).await.expect("watch the Node");
    tokio::spawn(async move {
        let mut events = Box::pin(events);
        while let Some(event) = events.next().await {
            if let Ok(WatchEvent::Deleted(_)) = event {
                return Utc::now();
            }
        }
        panic!("the watch ended before the Node was deleted");
    })
}

// ---------------------------------------------------------------------------------------------
// The simulated BMC, noting what the tenant cluster held at each power-off.

/// What the tenant cluster held right after a power-off returned.
#[derive(Debug, Clone)]
struct PowerOff {
    at: DateTime<Utc>,
    /// The Node existed, and was not being deleted.
    node_standing: bool,
    /// Its Lease existed.
    lease: bool,
    /// The pods on it (names).
    pods: Vec<String>,
}

struct Recording {
    inner: Arc<dyn BmcDriver>,
    client: Client,
    node_name: String,
    power_offs: Mutex<Vec<PowerOff>>,
}

impl Recording {
    async fn note_power_off(&self) {
        let node = Api::<Node>::all(self.client.clone()).get_opt(&self.node_name).await.expect("get the Node");
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), NODE_LEASE_NAMESPACE);
        let lease = leases.get_opt(&self.node_name).await.expect("get the Lease").is_some();
        let on_node = ListParams::default().fields(&format!("spec.nodeName={}", self.node_name));
        let pods = Api::<Pod>::all(self.client.clone()).list(&on_node).await.expect("pods").items;
        let pods = pods.into_iter().filter_map(|p| p.metadata.name).collect();
        let node_standing = node.is_some_and(|n| n.metadata.deletion_timestamp.is_none());
        self.power_offs.lock().expect("lock").push(PowerOff { at: Utc::now(), node_standing, lease, pods });
    }

    fn power_offs(&self) -> Vec<PowerOff> {
        self.power_offs.lock().expect("lock").clone()
    }
}

impl BmcDriver for Recording {
    fn inspect<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<Inventory, BmcError>> {
        self.inner.inspect(access)
    }

    fn boot_from_media<'a>(
        &'a self,
        access: &'a BmcAccess,
        media: &'a BootMedia,
    ) -> BoxFuture<'a, Result<(), BmcError>> {
        self.inner.boot_from_media(access, media)
    }

    fn finish_boot<'a>(&'a self, access: &'a BmcAccess, after: AfterBoot) -> BoxFuture<'a, Result<(), BmcError>> {
        self.inner.finish_boot(access, after)
    }

    fn power_off<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            self.inner.power_off(access).await?;
            self.note_power_off().await;
            Ok(())
        })
    }

    fn system_status<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<SystemStatus, BmcError>> {
        self.inner.system_status(access)
    }
}

// ---------------------------------------------------------------------------------------------
// The bench: paddock's API and database, the simulated world, one tenant cluster on the harness.

struct Bench {
    app: TestApp,
    store: Store,
    world: SimWorld,
    server: ApiServer,
    client: Client,
    class: MachineClassId,
    tenant: TenantId,
    cluster: ClusterId,
    pool: NodePoolId,
}

impl Bench {
    /// The bench with the available machines `machines` (behind `sim://<name>`), in that order.
    async fn new(server: ApiServer, machines: &[&str]) -> (Bench, Vec<MachineId>) {
        init_tracing();
        let app = TestApp::new().await;
        let store = Store::from_pool(app.db.pool.clone());
        paddock_sim::migrate(&store).await.expect("the simulated world's schema");
        let world = SimWorld::new(store.clone(), SimConfig { bmc_latency: Duration::ZERO, ..SimConfig::default() });
        let client = server.client().await;
        let body = json!({ "name": "metal", "cpu_cores": 64, "memory_gib": 512, "gpu_count": 0 });
        let class = app.post("/v1/machine-classes").token(&admin()).json(&body).send().await.expect(201).json();
        let class = MachineClassId(uuid_in(&class["id"]));
        let mut ids = Vec::new();
        for name in machines {
            ids.push(available(&app, &store, class, name).await);
        }
        let t = app.post("/v1/tenants").token(&admin()).json(&json!({ "name": "acme" })).send().await.expect(201);
        let tenant = uuid_in(&t.json()["id"]);
        let body = json!({
            "name": "c1", "kind": "kubernetes", "isolation": "private-nodes",
            "node_pools": [{ "name": "p", "machine_class": "metal", "count": 1 }],
        });
        app.post(format!("/v1/tenants/{tenant}/clusters")).token(&admin()).json(&body).send().await.expect(202);
        let (cluster, pool): (Uuid, Uuid) = sqlx::query_as(
            "select c.id, p.id from clusters c join node_pools p on p.cluster_id = c.id where c.tenant_id = $1",
        )
        .bind(tenant)
        .fetch_one(store.pool())
        .await
        .expect("cluster and pool");
        // The control plane as the cluster reconciler publishes it: this API server.
        let endpoint = server.url.trim_start_matches("https://");
        sqlx::query("update clusters set endpoints = $2 where id = $1")
            .bind(cluster)
            .bind(json!({ "kubernetes_api": endpoint, "slurm_rest_api": null, "login_ssh": null }))
            .execute(store.pool())
            .await
            .expect("endpoints");
        let kubeconfig = std::fs::read(&server.kubeconfig).expect("the harness kubeconfig");
        let binding = paddock_service::credentials::kubeconfig_binding(ClusterId(cluster));
        let sealed = app.cipher.seal(&kubeconfig, binding).expect("seal");
        let mut conn = store.conn().await.expect("conn");
        cluster::set_admin_kubeconfig(&mut conn, TenantId(tenant), ClusterId(cluster), Some(&sealed))
            .await
            .expect("kubeconfig");
        drop(conn);
        let (tenant, cluster, pool) = (TenantId(tenant), ClusterId(cluster), NodePoolId(pool));
        (Bench { app, store, world, server, client, class, tenant, cluster, pool }, ids)
    }
}

/// An available machine of `class` behind the simulated BMC `sim://<name>` (its system UUID
/// recorded, a verified clean unused).
async fn available(app: &TestApp, store: &Store, class: MachineClassId, name: &str) -> MachineId {
    let id = MachineId::new();
    let binding = Binding { table: "machines", column: "bmc_password_enc", row: id.uuid() };
    let bmc = Bmc {
        url: format!("sim://{name}"),
        system_id: Some(paddock_sim::SYSTEM_ID.to_owned()),
        username: "admin".to_owned(),
        password_enc: app.cipher.seal(b"password", binding).expect("seal"),
        ca_cert: None,
        insecure_tls: false,
        allow_insecure_http: true,
    };
    let labels = Labels::default();
    let new = machine::NewMachine { id, name, machine_class_id: class, labels: &labels, bmc: &bmc };
    let mut conn = store.conn().await.expect("conn");
    machine::insert(&mut conn, &new).await.expect("insert machine");
    let clean = Uuid::new_v4();
    sqlx::query(
        "insert into machine_cleans (id, machine_id, run_id, method, evidence) values ($1, $2, $3, 'agent', '{}')",
    )
    .bind(clean)
    .bind(id.uuid())
    .bind(Uuid::new_v4())
    .execute(&mut *conn)
    .await
    .expect("clean");
    sqlx::query("update machines set state = 'available', system_uuid = $2, clean_id = $3 where id = $1")
        .bind(id.uuid())
        .bind(paddock_sim::system_uuid(name))
        .bind(clean)
        .execute(&mut *conn)
        .await
        .expect("available");
    id
}

impl Bench {
    /// `id` allocated to the cluster's pool.
    async fn allocate(&self, id: MachineId) {
        let need = Need { node_pool_id: self.pool, machine_class_id: self.class, gpu_count: 0, count: 1 };
        let mut tx = self.store.begin().await.expect("begin");
        let key = paddock_testkit::ledger_key();
        let outcome = allocation::allocate(
            &mut tx,
            &key,
            self.tenant,
            self.cluster,
            std::slice::from_ref(&need),
            Duration::from_secs(600),
        )
        .await
        .expect("allocate");
        tx.commit().await.expect("commit");
        assert_eq!(outcome, Allocation::Allocated(vec![id]));
        // As the cluster reconciler does once the allocation is in.
        let mut tx = self.store.begin().await.expect("begin");
        allocation::hand_over(&mut tx, &[id], &[need]).await.expect("hand over");
        tx.commit().await.expect("commit");
    }

    fn reconciler(&self, bmc: Arc<Recording>) -> MachineReconciler {
        let kube = KubeDrivers { nodes: Arc::new(KubeTenantNodes::new()), ..self.world.kube() };
        let settings = Settings { poll: Duration::from_millis(200), ..Settings::default() };
        MachineReconciler::new(self.app.services.clone(), Drivers { bmc: Some(bmc), kube: Some(kube) }, settings)
    }

    fn recording(&self, node_name: &str) -> Arc<Recording> {
        Arc::new(Recording {
            inner: self.world.bmc(),
            client: self.client.clone(),
            node_name: node_name.to_owned(),
            power_offs: Mutex::default(),
        })
    }

    async fn load(&self, id: MachineId) -> Machine {
        let mut conn = self.store.conn().await.expect("conn");
        machine::get(&mut conn, id).await.expect("get").expect("machine")
    }

    /// Runs the handler once, as the worker would, on a job loaded from the queue.
    async fn run(&self, r: &MachineReconciler, id: MachineId) -> Outcome {
        let job_id = enqueue(&self.store, &new_job(MACHINE_RECONCILE, id.uuid())).await;
        let job = get(&self.store, job_id).await;
        tokio::time::timeout(Duration::from_secs(90), r.run(&job)).await.expect("the run ends")
    }

    /// Machine `id`'s custody entries: (from, to, evidence).
    async fn ledger(&self, id: MachineId) -> Vec<(Option<String>, String, Value)> {
        let mut conn = self.store.conn().await.expect("conn");
        let entries = custody::entries(&mut conn, id).await.expect("entries");
        entries.into_iter().map(|e| (e.from, e.to, e.evidence)).collect()
    }

    /// Plays a bound pod's kubelet: creates namespace `ns` and pod `name` on Node `node`, Running.
    async fn pod_on(&self, ns: &str, name: &str, node: &str) {
        let namespace: Namespace = serde_json::from_value(json!({ "metadata": { "name": ns } })).expect("ns");
        Api::<Namespace>::all(self.client.clone()).create(&PostParams::default(), &namespace).await.expect("namespace");
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), ns);
        paddock_testkit::eventually(WAIT, || async { accounts.get_opt("default").await.ok().flatten() }).await;
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": { "nodeName": node, "containers": [{ "name": "main", "image": "registry.k8s.io/pause:3.10" }] },
        }))
        .expect("pod");
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        pods.create(&PostParams::default(), &pod).await.expect("pod");
        let status = json!({ "status": { "phase": "Running", "conditions": [{ "type": "Ready", "status": "True" }] } });
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("pod status");
    }
}

fn uuid_in(v: &Value) -> Uuid {
    Uuid::parse_str(v.as_str().unwrap_or_else(|| panic!("not an id: {v}"))).expect("uuid")
}

fn wait_code(outcome: &Outcome) -> &str {
    match outcome {
        Outcome::Wait { reason, .. } => &reason.code,
        other => panic!("expected a wait, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_release_drains_the_node_and_powers_off_before_the_node_and_lease_are_deleted() {
    let Some(server) = api_server("release-order").await else { return };
    let (b, ids) = Bench::new(server, &["rel-1"]).await;
    let id = ids[0];
    b.allocate(id).await;
    let name = node_name(id);
    let uuid = paddock_sim::system_uuid("rel-1");
    // Provisioned (a fixture): active as its Node, which the kubelet registered with a Lease and
    // runs a pod on; a bootstrap token of the machine is still there.
    sqlx::query("update machines set state = 'active', node_name = $2 where id = $1")
        .bind(id.uuid())
        .bind(&name)
        .execute(b.store.pool())
        .await
        .expect("active");
    register(&b.client, &name, &uuid).await;
    let lease: Lease =
        serde_json::from_value(json!({ "metadata": { "name": name }, "spec": { "holderIdentity": name } }))
            .expect("lease");
    let leases: Api<Lease> = Api::namespaced(b.client.clone(), NODE_LEASE_NAMESPACE);
    leases.create(&PostParams::default(), &lease).await.expect("lease");
    b.pod_on("work", "train-0", &name).await;
    let token: Secret = serde_json::from_value(json!({
        "metadata": { "name": "bootstrap-token-abcdef", "labels": { LABEL_MACHINE_ID: id.to_string() } },
        "type": BOOTSTRAP_TOKEN_TYPE,
        "stringData": { "token-id": "abcdef", "token-secret": "0123456789abcdef" },
    }))
    .expect("token");
    let secrets: Api<Secret> = Api::namespaced(b.client.clone(), BOOTSTRAP_NAMESPACE);
    secrets.create(&PostParams::default(), &token).await.expect("token");

    let m = b.load(id).await;
    let mut tx = b.store.begin().await.expect("begin");
    let key = paddock_testkit::ledger_key();
    assert!(lifecycle::begin_release(&mut tx, &key, id, MachineState::Active, m.status_version)
        .await
        .expect("release"));
    tx.commit().await.expect("commit");
    let bmc = b.recording(&name);
    let r = b.reconciler(bmc.clone());

    // The drain: cordoned, the pod evicted; the machine stays on while the pod is leaving.
    let outcome = b.run(&r, id).await;
    assert_eq!(wait_code(&outcome), "draining_node", "{outcome:?}");
    assert!(bmc.power_offs().is_empty(), "powered off before the drain ended");
    let node = Api::<Node>::all(b.client.clone()).get(&name).await.expect("the Node is still there");
    assert_eq!(node.spec.and_then(|s| s.unschedulable), Some(true), "cordoned");
    let pods: Api<Pod> = Api::namespaced(b.client.clone(), "work");
    let pod = pods.get("train-0").await.expect("terminating, not gone");
    assert!(pod.metadata.deletion_timestamp.is_some(), "evicted");
    assert_eq!(b.load(id).await.state, MachineState::Releasing);

    // The kubelet stops the pod; the next run powers off, then removes the Node, its Lease and
    // the token, and the machine goes on to cleaning.
    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    pods.delete("train-0", &now).await.expect("the kubelet's final delete");
    let deletion = node_deletion(&b.client, &name).await;
    let before = Utc::now();
    b.run(&r, id).await;
    let after = Utc::now();
    // Released into cleaning (which goes on at once: the bench has no wipe image).
    let ledger = b.ledger(id).await;
    let released = ledger.iter().any(|(from, to, _)| from.as_deref() == Some("releasing") && to == "cleaning");
    assert!(released, "not released into cleaning: {ledger:#?}");
    let offs = bmc.power_offs();
    let first = offs.first().expect("powered off");
    assert!(before <= first.at && first.at <= after, "{first:?}");
    assert!(first.node_standing, "the Node was deleted before the power-off: {first:?}");
    assert!(first.lease, "the Lease was deleted before the power-off: {first:?}");
    assert!(first.pods.is_empty(), "powered off with pods on the Node: {first:?}");
    let deleted_at = tokio::time::timeout(WAIT, deletion).await.expect("the Node's deletion seen").expect("watch");
    assert!(first.at < deleted_at, "powered off at {}, the Node deleted at {deleted_at}", first.at);
    assert!(Api::<Node>::all(b.client.clone()).get_opt(&name).await.expect("get").is_none(), "the Node is left");
    assert!(leases.get_opt(&name).await.expect("get").is_none(), "the Lease is left");
    assert!(secrets.get_opt("bootstrap-token-abcdef").await.expect("get").is_none(), "the token is left");
    b.server.delete().await;
}

/// libvirt ties a VM's SMBIOS UUID to its domain, so a VM of the testbed cannot register with
/// another machine's UUID: this runs on the harness, the Node played.
#[tokio::test]
async fn a_node_with_another_machines_uuid_is_deleted_and_fails_the_provisioning_on_both_ledgers() {
    let Some(server) = api_server("uuid-mismatch").await else { return };
    let (b, ids) = Bench::new(server, &["prov-1", "prov-2"]).await;
    let (id, other) = (ids[0], ids[1]);
    b.allocate(id).await;
    let name = node_name(id);
    let (own, foreign) = (paddock_sim::system_uuid("prov-1"), paddock_sim::system_uuid("prov-2"));
    // Provisioning (a fixture): the first boot reported and verified, the machine back on its
    // disk; the report's token used.
    let run = Uuid::new_v4();
    sqlx::query(
        "update machines set state = 'provisioning', run_id = $2, run_purpose = 'provision', \
         run_booted_at = now(), run_finished_at = now() where id = $1",
    )
    .bind(id.uuid())
    .bind(run)
    .execute(b.store.pool())
    .await
    .expect("provisioning");
    sqlx::query(
        "insert into agent_tokens (id, seed_sha256, agent_sha256, nonce, machine_id, run_id, purpose, config_enc, \
           expires_at, used_at, report, verified) \
         values ($1, $2, $3, 'n', $4, $5, 'provision', '\\x00', now() + interval '1 hour', now(), '{}', true)",
    )
    .bind(Uuid::new_v4())
    .bind(Uuid::new_v4().as_bytes().to_vec())
    .bind(Uuid::new_v4().as_bytes().to_vec())
    .bind(id.uuid())
    .bind(run)
    .execute(b.store.pool())
    .await
    .expect("the used token");
    // Another machine's kubelet registers under this machine's node name, Ready.
    register(&b.client, &name, &foreign).await;
    let r = b.reconciler(b.recording(&name));

    b.run(&r, id).await;
    let m = b.load(id).await;
    assert_ne!(m.state, MachineState::Active, "activated on another machine's Node");
    assert!(Api::<Node>::all(b.client.clone()).get_opt(&name).await.expect("get").is_none(), "the Node is left");
    let ledger = b.ledger(id).await;
    let failed = ledger
        .iter()
        .find(|(from, to, _)| from.as_deref() == Some("provisioning") && to == "provision_failed")
        .unwrap_or_else(|| panic!("no provision_failed entry: {ledger:#?}"));
    assert_eq!(failed.2["error"]["code"], "node_uuid_mismatch", "{failed:?}");
    let message = failed.2["error"]["message"].as_str().expect("message");
    assert!(message.contains(&own) && message.contains(&foreign), "{message}");
    let theirs = b.ledger(other).await;
    let (from, to, evidence) = theirs.last().expect("an entry");
    assert_eq!((from.as_deref(), to.as_str()), (Some("available"), "available"), "{theirs:#?}");
    assert_eq!(evidence["code"], "node_uuid_mismatch");
    assert_eq!(evidence["system_uuid"], json!(foreign));
    assert_eq!(evidence["registered_for"], json!(id));
    assert_eq!(b.load(other).await.state, MachineState::Available, "the holder is left as it was");
    b.server.delete().await;
}
