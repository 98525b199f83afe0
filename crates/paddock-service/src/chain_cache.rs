//! What the isolation report already verified of each machine's custody chain. Verifying a chain
//! recomputes the MAC of every entry; a report that a portal polls would do that for every
//! machine on every call. A verdict is kept per machine with what it was reached on: the chain's
//! fingerprint (the database's digest of every entry as stored, see
//! `paddock_store::custody::chain_fingerprints`, so an edit anywhere in the chain, not only at its
//! head, is a new chain), the machine's state (the last entry must match it) and the checkpointed
//! head it was checked against. Anything else is verified anew. One verdict per machine: the
//! cache is as large as the fleet.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use paddock_types::custody::CustodyHead;
use paddock_types::MachineId;

/// What a verdict was reached on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Basis {
    /// The chain's fingerprint.
    pub fingerprint: String,
    /// The machine's state.
    pub state: String,
    /// The checkpointed head the chain had to reach, if any.
    pub checkpoint: Option<CustodyHead>,
}

/// The verdicts, and how many chains were verified in full.
#[derive(Debug, Default)]
pub struct ChainCache {
    verdicts: Mutex<HashMap<MachineId, (Basis, bool)>>,
    verifications: AtomicU64,
}

impl ChainCache {
    /// The verdict on `machine`'s chain, if one was reached on `basis`.
    pub(crate) fn get(&self, machine: MachineId, basis: &Basis) -> Option<bool> {
        let verdicts = self.verdicts.lock().unwrap_or_else(PoisonError::into_inner);
        verdicts.get(&machine).filter(|(known, _)| known == basis).map(|(_, verified)| *verified)
    }

    /// Records a verdict reached by a full verification.
    pub(crate) fn put(&self, machine: MachineId, basis: Basis, verified: bool) {
        self.verifications.fetch_add(1, Ordering::Relaxed);
        self.verdicts.lock().unwrap_or_else(PoisonError::into_inner).insert(machine, (basis, verified));
    }

    /// How many chains were verified in full so far.
    pub fn verifications(&self) -> u64 {
        self.verifications.load(Ordering::Relaxed)
    }
}
