//! The simulated agents: what a wipe image or an OS installer does once a machine booted from
//! media, played against paddock's *real* agent endpoints. A boot is due when the machine is on,
//! booted from CD with a seed inserted, `boot_latency` has passed and that boot was not reported
//! yet. Several processes may run an agent over one world: a due boot is claimed with
//! `for update skip locked` and a short lease (never held across the HTTP calls), and the
//! one-time token makes a second report a 409 anyway.
//!
//! The agent reads its seed as the booted machine reads its second virtual media device: it
//! fetches the image from the seed URL the BMC holds (`<seed base>/v1/agent/seed/<seed token>.iso`)
//! and finds `paddock/agent.json` in it (docs/security.md); then it fetches
//! `{agent_url}/v1/agent/config` and posts `{agent_url}/v1/agent/report` with the agent token as its
//! bearer. A wipe's report carries evidence per drive as the real agent's does (identity, method,
//! a verification of 66 ranges read back as zeros) and the simulated wipe image's digest. 2xx =
//! done; 404/409/410 (or any other 4xx) = give up on that boot; 5xx and network errors = try again
//! on the next tick. Neither the seed URL nor a token is ever logged.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use paddock_domain::agent::{
    verified_bytes, zeros_sha256, SIMULATED_OS_IMAGE_SHA256, SIMULATED_WIPE_IMAGE_SHA256, VERIFIED_RANGES,
};
use paddock_types::agent::AgentSeed;
use serde_json::{json, Value};
use sqlx::Row;
use tokio::sync::watch;

use crate::{micros, Inner, MachineFault, SimError};

/// How long a claimed boot stays with the process that claimed it (a crash just lets it expire).
const CLAIM_LEASE: Duration = Duration::from_secs(60);
/// Due boots claimed per tick.
const CLAIM_BATCH: i64 = 16;
/// Timeout of each HTTP call.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest an idle agent waits before it looks again (at least `agent_poll`).
const IDLE_POLL: Duration = Duration::from_secs(1);

/// The simulated agents of every machine; see [`crate::SimWorld::agent`].
pub struct SimAgent {
    pub(crate) inner: Arc<Inner>,
    pub(crate) http: reqwest::Client,
}

impl std::fmt::Debug for SimAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimAgent").finish_non_exhaustive()
    }
}

/// A due boot this process claimed.
struct Boot {
    bmc_url: String,
    system_uuid: String,
    seed_url: String,
    boot_seq: i64,
    booted_at: DateTime<Utc>,
    /// The machine's drives as its BMC keeps them (`id`, `serial`, `capacity_bytes`, ...).
    drives: Vec<Value>,
    wipe_fails: bool,
    /// The machine's injected faults.
    faults: Vec<String>,
}

/// How handling a boot ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Reported (or given up on): never again for this boot.
    Finished,
    /// Try again on a later tick.
    Retry,
}

/// What the simulated installer left on the machine's disk.
enum Installed {
    /// The OS, configured to join the cluster its configuration names.
    Joinable,
    /// Nothing usable: the join configuration names no cluster or node (it reports failure).
    Unusable,
    /// Nothing: the machine restarted since this boot, which ended the installer.
    Superseded,
}

/// Why an HTTP exchange did not succeed.
enum Failure {
    /// Network error or 5xx.
    Retry,
    /// A 4xx: the token is unknown, used or expired (or the request is refused).
    GiveUp(u16),
}

impl SimAgent {
    /// Reports due boots until `shutdown` turns true (or its sender is dropped): every
    /// `agent_poll` while there are boots to report; when a pass found none, it waits for the
    /// next boot this process's BMCs made to come due, and at most [`IDLE_POLL`] (boots made by
    /// another process over the same world), so an idle world costs one statement a second.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        tracing::info!("simulated machine agents started");
        let poll = self.inner.config.agent_poll;
        loop {
            if *shutdown.borrow() {
                break;
            }
            let busy = match self.pass().await {
                Ok((claimed, _)) => claimed > 0,
                Err(e) => {
                    tracing::warn!(error = %e, "the simulated agents could not look for due boots");
                    true
                }
            };
            let boots = &self.inner.boots;
            let pause = if busy { poll } else { boots.idle_wait(poll, poll.max(IDLE_POLL)) };
            tokio::select! {
                changed = shutdown.changed() => if changed.is_err() { break },
                () = tokio::time::sleep(pause) => {}
                () = boots.wait(), if !busy => {}
            }
        }
        tracing::info!("simulated machine agents stopped");
    }

    /// One pass: claims the due boots and handles them all at once (a machine's agent does not
    /// wait for another machine's: handled one at a time, 4,500 boots bounded a
    /// zero-latency fleet at ~45 reports/s); returns how many it finished (reported or gave up
    /// on). Boots to retry are released for the next pass.
    pub async fn tick(&self) -> Result<usize, SimError> {
        Ok(self.pass().await?.1)
    }

    /// A pass: how many due boots it claimed, and how many of those it finished.
    async fn pass(&self) -> Result<(usize, usize), SimError> {
        let boots = self.claim().await?;
        let claimed = boots.len();
        let mut running = tokio::task::JoinSet::new();
        for boot in boots {
            let agent = SimAgent { inner: self.inner.clone(), http: self.http.clone() };
            running.spawn(async move { agent.settle(&boot).await });
        }
        let (mut finished, mut failed) = (0, None);
        while let Some(ended) = running.join_next().await {
            match ended {
                Ok(Ok(true)) => finished += 1,
                Ok(Ok(false)) => {}
                Ok(Err(e)) => failed = Some(e),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => {}
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok((claimed, finished)),
        }
    }

    /// Handles one claimed boot and records how it ended: `true` when it is finished.
    async fn settle(&self, boot: &Boot) -> Result<bool, SimError> {
        let outcome = self.handle(boot).await;
        let mut conn = self.inner.store.conn().await?;
        match outcome {
            Outcome::Finished => {
                sqlx::query(
                    "update paddock_sim.machines set reported_seq = greatest(reported_seq, $2),
                            agent_claimed_until = case when boot_seq = $2 then null else agent_claimed_until end,
                            updated_at = now()
                     where bmc_url = $1",
                )
                .bind(&boot.bmc_url)
                .bind(boot.boot_seq)
                .execute(&mut *conn)
                .await?;
                Ok(true)
            }
            Outcome::Retry => {
                // Only this boot's claim: a later boot's belongs to the agent that claimed it.
                sqlx::query(
                    "update paddock_sim.machines set agent_claimed_until = null where bmc_url = $1 and boot_seq = $2",
                )
                .bind(&boot.bmc_url)
                .bind(boot.boot_seq)
                .execute(&mut *conn)
                .await?;
                Ok(false)
            }
        }
    }

    /// Claims due boots in one short statement; another process skips the rows this one locks
    /// and, afterwards, the leased ones.
    async fn claim(&self) -> Result<Vec<Boot>, SimError> {
        let mut conn = self.inner.store.conn().await?;
        let rows = sqlx::query(
            "update paddock_sim.machines set agent_claimed_until = now() + $3 * interval '1 microsecond'
             where bmc_url in (
                 select bmc_url from paddock_sim.machines
                 where boot_seq > reported_seq and power_on and boot_override = 'cd' and seed_url is not null
                   and booted_at + $1 * interval '1 microsecond' <= now()
                   and not ($2 = any (faults))
                   and (agent_claimed_until is null or agent_claimed_until < now())
                 order by booted_at
                 limit $4
                 for update skip locked)
             returning bmc_url, system_uuid, seed_url, boot_seq, booted_at, drives, faults",
        )
        .bind(micros(self.inner.config.boot_latency))
        .bind(MachineFault::NeverReports.as_str())
        .bind(micros(CLAIM_LEASE))
        .bind(CLAIM_BATCH)
        .fetch_all(&mut *conn)
        .await?;
        rows.into_iter()
            .map(|row| {
                let drives: Value = row.try_get("drives")?;
                let faults: Vec<String> = row.try_get("faults")?;
                Ok(Boot {
                    bmc_url: row.try_get("bmc_url")?,
                    system_uuid: row.try_get("system_uuid")?,
                    seed_url: row.try_get("seed_url")?,
                    boot_seq: row.try_get("boot_seq")?,
                    booted_at: row.try_get("booted_at")?,
                    drives: drives.as_array().cloned().unwrap_or_default(),
                    wipe_fails: faults.iter().any(|f| f == MachineFault::WipeFails.as_str()),
                    faults,
                })
            })
            .collect()
    }

    /// Plays one boot: read the seed, fetch the configuration, do the work, report.
    async fn handle(&self, boot: &Boot) -> Outcome {
        let machine = boot.bmc_url.as_str();
        let image = match self.get_bytes(&boot.seed_url).await {
            Ok(image) => image,
            Err(failure) => return self.failed(machine, "reading its seed", failure),
        };
        let seed = paddock_seed::read_file(&image, "paddock/agent.json")
            .and_then(|json| serde_json::from_slice::<AgentSeed>(&json).ok());
        let Some(seed) = seed else {
            tracing::warn!(machine, "the seed inserted in {machine} holds no paddock/agent.json; nothing to report");
            return Outcome::Finished;
        };
        let config = match self.get_json(&format!("{}/v1/agent/config", seed.agent_url), &seed.agent_token).await {
            Ok(config) => config,
            Err(failure) => return self.failed(machine, "fetching its configuration", failure),
        };
        let started_at = boot.booted_at;
        let mut checks = Vec::new();
        let (result, drives, image_sha256) = match config["purpose"].as_str() {
            Some("acceptance") => {
                if boot.has(MachineFault::AcceptanceNeverReports) {
                    tracing::debug!(machine, "the acceptance image of {machine} never reports (fault)");
                    return Outcome::Finished;
                }
                let (result, found) = accept(boot, &config["config"]);
                checks = found;
                // The class's image, which a simulated machine always booted.
                let image = config["config"]["image_sha256"].as_str().unwrap_or_default();
                (result, Vec::new(), image)
            }
            Some("wipe") => {
                let (result, drives) = wipe(boot, &config["config"]);
                (result, drives, SIMULATED_WIPE_IMAGE_SHA256)
            }
            Some("provision") => match self.provision(boot, &config["config"]).await {
                Ok(Installed::Joinable) => ("success", Vec::new(), SIMULATED_OS_IMAGE_SHA256),
                Ok(Installed::Unusable) => ("failure", Vec::new(), SIMULATED_OS_IMAGE_SHA256),
                Ok(Installed::Superseded) => {
                    tracing::debug!(machine, "{machine} restarted under its installer; the boot ends unreported");
                    return Outcome::Finished;
                }
                Err(e) => {
                    tracing::warn!(machine, error = %e, "the simulated installer of {machine} could not write its node");
                    return Outcome::Retry;
                }
            },
            other => {
                tracing::warn!(machine, purpose = ?other, "unknown agent purpose for {machine}");
                return Outcome::Finished;
            }
        };
        let finished_at = Utc::now().max(started_at);
        let devices = if checks.is_empty() { devices(&drives) } else { Vec::new() };
        let report = json!({
            "result": result,
            "drives": drives,
            "devices": devices,
            "image_sha256": image_sha256,
            "nonce": config["nonce"],
            "started_at": started_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "finished_at": finished_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "checks": checks,
        });
        let report_url = format!("{}/v1/agent/report", seed.agent_url);
        match self.post_json(&report_url, &seed.agent_token, &report).await {
            Ok(()) => {
                tracing::info!(machine, result, "the simulated agent of {machine} reported");
                Outcome::Finished
            }
            Err(failure) => self.failed(machine, "posting its report", failure),
        }
    }

    fn failed(&self, machine: &str, doing: &str, failure: Failure) -> Outcome {
        match failure {
            Failure::Retry => {
                tracing::debug!(machine, "the simulated agent of {machine} failed {doing}; trying again");
                Outcome::Retry
            }
            Failure::GiveUp(status) => {
                if !matches!(status, 404 | 409 | 410) {
                    tracing::warn!(machine, status, "the simulated agent of {machine} was refused {doing}");
                }
                Outcome::Finished
            }
        }
    }

    async fn get_bytes(&self, url: &str) -> Result<Vec<u8>, Failure> {
        let response = self.http.get(url).timeout(HTTP_TIMEOUT).send().await.map_err(|_| Failure::Retry)?;
        let response = check(response)?;
        response.bytes().await.map(|b| b.to_vec()).map_err(|_| Failure::Retry)
    }

    async fn get_json(&self, url: &str, token: &str) -> Result<Value, Failure> {
        let request = self.http.get(url).bearer_auth(token).timeout(HTTP_TIMEOUT);
        let response = check(request.send().await.map_err(|_| Failure::Retry)?)?;
        response.json().await.map_err(|_| Failure::Retry)
    }

    async fn post_json(&self, url: &str, token: &str, body: &Value) -> Result<(), Failure> {
        let request = self.http.post(url).bearer_auth(token).timeout(HTTP_TIMEOUT).json(body);
        check(request.send().await.map_err(|_| Failure::Retry)?).map(drop)
    }

    /// The installer's work: the OS is on disk, configured to join the cluster its join
    /// configuration names; the Node registers once the machine restarts from disk. Written
    /// before the report, so a worker that acts on the report at once finds it.
    async fn provision(&self, boot: &Boot, config: &Value) -> Result<Installed, SimError> {
        // The join configuration `SimKube::join_config` wrote, as the run's whole configuration
        // or under `join` / `join_config` (however the worker wraps it).
        let join = [config, &config["join"], &config["join_config"]]
            .into_iter()
            .find(|c| c["cluster_id"].is_string())
            .unwrap_or(config);
        let cluster = join["cluster_id"].as_str().and_then(|c| uuid::Uuid::parse_str(c).ok());
        let (Some(cluster), Some(node_name)) = (cluster, join["node_name"].as_str()) else {
            tracing::warn!(machine = boot.bmc_url, "the join configuration names no cluster_id and node_name");
            return Ok(Installed::Unusable);
        };
        let labels = if join["labels"].is_object() { join["labels"].clone() } else { json!({}) };
        let taints = if join["taints"].is_array() { join["taints"].clone() } else { json!([]) };
        let mut tx = self.inner.store.begin().await?;
        // A real installer dies with the boot it runs in. A simulated one outlives it, so it
        // writes only while its boot is still the machine's current one (the row lock orders it
        // with the BMC's restarts): a late installer of a superseded boot would otherwise undo
        // the join of the OS the machine has since booted from disk.
        let current: Option<bool> = sqlx::query_scalar(
            "select boot_seq = $2 and power_on and boot_override = 'cd'
             from paddock_sim.machines where bmc_url = $1 for update",
        )
        .bind(&boot.bmc_url)
        .bind(boot.boot_seq)
        .fetch_optional(&mut *tx)
        .await?;
        if current != Some(true) {
            return Ok(Installed::Superseded);
        }
        // The machine may have been this cluster's node under another name: one Node per machine.
        sqlx::query("delete from paddock_sim.nodes where cluster_id = $1 and system_uuid = $2 and node_name <> $3")
            .bind(cluster)
            .bind(&boot.system_uuid)
            .bind(node_name)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "insert into paddock_sim.nodes (cluster_id, node_name, system_uuid, labels, taints)
             values ($1, $2, $3, $4, $5)
             on conflict (cluster_id, node_name) do update set system_uuid = excluded.system_uuid,
                 labels = excluded.labels, taints = excluded.taints, provisioned_at = now(),
                 joined_at = null, ready_at = null",
        )
        .bind(cluster)
        .bind(node_name)
        .bind(&boot.system_uuid)
        .bind(&labels)
        .bind(&taints)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Installed::Joinable)
    }
}

/// Sorts an answer: 2xx passes, 4xx gives up, anything else is retried.
fn check(response: reqwest::Response) -> Result<reqwest::Response, Failure> {
    let status = response.status();
    if status.is_success() {
        Ok(response)
    } else if status.is_client_error() {
        Err(Failure::GiveUp(status.as_u16()))
    } else {
        Err(Failure::Retry)
    }
}

impl Boot {
    fn has(&self, fault: MachineFault) -> bool {
        self.faults.iter().any(|f| f == fault.as_str())
    }
}

/// The acceptance image's work: the machine's drives against the ones the configuration lists,
/// and its memory against the class's (the `acceptance_fails` fault fails that one).
fn accept(boot: &Boot, config: &Value) -> (&'static str, Vec<Value>) {
    let listed = config["drives"].as_array().cloned().unwrap_or_default();
    let missing: Vec<&str> = listed
        .iter()
        .filter_map(|d| d["id"].as_str())
        .filter(|id| !boot.drives.iter().any(|d| d["id"].as_str() == Some(id)))
        .collect();
    let drives = if missing.is_empty() {
        json!({ "name": "drives", "status": "healthy", "detail": format!("{} drives found", listed.len()) })
    } else {
        json!({ "name": "drives", "status": "failed", "detail": format!("missing: {}", missing.join(", ")) })
    };
    let gib = config["memory_gib"].as_u64().unwrap_or(0);
    let memory = if boot.has(MachineFault::AcceptanceFails) {
        json!({ "name": "memory", "status": "failed",
                "detail": format!("found {} GiB, the class promises {gib} GiB", gib / 2) })
    } else {
        json!({ "name": "memory", "status": "healthy", "detail": format!("{gib} GiB found") })
    };
    let passed = [&drives, &memory].iter().all(|c| c["status"] == "healthy");
    (if passed { "success" } else { "failure" }, vec![drives, memory])
}

/// The wipe image's work: every drive the configuration lists, wiped and verified, with its
/// evidence; a listed drive the machine does not have fails, and with `wipe_fails` the first
/// listed drive fails.
fn wipe(boot: &Boot, config: &Value) -> (&'static str, Vec<Value>) {
    let listed = config["drives"].as_array().cloned().unwrap_or_default();
    let drives: Vec<Value> = listed.iter().enumerate().map(|(i, d)| wiped(boot, &listed, d, i == 0)).collect();
    let all_ok = !drives.is_empty() && drives.iter().all(|d| d["result"] == "success");
    (if all_ok { "success" } else { "failure" }, drives)
}

/// The block devices the simulated agent saw: a disk per drive it found (the wipe image's CD and
/// the seed's floppy left alone), named like the kernel would.
fn devices(drives: &[Value]) -> Vec<Value> {
    let mut devices = vec![
        json!({ "name": "sr0", "kind": "cd", "action": "left", "reason": "virtual media: the wipe image" }),
        json!({ "name": "fd0", "kind": "floppy", "action": "left", "reason": "virtual media: the seed" }),
    ];
    let found = drives.iter().filter(|d| d["identity"]["size_bytes"].as_u64().unwrap_or(0) > 0);
    devices.extend(found.enumerate().map(|(i, d)| {
        let (action, reason) = match d["result"].as_str() {
            Some("success") => ("wiped", "a disk of the machine: wiped and verified"),
            _ => ("wipe_failed", "a disk of the machine: its wipe failed"),
        };
        json!({ "name": format!("nvme{i}n1"), "kind": "disk", "action": action, "reason": reason })
    }));
    devices
}

/// One drive's evidence: matched by serial when the configuration's serial is unique among the
/// listed drives, else by protocol and capacity; wiped with the strongest method its protocol
/// allows; the contract's 66 ranges read back as zeros, their SHA-256 the digest.
fn wiped(boot: &Boot, listed: &[Value], drive: &Value, first: bool) -> Value {
    let id = drive["id"].as_str().unwrap_or_default();
    let found = boot.drives.iter().find(|d| d["id"].as_str() == Some(id));
    let protocol = drive["protocol"].as_str().map(str::to_ascii_lowercase);
    let method = if protocol.as_deref() == Some("nvme") { "nvme-sanitize-crypto" } else { "overwrite-zeroes" };
    let Some(found) = found else {
        let identity = json!({ "size_bytes": 0, "serial": null, "model": null, "wwn": null, "eui": null });
        return json!({ "id": id, "match_basis": null, "identity": identity, "method": method,
                       "result": "failure", "detail": "no such drive", "verification": null });
    };
    let size = found["capacity_bytes"].as_u64().unwrap_or(0);
    let identity = json!({
        "model": found["model"], "serial": found["serial"], "wwn": null, "eui": null,
        "size_bytes": size, "protocol": protocol,
    });
    let unique = drive["serial"].is_string() && listed.iter().filter(|d| d["serial"] == drive["serial"]).count() == 1;
    let basis = if unique { "serial" } else { "protocol_capacity" };
    if boot.wipe_fails && first {
        return json!({ "id": id, "match_basis": basis, "identity": identity, "method": method,
                       "result": "failure", "detail": "simulated write error (fault wipe_fails)",
                       "verification": null });
    }
    let bytes_read = verified_bytes(size);
    let verification =
        json!({ "ranges": VERIFIED_RANGES, "bytes_read": bytes_read, "sha256": zeros_sha256(bytes_read) });
    json!({ "id": id, "match_basis": basis, "identity": identity, "method": method, "result": "success",
            "detail": null, "verification": verification })
}
