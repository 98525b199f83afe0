//! The custody ledger (docs/security.md), its signed checkpoints, and the tenant isolation report.
//!
//! The services hold the ledger key and hand it to every store function that moves a machine,
//! which writes the transition's entry with its MAC already computed (`paddock_store::custody`):
//! an entry is sealed by the process that wrote it, in the same transaction, and never later.
//! Verification recomputes the chain with the key: see `paddock_domain::ledger::verify`.
//!
//! A checkpoint (`GET /v1/custody/checkpoint`) is every machine's chain head signed with the
//! provider's Ed25519 key, for the provider to archive outside the database; each one issued is
//! also recorded (`custody_checkpoints`, append-only). `POST /v1/custody/verify` checks that each
//! chain still reaches its checkpointed head, so a truncated tail or a restored older copy of the
//! table is found. The isolation report verifies its machines against the latest recorded
//! checkpoint whose signature checks with the configured key: the newest head we vouched for.
//! That record lives in the database it guards, so it catches a tail cut from the ledger alone;
//! a restore of the whole database takes the record back too, and only a checkpoint archived
//! elsewhere, posted to `verify`, finds that.

use chrono::{DateTime, SubsecRound, Utc};
use paddock_domain::ledger::{self, Entry, LedgerKey, Verification};
use paddock_domain::signing::SigningKey;
use paddock_domain::{Error, Permission, Result};
use paddock_store::custody::{self, StoredCheckpoint};
use paddock_store::{machine, remediation, tenant, Conn};
use paddock_types::custody::{
    CheckpointRef, CustodyCheckpoint, CustodyEntryView, CustodyHead, CustodyHeadVerification, CustodyVerification,
    CustodyVerify, CustodyView, IsolationCluster, IsolationMachine, IsolationReport, IsolationWipe,
};
use paddock_types::{ClusterId, MachineId, TenantId};
use serde_json::{json, Value};
use tracing::instrument;

use crate::audit::Done;
use crate::chain_cache::Basis;
use crate::{commit, Body, Ctx, Services};

impl Services {
    /// The custody ledger's HMAC key, for the store functions that record transitions.
    pub fn ledger_key(&self) -> &LedgerKey {
        &self.ledger_key
    }

    fn verify_chain(&self, machine: MachineId, entries: &[Entry], state: Option<&str>) -> Verification {
        ledger::verify(&self.ledger_key, machine, entries, state)
    }

    fn checkpoint_key(&self) -> Result<&SigningKey> {
        self.signing_key().map(|k| &**k).ok_or_else(|| {
            Error::conflict(
                "signing_key_missing",
                "no signing key is configured (PADDOCK_USAGE_SIGNING_KEY): checkpoints cannot be signed or checked",
            )
        })
    }

    /// Every machine's chain head, signed, and recorded as issued (audited): provider roles only.
    #[instrument(skip_all)]
    pub async fn custody_checkpoint(&self, ctx: &Ctx) -> Result<CustodyCheckpoint> {
        self.audited(ctx, "custody.checkpoint", "custody", async |_| {
            ctx.actor.authorize(Permission::MachineRead)?;
            let key = self.checkpoint_key()?;
            // Whole microseconds, as the database keeps `issued_at`.
            let issued_at = Utc::now().trunc_subsecs(6);
            let mut tx = self.store.begin().await?;
            let machines: Vec<CustodyHead> = custody::heads(&mut tx)
                .await?
                .into_iter()
                // A head without a MAC is a row paddock did not write: verification finds it, and a
                // checkpoint vouches only for what paddock wrote, so such a head is left out.
                .filter_map(|(machine_id, seq, mac)| mac.map(|m| CustodyHead { machine_id, seq, mac: hex::encode(m) }))
                .collect();
            // No head moved since the latest checkpoint we issued: it still names every head, and
            // is the answer (a read records no row; a checkpoint is issued when the ledger moved).
            if let Some((latest, name)) = self.latest_checkpoint(&mut tx).await? {
                if latest.machines == machines {
                    let details = json!({ "digest": name.digest, "machines": machines.len(), "issued": false });
                    return Ok(Done::Commit { tx, value: latest, details });
                }
            }
            let document = checkpoint_document(issued_at, &machines);
            let signature = key.sign(&document);
            let details = json!({ "digest": ledger::digest(&document), "machines": machines.len(), "issued": true });
            let stored =
                StoredCheckpoint { document, signature: signature.signature.clone(), key_id: signature.key_id.clone() };
            custody::checkpoint_insert(&mut tx, issued_at, &stored).await?;
            let value =
                CustodyCheckpoint { issued_at, machines, signature: signature.signature, key_id: signature.key_id };
            Ok(Done::Commit { tx, value, details })
        })
        .await
    }

    /// Whether each machine of a checkpoint still reaches its checkpointed head, with its whole
    /// chain verified (audited): provider roles only; a checkpoint not signed by our key is 422.
    #[instrument(skip_all)]
    pub async fn custody_verify(&self, ctx: &Ctx, body: &Body) -> Result<CustodyVerification> {
        self.audited(ctx, "custody.verify", "custody", async |_| {
            ctx.actor.authorize(Permission::MachineRead)?;
            let key = self.checkpoint_key()?;
            let CustodyVerify { checkpoint } = body.decode()?;
            let document = checkpoint_document(checkpoint.issued_at, &checkpoint.machines);
            if !signed_by(key, &document, &checkpoint.key_id, &checkpoint.signature) {
                return Err(Error::invalid(
                    "checkpoint.signature",
                    "the checkpoint is not signed by this paddock's key",
                ));
            }
            let mut tx = self.store.begin().await?;
            // One snapshot: each machine's state and entries agree even while it moves.
            custody::one_snapshot(&mut tx).await?;
            let mut machines = Vec::with_capacity(checkpoint.machines.len());
            for head in &checkpoint.machines {
                machines.push(self.verify_head(&mut tx, head).await?);
            }
            let verification = CustodyVerification {
                checkpoint: checkpoint_ref(&document, checkpoint.issued_at, &checkpoint.key_id),
                verified: machines.iter().all(|m| m.verified),
                machines,
            };
            let details = json!({ "digest": verification.checkpoint.digest, "verified": verification.verified });
            Ok(Done::Commit { tx, value: verification, details })
        })
        .await
    }

    async fn verify_head(&self, conn: &mut Conn, head: &CustodyHead) -> Result<CustodyHeadVerification> {
        let state = machine::get(conn, head.machine_id).await?.map(|m| m.state);
        let entries = custody::entries(conn, head.machine_id).await?;
        let chain = self.verify_chain(head.machine_id, &entries, state.map(|s| s.as_str()));
        // The signature covered the MAC's text: one that is not hex cannot be any entry's.
        let reached = hex::decode(&head.mac)
            .map_err(|_| "the checkpointed MAC is not hex".to_owned())
            .and_then(|mac| ledger::reaches(&entries, head.seq, &mac));
        let finding = match (&reached, &chain.finding) {
            (Err(f), _) | (Ok(()), Some(f)) => Some(f.clone()),
            (Ok(()), None) => None,
        };
        Ok(CustodyHeadVerification {
            machine_id: head.machine_id,
            checkpoint_seq: head.seq,
            seq: i64::try_from(entries.len()).unwrap_or(i64::MAX),
            reaches_checkpoint: reached.is_ok(),
            chain_verified: chain.verified,
            verified: reached.is_ok() && chain.verified,
            first_bad_entry: chain.first_bad_entry,
            finding,
        })
    }

    /// Whether `machine`'s chain verifies, in its state and against the checkpointed head of
    /// `basis`: the verdict reached on the same basis before, else a full verification (`chain_cache`).
    async fn chain_verified(&self, conn: &mut Conn, machine: MachineId, basis: Basis) -> Result<bool> {
        if let Some(verified) = self.chains.get(machine, &basis) {
            return Ok(verified);
        }
        let entries = custody::entries(conn, machine).await?;
        let verified = self.verify_chain(machine, &entries, Some(&basis.state)).verified
            && basis.checkpoint.as_ref().is_none_or(|h| reaches_head(&entries, h));
        self.chains.put(machine, basis, verified);
        Ok(verified)
    }

    /// The latest recorded checkpoint signed by our key, and its name.
    async fn latest_checkpoint(&self, conn: &mut Conn) -> Result<Option<(CustodyCheckpoint, CheckpointRef)>> {
        let Some(key) = self.signing_key() else { return Ok(None) };
        let Some(stored) = custody::checkpoint_latest(conn, key.key_id()).await? else {
            return Ok(None);
        };
        // A row someone inserted without our key names nothing we vouched for.
        if !signed_by(key, &stored.document, &stored.key_id, &stored.signature) {
            return Ok(None);
        }
        let parsed: std::result::Result<(DateTime<Utc>, Vec<CustodyHead>), _> =
            serde_json::from_value(json!([stored.document["issued_at"], stored.document["machines"]]));
        let (issued_at, machines) = parsed.map_err(Error::internal)?;
        let name = checkpoint_ref(&stored.document, issued_at, &stored.key_id);
        Ok(Some((CustodyCheckpoint { issued_at, machines, signature: stored.signature, key_id: stored.key_id }, name)))
    }

    /// A machine's custody ledger, oldest first, with the chain recomputed: provider roles only
    /// (403 before any lookup), 404 for an unknown machine (retired ones keep their ledger).
    #[instrument(skip_all, fields(machine.id = %id))]
    pub async fn machine_custody(&self, ctx: &Ctx, id: MachineId) -> Result<CustodyView> {
        ctx.actor.authorize(Permission::MachineRead)?;
        // One snapshot: the machine's state and its entries agree even while it moves.
        let mut tx = self.store.begin().await?;
        custody::read_one_snapshot(&mut tx).await?;
        let m = machine::get(&mut tx, id).await?.ok_or(Error::NotFound { kind: "machine" })?;
        let entries = custody::entries(&mut tx, id).await?;
        commit(tx).await?;
        let v = self.verify_chain(id, &entries, Some(m.state.as_str()));
        Ok(CustodyView {
            machine_id: id,
            items: entries.into_iter().map(entry_view).collect(),
            verified: v.verified,
            first_bad_entry: v.first_bad_entry,
            unsealed: u64::try_from(v.unsealed).unwrap_or(u64::MAX),
            finding: v.finding,
        })
    }

    /// The isolation report of a tenant: per live cluster, its namespace and API endpoint,
    /// every machine it holds with the verified wipe that preceded the allocation and the
    /// machine's ledger verification, and its remediations; whether any machine is shared; a digest. Tenant roles of
    /// that tenant and provider admins/operators; a foreign or unknown tenant is 404.
    #[instrument(skip_all, fields(tenant.id = %tenant_id))]
    pub async fn isolation_report(&self, ctx: &Ctx, tenant_id: TenantId) -> Result<IsolationReport> {
        ctx.actor.authorize_tenant(Permission::ClusterRead, tenant_id, "tenant")?;
        let as_of = Utc::now();
        // One snapshot for every read, so the report is consistent with itself.
        let mut tx = self.store.begin().await?;
        custody::read_one_snapshot(&mut tx).await?;
        tenant::get(&mut tx, tenant_id).await?.ok_or(Error::NotFound { kind: "tenant" })?;
        let clusters = custody::report_clusters(&mut tx, tenant_id).await?;
        let cluster_ids: Vec<ClusterId> = clusters.iter().map(|c| c.id).collect();
        let remediations = remediation::of_clusters(&mut tx, tenant_id, &cluster_ids).await?;
        let machines = custody::report_machines(&mut tx, tenant_id).await?;
        let checkpoint = self.latest_checkpoint(&mut tx).await?;
        let ids: Vec<MachineId> = machines.iter().map(|m| m.machine_id).collect();
        let fingerprints = custody::chain_fingerprints(&mut tx, &ids).await?;
        let mut no_machine_shared = true;
        let mut views: Vec<IsolationCluster> = clusters
            .into_iter()
            .map(|c| IsolationCluster {
                cluster_id: c.id,
                name: c.name,
                phase: c.phase,
                // The name paddock-kube gives the cluster's namespace (`isolation::namespace_name`).
                namespace: format!("pc-{}", c.id.uuid().simple()),
                kubernetes_api: c.kubernetes_api,
                machines: Vec::new(),
                remediations: remediations.iter().filter(|r| r.cluster_id == c.id).cloned().collect(),
            })
            .collect();
        for m in machines {
            if m.live_allocations != 1 || m.holder_tenant_id != Some(tenant_id) {
                no_machine_shared = false;
            }
            let head = checkpoint.as_ref().and_then(|(c, _)| c.machines.iter().find(|h| h.machine_id == m.machine_id));
            let basis = Basis {
                fingerprint: fingerprints.get(&m.machine_id).cloned().unwrap_or_default(),
                state: m.state.clone(),
                checkpoint: head.cloned(),
            };
            let ledger_verified = self.chain_verified(&mut tx, m.machine_id, basis).await?;
            let wipe = m.clean.as_ref().map(|(method, run_id, completed_at)| IsolationWipe {
                clean_id: m.clean_id,
                method: method.clone(),
                run_id: *run_id,
                completed_at: *completed_at,
            });
            let wipe_verified = wipe.as_ref().is_some_and(|w| w.completed_at <= m.allocated_at) && !m.tenancy_between;
            let view = IsolationMachine {
                machine_id: m.machine_id,
                name: m.name,
                state: m.state,
                node_pool_id: m.node_pool_id,
                node_name: m.node_name,
                allocation_id: m.allocation_id,
                allocated_at: m.allocated_at,
                wipe,
                wipe_verified,
                ledger_verified,
            };
            // Rows come by cluster then machine id, so each cluster's list stays sorted.
            if let Some(c) = views.iter_mut().find(|c| c.cluster_id == m.cluster_id) {
                c.machines.push(view);
            }
        }
        commit(tx).await?;
        let complete =
            no_machine_shared && views.iter().flat_map(|c| &c.machines).all(|m| m.wipe_verified && m.ledger_verified);
        let mut report = IsolationReport {
            tenant_id,
            as_of,
            clusters: views,
            no_machine_shared,
            complete,
            checkpoint: checkpoint.map(|(_, name)| name),
            digest: String::new(),
        };
        report.digest = report_digest(&report);
        Ok(report)
    }
}

/// What a checkpoint's signature covers: `{issued_at, machines}` as the wire carries them.
fn checkpoint_document(issued_at: DateTime<Utc>, machines: &[CustodyHead]) -> Value {
    json!({ "issued_at": issued_at, "machines": machines })
}

/// Whether `signature` of `document` was made by `key` (and names it).
fn signed_by(key: &SigningKey, document: &Value, key_id: &str, signature: &str) -> bool {
    key_id == key.key_id() && key.verifies(document, signature)
}

fn checkpoint_ref(document: &Value, issued_at: DateTime<Utc>, key_id: &str) -> CheckpointRef {
    CheckpointRef { issued_at, key_id: key_id.to_owned(), digest: ledger::digest(document) }
}

fn reaches_head(entries: &[Entry], head: &CustodyHead) -> bool {
    hex::decode(&head.mac).is_ok_and(|mac| ledger::reaches(entries, head.seq, &mac).is_ok())
}

/// The digest of a report: its canonical JSON without `digest` and `as_of`.
pub fn report_digest(report: &IsolationReport) -> String {
    let mut value = serde_json::to_value(report).unwrap_or_default();
    if let Some(object) = value.as_object_mut() {
        object.remove("digest");
        object.remove("as_of");
    }
    ledger::digest(&value)
}

fn entry_view(e: Entry) -> CustodyEntryView {
    CustodyEntryView {
        id: e.id,
        machine_id: e.machine_id,
        seq: e.seq,
        at: e.at,
        actor: e.actor,
        from: e.from,
        to: e.to,
        reason: e.reason,
        evidence: e.evidence,
        prev_mac: e.prev_mac.map(hex::encode),
        mac: e.mac.map(hex::encode),
    }
}
