//! The simulated BMC: identity, idempotence, the UUID guard, faults, one world across processes.

use paddock_domain::bmc::{AfterBoot, BmcErrorKind, BootMedia, NO_SECOND_VIRTUAL_MEDIA, SYSTEM_UUID_MISMATCH};
use paddock_domain::secret::SecretString;
use paddock_sim::{system_uuid, MachineFault, SimConfig};

use crate::{access, world, world_on};

fn media(token: &str) -> BootMedia {
    BootMedia {
        image_url: "https://images.example/wipe.iso".to_owned(),
        seed_url: SecretString::new(format!("http://127.0.0.1:9/v1/agent/seed/{token}.iso")),
    }
}

#[tokio::test]
async fn first_contact_creates_a_deterministic_machine() {
    let (_db, world) = world().await;
    let bmc = world.bmc();
    let inv = bmc.inspect(&access("node-1", None)).await.expect("inspect");
    assert_eq!(inv.system_uuid, system_uuid("node-1"));
    assert_eq!(inv.manufacturer.as_deref(), Some("paddock-sim"));
    assert_eq!(inv.power_on, Some(false));
    assert_eq!(inv.cpu_cores, None, "unreported: unverified");
    assert_eq!(inv.memory_gib, None);
    let drives = inv.drives.clone().expect("drives");
    assert_eq!(drives.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), ["disk0", "disk1"]);
    assert!(drives.iter().all(|d| d.capacity_bytes.is_some_and(|c| c > 0)));
    // Again, and from another database: the same machine.
    assert_eq!(bmc.inspect(&access("node-1", None)).await.expect("inspect again"), inv);
    let (_db2, other) = crate::world().await;
    assert_eq!(other.bmc().inspect(&access("node-1", None)).await.expect("inspect").system_uuid, inv.system_uuid);
    assert_ne!(bmc.inspect(&access("node-2", None)).await.expect("inspect").system_uuid, inv.system_uuid);
}

#[tokio::test]
async fn hardware_can_be_reported() {
    let (_db, world) = world().await;
    world.set_machine_hardware("big", Some(64), Some(512)).await.expect("set");
    let inv = world.bmc().inspect(&access("big", None)).await.expect("inspect");
    assert_eq!((inv.cpu_cores, inv.memory_gib), (Some(64), Some(512)));
}

#[tokio::test]
async fn other_schemes_and_unknown_systems_are_refused() {
    let (_db, world) = world().await;
    let mut a = access("x", None);
    a.url = "https://bmc.example".to_owned();
    let err = world.bmc().inspect(&a).await.expect_err("not simulated");
    assert_eq!((err.kind, err.code.as_str()), (BmcErrorKind::Permanent, "bmc_config_invalid"));
    let mut a = access("x", None);
    a.system_id = Some("System.Embedded.7".to_owned());
    let err = world.bmc().inspect(&a).await.expect_err("no such system");
    assert_eq!((err.kind, err.code.as_str()), (BmcErrorKind::Permanent, "bmc_system_not_found"));
    for id in [paddock_sim::SYSTEM_ID.to_owned(), system_uuid("x").to_uppercase()] {
        a.system_id = Some(id);
        world.bmc().inspect(&a).await.expect("the system by id or UUID");
    }
}

#[tokio::test]
async fn destructive_calls_check_the_system_uuid() {
    let (_db, world) = world().await;
    let bmc = world.bmc();
    let wrong = access("node-1", Some(system_uuid("node-2")));
    let none = access("node-1", None);
    for a in [&wrong, &none] {
        let errors = [
            bmc.boot_from_media(a, &media("t")).await.expect_err("boot"),
            bmc.finish_boot(a, AfterBoot::BootFromDisk).await.expect_err("finish"),
            bmc.power_off(a).await.expect_err("power off"),
        ];
        for err in errors {
            assert_eq!(err.kind, BmcErrorKind::Permanent, "{err}");
            if a.system_uuid.is_some() {
                assert_eq!(err.code, SYSTEM_UUID_MISMATCH);
            }
        }
    }
    let machine = world.machine("node-1").await.expect("read").expect("exists");
    assert!(!machine.power_on && machine.boot_seq == 0, "nothing happened: {machine:?}");
}

#[tokio::test]
async fn boots_converge_when_repeated() {
    let (_db, world) = world().await;
    let bmc = world.bmc();
    let a = access("node-1", Some(system_uuid("node-1")));
    bmc.boot_from_media(&a, &media("t")).await.expect("boot");
    let m = world.machine("node-1").await.expect("read").expect("exists");
    assert!(m.power_on && m.seed_inserted && m.boot_override.as_deref() == Some("cd"));
    assert_eq!((m.boot_seq, m.image_url.as_deref()), (1, Some("https://images.example/wipe.iso")));
    // Repeating a boot restarts it: one more boot, same media.
    bmc.boot_from_media(&a, &media("t")).await.expect("boot again");
    assert_eq!(world.machine("node-1").await.expect("read").expect("exists").boot_seq, 2);

    for _ in 0..2 {
        bmc.finish_boot(&a, AfterBoot::BootFromDisk).await.expect("finish");
        let m = world.machine("node-1").await.expect("read").expect("exists");
        assert!(m.power_on && !m.seed_inserted && m.image_url.is_none() && m.boot_override.is_none(), "{m:?}");
        assert!(m.booted_from_disk);
    }
    for _ in 0..2 {
        bmc.finish_boot(&a, AfterBoot::PowerOff).await.expect("finish, off");
        bmc.power_off(&a).await.expect("off (already off is fine)");
        let m = world.machine("node-1").await.expect("read").expect("exists");
        assert!(!m.power_on && !m.seed_inserted);
    }
    let inv = bmc.inspect(&a).await.expect("inspect");
    assert_eq!(inv.power_on, Some(false));
}

#[tokio::test]
async fn machine_faults_fail_calls_as_a_bmc_would() {
    let (_db, world) = world().await;
    let bmc = world.bmc();
    let a = access("flaky", Some(system_uuid("flaky")));

    world.set_machine_fault("flaky", MachineFault::BmcTimeout, true).await.expect("fault");
    world.set_machine_fault("flaky", MachineFault::BmcTimeout, true).await.expect("fault twice");
    let err = bmc.inspect(&a).await.expect_err("timeout");
    assert_eq!((err.kind, err.code.as_str()), (BmcErrorKind::Transient, "bmc_timeout"));
    world.set_machine_fault("flaky", MachineFault::BmcTimeout, false).await.expect("heal");

    world.set_machine_fault("flaky", MachineFault::AuthFails, true).await.expect("fault");
    let err = bmc.power_off(&a).await.expect_err("auth");
    assert_eq!((err.kind, err.code.as_str()), (BmcErrorKind::AuthFailed, "bmc_auth_failed"));
    world.set_machine_fault("flaky", MachineFault::AuthFails, false).await.expect("heal");

    world.set_machine_fault("flaky", MachineFault::SingleVirtualMedia, true).await.expect("fault");
    let err = bmc.boot_from_media(&a, &media("t")).await.expect_err("one medium");
    assert_eq!((err.kind, err.code.as_str()), (BmcErrorKind::CapabilityGap, NO_SECOND_VIRTUAL_MEDIA));
    world.set_machine_fault("flaky", MachineFault::SingleVirtualMedia, false).await.expect("heal");

    bmc.boot_from_media(&a, &media("t")).await.expect("healed");
    assert!(world.machine("flaky").await.expect("read").expect("exists").faults.is_empty());
}

#[tokio::test]
async fn two_processes_share_one_world() {
    let (db, one) = world().await;
    let two = world_on(&db, SimConfig::zero());
    let a = access("shared", Some(system_uuid("shared")));
    one.bmc().boot_from_media(&a, &media("t")).await.expect("boot in one");
    assert_eq!(two.bmc().inspect(&a).await.expect("inspect in two").power_on, Some(true));
    two.set_machine_fault("shared", MachineFault::BmcTimeout, true).await.expect("fault in two");
    assert_eq!(one.bmc().inspect(&a).await.expect_err("seen by one").code, "bmc_timeout");
    // First contact from both at once converges on one record.
    let (b1, b2, race) = (one.bmc(), two.bmc(), access("race", None));
    let (r1, r2) = tokio::join!(b1.inspect(&race), b2.inspect(&race));
    assert_eq!(r1.expect("one").system_uuid, r2.expect("two").system_uuid);
    assert_eq!(db.count("paddock_sim.machines").await, 2);
}
