//! kubeadm's token discovery (`kubeadm join --discovery-token-ca-cert-hash`), as the installer's
//! step 2: `cluster-info` is read from the tenant API server without verifying its TLS certificate
//! (nothing is trusted yet), and trusted only when its JWS for the bootstrap token's id verifies
//! with the token's secret (HS256 over the detached `kubeconfig`: only a holder of the token, the
//! API server's bootstrapsigner, could sign it) and the SHA-256 of its CA's SubjectPublicKeyInfo
//! is paddock's pin. Then a request verified against that CA must succeed.

use std::thread;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use hmac::{Hmac, Mac};
use paddock_types::der;
use sha2::{Digest, Sha256};
use ureq::tls::{RootCerts, TlsConfig};

use crate::client::ca_certs;
use crate::install::Failure;

/// How long discovery keeps trying while the API server is unreachable or has not signed
/// `cluster-info` for the token yet.
pub const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(300);
const PAUSE: Duration = Duration::from_secs(2);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CLUSTER_INFO: &str = "/api/v1/namespaces/kube-public/configmaps/cluster-info";

/// A bootstrap token, `<id>.<secret>` (6 and 16 characters of `[a-z0-9]`).
pub struct Token<'a> {
    /// The public half: it names the JWS.
    pub id: &'a str,
    /// The secret half: the JWS's HMAC key.
    pub secret: &'a str,
}

impl<'a> Token<'a> {
    /// Parses `<id>.<secret>`.
    pub fn parse(token: &'a str) -> Option<Token<'a>> {
        let (id, secret) = token.split_once('.')?;
        let ok = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        (ok(id, 6) && ok(secret, 16)).then_some(Token { id, secret })
    }
}

/// The tenant CA (PEM) of the API server at `endpoint`, found by discovery and matching `pin`
/// (`sha256:<hex>`), once a request verified against it succeeded.
pub fn discover(endpoint: &str, token: &str, pin: &str, deadline: Instant) -> Result<String, Failure> {
    let token = Token::parse(token)
        .ok_or_else(|| Failure::new("discovery_failed", "the bootstrap token is not of the form <id>.<secret>"))?;
    let endpoint = endpoint.trim_end_matches('/');
    let (kubeconfig, jws) = cluster_info(endpoint, &token, deadline)?;
    check_jws(&jws, &kubeconfig, &token).map_err(|why| {
        Failure::new("discovery_failed", format!("cluster-info is not signed with the bootstrap token: {why}"))
    })?;
    let ca_pem = kubeconfig_ca(&kubeconfig).map_err(|why| Failure::new("discovery_failed", why))?;
    let found = ca_pin(&ca_pem).map_err(|why| Failure::new("discovery_failed", format!("cluster-info's CA: {why}")))?;
    if !found.eq_ignore_ascii_case(pin.trim()) {
        return Err(Failure::new(
            "ca_pin_mismatch",
            format!("the API server's CA has pin {found}, not the configured {}", pin.trim()),
        ));
    }
    verified_request(endpoint, &ca_pem)?;
    Ok(ca_pem)
}

/// `cluster-info`'s `kubeconfig` and its JWS for the token, read without verifying TLS; retried
/// until `deadline` while the server is unreachable or has not signed it for the token yet.
fn cluster_info(endpoint: &str, token: &Token, deadline: Instant) -> Result<(String, String), Failure> {
    // Nothing is trusted yet: the JWS and the pin are what make the answer trustworthy.
    let tls = TlsConfig::builder().disable_verification(true).build();
    let agent = agent(tls);
    let url = format!("{endpoint}{CLUSTER_INFO}");
    let key = format!("jws-kubeconfig-{}", token.id);
    loop {
        let why = match agent.get(&url).call() {
            Ok(mut resp) if resp.status() == 200 => {
                let cm: serde_json::Value = resp
                    .body_mut()
                    .read_json()
                    .map_err(|e| Failure::new("discovery_failed", format!("cluster-info is not JSON: {e}")))?;
                match (cm["data"]["kubeconfig"].as_str(), cm["data"][&key].as_str()) {
                    (Some(k), Some(jws)) => return Ok((k.to_owned(), jws.to_owned())),
                    (None, _) => "cluster-info holds no kubeconfig".to_owned(),
                    (_, None) => format!("cluster-info is not signed for token {} yet", token.id),
                }
            }
            Ok(resp) => format!("GET cluster-info answered {}", resp.status()),
            Err(e) => format!("GET cluster-info failed: {e}"),
        };
        if Instant::now() + PAUSE >= deadline {
            return Err(Failure::new("discovery_failed", why));
        }
        eprintln!("paddock-agent: discovery: {why}; retrying");
        thread::sleep(PAUSE);
    }
}

/// Checks a detached JWS (`<header>..<signature>`, RFC 7515 appendix F) over `payload`: HS256
/// with the token's secret, and the token's id as `kid` when the header names one.
pub fn check_jws(jws: &str, payload: &str, token: &Token) -> Result<(), String> {
    let (header, signature) = jws.split_once("..").ok_or("not a detached JWS")?;
    let header_json: serde_json::Value = URL_SAFE_NO_PAD
        .decode(header)
        .ok()
        .and_then(|h| serde_json::from_slice(&h).ok())
        .ok_or("its header is not base64url JSON")?;
    if header_json["alg"] != "HS256" {
        return Err(format!("algorithm {} is not HS256", header_json["alg"]));
    }
    if let Some(kid) = header_json.get("kid") {
        if kid != token.id {
            return Err(format!("it is for token {kid}, not {}", token.id));
        }
    }
    let signature = URL_SAFE_NO_PAD.decode(signature).map_err(|_| "its signature is not base64url")?;
    let mut mac = Hmac::<Sha256>::new_from_slice(token.secret.as_bytes()).map_err(|_| "bad key")?;
    mac.update(format!("{header}.{}", URL_SAFE_NO_PAD.encode(payload)).as_bytes());
    // Constant time.
    mac.verify_slice(&signature).map_err(|_| "the signature does not verify".to_owned())
}

/// The CA (PEM) of a kubeconfig's `certificate-authority-data` (cluster-info holds one cluster).
pub fn kubeconfig_ca(kubeconfig: &str) -> Result<String, String> {
    let data = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("certificate-authority-data:"))
        .map(|v| v.trim().trim_matches('"'))
        .ok_or("cluster-info's kubeconfig has no certificate-authority-data")?;
    let pem = STANDARD.decode(data).map_err(|_| "certificate-authority-data is not base64")?;
    String::from_utf8(pem).map_err(|_| "certificate-authority-data is not PEM".to_owned())
}

/// kubeadm's CA pin of the first certificate in `pem`: `sha256:` and the hex SHA-256 of its
/// SubjectPublicKeyInfo.
pub fn ca_pin(pem: &str) -> Result<String, String> {
    let certs = ca_certs(pem).map_err(|e| format!("{e:#}"))?;
    let spki = der::subject_public_key_info(certs[0].der())?;
    Ok(format!("sha256:{}", hex::encode(Sha256::digest(spki))))
}

/// `GET /version` verified against the CA alone: the server holds the CA's key (an answer
/// refusing the anonymous caller still proves the TLS).
fn verified_request(endpoint: &str, ca_pem: &str) -> Result<(), Failure> {
    let certs = ca_certs(ca_pem).map_err(|e| Failure::new("discovery_failed", format!("{e:#}")))?;
    let agent = agent(TlsConfig::builder().root_certs(RootCerts::new_with_certs(&certs)).build());
    match agent.get(&format!("{endpoint}/version")).call() {
        Ok(resp) if resp.status().is_success() || [401, 403].contains(&resp.status().as_u16()) => Ok(()),
        Ok(resp) => Err(Failure::new("discovery_failed", format!("GET /version answered {}", resp.status()))),
        Err(e) => Err(Failure::new(
            "discovery_failed",
            format!("the API server is not reachable with TLS verified against the pinned CA: {e}"),
        )),
    }
}

fn agent(tls: TlsConfig) -> ureq::Agent {
    ureq::Agent::config_builder()
        .tls_config(tls)
        .timeout_global(Some(REQUEST_TIMEOUT))
        .http_status_as_error(false)
        .build()
        .new_agent()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A P-256 CA made with `openssl req -x509 -newkey ec` ...
    const CA: &str = "-----BEGIN CERTIFICATE-----
MIIBgTCCASegAwIBAgIULeGXnD3Su7aaTLN/sMWHh0gUHWEwCgYIKoZIzj0EAwIw
FTETMBEGA1UEAwwKa3ViZXJuZXRlczAgFw0yNjEyMDUxOTM1MDJaGA8yMTI2MTEx
MTE5MzUwMlowFTETMBEGA1UEAwwKa3ViZXJuZXRlczBZMBMGByqGSM49AgEGCCqG
SM49AwEHA0IABJ4UM8O1dB68hqPmcpIPNQ+wxmLgaIf6fmkQKf2RbEwzyyi4hrz6
BRnDffetFnaITNHOSODOh8dMz5ER9KqxDEqjUzBRMB0GA1UdDgQWBBSYm9fLmssJ
5aUbtSBharn4OjQWIzAfBgNVHSMEGDAWgBSYm9fLmssJ5aUbtSBharn4OjQWIzAP
BgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0gAMEUCIQDkjchdWbA/HAW7Zyz5
I0zFbn4afPd2zNrlI8ME0xSCxwIgYY7WytJ2IXf7aEGpAlRmpiObm+gsSbP/u/9z
hVawC2c=
-----END CERTIFICATE-----
";
    /// ... and its pin, by openssl: `openssl x509 -pubkey -noout | openssl pkey -pubin -outform
    /// der | sha256sum`.
    const PIN: &str = "sha256:61067411dc2db26780ee8515c1c9230947a16e20d77d80b3f3fce5031b855656";

    /// A detached JWS over "apiVersion: v1\nkind: Config\n" for token `abcdef.0123456789abcdef`,
    /// signed with `openssl dgst -sha256 -mac HMAC -macopt key:0123456789abcdef` over
    /// `<header>.<base64url payload>`.
    const PAYLOAD: &str = "apiVersion: v1\nkind: Config\n";
    const JWS: &str = "eyJhbGciOiJIUzI1NiIsImtpZCI6ImFiY2RlZiJ9..vH_kT4yiol-nrAWgjfCYqvum5wsKETXe0S7OOp1VgnE";

    #[test]
    fn the_pin_is_the_spki_digest_openssl_computes() {
        assert_eq!(ca_pin(CA).expect("pin"), PIN);
        assert!(ca_pin("not PEM").is_err());
    }

    #[test]
    fn the_jws_verifies_only_with_the_tokens_secret_and_payload() {
        let token = Token::parse("abcdef.0123456789abcdef").expect("token");
        assert_eq!(check_jws(JWS, PAYLOAD, &token), Ok(()));
        assert!(check_jws(JWS, "apiVersion: v1\nkind: Config\nx: y\n", &token).is_err(), "another payload");
        let other = Token::parse("abcdef.0123456789abcdeg").expect("token");
        assert!(check_jws(JWS, PAYLOAD, &other).is_err(), "another secret");
        let other_id = Token::parse("abcdeg.0123456789abcdef").expect("token");
        assert!(check_jws(JWS, PAYLOAD, &other_id).expect_err("kid").contains("for token"));
        assert!(check_jws("eyJhbGciOiJub25lIn0..", PAYLOAD, &token).expect_err("alg none").contains("HS256"));
        assert!(check_jws(&JWS.replace("..", "."), PAYLOAD, &token).is_err(), "not detached");
    }

    #[test]
    fn tokens_and_kubeconfigs_are_read_strictly() {
        assert!(Token::parse("abcdef.0123456789abcdef").is_some());
        for bad in ["abcdef", "abcde.0123456789abcdef", "ABCDEF.0123456789abcdef", "abcdef.0123456789abcde"] {
            assert!(Token::parse(bad).is_none(), "{bad}");
        }
        let kubeconfig = format!(
            "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {}\n    server: https://x\n",
            STANDARD.encode(CA)
        );
        assert_eq!(kubeconfig_ca(&kubeconfig).as_deref(), Ok(CA));
        assert!(kubeconfig_ca("apiVersion: v1\n").is_err());
    }
}
