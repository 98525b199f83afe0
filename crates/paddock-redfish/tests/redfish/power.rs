//! Power convergence against the emulator.

use paddock_redfish::{Password, PowerOutcome, PowerState, RedfishClient, RedfishConfig};
use reqwest::Method;

use crate::require;
use crate::support::proxy::FaultProxy;
use crate::support::{emulators, fast, tls_emulator, tls_system_lock};

#[tokio::test]
async fn on_and_off_converge_and_already_there_sends_nothing() {
    let emu = require!(emulators());
    let raw = emu.raw();
    let node = raw.node("node-000").await;
    raw.force_power(&node, false).await;
    let proxy = FaultProxy::start(&emu.url).await;
    let client = RedfishClient::new(emu.config_at(&proxy.url, Some(&node.uuid))).expect("client");
    let expected = node.system_uuid();
    let resets = || proxy.count(&Method::POST, "ComputerSystem.Reset");

    let outcome = client.power(&expected, PowerState::On).await.expect("power on");
    assert!(matches!(outcome, PowerOutcome::Changed { reissued: false, .. }), "{outcome:?}");
    assert_eq!(raw.system(&node).await["PowerState"], "On");
    assert_eq!(resets(), 1);

    // Idempotent: already on is success, and no Reset is sent.
    assert_eq!(client.power(&expected, PowerState::On).await.expect("on again"), PowerOutcome::AlreadyThere);
    assert_eq!(resets(), 1);

    let outcome = client.power(&expected, PowerState::Off).await.expect("power off");
    assert!(matches!(outcome, PowerOutcome::Changed { reissued: false, .. }), "{outcome:?}");
    assert_eq!(raw.system(&node).await["PowerState"], "Off");
    assert_eq!(client.power(&expected, PowerState::Off).await.expect("off again"), PowerOutcome::AlreadyThere);
    assert_eq!(resets(), 2);
}

#[tokio::test]
async fn delayed_power_change_is_polled_until_reached() {
    // The TLS emulator applies power changes 2 s after the request.
    let tls = require!(tls_emulator());
    let _only_user = tls_system_lock().await;
    let mut config = fast(RedfishConfig::new(tls.url.clone(), "", Password::new("")));
    config.ca_cert_pem = Some(tls.ca_pem.clone());
    let client = RedfishClient::new(config).expect("client");
    let uuid = client.system().await.expect("system").uuid.expect("uuid");

    // Whatever the start, Off first (the only test that changes this emulator).
    client.power(&uuid, PowerState::Off).await.expect("off");
    let outcome = client.power(&uuid, PowerState::On).await.expect("on");
    let PowerOutcome::Changed { reissued, polls } = outcome else { panic!("expected a change, got {outcome:?}") };
    assert!(!reissued);
    assert!(polls > 1, "the new state cannot show on the first read with a 2 s delay (polls: {polls})");
    let outcome = client.power(&uuid, PowerState::Off).await.expect("off again");
    assert!(matches!(outcome, PowerOutcome::Changed { polls: 2.., .. }), "{outcome:?}");
}
