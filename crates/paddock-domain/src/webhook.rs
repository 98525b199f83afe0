//! Webhooks: the event names, the signing scheme (Standard Webhooks) and the address guard that
//! keeps deliveries off loopback, private and metadata addresses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The events a subscription may ask for (CloudEvents `type` is `dev.paddock.<name>`).
pub const EVENTS: [&str; 12] = [
    "operation.succeeded",
    "operation.failed",
    "cluster.ready",
    "cluster.degraded",
    "cluster.deleted",
    "node_pool.scaled",
    "machine.state_changed",
    "machine.quarantined",
    "machine.health_reported",
    "remediation.started",
    "remediation.ended",
    "usage.period_closed",
];

/// The events only the provider's subscriptions receive (fleet and billing facts; a health report
/// names a machine and its source whoever holds the machine).
pub const PROVIDER_ONLY: [&str; 4] =
    ["machine.state_changed", "machine.quarantined", "machine.health_reported", "usage.period_closed"];

/// The CloudEvents `type` prefix.
pub const TYPE_PREFIX: &str = "dev.paddock.";

/// The prefix of a signing secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// A fresh signing secret: `whsec_` and the base64 of 32 random bytes.
pub fn new_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("{SECRET_PREFIX}{}", STANDARD.encode(bytes))
}

/// The `webhook-signature` entry of `secret` over `id.timestamp.body`: `v1,<base64 HMAC-SHA256>`.
/// `None` for a secret that is not `whsec_` and base64 (never stored so).
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Option<String> {
    let key = STANDARD.decode(secret.strip_prefix(SECRET_PREFIX)?).ok()?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Some(format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes())))
}

/// An IP network, `address/prefix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

/// Why a network's text was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{text:?} is not a network in CIDR notation (address/prefix)")]
pub struct BadNetwork {
    /// The text given.
    pub text: String,
}

impl std::str::FromStr for Network {
    type Err = BadNetwork;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadNetwork { text: s.to_owned() };
        let (addr, prefix) = s.trim().split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(bad());
        }
        Ok(Self { addr, prefix })
    }
}

impl Network {
    const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Self {
        Self { addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)), prefix }
    }

    const fn v6(first: u16, prefix: u8) -> Self {
        Self { addr: IpAddr::V6(Ipv6Addr::new(first, 0, 0, 0, 0, 0, 0, 0)), prefix }
    }

    /// Whether `ip` is inside the network (an IPv4 network never holds an IPv6 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(&net.octets(), &ip.octets(), self.prefix),
            (IpAddr::V6(net), IpAddr::V6(ip)) => prefix_eq(&net.octets(), &ip.octets(), self.prefix),
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let (whole, rest) = (usize::from(prefix / 8), prefix % 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    rest == 0 || (a[whole] ^ b[whole]) >> (8 - rest) == 0
}

/// The ranges a webhook never goes to unless allowed: loopback, link-local (the metadata address
/// 169.254.169.254 with it), private, CGNAT, "this network", multicast and reserved, and their
/// IPv6 forms (IPv4-mapped addresses are refused whole: they would reach IPv4 hosts).
const FORBIDDEN: [Network; 14] = [
    Network::v4(0, 0, 0, 0, 8),
    Network::v4(10, 0, 0, 0, 8),
    Network::v4(100, 64, 0, 0, 10),
    Network::v4(127, 0, 0, 0, 8),
    Network::v4(169, 254, 0, 0, 16),
    Network::v4(172, 16, 0, 0, 12),
    Network::v4(192, 168, 0, 0, 16),
    Network::v4(224, 0, 0, 0, 3),
    Network { addr: IpAddr::V6(Ipv6Addr::UNSPECIFIED), prefix: 127 },
    Network { addr: IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0)), prefix: 96 },
    Network::v6(0x64, 16),
    Network::v6(0xfc00, 7),
    Network::v6(0xfe80, 10),
    Network::v6(0xff00, 8),
];

/// Where webhooks may go: `https` only unless insecure HTTP is allowed, and never to a forbidden
/// address outside the allowed networks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressGuard {
    /// `PADDOCK_WEBHOOK_INSECURE_HTTP`: `http://` URLs are accepted.
    pub insecure_http: bool,
    /// `PADDOCK_WEBHOOK_ALLOWED_NETWORKS`: forbidden ranges that are allowed after all.
    pub allowed: Vec<Network>,
}

impl AddressGuard {
    /// Whether a delivery may connect to `ip`.
    pub fn allows(&self, ip: IpAddr) -> bool {
        self.allowed.iter().any(|n| n.contains(ip)) || !FORBIDDEN.iter().any(|n| n.contains(ip))
    }

    /// Checks a subscription's URL as written: its scheme, that it has a host, no credentials,
    /// and, for an address literal, the address. A host name is checked at each connect.
    pub fn check_url(&self, url: &str) -> Result<url::Url, String> {
        let parsed = url::Url::parse(url).map_err(|e| format!("not an absolute URL ({e})"))?;
        match parsed.scheme() {
            "https" => {}
            "http" if self.insecure_http => {}
            "http" => return Err("must be https (http needs PADDOCK_WEBHOOK_INSECURE_HTTP=true)".to_owned()),
            other => return Err(format!("the scheme {other:?} is not https")),
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err("must not carry credentials".to_owned());
        }
        let ip = match parsed.host() {
            None => return Err("has no host".to_owned()),
            Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip),
            Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip),
            Some(url::Host::Domain(name)) if name.eq_ignore_ascii_case("localhost") => IpAddr::V4(Ipv4Addr::LOCALHOST),
            Some(url::Host::Domain(_)) => return Ok(parsed),
        };
        if self.allows(ip) {
            Ok(parsed)
        } else {
            Err(format!("{ip} is a loopback, private, link-local or reserved address"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_ranges_are_refused_and_public_ones_pass() {
        let guard = AddressGuard::default();
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.31.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "::1",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:8.8.8.8",
        ] {
            assert!(!guard.allows(ip.parse().expect("an address")), "{ip}");
        }
        for ip in ["8.8.8.8", "100.128.0.1", "172.32.0.1", "2606:4700::1111"] {
            assert!(guard.allows(ip.parse().expect("an address")), "{ip}");
        }
    }

    #[test]
    fn allowed_networks_open_a_forbidden_range() {
        let guard = AddressGuard { insecure_http: true, allowed: vec!["127.0.0.0/8".parse().expect("a network")] };
        assert!(guard.allows("127.0.0.1".parse().expect("an address")));
        assert!(!guard.allows("10.0.0.1".parse().expect("an address")));
        assert!(guard.check_url("http://127.0.0.1:9/hook").is_ok());
        assert!(AddressGuard::default().check_url("http://example.com/").is_err());
        assert!(AddressGuard::default().check_url("https://[fe80::1]/").is_err());
        assert!(AddressGuard::default().check_url("https://localhost/").is_err());
        assert!(AddressGuard::default().check_url("https://hooks.example.com/").is_ok());
    }

    #[test]
    fn a_signature_matches_the_standard_webhooks_example() {
        // The example of the Standard Webhooks specification.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = br#"{"test": 2432232314}"#;
        let sig = sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body).expect("a whsec_ secret");
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }
}
