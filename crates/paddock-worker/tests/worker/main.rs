//! Tests of the durable job queue (`paddock_store::job`) and the worker loop, against a real
//! PostgreSQL: one fresh database per test (`paddock_testkit::TestDb`).
//!
//! Run with `scripts/test -p paddock-worker`. `RUST_LOG=paddock_worker=debug` shows the worker's
//! logs.

#[macro_use]
mod emulator;

mod agent;
mod crash;
mod inspect;
mod lifecycle;
mod outage;
// paddock-redfish's test proxy, of which the lifecycle tests use a part.
mod power;
#[path = "../../../paddock-redfish/tests/support/proxy.rs"]
#[allow(dead_code)]
mod proxy;
mod queue;
// A real BMC's secure erase, replayed through that proxy.
#[path = "../../../paddock-redfish/tests/support/recorded.rs"]
#[allow(dead_code)]
mod recorded;
mod release;
mod reseal;
mod support;
mod wake;
mod worker;
