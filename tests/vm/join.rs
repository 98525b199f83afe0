//! A real join, end to end through the API: two node-sized VMs (scripts/vm-start's second count)
//! booted through the BMC emulator install the node OS image (scripts/node-image) onto their boot
//! disks, their kubelets bootstrap with the tokens paddock minted and the CA they verified against
//! the pin, register, and paddock sees the Nodes Ready by the VMs' SMBIOS UUIDs. They are tenant
//! A's Slurm cluster, one VM its `system` pool and one its `compute` pool: Kamaji's add-ons run on
//! them and their pods talk over the tenant network (tests/vm/network.rs); the real slurm-operator
//! runs the tenant's Slurm on them and the tenant uses it (tests/vm/slurm.rs); the compute node
//! rebooted under a running job is marked down by Slurm, shown by paddock and kept by the tenant;
//! the compute pool scaled to zero under a running job drains its Slurm node before its machine is
//! released and wiped; the next tenant's cluster gets that machine, which joins that tenant's API
//! server and finds nothing of the first, while the first cluster's deletion releases and wipes the
//! system machine.
//!
//! Real: the Redfish driver and the BMC emulator, the VMs and their firmware, the installer, the
//! node OS with containerd and the kubelet, the kubelet's TLS bootstrap, kube-proxy and CoreDNS,
//! the slurm-operator, Slurm's daemons and MariaDB (Debian's packages, images/slurm), paddock's
//! Kubernetes drivers (Kamaji backend, tenant nodes, tenant stack) and its Slurm probe against
//! real kube-apiservers. Played: Kamaji and its add-ons' images (tests/vm/node.rs and addons.rs
//! say why); a harness API server stands in for each tenant control plane. The node network is
//! restricted: a guest reaches only its tenant's API server, paddock's agent endpoint (relayed by
//! this test, as a provider's network would lead them) and, over the tenant network, the other
//! machines of its cluster.
//!
//! The tenant base stack is the production one but for what no image can be had for here
//! (tests/vm/stack.rs): Calico and the NVIDIA device plugin are left out, and the nodes keep a
//! bridge CNI baked into their image instead (routed over the tenant network: images/node/rcS).

use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};

use crate::node::{ApiServer, NodeLab};
use crate::testbed::{self, console_tail, fill, not_erased, reset, Answer, BmcOutage, Testbed, Vm};
use crate::{enroll_as, settle};

/// How long one step of a join may take (a provisioning's boot, install, reboot and the node's
/// first start with its image imports; a release and wipe): a bound for a loaded CI machine
/// running two node VMs on two cores, never a measurement (BENCHMARKS.md has those).
pub const JOIN_BOUND: Duration = Duration::from_secs(1800);

/// Waits until `what` finds what it waits for, within [`JOIN_BOUND`]; fails with `why` and `vm`'s
/// console.
pub async fn until<T, A: Answer<T>, F: std::future::Future<Output = A>>(vm: &Vm, why: &str, what: impl Fn() -> F) -> T {
    testbed::until(why, JOIN_BOUND, what, || async { format!("console:\n{}", console_tail(vm, 40)) }).await
}

/// A tenant: (id, token).
async fn tenant(lab: &NodeLab, name: &str) -> (String, String) {
    let created =
        lab.p.app.post("/v1/tenants").token(&paddock_testkit::admin()).json(&json!({ "name": name })).send().await;
    let created = created.expect(201).json();
    let id = created["id"].as_str().expect("tenant id").to_owned();
    let token = paddock_testkit::token(&["tenant:admin"], Some(id.parse().expect("uuid")));
    (id, token)
}

/// A `kubernetes` cluster of `count` `node` machines: (cluster path, node pool path).
async fn cluster(lab: &NodeLab, tenant: &(String, String), name: &str, count: u32) -> (String, String) {
    let pools = json!([{ "name": "nodes", "machine_class": "node", "count": count }]);
    let body = json!({ "name": name, "kind": "kubernetes", "isolation": "private-nodes", "node_pools": pools });
    let clusters = format!("/v1/tenants/{}/clusters", tenant.0);
    let created = lab.p.app.post(&clusters).token(&tenant.1).json(&body).send().await.expect(202).json();
    let id = created["cluster"]["id"].as_str().expect("cluster id");
    let pool = created["cluster"]["node_pools"][0]["id"].as_str().expect("pool id");
    (format!("{clusters}/{id}"), format!("{clusters}/{id}/node-pools/{pool}"))
}

async fn machine(lab: &NodeLab, id: &str) -> Value {
    lab.p.app.get(format!("/v1/machines/{id}")).token(&paddock_testkit::admin()).send().await.expect(200).json()
}

/// The Node of `vm` in `client`'s cluster (by its system UUID) once it is Ready.
pub async fn ready_node(client: &Client, vm: &Vm) -> Option<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.list(&ListParams::default()).await.ok()?.items.into_iter().find(|n| {
        let status = n.status.as_ref();
        let uuid = status.and_then(|s| s.node_info.as_ref()).map(|i| i.system_uuid.to_lowercase());
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        uuid.as_deref() == Some(vm.uuid.to_lowercase().as_str()) && ready
    })
}

/// What of a tenant's join must never be found on the machine once another tenant has it: its
/// CA (DER, and the first line of its PEM body), its bootstrap token's secret, and the first line
/// of the PEM body of every client certificate its csrsigning issued.
async fn secrets_of(server: &ApiServer, client: &Client, disk: &[u8]) -> Vec<(String, Vec<u8>)> {
    let kubeconfig = std::fs::read_to_string(&server.kubeconfig).expect("kubeconfig");
    let ca_b64 = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("certificate-authority-data: "))
        .expect("the CA in the kubeconfig");
    let ca_pem = base64::engine::general_purpose::STANDARD.decode(ca_b64.trim()).expect("base64");
    let mut found = vec![("the CA's PEM".to_owned(), pem_line(&ca_pem))];
    let der_b64: String = String::from_utf8_lossy(&ca_pem).lines().filter(|l| !l.starts_with("-----")).collect();
    found.push(("the CA's DER".to_owned(), base64::engine::general_purpose::STANDARD.decode(der_b64).expect("DER")));
    let token = join_token(disk).expect("the join archive holds the bootstrap token");
    let secret = token.split('.').nth(1).expect("a token's secret").as_bytes().to_vec();
    found.push(("the bootstrap token's secret".to_owned(), secret));
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    for csr in csrs.list(&ListParams::default()).await.expect("CSRs").items {
        if let Some(cert) = csr.status.and_then(|s| s.certificate) {
            found
                .push((format!("the certificate of CSR {}", csr.metadata.name.unwrap_or_default()), pem_line(&cert.0)));
        }
    }
    found
}

/// The first line of a PEM body: 64 base64 characters unique to the certificate.
fn pem_line(pem: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(pem);
    text.lines().find(|l| !l.starts_with("-----")).expect("a PEM body").as_bytes().to_vec()
}

/// The bootstrap token the join archive on `disk` carries (its MBR's partition 2, a ustar
/// archive holding `etc/kubernetes/bootstrap-kubelet.conf`).
fn join_token(disk: &[u8]) -> Option<String> {
    let entry = &disk[446 + 16..446 + 32];
    let start = u32::from_le_bytes(entry[8..12].try_into().ok()?) as usize * 512;
    let archive = &disk[start..start + (1 << 20)];
    let text = String::from_utf8_lossy(archive);
    text.lines().find_map(|l| l.trim().strip_prefix("token: ").map(str::to_owned))
}

/// What the disk holds of `secrets`, by name.
fn found_on(disk: &[u8], secrets: &[(String, Vec<u8>)]) -> Vec<String> {
    secrets.iter().filter(|(_, s)| memchr::memmem::find(disk, s).is_some()).map(|(what, _)| what.clone()).collect()
}

/// Where a provisioning's time went, from the machine's custody ledger, its run and its agent's
/// report: allocation to the run's boot (the BMC inserting the image and powering on), the boot
/// to the installer's start (firmware, kernel, the image's digest), the install (the installer's
/// start to its report: discovery, the OS written and read back, the join archive), and the
/// report to `active` (media ejected, the reboot from disk, containerd, the kubelet's TLS
/// bootstrap and registration, Ready). Read while the machine is `active` (before its next run).
async fn phases(lab: &NodeLab, id: &str) -> String {
    let custody = lab.p.get(&format!("/v1/machines/{id}/custody")).await;
    let items = custody["items"].as_array().expect("items");
    let at = |to: &str| items.iter().rev().find(|e| e["to"] == to).map(|e| e["at"].clone()).expect("entry");
    let (allocated, active) = (at("allocated"), at("active"));
    // The run's tokens are minted as the BMC boots the machine with its seed.
    let (booted, report): (chrono::DateTime<chrono::Utc>, Value) = sqlx::query_as(
        "select created_at, report from agent_tokens where machine_id = $1::uuid and purpose = 'provision' \
         and used_at is not null order by used_at desc limit 1",
    )
    .bind(id)
    .fetch_one(&lab.p.app.db.pool)
    .await
    .expect("the provisioning run's report");
    let booted = json!(booted.to_rfc3339());
    format!(
        "allocation to active {:.1} s: allocation to boot {:.1} s, boot to installer {:.1} s, install {:.1} s, \
         report to Node Ready {:.1} s",
        crate::secs(&allocated, &active),
        crate::secs(&allocated, &booted),
        crate::secs(&booted, &report["started_at"]),
        crate::secs(&report["started_at"], &report["finished_at"]),
        crate::secs(&report["finished_at"], &active),
    )
}

/// The BMC goes away while the installer writes: the VM installs and reports without it, and the
/// machine waits in `provisioning` (booting it from its disk needs the BMC), neither failed nor
/// handed on, until the BMC is back.
async fn bmc_away_during_install(lab: &NodeLab, vm: &Vm, id: &str) {
    // The console file holds the current boot only (libvirt truncates it at each start), and the
    // boot before this one was the wipe's: the line is this install's.
    let installing = || std::fs::read_to_string(&vm.console).is_ok_and(|c| c.contains("paddock-agent: installing"));
    until(vm, "the installer writes the node OS", || async { installing().then_some(()) }).await;
    let outage = BmcOutage::unleased().await;
    let pool = &lab.p.app.db.pool;
    let stopped: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("select now()").fetch_one(pool).await.expect("now");
    until(vm, "the install is reported and paddock finds the BMC gone", || async {
        let (reports, unreachable): (i64, i64) = sqlx::query_as(
            "select (select count(*) from agent_tokens where machine_id = $1::uuid and purpose = 'provision' \
                     and used_at is not null), \
                    (select count(*) from jobs where target_id = $1::uuid \
                     and last_error->>'code' = 'bmc_unreachable' and updated_at > $2)",
        )
        .bind(id)
        .bind(stopped)
        .fetch_one(pool)
        .await
        .expect("reports and BMC failures");
        (reports >= 2 && unreachable > 0).then_some(())
    })
    .await;
    let m = machine(lab, id).await;
    assert_eq!(m["state"], "provisioning", "a machine whose BMC is away waits: {m}");
    drop(outage);
    eprintln!("tenant B: the BMC was away for {:.1} s of the install", (chrono::Utc::now() - stopped).as_seconds_f64());
}

/// Two node-sized VMs join tenant A's Slurm cluster for real, their pods talk over the tenant
/// network (tests/vm/network.rs) and A's people use its Slurm (tests/vm/slurm.rs); the compute
/// pool to zero releases and wipes its VM for real; tenant B's cluster gets that VM, which joins
/// B's API server and finds nothing of A's, while A's cluster is deleted and the system VM wiped
/// (the two at once: each claim is its own, and the test is the CI run's longest).
#[tokio::test(flavor = "multi_thread")]
async fn two_vms_join_one_tenant_talk_are_wiped_and_one_joins_the_next_with_nothing_of_the_first() {
    let Some(bed) = Testbed::from_env() else { return };
    assert!(bed.node_image.is_some(), "scripts/test serves the node OS image (PADDOCK_TEST_NODE_IMAGE)");
    assert!(bed.nodes.len() >= 2, "scripts/test starts two node-sized VMs");
    let vms: Vec<Vm> = bed.nodes[..2].to_vec();
    let Some(lab) = NodeLab::start(&bed).await else { return };
    for vm in &vms {
        reset(vm);
        vm.disks.iter().for_each(fill);
        lab.open_doors(vm.node.expect("a node VM"), &vm.uuid).await;
    }
    // The node-sized VMs' class: one vCPU, 3 GiB (scripts/vm-start's default node memory).
    let class = json!({ "name": "node", "cpu_cores": 1, "memory_gib": 3, "gpu_model": "", "gpu_count": 0 });
    lab.p.app.post("/v1/machine-classes").token(&paddock_testkit::admin()).json(&class).send().await.expect(201);
    let mut ids = Vec::new();
    for vm in &vms {
        ids.push(enroll_as(&lab.p, &bed, vm, false, "node").await);
    }
    for (vm, id) in vms.iter().zip(&ids) {
        let m = settle(&lab.p, vm, id, &["available", "clean_failed", "maintenance"]).await;
        assert_eq!(m["state"], "available", "{m}\nconsole:\n{}", console_tail(vm, 30));
    }
    let a = tenant(&lab, "tenant-a").await;
    let (a_cluster, system, a_secrets) = tenant_a(&lab, &a, &vms, &ids).await;
    // B's cluster is made before A's is deleted, so it gets the compute VM, the one available.
    let b = b_allocated(&lab, &vms, &ids).await;
    assert_ne!(b.which, system, "B gets the VM released first, the compute pool's");
    tokio::join!(delete_a(&lab, &a, &a_cluster, &vms[system], &ids[system]), b_joins(&lab, &vms, &ids, &b, &a_secrets));
    lab.finish().await;
    vms.iter().for_each(reset);
}

/// Tenant A's Slurm cluster: a `system` pool and a `compute` pool of one VM each, from allocation
/// to Ready Nodes, the network between them, its Slurm used (tests/vm/slurm.rs), the compute node
/// rebooted under a job; then the compute pool to zero under a running job (drained first,
/// released and wiped once the job ended) with the accounting kept. Returns the cluster's path,
/// the system VM's index and what of A's join must never be found again.
async fn tenant_a(
    lab: &NodeLab,
    a: &(String, String),
    vms: &[Vm],
    ids: &[String],
) -> (String, usize, Vec<(String, Vec<u8>)>) {
    let t0 = Instant::now();
    let (a_cluster, pools) = slurm_cluster(lab, a, "first").await;
    let a_cluster_id = a_cluster.rsplit('/').next().expect("id").to_owned();
    for (vm, id) in vms.iter().zip(ids) {
        until(vm, "the VM is active in A's cluster", || async {
            let m = machine(lab, id).await;
            assert!(!["provision_failed", "maintenance"].contains(&m["state"].as_str().unwrap_or_default()), "{m}");
            (m["state"] == "active").then_some(())
        })
        .await;
    }
    eprintln!("tenant A: allocation to both Nodes Ready in {:.1} s", t0.elapsed().as_secs_f64());
    let nodes_ready = chrono::Utc::now();
    let a_server = lab.kamaji.tenant(&a_cluster_id).expect("A's API server");
    let a_client = a_server.client().await;
    let (mut nodes, mut a_secrets, mut compute) = (Vec::new(), Vec::new(), None);
    for (i, (vm, id)) in vms.iter().zip(ids).enumerate() {
        eprintln!("tenant A, {}: {}", vm.name, phases(lab, id).await);
        let node = ready_node(&a_client, vm).await.expect("paddock calls it active: its Node is Ready in A's cluster");
        let m = machine(lab, id).await;
        assert_eq!(m["node_name"].as_str(), Some(node.name_any().as_str()), "{m}");
        if m["node_pool_id"].as_str() == Some(pools.compute.as_str()) {
            compute = Some(i);
        }
        nodes.push(node.name_any());
        let disk = std::fs::read(boot_disk(vm)).expect("the boot disk");
        a_secrets.extend(secrets_of(&a_server, &a_client, &disk).await);
    }
    let compute = compute.expect("one VM is the compute pool's");
    let system = 1 - compute;
    // The kubelet's port is forwarded to this host, where an API server can reach it (a request
    // without credentials: the kubelet answers 401, as kubeadm configures it).
    let kubelet = vms[0].node.expect("a node VM").kubelet;
    let insecure = reqwest::Client::builder().danger_accept_invalid_certs(true).build().expect("client");
    let rsp = insecure.get(format!("https://127.0.0.1:{kubelet}/pods")).send().await.expect("the kubelet answers");
    assert_eq!(rsp.status().as_u16(), 401, "the kubelet refuses an anonymous request");
    crate::network::check(&a_client, [&nodes[0], &nodes[1]], vms).await;

    let t1 = Instant::now();
    let c = crate::slurm::ready(lab, a, &a_cluster, &a_client, &vms[system]).await;
    eprintln!(
        "tenant A: Slurm ready {:.1} s after the network checks; phase {}",
        t1.elapsed().as_secs_f64(),
        c["status"]["phase"]
    );
    eprintln!("tenant A, s after both Nodes Ready:{}", crate::slurm::timeline(&a_client, &c, nodes_ready).await);
    assert_eq!(c["status"]["phase"], "ready", "Slurm answering, the cluster is ready: {}", c["status"]);
    let job = crate::slurm::use_it(&a_client, &vms[system], &nodes[compute]).await;
    let login = crate::slurm::pod(&a_client, "login", None).await.expect("the login pod");
    let compute_vm = (&vms[compute], ids[compute].as_str());
    crate::slurm::reboot_under_a_job(lab, (a, &a_cluster), &a_client, &login, compute_vm, &nodes[compute]).await;
    crate::slurm::scale_to_zero_under_a_job(
        lab,
        a,
        &pools.compute_path,
        &a_client,
        &login,
        compute_vm,
        &nodes[compute],
    )
    .await;
    let sacct = format!("sacct -n -X -P -j {job} -o State");
    let kept = crate::slurm::exec(&a_client, &login, "login", &sacct).await.expect("sacct");
    assert_eq!(kept.trim(), "COMPLETED", "the accounting outlives the compute machine");
    assert_erased(&vms[compute]);
    (a_cluster, system, a_secrets)
}

/// Every byte of every disk of `vm` is zero (read after its wipe, before anyone has it again).
fn assert_erased(vm: &Vm) {
    for d in &vm.disks {
        assert_eq!(not_erased(&d.path), None, "every byte of {} of {} is zero after the wipe", d.name, vm.name);
    }
}

/// A's cluster deleted: its system VM (`vm`, machine `id`) released and wiped, A's control plane
/// gone.
async fn delete_a(lab: &NodeLab, a: &(String, String), a_cluster: &str, vm: &Vm, id: &str) {
    let t = Instant::now();
    lab.p.app.delete(a_cluster).token(&a.1).send().await.expect(202);
    until(vm, "the system VM is released and wiped", || async {
        let m = machine(lab, id).await;
        let state = m["state"].as_str().unwrap_or_default();
        assert!(!["clean_failed", "maintenance"].contains(&state), "{m}\nconsole:\n{}", console_tail(vm, 30));
        (state == "available").then_some(()).ok_or_else(|| format!("{m}"))
    })
    .await;
    assert_erased(vm);
    eprintln!("tenant A: cluster deletion to the system VM wiped in {:.1} s", t.elapsed().as_secs_f64());
}

/// Tenant A's pools.
struct Pools {
    compute: String,
    compute_path: String,
}

/// A `slurm` cluster of a `system` pool and a `compute` pool of one `node` machine each: (cluster
/// path, pools).
async fn slurm_cluster(lab: &NodeLab, tenant: &(String, String), name: &str) -> (String, Pools) {
    let pools = json!([
        { "name": "sys", "machine_class": "node", "count": 1, "role": "system" },
        { "name": "compute", "machine_class": "node", "count": 1 },
    ]);
    let body = json!({ "name": name, "kind": "slurm", "isolation": "private-nodes", "node_pools": pools });
    let clusters = format!("/v1/tenants/{}/clusters", tenant.0);
    let created = lab.p.app.post(&clusters).token(&tenant.1).json(&body).send().await.expect(202).json();
    let id = created["cluster"]["id"].as_str().expect("cluster id");
    let all = created["cluster"]["node_pools"].as_array().expect("pools");
    let compute = all.iter().find(|p| p["name"] == "compute").and_then(|p| p["id"].as_str()).expect("compute");
    let compute_path = format!("{clusters}/{id}/node-pools/{compute}");
    (format!("{clusters}/{id}"), Pools { compute: compute.to_owned(), compute_path })
}

/// A's cluster holds no Node, Lease or certificate signing request of `node` once its machine is
/// released.
pub async fn assert_nothing_left(a_client: &Client, node: &str) {
    let api: Api<Node> = Api::all(a_client.clone());
    let held: Vec<String> =
        api.list(&ListParams::default()).await.expect("nodes").items.iter().map(|n| n.name_any()).collect();
    assert!(!held.iter().any(|n| n == node), "A's cluster holds no Node {node}: {held:?}");
    let leases: Api<Lease> = Api::namespaced(a_client.clone(), "kube-node-lease");
    let leases: Vec<String> =
        leases.list(&ListParams::default()).await.expect("leases").items.iter().map(|l| l.name_any()).collect();
    assert!(!leases.iter().any(|l| l == node), "A's cluster holds no Lease of {node}: {leases:?}");
    let csrs: Api<CertificateSigningRequest> = Api::all(a_client.clone());
    let subject = format!("system:node:{node}");
    let held: Vec<String> = csrs
        .list(&ListParams::default())
        .await
        .expect("CSRs")
        .items
        .iter()
        .filter(|c| paddock_kube::csr::requests_for(c, &subject))
        .map(|c| c.name_any())
        .collect();
    assert!(held.is_empty(), "A's cluster holds no CSR of {node}: {held:?}");
}

/// Tenant B's one-machine cluster, and which of the VMs it was given.
struct TenantB {
    cluster_id: String,
    which: usize,
    since: Instant,
}

/// Tenant B's cluster, once one of the VMs is allocated to it.
async fn b_allocated(lab: &NodeLab, vms: &[Vm], ids: &[String]) -> TenantB {
    let b = tenant(lab, "tenant-b").await;
    let since = Instant::now();
    let (b_cluster, _) = cluster(lab, &b, "second", 1).await;
    let cluster_id = b_cluster.rsplit('/').next().expect("id").to_owned();
    let which = until(&vms[0], "one VM is allocated to B's cluster", || async {
        for (i, id) in ids.iter().enumerate() {
            if machine(lab, id).await["cluster_id"].as_str() == Some(cluster_id.as_str()) {
                return Some(i);
            }
        }
        None
    })
    .await;
    TenantB { cluster_id, which, since }
}

/// B's VM installs (the BMC away meanwhile) and joins B's API server, with nothing of A's on its
/// disk.
async fn b_joins(lab: &NodeLab, vms: &[Vm], ids: &[String], b: &TenantB, a_secrets: &[(String, Vec<u8>)]) {
    let (vm, id) = (&vms[b.which], &ids[b.which]);
    bmc_away_during_install(lab, vm, id).await;
    until(vm, "the VM is active in B's cluster", || async {
        let m = machine(lab, id).await;
        assert!(!["provision_failed", "maintenance"].contains(&m["state"].as_str().unwrap_or_default()), "{m}");
        let joined = m["state"] == "active" && m["cluster_id"].as_str() == Some(b.cluster_id.as_str());
        joined.then_some(()).ok_or_else(|| format!("{m}"))
    })
    .await;
    let took = b.since.elapsed().as_secs_f64();
    eprintln!("tenant B: allocation to Node Ready in {took:.1} s ({})", phases(lab, id).await);
    let b_client = lab.kamaji.tenant(&b.cluster_id).expect("B's API server").client().await;
    assert!(ready_node(&b_client, vm).await.is_some(), "the VM's Node is Ready in B's cluster");
    let disk = std::fs::read(boot_disk(vm)).expect("the boot disk");
    assert_eq!(found_on(&disk, a_secrets), Vec::<String>::new(), "nothing of A's join is on the VM's disk");
    assert!(join_token(&disk).is_some_and(|t| !a_secrets.iter().any(|(_, s)| t.as_bytes().ends_with(s))));
}

fn boot_disk(vm: &Vm) -> std::path::PathBuf {
    vm.disks.iter().find(|d| d.name == "sda").expect("the boot disk").path.clone()
}

/// BENCHMARKS.md: allocation to Node Ready for one node VM, then for two at once on the same
/// cores (target: two in at most 1.5 times the time of one). Needs `scripts/vm-start N 2`;
/// run by hand: `cargo test --test vm -- --ignored bench_node_vms_join --nocapture`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: two node-sized VMs (scripts/vm-start N 2), run by hand"]
async fn bench_node_vms_join_one_then_two_at_once() {
    let Some(bed) = Testbed::from_env() else { return };
    assert!(bed.nodes.len() >= 2, "scripts/vm-start N 2 starts two node-sized VMs");
    let Some(lab) = NodeLab::start(&bed).await else { return };
    let class = json!({ "name": "node", "cpu_cores": 1, "memory_gib": 3, "gpu_model": "", "gpu_count": 0 });
    lab.p.app.post("/v1/machine-classes").token(&paddock_testkit::admin()).json(&class).send().await.expect(201);
    let vms = &bed.nodes[..2];
    let mut ids = Vec::new();
    for vm in vms {
        reset(vm);
        lab.open_doors(vm.node.expect("a node VM"), &vm.uuid).await;
        ids.push(enroll_as(&lab.p, &bed, vm, false, "node").await);
    }
    for (vm, id) in vms.iter().zip(&ids) {
        assert_eq!(settle(&lab.p, vm, id, &["available", "clean_failed", "maintenance"]).await["state"], "available");
    }
    let t = tenant(&lab, "bench").await;
    let all_active = |n: usize| {
        let (lab, ids) = (&lab, &ids);
        move || async move {
            let mut active = 0;
            for id in ids {
                let m = machine(lab, id).await;
                assert!(!["provision_failed", "maintenance"].contains(&m["state"].as_str().unwrap_or_default()), "{m}");
                active += usize::from(m["state"] == "active");
            }
            (active == n).then_some(())
        }
    };
    let t0 = Instant::now();
    let (_, pool) = cluster(&lab, &t, "one", 1).await;
    until(&vms[0], "one VM active", all_active(1)).await;
    let one = t0.elapsed().as_secs_f64();
    for id in &ids {
        if machine(&lab, id).await["state"] == "active" {
            eprintln!("one VM: {one:.1} s ({})", phases(&lab, id).await);
        }
    }
    lab.p.app.patch(&pool).token(&t.1).json(&json!({ "count": 0 })).send().await.expect(202);
    until(&vms[0], "both VMs available", || async {
        let mut states = Vec::new();
        for id in &ids {
            states.push(machine(&lab, id).await["state"].clone());
        }
        states.iter().all(|s| s == "available").then_some(())
    })
    .await;
    let t1 = Instant::now();
    lab.p.app.patch(&pool).token(&t.1).json(&json!({ "count": 2 })).send().await.expect(202);
    until(&vms[0], "both VMs active", all_active(2)).await;
    let two = t1.elapsed().as_secs_f64();
    for id in &ids {
        eprintln!("two at once, {id}: {}", phases(&lab, id).await);
    }
    eprintln!("node VMs to Node Ready: one {one:.1} s, two at once {two:.1} s, ratio {:.2}", two / one);
    lab.finish().await;
    vms.iter().for_each(reset);
}
