//! Service root, system selection, inventory, credentials.

use std::sync::Arc;

use paddock_redfish::{Password, RedfishClient, RedfishError, ReportedPowerState, SystemUuid};
use reqwest::Method;

use crate::require;
use crate::support::proxy::{Fault, FaultProxy, Rule};
use crate::support::{emulators, fast, tls_emulator};

#[tokio::test]
async fn service_root_is_discovered() {
    let emu = require!(emulators());
    let client = RedfishClient::new(emu.config(None)).expect("client");
    let root = client.service_root().await.expect("service root");
    assert_eq!(root.redfish_version.as_deref(), Some("1.5.0"));
    assert!(root.uuid.is_some());
}

#[tokio::test]
async fn system_is_chosen_by_id() {
    let emu = require!(emulators());
    let node = emu.raw().node("node-010").await;
    // sushy-tools uses the UUID as `Id` too; the Id branch is also covered through the proxy below.
    let id = node.path.rsplit('/').next().expect("id").to_owned();
    let client = RedfishClient::new(emu.config(Some(&id))).expect("client");
    let inv = client.system().await.expect("system");
    assert_eq!(inv.id, id);
    assert_eq!(inv.name.as_deref(), Some("node-010"));
}

#[tokio::test]
async fn system_is_chosen_by_uuid_in_any_case() {
    let emu = require!(emulators());
    let node = emu.raw().node("node-011").await;
    let client = RedfishClient::new(emu.config(Some(&node.uuid.to_uppercase()))).expect("client");
    let inv = client.system().await.expect("system");
    assert_eq!(inv.uuid, Some(node.system_uuid()));
    assert_eq!(inv.name.as_deref(), Some("node-011"));
}

#[tokio::test]
async fn system_is_chosen_by_an_id_that_is_not_in_its_uri() {
    let emu = require!(emulators());
    // A BMC whose systems have Ids unlike their URIs: the proxy renames each system's Id to its Name.
    let proxy = FaultProxy::start(&emu.url).await;
    proxy.rule(Rule::containing(
        Some(Method::GET),
        "/redfish/v1/Systems/",
        Fault::Rewrite(Arc::new(|v| {
            if v["@odata.type"].as_str().is_some_and(|t| t.contains("ComputerSystem.v")) {
                v["Id"] = v["Name"].clone();
            }
        })),
    ));
    let client = RedfishClient::new(emu.config_at(&proxy.url, Some("node-010"))).expect("client");
    let inv = client.system().await.expect("system");
    assert_eq!(inv.id, "node-010");
    assert_eq!(inv.name.as_deref(), Some("node-010"));
}

#[tokio::test]
async fn several_systems_without_system_id_are_ambiguous() {
    let emu = require!(emulators());
    let client = RedfishClient::new(emu.config(None)).expect("client");
    let err = client.system().await.expect_err("ambiguous");
    let RedfishError::AmbiguousSystem { ids } = &err else { panic!("expected AmbiguousSystem, got {err:?}") };
    assert_eq!(ids.len(), 18);
    assert!(!err.is_transient());
    assert_eq!(err.code(), "bmc_system_ambiguous");
}

#[tokio::test]
async fn unknown_system_id_is_not_found() {
    let emu = require!(emulators());
    let client = RedfishClient::new(emu.config(Some("no-such-system"))).expect("client");
    let err = client.system().await.expect_err("unknown system");
    assert!(matches!(&err, RedfishError::SystemNotFound { available, .. } if available.len() == 18), "{err:?}");
    assert!(!err.is_transient());
}

#[tokio::test]
async fn single_system_needs_no_system_id() {
    let tls = require!(tls_emulator());
    let mut config = fast(paddock_redfish::RedfishConfig::new(tls.url.clone(), "", Password::new("")));
    config.ca_cert_pem = Some(tls.ca_pem.clone());
    let inv = RedfishClient::new(config).expect("client").system().await.expect("the only system");
    assert_eq!(inv.name.as_deref(), Some("node-000"));
    assert_eq!(inv.uuid, Some(SystemUuid::new("9871f117-ecb9-5856-8d64-7c41ecb62561")));
}

#[tokio::test]
async fn inventory_reports_drives_and_leaves_cpu_and_memory_unverified() {
    let emu = require!(emulators());
    let node = emu.raw().node("node-010").await;
    let client = RedfishClient::new(emu.config(Some(&node.uuid))).expect("client");
    let inv = client.system().await.expect("system");
    assert_eq!(inv.uuid, Some(node.system_uuid()));
    assert_eq!(inv.manufacturer.as_deref(), Some("Sushy Emulator"));
    assert!(matches!(inv.power_state, Some(ReportedPowerState::On | ReportedPowerState::Off)), "{:?}", inv.power_state);
    // The fake driver reports no serial, model, CPU or memory: unverified, not zero.
    assert_eq!(inv.serial_number, None);
    assert_eq!(inv.model, None);
    assert_eq!(inv.processor_count, None);
    assert_eq!(inv.processor_model, None);
    assert_eq!(inv.memory_gib, None);
    let drives = inv.drives.expect("storage is reported");
    let ids: Vec<&str> = drives.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["nvme0", "nvme1"]);
    for d in &drives {
        assert_eq!(d.storage_id, "1");
        assert_eq!(d.capacity_bytes, Some(3_840_755_982_336));
        assert_eq!(d.model.as_deref(), Some("C123"));
        assert_eq!(d.media_type.as_deref(), Some("HDD"));
        assert_eq!(d.protocol.as_deref(), Some("NVMe"));
    }
}

#[tokio::test]
async fn wrong_credentials_are_auth_failed_and_not_retried() {
    let emu = require!(emulators());
    let proxy = FaultProxy::start(&emu.url).await;
    let mut config = emu.config_at(&proxy.url, Some("node-010"));
    config.password = Password::new("wrong");
    let err = RedfishClient::new(config).expect("client").system().await.expect_err("wrong password");
    assert!(matches!(err, RedfishError::AuthFailed { status: 401, .. }), "{err:?}");
    assert!(!err.is_transient());
    assert_eq!(err.code(), "bmc_auth_failed");
    // The service root needs no auth; the Systems collection was asked for exactly once.
    assert_eq!(proxy.count(&Method::GET, "/redfish/v1/Systems"), 1);

    let mut anonymous = emu.config(Some("node-010"));
    anonymous.username = String::new();
    let err = RedfishClient::new(anonymous).expect("client").system().await.expect_err("no credentials");
    assert!(matches!(err, RedfishError::AuthFailed { status: 401, .. }), "{err:?}");
}
