//! The join archive (the node image contract, "The join archive"): a POSIX ustar archive of the
//! files the installed OS's init extracts onto `/` before it starts the kubelet: the tenant CA, the
//! kubelet's bootstrap kubeconfig, and `etc/paddock/node.env`.

use anyhow::{bail, Context};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use paddock_types::agent::ProvisionConfig;
use paddock_types::cluster::{Taint, TaintEffect};

const BLOCK: usize = 512;
/// The largest archive partition 2 holds.
pub const MAX_ARCHIVE: usize = 1 << 20;

/// The archive's members: directories first, then the files.
const DIRS: [&str; 4] = ["etc/", "etc/kubernetes/", "etc/kubernetes/pki/", "etc/paddock/"];
/// The tenant CA.
pub const CA_CRT: &str = "etc/kubernetes/pki/ca.crt";
/// The kubelet's bootstrap kubeconfig.
pub const BOOTSTRAP_KUBECONFIG: &str = "etc/kubernetes/bootstrap-kubelet.conf";
/// The node's name and taints.
pub const NODE_ENV: &str = "etc/paddock/node.env";

/// The join archive for `config`, trusting `ca_pem` (the CA discovery found and the pin matched).
pub fn join_archive(config: &ProvisionConfig, ca_pem: &str) -> anyhow::Result<Vec<u8>> {
    let kubeconfig = bootstrap_kubeconfig(&config.api_endpoint, ca_pem, &config.bootstrap_token)?;
    let env = node_env(&config.node_name, &config.node_taints);
    let files: [(&str, &[u8]); 3] =
        [(CA_CRT, ca_pem.as_bytes()), (BOOTSTRAP_KUBECONFIG, kubeconfig.as_bytes()), (NODE_ENV, env.as_bytes())];
    let archive = ustar(&DIRS, &files)?;
    if archive.len() > MAX_ARCHIVE {
        bail!("the join archive is {} bytes, more than partition 2's {MAX_ARCHIVE}", archive.len());
    }
    Ok(archive)
}

/// A kubeconfig with one cluster (`server`, the CA), one user (the bootstrap token) and one
/// context, current. The values are checked rather than quoted: nothing in them needs YAML escapes.
pub fn bootstrap_kubeconfig(server: &str, ca_pem: &str, token: &str) -> anyhow::Result<String> {
    let plain = |v: &str| !v.is_empty() && v.bytes().all(|b| b.is_ascii_graphic() && !b"\"'\\#".contains(&b));
    if !plain(server) {
        bail!("the API endpoint {server:?} is not a plain URL");
    }
    if !plain(token) {
        bail!("the bootstrap token is not of the form <id>.<secret>");
    }
    let ca = STANDARD.encode(ca_pem);
    Ok(format!(
        "apiVersion: v1
kind: Config
clusters:
- name: paddock
  cluster:
    server: \"{server}\"
    certificate-authority-data: {ca}
users:
- name: kubelet-bootstrap
  user:
    token: \"{token}\"
contexts:
- name: kubelet-bootstrap@paddock
  context:
    cluster: paddock
    user: kubelet-bootstrap
current-context: kubelet-bootstrap@paddock
"
    ))
}

/// `NODE_NAME` and `NODE_TAINTS` (`key=value:Effect`, comma-separated) as shell-sourceable lines.
pub fn node_env(node_name: &str, taints: &[Taint]) -> String {
    let taints: Vec<String> = taints
        .iter()
        .map(|t| {
            let effect = match t.effect {
                TaintEffect::NoSchedule => "NoSchedule",
                TaintEffect::PreferNoSchedule => "PreferNoSchedule",
                TaintEffect::NoExecute => "NoExecute",
            };
            if t.value.is_empty() {
                format!("{}:{effect}", t.key)
            } else {
                format!("{}={}:{effect}", t.key, t.value)
            }
        })
        .collect();
    format!("NODE_NAME={}\nNODE_TAINTS={}\n", shell_quote(node_name), shell_quote(&taints.join(",")))
}

/// `'value'`, a single quote inside written as `'\''`.
fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// A ustar archive of `dirs` (mode 0755) then `files` (mode 0600), owned 0:0, ending with two
/// zero blocks.
pub fn ustar(dirs: &[&str], files: &[(&str, &[u8])]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    for dir in dirs {
        out.extend(header(dir, 0o755, 0, b'5')?);
    }
    for (name, data) in files {
        out.extend(header(name, 0o600, data.len(), b'0')?);
        out.extend_from_slice(data);
        out.resize(out.len().next_multiple_of(BLOCK), 0);
    }
    out.resize(out.len() + 2 * BLOCK, 0);
    Ok(out)
}

/// One 512-byte ustar header (POSIX.1-1988): a name of at most 100 bytes, mtime 0.
fn header(name: &str, mode: u32, size: usize, typeflag: u8) -> anyhow::Result<[u8; BLOCK]> {
    if name.len() > 100 || name.starts_with('/') || name.split('/').any(|c| c == "..") {
        bail!("{name:?} is not a relative member name of at most 100 bytes");
    }
    let mut h = [0u8; BLOCK];
    h[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut h[100..108], u64::from(mode))?;
    octal(&mut h[108..116], 0)?;
    octal(&mut h[116..124], 0)?;
    octal(&mut h[124..136], u64::try_from(size).context("size")?)?;
    octal(&mut h[136..148], 0)?;
    h[156] = typeflag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[265..269].copy_from_slice(b"root");
    h[297..301].copy_from_slice(b"root");
    // The checksum counts its own field as eight spaces.
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    octal(&mut h[148..155], u64::from(sum))?;
    h[155] = b' ';
    Ok(h)
}

/// `value` in octal, zero-padded, filling `field` but its last byte (a NUL).
fn octal(field: &mut [u8], value: u64) -> anyhow::Result<()> {
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    if text.len() > digits {
        bail!("{value} does not fit a {digits}-digit octal field");
    }
    field[..digits].copy_from_slice(text.as_bytes());
    field[digits] = 0;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use sha2::{Digest, Sha256};

    use super::*;

    #[test]
    fn ustar_matches_pythons_tarfile_byte_for_byte() {
        // Python's tarfile (USTAR_FORMAT) for the same members: a directory `etc/` (0755) and
        // `etc/a` (0600, "hello"), uid/gid 0, uname/gname root, mtime 0: SHA-256 of its first
        // three blocks (both headers and the file's data block).
        let archive = ustar(&["etc/"], &[("etc/a", b"hello")]).expect("archive");
        assert_eq!(archive.len(), 5 * BLOCK, "two headers, one data block, two zero blocks");
        assert_eq!(
            hex::encode(Sha256::digest(&archive[..3 * BLOCK])),
            "777593f0b100d10f345ad2b9164f888749f35ab40f8d403354b79588875e58c3"
        );
        assert!(archive[3 * BLOCK..].iter().all(|&b| b == 0));
    }

    #[test]
    fn the_join_archive_extracts_with_tar() {
        let config = ProvisionConfig {
            node_name: "gpu-0".into(),
            api_endpoint: "https://10.0.0.1:6443".into(),
            ca_cert: String::new(),
            ca_cert_hash: String::new(),
            bootstrap_token: "abcdef.0123456789abcdef".into(),
            node_taints: vec![
                Taint { key: "gpu".into(), value: "true".into(), effect: TaintEffect::NoSchedule },
                Taint { key: "dedicated".into(), value: String::new(), effect: TaintEffect::NoExecute },
            ],
            os_image_sha256: String::new(),
            join: serde_json::Value::Null,
        };
        let ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let archive = join_archive(&config, ca).expect("archive");
        let dir = std::env::temp_dir().join(format!("paddock-joinfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("join.tar");
        std::fs::write(&file, &archive).expect("write");
        let out = Command::new("tar").arg("-xf").arg(&file).arg("-C").arg(&dir).output().expect("tar");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let read = |p: &str| std::fs::read_to_string(dir.join(p)).expect(p);
        assert_eq!(read(CA_CRT), ca);
        assert_eq!(read(NODE_ENV), "NODE_NAME='gpu-0'\nNODE_TAINTS='gpu=true:NoSchedule,dedicated:NoExecute'\n");
        let kubeconfig = read(BOOTSTRAP_KUBECONFIG);
        assert!(kubeconfig.contains("server: \"https://10.0.0.1:6443\"\n"), "{kubeconfig}");
        assert!(kubeconfig.contains(&format!("certificate-authority-data: {}\n", STANDARD.encode(ca))));
        assert!(kubeconfig.contains("token: \"abcdef.0123456789abcdef\"\n"));
        let listing = Command::new("tar").arg("-tvf").arg(&file).output().expect("tar -t");
        let listing = String::from_utf8_lossy(&listing.stdout);
        assert!(listing.contains("-rw------- root/root"), "files are 0600 root: {listing}");
        assert!(listing.contains("drwxr-xr-x root/root"), "dirs are 0755 root: {listing}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn quotes_and_names_are_checked() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert!(bootstrap_kubeconfig("https://a\"b", "", "a.b").is_err());
        assert!(header("../x", 0o600, 0, b'0').is_err());
        assert!(header(&"a".repeat(101), 0o600, 0, b'0').is_err());
    }
}
