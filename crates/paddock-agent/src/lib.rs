//! paddock's wipe agent (docs/security.md): boots from the wipe image between tenancies, finds the
//! run's seed on the removable media the BMC inserted (never on a disk of the machine), fetches
//! `config`, wipes every disk with the strongest method it supports, verifies each with its own
//! O_DIRECT reads and reports the evidence, with every block device it saw and what it did to it.
//! The same wipe runs standalone for operators (`paddock-agent wipe --device ...`). A provisioning
//! boot installs the node OS image and its join configuration instead ([`install`]); an
//! acceptance run checks the machine against its class ([`accept`]).

pub mod accept;
pub mod client;
pub mod device;
pub mod discovery;
pub mod erase;
pub mod install;
pub mod iso;
pub mod joinfs;
pub mod matching;
pub mod mbr;
pub mod method;
pub mod run;
pub mod seed;
mod sys;
pub mod verify;
pub mod wipe;
