//! [`RedfishBmc`]: the Redfish implementation of `paddock_domain::bmc::BmcDriver`.
//!
//! One [`RedfishClient`] per call, built from the machine's [`BmcAccess`]; every client shares the
//! process's [`BmcLimiter`] with the machine id as its machine key, so the BMC bounds of docs/security.md (one
//! call in flight per machine, a bound per BMC host) hold across all the worker's jobs.
//!
//! The driver remembers two things per machine, in memory: where the system and its
//! virtual media devices are on the BMC ([`Discovery`]: the next client skips the service root
//! and the collections; never the system read that checks the UUID before a destructive call,
//! docs/security.md), and the power change a `start_*` call asked for and has not seen settle
//! ([`PendingPower`]), so that a job can end its run while the BMC works and settle it in the
//! next. It also keeps, per machine and endpoint, the inserts of virtual media that got no answer
//! ([`UnansweredInserts`]), so that a later call reads whether one landed instead of making the
//! BMC fetch the image again. A memo is about one endpoint (URL and system id): new credentials or another system id
//! start afresh. A layout that changed under a remembered discovery (a path that is gone, another
//! UUID behind it) is discovered again at once, and the call repeated once.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use paddock_domain::bmc::{
    AfterBoot, BmcAccess, BmcDriver, BmcError, BmcErrorKind, BootMedia, BoxFuture, Inventory, InventoryDrive,
    OutOfBandErase, PowerProgress, SystemStatus, NO_SECOND_VIRTUAL_MEDIA, SYSTEM_UUID_MISMATCH,
};

use crate::{
    BmcLimiter, Discovery, Password, PendingPower, PowerState, RedfishClient, RedfishConfig, RedfishError,
    SystemInventory, SystemUuid, UnansweredInserts, Url,
};

/// What the driver remembers of one machine between calls.
#[derive(Debug, Clone, Default)]
struct Memo {
    /// The endpoint it is about: the BMC URL and the configured system id.
    endpoint: (String, Option<String>),
    discovery: Discovery,
    pending: Option<PendingPower>,
}

/// What one run of an operation hands back to the memo: the result, the client's discovery, the
/// pending power change.
type Ran<T> = (Result<T, RedfishError>, Discovery, Option<PendingPower>);

/// Adjusts a client's config after it is built from the access.
type Tune = std::sync::Arc<dyn Fn(&mut RedfishConfig) + Send + Sync>;

/// The Redfish BMC driver.
#[derive(Clone)]
pub struct RedfishBmc {
    limiter: BmcLimiter,
    tune: Option<Tune>,
    memos: Arc<Mutex<HashMap<String, Memo>>>,
    /// Unanswered inserts by machine id and BMC URL; kept through failures (unlike the memo's
    /// discovery), since a failure is what leaves one behind.
    unanswered: Arc<Mutex<HashMap<(String, String), UnansweredInserts>>>,
}

impl std::fmt::Debug for RedfishBmc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedfishBmc").field("limiter", &self.limiter).finish_non_exhaustive()
    }
}

impl RedfishBmc {
    /// A driver whose clients share `limiter` (one per process) and use the default timeouts.
    pub fn new(limiter: BmcLimiter) -> Self {
        Self { limiter, tune: None, memos: Arc::default(), unanswered: Arc::default() }
    }

    /// Adjusts every client's config (timeouts, retries) after it is built from the access.
    pub fn with_tuning(mut self, tune: impl Fn(&mut RedfishConfig) + Send + Sync + 'static) -> Self {
        self.tune = Some(std::sync::Arc::new(tune));
        self
    }

    fn client(&self, access: &BmcAccess) -> Result<RedfishClient, BmcError> {
        let url = Url::parse(&access.url).map_err(|e| {
            BmcError::new(BmcErrorKind::Permanent, "bmc_config_invalid", format!("the BMC URL does not parse: {e}"))
        })?;
        let mut config =
            RedfishConfig::new(url, access.username.clone(), Password::new(access.password.expose().to_owned()));
        config.system_id = access.system_id.clone();
        config.ca_cert_pem = access.ca_cert.clone();
        config.insecure_tls = access.insecure_tls;
        if let Some(tune) = &self.tune {
            tune(&mut config);
        }
        let client = RedfishClient::new(config).map_err(map_error)?;
        let key = (access.machine_id.to_string(), access.url.clone());
        let unanswered = self.unanswered.lock().map(|mut u| u.entry(key).or_default().clone()).unwrap_or_default();
        Ok(client.with_limiter(self.limiter.clone(), access.machine_id.to_string()).with_unanswered_inserts(unanswered))
    }

    /// The machine's memo, empty when there is none or it is about another endpoint.
    fn memo(&self, access: &BmcAccess) -> Memo {
        let endpoint = (access.url.clone(), access.system_id.clone());
        let known = self.memos.lock().ok().and_then(|m| m.get(&access.machine_id.to_string()).cloned());
        match known {
            Some(memo) if memo.endpoint == endpoint => memo,
            _ => Memo { endpoint, ..Memo::default() },
        }
    }

    fn remember(&self, access: &BmcAccess, discovery: Discovery, pending: Option<PendingPower>) {
        let endpoint = (access.url.clone(), access.system_id.clone());
        if let Ok(mut memos) = self.memos.lock() {
            if discovery.is_empty() && pending.is_none() {
                memos.remove(&access.machine_id.to_string());
            } else {
                memos.insert(access.machine_id.to_string(), Memo { endpoint, discovery, pending });
            }
        }
    }

    /// Runs `op` with a client that starts from the machine's memo, and keeps what it found out.
    /// A failure forgets the discovery; one that a stale discovery may explain (a path gone,
    /// another system behind it) runs `op` once more with a fresh one. Every operation is
    /// idempotent, and the UUID check comes before any change.
    async fn with_memo<T, F, Fut>(&self, access: &BmcAccess, op: F) -> Result<T, BmcError>
    where
        F: Fn(RedfishClient, Option<PendingPower>) -> Fut,
        Fut: Future<Output = Ran<T>>,
    {
        let memo = self.memo(access);
        let remembered = !memo.discovery.is_empty();
        let (result, discovery, pending) = op(self.client(access)?.with_discovery(memo.discovery), memo.pending).await;
        let (result, discovery, pending) = match result {
            Err(e) if remembered && stale_layout(&e) => {
                tracing::debug!(machine.id = %access.machine_id, error = %e, "discovering the BMC's layout again");
                op(self.client(access)?, pending).await
            }
            other => (other, discovery, pending),
        };
        match result {
            Ok(value) => {
                self.remember(access, discovery, pending);
                Ok(value)
            }
            Err(e) => {
                self.remember(access, Discovery::default(), pending);
                Err(map_error(e))
            }
        }
    }

    /// The UUID on record; a machine without one is refused before any change (naming what the
    /// BMC reports, when it can be read).
    async fn expected(&self, access: &BmcAccess) -> Result<SystemUuid, BmcError> {
        match access.system_uuid.as_deref().map(str::trim).filter(|u| !u.is_empty()) {
            Some(uuid) => Ok(SystemUuid::new(uuid)),
            None => {
                let client = self.client(access)?;
                let reported = match client.reported_uuid().await {
                    Ok(Some(uuid)) => uuid.to_string(),
                    Ok(None) => "not reported".to_owned(),
                    Err(_) => "unknown (unreadable)".to_owned(),
                };
                Err(BmcError::new(
                    BmcErrorKind::Permanent,
                    SYSTEM_UUID_MISMATCH,
                    format!(
                        "no system UUID is on record for this machine (the BMC's system UUID is {reported}); \
                         destructive calls need one, recorded by inspection"
                    ),
                ))
            }
        }
    }
}

/// Classifies a Redfish error for the worker.
pub fn map_error(e: RedfishError) -> BmcError {
    let kind = match &e {
        // The machine behind the BMC is not the one on record: nothing was changed, and nothing
        // will be until someone looks.
        RedfishError::UuidMismatch { .. } => {
            return BmcError::new(BmcErrorKind::Permanent, SYSTEM_UUID_MISMATCH, e.to_string());
        }
        RedfishError::NoSecondVirtualMedia { .. } => {
            return BmcError::new(BmcErrorKind::CapabilityGap, NO_SECOND_VIRTUAL_MEDIA, e.to_string());
        }
        RedfishError::AuthFailed { .. } => BmcErrorKind::AuthFailed,
        RedfishError::AmbiguousSystem { .. } => BmcErrorKind::AmbiguousSystem,
        _ if e.is_transient() => BmcErrorKind::Transient,
        RedfishError::CapabilityGap { .. } => BmcErrorKind::CapabilityGap,
        _ => BmcErrorKind::Permanent,
    };
    BmcError::new(kind, e.code(), e.to_string())
}

/// Converts the client's inventory; a system without a UUID cannot be guarded, so it is refused.
pub fn to_inventory(inv: SystemInventory) -> Result<Inventory, BmcError> {
    let Some(uuid) = inv.uuid else {
        return Err(BmcError::new(
            BmcErrorKind::Permanent,
            "bmc_system_uuid_missing",
            format!("system {:?} reports no UUID; paddock needs it to guard every destructive call", inv.id),
        ));
    };
    let memory_gib = inv.memory_gib.filter(|m| m.is_finite() && *m >= 0.0 && *m <= f64::from(u32::MAX)).map(|m| {
        // In range: checked just above.
        m.round() as u32
    });
    Ok(Inventory {
        system_uuid: uuid.as_str().to_owned(),
        serial: inv.serial_number,
        model: inv.model,
        manufacturer: inv.manufacturer,
        power_on: inv.power_state.and_then(|p| p.settled()).map(|p| p == PowerState::On),
        // Redfish `ProcessorSummary.Count` counts processors (sockets), not cores: cores stay
        // unreported (unverified) until the client reads `Processors/*/TotalCores`.
        cpu_cores: None,
        memory_gib,
        drives: inv.drives.map(|drives| {
            drives
                .into_iter()
                .map(|d| InventoryDrive {
                    id: d.id,
                    capacity_bytes: d.capacity_bytes,
                    model: d.model,
                    serial: d.serial_number.filter(|s| !s.trim().is_empty()),
                    protocol: d.protocol,
                })
                .collect()
        }),
    })
}

/// Whether `e` may come from a remembered layout that changed under it.
fn stale_layout(e: &RedfishError) -> bool {
    matches!(
        e,
        RedfishError::NotFound { .. } | RedfishError::UuidMismatch { .. } | RedfishError::NoSuchVirtualMedia { .. }
    )
}

impl BmcDriver for RedfishBmc {
    fn inspect<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<Inventory, BmcError>> {
        Box::pin(async move {
            let inv = self
                .with_memo(access, |client, pending| async move {
                    let inv = client.system().await;
                    (inv, client.discovery(), pending)
                })
                .await?;
            to_inventory(inv)
        })
    }

    fn boot_from_media<'a>(
        &'a self,
        access: &'a BmcAccess,
        media: &'a BootMedia,
    ) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            let image = media_url(media)?;
            let expected = self.expected(access).await?;
            let (image, expected) = (&image, &expected);
            self.with_memo(access, |client, _| async move {
                let done = client.boot_from_media(expected, image, &media.seed_url).await;
                (done, client.discovery(), None)
            })
            .await
        })
    }

    fn start_boot_from_media<'a>(
        &'a self,
        access: &'a BmcAccess,
        media: &'a BootMedia,
    ) -> BoxFuture<'a, Result<PowerProgress, BmcError>> {
        Box::pin(async move {
            let image = media_url(media)?;
            let expected = self.expected(access).await?;
            let (image, expected) = (&image, &expected);
            self.with_memo(access, |client, mut pending| async move {
                let progress = client.start_boot_from_media(expected, image, &media.seed_url, &mut pending).await;
                (progress, client.discovery(), pending)
            })
            .await
        })
    }

    fn finish_boot<'a>(&'a self, access: &'a BmcAccess, after: AfterBoot) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            let expected = &self.expected(access).await?;
            self.with_memo(access, |client, _| async move {
                let done = client.finish_boot(expected, after).await;
                (done, client.discovery(), None)
            })
            .await
        })
    }

    fn start_finish_boot<'a>(
        &'a self,
        access: &'a BmcAccess,
        after: AfterBoot,
    ) -> BoxFuture<'a, Result<PowerProgress, BmcError>> {
        if after != AfterBoot::PowerOff {
            // A restart from disk is the provisioning's: it waits, as it always did.
            return Box::pin(async move { self.finish_boot(access, after).await.map(|()| PowerProgress::Done) });
        }
        Box::pin(async move {
            let expected = &self.expected(access).await?;
            self.with_memo(access, |client, mut pending| async move {
                let progress = client.start_finish_boot_off(expected, &mut pending).await;
                (progress, client.discovery(), pending)
            })
            .await
        })
    }

    fn power_progress<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<PowerProgress, BmcError>> {
        Box::pin(async move {
            if self.memo(access).pending.is_none() {
                return Ok(PowerProgress::Done);
            }
            let expected = &self.expected(access).await?;
            self.with_memo(access, |client, mut pending| async move {
                let progress = client.power_progress(expected, &mut pending).await;
                (progress, client.discovery(), pending)
            })
            .await
        })
    }

    fn power_off<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move { self.power(access, PowerState::Off).await })
    }

    fn power_on<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move { self.power(access, PowerState::On).await })
    }

    fn erase_out_of_band<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<Vec<OutOfBandErase>, BmcError>> {
        Box::pin(async move {
            let expected = &self.expected(access).await?;
            self.with_memo(access, |client, pending| async move {
                let erased = client.erase_out_of_band(expected).await;
                (erased, client.discovery(), pending)
            })
            .await
        })
    }

    fn system_status<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<SystemStatus, BmcError>> {
        Box::pin(async move {
            // The UUID on record is required even for this read: the power sync acts on what it
            // reads, and must never act on another system behind the same BMC.
            let expected = &self.expected(access).await?;
            let (power, health) = self
                .with_memo(access, |client, pending| async move {
                    let status = client.status(expected).await;
                    (status, client.discovery(), pending)
                })
                .await?;
            Ok(SystemStatus { power_on: power.map(|p| p == PowerState::On), health })
        })
    }
}

impl RedfishBmc {
    /// A power change that waits until it is read back (the power sync's corrections, releases);
    /// whatever a `start_*` call had pending is over with it.
    async fn power(&self, access: &BmcAccess, target: PowerState) -> Result<(), BmcError> {
        let expected = &self.expected(access).await?;
        self.with_memo(access, |client, _| async move {
            let done = client.power(expected, target).await.map(drop);
            (done, client.discovery(), None)
        })
        .await
    }
}

/// The image URL of a media boot.
fn media_url(media: &BootMedia) -> Result<Url, BmcError> {
    Url::parse(&media.image_url).map_err(|e| {
        BmcError::new(BmcErrorKind::Permanent, "bmc_media_url_invalid", format!("the image URL does not parse: {e}"))
    })
}
