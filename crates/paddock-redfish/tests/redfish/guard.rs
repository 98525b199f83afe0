//! The UUID guard: no destructive request reaches a BMC whose system is not the recorded one.

use paddock_redfish::{BootTarget, PowerState, RedfishClient, RedfishError, SystemUuid};

use crate::require;
use crate::support::emulators;
use crate::support::images::ImageServer;
use crate::support::proxy::FaultProxy;

#[tokio::test]
async fn uuid_mismatch_refuses_every_destructive_call() {
    let emu = require!(emulators());
    let images = ImageServer::start().await;
    let raw = emu.raw();
    let node = raw.node("node-003").await;
    let before = (raw.system(&node).await, raw.cd(&node).await);
    let proxy = FaultProxy::start(&emu.url).await;
    let client = RedfishClient::new(emu.config_at(&proxy.url, Some(&node.uuid))).expect("client");
    // The machine record says another system (e.g. the BMC was re-cabled or the address reused).
    let recorded = raw.node("node-004").await.system_uuid();

    let mismatch = |r: Result<_, RedfishError>| match r {
        Err(e @ RedfishError::UuidMismatch { .. }) => {
            assert!(!e.is_transient());
            assert_eq!(e.code(), "bmc_uuid_mismatch");
        }
        other => panic!("expected UuidMismatch, got {other:?}"),
    };
    mismatch(client.ensure_uuid(&recorded).await);
    mismatch(client.power(&recorded, PowerState::On).await.map(drop));
    mismatch(client.power(&recorded, PowerState::Off).await.map(drop));
    mismatch(client.set_boot_once(&recorded, BootTarget::Pxe).await.map(drop));
    mismatch(client.insert_media(&recorded, "Cd", &images.url("wipe.iso")).await.map(drop));
    mismatch(client.eject_media(&recorded, "Cd").await.map(drop));

    // Nothing but reads went out, and the emulator's state is as it was.
    assert_eq!(proxy.changes().len(), 0, "{:?}", proxy.changes());
    let after = (raw.system(&node).await, raw.cd(&node).await);
    for field in ["PowerState", "Boot"] {
        assert_eq!(after.0[field], before.0[field], "{field}");
    }
    assert_eq!(after.1["Inserted"], before.1["Inserted"]);
    assert_eq!(after.1["Image"], before.1["Image"]);
    assert_eq!(images.downloads(), 0);
}

#[tokio::test]
async fn the_recorded_uuid_matches_in_any_case() {
    let emu = require!(emulators());
    let node = emu.raw().node("node-003").await;
    let client = RedfishClient::new(emu.config(Some(&node.uuid))).expect("client");
    client.ensure_uuid(&SystemUuid::new(&node.uuid.to_uppercase())).await.expect("same UUID");
}
