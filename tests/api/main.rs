//! Black-box tests of the HTTP API: the real router with its whole middleware stack over a real
//! PostgreSQL (one fresh database per test). Run with `scripts/test`.

mod acceptance;
mod agent;
mod allocation;
mod authz;
mod autoscale;
mod bad_input;
mod body_shape;
mod cluster;
mod common;
mod console;
mod credit;
mod custody;
mod drift;
mod focus;
mod health;
mod idempotency;
mod jwt;
mod kubeconfig;
mod kubernetes;
mod lifecycle;
mod limits;
mod machine;
mod machine_class;
mod metrics;
mod openapi;
mod operation;
mod operation_steps;
mod pagination;
mod platform;
mod query_params;
mod ray;
mod remediation;
mod scim;
mod slurm_health;
mod slurm_identity;
mod sweep;
mod tenant;
mod tenant_scope;
mod usage;
mod usage_adjustments;
mod usage_export;
mod usage_prices;
mod webhook_failures;
mod webhook_health;
mod webhook_views;
mod webhooks;
mod worker;

// The played kubelets, provisioner, slurmrestd stand-in and operator process of paddock-kube's
// operator test, shared with `kubernetes::operator`, which does not use every part of them.
#[path = "../../crates/paddock-kube/tests/played/mod.rs"]
#[allow(dead_code)]
mod played;
