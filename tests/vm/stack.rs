//! The tenant base stack the VM tests apply: the newest embedded stack, with what cannot run here
//! changed, and each change written down. No registry is reachable from the node VMs, so an image
//! runs only if the node image carries it (scripts/node-image):
//! - Calico and the NVIDIA device plugin are LEFT OUT: their images cannot be had here (Calico's
//!   are built from far more than Go modules; the device plugin needs NVML). The nodes keep the
//!   bridge CNI of their image, routed over the tenant network (images/node/rcS), which stands in
//!   for Calico; the VMs have no GPUs for the device plugin to offer.
//! - The slurm-operator and local-path-provisioner manifests are upstream's, byte for byte, but
//!   for their image references: `paddock.local/...` names of the same releases built from the
//!   same sources (images/node/build, images/slurm/build). The provisioner's helper pods run the
//!   node image's busybox.
//! - The operator's container also gets `terminationMessagePolicy: FallbackToLogsOnError`, for
//!   diagnosis only: when it exits in error, the kubelet keeps the tail of its log in the pod's
//!   status, which outlives the container's log (the join's timeline prints it).
//!
//! Everything else (the Slinky CRDs, the operator's RBAC and Deployment, the storage class, every
//! readiness rule) is the production stack's, applied by paddock's stack driver as in production,
//! so the cluster's `StackReady` means what it means there.

use std::path::{Path, PathBuf};

use paddock_domain::stack::{definition, latest_version, StackDefinition};
use paddock_kube::KubeTenantStack;
use sha2::{Digest, Sha256};

/// Components whose images cannot be had here (see the module documentation).
const LEFT_OUT: [&str; 2] = ["calico", "nvidia-device-plugin"];

/// Upstream image reference -> the local one the node image carries, per manifest file.
const LOCAL_IMAGES: [(&str, &str, &str); 3] = [
    (
        "slurm-operator/slurm-operator.yaml",
        "image: ghcr.io/slinkyproject/slurm-operator:1.2.1\n",
        "image: paddock.local/slinkyproject/slurm-operator:1.2.1\n          \
         terminationMessagePolicy: FallbackToLogsOnError\n",
    ),
    (
        "local-path-provisioner/local-path-storage.yaml",
        "image: rancher/local-path-provisioner:v0.0.30\n",
        "image: paddock.local/rancher/local-path-provisioner:v0.0.30\n",
    ),
    (
        "local-path-provisioner/local-path-storage.yaml",
        "image: busybox\n",
        "image: paddock.local/library/busybox:1.35.0\n",
    ),
];

/// The stack driver over the VM tests' variant of the newest stack, written under `dir` from the
/// upstream files in `stacks` (`PADDOCK_TEST_UPSTREAM_STACKS`).
pub fn local(stacks: &Path, dir: &Path) -> KubeTenantStack {
    let version = latest_version();
    let mut def: StackDefinition = definition(version).expect("the newest stack").clone();
    def.components.retain(|c| !LEFT_OUT.contains(&c.name.as_str()));
    for component in &mut def.components {
        for manifest in &mut component.manifests {
            let from = stacks.join(version).join(&manifest.file);
            let mut text = std::fs::read_to_string(&from).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
            for (file, upstream, local) in LOCAL_IMAGES.iter().filter(|(f, _, _)| *f == manifest.file) {
                assert_eq!(text.matches(upstream).count(), 1, "{file} names {upstream:?} once");
                text = text.replace(upstream, local);
            }
            let to: PathBuf = dir.join(version).join(&manifest.file);
            std::fs::create_dir_all(to.parent().expect("a directory")).expect("the stack's directory");
            std::fs::write(&to, &text).expect("the stack's manifest");
            manifest.sha256 = Some(hex::encode(Sha256::digest(text.as_bytes())));
        }
    }
    let stack = KubeTenantStack::with_definitions(dir.to_owned(), [def]).expect("a valid definition");
    stack.verify(version).expect("the stack files verify");
    stack
}
