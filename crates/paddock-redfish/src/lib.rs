//! Redfish BMC client of paddock: the real driver behind the `BmcDriver` seam.
//!
//! [`RedfishClient`] talks to one system behind one BMC endpoint: service root discovery, the
//! system chosen by `Id` or `UUID`, inventory, and the idempotent operations the machine lifecycle
//! needs (power convergence, restart, one-time boot, boot back to disk, virtual media), each
//! destructive one guarded by a system UUID check, and the two composite operations of the
//! `BmcDriver` seam, `boot_from_media` and `finish_boot`, each one operation under one machine
//! slot. The seed URL's token is never logged nor put into an error ([`mask_url`]). [`BmcLimiter`]
//! keeps the BMC bounds of docs/security.md: one call in flight per machine and a
//! configurable number per BMC host.
//!
//! Errors are [`RedfishError`], classified with [`RedfishError::is_transient`] and
//! [`RedfishError::code`]. What this crate does not do: sessions (basic auth only), out-of-band
//! drive erase, BIOS settings, firmware.
//!
//! ```no_run
//! use paddock_redfish::{BmcLimiter, BootTarget, Password, PowerState, RedfishClient, RedfishConfig, Url};
//!
//! # async fn demo(wipe_iso: Url) -> Result<(), paddock_redfish::RedfishError> {
//! let limiter = BmcLimiter::new(4); // shared by every client of the process
//! let mut config = RedfishConfig::new(
//!     Url::parse("https://10.0.0.5").expect("url"),
//!     "admin",
//!     Password::new("from the encrypted column"),
//! );
//! config.ca_cert_pem = Some("-----BEGIN CERTIFICATE-----...".into());
//! let bmc = RedfishClient::new(config)?.with_limiter(limiter, "machine-id");
//!
//! let inventory = bmc.system().await?; // enrolling: record inventory.uuid
//! let uuid = inventory.uuid.expect("reported");
//! bmc.power(&uuid, PowerState::Off).await?; // every destructive call re-checks the UUID
//! bmc.insert_media(&uuid, "Cd", &wipe_iso).await?;
//! bmc.set_boot_once(&uuid, BootTarget::Cd).await?;
//! bmc.power(&uuid, PowerState::On).await?;
//! # Ok(())
//! # }
//! ```

mod client;
mod config;
pub mod driver;
mod error;
mod limiter;
mod model;
mod redact;
mod transport;

pub use client::{Discovery, PendingPower, RedfishClient, UnansweredInserts};
pub use config::{
    Backoff, Password, PowerPolicy, RedfishConfig, TaskPolicy, DEFAULT_INSERT_TIMEOUT, DEFAULT_MAX_BODY_BYTES,
};
pub use driver::RedfishBmc;
pub use error::RedfishError;
pub use limiter::{BmcLimiter, BmcPermit};
pub use model::{
    BootOverride, BootTarget, ChangeOutcome, DriveInventory, PowerOutcome, PowerState, ReportedPowerState,
    RestartOutcome, ServiceRoot, SystemInventory, SystemUuid, VirtualMediaDevice,
};
pub use redact::mask_url;
pub use url::Url;
