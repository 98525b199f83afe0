//! Integration tests of paddock-auth: one binary, one module per concern.

mod asymmetric;
mod claims;
mod common;
mod config;
mod hs256;
mod jwks;
mod malformed;
