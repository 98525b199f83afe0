//! TLS: the machine's CA (and only it) is trusted, or the explicit insecure flag.

use paddock_redfish::{Password, RedfishClient, RedfishConfig, RedfishError};

use crate::require;
use crate::support::{fast, tls_emulator, TlsEmulator};

fn config(tls: &TlsEmulator) -> RedfishConfig {
    fast(RedfishConfig::new(tls.url.clone(), "", Password::new("")))
}

#[tokio::test]
async fn tls_with_the_machine_ca_works() {
    let tls = require!(tls_emulator());
    let mut config = config(tls);
    config.ca_cert_pem = Some(tls.ca_pem.clone());
    let client = RedfishClient::new(config).expect("client");
    assert!(client.service_root().await.expect("root").redfish_version.is_some());
    assert!(client.system().await.expect("system").uuid.is_some());
}

fn assert_tls_refused(err: RedfishError) {
    assert!(matches!(err, RedfishError::Tls { .. }), "expected a TLS failure, got {err:?}");
    assert!(!err.is_transient(), "a certificate problem does not go away by retrying");
    assert_eq!(err.code(), "bmc_tls_failed");
}

#[tokio::test]
async fn tls_without_a_ca_is_refused() {
    let tls = require!(tls_emulator());
    let client = RedfishClient::new(config(tls)).expect("client");
    assert_tls_refused(client.service_root().await.expect_err("untrusted certificate"));
}

#[tokio::test]
async fn tls_with_another_ca_is_refused() {
    let tls = require!(tls_emulator());
    let mut config = config(tls);
    config.ca_cert_pem = Some(tls.other_ca_pem.clone());
    let client = RedfishClient::new(config).expect("client");
    assert_tls_refused(client.service_root().await.expect_err("certificate from another CA"));
}

#[tokio::test]
async fn insecure_flag_accepts_the_certificate() {
    let tls = require!(tls_emulator());
    let mut config = config(tls);
    config.insecure_tls = true;
    let client = RedfishClient::new(config).expect("client");
    assert!(client.system().await.expect("system").uuid.is_some());
}

#[test]
fn a_ca_that_is_not_pem_is_a_config_error() {
    let mut config = RedfishConfig::new("https://127.0.0.1:1".parse().expect("url"), "", Password::new(""));
    config.ca_cert_pem = Some("not a certificate".into());
    let err = RedfishClient::new(config).expect_err("bad CA");
    assert!(matches!(err, RedfishError::CaCert { .. } | RedfishError::Config { .. }), "{err:?}");
}
