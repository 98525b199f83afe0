//! The node OS image `scripts/node-image` built (`PADDOCK_TEST_NODE_IMAGE`, the ISO, with the
//! SHA-256 it printed in `PADDOCK_TEST_NODE_IMAGE_SHA256`, disk.img and manifest.txt beside it;
//! `scripts/test` builds it, twice and compared on a fresh build): the ISO is what its digest says
//! and carries `/node/disk.img` as images/node/README.md lays it out, and disk.img boots from the BIOS
//! into containerd with the pause image, then the kubelet or the "no join archive" line
//! (`images/node/smoke-boot`, QEMU with TCG).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::sha256_hex;

/// The root file system's UUID images/node/build gives it (5061646f-636b-4e6f-9465-526f6f744653).
const ROOT_UUID: [u8; 16] =
    [0x50, 0x61, 0x64, 0x6f, 0x63, 0x6b, 0x4e, 0x6f, 0x94, 0x65, 0x52, 0x6f, 0x6f, 0x74, 0x46, 0x53];

/// The ISO and its printed digest, or None (the test is skipped: `paddock_testkit::skip`).
fn image() -> Option<(PathBuf, String)> {
    let why = "scripts/test builds the node image and sets it";
    let iso = paddock_testkit::skip::env("PADDOCK_TEST_NODE_IMAGE", why)?;
    let sha = paddock_testkit::skip::env("PADDOCK_TEST_NODE_IMAGE_SHA256", why)?;
    Some((PathBuf::from(iso), sha))
}

/// The SHA-256 the `manifest.txt` beside the ISO records for `path`.
fn manifest_digest(iso: &Path, path: &str) -> String {
    let text = std::fs::read_to_string(iso.with_file_name("manifest.txt")).expect("the image's manifest.txt");
    let found = text.lines().filter_map(|l| l.split_once("  ")).find(|(_, p)| *p == path);
    found.map(|(sha, _)| sha.to_owned()).unwrap_or_else(|| panic!("manifest.txt records {path}:\n{text}"))
}

fn u32_le(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// The extent (offset, length) of the entry `name` in the ISO 9660 directory at `dir`.
fn iso_entry(iso: &[u8], dir: (usize, usize), name: &str) -> (usize, usize) {
    let (start, len) = dir;
    let mut at = start;
    while at < start + len {
        let size = usize::from(iso[at]);
        if size == 0 {
            at = (at / 2048 + 1) * 2048; // records do not cross sectors: the rest is padding
            continue;
        }
        let id = &iso[at + 33..at + 33 + usize::from(iso[at + 32])];
        if id == name.as_bytes() {
            return (u32_le(iso, at + 2) as usize * 2048, u32_le(iso, at + 10) as usize);
        }
        at += size;
    }
    panic!("the ISO's directory has no {name}")
}

/// The ISO is its digest, labelled PADDOCK_NODE, and holds disk.img (the bytes beside it, as the
/// manifest records them); disk.img has the contract's MBR layout: the FAT boot partition, 1 MiB
/// of zero for the join archive, the ext4 root with the fixed UUID and label.
#[test]
fn the_node_image_is_its_digest_and_carries_the_contracts_disk() {
    let Some((iso_path, sha)) = image() else { return };
    let iso = std::fs::read(&iso_path).expect("reading the node image");
    assert_eq!(sha256_hex(&iso), sha, "the printed SHA-256 is the ISO's");
    assert_eq!(manifest_digest(&iso_path, "paddock-node.iso"), sha);
    let pvd = &iso[16 * 2048..17 * 2048];
    assert_eq!(&pvd[1..6], b"CD001", "an ISO 9660 image");
    assert_eq!(std::str::from_utf8(&pvd[40..72]).expect("label").trim_end(), "PADDOCK_NODE");
    assert_eq!(u64::from(u32_le(pvd, 80)) * 2048, iso.len() as u64, "the volume space is the whole file");

    let root = (u32_le(pvd, 156 + 2) as usize * 2048, u32_le(pvd, 156 + 10) as usize);
    let node = iso_entry(&iso, root, "NODE");
    let (at, len) = iso_entry(&iso, node, "DISK.IMG;1");
    let disk = std::fs::read(iso_path.with_file_name("disk.img")).expect("disk.img beside the ISO");
    assert_eq!(len, disk.len(), "/node/disk.img is one extent of disk.img's length");
    assert!(iso[at..at + len] == disk[..], "/node/disk.img holds disk.img's bytes");
    assert_eq!(sha256_hex(&disk), manifest_digest(&iso_path, "node/disk.img"));
    iso_entry(&iso, node, "MANIFEST.TXT;1");

    assert_eq!(&disk[510..512], &[0x55, 0xaa], "an MBR");
    let part = |i: usize| {
        let e = &disk[446 + 16 * i..446 + 16 * (i + 1)];
        (e[0], e[4], u32_le(e, 8) as usize, u32_le(e, 12) as usize)
    };
    assert_eq!(part(0), (0x80, 0x0c, 2048, 131_072), "1: FAT32 LBA, bootable, 64 MiB from 1 MiB");
    assert_eq!(part(1), (0x00, 0xda, 133_120, 2048), "2: non-FS data, 1 MiB");
    let (status, kind, start, sectors) = part(2);
    assert_eq!((status, kind, start), (0x00, 0x83, 135_168), "3: Linux from 66 MiB");
    assert_eq!((start + sectors) * 512, disk.len(), "3: the rest of the disk");
    assert_eq!(part(3), (0, 0, 0, 0), "no fourth partition");
    assert!(disk[133_120 * 512..135_168 * 512].iter().all(|b| *b == 0), "the join archive's partition is zero");
    let fat = &disk[2048 * 512..2049 * 512];
    assert_eq!(&fat[82..90], b"FAT32   ", "partition 1 is FAT32");
    let ext4 = &disk[start * 512 + 1024..start * 512 + 2048];
    assert_eq!(&ext4[0x38..0x3a], &[0x53, 0xef], "partition 3 is ext4");
    assert_eq!(ext4[0x68..0x78], ROOT_UUID, "the root's fixed UUID");
    assert_eq!(&ext4[0x78..0x84], b"paddock-root", "the root's label");
    assert!(disk.len() < 4 << 30, "disk.img fits one ISO 9660 extent");
}

/// disk.img boots from the BIOS (SeaBIOS, syslinux, the kernel, the node's initramfs, busybox
/// init on the ext4 root) into containerd with the pause image imported, and then starts the
/// kubelet for the node of the join archive in partition 2, or says there is none when partition
/// 2 is zero. Both boots run at once.
#[test]
fn the_node_disk_boots_from_the_bios_into_containerd_then_the_kubelet() {
    let Some((iso, _)) = image() else { return };
    let disk = iso.with_file_name("disk.img");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../images/node/smoke-boot");
    let boots: Vec<_> = ["join", "no-join"]
        .into_iter()
        .map(|mode| {
            let child = Command::new(&script)
                .arg(&disk)
                .arg(mode)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("running images/node/smoke-boot (qemu-system-x86 and fdisk installed)");
            (mode, child)
        })
        .collect();
    for (mode, child) in boots {
        let out = child.wait_with_output().expect("smoke-boot");
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{mode} boot:\n{said}");
        assert!(said.contains("seen: paddock-node: containerd started"), "{mode} boot:\n{said}");
        assert!(said.contains("seen: registry.k8s.io/pause:3.10"), "{mode} boot:\n{said}");
    }
}
