//! The custody ledger of a machine and a tenant's isolation report (docs/security.md).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{AllocationId, CleanId, ClusterId, CustodyEntryId, MachineId, NodePoolId, TenantId};

/// One transition of a machine, as the ledger recorded it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CustodyEntryView {
    /// Id.
    pub id: CustodyEntryId,
    /// The machine.
    pub machine_id: MachineId,
    /// Position in the machine's chain: 1, 2, 3, ...
    #[schema(minimum = 1)]
    pub seq: i64,
    /// When the transition happened (microsecond precision).
    pub at: DateTime<Utc>,
    /// Who made it: the token subject of an API call, or `paddock-worker`.
    pub actor: String,
    /// The state left (a machine state); null for enrollment.
    pub from: Option<String>,
    /// The state entered (a machine state).
    pub to: String,
    /// Why.
    pub reason: String,
    /// What proves it: the wipe report of a clean, the allocation (tenant, cluster, pool, clean),
    /// the node that joined, the error or maintenance reason, the enrolling request.
    #[schema(value_type = Object)]
    pub evidence: serde_json::Value,
    /// HMAC-SHA256 of the previous entry, hex; null for the first entry.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub prev_mac: Option<String>,
    /// HMAC-SHA256 over this entry's canonical JSON (RFC 8785) and `prev_mac`, hex, computed by
    /// paddock before it wrote the entry; null only for a row paddock did not write (a break).
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub mac: Option<String>,
}

/// A machine's custody ledger and the result of recomputing its chain.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CustodyView {
    /// The machine.
    pub machine_id: MachineId,
    /// Every entry, oldest first.
    pub items: Vec<CustodyEntryView>,
    /// Every entry carries a MAC that checks, the sequence has no gap, each entry leaves the
    /// state the one before it entered, and the last entry leads to the machine's current state.
    pub verified: bool,
    /// The first entry that fails verification (without a MAC or with a wrong one, out of
    /// sequence, not linked to the one before it, or not starting where the one before it
    /// ended); null when verified, or when only the end is missing.
    pub first_bad_entry: Option<CustodyEntryId>,
    /// Entries without a MAC. paddock writes every entry with its MAC, so each one is a row
    /// inserted by someone else, and a break.
    #[schema(minimum = 0)]
    pub unsealed: u64,
    /// What is wrong, readable; null when verified.
    pub finding: Option<String>,
}

/// The verified wipe that preceded an allocation.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct IsolationWipe {
    /// The clean record.
    pub clean_id: CleanId,
    /// How the machine was wiped (`agent`: the wipe image's agent reported every drive).
    pub method: String,
    /// The wipe run.
    #[schema(value_type = String, format = Uuid)]
    pub run_id: uuid::Uuid,
    /// When the wipe was verified.
    pub completed_at: DateTime<Utc>,
}

/// A machine a cluster holds, with the evidence that it was clean when the tenant got it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct IsolationMachine {
    /// The machine.
    pub machine_id: MachineId,
    /// Its name.
    pub name: String,
    /// Its state (a machine state).
    pub state: String,
    /// The node pool it serves.
    pub node_pool_id: NodePoolId,
    /// Its node name in the tenant cluster, once active.
    pub node_name: Option<String>,
    /// The allocation that gave it to the cluster.
    pub allocation_id: AllocationId,
    /// When.
    pub allocated_at: DateTime<Utc>,
    /// The clean the allocation consumed, as recorded; null when the record is missing.
    pub wipe: Option<IsolationWipe>,
    /// The wipe record exists, belongs to this machine, completed before the allocation, and no
    /// other tenancy of the machine came between the two.
    pub wipe_verified: bool,
    /// The machine's custody ledger verifies (see `GET /v1/machines/{machine_id}/custody`).
    pub ledger_verified: bool,
}

/// A live cluster of the tenant and the machines it holds.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct IsolationCluster {
    /// The cluster.
    pub cluster_id: ClusterId,
    /// Its name.
    pub name: String,
    /// Its phase.
    pub phase: String,
    /// Its namespace on the platform cluster (`pc-<cluster id without dashes>`), holding its
    /// control plane and nothing of any other tenant.
    pub namespace: String,
    /// Its own Kubernetes API endpoint, once published.
    pub kubernetes_api: Option<String>,
    /// The machines it holds (live allocations), by id.
    pub machines: Vec<IsolationMachine>,
    /// Its remediations, oldest first: each failed machine swapped for a spare, where the spare
    /// came from and where the failed machine went (maintenance, never straight back to the
    /// fleet; an operator's return wipes it).
    pub remediations: Vec<crate::remediation::RemediationView>,
}

/// Evidence that a tenant's clusters run on machines no one else holds, each wiped before the
/// tenant got it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct IsolationReport {
    /// The tenant.
    pub tenant_id: TenantId,
    /// When the report was made; not part of the digest.
    pub as_of: DateTime<Utc>,
    /// Live clusters, by id.
    pub clusters: Vec<IsolationCluster>,
    /// Checked, not assumed: none of these machines is in a live allocation of anyone else (or
    /// in two live allocations), and each machine's record names this tenant as its holder.
    pub no_machine_shared: bool,
    /// Every machine has a verified preceding wipe and a verified ledger, and no machine is
    /// shared.
    pub complete: bool,
    /// The latest checkpoint paddock issued (`GET /v1/custody/checkpoint`) that these machines'
    /// ledgers were verified against: each chain must still reach its head there. Null when none
    /// was issued yet (or its signature does not check with the configured key).
    pub checkpoint: Option<CheckpointRef>,
    /// SHA-256 (hex) of the canonical JSON (RFC 8785) of this report without `digest` and
    /// `as_of`: the same state of the world gives the same digest.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub digest: String,
}

/// Names a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CheckpointRef {
    /// When it was issued.
    pub issued_at: DateTime<Utc>,
    /// The signing key's id.
    pub key_id: String,
    /// SHA-256 (hex) of the signed document (the canonical JSON of `{issued_at, machines}`).
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub digest: String,
}

/// One machine's chain head: its newest entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CustodyHead {
    /// The machine.
    pub machine_id: MachineId,
    /// The newest entry's position in the chain.
    #[schema(minimum = 1)]
    pub seq: i64,
    /// The newest entry's MAC, hex.
    #[schema(pattern = "^[0-9a-f]{64}$", min_length = 64, max_length = 64)]
    pub mac: String,
}

/// Every machine's chain head at one moment, signed with the provider's Ed25519 key, for the
/// provider to archive outside the database: a chain that no longer reaches its head here was cut
/// short or replaced by an older copy.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CustodyCheckpoint {
    /// When it was issued (part of the signed document).
    pub issued_at: DateTime<Utc>,
    /// Every machine's head, by machine id.
    pub machines: Vec<CustodyHead>,
    /// Ed25519 signature (standard base64) of the canonical JSON (RFC 8785) of
    /// `{issued_at, machines}`; the public key is at `GET /v1/usage/signing-key`.
    #[schema(max_length = 128)]
    pub signature: String,
    /// The signing key's id.
    #[schema(max_length = 64)]
    pub key_id: String,
}

/// `POST /v1/custody/verify`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"checkpoint": {"issued_at": "2026-12-01T00:00:00Z", "machines": [{"machine_id": "0193a9c4-6a10-7e55-8c3b-2f4d9e1a7b60", "seq": 42, "mac": "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"}], "signature": "2hXq6nJ1q3b2cH1mS0lQ9Yc1vR7wP4kT8eN5aD3fG6jL0oU2iZ9xV7bC4mQ1sE8rW5tY3uI6oP0aS2dF4gH7jA==", "key_id": "usage-2026"}}))]
pub struct CustodyVerify {
    /// A checkpoint as `GET /v1/custody/checkpoint` returned it.
    pub checkpoint: CustodyCheckpoint,
}

/// Whether one machine's chain still reaches its checkpointed head.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CustodyHeadVerification {
    /// The machine.
    pub machine_id: MachineId,
    /// The head the checkpoint names.
    #[schema(minimum = 1)]
    pub checkpoint_seq: i64,
    /// The chain's length now.
    #[schema(minimum = 0)]
    pub seq: i64,
    /// The entry at `checkpoint_seq` is still there, with the checkpointed MAC.
    pub reaches_checkpoint: bool,
    /// The whole chain verifies (as `GET /v1/machines/{machine_id}/custody` says).
    pub chain_verified: bool,
    /// Both: the chain is intact and was not cut short.
    pub verified: bool,
    /// The first entry that fails the chain's verification.
    pub first_bad_entry: Option<CustodyEntryId>,
    /// What is wrong, readable; null when verified.
    pub finding: Option<String>,
}

/// The answer of `POST /v1/custody/verify`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CustodyVerification {
    /// The checkpoint verified against.
    pub checkpoint: CheckpointRef,
    /// Every machine of the checkpoint verifies.
    pub verified: bool,
    /// Per machine of the checkpoint, in its order.
    pub machines: Vec<CustodyHeadVerification>,
}
