//! Integration tests of the Redfish client against the real sushy-tools emulator started by
//! `scripts/test` (`scripts/redfish-start`): a main emulator (HTTP, basic auth, 18 systems) and a
//! TLS one (HTTPS, private CA, 1 system, 2 s power delay). Fault tests put the test-only proxy of
//! `tests/support/proxy.rs` in front of the main emulator.
//!
//! Each test that changes state owns one system of the main emulator (`node-NNN`, see the table
//! below), so tests run in parallel and in any order:
//!
//! | system   | owner                                   |
//! | -------- | --------------------------------------- |
//! | node-000 | power::on_and_off_converge (and paddock-worker's power sync test, in its own test binary; ends Off) |
//! | node-001 | boot::boot_once_sets_the_target         |
//! | node-002 | media::insert_and_eject_round_trip      |
//! | node-003 | guard::uuid_mismatch_* (never changed)  |
//! | node-004 | faults::lost_reset_is_reissued_once     |
//! | node-005 | faults::task_monitor_is_followed        |
//! | node-006 | media::virtual_media_through_the_manager|
//! | node-007 | media::missing_image_is_rejected        |
//! | node-008 | faults: lost resets, capability gaps    |
//! | node-009 | faults::failed_task_is_an_error (and paddock-worker's out-of-band erase tests, in its own test binary; ends Off) |
//! | node-012 | media::unknown_device_*                 |
//! | node-016 | media::an_insert_that_outlasts_its_timeout_* |
//! | node-017 | driver::a_media_boot_whose_insert_outlasts_* |
//! | node-010, node-011, node-013..015 | read-only tests, and one `driver` test each |
//!
//! The `driver` tests (`RedfishBmc`) change the systems the read-only tests only read: node-013
//! (media boot round trip), node-014 (lost resets), node-015 (task monitor), node-010 (seed
//! secrecy), node-011 (single device, and out-of-band erase through the proxy: both change nothing); node-003 (UUID guard, changes nothing).
//! The TLS emulator's one system is changed under `support::tls_system_lock`.

#[path = "../support/mod.rs"]
mod support;

mod boot;
mod discovery;
mod driver;
mod faults;
mod guard;
mod limits;
mod media;
mod power;
mod tls;
