//! Machine classes: hardware profiles, readable by every role.

use paddock_domain::cursor::PageRequest;
use paddock_domain::model::MachineClass;
use paddock_domain::precondition::IfMatch;
use paddock_domain::{validate, Error, Permission, Result};
use paddock_store::machine_class;
use paddock_types::machine_class::MachineClassCreate;
use paddock_types::MachineClassId;
use serde_json::json;

use crate::{Body, Ctx, Done, Listed, Services};

const NOT_FOUND: Error = Error::NotFound { kind: "machine class" };

impl Services {
    /// Creates a class.
    pub async fn machine_class_create(&self, ctx: &Ctx, body: &Body) -> Result<MachineClass> {
        self.audited(ctx, "machine_class.create", "machine_class", async |audit| {
            ctx.actor.authorize(Permission::MachineClassWrite)?;
            let spec: MachineClassCreate = body.decode()?;
            validate::machine_class(&spec)?;
            self.acceptance_not_the_wipe_image(&spec)?;
            let id = MachineClassId::new();
            audit.target(id.uuid(), None);
            let mut tx = self.store.begin().await?;
            let value = machine_class::insert(&mut tx, id, &spec).await?;
            Ok(Done::Commit { tx, value, details: json!({ "name": spec.name }) })
        })
        .await
    }

    /// An acceptance image is a boot of its own, never the wipe image: the wipe's digest is what
    /// the ledger records as the image that wiped the machine, and one image in both roles would
    /// let a wipe report pass as an acceptance (or the reverse).
    fn acceptance_not_the_wipe_image(&self, spec: &MachineClassCreate) -> Result<()> {
        match &spec.acceptance {
            Some(a) if a.image_sha256 == self.agent.wipe_image_sha256 => Err(Error::invalid(
                "acceptance.image_sha256",
                "is the wipe image's digest (PADDOCK_WIPE_IMAGE_SHA256); an acceptance image must be another image",
            )),
            _ => Ok(()),
        }
    }

    /// Lists classes.
    pub async fn machine_class_list(&self, ctx: &Ctx, page: PageRequest) -> Result<Listed<MachineClass>> {
        ctx.actor.authorize(Permission::MachineClassRead)?;
        let mut conn = self.store.conn().await?;
        let items = machine_class::list(&mut conn, page.after, page.limit).await?;
        let next_cursor = page.next_cursor(&items, |c| c.id.uuid());
        Ok(Listed { items, next_cursor })
    }

    /// Reads one class by name.
    pub async fn machine_class_get(&self, ctx: &Ctx, name: &str) -> Result<MachineClass> {
        ctx.actor.authorize(Permission::MachineClassRead)?;
        let mut conn = self.store.conn().await?;
        machine_class::get_by_name(&mut conn, name).await?.ok_or(NOT_FOUND)
    }

    /// Applies a merge patch. The hardware fields (`cpu_cores`, `memory_gib`, `gpu_count`) cannot
    /// change while machines of the class exist: their inventory was checked against the old values.
    pub async fn machine_class_update(
        &self,
        ctx: &Ctx,
        name: &str,
        body: &Body,
        if_match: &IfMatch,
    ) -> Result<MachineClass> {
        self.audited(ctx, "machine_class.update", "machine_class", async |audit| {
            ctx.actor.authorize(Permission::MachineClassWrite)?;
            let mut tx = self.store.begin().await?;
            let current = machine_class::get_by_name_for_update(&mut tx, name).await?.ok_or(NOT_FOUND)?;
            audit.target(current.id.uuid(), None);
            if_match.check(current.generation)?;
            let patch = body.value()?;
            let spec = body.apply_patch(&current.spec, &patch, &["name"])?;
            validate::machine_class(&spec)?;
            self.acceptance_not_the_wipe_image(&spec)?;
            // A patch that changes nothing keeps the generation (and the etag), but is audited.
            if spec == current.spec {
                return Ok(Done::Commit { tx, value: current, details: json!({ "patch": patch, "changed": false }) });
            }
            let hardware_changed = (spec.cpu_cores, spec.memory_gib, spec.gpu_count)
                != (current.spec.cpu_cores, current.spec.memory_gib, current.spec.gpu_count);
            if hardware_changed && machine_class::in_use(&mut tx, current.id).await? {
                return Err(Error::conflict(
                    "machine_class_in_use",
                    "cpu_cores, memory_gib and gpu_count cannot change while machines or node pools use this class",
                ));
            }
            let value = machine_class::update_spec(&mut tx, current.id, &spec).await?;
            Ok(Done::Commit { tx, value, details: json!({ "patch": patch, "changed": true }) })
        })
        .await
    }

    /// Deletes a class; 409 while any machine or node pool (retired or deleted ones included) refers to it.
    pub async fn machine_class_delete(&self, ctx: &Ctx, name: &str, if_match: &IfMatch) -> Result<()> {
        self.audited(ctx, "machine_class.delete", "machine_class", async |audit| {
            ctx.actor.authorize(Permission::MachineClassWrite)?;
            let mut tx = self.store.begin().await?;
            let current = machine_class::get_by_name_for_update(&mut tx, name).await?.ok_or(NOT_FOUND)?;
            audit.target(current.id.uuid(), None);
            if_match.check(current.generation)?;
            if machine_class::in_use(&mut tx, current.id).await? {
                return Err(Error::conflict(
                    "machine_class_in_use",
                    "machines or node pools use this class; retire or delete them first",
                ));
            }
            machine_class::delete(&mut tx, current.id).await?;
            Ok(Done::Commit { tx, value: (), details: json!({ "name": name }) })
        })
        .await
    }
}

/// The 422 for a request naming a class that does not exist, listing the names that would do
/// (whoever may name a class may read the classes); a long catalogue is cut short.
pub(crate) async fn unknown(conn: &mut paddock_store::Conn, field: &str, name: &str) -> Result<Error> {
    const SHOWN: u32 = 20;
    let mut names = machine_class::names(conn, SHOWN + 1).await?;
    let more = if names.len() > SHOWN as usize { ", ..." } else { "" };
    names.truncate(SHOWN as usize);
    let known = if names.is_empty() {
        "there are none yet".to_owned()
    } else {
        format!("the classes are {}{more}", names.join(", "))
    };
    Ok(Error::invalid(field, format!("no machine class is named {name:?}; {known}")))
}
