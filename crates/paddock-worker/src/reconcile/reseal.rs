//! The re-seal job ([`RESEAL`], one fleet-wide job that `paddock reseal` enqueues): seals every
//! encrypted value again under the current key, so that the keys in
//! `PADDOCK_ENCRYPTION_OLD_KEYS` can be retired once it has succeeded.
//!
//! It walks each sealed column in id order, [`BATCH`] values at a time, each value written by a
//! guarded update of its own (a value rewritten meanwhile, under the current key, is left
//! alone). The database selects only values not yet under the current key, so the job is
//! idempotent and a run that stopped half-way resumes where it stopped. A value that no
//! configured key opens is skipped and the job fails naming how many: retiring a key then would
//! lose them.

use futures::future::BoxFuture;
use futures::FutureExt;
use paddock_domain::job_kind::RESEAL;
use paddock_domain::secret::Binding;
use paddock_service::Services;
use paddock_store::reseal::{self, SEALED_COLUMNS};
use paddock_store::StoreError;
use tracing::{info, warn};
use uuid::Uuid;

use super::store_error;
use crate::{Job, JobHandler, Outcome};

/// Values read per query.
pub const BATCH: u32 = 100;

/// What one run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tally {
    resealed: u64,
    unreadable: u64,
}

/// The [`RESEAL`] handler.
#[derive(Clone)]
pub struct Resealer {
    services: Services,
}

impl std::fmt::Debug for Resealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resealer").finish_non_exhaustive()
    }
}

impl Resealer {
    /// A resealer over `services` (whose cipher holds the current and the older keys).
    pub fn new(services: Services) -> Self {
        Self { services }
    }

    async fn run_all(&self) -> Outcome {
        let mut tally = Tally::default();
        for column in SEALED_COLUMNS {
            if let Err(e) = self.column(column, &mut tally).await {
                return store_error(e);
            }
        }
        info!(resealed = tally.resealed, unreadable = tally.unreadable, "re-seal finished");
        if tally.unreadable > 0 {
            let detail = format!(
                "{} sealed values open with no configured key and were left as they are; keep the old keys",
                tally.unreadable
            );
            return Outcome::fail("reseal_unreadable_values", detail);
        }
        Outcome::Done
    }

    /// Re-seals one column's stale values, batch by batch.
    async fn column(&self, column: (&'static str, &'static str), tally: &mut Tally) -> Result<(), StoreError> {
        let cipher = self.services.cipher();
        let mut conn = self.services.store().conn().await?;
        let mut after = Uuid::nil();
        loop {
            let batch = reseal::stale(&mut conn, column, cipher.current_key_id(), after, BATCH).await?;
            let Some((last, _)) = batch.last() else { return Ok(()) };
            after = *last;
            for (id, sealed) in &batch {
                let binding = Binding { table: column.0, column: column.1, row: *id };
                match cipher.reseal(sealed, binding) {
                    Ok(Some(fresh)) => {
                        if reseal::replace(&mut conn, column, *id, sealed, &fresh).await? {
                            tally.resealed += 1;
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        warn!(error = &e as &dyn std::error::Error, table = column.0, column = column.1, row = %id,
                            "a sealed value could not be re-sealed");
                        tally.unreadable += 1;
                    }
                }
            }
        }
    }
}

impl JobHandler for Resealer {
    fn kind(&self) -> &'static str {
        RESEAL
    }

    fn run<'a>(&'a self, _job: &'a Job) -> BoxFuture<'a, Outcome> {
        self.run_all().boxed()
    }
}
