//! Integration tests of paddock-kube against real kube-apiservers (with etcd and the namespace,
//! service-account and resource-quota controllers) of the kube-harness, started by `scripts/test`
//! (`scripts/kube-start`). See `support` for how a test gets its API server.
//!
//! Most tests share one API server and isolate themselves by namespace (each makes fresh cluster
//! ids, hence fresh namespaces). `faults::a_stopped_api_server_gives_a_transient_error`,
//! `kamaji::*` and `stack::*` (the real upstream stack manifests have fixed, partly cluster-scoped
//! names) get their own API server, named after the test; `control_plane::*` share one with the
//! Kamaji CRDs installed. `chart::*` render the Helm chart with `scripts/helm`.
//! `nodes::*` and `drain::*` use the shared API server as a tenant cluster.
//! `operator::*` runs the real Slinky slurm-operator (`PADDOCK_TEST_SLURM_OPERATOR`) on its own API
//! server with the workload controllers and the kube-scheduler; `ray_operator::*` likewise runs
//! the real KubeRay ray-operator (`PADDOCK_TEST_RAY_OPERATOR`). `workloads::*` get their own API server
//! with the harness's workload controllers and real kube-scheduler (`support::WORKLOADS`). `join::*`
//! get their own API server with the harness's `node-join` controllers and play a kubelet's TLS
//! bootstrap with paddock's join token.

mod support;

// Shared with the API's end-to-end test, which does not use every part of it.
#[path = "../played/mod.rs"]
#[allow(dead_code)]
mod played;

mod chart;
mod control_plane;
mod credentials;
mod drain;
mod faults;
mod isolation;
mod join;
mod kamaji;
mod nodes;
mod operator;
mod ray_operator;
mod removal;
mod slurm;
mod slurm_accounting;
mod slurm_demand;
mod slurm_host;
mod slurm_nudge;
mod slurm_probe;
mod slurm_release;
mod slurm_rest;
mod stack;
mod workloads;
