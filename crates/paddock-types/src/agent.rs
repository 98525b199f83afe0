//! What the machine agents (the wipe image and the node's first boot) find in their seed, fetch and
//! report (docs/security.md): the seed token is in the seed's URL only; `config` and `report` take the
//! run's agent token as a bearer instead of a JWT.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::cluster::Taint;
use crate::health::HealthCheck;
use crate::MachineId;

/// What a run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentPurpose {
    /// Wipe every listed drive.
    Wipe,
    /// Install the node OS and join the tenant cluster.
    Provision,
    /// Check the machine before it enters the fleet (a machine class's acceptance image).
    Acceptance,
}

impl AgentPurpose {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Wipe => "wipe",
            Self::Provision => "provision",
            Self::Acceptance => "acceptance",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Wipe, Self::Provision, Self::Acceptance].into_iter().find(|p| p.as_str() == s)
    }
}

/// Success or failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentResult {
    /// Done.
    Success,
    /// Not done.
    Failure,
}

/// The machine a run is for.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentMachine {
    /// Machine id.
    pub id: MachineId,
    /// Machine name.
    pub name: String,
}

/// `paddock/agent.json` in the run's seed: where the agent reaches paddock and with which token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentSeed {
    /// `PADDOCK_AGENT_BASE_URL` without a trailing slash: the agent calls
    /// `{agent_url}/v1/agent/config` and `{agent_url}/v1/agent/report`.
    pub agent_url: String,
    /// The run's agent token (base64url), sent as `Authorization: Bearer <agent_token>`.
    pub agent_token: String,
    /// PEM of the CA that signs the agent endpoint's TLS certificate; `null` for a public CA.
    pub ca_cert: Option<String>,
    /// The machine.
    pub machine_id: MachineId,
    /// The run.
    pub run_id: uuid::Uuid,
}

/// `GET /v1/agent/config`: what the agent is to do.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentConfigView {
    /// What the run does.
    pub purpose: AgentPurpose,
    /// The machine.
    pub machine: AgentMachine,
    /// The run.
    pub run_id: uuid::Uuid,
    /// Random per run (base64url); the report may echo it.
    pub nonce: String,
    /// When the run's tokens expire.
    pub expires_at: DateTime<Utc>,
    /// The run's instructions: for a wipe a [`WipeConfig`], for a provisioning boot a
    /// [`ProvisionConfig`], for an acceptance an [`AcceptanceConfig`].
    pub config: AgentRunConfig,
}

/// A run's instructions, by its purpose (the JSON has no tag: the view's `purpose` says which).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum AgentRunConfig {
    /// An acceptance's expectations (first: a wipe's `drives` alone never has its fields).
    Acceptance(AcceptanceConfig),
    /// A wipe's drives.
    Wipe(WipeConfig),
    /// A provisioning boot's installation and join.
    Provision(ProvisionConfig),
}

impl AgentRunConfig {
    /// The purpose these instructions are for.
    pub fn purpose(&self) -> AgentPurpose {
        match self {
            Self::Wipe(_) => AgentPurpose::Wipe,
            Self::Provision(_) => AgentPurpose::Provision,
            Self::Acceptance(_) => AgentPurpose::Acceptance,
        }
    }
}

/// The `config` of an acceptance: the image's digest and what the machine's class promises, for
/// the image to check the machine against. The image reports each check (`checks` of the report);
/// any check not `healthy`, or a `failure` result, keeps the machine out of the fleet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AcceptanceConfig {
    /// SHA-256 (hex) of the acceptance image the class names: the report must name it.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub image_sha256: String,
    /// The machine's class.
    pub machine_class: String,
    /// CPU cores the class promises.
    pub cpu_cores: u32,
    /// Memory the class promises, in GiB.
    pub memory_gib: u32,
    /// GPU model the class promises (empty: none).
    pub gpu_model: String,
    /// GPUs the class promises.
    pub gpu_count: u32,
    /// The drives the BMC listed, as for a wipe: the image checks it finds each of them.
    pub drives: Vec<WipeDrive>,
}

/// The `config` of a provisioning boot: the node OS image to install (its digest), the tenant API
/// server to join, how to trust it (kubeadm's token discovery: the CA pin) and the node's name
/// and taints. The bootstrap token is a secret: `Debug` leaves it out.
#[derive(Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ProvisionConfig {
    /// The name the node registers with.
    pub node_name: String,
    /// The tenant API server: `https://host:port`.
    pub api_endpoint: String,
    /// PEM of the tenant cluster's CA, as paddock knows it (the installer trusts only the CA whose
    /// SubjectPublicKeyInfo matches `ca_cert_hash`, found by discovery).
    pub ca_cert: String,
    /// kubeadm's CA pin: `sha256:` and the hex SHA-256 of the CA's SubjectPublicKeyInfo.
    pub ca_cert_hash: String,
    /// The bootstrap token, `<id>.<secret>`.
    pub bootstrap_token: String,
    /// The taints the node registers with (its pool's).
    #[serde(default)]
    pub node_taints: Vec<Taint>,
    /// SHA-256 (hex) of the node OS image (`PADDOCK_OS_IMAGE_SHA256`): the installer installs
    /// nothing from a boot medium of another digest.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub os_image_sha256: String,
    /// The cluster driver's whole join configuration (what a simulated machine reads).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub join: serde_json::Value,
}

impl std::fmt::Debug for ProvisionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProvisionConfig")
            .field("node_name", &self.node_name)
            .field("api_endpoint", &self.api_endpoint)
            .field("ca_cert_hash", &self.ca_cert_hash)
            .field("node_taints", &self.node_taints)
            .field("os_image_sha256", &self.os_image_sha256)
            .finish_non_exhaustive()
    }
}

/// The `config` of a wipe: every drive the BMC listed, with what it reported of each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WipeConfig {
    /// The drives to wipe (besides any other drive the agent finds).
    pub drives: Vec<WipeDrive>,
}

/// A drive of a wipe's configuration, as the BMC inventory reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WipeDrive {
    /// The BMC's drive id.
    pub id: String,
    /// Serial number, when the BMC reported one.
    pub serial: Option<String>,
    /// Capacity in bytes, when reported.
    pub capacity_bytes: Option<u64>,
    /// `nvme`, `sata`, `sas`, `scsi`, `virtio` or what else the BMC said; `null` when unreported.
    pub protocol: Option<String>,
}

/// How a reported drive was matched to a drive of the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MatchBasis {
    /// By serial number (serials are unique on the machine).
    Serial,
    /// By protocol and capacity.
    ProtocolCapacity,
}

/// A drive as the running kernel sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DriveIdentity {
    /// Model.
    #[serde(default)]
    #[schema(max_length = 256)]
    pub model: Option<String>,
    /// Serial number.
    #[serde(default)]
    #[schema(max_length = 256)]
    pub serial: Option<String>,
    /// World wide name.
    #[serde(default)]
    #[schema(max_length = 256)]
    pub wwn: Option<String>,
    /// NVMe EUI-64 / NGUID.
    #[serde(default)]
    #[schema(max_length = 256)]
    pub eui: Option<String>,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Transport (`nvme`, `sata`, ...).
    #[serde(default)]
    #[schema(max_length = 64)]
    pub protocol: Option<String>,
}

/// What was read back to verify a wipe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Verification {
    /// Ranges read back: 66 (64 sampled over the device, plus the first and last MiB).
    #[schema(minimum = 0)]
    pub ranges: u64,
    /// Bytes read back: what those ranges hold on a drive of the identity's size (each range cut
    /// to the size: 6 MiB on any drive of at least 1 MiB).
    #[schema(minimum = 0)]
    pub bytes_read: u64,
    /// SHA-256 of what was read (64 hex digits): of that many zero bytes, since every range must
    /// read back as zeroes.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub sha256: String,
}

/// One drive of a wipe report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DriveReport {
    /// The configuration's drive id, or `null` for a drive the BMC did not list.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 256)]
    pub id: Option<String>,
    /// How the drive was matched to the configuration's; `null` for an unlisted drive.
    #[serde(default)]
    pub match_basis: Option<MatchBasis>,
    /// The drive as the kernel sees it.
    pub identity: DriveIdentity,
    /// How it was wiped, strongest first: `nvme-sanitize-crypto`, `nvme-sanitize-block`,
    /// `nvme-format-crypto`, `nvme-format-user-data`, `ata-secure-erase-enhanced`,
    /// `ata-secure-erase`, `discard-zeroes`, `overwrite-zeroes`. Another name fails the wipe.
    #[schema(min_length = 1, max_length = 64)]
    pub method: String,
    /// Whether it was wiped.
    pub result: AgentResult,
    /// Anything worth keeping (tool output, error).
    #[serde(default)]
    #[schema(max_length = 4096)]
    pub detail: Option<String>,
    /// What was read back; `null` fails the wipe.
    #[serde(default)]
    pub verification: Option<Verification>,
}

/// `POST /v1/agent/report`: how the run ended. It uses the run up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"result": "success", "started_at": "2026-12-01T10:00:05Z", "finished_at": "2026-12-01T10:07:41Z", "image_sha256": "9f2c1e0b7a6d5c4b3a29180f7e6d5c4b3a29180f7e6d5c4b3a29180f7e6d5c4b", "nonce": "c2b1f0e9", "drives": [{"id": "Drive0", "match_basis": "serial", "identity": {"model": "SAMSUNG MZQL23T8HCLS", "serial": "S64HNE0T401234", "size_bytes": 3_840_755_982_336_u64, "protocol": "NVMe"}, "method": "nvme-format-crypto", "result": "success", "verification": {"ranges": 66, "bytes_read": 6291456, "sha256": "b69dae56a14d1a8314ed40664c4033ea0a550eea2673e04df42a66ac6b9faf2c"}}], "devices": [{"name": "nvme0n1", "kind": "disk", "action": "wiped", "reason": "a disk of the machine: wiped with nvme-format-crypto and verified"}, {"name": "sr0", "kind": "cd", "action": "left", "reason": "virtual media: the wipe image"}]}))]
pub struct AgentReport {
    /// Overall result.
    pub result: AgentResult,
    /// When the run started.
    pub started_at: DateTime<Utc>,
    /// When it finished.
    pub finished_at: DateTime<Utc>,
    /// SHA-256 of the image the machine booted (64 hex digits).
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub image_sha256: String,
    /// The configuration's nonce, echoed. Required: a report without it is recorded but proves
    /// nothing (the run fails); another run's nonce is refused (422).
    #[serde(default)]
    #[schema(max_length = 64)]
    pub nonce: Option<String>,
    /// Per drive (wipes; empty for a provisioning boot).
    #[serde(default)]
    #[schema(max_items = 256)]
    pub drives: Vec<DriveReport>,
    /// Every block device the agent saw, with what it did to it and why (wipes; empty for a
    /// provisioning boot). A wipe listing none, or leaving a `disk` not `wiped`, fails.
    #[serde(default)]
    #[schema(max_items = 1024)]
    pub devices: Vec<BlockDevice>,
    /// Why the run failed, when the agent knows (a provisioning boot names each refusal); absent
    /// on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<AgentFailure>,
    /// What an acceptance image checked (`{name, status, detail}`, as a health report's checks);
    /// empty for other runs. An acceptance passes only with at least one check, every one
    /// `healthy`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 64)]
    pub checks: Vec<HealthCheck>,
}

/// Why a run failed, as the agent names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentFailure {
    /// A stable snake_case reason: for a provisioning boot `os_image_digest_mismatch`,
    /// `discovery_failed`, `ca_pin_mismatch`, `no_target_disk`, `install_failed`.
    #[schema(min_length = 1, max_length = 64, pattern = "^[a-z][a-z0-9_]*$")]
    pub code: String,
    /// What went wrong.
    #[schema(max_length = 1024)]
    pub message: String,
}

/// What a block device is, from the kernel's view of how it is attached (never from what it
/// holds, which a disk's owner can write).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BlockDeviceKind {
    /// A disk of the machine: wiped.
    Disk,
    /// A CD-ROM (`sr*`): virtual media (the wipe image, or the seed); never wiped.
    Cd,
    /// A floppy (`fd*`): virtual media (the seed); never wiped.
    Floppy,
    /// A device on the USB transport: virtual media as a BMC presents it; never wiped.
    Usb,
    /// Not a disk: loop, RAM, zram, device-mapper, md or network block devices.
    Virtual,
}

/// What the agent did with a block device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BlockDeviceAction {
    /// Wiped and verified (its evidence is among `drives`).
    Wiped,
    /// A wipe was tried and failed (its evidence is among `drives`).
    WipeFailed,
    /// Left alone (`reason` says why).
    Left,
}

/// A block device the agent saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BlockDevice {
    /// The kernel's name (`nvme0n1`, `sda`, `sr0`).
    #[schema(min_length = 1, max_length = 64)]
    pub name: String,
    /// What it is.
    pub kind: BlockDeviceKind,
    /// What was done to it.
    pub action: BlockDeviceAction,
    /// Why.
    #[schema(max_length = 1024)]
    pub reason: String,
}

/// The bytes of a file, for the OpenAPI document (a binary string).
#[derive(Debug, Clone, ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct BinaryFile(pub Vec<u8>);
