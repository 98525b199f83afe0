//! `RedfishBmc`, the `BmcDriver` the worker calls: media boots, their end, power off, against the
//! real emulator (basic auth on the main one, TLS with the private CA on the other). The proxy,
//! where used, forwards to the real emulator; each perturbation it adds is named in a comment.

use std::sync::Arc;
use std::time::Duration;

use paddock_domain::bmc::{
    AfterBoot, BmcAccess, BmcDriver, BmcError, BmcErrorKind, BootMedia, PowerProgress, NO_SECOND_VIRTUAL_MEDIA,
    SYSTEM_UUID_MISMATCH,
};
use paddock_domain::secret::SecretString;
use paddock_redfish::{BmcLimiter, Password, RedfishBmc, RedfishClient, RedfishConfig, ReportedPowerState, Url};
use reqwest::Method;
use serde_json::{json, Value};

use crate::require;
use crate::support::images::ImageServer;
use crate::support::logs;
use crate::support::proxy::{Fault, FaultProxy, Rule};
use crate::support::{
    emulators, eventually, fast, tls_emulator, tls_pending_power, tls_system_lock, Emulators, Node, Raw,
};

fn driver() -> RedfishBmc {
    RedfishBmc::new(BmcLimiter::new(4)).with_tuning(|c: &mut RedfishConfig| *c = fast(c.clone()))
}

/// A driver that takes a lost `Reset` as lost after `after`.
fn driver_reissuing_after(after: Duration) -> RedfishBmc {
    RedfishBmc::new(BmcLimiter::new(4)).with_tuning(move |c: &mut RedfishConfig| {
        *c = fast(c.clone());
        c.power.reissue_after = after;
    })
}

/// The machine's access as the worker builds it, reaching the BMC at `url` (the emulator or a
/// proxy in front of it).
fn access(emu: &Emulators, url: &Url, node: &Node) -> BmcAccess {
    BmcAccess {
        machine_id: Default::default(),
        url: url.to_string(),
        system_id: Some(node.uuid.clone()),
        username: emu.user.clone(),
        password: SecretString::new(emu.password.clone()),
        ca_cert: None,
        insecure_tls: false,
        system_uuid: Some(node.uuid.clone()),
    }
}

fn media(images: &ImageServer, token: &str) -> BootMedia {
    BootMedia {
        image_url: images.url("wipe.iso").to_string(),
        seed_url: SecretString::new(images.seed_url(token).to_string()),
    }
}

async fn device(raw: &Raw, node: &Node, id: &str) -> Value {
    raw.get(&format!("{}/VirtualMedia/{id}", node.path)).await
}

/// The emulator shows a booted media boot: image in the CD, seed in the second device, a boot
/// override to `Cd` (sushy-tools reads `Continuous` back whatever was sent), power on.
async fn assert_media_booted(raw: &Raw, node: &Node, media: &BootMedia) {
    let cd = device(raw, node, "Cd").await;
    assert_eq!((cd["Inserted"].clone(), cd["Image"].clone()), (true.into(), media.image_url.clone().into()));
    let second = device(raw, node, "Floppy").await;
    assert_eq!(second["Inserted"], true);
    assert_eq!(second["Image"], media.seed_url.expose());
    let system = raw.system(node).await;
    assert_eq!(system["Boot"]["BootSourceOverrideTarget"], "Cd");
    assert_eq!(system["PowerState"], "On");
}

/// The emulator shows an ended media boot: nothing inserted, boot override back to `Hdd`, power
/// as given.
async fn assert_finished(raw: &Raw, node: &Node, power: &str) {
    for id in ["Cd", "Floppy"] {
        let d = device(raw, node, id).await;
        assert_eq!(d["Inserted"], false, "{id}: {d}");
        assert_eq!(d["Image"], "", "{id}: {d}");
    }
    let system = raw.system(node).await;
    let boot = &system["Boot"];
    assert!(
        boot["BootSourceOverrideTarget"] == "Hdd" || boot["BootSourceOverrideEnabled"] == "Disabled",
        "boot override still points away from the disk: {boot}"
    );
    assert_eq!(system["PowerState"], power);
}

fn posts(proxy: &FaultProxy, needle: &str) -> usize {
    proxy.count(&Method::POST, needle)
}

#[tokio::test]
async fn media_boot_and_its_end_converge_and_repeat_as_no_ops() {
    let emu = require!(emulators());
    let images = ImageServer::start().await;
    let raw = emu.raw();
    let node = raw.node("node-013").await;
    // A machine left running, with something in its CD: both are cleared by the boot.
    raw.force_power(&node, true).await;
    let stale = serde_json::json!({"Image": images.url("stale.iso").as_str(), "Inserted": true});
    assert_eq!(raw.post(&format!("{}/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia", node.path), stale).await, 204);
    let proxy = FaultProxy::start(&emu.url).await; // transparent: counts requests only
    let access = access(emu, &proxy.url, &node);
    let bmc = driver();
    let media = media(&images, "tok-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");

    bmc.boot_from_media(&access, &media).await.expect("boot from media");
    assert_media_booted(&raw, &node, &media).await;
    assert_eq!(posts(&proxy, "ComputerSystem.Reset"), 2, "off, then on");
    assert_eq!(posts(&proxy, "EjectMedia"), 1, "the stale CD");
    assert_eq!(posts(&proxy, "InsertMedia"), 2);

    // Repeating it restarts the boot and ends in the same state.
    bmc.boot_from_media(&access, &media).await.expect("boot from media again");
    assert_media_booted(&raw, &node, &media).await;

    // The end of a provisioning boot: media out, disk, a restart (the system stays on).
    let resets = posts(&proxy, "ComputerSystem.Reset");
    bmc.finish_boot(&access, AfterBoot::BootFromDisk).await.expect("finish: boot from disk");
    assert_finished(&raw, &node, "On").await;
    assert_eq!(posts(&proxy, "ComputerSystem.Reset"), resets + 1, "one ForceRestart");

    // A wipe boot and its end: media out, disk, off.
    bmc.boot_from_media(&access, &media).await.expect("boot from media once more");
    assert_media_booted(&raw, &node, &media).await;
    bmc.finish_boot(&access, AfterBoot::PowerOff).await.expect("finish: power off");
    assert_finished(&raw, &node, "Off").await;

    // Repeating the end, and powering off what is off, send nothing at all.
    let changes = proxy.changes().len();
    bmc.finish_boot(&access, AfterBoot::PowerOff).await.expect("finish again");
    bmc.power_off(&access).await.expect("power off an off machine");
    assert_eq!(proxy.changes().len(), changes, "{:?}", &proxy.changes()[changes..]);
    assert_finished(&raw, &node, "Off").await;
}

#[tokio::test]
async fn uuid_mismatch_or_none_on_record_changes_nothing() {
    let emu = require!(emulators());
    let images = ImageServer::start().await;
    let raw = emu.raw();
    let node = raw.node("node-003").await;
    let before = (raw.system(&node).await, raw.cd(&node).await);
    let proxy = FaultProxy::start(&emu.url).await;
    let bmc = driver();
    let token = "tok-BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB";
    let media = media(&images, token);
    // The record says another machine (the BMC address was reused for another box).
    let other = raw.node("node-004").await.uuid;
    let mut wrong = access(emu, &proxy.url, &node);
    wrong.system_uuid = Some(other.to_uppercase());

    let refused = |r: Result<(), BmcError>, names: &[&str]| {
        let e = r.expect_err("refused");
        assert_eq!((e.kind, e.code.as_str()), (BmcErrorKind::Permanent, SYSTEM_UUID_MISMATCH), "{e:?}");
        for name in names {
            assert!(e.message.to_lowercase().contains(name), "{name} not named in {e}");
        }
        assert!(!format!("{e} {e:?}").contains(token));
    };
    refused(bmc.boot_from_media(&wrong, &media).await, &[&node.uuid, &other]);
    refused(bmc.finish_boot(&wrong, AfterBoot::PowerOff).await, &[&node.uuid, &other]);
    refused(bmc.finish_boot(&wrong, AfterBoot::BootFromDisk).await, &[&node.uuid, &other]);
    refused(bmc.power_off(&wrong).await, &[&node.uuid, &other]);

    // No UUID on record (never inspected): refused too, naming what the BMC reports.
    let mut unknown = access(emu, &proxy.url, &node);
    unknown.system_uuid = None;
    refused(bmc.boot_from_media(&unknown, &media).await, &[&node.uuid]);
    refused(bmc.power_off(&unknown).await, &[&node.uuid]);

    assert_eq!(proxy.changes().len(), 0, "{:?}", proxy.changes());
    let after = (raw.system(&node).await, raw.cd(&node).await);
    for field in ["PowerState", "Boot"] {
        assert_eq!(after.0[field], before.0[field], "{field}");
    }
    assert_eq!(after.1, before.1);
    assert_eq!(images.downloads(), 0);
}

#[tokio::test]
async fn lost_or_failed_resets_still_converge() {
    let emu = require!(emulators());
    let images = ImageServer::start().await;
    let raw = emu.raw();
    let node = raw.node("node-014").await;
    raw.force_power(&node, true).await;
    let proxy = FaultProxy::start(&emu.url).await;
    let access = access(emu, &proxy.url, &node);
    let bmc = driver_reissuing_after(Duration::from_millis(500));

    // Perturbation: the BMC answers 204 to the first Reset and then forgets it.
    proxy.rule(Rule::containing(Some(Method::POST), "ComputerSystem.Reset", Fault::Drop).times(1));
    bmc.power_off(&access).await.expect("converged after one re-issue");
    assert_eq!(raw.system(&node).await["PowerState"], "Off");
    assert_eq!(posts(&proxy, "ComputerSystem.Reset"), 2);

    // Perturbation: the first Reset of the boot (on) fails with 503; the retry gets through.
    let busy = Fault::Status { status: 503, retry_after: None };
    proxy.rule(Rule::containing(Some(Method::POST), "ComputerSystem.Reset", busy).times(1));
    let media = media(&images, "tok-CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC");
    bmc.boot_from_media(&access, &media).await.expect("boot despite a 503");
    assert_media_booted(&raw, &node, &media).await;
    let statuses: Vec<u16> = proxy.seen().iter().filter(|s| s.path.contains("Reset")).map(|s| s.status).collect();
    assert_eq!(statuses, [204, 204, 503, 204], "dropped + re-issued off, then 503 + retried on");

    // Perturbation: a Reset that is never applied ends in a transient error, not a retry storm.
    proxy.rule(Rule::containing(Some(Method::POST), "ComputerSystem.Reset", Fault::Drop));
    let stubborn = RedfishBmc::new(BmcLimiter::new(4)).with_tuning(|c: &mut RedfishConfig| {
        *c = fast(c.clone());
        c.power.reissue_after = Duration::from_millis(200);
        c.power.timeout = Duration::from_millis(900);
    });
    let resets = posts(&proxy, "ComputerSystem.Reset");
    let e = stubborn.power_off(&access).await.expect_err("never off");
    assert_eq!((e.kind, e.code.as_str()), (BmcErrorKind::Transient, "bmc_power_timeout"), "{e:?}");
    assert_eq!(posts(&proxy, "ComputerSystem.Reset"), resets + 2, "sent, then re-issued once");
}

#[tokio::test]
async fn accepted_reset_is_followed_through_its_task_monitor() {
    let emu = require!(emulators());
    let raw = emu.raw();
    let node = raw.node("node-015").await;
    raw.force_power(&node, true).await;
    let proxy = FaultProxy::start(&emu.url).await;
    // Perturbation: the BMC answers 202 with a task monitor (Running twice, then the result).
    proxy.rule(Rule::containing(Some(Method::POST), "ComputerSystem.Reset", Fault::Accepted { polls: 2, fail: None }));
    driver().power_off(&access(emu, &proxy.url, &node)).await.expect("power off");
    assert_eq!(proxy.count(&Method::GET, "/TaskMonitors/"), 3);
    assert_eq!(raw.system(&node).await["PowerState"], "Off");

    // A task that fails is a failed call (and says why).
    raw.force_power(&node, true).await;
    let failing = FaultProxy::start(&emu.url).await;
    failing.rule(Rule::containing(
        Some(Method::POST),
        "ComputerSystem.Reset",
        Fault::Accepted { polls: 1, fail: Some("power controller busy".into()) },
    ));
    let e = driver().power_off(&access(emu, &failing.url, &node)).await.expect_err("task failed");
    assert_eq!(e.code, "bmc_task_failed", "{e:?}");
    assert!(e.message.contains("power controller busy"), "{e}");
}

#[tokio::test]
async fn the_seed_token_never_appears_in_errors_or_logs() {
    let emu = require!(emulators());
    let images = ImageServer::start().await;
    let raw = emu.raw();
    let node = raw.node("node-010").await;
    let bmc = driver();
    let access = access(emu, &emu.url, &node);
    let token = "tok-DDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDD";
    let (logs, _guard) = logs::capture();

    // A seed the emulator cannot fetch: it answers 500 with a message that quotes the URL (and
    // its path on its own), which the client retries (logging each failure) and then reports.
    let unreachable = BootMedia {
        image_url: images.url("wipe.iso").to_string(),
        seed_url: SecretString::new(format!("http://127.0.0.1:1/v1/agent/seed/{token}.iso")),
    };
    let e = bmc.boot_from_media(&access, &unreachable).await.expect_err("the seed cannot be fetched");
    let shown = format!("{e} | {e:?}");
    assert_eq!(e.kind, BmcErrorKind::Transient, "{shown}");
    assert!(!shown.contains(token), "the token leaked into the error: {shown}");
    assert!(shown.contains("http://127.0.0.1:1/v1/agent/seed/[redacted]"), "masked URL expected: {shown}");

    // A successful boot logs its steps, never the seed.
    let media = media(&images, token);
    bmc.boot_from_media(&access, &media).await.expect("boot");
    assert_media_booted(&raw, &node, &media).await;
    bmc.finish_boot(&access, AfterBoot::PowerOff).await.expect("finish");

    let text = logs.text();
    assert!(text.contains("retrying"), "the 500s were logged (capture works): {text}");
    assert!(text.contains("booting from virtual media"), "{text}");
    assert!(text.contains("/v1/agent/seed/[redacted]"), "the BMC's message was logged, scrubbed: {text}");
    assert!(!text.contains(token), "the token leaked into the logs");
}

#[tokio::test]
async fn a_single_virtual_media_device_is_no_second_virtual_media() {
    let emu = require!(emulators());
    let images = ImageServer::start().await;
    let raw = emu.raw();
    let node = raw.node("node-011").await;
    let proxy = FaultProxy::start(&emu.url).await;
    // Perturbation: a BMC with one virtual media device (sushy-tools always has Cd and Floppy).
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
    let before = raw.system(&node).await;
    let e = driver()
        .boot_from_media(&access(emu, &proxy.url, &node), &media(&images, "tok-EEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEE"))
        .await
        .expect_err("one device");
    assert_eq!((e.kind, e.code.as_str()), (BmcErrorKind::CapabilityGap, NO_SECOND_VIRTUAL_MEDIA), "{e:?}");
    assert!(e.message.contains("Cd"), "{e}");
    // Found out before anything changed.
    assert!(proxy.changes().is_empty(), "{:?}", proxy.changes());
    assert_eq!(raw.system(&node).await["PowerState"], before["PowerState"]);
}

#[tokio::test]
async fn media_boot_over_tls_polls_the_delayed_power_changes() {
    let tls = require!(tls_emulator());
    let _only_user = tls_system_lock().await;
    let images = ImageServer::start().await;
    let bmc = driver();
    let mut access = BmcAccess {
        machine_id: Default::default(),
        url: tls.url.to_string(),
        system_id: None,
        username: String::new(),
        password: SecretString::new(String::new()),
        ca_cert: Some(tls.ca_pem.clone()),
        insecure_tls: false,
        system_uuid: None,
    };
    access.system_uuid = Some(bmc.inspect(&access).await.expect("inspect").system_uuid);
    let media = media(&images, "tok-FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF");

    // Reads through a separate client (not the driver under test).
    let mut config = fast(RedfishConfig::new(tls.url.clone(), "", Password::new("")));
    config.ca_cert_pem = Some(tls.ca_pem.clone());
    let reader = RedfishClient::new(config).expect("client");
    let loaded = || async {
        let devices = reader.virtual_media_devices().await.expect("devices");
        devices.iter().map(|d| (d.id.clone(), d.inserted == Some(true))).collect::<Vec<_>>()
    };

    // This emulator applies power changes 2 s late (a restart reads Off meanwhile).
    bmc.boot_from_media(&access, &media).await.expect("boot over TLS");
    let inv = reader.system().await.expect("system");
    assert_eq!(inv.power_state, Some(ReportedPowerState::On));
    assert_eq!(inv.boot.and_then(|b| b.target).as_deref(), Some("Cd"));
    assert_eq!(loaded().await, [("Cd".to_owned(), true), ("Floppy".to_owned(), true)]);
    bmc.finish_boot(&access, AfterBoot::BootFromDisk).await.expect("restart from disk");
    let inv = reader.system().await.expect("system");
    assert_eq!(inv.power_state, Some(ReportedPowerState::On));
    assert_eq!(inv.boot.and_then(|b| b.target).as_deref(), Some("Hdd"));
    assert_eq!(loaded().await, [("Cd".to_owned(), false), ("Floppy".to_owned(), false)]);
    bmc.finish_boot(&access, AfterBoot::PowerOff).await.expect("power off");
    bmc.power_off(&access).await.expect("already off");
    assert_eq!(bmc.inspect(&access).await.expect("inspect").power_on, Some(false));
    // Off for good: the emulator holds no power change that it would still apply by itself.
    let uuid = access.system_uuid.clone().expect("inspected");
    let Ok(pending) = tls_pending_power(&uuid) else { return };
    assert_eq!(pending, None, "a power change is still pending");
}

/// A wipe's boot and its end without waiting for the power, on the emulator that applies
/// power changes 2 s late. The boot's call returns once the power-on is asked for; the power
/// settles through `power_progress`; the end, asked for before the power-on has even shown (an
/// agent that reports at once), first settles that power-on, then answers `Pending` until the
/// power-off is through, and leaves the machine off for good.
#[tokio::test]
async fn a_wipe_boot_and_its_end_return_while_the_power_changes() {
    let tls = require!(tls_emulator());
    let _only_user = tls_system_lock().await;
    let images = ImageServer::start().await;
    let bmc = driver();
    let mut access = BmcAccess {
        machine_id: Default::default(),
        url: tls.url.to_string(),
        system_id: None,
        username: String::new(),
        password: SecretString::new(String::new()),
        ca_cert: Some(tls.ca_pem.clone()),
        insecure_tls: false,
        system_uuid: None,
    };
    access.system_uuid = Some(bmc.inspect(&access).await.expect("inspect").system_uuid);
    bmc.power_off(&access).await.expect("off to begin with");
    assert_eq!(bmc.power_progress(&access).await.expect("nothing pending"), PowerProgress::Done);
    let media = media(&images, "tok-GGGGGGGGGGGGGGGGGGGGGGGGGGGGGGGGGGGGGGGGGGG");

    let boot = bmc.start_boot_from_media(&access, &media).await.expect("start the boot");
    assert_eq!(boot, PowerProgress::Done, "the boot is under way");
    // The emulator still reads Off: the power-on is pending, so the call did not wait for it.
    assert!(matches!(bmc.power_progress(&access).await.expect("progress"), PowerProgress::Pending(_)));

    // The end at once, before the power-on shows: Pending until the machine was on and is off.
    let mut pending = 0;
    loop {
        match bmc.start_finish_boot(&access, AfterBoot::PowerOff).await.expect("finish") {
            PowerProgress::Done => break,
            PowerProgress::Pending(after) => {
                pending += 1;
                assert!(pending < 200, "the power never settled");
                tokio::time::sleep(after).await;
            }
        }
    }
    // Two delayed power changes: pending at least twice (no timed assert: it measured 3.96 s
    // against 4 s on a loaded machine).
    assert!(pending >= 2, "{pending}");
    assert_eq!(bmc.power_progress(&access).await.expect("settled"), PowerProgress::Done);
    // Off for good, media out, boot back to the disk: no power-on was still pending.
    let inv = bmc.inspect(&access).await.expect("inspect");
    assert_eq!(inv.power_on, Some(false));
    let Ok(pending) = tls_pending_power(&inv.system_uuid) else { return };
    assert_eq!(pending, None, "a power change is still pending");
    let mut config = fast(RedfishConfig::new(tls.url.clone(), "", Password::new("")));
    config.ca_cert_pem = Some(tls.ca_pem.clone());
    let reader = RedfishClient::new(config).expect("client");
    assert_eq!(reader.system().await.expect("system").boot.and_then(|b| b.target).as_deref(), Some("Hdd"));
    let devices = reader.virtual_media_devices().await.expect("devices");
    assert!(devices.iter().all(|d| d.inserted != Some(true)), "{devices:?}");
}

/// The driver remembers where a machine's system and media devices are, so only its
/// first call reads the service root and the collections; every call still reads the system
/// itself (the UUID guard of docs/security.md). Another endpoint for the machine starts afresh.
/// Read-only calls on node-011.
#[tokio::test]
async fn discovery_is_remembered_per_machine_but_the_system_is_read_every_time() {
    let emu = require!(emulators());
    let raw = emu.raw();
    let node = raw.node("node-011").await;
    let proxy = FaultProxy::start(&emu.url).await; // transparent: counts requests only
    let bmc = driver();
    let access = access(emu, &proxy.url, &node);
    let reads = |path: &str| {
        proxy.seen().iter().filter(|s| s.method == Method::GET && s.path.trim_end_matches('/') == path).count()
    };
    bmc.inspect(&access).await.expect("inspect");
    for _ in 0..3 {
        let status = bmc.system_status(&access).await.expect("status");
        assert!(status.power_on.is_some(), "{status:?}");
        // sushy-tools rates every system OK, whatever happens to it: a health other than healthy
        // is tested on the simulated BMC and on recorded payloads.
        assert_eq!(
            status.health.as_ref().map(|h| h.status),
            Some(paddock_types::health::HealthStatus::Healthy),
            "{status:?}"
        );
    }
    let calls = 1 + 3;
    assert_eq!(reads("/redfish/v1"), 1, "service root");
    assert_eq!(reads("/redfish/v1/Systems"), 1, "Systems collection");
    // Once per call, plus once by the discovery (matching the configured system id).
    assert_eq!(reads(node.path.trim_end_matches('/')), calls + 1, "the system, once per call");

    // Another endpoint (here: the system id spelled otherwise, as after a PATCH of it) is
    // discovered again.
    let mut moved = access.clone();
    moved.system_id = Some(node.uuid.to_uppercase());
    bmc.inspect(&moved).await.expect("inspect at the new endpoint");
    assert_eq!(reads("/redfish/v1"), 2, "service root again");
}

/// Adds `#Drive.SecureErase` to the drive's resource (a JSON rewrite of its GET), its target
/// under the drive's own `@odata.id`.
fn advertise_secure_erase(proxy: &FaultProxy, node: &Node, drive: &str) {
    proxy.rule(Rule::exact(
        Some(Method::GET),
        &format!("{}/Storage/1/Drives/{drive}", node.path),
        Fault::Rewrite(Arc::new(|v: &mut Value| {
            let target = format!("{}/Actions/Drive.SecureErase", v["@odata.id"].as_str().unwrap_or_default());
            v["Actions"]["#Drive.SecureErase"] = serde_json::json!({ "target": target });
        })),
    ));
}

/// Out-of-band erase (docs/security.md). sushy-tools has no `Drive.SecureErase`, so the action is
/// the TEST PROXY's: it adds the action to drives `nvme0` and `nvme1` of the real emulator's
/// system (rewriting their GETs), answers the POST to `nvme0`'s itself with 204 (a BMC that
/// accepted the erase) and refuses `nvme1`'s with 400, and records both POSTs. Everything else,
/// the UUID guard's reads and the storage walk included, is the emulator's. Without the action
/// nothing is posted. Changes nothing in the emulator (node-011).
#[tokio::test]
async fn secure_erase_is_called_on_every_drive_that_advertises_it_and_each_result_is_returned() {
    use paddock_domain::bmc::{EraseResult, EraseScope, OutOfBandErase};
    let emu = require!(emulators());
    let node = emu.raw().node("node-011").await;
    let plain = FaultProxy::start(&emu.url).await; // transparent: counts requests only
    let none = driver().erase_out_of_band(&access(emu, &plain.url, &node)).await.expect("erase");
    assert_eq!(none, [], "the emulator advertises no erase");
    assert_eq!(plain.changes().len(), 0, "nothing was posted: {:?}", plain.changes());

    let proxy = FaultProxy::start(&emu.url).await;
    advertise_secure_erase(&proxy, &node, "nvme0");
    advertise_secure_erase(&proxy, &node, "nvme1");
    proxy.rule(Rule::containing(Some(Method::POST), "/Drives/nvme0/Actions/Drive.SecureErase", Fault::Drop));
    proxy.rule(Rule::containing(
        Some(Method::POST),
        "/Drives/nvme1/Actions/Drive.SecureErase",
        Fault::Status { status: 400, retry_after: None },
    ));
    let erased = driver().erase_out_of_band(&access(emu, &proxy.url, &node)).await.expect("erase");
    let ok = OutOfBandErase {
        scope: EraseScope::Drive,
        id: "nvme0".into(),
        action: "Drive.SecureErase".into(),
        result: EraseResult::Success,
        detail: None,
    };
    assert_eq!(erased.len(), 2, "{erased:?}");
    assert_eq!(erased[0], ok);
    assert_eq!((erased[1].id.as_str(), erased[1].result), ("nvme1", EraseResult::Failure), "{erased:?}");
    assert!(erased[1].detail.as_deref().is_some_and(|d| d.contains("400")), "the failure says why: {erased:?}");
    let posts: Vec<String> = proxy.changes().into_iter().map(|s| s.path).collect();
    assert_eq!(
        posts,
        [
            format!("{}/Storage/1/Drives/nvme0/Actions/Drive.SecureErase", node.path),
            format!("{}/Storage/1/Drives/nvme1/Actions/Drive.SecureErase", node.path),
        ],
        "one erase per drive, nothing else changed"
    );

    // A system that is not the one on record is refused before any erase.
    let mut other = access(emu, &proxy.url, &node);
    other.system_uuid = Some("00000000-0000-0000-0000-000000000000".into());
    let e = driver().erase_out_of_band(&other).await.expect_err("another system");
    assert_eq!(e.code, SYSTEM_UUID_MISMATCH, "{e:?}");
    assert_eq!(proxy.changes().len(), 2, "no erase on another system");
}

/// A real BMC's secure erase that ends badly (docs/security.md, out-of-band erase). sushy-tools
/// has no `Drive.SecureErase`, so the flow is bmcweb's, REPLAYED by the test proxy from its public
/// source (`support/recorded.rs` says where each answer comes from), not a live BMC: the drive
/// advertises the action with an ActionInfo, the POST is answered `202` with a task monitor, the
/// monitor answers `202` while the task runs and then `204`, and the Task resource says it was
/// aborted. paddock sends the strongest `SanitizationType` the ActionInfo allows, follows the
/// monitor to its end, reads the Task, and returns the failure with the BMC's own message: a
/// monitor's `204` is not taken for a completed erase. Changes nothing in the emulator (node-011).
#[tokio::test]
async fn a_secure_erase_task_the_bmc_aborts_is_returned_as_failed_with_its_message() {
    use crate::support::recorded::{final_message, replay_secure_erase, Ending, MONITOR, TASK};
    use paddock_domain::bmc::EraseResult;
    let emu = require!(emulators());
    let node = emu.raw().node("node-011").await;
    let proxy = FaultProxy::start(&emu.url).await;
    replay_secure_erase(&proxy, "/Storage/1/Drives/nvme0", 1, Ending::Aborted);

    let erased = driver().erase_out_of_band(&access(emu, &proxy.url, &node)).await.expect("erase");
    assert_eq!(erased.len(), 1, "{erased:?}");
    assert_eq!((erased[0].id.as_str(), erased[0].result), ("nvme0", EraseResult::Failure), "{erased:?}");
    let detail = erased[0].detail.as_deref().unwrap_or_default();
    assert!(detail.contains(final_message(Ending::Aborted)), "the BMC's own words: {detail}");
    let posts: Vec<Option<Value>> = proxy.changes().into_iter().map(|s| s.body).collect();
    assert_eq!(
        posts,
        [Some(json!({ "SanitizationType": "CryptographicErase" }))],
        "one erase, as the ActionInfo allows"
    );
    assert_eq!(proxy.count(&Method::GET, MONITOR), 2, "the monitor is followed to its end");
    assert_eq!(proxy.count(&Method::GET, TASK) - proxy.count(&Method::GET, MONITOR), 1, "then the Task is read");
}

/// Out-of-band erase beyond drives (docs/security.md: "the BIOS/`Storage` actions a BMC lists").
/// sushy-tools has neither action, so they are the TEST PROXY's: it adds
/// `#Storage.ResetToDefaults` to the real emulator's storage subsystem `1` and
/// `#ComputerSystem.Decommission` to its system (rewriting their GETs), accepts the POSTs itself
/// and records their bodies. paddock calls the narrowest first, sends `ResetAll` and only
/// the `UserData` decommission with a secure erase required (never the types that would reset
/// the provider's BMC or firmware settings), and leaves out an action whose advertised values
/// lack what it would send. Changes nothing in the emulator (node-011).
#[tokio::test]
async fn storage_reset_and_system_decommission_are_called_where_advertised() {
    use paddock_domain::bmc::{EraseResult, EraseScope};
    let emu = require!(emulators());
    let node = emu.raw().node("node-011").await;
    let proxy = FaultProxy::start(&emu.url).await;
    let storage = format!("{}/Storage/1", node.path);
    advertise_action(&proxy, &storage, "#Storage.ResetToDefaults", json!(["ResetAll", "PreserveVolumes"]));
    advertise_action(&proxy, &node.path, "#ComputerSystem.Decommission", json!(["UserData", "All", "BIOSConfig"]));
    proxy.rule(Rule::containing(Some(Method::POST), "/Actions/", Fault::Drop));

    let erased = driver().erase_out_of_band(&access(emu, &proxy.url, &node)).await.expect("erase");
    let done: Vec<(EraseScope, &str, EraseResult)> =
        erased.iter().map(|e| (e.scope, e.action.as_str(), e.result)).collect();
    assert_eq!(
        done,
        [
            (EraseScope::Storage, "Storage.ResetToDefaults", EraseResult::Success),
            (EraseScope::System, "ComputerSystem.Decommission", EraseResult::Success),
        ],
        "{erased:?}"
    );
    assert_eq!(erased[0].id, "1", "the storage subsystem's id: {erased:?}");
    let posts: Vec<(String, Option<Value>)> = proxy.changes().into_iter().map(|s| (s.path, s.body)).collect();
    assert_eq!(
        posts,
        [
            (format!("{storage}/Actions/Storage.ResetToDefaults"), Some(json!({ "ResetType": "ResetAll" }))),
            (
                format!("{}/Actions/ComputerSystem.Decommission", node.path),
                Some(json!({ "DecommissionTypes": ["UserData"], "RequireSecureErase": true })),
            ),
        ],
        "each advertised erase once, with what paddock sends"
    );

    // A BMC whose decommission allows only types that would reset its own or the firmware's
    // settings is not asked for one; the storage reset still is.
    let narrow = FaultProxy::start(&emu.url).await;
    advertise_action(&narrow, &storage, "#Storage.ResetToDefaults", json!(["ResetAll"]));
    advertise_action(&narrow, &node.path, "#ComputerSystem.Decommission", json!(["ManagerConfig", "BIOSConfig"]));
    narrow.rule(Rule::containing(Some(Method::POST), "/Actions/", Fault::Drop));
    let erased = driver().erase_out_of_band(&access(emu, &narrow.url, &node)).await.expect("erase");
    assert_eq!(erased.len(), 1, "{erased:?}");
    assert_eq!(erased[0].scope, EraseScope::Storage, "{erased:?}");
    assert_eq!(narrow.changes().len(), 1, "no decommission: {:?}", narrow.changes());
}

/// Adds the action `name` (e.g. `#Storage.ResetToDefaults`) to the resource at `path` (a JSON
/// rewrite of its GET), its target under the resource's own `@odata.id`, with `allowed` as the
/// allowable values of its parameter.
fn advertise_action(proxy: &FaultProxy, path: &str, name: &'static str, allowed: Value) {
    proxy.rule(Rule::exact(
        Some(Method::GET),
        path,
        Fault::Rewrite(Arc::new(move |v: &mut Value| {
            let target = format!("{}/Actions/{}", v["@odata.id"].as_str().unwrap_or_default(), &name[1..]);
            let param = if name.ends_with("Decommission") { "DecommissionTypes" } else { "ResetType" };
            let mut action = json!({ "target": target });
            action[format!("{param}@Redfish.AllowableValues")] = allowed.clone();
            v["Actions"][name] = action;
        })),
    ));
}

/// A media boot whose image insert outlasts the insert timeout (the BMC fetches the image inside
/// the request) fails as transient without sending the insert again; the next boot finds the
/// image landed, keeps it instead of ejecting it, and boots. The BMC fetches the image once.
#[tokio::test]
async fn a_media_boot_whose_insert_outlasts_its_timeout_keeps_the_image_that_landed() {
    let emu = require!(emulators());
    let images = ImageServer::start().await;
    images.delay_images(Duration::from_secs(5));
    let raw = emu.raw();
    let node = raw.node("node-017").await;
    let access = access(emu, &emu.url, &node);
    let bmc = RedfishBmc::new(BmcLimiter::new(4)).with_tuning(|c: &mut RedfishConfig| {
        *c = fast(c.clone());
        c.insert_timeout = Duration::from_secs(2);
    });
    let media = BootMedia {
        image_url: images.url("node-os.iso").to_string(),
        seed_url: SecretString::new(images.seed_url("tok-BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB").to_string()),
    };

    let err = bmc.boot_from_media(&access, &media).await.expect_err("the insert got no answer in time");
    assert_eq!((err.kind, err.code.as_str()), (BmcErrorKind::Transient, "bmc_media_insert_unconfirmed"), "{err:?}");
    let cd = || async { device(&raw, &node, "Cd").await };
    eventually(Duration::from_secs(60), || async { cd().await["Inserted"] == true }).await;

    bmc.boot_from_media(&access, &media).await.expect("boot with the image that landed");
    assert_media_booted(&raw, &node, &media).await;
    assert_eq!(images.downloads_of("node-os.iso"), 1, "the BMC fetched the image once");
    bmc.finish_boot(&access, AfterBoot::PowerOff).await.expect("finish: power off");
    assert_finished(&raw, &node, "Off").await;
}
