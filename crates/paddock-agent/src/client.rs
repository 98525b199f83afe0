//! The agent API (docs/security.md): `GET {agent_url}/v1/agent/config` and
//! `POST {agent_url}/v1/agent/report` with the seed's bearer token, TLS verified against the seed's
//! CA when it names one. Network errors and 5xx are retried with backoff until a deadline.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use ureq::tls::{parse_pem, PemItem, RootCerts, TlsConfig};

use crate::device::Seen;
use crate::matching::ConfigDrive;
use crate::seed::AgentSeed;
use crate::wipe::{DriveReport, Outcome};

/// First pause after a failed attempt; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// Longest pause between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Bound on one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// `GET config`'s answer.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct AgentConfig {
    /// `wipe` or `provision`.
    pub purpose: String,
    /// The machine.
    pub machine: MachineRef,
    /// The run.
    pub run_id: String,
    /// Echoed in the report.
    pub nonce: String,
    /// When the run's token expires.
    pub expires_at: DateTime<Utc>,
    /// The purpose's configuration; for `wipe`, [`WipeConfig`].
    pub config: serde_json::Value,
}

/// The machine `config` is for.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct MachineRef {
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
}

/// A wipe's configuration: the drives the BMC reported.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct WipeConfig {
    /// The drives to wipe.
    pub drives: Vec<ConfigDrive>,
}

/// `POST report`'s body.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Report {
    /// Success only when every drive succeeded and every listed drive was found.
    pub result: Outcome,
    /// When the wipe started (RFC 3339).
    pub started_at: DateTime<Utc>,
    /// When it finished.
    pub finished_at: DateTime<Utc>,
    /// SHA-256 of the image the agent runs in.
    pub image_sha256: String,
    /// `config`'s nonce.
    pub nonce: String,
    /// Per-drive evidence.
    pub drives: Vec<DriveReport>,
    /// Every block device seen, with what was done to it and why (empty for a first boot).
    pub devices: Vec<Seen>,
}

/// How a delivered report was acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivered {
    /// 204.
    Accepted,
    /// 409 on a retry: an earlier attempt got through.
    AlreadyDelivered,
}

/// A client of one run's agent API.
pub struct Client {
    agent: ureq::Agent,
    base: String,
    authorization: String,
}

impl Client {
    /// A client for `seed`'s API, trusting only the seed's CA when it gives one.
    pub fn new(seed: &AgentSeed) -> anyhow::Result<Client> {
        let mut tls = TlsConfig::builder();
        if let Some(pem) = seed.ca_cert.as_deref().filter(|p| !p.trim().is_empty()) {
            tls = tls.root_certs(RootCerts::new_with_certs(&ca_certs(pem)?));
        }
        let agent = ureq::Agent::config_builder()
            .tls_config(tls.build())
            .timeout_global(Some(REQUEST_TIMEOUT))
            .http_status_as_error(false)
            .build()
            .new_agent();
        let base = seed.agent_url.trim_end_matches('/').to_owned();
        Ok(Client { agent, base, authorization: format!("Bearer {}", seed.agent_token) })
    }

    /// Fetches `config`, retrying network errors and 5xx until `deadline`.
    pub fn config(&self, deadline: Instant) -> anyhow::Result<AgentConfig> {
        let url = format!("{}/v1/agent/config", self.base);
        retry(deadline, |_| {
            let mut resp =
                self.agent.get(&url).header("Authorization", &self.authorization).call().map_err(transient)?;
            match resp.status().as_u16() {
                200 => resp
                    .body_mut()
                    .read_json::<AgentConfig>()
                    .context("config is not valid JSON of the contract")
                    .map_err(Attempt::Fatal),
                s => Err(status_error(s, "GET config")),
            }
        })
    }

    /// Posts the report, retrying network errors and 5xx until `deadline` (the run's expiry).
    pub fn report(&self, report: &Report, deadline: Instant) -> anyhow::Result<Delivered> {
        let url = format!("{}/v1/agent/report", self.base);
        retry(deadline, |attempt| {
            let resp = self
                .agent
                .post(&url)
                .header("Authorization", &self.authorization)
                .send_json(report)
                .map_err(transient)?;
            match resp.status().as_u16() {
                200 | 204 => Ok(Delivered::Accepted),
                409 if attempt > 1 => Ok(Delivered::AlreadyDelivered),
                s => Err(status_error(s, "POST report")),
            }
        })
    }
}

/// Every certificate in a PEM bundle; at least one.
fn ca_certs(pem: &str) -> anyhow::Result<Vec<ureq::tls::Certificate<'static>>> {
    let mut certs = Vec::new();
    for item in parse_pem(pem.as_bytes()) {
        if let PemItem::Certificate(c) = item.context("the seed's ca_cert is not valid PEM")? {
            certs.push(c);
        }
    }
    if certs.is_empty() {
        bail!("the seed's ca_cert holds no certificate");
    }
    Ok(certs)
}

/// One attempt's failure.
enum Attempt {
    /// Worth another try (network error, 5xx, 429).
    Transient(anyhow::Error),
    /// Not worth one.
    Fatal(anyhow::Error),
}

fn transient(e: ureq::Error) -> Attempt {
    Attempt::Transient(anyhow::Error::new(e))
}

fn status_error(status: u16, what: &str) -> Attempt {
    let meaning = match status {
        404 => "the token is unknown",
        409 => "the run's report was already delivered",
        410 => "the run has expired",
        401 | 403 => "the token was refused",
        _ => "unexpected status",
    };
    let err = anyhow!("{what} answered {status}: {meaning}");
    if status >= 500 || status == 429 {
        Attempt::Transient(err)
    } else {
        Attempt::Fatal(err)
    }
}

/// Calls `op` (with the attempt number, from 1) until it succeeds, fails fatally, or `deadline`
/// passes, pausing with exponential backoff between attempts.
fn retry<T>(deadline: Instant, mut op: impl FnMut(u32) -> Result<T, Attempt>) -> anyhow::Result<T> {
    let mut pause = FIRST_BACKOFF;
    let mut attempt = 0;
    loop {
        attempt += 1;
        match op(attempt) {
            Ok(v) => return Ok(v),
            Err(Attempt::Fatal(e)) => return Err(e),
            Err(Attempt::Transient(e)) => {
                let now = Instant::now();
                if now + pause >= deadline {
                    return Err(e.context(format!("giving up after {attempt} attempts")));
                }
                eprintln!("paddock-agent: attempt {attempt} failed, retrying in {pause:?}: {e:#}");
                thread::sleep(pause);
                pause = (pause * 2).min(MAX_BACKOFF);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::device::Identity;
    use crate::matching::MatchBasis;
    use crate::method::Method;
    use crate::verify::Verification;

    #[test]
    fn the_report_has_exactly_the_contracts_shape() {
        let at = DateTime::parse_from_rfc3339("2026-12-01T10:00:00Z").expect("date").with_timezone(&Utc);
        let drive = DriveReport {
            device: None,
            id: Some("d1".into()),
            match_basis: Some(MatchBasis::ProtocolCapacity),
            identity: Identity {
                serial: Some("S1".into()),
                size_bytes: 4096,
                protocol: Some("nvme".into()),
                ..Identity::default()
            },
            method: Method::NvmeFormatUserData,
            result: Outcome::Success,
            detail: None,
            verification: Some(Verification { ranges: 66, bytes_read: 4096, sha256: "ab".into() }),
        };
        let report = Report {
            result: Outcome::Success,
            started_at: at,
            finished_at: at,
            image_sha256: "f".repeat(64),
            nonce: "n".into(),
            drives: vec![drive],
            devices: vec![Seen {
                name: "nvme0n1".into(),
                kind: crate::device::Kind::Disk,
                action: crate::device::Action::Wiped,
                reason: "wiped".into(),
            }],
        };
        assert_eq!(
            serde_json::to_value(&report).expect("json"),
            json!({
                "result": "success", "started_at": "2026-12-01T10:00:00Z", "finished_at": "2026-12-01T10:00:00Z",
                "image_sha256": "f".repeat(64), "nonce": "n",
                "drives": [{
                    "id": "d1", "match_basis": "protocol_capacity",
                    "identity": {"model": null, "serial": "S1", "wwn": null, "eui": null, "size_bytes": 4096, "protocol": "nvme"},
                    "method": "nvme-format-user-data", "result": "success", "detail": null,
                    "verification": {"ranges": 66, "bytes_read": 4096, "sha256": "ab"}
                }],
                "devices": [{"name": "nvme0n1", "kind": "disk", "action": "wiped", "reason": "wiped"}]
            })
        );
    }

    #[test]
    fn retry_retries_transient_failures_and_stops_at_a_fatal_one_or_the_deadline() {
        let far = Instant::now() + Duration::from_secs(60);
        let mut calls = Vec::new();
        let got = retry(far, |attempt| {
            calls.push(attempt);
            if attempt < 3 {
                Err(status_error(503, "GET config"))
            } else {
                Ok(attempt)
            }
        });
        assert_eq!(got.expect("third attempt succeeds"), 3);
        assert_eq!(calls, [1, 2, 3]);
        let fatal = retry(far, |_| -> Result<(), Attempt> { Err(status_error(410, "POST report")) });
        assert!(format!("{:#}", fatal.expect_err("410 is fatal")).contains("410: the run has expired"));
        let mut n = 0;
        let late = retry(Instant::now(), |_| -> Result<(), Attempt> {
            n += 1;
            Err(status_error(502, "POST report"))
        });
        assert!(format!("{:#}", late.expect_err("deadline")).contains("giving up after 1 attempts"));
        assert_eq!(n, 1);
    }

    #[test]
    fn config_of_the_contract_parses() {
        let config: AgentConfig = serde_json::from_value(json!({
            "purpose": "wipe", "machine": {"id": "m", "name": "node-1"}, "run_id": "r", "nonce": "bm9uY2U",
            "expires_at": "2026-12-01T16:00:00+00:00",
            "config": {"drives": [{"id": "d1", "serial": null, "capacity_bytes": 1000, "protocol": "sata"}, {"id": "d2"}]}
        }))
        .expect("config");
        let wipe: WipeConfig = serde_json::from_value(config.config).expect("wipe config");
        assert_eq!(wipe.drives.len(), 2);
        assert_eq!(wipe.drives[0].capacity_bytes, Some(1000));
        assert_eq!(wipe.drives[1].serial, None);
    }
}
