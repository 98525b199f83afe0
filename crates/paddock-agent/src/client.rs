//! The agent API (docs/security.md): `GET {agent_url}/v1/agent/config` and
//! `POST {agent_url}/v1/agent/report` with the seed's bearer token, TLS verified against the seed's
//! CA when it names one. Network errors and 5xx are retried with backoff until a deadline.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use paddock_types::agent::{AgentConfigView, AgentReport};
use ureq::tls::{parse_pem, PemItem, RootCerts, TlsConfig};

use crate::seed::AgentSeed;

/// First pause after a failed attempt; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// Longest pause between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Bound on one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

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
            tls = tls.root_certs(RootCerts::new_with_certs(&ca_certs(pem).context("the seed's ca_cert")?));
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
    pub fn config(&self, deadline: Instant) -> anyhow::Result<AgentConfigView> {
        let url = format!("{}/v1/agent/config", self.base);
        retry(deadline, |_| {
            let mut resp =
                self.agent.get(&url).header("Authorization", &self.authorization).call().map_err(transient)?;
            match resp.status().as_u16() {
                200 => resp
                    .body_mut()
                    .read_json::<AgentConfigView>()
                    .context("config is not valid JSON of the contract")
                    .map_err(Attempt::Fatal),
                s => Err(status_error(s, "GET config")),
            }
        })
    }

    /// Posts the report, retrying network errors and 5xx until `deadline` (the run's expiry).
    pub fn report(&self, report: &AgentReport, deadline: Instant) -> anyhow::Result<Delivered> {
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
pub fn ca_certs(pem: &str) -> anyhow::Result<Vec<ureq::tls::Certificate<'static>>> {
    let mut certs = Vec::new();
    for item in parse_pem(pem.as_bytes()) {
        if let PemItem::Certificate(c) = item.context("not valid PEM")? {
            certs.push(c);
        }
    }
    if certs.is_empty() {
        bail!("no certificate in the PEM");
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

    use paddock_types::agent::AgentRunConfig;

    use super::*;

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
        let config: AgentConfigView = serde_json::from_value(json!({
            "purpose": "wipe", "machine": {"id": "0193e0a0-0000-7000-8000-000000000001", "name": "node-1"},
            "run_id": "0193e0a0-0000-7000-8000-000000000002", "nonce": "bm9uY2U",
            "expires_at": "2026-12-01T16:00:00+00:00",
            "config": {"drives": [{"id": "d1", "serial": null, "capacity_bytes": 1000, "protocol": "sata"}, {"id": "d2"}]}
        }))
        .expect("config");
        let AgentRunConfig::Wipe(wipe) = config.config else { panic!("a wipe's config: {config:?}") };
        assert_eq!(wipe.drives.len(), 2);
        assert_eq!(wipe.drives[0].capacity_bytes, Some(1000));
        assert_eq!(wipe.drives[1].serial, None);
    }
}
