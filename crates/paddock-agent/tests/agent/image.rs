//! The wipe image `scripts/wipe-image` built (`PADDOCK_TEST_WIPE_IMAGE`, with the SHA-256 it
//! printed in `PADDOCK_TEST_WIPE_IMAGE_SHA256`; `scripts/test` builds it, twice and compared on a
//! fresh build): it is what its digest says, it carries what the measured-boot work needs, and it
//! boots through BIOS and UEFI into the agent (`images/wipe/smoke-boot`, QEMU with TCG).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::sha256_hex;

/// The image and its printed digest, or None (the test is skipped: `paddock_testkit::skip`).
fn image() -> Option<(PathBuf, String)> {
    let why = "scripts/test builds the image and sets it";
    let iso = paddock_testkit::skip::env("PADDOCK_TEST_WIPE_IMAGE", why)?;
    let sha = paddock_testkit::skip::env("PADDOCK_TEST_WIPE_IMAGE_SHA256", why)?;
    Some((PathBuf::from(iso), sha))
}

/// The `manifest.txt` beside the ISO: `<sha256>  <path>` lines.
fn manifest(iso: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(iso.with_file_name("manifest.txt")).expect("the image's manifest.txt");
    text.lines().filter_map(|l| l.split_once("  ")).map(|(sha, path)| (sha.to_owned(), path.to_owned())).collect()
}

/// The digest is the bytes', the manifest agrees, and the ISO's own length is the file's (the
/// agent hashes its boot medium up to the volume space size: the ledger's image digest).
#[test]
fn the_image_is_the_digest_it_was_built_with() {
    let Some((iso, sha)) = image() else { return };
    let bytes = std::fs::read(&iso).expect("reading the image");
    assert_eq!(sha256_hex(&bytes), sha, "the printed SHA-256 is the image's");
    let manifest = manifest(&iso);
    let digest_of = |path: &str| manifest.iter().find(|(_, p)| p == path).map(|(s, _)| s.clone());
    assert_eq!(digest_of("paddock-wipe.iso").as_deref(), Some(sha.as_str()), "{manifest:?}");
    for part in ["boot/vmlinuz", "boot/initrd.img", "EFI/BOOT/BOOTX64.EFI", "boot/efiboot.img"] {
        let digest = digest_of(part).unwrap_or_else(|| panic!("the manifest records {part}: {manifest:?}"));
        assert_eq!(digest.len(), 64, "{part}: {digest}");
    }

    // The primary volume descriptor (ISO 9660, sector 16): its label and volume space size.
    let pvd = &bytes[16 * 2048..17 * 2048];
    assert_eq!(&pvd[1..6], b"CD001", "an ISO 9660 image");
    assert_eq!(std::str::from_utf8(&pvd[40..72]).expect("label").trim_end(), "PADDOCK_WIPE");
    let blocks = u32::from_le_bytes(pvd[80..84].try_into().expect("4 bytes"));
    assert_eq!(u64::from(blocks) * 2048, bytes.len() as u64, "the volume space is the whole file");
}

/// Both firmwares boot it into the agent, which finds the seed, prints the image digest the build
/// printed and tries to fetch its config (the VMs have no network). Both boots run at once.
#[test]
fn the_image_boots_through_bios_and_uefi_into_the_agent() {
    let Some((iso, sha)) = image() else { return };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../images/wipe/smoke-boot");
    let boots: Vec<_> = ["bios", "uefi"]
        .into_iter()
        .map(|mode| {
            let child = Command::new(&script)
                .arg(&iso)
                .arg(&sha)
                .arg(mode)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("running images/wipe/smoke-boot (qemu-system-x86, ovmf and xorriso installed)");
            (mode, child)
        })
        .collect();
    for (mode, child) in boots {
        let out = child.wait_with_output().expect("smoke-boot");
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{mode} boot:\n{said}");
        assert!(said.contains(&format!("seen: paddock-agent: image sha256 {sha}")), "{mode} boot:\n{said}");
    }
}
