//! The installer (a provisioning boot's purpose) against loop devices standing in for the
//! machine's disks, a node OS ISO built here with xorriso (a fake `node/disk.img` with a real MBR
//! of the contract's layout), and a real tenant API server of the kube-harness (with the
//! `bootstrapsigner` controller, which signs `cluster-info` for bootstrap tokens), with a bootstrap
//! token paddock minted (`KubeTenantNodes::join_config`), as the worker passes it on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use paddock_agent::device::Roots;
use paddock_agent::install::{self, Failure, Target};
use paddock_agent::{iso, joinfs, mbr};
use paddock_domain::driver::{ClusterRef, NodeRef, TenantAccess};
use paddock_domain::secret::SecretString;
use paddock_kube::KubeTenantNodes;
use paddock_testkit::skip;
use paddock_types::agent::ProvisionConfig;
use paddock_types::cluster::{Taint, TaintEffect};
use paddock_types::{ClusterId, MachineId, NodePoolId, TenantId};

use crate::harness::{pattern, sha256_hex, Loop};

const MIB: usize = 1 << 20;

/// A 4 MiB disk.img: an MBR of the contract's layout, scaled down (partition 1 FAT32 LBA and
/// bootable at 1 MiB, partition 2 the 1 MiB join archive (type 0xda) at 2 MiB, partition 3 Linux at
/// 3 MiB), a pattern everywhere but the zero partition 2.
fn disk_img() -> Vec<u8> {
    let mut img = pattern(4 * MIB, 41);
    img[2 * MIB..3 * MIB].fill(0);
    let mut mbr = [0u8; 512];
    for (i, (kind, start)) in [(0x0cu8, 2048u32), (0xda, 4096), (0x83, 6144)].into_iter().enumerate() {
        let entry = &mut mbr[446 + 16 * i..462 + 16 * i];
        entry[0] = if i == 0 { 0x80 } else { 0 };
        entry[4] = kind;
        entry[8..12].copy_from_slice(&start.to_le_bytes());
        entry[12..16].copy_from_slice(&2048u32.to_le_bytes());
    }
    mbr[510..].copy_from_slice(&[0x55, 0xaa]);
    img[..512].copy_from_slice(&mbr);
    img
}

/// The node OS ISO (`xorriso -as mkisofs -iso-level 3 -V PADDOCK_NODE`) holding `node/disk.img`
/// and `node/manifest.txt`, in `dir`.
fn node_iso(dir: &Path, disk_img: &[u8]) -> PathBuf {
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("node")).expect("payload dir");
    std::fs::write(root.join("node/disk.img"), disk_img).expect("disk.img");
    std::fs::write(root.join("node/manifest.txt"), "disk.img test\n").expect("manifest");
    let iso = dir.join("node.iso");
    let out = Command::new("xorriso")
        .args(["-as", "mkisofs", "-iso-level", "3", "-J", "-V", "PADDOCK_NODE", "-o"])
        .arg(&iso)
        .arg(&root)
        .output()
        .expect("running xorriso");
    assert!(out.status.success(), "xorriso: {}", String::from_utf8_lossy(&out.stderr));
    iso
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("paddock-install-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A tenant API server of the kube-harness with the bootstrapsigner; `None` (skipped) without
/// the harness.
async fn api_server(name: &str) -> Option<(String, String, String)> {
    let control = skip::env("PADDOCK_TEST_KUBE_CONTROL", "the installer's discovery needs a tenant API server")?;
    let name = format!("{name}-{}", std::process::id());
    let body = serde_json::json!({ "name": name, "crds": [], "controllers": ["bootstrapsigner"] });
    let http = reqwest::Client::builder().timeout(Duration::from_secs(180)).build().expect("client");
    let rsp = http.post(format!("{}/apiservers", control.trim_end_matches('/'))).json(&body).send().await;
    let rsp = rsp.expect("POST /apiservers");
    assert_eq!(rsp.status().as_u16(), 201, "creating API server {name}");
    let info: serde_json::Value = rsp.json().await.expect("API server info");
    let url = info["url"].as_str().expect("url").to_owned();
    let kubeconfig = std::fs::read_to_string(info["kubeconfig"].as_str().expect("kubeconfig")).expect("kubeconfig");
    Some((url, kubeconfig, format!("{}/apiservers/{name}", control.trim_end_matches('/'))))
}

/// The provisioning boot's configuration the worker would build from paddock's join
/// configuration for a node of pool `gpu` (a fresh bootstrap token in the API server).
async fn provision_config(url: &str, kubeconfig: &str, os_image_sha256: String) -> ProvisionConfig {
    let cluster = ClusterRef {
        tenant_id: TenantId::new(),
        cluster_id: ClusterId::new(),
        tenant_name: "acme".into(),
        cluster_name: "train".into(),
    };
    let endpoint = url.trim_start_matches("https://").to_owned();
    let access = TenantAccess { cluster, endpoint, admin_kubeconfig: SecretString::new(kubeconfig.to_owned()) };
    let machine_id = MachineId::new();
    let taint = Taint { key: "example.com/gpu".into(), value: "true".into(), effect: TaintEffect::NoSchedule };
    let node = NodeRef {
        machine_id,
        node_pool_id: NodePoolId::new(),
        pool_name: "gpu".into(),
        node_name: paddock_domain::driver::node_name(machine_id),
        system_uuid: uuid::Uuid::new_v4().to_string(),
        labels: BTreeMap::new(),
        taints: vec![taint],
    };
    let join = KubeTenantNodes::new().join_config(&access, &node, 3600).await.expect("join config").0;
    let text = |k: &str| join[k].as_str().unwrap_or_else(|| panic!("{k} in the join configuration")).to_owned();
    ProvisionConfig {
        node_name: node.node_name.clone(),
        api_endpoint: format!("https://{}", text("api_endpoint")),
        ca_cert: text("ca_cert"),
        ca_cert_hash: text("ca_cert_hash"),
        bootstrap_token: text("bootstrap_token"),
        node_taints: node.taints.clone(),
        os_image_sha256,
        join,
    }
}

/// Runs the installer (off the runtime: it blocks) with `iso` as the boot medium and `disks`.
async fn install(iso: &Path, disks: &[&Loop], image_sha256: String, config: &ProvisionConfig) -> Result<(), Failure> {
    let (iso, config) = (iso.to_owned(), config.clone());
    let named: Vec<PathBuf> = disks.iter().map(|d| d.dev.clone()).collect();
    tokio::task::spawn_blocking(move || {
        let roots = Roots::default();
        let target = Target { roots: &roots, named: &named, medium: Ok(&iso) };
        install::install(&target, &image_sha256, &config)
    })
    .await
    .expect("the installer's thread")
}

/// Reads the join archive's member `name` (a ustar archive: 512-byte headers, data padded).
fn member(archive: &[u8], name: &str) -> Option<Vec<u8>> {
    let mut at = 0;
    while at + 512 <= archive.len() && archive[at] != 0 {
        let header = &archive[at..at + 512];
        let end = header[..100].iter().position(|&b| b == 0).unwrap_or(100);
        let size = u64::from_str_radix(std::str::from_utf8(&header[124..135]).expect("size"), 8).expect("octal");
        let size = usize::try_from(size).expect("size");
        if &header[..end] == name.as_bytes() {
            return Some(archive[at + 512..at + 512 + size].to_vec());
        }
        at += 512 + size.next_multiple_of(512);
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_installer_writes_the_image_and_the_join_archive_only_after_discovery_matched_the_pin() {
    let Some((url, kubeconfig, server)) = api_server("installer").await else { return };
    let dir = temp_dir("ok");
    let img = disk_img();
    let iso = node_iso(&dir, &img);
    let digest = paddock_agent::device::image_sha256(&iso).expect("the ISO's digest");
    assert_eq!(
        digest,
        sha256_hex(&std::fs::read(&iso).expect("iso")),
        "the digest is the ISO file's (images/wipe/build prints that one)"
    );
    let mut f = std::fs::File::open(&iso).expect("iso");
    let extent = iso::find(&mut f, install::DISK_IMG).expect("read").expect("disk.img on the ISO");
    assert_eq!(extent.len as usize, img.len());
    let config = provision_config(&url, &kubeconfig, digest.clone()).await;

    // A wrong pin: refused after discovery, before any byte is written.
    let target = Loop::random(8 * MIB, 42);
    let before = target.contents();
    let wrong = ProvisionConfig { ca_cert_hash: format!("sha256:{}", "ab".repeat(32)), ..config.clone() };
    let refused = install(&iso, &[&target], digest.clone(), &wrong).await.expect_err("a wrong pin");
    assert_eq!(refused.code, "ca_pin_mismatch", "{refused:?}");
    assert!(target.contents() == before, "no byte written after a pin mismatch");

    // Another image digest: refused before anything else.
    let other = ProvisionConfig { os_image_sha256: "0".repeat(64), ..config.clone() };
    let refused = install(&iso, &[&target], digest.clone(), &other).await.expect_err("another image");
    assert_eq!(refused.code, "os_image_digest_mismatch", "{refused:?}");
    assert!(target.contents() == before, "no byte written after a digest mismatch");

    // No disk big enough: refused before writing.
    let small = Loop::random(2 * MIB, 43);
    let refused = install(&iso, &[&small], digest.clone(), &config).await.expect_err("too small");
    assert_eq!(refused.code, "no_target_disk", "{refused:?}");

    // The right pin: disk.img on the target, the join archive at partition 2.
    install(&iso, &[&target], digest, &config).await.expect("installed");
    let written = target.contents();
    let p2 = mbr::partition(&written, 2).expect("partition 2");
    assert_eq!((p2.kind, p2.offset, p2.len), (mbr::JOIN_ARCHIVE_TYPE, 2 * MIB as u64, MIB as u64));
    let (p2_start, p2_end) = (p2.offset as usize, (p2.offset + p2.len) as usize);
    assert!(written[..p2_start] == img[..p2_start], "disk.img before partition 2, byte for byte");
    assert!(written[p2_end..img.len()] == img[p2_end..], "disk.img after partition 2, byte for byte");
    assert!(written[img.len()..] == before[img.len()..], "nothing past disk.img");
    let archive = &written[p2_start..p2_end];
    let ca = String::from_utf8(member(archive, joinfs::CA_CRT).expect("ca.crt")).expect("PEM");
    assert_eq!(ca.trim(), config.ca_cert.trim(), "the CA discovery found is the tenant's");
    let kubelet = String::from_utf8(member(archive, joinfs::BOOTSTRAP_KUBECONFIG).expect("kubeconfig")).expect("text");
    assert!(kubelet.contains(&format!("server: \"{}\"", config.api_endpoint)), "{kubelet}");
    assert!(kubelet.contains(&format!("token: \"{}\"", config.bootstrap_token)), "the bootstrap token");
    let env = String::from_utf8(member(archive, joinfs::NODE_ENV).expect("node.env")).expect("text");
    assert_eq!(env, format!("NODE_NAME='{}'\nNODE_TAINTS='example.com/gpu=true:NoSchedule'\n", config.node_name));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = reqwest::Client::new().delete(server).send().await;
}
