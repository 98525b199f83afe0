//! The store's own tests, on the real PostgreSQL `scripts/test` starts (one fresh database per
//! test, `paddock_testkit::TestDb`): what the API tests reach only indirectly. The job queue's
//! functions have theirs in `paddock-worker/tests/worker/queue.rs`; `job.rs` here adds the due
//! times the queue's tests leave out.

mod allocation;
mod guarded;
mod job;
mod role_migration;
mod support;
mod tenancy_keys;
