//! The custody ledger (SPEC section 5) and the tenant isolation report.
//!
//! The store appends an unsealed entry in the transaction of every machine transition; the
//! services hold the ledger key and seal. [`Services::custody_seal`] seals a machine's unsealed
//! entries in the caller's transaction (the worker calls it in the transaction of each of its
//! transitions, the cluster reconciler's allocations and release starts included; enrollment in
//! its own); [`Services::custody_seal_pending`] seals, in a short transaction of its own, what was
//! left unsealed (entries written while no key was configured, and the first entry the ledger's
//! migration wrote for every machine), before the machine's job does anything else.
//! Sealing holds the machine's row lock, so it never interleaves with an append or another seal.
//!
//! Verification recomputes the chain with the key: see `paddock_domain::ledger::verify`.

use chrono::Utc;
use paddock_domain::ledger::{self, Entry, LedgerKey, Verification};
use paddock_domain::{Error, Permission, Result};
use paddock_store::{custody, machine, tenant, Conn, StoreError};
use paddock_types::custody::{
    CustodyEntryView, CustodyView, IsolationCluster, IsolationMachine, IsolationReport, IsolationWipe,
};
use paddock_types::{MachineId, TenantId};
use tracing::instrument;

use crate::{commit, Ctx, Services};

impl Services {
    /// Sets the custody ledger's HMAC key (`PADDOCK_LEDGER_KEY`). Without one, entries are still
    /// recorded but stay unsealed, and verification reports them so.
    pub fn with_ledger_key(mut self, key: LedgerKey) -> Self {
        self.ledger_key = Some(std::sync::Arc::new(key));
        self
    }

    /// Seals the machine's unsealed entries in order, in the caller's transaction (locking the
    /// machine's row); returns how many. Without a key, seals nothing.
    pub async fn custody_seal(&self, conn: &mut Conn, machine: MachineId) -> std::result::Result<usize, StoreError> {
        let Some(key) = self.ledger_key.as_deref() else {
            return Ok(0);
        };
        let Some((last_mac, pending)) = custody::pending_for_seal(conn, machine).await? else {
            return Ok(0);
        };
        for (entry, prev_mac, mac) in ledger::seal_pending(key, last_mac.as_deref(), &pending) {
            if !custody::set_mac(conn, entry.id, prev_mac.as_deref(), &mac).await? {
                // We hold the row lock: only a bug or a hand edit gets here. Refuse loudly.
                return Err(StoreError::Corrupt(format!("custody entry {} was sealed under our lock", entry.id)));
            }
        }
        Ok(pending.len())
    }

    /// Seals what transitions made without the key left unsealed, in a short transaction of its
    /// own; takes no lock when nothing waits (the common case).
    #[instrument(skip_all, fields(machine.id = %machine))]
    pub async fn custody_seal_pending(&self, machine: MachineId) -> std::result::Result<usize, StoreError> {
        if self.ledger_key.is_none() {
            return Ok(0);
        }
        {
            let mut conn = self.store.conn().await?;
            if !custody::has_unsealed(&mut conn, machine).await? {
                return Ok(0);
            }
        }
        let mut tx = self.store.begin().await?;
        let sealed = self.custody_seal(&mut tx, machine).await?;
        tx.commit().await?;
        Ok(sealed)
    }

    fn verify_chain(&self, machine: MachineId, entries: &[Entry], state: Option<&str>) -> Verification {
        match self.ledger_key.as_deref() {
            Some(key) => ledger::verify(key, machine, entries, state),
            None => Verification {
                verified: false,
                first_bad_entry: None,
                unsealed: entries.iter().filter(|e| e.mac.is_none()).count(),
                finding: Some("no ledger key is configured (PADDOCK_LEDGER_KEY): nothing can be verified".to_owned()),
            },
        }
    }

    /// A machine's custody ledger, oldest first, with the chain recomputed: provider roles only
    /// (403 before any lookup), 404 for an unknown machine (retired ones keep their ledger).
    #[instrument(skip_all, fields(machine.id = %id))]
    pub async fn machine_custody(&self, ctx: &Ctx, id: MachineId) -> Result<CustodyView> {
        ctx.actor.authorize(Permission::MachineRead)?;
        // One snapshot: the machine's state and its entries agree even while it moves.
        let mut tx = self.store.begin().await?;
        custody::read_one_snapshot(&mut tx).await?;
        let m = machine::get(&mut tx, id, false).await?.ok_or(Error::NotFound { kind: "machine" })?;
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

    /// The isolation report of a tenant: per live cluster, its namespace and API endpoint and
    /// every machine it holds with the verified wipe that preceded the allocation and the
    /// machine's ledger verification; whether any machine is shared; a digest. Tenant roles of
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
        let machines = custody::report_machines(&mut tx, tenant_id).await?;
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
            })
            .collect();
        for m in machines {
            if m.live_allocations != 1 || m.holder_tenant_id != Some(tenant_id) {
                no_machine_shared = false;
            }
            let entries = custody::entries(&mut tx, m.machine_id).await?;
            let ledger_verified = self.verify_chain(m.machine_id, &entries, Some(&m.state)).verified;
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
        let mut report =
            IsolationReport { tenant_id, as_of, clusters: views, no_machine_shared, complete, digest: String::new() };
        report.digest = report_digest(&report);
        Ok(report)
    }
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
