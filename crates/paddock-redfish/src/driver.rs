//! [`RedfishBmc`]: the Redfish implementation of `paddock_domain::bmc::BmcDriver`.
//!
//! One [`RedfishClient`] per call, built from the machine's [`BmcAccess`]; every client shares the
//! process's [`BmcLimiter`] with the machine id as its machine key, so SPEC section 5's bounds (one
//! call in flight per machine, a bound per BMC host) hold across all the worker's jobs.

use paddock_domain::bmc::{
    AfterBoot, BmcAccess, BmcDriver, BmcError, BmcErrorKind, BootMedia, BoxFuture, Inventory, InventoryDrive,
    OutOfBandErase, NO_SECOND_VIRTUAL_MEDIA, SYSTEM_UUID_MISMATCH,
};

use crate::{
    BmcLimiter, Password, PowerState, RedfishClient, RedfishConfig, RedfishError, SystemInventory, SystemUuid, Url,
};

/// Adjusts a client's config after it is built from the access.
type Tune = std::sync::Arc<dyn Fn(&mut RedfishConfig) + Send + Sync>;

/// The Redfish BMC driver.
#[derive(Clone)]
pub struct RedfishBmc {
    limiter: BmcLimiter,
    tune: Option<Tune>,
}

impl std::fmt::Debug for RedfishBmc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedfishBmc").field("limiter", &self.limiter).finish_non_exhaustive()
    }
}

impl RedfishBmc {
    /// A driver whose clients share `limiter` (one per process) and use the default timeouts.
    pub fn new(limiter: BmcLimiter) -> Self {
        Self { limiter, tune: None }
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
        Ok(client.with_limiter(self.limiter.clone(), access.machine_id.to_string()))
    }

    /// The client and the UUID on record; a machine without one is refused before any change
    /// (naming what the BMC reports, when it can be read).
    async fn guarded(&self, access: &BmcAccess) -> Result<(RedfishClient, SystemUuid), BmcError> {
        let client = self.client(access)?;
        match access.system_uuid.as_deref().map(str::trim).filter(|u| !u.is_empty()) {
            Some(uuid) => Ok((client, SystemUuid::new(uuid))),
            None => {
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

impl BmcDriver for RedfishBmc {
    fn inspect<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<Inventory, BmcError>> {
        Box::pin(async move {
            let client = self.client(access)?;
            let inv = client.system().await.map_err(map_error)?;
            to_inventory(inv)
        })
    }

    fn boot_from_media<'a>(
        &'a self,
        access: &'a BmcAccess,
        media: &'a BootMedia,
    ) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            let image = Url::parse(&media.image_url).map_err(|e| {
                BmcError::new(
                    BmcErrorKind::Permanent,
                    "bmc_media_url_invalid",
                    format!("the image URL does not parse: {e}"),
                )
            })?;
            let (client, expected) = self.guarded(access).await?;
            client.boot_from_media(&expected, &image, &media.seed_url).await.map_err(map_error)
        })
    }

    fn finish_boot<'a>(&'a self, access: &'a BmcAccess, after: AfterBoot) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            let (client, expected) = self.guarded(access).await?;
            client.finish_boot(&expected, after).await.map_err(map_error)
        })
    }

    fn power_off<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            let (client, expected) = self.guarded(access).await?;
            client.power(&expected, PowerState::Off).await.map(drop).map_err(map_error)
        })
    }

    fn power_on<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<(), BmcError>> {
        Box::pin(async move {
            let (client, expected) = self.guarded(access).await?;
            client.power(&expected, PowerState::On).await.map(drop).map_err(map_error)
        })
    }

    fn erase_out_of_band<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<Vec<OutOfBandErase>, BmcError>> {
        Box::pin(async move {
            let (client, expected) = self.guarded(access).await?;
            client.erase_out_of_band(&expected).await.map_err(map_error)
        })
    }

    fn power_state<'a>(&'a self, access: &'a BmcAccess) -> BoxFuture<'a, Result<Option<bool>, BmcError>> {
        Box::pin(async move {
            // The UUID on record is required even for this read: the power sync acts on what it
            // reads, and must never act on another system behind the same BMC.
            let (client, expected) = self.guarded(access).await?;
            let state = client.power_state(&expected).await.map_err(map_error)?;
            Ok(state.map(|p| p == PowerState::On))
        })
    }
}
