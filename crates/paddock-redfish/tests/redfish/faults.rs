//! Real BMC misbehaviour, injected by the test proxy in front of the real emulator: 503 bursts,
//! `Retry-After`, stalls, task monitors, lost and unsupported actions.

use std::sync::Arc;
use std::time::Duration;

use paddock_redfish::{BootTarget, ChangeOutcome, PowerOutcome, PowerState, RedfishClient, RedfishError};
use reqwest::Method;
use serde_json::{json, Value};

use crate::require;
use crate::support::proxy::{Fault, FaultProxy, Rule};
use crate::support::{emulators, Emulators, Node};

fn busy(retry_after: Option<&str>) -> Fault {
    Fault::Status { status: 503, retry_after: retry_after.map(str::to_owned) }
}

async fn proxied(emu: &Emulators, name: &str) -> (FaultProxy, Node) {
    let node = emu.raw().node(name).await;
    (FaultProxy::start(&emu.url).await, node)
}

fn client(emu: &Emulators, proxy: &FaultProxy, node: &Node) -> RedfishClient {
    RedfishClient::new(emu.config_at(&proxy.url, Some(&node.uuid))).expect("client")
}

fn answered(proxy: &FaultProxy, status: u16) -> usize {
    proxy.seen().iter().filter(|s| s.status == status).count()
}

#[tokio::test]
async fn burst_of_503_is_retried_then_succeeds() {
    let emu = require!(emulators());
    let (proxy, node) = proxied(emu, "node-013").await;
    proxy.rule(Rule::exact(Some(Method::GET), &node.path, busy(Some("0"))).times(2));
    let inv = client(emu, &proxy, &node).system().await.expect("retried through the burst");
    assert_eq!(inv.uuid, Some(node.system_uuid()));
    assert_eq!(answered(&proxy, 503), 2);
}

#[tokio::test]
async fn exhausted_retries_are_transient() {
    let emu = require!(emulators());
    let (proxy, node) = proxied(emu, "node-013").await;
    proxy.rule(Rule::exact(Some(Method::GET), "/redfish/v1/Systems", busy(None)));
    let err = client(emu, &proxy, &node).system().await.expect_err("always busy");
    assert!(matches!(err, RedfishError::Status { status: 503, .. }), "{err:?}");
    assert!(err.is_transient());
    // One try and the configured two retries, no more.
    assert_eq!(answered(&proxy, 503), 3);
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let emu = require!(emulators());
    let (proxy, node) = proxied(emu, "node-014").await;
    proxy.rule(Rule::exact(Some(Method::GET), "/redfish/v1/Systems", busy(Some("1"))).times(1));
    client(emu, &proxy, &node).system().await.expect("succeeds after the wait");
    let seen: Vec<_> = proxy.seen().into_iter().filter(|s| s.path == "/redfish/v1/Systems").collect();
    assert_eq!(seen.iter().map(|s| s.status).collect::<Vec<_>>(), [503, 200]);
    // The backoff alone would have waited 20 ms; the BMC asked for a second.
    let gap = seen[1].at - seen[0].at;
    assert!(gap >= Duration::from_millis(950), "retried after {gap:?}, before Retry-After: 1");
}

#[tokio::test]
async fn a_long_retry_after_goes_back_to_the_caller() {
    let emu = require!(emulators());
    let (proxy, node) = proxied(emu, "node-014").await;
    proxy.rule(Rule::exact(Some(Method::GET), "/redfish/v1/Systems", busy(Some("3600"))));
    let err = client(emu, &proxy, &node).system().await.expect_err("too long to wait in place");
    assert!(err.is_transient());
    assert_eq!(err.retry_after(), Some(Duration::from_secs(3600)));
    assert_eq!(answered(&proxy, 503), 1);
}

#[tokio::test]
async fn a_stall_hits_the_timeout_and_is_transient() {
    let emu = require!(emulators());
    let (proxy, node) = proxied(emu, "node-015").await;
    proxy.rule(Rule::exact(Some(Method::GET), &node.path, Fault::Stall(Duration::from_secs(30))));
    let mut config = emu.config_at(&proxy.url, Some(&node.uuid));
    config.request_timeout = Duration::from_millis(300);
    config.retries = 0;
    let err = RedfishClient::new(config).expect("client").system().await.expect_err("stalled");
    assert!(matches!(err, RedfishError::Timeout { .. }), "{err:?}");
    assert!(err.is_transient());
    assert_eq!(err.code(), "bmc_timeout");
}

#[tokio::test]
async fn a_single_stall_is_retried() {
    let emu = require!(emulators());
    let (proxy, node) = proxied(emu, "node-015").await;
    proxy.rule(Rule::exact(Some(Method::GET), "/redfish/v1/Systems", Fault::Stall(Duration::from_secs(30))).times(1));
    let mut config = emu.config_at(&proxy.url, Some(&node.uuid));
    config.request_timeout = Duration::from_millis(300);
    RedfishClient::new(config).expect("client").system().await.expect("second attempt succeeds");
}

#[tokio::test]
async fn task_monitor_is_followed_to_completion() {
    let emu = require!(emulators());
    let (proxy, node) = proxied(emu, "node-005").await;
    proxy.rule(Rule::exact(Some(Method::PATCH), &node.path, Fault::Accepted { polls: 2, fail: None }));
    let outcome = client(emu, &proxy, &node).set_boot_once(&node.system_uuid(), BootTarget::Pxe).await.expect("boot");
    assert_eq!(outcome, ChangeOutcome::Applied);
    // Two "Running" answers, then the relayed result.
    assert_eq!(proxy.count(&Method::GET, "/TaskMonitors/"), 3);
    assert_eq!(emu.raw().system(&node).await["Boot"]["BootSourceOverrideTarget"], "Pxe");
}

#[tokio::test]
async fn failed_task_is_an_error() {
    let emu = require!(emulators());
    let (proxy, node) = proxied(emu, "node-009").await;
    let fail = Fault::Accepted { polls: 1, fail: Some("firmware busy".into()) };
    proxy.rule(Rule::exact(Some(Method::PATCH), &node.path, fail));
    let err =
        client(emu, &proxy, &node).set_boot_once(&node.system_uuid(), BootTarget::Cd).await.expect_err("task failed");
    let RedfishError::TaskFailed { state, message, .. } = &err else { panic!("{err:?}") };
    assert_eq!(state, "Exception");
    assert_eq!(message.as_deref(), Some("firmware busy"));
    assert!(!err.is_transient());
}

#[tokio::test]
async fn lost_reset_is_reissued_once() {
    let emu = require!(emulators());
    let (proxy, node) = proxied(emu, "node-004").await;
    emu.raw().force_power(&node, false).await;
    // The BMC answers 204 to the first Reset and then forgets it.
    proxy.rule(Rule::containing(Some(Method::POST), "ComputerSystem.Reset", Fault::Drop).times(1));
    let mut config = emu.config_at(&proxy.url, Some(&node.uuid));
    config.power.reissue_after = Duration::from_millis(500);
    let client = RedfishClient::new(config).expect("client");
    let outcome = client.power(&node.system_uuid(), PowerState::On).await.expect("converged");
    assert!(matches!(outcome, PowerOutcome::Changed { reissued: true, .. }), "{outcome:?}");
    assert_eq!(proxy.count(&Method::POST, "ComputerSystem.Reset"), 2);
    assert_eq!(emu.raw().system(&node).await["PowerState"], "On");
}

#[tokio::test]
async fn power_that_never_changes_times_out_after_one_reissue() {
    let emu = require!(emulators());
    let (proxy, node) = proxied(emu, "node-008").await;
    proxy.rule(Rule::containing(Some(Method::POST), "ComputerSystem.Reset", Fault::Drop));
    let mut config = emu.config_at(&proxy.url, Some(&node.uuid));
    config.power.reissue_after = Duration::from_millis(300);
    config.power.timeout = Duration::from_millis(1200);
    let err =
        RedfishClient::new(config).expect("client").power(&node.system_uuid(), PowerState::On).await.expect_err("lost");
    assert!(matches!(&err, RedfishError::PowerTimeout { last: Some(s), .. } if s == "Off"), "{err:?}");
    assert!(err.is_transient());
    assert_eq!(proxy.count(&Method::POST, "ComputerSystem.Reset"), 2);
}

#[tokio::test]
async fn unadvertised_reset_type_is_a_capability_gap() {
    let emu = require!(emulators());
    let (proxy, node) = proxied(emu, "node-008").await;
    proxy.rule(Rule::exact(
        Some(Method::GET),
        &node.path,
        Fault::Rewrite(Arc::new(|v: &mut Value| {
            v["Actions"]["#ComputerSystem.Reset"]["ResetType@Redfish.AllowableValues"] = json!(["ForceOff", "Nmi"]);
        })),
    ));
    let err = client(emu, &proxy, &node).power(&node.system_uuid(), PowerState::On).await.expect_err("no On");
    assert!(matches!(err, RedfishError::CapabilityGap { status: None, .. }), "{err:?}");
    assert!(!err.is_transient());
    assert!(proxy.changes().is_empty());
}

#[tokio::test]
async fn reset_answered_501_is_a_capability_gap_and_not_retried() {
    let emu = require!(emulators());
    let (proxy, node) = proxied(emu, "node-008").await;
    let not_implemented = Fault::Status { status: 501, retry_after: None };
    proxy.rule(Rule::containing(Some(Method::POST), "ComputerSystem.Reset", not_implemented));
    let err = client(emu, &proxy, &node).power(&node.system_uuid(), PowerState::On).await.expect_err("501");
    assert!(matches!(err, RedfishError::CapabilityGap { status: Some(501), .. }), "{err:?}");
    assert!(!err.is_transient());
    assert_eq!(proxy.count(&Method::POST, "ComputerSystem.Reset"), 1);
}

#[tokio::test]
async fn unadvertised_boot_target_is_a_capability_gap() {
    let emu = require!(emulators());
    let (proxy, node) = proxied(emu, "node-008").await;
    proxy.rule(Rule::exact(
        Some(Method::GET),
        &node.path,
        Fault::Rewrite(Arc::new(|v: &mut Value| {
            v["Boot"]["BootSourceOverrideTarget@Redfish.AllowableValues"] = json!(["Pxe", "Hdd"]);
        })),
    ));
    let err = client(emu, &proxy, &node).set_boot_once(&node.system_uuid(), BootTarget::Cd).await.expect_err("no Cd");
    assert!(matches!(err, RedfishError::CapabilityGap { .. }), "{err:?}");
    assert!(proxy.changes().is_empty());
}

#[tokio::test]
async fn an_endless_answer_is_cut_off_at_the_body_limit_not_read_into_memory() {
    let emu = require!(emulators());
    let (proxy, node) = proxied(emu, "node-012").await;
    proxy.rule(Rule::exact(Some(Method::GET), "/redfish/v1/Systems", Fault::Endless));
    let mut config = emu.config_at(&proxy.url, Some(&node.uuid));
    config.max_body_bytes = 256 * 1024;
    let err = RedfishClient::new(config).expect("client").system().await.expect_err("an endless body");
    assert!(matches!(err, RedfishError::BodyTooLarge { limit: 262_144, .. }), "{err:?}");
    assert_eq!((err.code(), err.is_transient()), ("bmc_bad_response", false));
    // Not retried: the same BMC would send the same again.
    assert_eq!(proxy.count(&Method::GET, "/redfish/v1/Systems"), 1);
}
