//! One-time boot override against the emulator.

use paddock_redfish::{BootTarget, ChangeOutcome, RedfishClient};

use crate::require;
use crate::support::emulators;

#[tokio::test]
async fn boot_once_sets_the_target() {
    let emu = require!(emulators());
    let raw = emu.raw();
    let node = raw.node("node-001").await;
    let client = RedfishClient::new(emu.config(Some(&node.uuid))).expect("client");
    let expected = node.system_uuid();
    for target in [BootTarget::Cd, BootTarget::Pxe, BootTarget::Hdd, BootTarget::Cd] {
        // sushy-tools reads back `Continuous` after `Once`, so every call sends the PATCH again.
        let outcome = client.set_boot_once(&expected, target).await.expect("boot once");
        assert_eq!(outcome, ChangeOutcome::Applied);
        assert_eq!(raw.system(&node).await["Boot"]["BootSourceOverrideTarget"], target.as_str());
    }
    let inv = client.system().await.expect("system");
    assert_eq!(inv.boot.and_then(|b| b.target).as_deref(), Some("Cd"));
}
