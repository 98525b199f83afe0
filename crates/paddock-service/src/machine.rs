//! Machines: enrollment, inventory reads, BMC credential changes, maintenance and retirement.
//! The BMC password is sealed (bound to the machine's row) before it reaches the store and is
//! never returned. Changes the worker carries out answer with a pending operation; until the
//! worker acts, the machine record carries the operator's intent.

use paddock_domain::cursor::PageRequest;
use paddock_domain::machine::{holds_tenancy, DUPLICATE_SYSTEM, RETIRABLE};
use paddock_domain::model::{Bmc, Machine};
use paddock_domain::precondition::IfMatch;
use paddock_domain::secret::Binding;
use paddock_domain::validate::{self, Checks};
use paddock_domain::{Error, Permission, Result};
use paddock_store::machine::{self as store, NewMachine};
use paddock_store::{custody, machine_class, Conn, Tx};
use paddock_types::machine::MachineFilter;
use paddock_types::machine::{MachineEnroll, MachineForceRelease, MachineState, MaintenanceEnter};
use paddock_types::operation::OperationView;
use paddock_types::{Labels, MachineId};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::operation::{accept, Accepted, Target};
use crate::{Body, Ctx, Done, Listed, Services};

const NOT_FOUND: Error = Error::NotFound { kind: "machine" };

/// A machine and, for asynchronous changes, the operation that carries the change out.
#[derive(Debug)]
pub struct MachineChange {
    /// The machine as it is now.
    pub machine: Machine,
    /// The operation; `None` for a synchronous change (labels only).
    pub operation: Option<OperationView>,
}

/// What a merge patch may change: labels and BMC access (the password is handled apart, as it is
/// never read back).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MachineSpec {
    #[serde(default)]
    labels: Labels,
    bmc: BmcSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BmcSpec {
    url: String,
    #[serde(default)]
    system_id: Option<String>,
    username: String,
    #[serde(default)]
    ca_cert: Option<String>,
    #[serde(default)]
    insecure_tls: bool,
    #[serde(default)]
    allow_insecure_http: bool,
}

fn password_binding(id: MachineId) -> Binding<'static> {
    Binding { table: "machines", column: "bmc_password_enc", row: id.uuid() }
}

impl Services {
    /// Enrolls a machine: recorded in `enrolling`, with a pending `machine_enroll` operation.
    pub async fn machine_enroll(&self, ctx: &Ctx, body: &Body) -> Result<MachineChange> {
        self.audited(ctx, "machine.enroll", "machine", async |audit| {
            ctx.actor.authorize(Permission::MachineWrite)?;
            let spec: MachineEnroll = body.decode()?;
            validate::machine_enroll(&spec)?;
            let id = MachineId::new();
            audit.target(id.uuid(), None);
            let mut tx = self.store.begin().await?;
            let Some(class) = machine_class::get_by_name(&mut tx, &spec.machine_class).await? else {
                return Err(crate::machine_class::unknown(&mut tx, "machine_class", &spec.machine_class).await?);
            };
            let bmc = Bmc {
                url: spec.bmc.url.clone(),
                system_id: spec.bmc.system_id.clone(),
                username: spec.bmc.username.clone(),
                password_enc: self
                    .cipher
                    .seal(spec.bmc.password.as_bytes(), password_binding(id))
                    .map_err(Error::internal)?,
                ca_cert: spec.bmc.ca_cert.clone(),
                insecure_tls: spec.bmc.insecure_tls,
                allow_insecure_http: spec.bmc.allow_insecure_http,
            };
            let new = NewMachine { id, name: &spec.name, machine_class_id: class.id, labels: &spec.labels, bmc: &bmc };
            store::insert(&mut tx, &new).await?;
            let details = json!({ "name": spec.name, "machine_class": spec.machine_class, "bmc_url": spec.bmc.url });
            // The ledger's first entry, sealed as it is written, in the enrollment's transaction.
            let evidence = json!({
                "name": spec.name, "machine_class": spec.machine_class, "bmc_url": spec.bmc.url,
                "request_id": ctx.request_id,
            });
            let (to, reason) = (MachineState::Enrolling, "enrolled");
            let key = self.ledger_key();
            custody::append(&mut tx, key, id, None, to, &ctx.actor.subject, reason, &evidence).await?;
            changed(tx, id, 1, "machine_enroll", &[], details).await
        })
        .await
    }

    /// Lists machines, filtered.
    pub async fn machine_list(&self, ctx: &Ctx, filter: &MachineFilter, page: PageRequest) -> Result<Listed<Machine>> {
        ctx.actor.authorize(Permission::MachineRead)?;
        let mut conn = self.store.conn().await?;
        let items = store::list(&mut conn, filter, page.after, page.limit).await?;
        let next_cursor = page.next_cursor(&items, |m| m.id.uuid());
        Ok(Listed { items, next_cursor })
    }

    /// Reads one machine.
    pub async fn machine_get(&self, ctx: &Ctx, id: MachineId) -> Result<Machine> {
        ctx.actor.authorize(Permission::MachineRead)?;
        let mut conn = self.store.conn().await?;
        store::get(&mut conn, id).await?.ok_or(NOT_FOUND)
    }

    /// Applies a merge patch to labels and BMC access. A BMC change is carried out by the worker
    /// (a `machine_update_credentials` operation); a labels-only change is synchronous.
    pub async fn machine_update(
        &self,
        ctx: &Ctx,
        id: MachineId,
        body: &Body,
        if_match: &IfMatch,
    ) -> Result<MachineChange> {
        self.audited(ctx, "machine.update", "machine", async |audit| {
            audit.target(id.uuid(), None);
            ctx.actor.authorize(Permission::MachineWrite)?;
            let mut tx = self.store.begin().await?;
            let current = self.machine_for_change(&mut tx, id).await?;
            if_match.check(current.generation)?;
            let mut patch = body.value()?;
            let password = take_password(&mut patch)?;
            let before = MachineSpec {
                labels: current.labels.clone(),
                bmc: BmcSpec {
                    url: current.bmc.url.clone(),
                    system_id: current.bmc.system_id.clone(),
                    username: current.bmc.username.clone(),
                    ca_cert: current.bmc.ca_cert.clone(),
                    insecure_tls: current.bmc.insecure_tls,
                    allow_insecure_http: current.bmc.allow_insecure_http,
                },
            };
            let after: MachineSpec = body.apply_patch(&before, &patch, &[])?;
            let mut c = Checks::new();
            c.labels("labels", &after.labels);
            let b = &after.bmc;
            let access = validate::BmcAccess {
                url: &b.url,
                system_id: b.system_id.as_deref(),
                username: &b.username,
                ca_cert: b.ca_cert.as_deref(),
                insecure_tls: b.insecure_tls,
                allow_insecure_http: b.allow_insecure_http,
            };
            validate::bmc_access(&mut c, &access);
            if let Some(password) = &password {
                c.text("bmc.password", password, 1024);
            }
            c.finish()?;
            let bmc_changed = after.bmc != before.bmc || password.is_some();
            if !bmc_changed && after.labels == before.labels {
                // Nothing changes: same generation and etag, but the call is audited.
                let value = MachineChange { machine: current, operation: None };
                return Ok(Done::Commit { tx, value, details: json!({ "patch": patch, "changed": false }) });
            }
            let bmc = Bmc {
                url: after.bmc.url.clone(),
                system_id: after.bmc.system_id.clone(),
                username: after.bmc.username.clone(),
                password_enc: match &password {
                    Some(p) => self.cipher.seal(p.as_bytes(), password_binding(id)).map_err(Error::internal)?,
                    None => current.bmc.password_enc.clone(),
                },
                ca_cert: after.bmc.ca_cert.clone(),
                insecure_tls: after.bmc.insecure_tls,
                allow_insecure_http: after.bmc.allow_insecure_http,
            };
            store::update_spec(&mut tx, id, &after.labels, &bmc).await?;
            // The patch is recorded without the password: only that one was given.
            let details = json!({ "patch": patch, "password_changed": password.is_some() });
            if bmc_changed {
                return changed(tx, id, current.generation + 1, "machine_update_credentials", &[], details).await;
            }
            let machine = store::get(&mut tx, id).await?.ok_or(NOT_FOUND)?;
            Ok(Done::Commit { tx, value: MachineChange { machine, operation: None }, details })
        })
        .await
    }

    /// Takes a machine out of service (any state but retired); the worker releases a machine that
    /// holds a tenancy first. 409 when it is already in (or on its way to) maintenance.
    pub async fn machine_maintenance_enter(&self, ctx: &Ctx, id: MachineId, body: &Body) -> Result<MachineChange> {
        self.audited(ctx, "machine.maintenance_enter", "machine", async |audit| {
            audit.target(id.uuid(), None);
            ctx.actor.authorize(Permission::MachineWrite)?;
            let mut tx = self.store.begin().await?;
            let current = self.machine_for_change(&mut tx, id).await?;
            if current.state == MachineState::Maintenance || current.maintenance_reason.is_some() {
                return Err(Error::conflict(
                    "already_in_maintenance",
                    "the machine is already in maintenance or entering it",
                ));
            }
            let request: MaintenanceEnter = body.decode()?;
            let mut c = Checks::new();
            c.text("reason", request.reason.trim(), 1000);
            c.finish()?;
            store::set_maintenance_intent(&mut tx, id, Some(request.reason.trim())).await?;
            let details = json!({ "reason": request.reason.trim(), "state": current.state.as_str() });
            let kind = "machine_maintenance_enter";
            changed(tx, id, current.generation + 1, kind, &["machine_maintenance_leave"], details).await
        })
        .await
    }

    /// Returns a machine from maintenance; it always leaves through cleaning. A machine still
    /// on its way into maintenance has that request cancelled.
    pub async fn machine_maintenance_leave(&self, ctx: &Ctx, id: MachineId) -> Result<MachineChange> {
        self.audited(ctx, "machine.maintenance_leave", "machine", async |audit| {
            audit.target(id.uuid(), None);
            ctx.actor.authorize(Permission::MachineWrite)?;
            let mut tx = self.store.begin().await?;
            let current = self.machine_for_change(&mut tx, id).await?;
            if current.state != MachineState::Maintenance && current.maintenance_reason.is_none() {
                return Err(Error::conflict("not_in_maintenance", "the machine is not in maintenance"));
            }
            store::set_maintenance_intent(&mut tx, id, None).await?;
            let details = json!({ "state": current.state.as_str() });
            let kind = "machine_maintenance_leave";
            changed(tx, id, current.generation + 1, kind, &["machine_maintenance_enter"], details).await
        })
        .await
    }

    /// Forces the release of a machine's tenancy at once (docs/api.md, docs/security.md): 409 unless the
    /// machine holds a tenancy, or while a forced release is already pending; the worker then
    /// records the forcing (billing stops there), powers the machine off, deletes its Node best
    /// effort and sends it to cleaning.
    pub async fn machine_force_release(&self, ctx: &Ctx, id: MachineId, body: &Body) -> Result<MachineChange> {
        self.audited(ctx, "machine.force_release", "machine", async |audit| {
            audit.target(id.uuid(), None);
            ctx.actor.authorize(Permission::MachineWrite)?;
            let mut tx = self.store.begin().await?;
            let current = self.machine_for_change(&mut tx, id).await?;
            if !holds_tenancy(current.state) {
                return Err(Error::conflict(
                    "machine_not_in_tenancy",
                    format!(
                        "a machine in state {} holds no tenancy to release; only allocated, provisioning, active, \
                         releasing or provision_failed",
                        current.state.as_str()
                    ),
                ));
            }
            if current.force_release_reason.is_some() {
                return Err(Error::conflict("force_release_pending", "the machine's release is already being forced"));
            }
            let request: MachineForceRelease = body.decode()?;
            let mut c = Checks::new();
            c.text("reason", request.reason.trim(), 1000);
            c.finish()?;
            store::set_force_release_intent(&mut tx, id, request.reason.trim(), &ctx.actor.subject).await?;
            let details = json!({
                "reason": request.reason.trim(), "state": current.state.as_str(), "tenant_id": current.tenant_id,
                "cluster_id": current.cluster_id,
            });
            changed(tx, id, current.generation + 1, "machine_force_release", &[], details).await
        })
        .await
    }

    /// Retires a machine: only from `available`, `maintenance` or `clean_failed`, or a duplicate
    /// record of a server enrolled already (`duplicate_system`) from wherever inspection stopped it.
    pub async fn machine_retire(&self, ctx: &Ctx, id: MachineId, if_match: &IfMatch) -> Result<MachineChange> {
        self.audited(ctx, "machine.retire", "machine", async |audit| {
            audit.target(id.uuid(), None);
            ctx.actor.authorize(Permission::MachineWrite)?;
            let mut tx = self.store.begin().await?;
            let current = self.machine_for_retire(&mut tx, id).await?;
            if_match.check(current.generation)?;
            // A duplicate record (`duplicate_system`) retires from where inspection stopped it.
            if !RETIRABLE.contains(&current.state) && current.duplicate_of.is_none() {
                return Err(Error::conflict(
                    "machine_busy",
                    format!(
                        "a machine in state {} cannot be retired; only available, maintenance or clean_failed",
                        current.state.as_str()
                    ),
                ));
            }
            if store::retire_requested(&mut tx, id).await? {
                return Err(Error::conflict("retire_pending", "the machine is already being retired"));
            }
            store::set_retire_intent(&mut tx, id).await?;
            let details = json!({ "state": current.state.as_str() });
            changed(tx, id, current.generation + 1, "machine_retire", &[], details).await
        })
        .await
    }

    /// Locks a machine for a change; a retired one takes no more changes, and a duplicate record
    /// of a server enrolled already takes none but retirement.
    async fn machine_for_change(&self, conn: &mut Conn, id: MachineId) -> Result<Machine> {
        let machine = self.machine_for_retire(conn, id).await?;
        if let Some(holder) = machine.duplicate_of {
            return Err(Error::conflict(
                DUPLICATE_SYSTEM,
                format!(
                    "the machine's server is enrolled already as machine {holder}; this record can only be retired"
                ),
            ));
        }
        Ok(machine)
    }

    /// Locks a machine for its retirement; a retired one takes no more changes.
    async fn machine_for_retire(&self, conn: &mut Conn, id: MachineId) -> Result<Machine> {
        let machine = store::get_for_update(conn, id).await?.ok_or(NOT_FOUND)?;
        if machine.state == MachineState::Retired {
            return Err(Error::conflict("machine_retired", "the machine is retired"));
        }
        Ok(machine)
    }
}

/// Pulls `bmc.password` out of a machine patch: it is sealed, never merged or recorded.
fn take_password(patch: &mut Value) -> Result<Option<String>> {
    let Some(bmc) = patch.get_mut("bmc").and_then(Value::as_object_mut) else {
        return Ok(None);
    };
    match bmc.remove("password") {
        None => Ok(None),
        Some(Value::String(p)) => Ok(Some(p)),
        Some(Value::Null) => Err(Error::invalid("bmc.password", "cannot be removed; give a new password")),
        Some(_) => Err(Error::invalid("bmc.password", "must be a string")),
    }
}

/// Ends an accepted machine change (202): its operation of `kind` for `generation` and the
/// machine's reconcile job reporting to it, in the write's transaction, and the machine as it is now.
async fn changed(
    mut tx: Tx,
    id: MachineId,
    generation: i64,
    kind: &str,
    supersedes: &[&str],
    details: Value,
) -> Result<Done<MachineChange>> {
    let change = Accepted { kind, generation, supersedes, reconcile: true };
    let operation = accept(&mut tx, Target::Machine(id), change).await?;
    let machine = store::get(&mut tx, id).await?.ok_or(NOT_FOUND)?;
    Ok(Done::Commit { tx, value: MachineChange { machine, operation: Some(operation) }, details })
}
