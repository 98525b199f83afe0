//! Virtual media against the emulator (which downloads each image from our image server).

use std::sync::Arc;
use std::time::Duration;

use paddock_redfish::{ChangeOutcome, RedfishClient, RedfishError};
use reqwest::Method;
use serde_json::Value;

use crate::require;
use crate::support::images::ImageServer;
use crate::support::proxy::{Fault, FaultProxy, Rule};
use crate::support::{emulators, eventually};

#[tokio::test]
async fn virtual_media_devices_are_listed() {
    let emu = require!(emulators());
    let node = emu.raw().node("node-010").await;
    let client = RedfishClient::new(emu.config(Some(&node.uuid))).expect("client");
    let devices = client.virtual_media_devices().await.expect("devices");
    let ids: Vec<&str> = devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["Cd", "Floppy"]);
    assert!(devices[0].supports_cd());
    assert!(!devices[1].supports_cd());
}

#[tokio::test]
async fn insert_and_eject_round_trip() {
    let emu = require!(emulators());
    let images = ImageServer::start().await;
    let raw = emu.raw();
    let node = raw.node("node-002").await;
    let client = RedfishClient::new(emu.config(Some(&node.uuid))).expect("client");
    let expected = node.system_uuid();
    let wipe = images.url("wipe.iso");

    assert_eq!(client.insert_media(&expected, "Cd", &wipe).await.expect("insert"), ChangeOutcome::Applied);
    let cd = raw.cd(&node).await;
    assert_eq!(cd["Inserted"], true);
    assert_eq!(cd["Image"], wipe.as_str());
    assert_eq!(images.downloads(), 1, "the emulator fetches the image on insert");

    // Idempotent: the same image again sends nothing.
    assert_eq!(client.insert_media(&expected, "cd", &wipe).await.expect("again"), ChangeOutcome::AlreadyDone);
    assert_eq!(images.downloads(), 1);

    // Another image replaces it (ejecting first).
    let os = images.url("os.iso");
    assert_eq!(client.insert_media(&expected, "Cd", &os).await.expect("replace"), ChangeOutcome::Applied);
    assert_eq!(raw.cd(&node).await["Image"], os.as_str());

    assert_eq!(client.eject_media(&expected, "Cd").await.expect("eject"), ChangeOutcome::Applied);
    assert_eq!(raw.cd(&node).await["Inserted"], false);
    assert_eq!(client.eject_media(&expected, "Cd").await.expect("eject again"), ChangeOutcome::AlreadyDone);
}

#[tokio::test]
async fn missing_image_is_rejected_permanently() {
    let emu = require!(emulators());
    let images = ImageServer::start().await;
    let raw = emu.raw();
    let node = raw.node("node-007").await;
    let client = RedfishClient::new(emu.config(Some(&node.uuid))).expect("client");
    let err = client
        .insert_media(&node.system_uuid(), "Cd", &images.url("missing.img"))
        .await
        .expect_err("the image does not exist");
    assert!(matches!(err, RedfishError::Status { status: 400, .. }), "{err:?}");
    assert!(!err.is_transient());
    assert_eq!(raw.cd(&node).await["Inserted"], false);
}

#[tokio::test]
async fn unknown_device_is_refused_without_asking_the_bmc_for_it() {
    let emu = require!(emulators());
    let images = ImageServer::start().await;
    let raw = emu.raw();
    let node = raw.node("node-012").await;
    let proxy = FaultProxy::start(&emu.url).await;
    let client = RedfishClient::new(emu.config_at(&proxy.url, Some(&node.uuid))).expect("client");
    let expected = node.system_uuid();
    let wipe = images.url("wipe.iso");
    client.insert_media(&expected, "Cd", &wipe).await.expect("insert");

    let err = client.insert_media(&expected, "Usb", &wipe).await.expect_err("no such device");
    let RedfishError::NoSuchVirtualMedia { available, .. } = &err else { panic!("{err:?}") };
    assert_eq!(available, &["Cd", "Floppy"]);
    assert!(matches!(client.eject_media(&expected, "Usb").await, Err(RedfishError::NoSuchVirtualMedia { .. })));
    // sushy-tools empties every device of a system asked for an unknown one: the client never asks.
    assert_eq!(proxy.count(&Method::GET, "/VirtualMedia/Usb"), 0);
    assert_eq!(raw.cd(&node).await["Inserted"], true);
}

#[tokio::test]
async fn virtual_media_through_the_manager() {
    let emu = require!(emulators());
    let images = ImageServer::start().await;
    let raw = emu.raw();
    let node = raw.node("node-006").await;
    // A BMC that lists virtual media only under its Manager: hide the system's own link.
    let proxy = FaultProxy::start(&emu.url).await;
    proxy.rule(Rule::exact(
        Some(Method::GET),
        &node.path,
        Fault::Rewrite(Arc::new(|v: &mut Value| {
            if let Some(o) = v.as_object_mut() {
                o.remove("VirtualMedia");
            }
        })),
    ));
    let client = RedfishClient::new(emu.config_at(&proxy.url, Some(&node.uuid))).expect("client");
    let devices = client.virtual_media_devices().await.expect("devices");
    assert_eq!(devices.len(), 2);
    assert!(proxy.count(&Method::GET, "/redfish/v1/Managers/") >= 1, "found through Links.ManagedBy");

    let wipe = images.url("wipe.iso");
    assert_eq!(client.insert_media(&node.system_uuid(), "Cd", &wipe).await.expect("insert"), ChangeOutcome::Applied);
    assert_eq!(raw.cd(&node).await["Image"], wipe.as_str());
    assert_eq!(client.eject_media(&node.system_uuid(), "Cd").await.expect("eject"), ChangeOutcome::Applied);
}

#[tokio::test]
async fn a_single_virtual_media_device_is_visible_to_the_caller() {
    let emu = require!(emulators());
    let node = emu.raw().node("node-011").await;
    // A BMC with one device only (the caller maps this to `no_second_virtual_media`).
    let proxy = FaultProxy::start(&emu.url).await;
    proxy.rule(Rule::exact(
        Some(Method::GET),
        &format!("{}/VirtualMedia", node.path),
        Fault::Rewrite(Arc::new(|v: &mut Value| {
            if let Some(members) = v["Members"].as_array_mut() {
                members.truncate(1);
            }
            v["Members@odata.count"] = 1.into();
        })),
    ));
    let client = RedfishClient::new(emu.config_at(&proxy.url, Some(&node.uuid))).expect("client");
    let devices = client.virtual_media_devices().await.expect("devices");
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].id, "Cd");
}

/// sushy-tools, like many BMCs, fetches the whole image inside its `InsertMedia` request. One
/// that outlasts the insert timeout is never sent again: the client reads the device instead,
/// answers `InsertUnconfirmed` while the BMC still fetches, and finds the image once it landed.
/// The BMC fetches the image once.
#[tokio::test]
async fn an_insert_that_outlasts_its_timeout_is_never_sent_again() {
    let emu = require!(emulators());
    let images = ImageServer::start().await;
    images.delay_images(Duration::from_secs(5));
    let raw = emu.raw();
    let node = raw.node("node-016").await;
    let mut config = emu.config(Some(&node.uuid));
    config.insert_timeout = Duration::from_secs(2);
    let client = RedfishClient::new(config).expect("client");
    let expected = node.system_uuid();
    let os = images.url("node-os.iso");

    let err = client.insert_media(&expected, "Cd", &os).await.expect_err("no answer within the insert timeout");
    assert!(matches!(err, RedfishError::InsertUnconfirmed { source: Some(_), .. }), "{err:?}");
    assert!(err.is_transient());
    assert_eq!(err.code(), "bmc_media_insert_unconfirmed");
    // Asked again while the BMC still fetches: the device is read, nothing is sent.
    let again = client.insert_media(&expected, "Cd", &os).await.expect_err("still fetching");
    assert!(matches!(again, RedfishError::InsertUnconfirmed { source: None, .. }), "{again:?}");

    eventually(Duration::from_secs(60), || async { raw.cd(&node).await["Inserted"] == true }).await;
    assert_eq!(client.insert_media(&expected, "Cd", &os).await.expect("landed"), ChangeOutcome::AlreadyDone);
    assert_eq!(raw.cd(&node).await["Image"], os.as_str());
    assert_eq!(images.downloads_of("node-os.iso"), 1, "the BMC fetched the image once");
    assert_eq!(client.eject_media(&expected, "Cd").await.expect("eject"), ChangeOutcome::Applied);
}
