//! Discovery, the seed and the image digest on a fake host: a sysfs and a /dev of plain files laid
//! out as the kernel lays them out, with a tenant's disk that carries a planted `cidata` seed
//! (its own `paddock/agent.json`) and a `PADDOCK_WIPE`-labelled volume. What a disk holds never
//! decides anything: the disk is wiped, the seed is the one on the virtual media, the image is
//! the CD's.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use paddock_agent::device::{self, Action, Kind, Roots};
use paddock_agent::seed;
use serde_json::json;

use crate::harness::{pattern, sha256_hex};

const MIB: usize = 1 << 20;
const CD: &str = "pci0000:00/0000:00:01.1/ata1/host0/target0:0:0/0:0:0:0";
const FLOPPY: &str = "platform/floppy.0";
const USB: &str = "pci0000:00/0000:00:14.0/usb1/1-1/1-1:1.0/host2/target2:0:0/2:0:0:0";

/// A sysfs and a /dev under a temporary directory, removed on drop.
struct FakeHost {
    dir: PathBuf,
    roots: Roots,
}

impl FakeHost {
    fn new() -> FakeHost {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "paddock-agent-fakehost-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let roots = Roots { sys: dir.join("sys"), dev: dir.join("dev") };
        fs::create_dir_all(roots.sys.join("block")).expect("sys/block");
        fs::create_dir_all(&roots.dev).expect("dev");
        FakeHost { dir, roots }
    }

    /// A whole device `name` at `devpath` (under /sys/devices) holding `contents`.
    fn device(&self, name: &str, devpath: &str, contents: &[u8]) -> &Self {
        let device = self.roots.sys.join("devices").join(devpath);
        fs::create_dir_all(&device).expect("the device's directory");
        if name.starts_with("sr") {
            fs::write(device.join("type"), "5\n").expect("type");
        }
        let block = self.roots.sys.join("block").join(name);
        fs::create_dir_all(&block).expect("sys/block/<name>");
        symlink(&device, block.join("device")).expect("the device link");
        fs::write(block.join("size"), format!("{}\n", contents.len() / 512)).expect("size");
        fs::write(self.roots.dev.join(name), contents).expect("the device node");
        self
    }

    /// A partition `part` of the device `name` holding `contents`.
    fn partition(&self, name: &str, part: &str, contents: &[u8]) -> &Self {
        let dir = self.roots.sys.join("block").join(name).join(part);
        fs::create_dir_all(&dir).expect("the partition's directory");
        fs::write(dir.join("partition"), "1\n").expect("partition");
        fs::write(dir.join("size"), format!("{}\n", contents.len() / 512)).expect("size");
        fs::write(self.roots.dev.join(part), contents).expect("the partition's node");
        self
    }

    fn node(&self, name: &str) -> PathBuf {
        self.roots.dev.join(name)
    }
}

impl Drop for FakeHost {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A seed whose `paddock/agent.json` sends the agent to `agent_url` for `run_id`.
fn seed_iso(agent_url: &str, run_id: &str) -> Vec<u8> {
    let agent = json!({
        "agent_url": agent_url, "agent_token": "t", "ca_cert": null,
        "machine_id": "00000000-0000-0000-0000-000000000001", "run_id": run_id,
    });
    let json = serde_json::to_vec(&agent).expect("agent.json");
    paddock_seed::agent_seed_iso(b"instance-id: m\n", b"#cloud-config\n", &json).expect("a seed image")
}

/// An ISO 9660 image labelled `label` (the wipe image's is `PADDOCK_WIPE`).
fn labelled_iso(label: &str, seed: u8) -> Vec<u8> {
    let content = vec![seed; 4096];
    paddock_seed::nocloud_iso(&[("content", &content)], label).expect("an image")
}

/// The wipe image's digest as `images/wipe/build` prints it: the whole ISO file's.
fn digest(iso: &[u8]) -> String {
    sha256_hex(iso)
}

/// A tenant's disk `vdc` with a planted seed on `vdc1` and a planted image on `vdc2`, beside the
/// machine's own disk `vda`, the wipe image on the CD `sr0`, the run's seed on the floppy `fd0`,
/// an empty USB virtual media device `sdb` and a loop device.
fn planted_host() -> (FakeHost, Vec<u8>) {
    let host = FakeHost::new();
    let image = labelled_iso("PADDOCK_WIPE", 1);
    host.device("sr0", CD, &image)
        .device("fd0", FLOPPY, &seed_iso("https://paddock.example", "11111111-1111-1111-1111-111111111111"))
        .device("sdb", USB, &[0u8; 4096])
        .device("loop0", "virtual/block/loop0", &pattern(MIB, 3))
        .device("vda", "pci0000:00/0000:00:04.0/virtio1", &pattern(4 * MIB, 1))
        .device("vdc", "pci0000:00/0000:00:05.0/virtio2", &pattern(4 * MIB, 2))
        .partition("vdc", "vdc1", &seed_iso("https://tenant.example", "22222222-2222-2222-2222-222222222222"))
        .partition("vdc", "vdc2", &labelled_iso("PADDOCK_WIPE", 9));
    (host, image)
}

#[test]
fn a_disk_carrying_a_planted_seed_and_image_label_is_wiped_and_every_other_device_says_why() {
    let (host, _) = planted_host();
    let (disks, left) = device::discover(&host.roots).expect("discovery");
    let names: Vec<&str> = disks.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["vda", "vdc"], "every disk of the machine is wiped, whatever it holds");
    let left: Vec<(&str, Kind, Action)> = left.iter().map(|s| (s.name.as_str(), s.kind, s.action)).collect();
    assert_eq!(
        left,
        [
            ("fd0", Kind::Floppy, Action::Left),
            ("loop0", Kind::Virtual, Action::Left),
            ("sdb", Kind::Usb, Action::Left),
            ("sr0", Kind::Cd, Action::Left),
        ]
    );
}

#[test]
fn the_seed_is_the_one_on_virtual_media_never_a_disks() {
    let (host, _) = planted_host();
    let found = seed::find(&host.roots).expect("the seed");
    assert_eq!(found.device, host.node("fd0"));
    assert_eq!(found.seed.agent_url, "https://paddock.example", "not the tenant's server");
    assert_eq!(found.seed.run_id, "11111111-1111-1111-1111-111111111111");
}

#[test]
fn a_second_seed_on_virtual_media_fails_naming_both() {
    let (host, _) = planted_host();
    fs::write(host.node("sdb"), seed_iso("https://other.example", "33333333-3333-3333-3333-333333333333"))
        .expect("a second seed");
    let err = format!("{:#}", seed::find(&host.roots).expect_err("two seeds"));
    assert!(err.contains("more than one device holds paddock/agent.json"), "{err}");
    assert!(err.contains(&host.node("fd0").display().to_string()), "{err}");
    assert!(err.contains(&host.node("sdb").display().to_string()), "{err}");
}

#[test]
fn the_image_is_the_virtual_cd_never_a_disks_labelled_volume() {
    let (host, image) = planted_host();
    let found = seed::find(&host.roots).expect("the seed");
    let medium = device::boot_medium(&host.roots, &found.device).expect("the boot medium");
    let sha = device::image_sha256(&medium).expect("the image digest");
    assert_eq!(sha, digest(&image), "the CD's image, not vdc2's PADDOCK_WIPE volume");
    // A second ISO on virtual media besides the seed: which one the agent booted is unknown.
    fs::write(host.node("sdb"), labelled_iso("OTHER", 5)).expect("a second image");
    let err = format!("{:#}", device::boot_medium(&host.roots, &found.device).expect_err("two images"));
    assert!(err.contains(&host.node("sdb").display().to_string()) && err.contains("sr0"), "{err}");
}

/// The seed image paddock serves reads back through the agent's reader.
#[test]
fn the_served_seed_reads_as_iso_9660() {
    let host = FakeHost::new();
    host.device("sr1", CD, &seed_iso("https://paddock.example", "44444444-4444-4444-4444-444444444444"));
    let read = seed::read(Path::new(&host.node("sr1"))).expect("read");
    assert_eq!(read.run_id, "44444444-4444-4444-4444-444444444444");
}
