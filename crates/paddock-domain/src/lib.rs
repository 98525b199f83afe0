//! The pure model of paddock: who may do what (`authz`), the domain `Error`, validation rules,
//! JSON merge patch, opaque cursors, the machine lifecycle and the cipher for secrets at rest.
//! No I/O: no sqlx, no HTTP. Every other crate builds on these rules so they exist once.

pub mod agent;
pub mod attestation;
pub mod authz;
pub mod autoscale;
pub mod bmc;
pub mod cluster;
pub mod cursor;
pub mod driver;
pub mod error;
pub mod health;
pub mod job_kind;
pub mod json;
pub mod ledger;
pub mod machine;
pub mod model;
pub mod precondition;
pub mod scim;
pub mod secret;
pub mod signing;
pub mod slurm_identity;
pub mod ssh;
pub mod stack;
pub mod usage;
pub mod validate;
pub mod webhook;

pub use authz::{Actor, Permission, Role, Scope};
pub use error::{Error, Result};
