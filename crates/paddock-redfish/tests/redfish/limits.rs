//! The concurrency bounds, observed from the BMC's side by the proxy's in-flight counters.

use std::time::Duration;

use paddock_redfish::{BmcLimiter, RedfishClient};

use crate::require;
use crate::support::emulators;
use crate::support::proxy::FaultProxy;

/// Two clients for one machine (as two workers would have), each making several calls at once.
async fn hammer_one_machine(limiter: Option<BmcLimiter>) -> usize {
    let emu = emulators().expect("checked by the caller");
    let node = emu.raw().node("node-013").await;
    let proxy = FaultProxy::start(&emu.url).await;
    // Each request takes a while, so overlapping calls would show.
    proxy.delay_all(Duration::from_millis(40));
    let make = || {
        let client = RedfishClient::new(emu.config_at(&proxy.url, Some(&node.uuid))).expect("client");
        match &limiter {
            Some(l) => client.with_limiter(l.clone(), node.uuid.clone()),
            None => client,
        }
    };
    let (a, b) = (make(), make());
    let calls = [&a, &b, &a, &b].map(|c| async move { c.virtual_media_devices().await.expect("devices") });
    futures_join(calls).await;
    proxy.max_in_flight_for(&node.uuid)
}

async fn futures_join<F: std::future::Future>(futures: [F; 4]) {
    let [a, b, c, d] = futures;
    tokio::join!(a, b, c, d);
}

#[tokio::test]
async fn one_call_in_flight_per_machine() {
    let _emu = require!(emulators());
    assert_eq!(hammer_one_machine(Some(BmcLimiter::new(8))).await, 1);
}

#[tokio::test]
async fn without_a_limiter_calls_for_one_machine_overlap() {
    // The control for the test above: the proxy does see overlapping calls when nothing bounds them.
    let _emu = require!(emulators());
    assert!(hammer_one_machine(None).await >= 2);
}

#[tokio::test]
async fn per_host_bound_is_respected() {
    let emu = require!(emulators());
    let proxy = FaultProxy::start(&emu.url).await;
    proxy.delay_all(Duration::from_millis(40));
    let limiter = BmcLimiter::new(2);
    let mut clients = Vec::new();
    for name in ["node-010", "node-011", "node-013", "node-014"] {
        let node = emu.raw().node(name).await;
        let client = RedfishClient::new(emu.config_at(&proxy.url, Some(&node.uuid))).expect("client");
        clients.push(client.with_limiter(limiter.clone(), node.uuid.clone()));
    }
    let [a, b, c, d] = [0, 1, 2, 3].map(|i| {
        let client = &clients[i];
        async move { client.virtual_media_devices().await.expect("devices") }
    });
    tokio::join!(a, b, c, d);
    let max = proxy.max_in_flight_total();
    assert!(max <= 2, "{max} requests in flight on one BMC host, bound 2");
    // Four machines with work: the bound was reached, not merely undisturbed.
    assert_eq!(max, 2);
}
