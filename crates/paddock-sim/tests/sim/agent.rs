//! The simulated agent against the real API on a port: it fetches the run's configuration and
//! reports like a machine, and paddock verifies (or refuses) the report.

use std::time::Duration;

use paddock_api::{ApiConfig, AppState};
use paddock_auth::{Secret, Verifier, VerifierConfig};
use paddock_domain::bmc::{AfterBoot, BootMedia};
use paddock_domain::driver::{ControlPlaneSpec, ServiceType};
use paddock_domain::secret::SecretString;
use paddock_service::agent::AgentRun;
use paddock_service::Services;
use paddock_sim::{system_uuid, MachineFault, SimConfig, SimWorld};
use paddock_store::Store;
use paddock_testkit::{admin, eventually, TestApp, TEST_SECRET};
use paddock_types::agent::{AgentPurpose, AgentRunConfig};
use paddock_types::MachineId;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::{access, cluster, node_of, tenant, world_on};

/// The real API served on a port, its services, and a sim world over its database.
struct Harness {
    app: TestApp,
    services: Services,
    world: SimWorld,
}

impl Harness {
    async fn new() -> Harness {
        let app = TestApp::new().await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        // The app's services, told where machines reach the agent endpoints and BMCs the seeds.
        let services =
            Services::new(Store::from_pool(app.db.pool.clone()), app.cipher.clone(), paddock_testkit::ledger_key())
                .with_agent_base_url(&base);
        let verifier = Verifier::new(VerifierConfig {
            hs256_secret: Some(Secret::new(TEST_SECRET.to_vec())),
            ..VerifierConfig::default()
        })
        .await
        .expect("verifier");
        let router = paddock_api::router(AppState::new(services.clone(), verifier, ApiConfig::default()));
        tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
        let world = world_on(&app.db, SimConfig::zero());
        Harness { app, services, world }
    }

    /// Enrolls `sim://<name>` through the API; returns its id.
    async fn enroll(&self, name: &str) -> MachineId {
        self.app
            .post("/v1/machine-classes")
            .token(&admin())
            .json(&json!({"name": format!("class-{name}"), "cpu_cores": 64, "memory_gib": 512, "gpu_count": 0}))
            .send()
            .await
            .expect(201);
        let body = self
            .app
            .post("/v1/machines")
            .token(&admin())
            .json(&json!({
                "name": name,
                "machine_class": format!("class-{name}"),
                "bmc": {"url": format!("sim://{name}"), "username": "admin", "password": "pw"},
            }))
            .send()
            .await
            .expect(202)
            .json();
        MachineId(Uuid::parse_str(body["machine"]["id"].as_str().expect("id")).expect("uuid"))
    }

    /// Issues a run's tokens and boots the sim machine with its seed, as the worker does; returns
    /// the seed token.
    async fn boot(&self, name: &str, machine: MachineId, purpose: AgentPurpose, config: Value) -> SecretString {
        let config = match purpose {
            AgentPurpose::Wipe => AgentRunConfig::Wipe(serde_json::from_value(config).expect("a wipe's config")),
            AgentPurpose::Provision => {
                AgentRunConfig::Provision(serde_json::from_value(config).expect("a provisioning boot's config"))
            }
            AgentPurpose::Acceptance => {
                AgentRunConfig::Acceptance(serde_json::from_value(config).expect("an acceptance's config"))
            }
        };
        let run = AgentRun { machine_id: machine, run_id: Uuid::now_v7(), config };
        let token = self.services.agent_token_issue(&run, Duration::from_secs(600)).await.expect("token");
        self.boot_with(name, &token).await;
        token
    }

    async fn boot_with(&self, name: &str, seed_token: &SecretString) {
        let media = BootMedia {
            image_url: "https://images.example/wipe.iso".to_owned(),
            seed_url: self.services.agent_seed_url(seed_token),
        };
        let a = access(name, Some(system_uuid(name)));
        self.world.bmc().boot_from_media(&a, &media).await.expect("boot from media");
    }

    /// `(used, verified, report)` of the machine's latest token.
    async fn token_row(&self, machine: MachineId) -> (bool, Option<bool>, Option<Value>) {
        sqlx::query_as(
            "select used_at is not null, verified, report from agent_tokens where machine_id = $1
             order by created_at desc limit 1",
        )
        .bind(machine.uuid())
        .fetch_one(&self.app.db.pool)
        .await
        .expect("token row")
    }
}

impl Harness {
    /// A wipe run's configuration as the worker writes it: the drives as the machine's BMC
    /// reports them (the evidence of the report is checked against them).
    async fn wipe_config(&self, name: &str) -> Value {
        let inventory =
            self.world.bmc().inspect(&access(name, Some(system_uuid(name)))).await.expect("the sim BMC's inventory");
        let drives: Vec<Value> = inventory
            .drives
            .unwrap_or_default()
            .iter()
            .map(|d| json!({ "id": d.id, "serial": d.serial, "capacity_bytes": d.capacity_bytes, "protocol": d.protocol }))
            .collect();
        json!({ "drives": drives })
    }
}

#[tokio::test]
async fn a_wipe_is_reported_once_and_verified() {
    let h = Harness::new().await;
    let machine = h.enroll("w1").await;
    let agent = h.world.agent(reqwest::Client::new());
    assert_eq!(agent.tick().await.expect("tick"), 0, "nothing booted yet");
    h.boot("w1", machine, AgentPurpose::Wipe, h.wipe_config("w1").await).await;

    assert_eq!(agent.tick().await.expect("tick"), 1);
    let (used, verified, report) = h.token_row(machine).await;
    assert!(used);
    assert_eq!(verified, Some(true));
    let report = report.expect("report");
    assert_eq!(report["result"], "success");
    let drives = report["drives"].as_array().expect("drives");
    assert_eq!(drives.len(), 2);
    // NVMe drives, as the BMC lists them: the strongest method NVMe allows.
    assert!(drives.iter().all(|d| d["method"] == "nvme-sanitize-crypto" && d["result"] == "success"), "{report}");
    assert!(drives.iter().all(|d| d["match_basis"] == "serial"), "unique serials match by serial: {report}");
    assert!(drives.iter().all(|d| d["verification"]["ranges"] == 66), "complete evidence: {report}");
    assert_eq!(report["image_sha256"], paddock_domain::agent::SIMULATED_WIPE_IMAGE_SHA256);
    // Reported once: a second pass has nothing to do.
    assert_eq!(agent.tick().await.expect("tick"), 0);
    let m = h.world.machine("w1").await.expect("read").expect("exists");
    assert_eq!(m.reported_seq, m.boot_seq);

    // Rebooting with the used seed: the API answers 409 and the agent gives up on that boot.
    h.boot_with("w1", &seed_token(&h, "w1").await).await;
    assert_eq!(agent.tick().await.expect("tick"), 1);
    assert_eq!(agent.tick().await.expect("tick"), 0);
}

/// The seed token of the machine's latest boot, read back from the sim world (where the BMC
/// keeps the seed URL, token and all).
async fn seed_token(h: &Harness, name: &str) -> SecretString {
    let seed: String = sqlx::query_scalar("select seed_url from paddock_sim.machines where name = $1")
        .bind(name)
        .fetch_one(&h.app.db.pool)
        .await
        .expect("seed");
    let file = seed.rsplit('/').next().expect("file");
    SecretString::new(file.strip_suffix(".iso").expect("a seed URL").to_owned())
}

#[tokio::test]
async fn a_failing_drive_fails_the_wipe() {
    let h = Harness::new().await;
    let machine = h.enroll("w2").await;
    h.world.set_machine_fault("w2", MachineFault::WipeFails, true).await.expect("fault");
    h.boot("w2", machine, AgentPurpose::Wipe, json!({"drives": [{"id": "disk0"}, {"id": "disk1"}, {"id": "nvme9"}]}))
        .await;
    assert_eq!(h.world.agent(reqwest::Client::new()).tick().await.expect("tick"), 1);
    let (used, verified, report) = h.token_row(machine).await;
    assert!(used);
    assert_eq!(verified, Some(false));
    let report = report.expect("report");
    assert_eq!(report["result"], "failure");
    let results: Vec<&str> =
        report["drives"].as_array().expect("drives").iter().map(|d| d["result"].as_str().expect("result")).collect();
    assert_eq!(results, ["failure", "success", "failure"], "{report}");
}

#[tokio::test]
async fn a_machine_that_never_reports_keeps_its_token() {
    let h = Harness::new().await;
    let machine = h.enroll("w3").await;
    h.world.set_machine_fault("w3", MachineFault::NeverReports, true).await.expect("fault");
    h.boot("w3", machine, AgentPurpose::Wipe, h.wipe_config("w3").await).await;
    let agent = h.world.agent(reqwest::Client::new());
    assert_eq!(agent.tick().await.expect("tick"), 0);
    assert!(!h.token_row(machine).await.0);
    // Healed, it reports that same boot.
    h.world.set_machine_fault("w3", MachineFault::NeverReports, false).await.expect("heal");
    assert_eq!(agent.tick().await.expect("tick"), 1);
    assert_eq!(h.token_row(machine).await.1, Some(true));
}

#[tokio::test]
async fn an_unreachable_api_is_retried() {
    let h = Harness::new().await;
    let machine = h.enroll("w4").await;
    // A seed pointing at a closed port: the boot stays due.
    let config = h.wipe_config("w4").await;
    let config = AgentRunConfig::Wipe(serde_json::from_value(config).expect("a wipe's config"));
    let run = AgentRun { machine_id: machine, run_id: Uuid::now_v7(), config };
    let token = h.services.agent_token_issue(&run, Duration::from_secs(600)).await.expect("token");
    let media = BootMedia {
        image_url: "https://images.example/wipe.iso".to_owned(),
        seed_url: SecretString::new(format!("http://127.0.0.1:9/v1/agent/seed/{}.iso", token.expose())),
    };
    h.world.bmc().boot_from_media(&access("w4", Some(system_uuid("w4"))), &media).await.expect("boot");
    let agent = h.world.agent(reqwest::Client::new());
    assert_eq!(agent.tick().await.expect("tick"), 0);
    let m = h.world.machine("w4").await.expect("read").expect("exists");
    assert!(m.reported_seq < m.boot_seq, "still due: {m:?}");
}

#[tokio::test]
async fn a_provisioned_machine_joins_its_cluster() {
    let h = Harness::new().await;
    let machine = h.enroll("p1").await;
    let kube = h.world.kube();
    let c = cluster();
    let t = tenant(&c);
    kube.platform.ensure_isolation(&c).await.expect("isolation");
    let spec = ControlPlaneSpec {
        cluster: c.clone(),
        kubernetes_version: "v1.34.1".to_owned(),
        replicas: 1,
        service_type: ServiceType::NodePort,
        datastore: None,
    };
    kube.control_plane.ensure_control_plane(&spec).await.expect("control plane");
    let n = node_of("p1");
    let join = kube.nodes.join_config(&t, &n, 600).await.expect("join config");
    // The simulated machine finds the driver's join configuration under `join`.
    let j = &join.0;
    let config = json!({
        "node_name": n.node_name, "api_endpoint": j["api_endpoint"], "ca_cert": j["ca_cert"],
        "ca_cert_hash": j["ca_cert_hash"], "bootstrap_token": j["bootstrap_token"],
        "os_image_sha256": "0".repeat(64), "join": j,
    });
    h.boot("p1", machine, AgentPurpose::Provision, config).await;

    // The agent as the worker runs it: a long-running task with a shutdown signal.
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(h.world.agent(reqwest::Client::new()).run(shutdown));
    let verified = eventually(Duration::from_secs(10), || async {
        let (used, verified, _) = h.token_row(machine).await;
        used.then_some(verified)
    })
    .await;
    assert_eq!(verified, Some(true));
    stop.send(true).expect("stop");
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("the agent stops").expect("no panic");

    // Installed, not yet booted from disk: no Node. Then the worker ends the boot.
    assert_eq!(kube.nodes.node(&t, &n).await.expect("node"), None);
    let a = access("p1", Some(system_uuid("p1")));
    h.world.bmc().finish_boot(&a, AfterBoot::BootFromDisk).await.expect("boot from disk");
    let status = kube.nodes.node(&t, &n).await.expect("node").expect("registered");
    assert!(status.ready && status.name == "m-p1", "{status:?}");
    let nodes = h.world.nodes(c.cluster_id).await.expect("nodes");
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].system_uuid, system_uuid("p1"));
}

#[tokio::test]
async fn two_agents_never_report_one_boot_twice() {
    let h = Harness::new().await;
    let mut machines = Vec::new();
    for i in 0..4 {
        let name = format!("r{i}");
        let id = h.enroll(&name).await;
        let config = h.wipe_config(&name).await;
        h.boot(&name, id, AgentPurpose::Wipe, config).await;
        machines.push(id);
    }
    let one = h.world.agent(reqwest::Client::new());
    let two = world_on(&h.app.db, SimConfig::zero()).agent(reqwest::Client::new());
    let (a, b) = tokio::join!(one.tick(), two.tick());
    assert_eq!(a.expect("one") + b.expect("two"), 4);
    for id in machines {
        assert_eq!(h.token_row(id).await.1, Some(true));
    }
    let audited: i64 = sqlx::query_scalar("select count(*) from audit_events where action = 'agent.report'")
        .fetch_one(&h.app.db.pool)
        .await
        .expect("count");
    assert_eq!(audited, 4, "one report per boot");
}

#[tokio::test]
async fn a_boot_is_not_reported_before_its_latency() {
    let (db, _) = crate::world().await;
    let slow = world_on(&db, SimConfig { boot_latency: Duration::from_secs(3600), ..SimConfig::zero() });
    let media = BootMedia {
        image_url: "https://images.example/wipe.iso".to_owned(),
        seed_url: SecretString::new("http://127.0.0.1:9/v1/agent/seed/t.iso".to_owned()),
    };
    slow.bmc().boot_from_media(&access("s1", Some(system_uuid("s1"))), &media).await.expect("boot");
    assert_eq!(slow.agent(reqwest::Client::new()).tick().await.expect("tick"), 0);
    let m = slow.machine("s1").await.expect("read").expect("exists");
    assert!(m.reported_seq < m.boot_seq, "still booting: {m:?}");
}
