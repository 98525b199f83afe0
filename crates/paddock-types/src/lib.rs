//! Wire types of the paddock REST API: requests, views, typed ids, pagination and the Problem
//! schema. No I/O and no rules: validation lives in `paddock-domain`, which depends on this crate.
//! Every type here derives `ToSchema`, and the schema attributes carry the same bounds the domain
//! enforces, so generated clients see the contract.

pub mod agent;
pub mod audit;
pub mod cluster;
pub mod custody;
pub mod der;
pub mod health;
pub mod id;
pub mod machine;
pub mod machine_class;
pub mod operation;
pub mod page;
pub mod problem;
pub mod remediation;
pub mod scim;
pub mod tenant;
pub mod usage;
pub mod webhook;

pub use id::*;

/// Labels attached to an object: an ordered map so views serialize deterministically.
pub type Labels = std::collections::BTreeMap<String, String>;

/// Regular expression of a DNS-1123 label, as published in schemas.
pub const DNS_LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
