//! Enrolling and inspecting: the BMC's inventory recorded and checked against the class.

use paddock_domain::bmc::{check_against_class, inventory_json, BmcDriver, Inventory};
use paddock_domain::model::Machine;
use paddock_store::operation::step::{INSPECT, RECORD_INVENTORY};
use paddock_store::{machine, machine_class, Conn, StoreError};
use paddock_types::machine::MachineState;
use paddock_types::operation::OperationState;

use super::{MachineReconciler, Step};

impl MachineReconciler {
    /// Reads the BMC (no connection held meanwhile), records the inventory, then moves on, every
    /// write guarded on the state and status version read before.
    pub(super) async fn inspect(&self, bmc: &dyn BmcDriver, m: &Machine) -> Step {
        let access = match self.access(m) {
            Ok(a) => a,
            Err(step) => return step,
        };
        let inventory = match bmc.inspect(&access).await {
            Ok(inv) => inv,
            Err(e) => return self.bmc_failed(m, e).await,
        };
        let read = [(INSPECT, OperationState::Succeeded), (RECORD_INVENTORY, OperationState::Running)];
        let result = async {
            self.report(m, &read).await?;
            let mut conn = self.services.store().conn().await?;
            self.record_inspection(&mut conn, m, &inventory).await
        }
        .await;
        // Whether it moved or lost a race, the next step reads the machine again.
        result.map_or_else(Step::from, |()| Step::Again)
    }

    /// What inspection found, against the machine's class: the inventory recorded (if it
    /// changed), `enrolling` -> `inspecting`, then `cleaning`, or `maintenance` with the reason
    /// the machine does not match its class or answers with another system's UUID. A lost race
    /// (a guarded write that matched nothing) stops the walk.
    async fn record_inspection(&self, conn: &mut Conn, m: &Machine, inventory: &Inventory) -> Result<(), StoreError> {
        let key = self.services.ledger_key();
        let Some(class) = machine_class::get_by_name(conn, &m.machine_class).await? else {
            // The class is restricted from deletion while in use: a race at most.
            return Ok(());
        };
        // A machine that already went through enrolling knows its UUID: another system
        // answering now is a contradiction, never something to overwrite silently.
        if let Some(known) = m.system_uuid.as_deref().filter(|_| m.state == MachineState::Inspecting) {
            if !known.eq_ignore_ascii_case(&inventory.system_uuid) {
                let reason = format!(
                    "the BMC now reports system UUID {} but inspection recorded {known}",
                    inventory.system_uuid
                );
                let to = MachineState::Maintenance;
                machine::advance(conn, key, m.id, m.state, m.status_version, to, Some(&reason)).await?;
                return Ok(());
            }
        }
        // The same server enrolled twice (another URL for its BMC, its system named by `Id` once
        // and by `UUID` once): the record that holds the UUID keeps it, this one stops here,
        // before anything powers or wipes the server the UUID check would let it reach.
        let holds = m.system_uuid.as_deref().is_some_and(|known| known.eq_ignore_ascii_case(&inventory.system_uuid));
        if !holds {
            if let Some((holder, name)) = machine::system_uuid_holder(conn, m.id, &inventory.system_uuid).await? {
                let uuid = &inventory.system_uuid;
                machine::mark_duplicate(conn, key, m.id, m.state, m.status_version, (holder, &name), uuid).await?;
                return Ok(());
            }
        }
        let verdict = check_against_class(inventory, &class.spec);
        let json = inventory_json(inventory, &verdict);
        let (mut state, mut version) = (m.state, m.status_version);
        if m.system_uuid.as_deref() != Some(inventory.system_uuid.as_str()) || m.inventory != json {
            match machine::set_inventory(conn, m.id, state, version, &inventory.system_uuid, &json).await {
                Ok(true) => version += 1,
                // A lost race, or another record inspected the same server at the same moment and
                // took the UUID first (the unique index): the next step reads again and sees it.
                Ok(false) => return Ok(()),
                Err(StoreError::Unique { constraint, .. }) if constraint == machine::SYSTEM_UUID_KEY => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        if state == MachineState::Enrolling {
            if !machine::advance(conn, key, m.id, state, version, MachineState::Inspecting, None).await? {
                return Ok(());
            }
            (state, version) = (MachineState::Inspecting, version + 1);
        }
        let reason = verdict.maintenance_reason();
        let to = if reason.is_some() { MachineState::Maintenance } else { MachineState::Cleaning };
        machine::advance(conn, key, m.id, state, version, to, reason.as_deref()).await?;
        Ok(())
    }
}
